#!/usr/bin/env python3
"""Prints bench/dist's table: Backplane (bp-bench-dist) beside PyTorch + NCCL (torch_dist.py),
both measured in one run, with ratios and the goals of DESIGN.md section 7.

    python3 bench/dist/compare_dist.py OUT_DIR N

OUT_DIR holds the RESULT lines of each program (tools/gpu/dist.sh writes them):
bp_collectives.txt, torch_collectives.txt, bp_ddp1.txt, bp_ddpN.txt, torch_ddp1.txt,
torch_ddpN.txt, bp_curve1.txt, bp_curveN.txt. Exit status 0 when every goal is met.
"""
import os
import sys


def results(path, kind):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "[rank":  # bp-run's prefix "[rank R] "
            parts = parts[2:]
        if len(parts) >= 2 and parts[0] == "RESULT" and parts[1] == kind:
            out.append(parts[2:])
    return out


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    ok = True
    rows = []
    bp = {(r[0], r[1]): float(r[4]) for r in results(f"{out}/bp_collectives.txt", "collective")}
    tc = {(r[0], r[1]): float(r[4]) for r in results(f"{out}/torch_collectives.txt", "collective")}
    print(f"\nbench/dist on {n} GPUs (bus bandwidth GB/s; ratio = Backplane / PyTorch + NCCL)")
    print(f"{'metric':44s} {'Backplane':>12s} {'PyTorch':>12s} {'ratio':>8s}  goal")
    for key in sorted(tc, key=lambda k: (k[0], int(k[1]))):
        b, t = bp.get(key), tc[key]
        ratio = b / t if b else 0.0
        goal = ratio >= 0.95
        ok &= goal
        print(f"{key[0] + ' ' + key[1] + ' MiB busbw':44s} {b or 0:12.1f} {t:12.1f} "
              f"{ratio:8.3f}  >= 0.95 {'PASS' if goal else 'FAIL'}")
    def ddp(path):
        r = results(path, "ddp")
        return float(r[-1][2]) if r else 0.0
    b1, bn = ddp(f"{out}/bp_ddp1.txt"), ddp(f"{out}/bp_ddp{n}.txt")
    t1, tn = ddp(f"{out}/torch_ddp1.txt"), ddp(f"{out}/torch_ddp{n}.txt")
    print(f"{'MLP 4096x3 SGD samples/s, 1 GPU':44s} {b1:12.0f} {t1:12.0f} "
          f"{(b1 / t1 if t1 else 0):8.3f}")
    print(f"{f'MLP 4096x3 SGD samples/s, {n} GPUs (DDP)':44s} {bn:12.0f} {tn:12.0f} "
          f"{(bn / tn if tn else 0):8.3f}")
    scale_b = bn / b1 if b1 else 0.0
    scale_t = tn / t1 if t1 else 0.0
    goal = scale_b >= 0.95 * n
    ok &= goal
    print(f"{f'scaling {n} GPUs / 1 GPU':44s} {scale_b:12.3f} {scale_t:12.3f} "
          f"{'':8s}  >= {0.95 * n:.2f} {'PASS' if goal else 'FAIL'}")
    c1 = [float(r[2]) for r in results(f"{out}/bp_curve1.txt", "curve")]
    cn = [float(r[2]) for r in results(f"{out}/bp_curve{n}.txt", "curve")]
    if c1 and len(c1) == len(cn):
        worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(cn, c1))
        goal = worst <= 1e-4
        ok &= goal
        print(f"{f'loss curve, {n} GPUs vs 1 GPU on the combined batch':44s} "
              f"max relative difference {worst:.2e}  <= 1e-4 {'PASS' if goal else 'FAIL'}")
    else:
        ok = False
        print("loss curve: missing results")
    print("\nALL GOALS MET" if ok else "\nSOME GOALS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
