#!/usr/bin/env python3
"""PyTorch side of bench/mlp: forward of Linear(1024,1024)-ReLU-Linear(1024,10) at batch 256,
measured exactly as bp-bench-mlp measures Backplane (median of many single forwards, each
followed by a device synchronisation, after warm-up; plus the mean per forward when many are
queued and synchronised once). Runs on the CPU and, when available, on CUDA.

Standalone:  python3 bench/mlp/torch_mlp.py [--iters 300] [--warmup 30]
bp-bench-mlp runs it with --machine and reads lines
    RESULT <device> <median_us> <queued_us> <description>
"""
import argparse
import statistics
import sys
import time


def bench(torch, device, iters, warmup):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                              torch.nn.Linear(1024, 10)).to(device)
    x = torch.randn(256, 1024, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for _ in range(warmup):
            net(x)
        sync()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            net(x)
            sync()
            times.append((time.perf_counter() - t0) * 1e6)
        t0 = time.perf_counter()
        for _ in range(iters):
            net(x)
        sync()
        queued = (time.perf_counter() - t0) * 1e6 / iters
    return statistics.median(times), queued


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--machine", action="store_true", help="print RESULT lines for bp-bench-mlp")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"UNAVAILABLE torch cannot be imported ({e})")
        return 0
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.insert(0, torch.device("cuda:0"))
    for d in devices:
        median, queued = bench(torch, d, args.iters, args.warmup)
        name = torch.cuda.get_device_name(d) if d.type == "cuda" else \
            f"CPU, {torch.get_num_threads()} threads"
        desc = f"torch {torch.__version__} {name}"
        if args.machine:
            print(f"RESULT {d.type} {median:.3f} {queued:.3f} {desc}", flush=True)
        else:
            print(f"{d.type:6s} median {median:9.1f} us   queued {queued:9.1f} us   ({desc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
