#!/usr/bin/env python3
"""The character GPT (examples/gpt) trained with one seed on several devices: the loss curves
must agree (issue 27: cpu:0 against opencl:0). Each device's run prints JSON lines
{"step", "train_loss", "val_loss"}; every report must match the first device's within --tol
(absolute; the backends sum in different orders, so f32 rounding drifts a little over the
run), and the run must learn (the last validation loss below --max-loss).

    gpt_devices.py --binary example-gpt --devices cpu:0,opencl:0 [--steps 60]
"""
import argparse
import json
import subprocess
import sys


def curve(binary, device, steps, every):
    cmd = [binary, "--device", device, "--layers", "2", "--heads", "2", "--width", "64",
           "--context", "64", "--batch", "16", "--steps", str(steps), "--dropout", "0",
           "--lr", "3e-3", "--eval-every", str(every)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"step"')]
    print(f"{device}: " + ", ".join(f"step {x['step']} train {x['train_loss']:.4f} "
                                     f"val {x['val_loss']:.4f}" for x in rows), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--devices", default="cpu:0,opencl:0")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--tol", type=float, default=5e-3)
    ap.add_argument("--max-loss", type=float, default=3.0)
    a = ap.parse_args()
    devices = a.devices.split(",")
    curves = {d: curve(a.binary, d, a.steps, a.every) for d in devices}
    ref = curves[devices[0]]
    bad = []
    for d in devices[1:]:
        if len(curves[d]) != len(ref):
            bad.append(f"{d}: {len(curves[d])} reports, {devices[0]} has {len(ref)}")
            continue
        for x, y in zip(ref, curves[d]):
            for k in ("train_loss", "val_loss"):
                if not abs(x[k] - y[k]) <= a.tol:
                    bad.append(f"step {x['step']} {k}: {devices[0]} {x[k]:.4f}, {d} {y[k]:.4f} "
                               f"(tolerance {a.tol})")
    last = ref[-1]["val_loss"] if ref else float("inf")
    if not last < a.max_loss:
        bad.append(f"{devices[0]} did not learn: last validation loss {last:.4f} >= {a.max_loss}")
    if bad:
        print("FAIL\n" + "\n".join(bad))
        return 1
    print(f"PASS: {len(ref)} reports agree within {a.tol} on {', '.join(devices)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
