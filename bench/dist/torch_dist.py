#!/usr/bin/env python3
"""PyTorch + NCCL side of bench/dist, measured exactly as bp-bench-dist measures Backplane.

    python3 -m torch.distributed.run --nproc_per_node=2 bench/dist/torch_dist.py collectives
    python3 -m torch.distributed.run --nproc_per_node=2 bench/dist/torch_dist.py latency
    python3 -m torch.distributed.run --nproc_per_node=2 bench/dist/torch_dist.py ddp
    python3 -m torch.distributed.run --nproc_per_node=2 bench/dist/torch_dist.py curve

Rank 0 prints the RESULT lines of bp_bench_dist.cpp. Each rank uses cuda:<local rank>; the
collectives run on the default stream and are waited for at the end of each timed loop, the
model is the same MLP (4096-4096-4096-10, f32, TF32 off) trained with SGD, plain on one rank and
with DistributedDataParallel on several.
"""
import argparse
import os
import sys
import time


def size_bytes(s):
    """'64K' KiB, '4B' bytes, '256' MiB (bp_bench_dist.cpp's size names)."""
    if s[-1] in "Kk":
        return int(s[:-1]) << 10
    if s[-1] == "B":
        return int(s[:-1])
    return int(s) << 20


def median(v):
    return sorted(v)[len(v) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["collectives", "latency", "ddp", "curve"])
    ap.add_argument("--sizes", default="64K,1,4,64,256")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--combined", type=int, default=2048)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl", device_id=dev)
    n, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        print(f"torch_dist {args.mode}: {n} rank(s), torch {torch.__version__}, "
              f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{torch.cuda.get_device_name(dev)}", flush=True)

    if args.mode == "latency":
        x = torch.rand(1, device=dev)
        for _ in range(20):
            dist.all_reduce(x, async_op=True).wait()
        dist.barrier()
        torch.cuda.synchronize()
        calls = args.iters or 2000
        times = []
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x, async_op=True).wait()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / calls)
        if rank == 0:
            print(f"RESULT latency all_reduce f32 4B {median(times) * 1e6:.2f}", flush=True)
    elif args.mode == "collectives":
        dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
                  "f64": torch.float64}
        cases = [(op, d, m) for op in ["all_reduce", "all_gather", "reduce_scatter"]
                 for d in args.dtypes.split(",") for m in args.sizes.split(",")]
        for op, dname, size in cases:
            dt = dtypes[dname]
            esize = torch.empty(0, dtype=dt).element_size()
            elems = size_bytes(size) // esize
            elems -= elems % n
            elems = max(elems, n)
            iters = args.iters or 20
            calls = max(iters, 200) if size_bytes(size) < (64 << 20) else iters
            full = torch.rand(elems, device=dev).to(dt)
            part = torch.rand(elems // n, device=dev).to(dt)

            def call():
                if op == "all_reduce":
                    return dist.all_reduce(full, async_op=True)
                if op == "all_gather":
                    return dist.all_gather_into_tensor(full, part, async_op=True)
                return dist.reduce_scatter_tensor(part, full, async_op=True)

            for _ in range(3):
                call().wait()
            dist.barrier()
            torch.cuda.synchronize()
            times = []
            for _ in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                works = [call() for _ in range(calls)]
                for w in works:
                    w.wait()
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) / calls)
            t = median(times)
            algbw = elems * esize / t / 1e9
            factor = 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1.0) / n
            if rank == 0:
                print(f"RESULT collective {op} {dname} {size} {t * 1e6:.1f} {algbw:.2f} "
                      f"{algbw * factor:.2f}", flush=True)
    else:
        curve = args.mode == "curve"
        steps = args.steps or (20 if curve else 60)
        warmup = 0 if curve else args.warmup
        per = args.combined // n if curve else args.batch
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                  torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                  torch.nn.Linear(4096, 10)).to(dev)
        model = net
        if n > 1:
            model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = torch.nn.CrossEntropyLoss()

        def rows(step, combined, first, count):
            gx = torch.Generator(device=dev).manual_seed(1000 + step)
            gy = torch.Generator(device=dev).manual_seed(5000 + step)
            x = torch.randn(combined, 4096, device=dev, generator=gx)
            y = (torch.rand(combined, device=dev, generator=gy) * 10).long()
            return x[first:first + count].contiguous(), y[first:first + count].contiguous()

        data = [] if curve else [rows(k * n + rank, per, 0, per) for k in range(4)]
        losses = []

        def step(s):
            x, y = rows(s, args.combined, rank * per, per) if curve else data[s % len(data)]
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())

        for s in range(warmup):
            step(s)
        if n > 1:
            dist.barrier()
        torch.cuda.synchronize()
        losses.clear()
        t0 = time.perf_counter()
        for s in range(steps):
            step(s)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        if curve:
            for s, l in enumerate(losses):
                l = l.reshape(1).clone()
                if n > 1:
                    dist.all_reduce(l, op=dist.ReduceOp.AVG)
                if rank == 0:
                    print(f"RESULT curve {n} {s} {l.item():.7f}", flush=True)
        elif rank == 0:
            print(f"RESULT ddp {n} {per} {per * n * steps / t:.0f} {t / steps * 1e3:.3f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
