#!/usr/bin/env python3
"""Where a GPT-2 small training step spends its device time, Backplane against PyTorch: the
same model and step as gpt2_compare.py's throughput rows (bf16 autocast, AdamW, batch 8 x 1024),
profiled for --steps steps after --warmup, with each side's own profiler:

- Backplane: backplane.profiler (every launch's device time), its key_averages() table and a
  Chrome trace;
- PyTorch: torch.profiler with CUDA activity, key_averages() sorted by device time.

Also the wall time per step of each (synchronised after the profiled steps) and the sum of the
device times, so the host's share (time the GPU waits for launches) shows as wall minus device.

    python3 bench/gpt2/gpt2_profile.py --device cuda:0 --out out/gpt2-profile

Writes bp-table.txt, torch-table.txt, bp-trace.json and summary.json into --out.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_compare as gc  # noqa: E402


def ms_per_step(step, sync, n):
    """Runs n steps and returns the wall time per step in ms, synchronised at both ends."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t0) / max(n, 1) * 1e3


def profile_bp(device, cfg, batch, seq, a):
    import numpy as np

    import backplane as bp

    dev = bp.device(device)
    bp.set_allow_tf32(False)
    bp.manual_seed(0)
    model = bp.models.GPT(bp.models.GPTConfig(**cfg, gelu_approximate="tanh"), device=dev)
    opt = bp.optim.AdamW(model.parameters(), **gc.ADAMW, fused=True)
    rng = np.random.default_rng(0)
    x, y = (bp.from_numpy(rng.integers(0, cfg["vocab_size"], size=(batch, seq), dtype=np.int64))
            .to(dev) for _ in range(2))
    V = cfg["vocab_size"]

    def step():
        opt.zero_grad()
        with bp.autocast(dev.type, dtype=bp.bfloat16):
            loss = bp.nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()

    sync = lambda: bp.synchronize(dev)  # noqa: E731
    ms_per_step(step, sync, a.warmup)
    wall_plain = ms_per_step(step, sync, a.steps)
    with bp.profiler.profile() as prof:
        wall = ms_per_step(step, sync, a.steps)
    rows = prof.key_averages()
    table = rows.table(row_limit=a.rows)
    prof.export_chrome_trace(os.path.join(a.out, "bp-trace.json"))
    device_us = sum(r.device_time_total for r in rows) / a.steps
    return {"wall_ms": wall_plain, "wall_profiled_ms": wall,
            "device_ms": device_us / 1e3,
            "top": [{"key": r.key, "count": r.count / a.steps,
                     "device_ms": r.device_time_total / a.steps / 1e3} for r in rows[:a.rows]]}, table


def profile_torch(device, cfg, batch, seq, a):
    import torch
    from torch.profiler import ProfilerActivity, profile

    tdev = gc.torch_device(torch, device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = gc.torch_gpt(torch, cfg).to(tdev)
    opt = torch.optim.AdamW(model.parameters(), **gc.ADAMW, fused=True)
    x = torch.randint(0, cfg["vocab_size"], (batch, seq), device=tdev)
    y = torch.randint(0, cfg["vocab_size"], (batch, seq), device=tdev)
    V = cfg["vocab_size"]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(tdev.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), y.view(-1))
        loss.backward()
        opt.step()

    ms_per_step(step, torch.cuda.synchronize, a.warmup)
    wall_plain = ms_per_step(step, torch.cuda.synchronize, a.steps)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = ms_per_step(step, torch.cuda.synchronize, a.steps)
    avgs = prof.key_averages()
    table = avgs.table(sort_by="self_cuda_time_total", row_limit=a.rows)
    # Kernel rows only (the device-side events), so the sum is the GPU's busy time.
    kernels = [e for e in prof.events() if getattr(e.device_type, "name", "") == "CUDA"]
    device_us = sum(e.time_range.elapsed_us() for e in kernels) / a.steps
    by_name = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:a.rows]
    return {"wall_ms": wall_plain, "wall_profiled_ms": wall,
            "device_ms": device_us / 1e3,
            "top": [{"key": k, "device_ms": v / a.steps / 1e3} for k, v in top]}, table


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--out", default="gpt2-profile")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    cfg = dict(gc.GPT2_SMALL)
    summary = {}
    for name, fn in (("backplane", profile_bp), ("pytorch", profile_torch)):
        r, table = fn(a.device, cfg, a.batch, a.seq, a)
        summary[name] = r
        fname = "bp-table.txt" if name == "backplane" else "torch-table.txt"
        with open(os.path.join(a.out, fname), "w") as f:
            f.write(table)
        print(f"== {name}: wall {r['wall_ms']:.1f} ms/step (profiled {r['wall_profiled_ms']:.1f}),"
              f" device busy {r['device_ms']:.1f} ms/step")
        for row in r["top"][:25]:
            print(f"   {row['device_ms']:8.3f} ms  {row['key'][:110]}")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
