#!/usr/bin/env python3
"""BACKPLANE_TRACE=path writes a whole-run Chrome trace at exit.

usage: env_trace_test.py TRACE_PROGRAM BP_SMI OUT_DIR
Runs the program (which never calls the profiler) with BACKPLANE_TRACE set and checks the
trace: valid JSON, per device two 'add' ops on the host track and two kernels on the device's
stream 0 with positive durations, one 'fill', and an implicit synchronisation of to_vector().
"""
import json
import os
import subprocess
import sys

prog, smi, out_dir = sys.argv[1:4]
devices = [d["device"] for d in json.loads(subprocess.check_output([smi, "--json"]))["devices"]]
path = os.path.join(out_dir, "env_trace.json")
if os.path.exists(path):
    os.remove(path)
env = dict(os.environ, BACKPLANE_TRACE=path)
r = subprocess.run([prog], env=env, capture_output=True, text=True, timeout=300)
if r.returncode != 0:
    sys.exit(f"FAIL: program exited {r.returncode}: {r.stderr}")
if f"trace written to {path}" not in r.stderr:
    sys.exit(f"FAIL: no 'trace written' note on stderr: {r.stderr!r}")
with open(path) as f:
    trace = json.load(f)
events = trace["traceEvents"]
wall = trace["otherData"]["wall_us"]
pids = {e["args"]["name"].split(" ")[0]: e["pid"] for e in events
        if e["ph"] == "M" and e["name"] == "process_name"}
for dev in devices:
    if dev not in pids:
        sys.exit(f"FAIL: no track for {dev}; tracks: {sorted(pids)}")
    host_adds = [e for e in events if e.get("cat") == "op" and e["name"] == "add"
                 and e["args"]["device"] == dev]
    kernels = [e for e in events if e.get("cat") == "kernel" and e["name"] == "add"
               and e["pid"] == pids[dev]]
    fills = [e for e in events if e.get("cat") == "op" and e["name"] == "fill"
             and e["args"]["device"] == dev]
    if len(host_adds) != 2 or len(kernels) != 2 or len(fills) != 1:
        sys.exit(f"FAIL: {dev}: {len(host_adds)} add ops, {len(kernels)} add kernels, "
                 f"{len(fills)} fills (expected 2, 2, 1)")
    for k in kernels:
        if not (0 < k["dur"] <= wall and k["tid"] == 0):
            sys.exit(f"FAIL: {dev}: kernel {k} has a duration outside (0, {wall}] or stream != 0")
    syncs = [e for e in events if e.get("cat") == "sync" and e["args"].get("device") == dev
             and e["args"].get("implicit") and e["args"].get("what") == "to_vector()"]
    if len(syncs) != 1:
        sys.exit(f"FAIL: {dev}: {len(syncs)} implicit synchronisations of to_vector() (expected 1)")
print(f"ok: {len(events)} events, devices {devices}")
