"""Python per-op overhead: a one-element add, backplane against PyTorch's eager add in the same
run, interleaved (goal on cuda:0: backplane's time at most 0.8x PyTorch's).

    python bench/python/op_overhead.py [--device cuda:0] [--n 20000] [--rounds 3] [--json F]

Rows: the add queued n times then one synchronisation (the per-op cost of Python + dispatch +
launch), the add followed by a synchronisation each time (launch + wait), and 1000 add_
captured once in a graph and replayed n / 1000 times (backplane.Graph against
torch.cuda.CUDAGraph; CUDA only for torch). Medians over the rounds, in microseconds per op.
"""
import argparse
import json
import statistics
import time

import backplane as bp


def per_op(body, sync, n):
    sync()
    t0 = time.perf_counter()
    body(n)
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0" if bp.num_gpus() else "cpu:0")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = bp.device(args.device)
    a = bp.ones(1, device=dev)
    b = bp.ones(1, device=dev)

    def bp_queued(n):
        for _ in range(n):
            c = a + b  # noqa: F841
        return None

    def bp_synced(n):
        for _ in range(n):
            c = a + b  # noqa: F841
            dev.synchronize()

    def bp_sync():
        dev.synchronize()

    acc = bp.zeros(1, device=dev)

    def bp_block():
        for _ in range(1000):
            acc.add_(b)

    graph = bp.capture(bp_block, dev)

    def bp_replay(n):
        for _ in range(max(n // 1000, 1)):
            graph.replay()

    cases = {"add queued": [bp_queued], "add + sync": [bp_synced],
             "add_ x1000 graph replay": [bp_replay]}
    try:
        import torch
        tdev = torch.device(args.device.replace("cpu:0", "cpu"))
        ta = torch.ones(1, device=tdev)
        tb = torch.ones(1, device=tdev)
        tsync = torch.cuda.synchronize if tdev.type == "cuda" else (lambda: None)

        def t_queued(n):
            for _ in range(n):
                c = ta + tb  # noqa: F841

        def t_synced(n):
            for _ in range(n):
                c = ta + tb  # noqa: F841
                tsync()

        cases["add queued"].append(t_queued)
        cases["add + sync"].append(t_synced)
        if tdev.type == "cuda":
            tacc = torch.zeros(1, device=tdev)
            tgraph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(1000):  # warm-up on the capture stream
                    tacc.add_(tb)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(tgraph):
                for _ in range(1000):
                    tacc.add_(tb)

            def t_replay(n):
                for _ in range(max(n // 1000, 1)):
                    tgraph.replay()

            cases["add_ x1000 graph replay"].append(t_replay)
        ref = f"torch {torch.__version__}"
    except ImportError:
        tsync = None
        ref = None
    # Warm-up: caches, allocator pools, first launches.
    for fns in cases.values():
        per_op(fns[0], bp_sync, 1000)
        if len(fns) > 1:
            per_op(fns[1], tsync, 1000)
    results = {k: ([], []) for k in cases}
    for _ in range(args.rounds):
        for name, fns in cases.items():
            n = {"add queued": args.n, "add + sync": max(args.n // 4, 100)}.get(
                name, max(args.n // 1000, 1) * 1000)
            results[name][0].append(per_op(fns[0], bp_sync, n))
            if len(fns) > 1:
                results[name][1].append(per_op(fns[1], tsync, n))
    print(f"Python per-op overhead on {dev} ({dev.name}); reference: {ref or 'none (no torch)'}")
    print(f"| {'metric (us/op, median of ' + str(args.rounds) + ')':<36} | backplane | "
          f"{'torch':>9} | ratio |")
    print(f"|{'-' * 38}|-----------|-----------|-------|")
    out = {"device": str(dev), "reference": ref, "rows": []}
    for name, (ours, theirs) in results.items():
        m = statistics.median(ours)
        t = statistics.median(theirs) if theirs else float("nan")
        print(f"| {'1-element ' + name:<36} | {m:9.2f} | {t:9.2f} | {m / t:5.2f} |")
        out["rows"].append({"metric": name, "backplane_us": m, "torch_us": t, "ratio": m / t})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
