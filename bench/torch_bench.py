#!/usr/bin/env python3
"""The reference side of bench/compare.py: the same measurements as bp-bench with PyTorch on
each device kind asked for (`--device cpu:0`, `--device cuda:0`; without any: CUDA when
available, and the CPU) or, where PyTorch is missing, NumPy on the CPU. One JSON object per
line: {"metric", "device", "value", "unit", "impl"}."""
import json
import statistics
import sys
import time

quick = "--quick" in sys.argv
only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
kinds = {sys.argv[i + 1].split(":")[0] for i, a in enumerate(sys.argv[:-1]) if a == "--device"}


def emit(metric, device, value, unit, impl):
    print(json.dumps({"metric": metric, "device": device, "value": value, "unit": unit,
                      "impl": impl}), flush=True)


def wanted(metric):
    return not only or only in metric


def torch_bench(torch, dev):
    cuda = dev.startswith("cuda")
    impl = "torch " + torch.__version__
    if not cuda:
        impl += f" ({torch.get_num_threads()} threads)"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def time_ms(fn, reps, inner=1):
        for _ in range(max(2, reps // 5)):
            fn()
        sync()
        samples = []
        for _ in range(reps):
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(inner):
                    fn()
                e.record()
                e.synchronize()
                samples.append(s.elapsed_time(e) / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - t0) * 1e3 / inner)
        return statistics.median(samples)

    def host_us(fn, reps, inner):
        for _ in range(inner):
            fn()
        sync()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            sync()
            samples.append((time.perf_counter() - t0) * 1e6 / inner)
        return statistics.median(samples)

    n = (1 << 22) if quick else (1 << 26)
    lg = n.bit_length() - 1
    a = torch.rand(n, device=dev)
    b = torch.rand(n, device=dev)
    reps = 5 if quick else 20
    mb = n * 4.0
    for name, fn, k in [("add", lambda: a + b, 3), ("exp", lambda: a.exp(), 2),
                        ("mul", lambda: a * b, 3), ("sum", lambda: a.sum(), 1),
                        ("norm", lambda: torch.linalg.vector_norm(a), 1)]:
        metric = f"{name} f32 2^{lg}"
        if wanted(metric):
            emit(metric, dev, k * mb / time_ms(fn, reps) / 1e6, "GB/s", impl)
    sizes = ([2048] if quick else [4096, 8192]) if cuda else ([512] if quick else [1024, 2048])
    modes = [("f32", torch.float32, False)]
    if cuda:
        modes += [("tf32", torch.float32, True), ("bf16", torch.bfloat16, False)]
    for size in sizes:
        for name, dt, tf32 in modes:
            metric = f"matmul {name} {size}"
            if not wanted(metric):
                continue
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x = torch.rand(size, size, device=dev, dtype=dt)
            y = torch.rand(size, size, device=dev, dtype=dt)
            ms = time_ms(lambda: x @ y, 5 if size >= 8192 else 10)
            emit(metric, dev, 2.0 * size ** 3 / ms / 1e9, "TFLOP/s", impl)
    torch.backends.cuda.matmul.allow_tf32 = False
    if cuda:
        nbytes = (32 << 20) if quick else (256 << 20)
        mib = f"{nbytes >> 20} MiB"
        dbuf = torch.ones(nbytes, dtype=torch.uint8, device=dev)
        pinned = torch.ones(nbytes, dtype=torch.uint8).pin_memory()
        pageable = torch.ones(nbytes, dtype=torch.uint8)
        for name, fn in [("h2d pinned", lambda: dbuf.copy_(pinned, non_blocking=True)),
                         ("h2d pageable", lambda: dbuf.copy_(pageable)),
                         ("d2h pinned", lambda: pinned.copy_(dbuf, non_blocking=True)),
                         ("d2h pageable", lambda: pageable.copy_(dbuf))]:
            metric = f"{name} {mib}"
            if wanted(metric):
                emit(metric, dev, nbytes / time_ms(fn, 3 if quick else 10) / 1e6, "GB/s", impl)
    if wanted("alloc+free 1 MiB"):
        emit("alloc+free 1 MiB", dev,
             host_us(lambda: torch.empty(1 << 20, dtype=torch.uint8, device=dev), 11, 2000),
             "us", impl)
    x1 = torch.rand(1, device=dev)
    y1 = torch.rand(1, device=dev)
    if wanted("1-element add queued"):
        emit("1-element add queued", dev, host_us(lambda: x1 + y1, 5, 2000 if quick else 20000),
             "us/op", impl)
    if wanted("1-element add_ in place queued"):
        acc = torch.zeros(1, device=dev)
        emit("1-element add_ in place queued", dev,
             host_us(lambda: acc.add_(y1), 5, 2000 if quick else 20000), "us/op", impl)
    if wanted("1-element add + sync"):
        def add_sync():
            x1 + y1
            sync()
        emit("1-element add + sync", dev, host_us(add_sync, 5, 500 if quick else 5000), "us/op",
             impl)


def numpy_bench(np):
    impl = "numpy " + np.__version__
    n = (1 << 22) if quick else (1 << 26)
    lg = n.bit_length() - 1
    rng = np.random.default_rng()
    a = rng.random(n, dtype=np.float32)
    b = rng.random(n, dtype=np.float32)

    def time_ms(fn, reps):
        fn()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    mb = n * 4.0
    for name, fn, k in [("add", lambda: a + b, 3), ("exp", lambda: np.exp(a), 2),
                        ("mul", lambda: a * b, 3), ("sum", lambda: a.sum(), 1),
                        ("norm", lambda: np.linalg.norm(a), 1)]:
        metric = f"{name} f32 2^{lg}"
        if wanted(metric):
            emit(metric, "cpu:0", k * mb / time_ms(fn, 5 if quick else 20) / 1e6, "GB/s", impl)
    for size in [512] if quick else [1024, 2048]:
        x = rng.random((size, size), dtype=np.float32)
        y = rng.random((size, size), dtype=np.float32)
        if wanted(f"matmul f32 {size}"):
            emit(f"matmul f32 {size}", "cpu:0",
                 2.0 * size ** 3 / time_ms(lambda: x @ y, 10) / 1e9, "TFLOP/s", impl)
    x1 = np.ones(1, np.float32)
    if wanted("1-element add queued"):
        reps = 20000
        t0 = time.perf_counter()
        for _ in range(reps):
            x1 + x1
        emit("1-element add queued", "cpu:0", (time.perf_counter() - t0) * 1e6 / reps, "us/op",
             impl)


try:
    import torch
    if torch.cuda.is_available() and (not kinds or "cuda" in kinds):
        torch_bench(torch, "cuda:0")
    if not kinds or "cpu" in kinds:
        torch_bench(torch, "cpu:0")
except ImportError:
    try:
        import numpy
        numpy_bench(numpy)
    except ImportError:
        print("torch_bench.py: neither torch nor numpy is installed", file=sys.stderr)
