#!/usr/bin/env python3
"""Prints bench/dist's table: Backplane (bp-bench-dist) beside PyTorch + NCCL (torch_dist.py),
both measured in one run, with ratios and the goals that docs/distributed.md states.

    python3 bench/dist/compare_dist.py OUT_DIR N

OUT_DIR holds the RESULT lines of each program (tools/gpu/dist.sh writes them):
bp_collectives.txt, torch_collectives.txt, bp_latency.txt, torch_latency.txt, bp_ddpW.txt and torch_ddpW.txt for W = 1 and every
power of two up to N (and N), bp_curve1.txt, bp_curveN.txt. Exit status 0 when every goal is
met: bus bandwidth at least 0.95x PyTorch + NCCL for every op, dtype and size; a 4-byte
all_reduce no slower per call than PyTorch's; W-GPU training at
least 0.9 * W times one GPU's samples/s; the N-GPU loss curve within 1e-4 of one GPU's.
"""
import os
import sys

from torch_dist import size_bytes  # the same size names as both programs


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


def size_label(s):
    return s[:-1] + " KiB" if s[-1] in "Kk" else s[:-1] + " B" if s[-1] == "B" else s + " MiB"


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    ok = True
    rows = []
    bp = {tuple(r[:3]): float(r[5]) for r in results(f"{out}/bp_collectives.txt", "collective")}
    tc = {tuple(r[:3]): float(r[5]) for r in results(f"{out}/torch_collectives.txt", "collective")}
    print(f"\nbench/dist on {n} GPUs (bus bandwidth GB/s; ratio = Backplane / PyTorch + NCCL)")
    print(f"{'metric':44s} {'Backplane':>12s} {'PyTorch':>12s} {'ratio':>8s}  goal")
    for key in sorted(tc, key=lambda k: (k[0], k[1], size_bytes(k[2]))):
        b, t = bp.get(key), tc[key]
        ratio = b / t if b else 0.0
        goal = ratio >= 0.95
        ok &= goal
        print(f"{key[0] + ' ' + key[1] + ' ' + size_label(key[2]) + ' busbw':44s} {b or 0:12.2f} "
              f"{t:12.2f} {ratio:8.3f}  >= 0.95 {'PASS' if goal else 'FAIL'}")
    bl = results(f"{out}/bp_latency.txt", "latency")
    tl = results(f"{out}/torch_latency.txt", "latency")
    if bl and tl:
        b, t = float(bl[-1][3]), float(tl[-1][3])
        goal = b <= t
        ok &= goal
        print(f"{'all_reduce f32 4 B, us per call (lower wins)':44s} {b:12.2f} {t:12.2f} "
              f"{t / b:8.3f}  <= PyTorch {'PASS' if goal else 'FAIL'}")

    def ddp(path):
        r = results(path, "ddp")
        return float(r[-1][2]) if r else 0.0
    worlds = sorted({1, n} | {w for w in (2, 4, 8, 16, 32) if w < n})
    b1, t1 = ddp(f"{out}/bp_ddp1.txt"), ddp(f"{out}/torch_ddp1.txt")
    for w in worlds:
        bw, tw = ddp(f"{out}/bp_ddp{w}.txt"), ddp(f"{out}/torch_ddp{w}.txt")
        label = "1 GPU" if w == 1 else f"{w} GPUs (DDP)"
        print(f"{'MLP 4096x3 SGD samples/s, ' + label:44s} {bw:12.0f} {tw:12.0f} "
              f"{(bw / tw if tw else 0):8.3f}")
        if w == 1:
            continue
        scale_b = bw / b1 if b1 else 0.0
        scale_t = tw / t1 if t1 else 0.0
        goal = scale_b >= 0.9 * w
        ok &= goal
        print(f"{f'scaling {w} GPUs / 1 GPU':44s} {scale_b:12.3f} {scale_t:12.3f} "
              f"{'':8s}  >= {0.9 * w:.2f} {'PASS' if goal else 'FAIL'}")
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
