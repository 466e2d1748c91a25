#!/usr/bin/env python3
"""Runs bp-bench and the reference (bench/torch_bench.py: PyTorch, or NumPy without it) in one
command on one machine and prints one table with ratios Backplane / reference.

    python3 bench/compare.py [--bp build/bin/bp-bench] [--device cuda:0] [--quick] [--only S]

For throughputs (GB/s, TFLOP/s) ratio > 1 means Backplane is faster; for times (us) the
ratio is Backplane's time over the reference's, so < 1 means faster."""
import argparse
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--bp", default=os.path.join(here, "..", "build", "bin", "bp-bench"))
p.add_argument("--device", action="append", default=[])
p.add_argument("--quick", action="store_true")
p.add_argument("--only", default="")
p.add_argument("--json", help="write all rows to this file")
args = p.parse_args()

extra = (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
bp_cmd = [args.bp] + sum((["--device", d] for d in args.device), []) + extra
bp_rows = [json.loads(l) for l in subprocess.run(bp_cmd, check=True, capture_output=True,
                                                   text=True).stdout.splitlines() if l.strip()]
ref = subprocess.run([sys.executable, os.path.join(here, "torch_bench.py")] + extra +
                     sum((["--device", d] for d in args.device), []),
                     capture_output=True, text=True)
if ref.returncode != 0:
    print(ref.stderr, file=sys.stderr)
ref_rows = [json.loads(l) for l in ref.stdout.splitlines() if l.strip().startswith("{")]
refs = {(r["metric"], r["device"].split(":")[0]): r for r in ref_rows}

print(f"{'metric':<28} {'device':<9} {'backplane':>12} {'reference':>12} {'unit':<8} "
      f"{'ratio':>7}  reference impl")
rows = []
for r in bp_rows:
    kind = r["device"].split(":")[0]
    ref_r = refs.get((r["metric"], kind))
    ratio = ""
    if ref_r and ref_r["value"] > 0:
        ratio = r["value"] / ref_r["value"]
    rows.append({**r, "reference": ref_r["value"] if ref_r else None,
                 "reference_impl": ref_r["impl"] if ref_r else None,
                 "ratio": ratio if ratio != "" else None})
    print(f"{r['metric']:<28} {r['device']:<9} {r['value']:>12.3f} "
          f"{(ref_r['value'] if ref_r else float('nan')):>12.3f} {r['unit']:<8} "
          f"{(f'{ratio:.2f}x' if ratio != '' else '-'):>7}  {ref_r['impl'] if ref_r else '-'}")
if args.json:
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
