#!/usr/bin/env python3
"""bp-smi --watch: redraws the device table until SIGINT, then exits 0, and lists what other
Backplane programs publish with BACKPLANE_PUBLISH_STATS=1.

usage: smi_watch_test.py BP_SMI TRACE_PROGRAM OUT_DIR
1. starts `TRACE_PROGRAM --hold` (3 MiB on cpu:0) with BACKPLANE_PUBLISH_STATS=1;
2. runs `bp-smi --watch 0.2` with stdout on a pipe (plain tables, no screen clearing) until at
   least two tables have appeared (at most 60 s), sends SIGINT and checks the exit status, the
   tables (numbered, each with cpu:0) and the holder's row (its pid, cpu:0, 3MiB);
3. kills the holder with SIGKILL (no clean-up at exit) and checks that the next bp-smi --watch
   removes its stale file and lists no process.
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

smi, prog, out_dir = sys.argv[1:4]
stats = os.path.join(out_dir, "smi_watch_stats")
shutil.rmtree(stats, ignore_errors=True)
env = dict(os.environ, BACKPLANE_STATS_DIR=stats)


def watch(min_tables, until=None):
    """Runs bp-smi --watch 0.2 until min_tables tables (each passing `until`) appeared."""
    proc = subprocess.Popen([smi, "--watch", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines, done = [], threading.Event()

    def reader():
        for line in proc.stdout:
            lines.append(line)
            tables = "".join(lines).split("bp-smi --watch 0.2: ")[1:]
            complete = [t for t in tables if t.endswith("\n\n")]
            if len(complete) >= min_tables and (until is None or until(complete[-1])):
                done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    if not done.wait(60):
        proc.kill()
        sys.exit(f"FAIL: not {min_tables} complete tables within 60 s:\n" + "".join(lines))
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
    if not out.rstrip().endswith("bp-smi: stopped"):
        sys.exit(f"FAIL: the output does not end with 'bp-smi: stopped':\n{out[-400:]}")
    tables = out.split("bp-smi --watch 0.2: ")[1:]
    for i, table in enumerate(tables):
        if "memory used/total" not in table or "\n  cpu:0 " not in table:
            sys.exit(f"FAIL: table {i + 1} lacks the header or the cpu:0 row:\n{table}")
        if f"refresh {i + 1} " not in table:
            sys.exit(f"FAIL: table {i + 1} is not numbered {i + 1}:\n{table}")
    return tables


holder = subprocess.Popen([prog, "--hold"], stdout=subprocess.PIPE, text=True,
                          env=dict(env, BACKPLANE_PUBLISH_STATS="1"))
try:
    if holder.stdout.readline().strip() != "holding":
        sys.exit("FAIL: the holder did not start")

    def holder_listed(table):
        return any(l.startswith(f"  {holder.pid:<8} ") and " cpu:0 " in l and " 3MiB " in l
                   for l in table.splitlines())

    tables = watch(2, holder_listed)
    if len(tables) < 2:
        sys.exit(f"FAIL: {len(tables)} table(s), expected at least 2")
    listed = sum(1 for t in tables if holder_listed(t))
    print(f"ok: {len(tables)} tables, exit status 0 after SIGINT; the holder (pid {holder.pid}) "
          f"listed with 3MiB on cpu:0 in {listed}")
finally:
    holder.kill()  # SIGKILL: its file stays behind
    holder.wait()

stale = os.path.join(stats, f"{holder.pid}.json")
if not os.path.exists(stale):
    sys.exit(f"FAIL: {stale} should still exist after SIGKILL")
tables = watch(1)
if os.path.exists(stale):
    sys.exit(f"FAIL: bp-smi --watch left the stale {stale} of a dead process")
if "(none: run a program with BACKPLANE_PUBLISH_STATS=1" not in tables[0]:
    sys.exit(f"FAIL: a dead process is still listed:\n{tables[0]}")
print("ok: the dead holder's file was removed and no process is listed")
