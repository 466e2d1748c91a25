#!/usr/bin/env python3
"""PyTorch side of bp-bench-resnet: the same ResNet-18 (CIFAR shape; tests/fixtures/torch/
resnet_torch.py) measured the same way (median of single steps each followed by a device
synchronisation, after warm-up), printing the same JSON lines:

    resnet18_train_f32_b256        eager, float32, TF32 off
    resnet18_train_bf16_b256       eager with torch.autocast(bfloat16) and channels-last
    resnet18_train_*_graph_b256    the eager row again: the bar for Backplane's bp::Graph
                                   replay is PyTorch eager (issue 26: at least 1.2x)
    resnet18_infer_b1 (us)         float32 latency at batch 1
    resnet18_infer_b256 (img/s)    float32 throughput

    python3 bench/resnet/torch_resnet.py [--device cuda:0] [--quick] [--only S] [--batch 256]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "fixtures", "torch"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", action="append", default=[])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_resnet.py: PyTorch is not installed", file=sys.stderr)
        return 0
    from resnet_torch import ResNet18

    batch, iters, warmup = args.batch, args.iters, 3
    if args.quick:
        batch, iters, warmup = min(batch, 32), min(iters, 5), 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # cuDNN's algorithm search as Backplane's is set (BACKPLANE_CUDNN_BENCHMARK=1: cudnnFind once
    # a shape, like cudnn.benchmark = True; unset: heuristics on both sides), so one command
    # compares like with like.
    benchmark = os.environ.get("BACKPLANE_CUDNN_BENCHMARK", "0") == "1"
    torch.backends.cudnn.benchmark = benchmark
    devices = args.device or (["cuda:0"] if torch.cuda.is_available() else ["cpu:0"])

    def wanted(m):
        return not args.only or args.only in m

    for name in devices:
        dev = torch.device(name.replace("cpu:0", "cpu"))
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

        def median_us(fn, n):
            for _ in range(warmup):
                fn()
            sync()
            t = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                sync()
                t.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(t)

        def emit(metric, value, unit, impl):
            print(json.dumps({"metric": metric, "device": name, "value": value, "unit": unit,
                              "impl": impl}), flush=True)

        for dt in ("f32", "bf16"):
            eager, graph = f"resnet18_train_{dt}_b{batch}", f"resnet18_train_{dt}_graph_b{batch}"
            if not (wanted(eager) or wanted(graph)):
                continue
            torch.manual_seed(0)
            net = ResNet18().to(dev)
            x = torch.randn(batch, 3, 32, 32, device=dev)
            y = torch.randint(0, 10, (batch,), device=dev)
            if dt == "bf16":
                net = net.to(memory_format=torch.channels_last)
                x = x.to(memory_format=torch.channels_last)
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            loss_fn = torch.nn.CrossEntropyLoss()

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dt == "bf16"):
                    loss = loss_fn(net(x), y)
                loss.backward()
                opt.step()

            rate = batch / (median_us(step, iters) * 1e-6)
            impl = f"torch {torch.__version__} eager" + (" autocast bf16 channels-last"
                                                         if dt == "bf16" else " f32")
            impl += ", cudnn.benchmark" if benchmark else ", cudnn heuristics"
            if wanted(eager):
                emit(eager, rate, "img/s", impl)
            if wanted(graph):
                emit(graph, rate, "img/s", impl + " (graph bar: 1.2x)")
        torch.manual_seed(0)
        net = ResNet18().to(dev).eval()
        with torch.no_grad():
            if wanted("resnet18_infer_b1"):
                x1 = torch.randn(1, 3, 32, 32, device=dev)
                emit("resnet18_infer_b1", median_us(lambda: net(x1), iters * 2), "us",
                     f"torch {torch.__version__} eager f32")
            if wanted(f"resnet18_infer_b{batch}"):
                xb = torch.randn(batch, 3, 32, 32, device=dev)
                emit(f"resnet18_infer_b{batch}", batch / (median_us(lambda: net(xb), iters) * 1e-6),
                     "img/s", f"torch {torch.__version__} eager f32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
