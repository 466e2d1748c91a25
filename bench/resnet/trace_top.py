#!/usr/bin/env python3
"""Where a training step's device time goes: sums the device intervals of a Chrome trace that
Backplane's profiler wrote (BACKPLANE_TRACE=path.json) by op name, or of PyTorch's profiler for
the same model (--torch), and prints the largest.

    python3 bench/resnet/trace_top.py trace.json [--top 25] [--last 0.5]
    python3 bench/resnet/trace_top.py --torch [--dtype f32|bf16] [--batch 256] [--top 25]
        [--device cuda|cpu]
"""
import argparse
import collections
import json
import os
import sys


def backplane(path, top, last):
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    by, n = collections.Counter(), collections.Counter()
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "memcpy")]
    # --last F: only the intervals in the last F of the trace's time span (steady state, past
    # the warm-up's first launches, which include module loads and library set-up).
    if device and last < 1:
        t0 = min(e["ts"] for e in device)
        t1 = max(e["ts"] for e in device)
        device = [e for e in device if e["ts"] >= t1 - last * (t1 - t0)]
    for e in device:
        by[e["name"]] += e.get("dur", 0)
        n[e["name"]] += 1
    total = sum(by.values())
    print(f"backplane device time {total / 1e3:.2f} ms over {sum(n.values())} intervals")
    for name, us in by.most_common(top):
        print(f"  {name:<36} {us / 1e3:9.3f} ms {100 * us / max(total, 1):5.1f}%  x{n[name]}")


def torch_profile(dtype, batch, top, device="cuda"):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests", "fixtures", "torch"))
    from resnet_torch import ResNet18
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model = ResNet18(10, 64).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if dtype == "bf16":
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], torch.bfloat16, enabled=dtype == "bf16"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    sync()
    kind = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[kind]) as p:
        for _ in range(5):
            step()
        sync()
    sort = "cuda_time_total" if cuda else "self_cpu_time_total"
    print(p.key_averages().table(sort_by=sort, row_limit=top, max_name_column_width=50))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--device", default="cuda", help="the PyTorch profile's device (cuda or cpu)")
    ap.add_argument("--last", type=float, default=1.0,
                    help="only the last fraction of the trace's span (Backplane traces)")
    a = ap.parse_args()
    if a.torch:
        torch_profile(a.dtype, a.batch, a.top, a.device)
    else:
        backplane(a.trace, a.top, a.last)


if __name__ == "__main__":
    main()
