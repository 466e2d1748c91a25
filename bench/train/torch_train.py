#!/usr/bin/env python3
"""PyTorch side of bench/train: one SGD training step (zero_grad, forward, cross-entropy,
backward, step; lr 0.01, momentum 0.9) of Linear(1024,1024)-ReLU-Linear(1024,10) at batch
256, measured exactly as bp-bench-train measures Backplane (median of single steps each followed
by a device synchronisation, after warm-up; plus the mean per step when queued). Runs on the
CPU and, when available, on CUDA.

Standalone:  python3 bench/train/torch_train.py [--iters 300] [--warmup 30]
bp-bench-train runs it with --machine and reads lines
    RESULT <device> <median_us> <queued_us> <description>
    GRAPH <device> <median_us> <queued_us>      (the step captured in a CUDA graph, replayed)
"""
import argparse
import statistics
import sys
import time


def setup(torch, device):
    """The network, a fixed batch, SGD and the loss, seeded as bp-bench-train seeds its own."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                              torch.nn.Linear(1024, 10)).to(device)
    x = torch.randn(256, 1024, device=device)
    y = (torch.arange(256, device=device) * 7) % 10
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    return net, x, y, opt, torch.nn.CrossEntropyLoss()


def timed(step, sync, iters, warmup):
    """Median of single steps each followed by sync, after warm-up; then the mean per step of
    `iters` steps queued back to back."""
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    queued = (time.perf_counter() - t0) * 1e6 / iters
    return statistics.median(times), queued


def bench(torch, device, iters, warmup):
    net, x, y, opt, loss_fn = setup(torch, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step():
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    return timed(step, sync, iters, warmup)


def bench_graph(torch, device, iters, warmup):
    """The same step captured in a CUDA graph (torch.cuda.graph, the documented whole-network
    capture: warm-up on a side stream, grads set to None, forward + backward + step captured
    with static input tensors) and replayed; timed like bench()."""
    net, x, y, opt, loss_fn = setup(torch, device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(net(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
    return timed(graph.replay, torch.cuda.synchronize, iters, warmup)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--machine", action="store_true", help="print RESULT lines for bp-bench-train")
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
        if d.type == "cuda":
            gmed, gqueued = bench_graph(torch, d, args.iters, args.warmup)
            if args.machine:
                print(f"GRAPH {d.type} {gmed:.3f} {gqueued:.3f}", flush=True)
            else:
                print(f"{d.type:6s} CUDA graph replay median {gmed:9.1f} us   queued "
                      f"{gqueued:9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
