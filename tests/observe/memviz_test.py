#!/usr/bin/env python3
"""tools/bp-memviz: a trace and a snapshot become self-contained HTML pages that headless
Chromium renders without a JavaScript error.

usage: memviz_test.py BP_MEMVIZ TRACE_PROGRAM BP_SMI OUT_DIR
Skips (exit 77) with a message when chromium is not installed (tools/setup.sh installs it).
The screenshots stay in OUT_DIR (memviz_trace.png, memviz_snapshot.png) to be looked at.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

memviz, prog, smi, out = sys.argv[1:5]
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if not chromium:
    print("SKIP: chromium is not installed (apt-get install -y chromium; tools/setup.sh does it)")
    sys.exit(77)

trace, snap = os.path.join(out, "memviz_trace.json"), os.path.join(out, "memviz_snapshot.json")
for p in (trace, snap):
    if os.path.exists(p):
        os.remove(p)
r = subprocess.run([prog, "--snapshot", snap], env=dict(os.environ, BACKPLANE_TRACE=trace),
                   capture_output=True, text=True, timeout=300)
if r.returncode != 0:
    sys.exit(f"FAIL: {prog} exited {r.returncode}: {r.stderr}")
devices = [d["device"] for d in json.loads(subprocess.check_output([smi, "--json"]))["devices"]]


def render(src, name):
    html = os.path.join(out, name + ".html")
    subprocess.run([sys.executable, memviz, src, "-o", html], check=True, timeout=60)
    return html


def chrome(*args):
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--virtual-time-budget=5000", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def status(dom):
    m = re.search(r'<html[^>]*data-bp-memviz="([^"]*)"', dom)
    return m.group(1) if m else "(the script never finished)"


def check_page(html, must_contain, png):
    text = open(html).read()
    # Self-contained: no external script, style, image or link; the SVG namespace is a name.
    ext = re.findall(r'(?:src|href)\s*=\s*["\']?(?:https?:)?//|<link\b|@import|url\(\s*["\']?https?:',
                     text)
    if ext:
        sys.exit(f"FAIL: {html} references external resources: {ext}")
    if re.findall(r"https?://(?!www\.w3\.org/2000/svg)", text):
        sys.exit(f"FAIL: {html} contains a network address")
    dom = chrome("--dump-dom", "file://" + os.path.abspath(html))
    st = status(dom)
    if st != "ok":
        sys.exit(f"FAIL: {html}: script status '{st}' (a JavaScript error)")
    for s in must_contain:
        if s not in dom:
            sys.exit(f"FAIL: {html}: the rendered page lacks '{s}'")
    if os.path.exists(png):
        os.remove(png)
    chrome("--window-size=1000,1400", "--screenshot=" + png, "file://" + os.path.abspath(html))
    with open(png, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"FAIL: {png} is not a PNG")
    w, h = struct.unpack(">II", head[16:24])
    size = os.path.getsize(png)
    if (w, h) != (1000, 1400) or size < 15000:  # a blank page compresses to a few KiB
        sys.exit(f"FAIL: {png} is {w}x{h}, {size} bytes (expected 1000x1400 with content)")
    print(f"ok: {html} -> {png} ({w}x{h}, {size} bytes)")


page = render(trace, "memviz_trace")
check_page(page, [f"<h2>{d}</h2>" for d in devices] + ["Memory over time", "<td>mul</td>",
                                                        "<td>exp</td>", "<polyline"],
           os.path.join(out, "memviz_trace.png"))
page = render(snap, "memviz_snapshot")
check_page(page, ["<h2>cpu:0</h2>", ">256.00 KiB</td>", "<td>mul</td>", "Largest live blocks"],
           os.path.join(out, "memviz_snapshot.png"))

# The check itself catches a JavaScript error: a page whose data lacks "devices" throws.
broken = os.path.join(out, "memviz_broken.html")
with open(page) as f:
    text = f.read()
with open(broken, "w") as f:
    f.write(text.replace('"devices":', '"devicez":', 1))
st = status(chrome("--dump-dom", "file://" + os.path.abspath(broken)))
if not st.startswith("error: "):
    sys.exit(f"FAIL: a page whose script throws reports '{st}', not an error")
print(f"ok: a throwing page is caught ({st})")
