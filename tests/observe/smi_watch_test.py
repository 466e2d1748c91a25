#!/usr/bin/env python3
"""bp-smi --watch: redraws the device table until SIGINT, then exits 0.

usage: smi_watch_test.py BP_SMI
Runs `bp-smi --watch 0.2` with stdout on a pipe (plain tables, no screen clearing), waits until
at least two tables have appeared (at most 60 s), sends SIGINT and checks the exit status, the
number of tables and that every table lists cpu:0.
"""
import signal
import subprocess
import sys
import threading
import time

smi = sys.argv[1]
proc = subprocess.Popen([smi, "--watch", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
lines = []
seen_two = threading.Event()


def reader():
    for line in proc.stdout:
        lines.append(line)
        if sum(1 for l in lines if l.startswith("bp-smi --watch")) >= 2:
            seen_two.set()


t = threading.Thread(target=reader, daemon=True)
t.start()
if not seen_two.wait(60):
    proc.kill()
    sys.exit("FAIL: fewer than two tables within 60 s:\n" + "".join(lines))
time.sleep(0.3)
proc.send_signal(signal.SIGINT)
try:
    rc = proc.wait(10)
except subprocess.TimeoutExpired:
    proc.kill()
    sys.exit("FAIL: bp-smi --watch did not exit within 10 s of SIGINT")
t.join(5)
err = proc.stderr.read()
out = "".join(lines)
if rc != 0:
    sys.exit(f"FAIL: exit status {rc} after SIGINT (expected 0)\nstdout:\n{out}\nstderr:\n{err}")
if "\033[2J" in out:
    sys.exit("FAIL: the screen is cleared although stdout is not a terminal")
tables = out.split("bp-smi --watch 0.2: ")[1:]
if len(tables) < 2:
    sys.exit(f"FAIL: {len(tables)} table(s), expected at least 2:\n{out}")
for i, table in enumerate(tables):
    if "memory used/total" not in table or "\n  cpu:0 " not in table:
        sys.exit(f"FAIL: table {i + 1} lacks the header or the cpu:0 row:\n{table}")
    if f"refresh {i + 1} " not in table:
        sys.exit(f"FAIL: table {i + 1} is not numbered {i + 1}:\n{table}")
if not out.rstrip().endswith("bp-smi: stopped"):
    sys.exit(f"FAIL: the output does not end with 'bp-smi: stopped':\n{out[-400:]}")
print(f"ok: {len(tables)} tables, exit status 0 after SIGINT")
