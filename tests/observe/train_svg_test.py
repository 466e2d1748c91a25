#!/usr/bin/env python3
"""examples/train writes its loss curves as an SVG and prints plain progress lines off a TTY.

usage: train_svg_test.py EXAMPLE_TRAIN OUT_DIR
"""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

prog, out_dir = sys.argv[1:3]
svg = os.path.join(out_dir, "train_loss.svg")
if os.path.exists(svg):
    os.remove(svg)
r = subprocess.run([prog, svg], capture_output=True, text=True, timeout=600)
if r.returncode != 0:
    sys.exit(f"FAIL: example-train exited {r.returncode}\n{r.stdout}\n{r.stderr}")
line = re.compile(r"epoch (\d+)/15 batch (\d+)/16 loss \d+\.\d{6} samples/s \d+\.\d eta \d+:\d\d:\d\d")
progress = [l for l in r.stderr.splitlines() if l.startswith("epoch ")]
if len(progress) != 2 * 15 * 2 or not all(line.fullmatch(l) for l in progress):
    sys.exit(f"FAIL: expected 60 plain progress lines on stderr, got {len(progress)}:\n{r.stderr[:2000]}")
if "\r" in r.stderr or "\033" in r.stderr:
    sys.exit("FAIL: terminal control characters in progress written to a pipe")
root = ET.parse(svg).getroot()
ns = "{http://www.w3.org/2000/svg}"
if root.tag != ns + "svg":
    sys.exit(f"FAIL: root element {root.tag}")
lines = root.findall(ns + "polyline")
if len(lines) != 2:
    sys.exit(f"FAIL: {len(lines)} polylines, expected 2 (the two runs)")
for pl in lines:
    pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
    if len(pts) != 15:
        sys.exit(f"FAIL: a curve with {len(pts)} points, expected 15 epochs")
    if not pts[-1][1] > pts[0][1]:  # SVG y grows downwards: the loss fell
        sys.exit(f"FAIL: the curve does not fall: {pts[0]} -> {pts[-1]}")
print(f"ok: {svg}, 2 curves of 15 epochs, {len(progress)} progress lines")
