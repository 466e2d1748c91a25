#!/usr/bin/env python3
"""Runs bp-bench and the reference (bench/torch_bench.py: PyTorch, or NumPy without it) in one
command on one machine and prints one table with ratios Backplane / reference.

    python3 bench/compare.py [--bp build/bin/bp-bench] [--device cuda:0] [--quick] [--only S]
                             [--repeat N] [--json FILE] [--ref-bin PROGRAM]

--ref-bin runs PROGRAM (same options, same JSON lines) as the reference instead of
bench/torch_bench.py: bench/libtorch/torch_per_op.cpp built against libtorch
(tools/gpu/libtorch_bench.sh), so per-op costs compare C++ with C++.

--repeat N runs both N times, alternating (Backplane, reference, Backplane, ...), and reports
the median of each side and the ratio of the medians, with the spread (min-max) of each side;
the header names the date, the machine and the exact command, so a table in README.md can say
where it came from (issue 17: one noisy reference sample once went into README).

For throughputs (GB/s, TFLOP/s) ratio > 1 means Backplane is faster; for times (us) the
ratio is Backplane's time over the reference's, so < 1 means faster."""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--bp", default=os.path.join(here, "..", "build", "bin", "bp-bench"))
p.add_argument("--device", action="append", default=[])
p.add_argument("--quick", action="store_true")
p.add_argument("--only", default="")
p.add_argument("--repeat", type=int, default=1, help="runs of each side; medians are reported")
p.add_argument("--json", help="write all rows to this file")
p.add_argument("--ref-bin", help="reference program printing bp-bench's JSON lines "
               "(default: bench/torch_bench.py)")
args = p.parse_args()
if args.repeat < 1:
    p.error("--repeat must be at least 1")

extra = (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
bp_cmd = [args.bp] + sum((["--device", d] for d in args.device), []) + extra
ref_cmd = ([args.ref_bin] if args.ref_bin else [sys.executable, os.path.join(
    here, "torch_bench.py")]) + extra + sum((["--device", d] for d in args.device), [])


def run_bp():
    out = subprocess.run(bp_cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.strip()]


def run_ref():
    ref = subprocess.run(ref_cmd, capture_output=True, text=True)
    if ref.returncode != 0:
        print(ref.stderr, file=sys.stderr)
    return [json.loads(l) for l in ref.stdout.splitlines() if l.strip().startswith("{")]


# samples[(metric, device)] = [values...], in the order bp-bench printed them.
bp_samples, bp_rows, ref_samples, ref_info = {}, {}, {}, {}
for i in range(args.repeat):
    for r in run_bp():
        key = (r["metric"], r["device"])
        bp_rows.setdefault(key, r)
        bp_samples.setdefault(key, []).append(r["value"])
    for r in run_ref():
        key = (r["metric"], r["device"].split(":")[0])
        ref_info.setdefault(key, r)
        ref_samples.setdefault(key, []).append(r["value"])
    if args.repeat > 1:
        print(f"run {i + 1}/{args.repeat} done", file=sys.stderr)

command = " ".join(shlex.quote(a) for a in ["python3", os.path.relpath(__file__)] + sys.argv[1:])
now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
print(f"# {now} on {platform.node()}: {command}")
what = "median of %d runs each, interleaved" % args.repeat if args.repeat > 1 else "one run"
print(f"# values: {what}; ratio = Backplane / reference")


def spread(v):
    return f"{min(v):.3g}-{max(v):.3g}" if len(v) > 1 else ""


print(f"{'metric':<28} {'device':<9} {'backplane':>12} {'reference':>12} {'unit':<8} "
      f"{'ratio':>7}  {'bp spread':>17} {'ref spread':>17}  reference impl")
rows = []
for key, r in bp_rows.items():
    kind = key[1].split(":")[0]
    value = statistics.median(bp_samples[key])
    ref_v = ref_samples.get((key[0], kind))
    ref_med = statistics.median(ref_v) if ref_v else None
    ratio = value / ref_med if ref_med else None
    impl = ref_info[(key[0], kind)]["impl"] if ref_v else None
    rows.append({**r, "value": value, "samples": bp_samples[key], "reference": ref_med,
                 "reference_samples": ref_v, "reference_impl": impl, "ratio": ratio,
                 "repeat": args.repeat, "date": now, "command": command})
    print(f"{key[0]:<28} {key[1]:<9} {value:>12.3f} "
          f"{(ref_med if ref_med is not None else float('nan')):>12.3f} {r['unit']:<8} "
          f"{(f'{ratio:.2f}x' if ratio else '-'):>7}  {spread(bp_samples[key]):>17} "
          f"{spread(ref_v) if ref_v else '':>17}  {impl or '-'}")
if args.json:
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
