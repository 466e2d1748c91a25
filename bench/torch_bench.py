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
    conv_bench(torch, dev, cuda, time_ms)
    cross_entropy_bench(torch, dev, cuda, time_ms, impl)
    transpose_copy_bench(torch, dev, cuda, time_ms, impl)
    layer_norm_bench(torch, dev, cuda, time_ms, impl)
    batch_norm_bench(torch, dev, cuda, time_ms, impl)
    if cuda:
        attention_bench(torch, dev, time_ms, impl)


# bp-bench's Note [Convolution rows]: ResNet-18 CIFAR shapes at batch 256, f32 (TF32 off) and
# bf16; backward rows time y.backward(dy) alone after an untimed forward on a fresh leaf.
CONV_SHAPES = [("64x32x32", 64, 32, 64, 1), ("128x16x16", 128, 16, 128, 1),
               ("256x8x8", 256, 8, 256, 1), ("512x4x4", 512, 4, 512, 1),
               ("64x32x32 s2 to 128", 64, 32, 128, 2)]


def conv_bench(torch, dev, cuda, time_ms):
    F = torch.nn.functional
    n = 32 if quick else (256 if cuda else 32)
    reps = 5 if quick else 20
    impl = "torch " + torch.__version__ + (" cuDNN " + str(torch.backends.cudnn.version())
                                           if cuda else f" ({torch.get_num_threads()} threads)")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    modes = [("f32", torch.float32)] + ([("bf16", torch.bfloat16)] if cuda else [])

    def split_ms(setup, timed):
        for _ in range(2):
            timed(setup())
        if cuda:
            torch.cuda.synchronize()
        samples = []
        for _ in range(reps):
            state = setup()
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                timed(state)
                e.record()
                e.synchronize()
                samples.append(s.elapsed_time(e))
            else:
                t0 = time.perf_counter()
                timed(state)
                samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    for mname, dt in modes:
        for name, c, hw, k, stride in CONV_SHAPES:
            tail = f" {name} {mname}"
            p = (hw + 2 - 3) // stride + 1
            flops = 2.0 * n * k * p * p * c * 9
            x = torch.randn(n, c, hw, hw, device=dev, dtype=dt)
            w = torch.randn(k, c, 3, 3, device=dev, dtype=dt) * 0.05
            dy = torch.randn(n, k, p, p, device=dev, dtype=dt)
            if wanted("conv2d fwd" + tail):
                with torch.no_grad():
                    ms = time_ms(lambda: F.conv2d(x, w, None, stride, 1), reps)
                emit("conv2d fwd" + tail, dev, flops / ms / 1e9, "TFLOP/s", impl)
            for which, label in enumerate(["conv2d bwd_input", "conv2d bwd_weight"]):
                if not wanted(label + tail):
                    continue

                def setup(which=which):
                    xl = x.detach().requires_grad_() if which == 0 else x
                    wl = w.detach().requires_grad_() if which == 1 else w
                    return F.conv2d(xl, wl, None, stride, 1)

                ms = split_ms(setup, lambda y: y.backward(dy))
                emit(label + tail, dev, flops / ms / 1e9, "TFLOP/s", impl)
        x = torch.randn(n, 64, 32, 32, device=dev, dtype=dt)
        esize = x.element_size()
        in_bytes = x.numel() * esize
        mp_bytes = in_bytes * 1.25 + in_bytes * 0.25 * 8 / esize
        if wanted(f"max_pool2d bwd 3x3 s2 64x32x32 {mname}"):
            dy = torch.randn(n, 64, 16, 16, device=dev, dtype=dt)
            ms = split_ms(lambda: F.max_pool2d(x.detach().requires_grad_(), 3, 2, 1),
                          lambda y: y.backward(dy))
            emit(f"max_pool2d bwd 3x3 s2 64x32x32 {mname}", dev, mp_bytes / ms / 1e6, "GB/s",
                 impl)
        with torch.no_grad():
            if wanted(f"max_pool2d 3x3 s2 64x32x32 {mname}"):
                ms = time_ms(lambda: F.max_pool2d(x, 3, 2, 1, return_indices=True), reps)
                emit(f"max_pool2d 3x3 s2 64x32x32 {mname}", dev, mp_bytes / ms / 1e6, "GB/s",
                     impl)
            if wanted(f"avg_pool2d 2x2 s2 64x32x32 {mname}"):
                ms = time_ms(lambda: F.avg_pool2d(x, 2), reps)
                emit(f"avg_pool2d 2x2 s2 64x32x32 {mname}", dev, in_bytes * 1.25 / ms / 1e6,
                     "GB/s", impl)
            x4 = torch.randn(n, 512, 4, 4, device=dev, dtype=dt)
            if wanted(f"adaptive_avg_pool2d 512x4x4 {mname}"):
                ms = time_ms(lambda: F.adaptive_avg_pool2d(x4, 1), reps)
                emit(f"adaptive_avg_pool2d 512x4x4 {mname}", dev,
                     x4.numel() * esize * (1 + 1 / 16) / ms / 1e6, "GB/s", impl)


def fwd_bwd_rows(dev, impl, time_ms, op, tail, reps, fwd_work, step_work, scale, unit, forward,
                 step, torch):
    """bp-bench's FwdBwdRows: "<op> fwd<tail>" times `forward` under no_grad, "<op>
    fwd+bwd<tail>" times `step`, each as work per ms over `scale`."""
    if wanted(op + " fwd" + tail):
        with torch.no_grad():
            ms = time_ms(forward, reps)
        emit(op + " fwd" + tail, dev, fwd_work / ms / scale, unit, impl)
    if wanted(op + " fwd+bwd" + tail):
        emit(op + " fwd+bwd" + tail, dev, step_work / time_ms(step, reps) / scale, unit, impl)


def wants_rows(op, tail):
    return wanted(op + " fwd" + tail) or wanted(op + " fwd+bwd" + tail)


# bp-bench's bench_layer_norm: GPT-2's [8192, 768] (GPU) or [512, 768] activations, weight and
# bias, forward and forward + backward.
def layer_norm_bench(torch, dev, cuda, time_ms, impl):
    F = torch.nn.functional
    rows, cols = (8192 if cuda else 512), 768
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        tail = f" [{rows},768] {name}"
        if not wants_rows("layer_norm", tail):
            continue
        x = torch.randn(rows, cols, device=dev, dtype=dt, requires_grad=True)
        w = torch.rand(cols, device=dev, dtype=dt, requires_grad=True)
        b = torch.randn(cols, device=dev, dtype=dt, requires_grad=True)
        dy = torch.randn(rows, cols, device=dev, dtype=dt)
        nbytes = rows * cols * x.element_size()
        fwd_bwd_rows(dev, impl, time_ms, "layer_norm", tail, 3 if quick else 20, 2 * nbytes,
                     5 * nbytes, 1e6, "GB/s", lambda: F.layer_norm(x, (cols,), w, b),
                     lambda: F.layer_norm(x, (cols,), w, b).backward(dy), torch)


# bp-bench's bench_batch_norm: training-mode batch norm of [256, 64, 32, 32] (GPU) or
# [32, 64, 32, 32], forward and forward + backward, contiguous (NCHW) as Backplane's.
def batch_norm_bench(torch, dev, cuda, time_ms, impl):
    F = torch.nn.functional
    n, c = (256 if cuda else 32), 64
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        tail = f" [{n},64,32,32] {name}"
        if not wants_rows("batch_norm", tail):
            continue
        x = torch.randn(n, c, 32, 32, device=dev, dtype=dt, requires_grad=True)
        w = torch.rand(c, device=dev, requires_grad=True)
        b = torch.randn(c, device=dev, requires_grad=True)
        rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
        dy = torch.randn(n, c, 32, 32, device=dev, dtype=dt)
        nbytes = x.numel() * x.element_size()
        fwd_bwd_rows(dev, impl, time_ms, "batch_norm", tail, 3 if quick else 20, 2 * nbytes,
                     5 * nbytes, 1e6, "GB/s", lambda: F.batch_norm(x, rm, rv, w, b, True),
                     lambda: F.batch_norm(x, rm, rv, w, b, True).backward(dy), torch)


# bp-bench's bench_transpose_copy: [B, T, H, D] read as [B, H, T, D] and made dense.
def transpose_copy_bench(torch, dev, cuda, time_ms, impl):
    b = 8 if cuda else 1
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        metric = f"copy heads transpose [{b},1024,12,64] {name}"
        if not wanted(metric):
            continue
        x = torch.randn(b, 1024, 12, 64, device=dev, dtype=dt)
        ms = time_ms(lambda: x.transpose(1, 2).contiguous(), 3 if quick else 20)
        emit(metric, dev, 2.0 * x.numel() * x.element_size() / ms / 1e6, "GB/s", impl)


# bp-bench's Note [Cross-entropy rows]: 8192 (GPU) or 512 rows of 50,257 classes, the mean loss
# and its backward into the logits, same dtype, no autocast.
def cross_entropy_bench(torch, dev, cuda, time_ms, impl):
    F = torch.nn.functional
    rows, classes = (8192 if cuda else 512), 50257
    reps = 3 if quick else (20 if cuda else 5)
    for mname, dt in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
        tail = f" {rows}x50257 {mname}"
        if not wants_rows("cross_entropy", tail):
            continue
        x = torch.randn(rows, classes, device=dev, dtype=dt).requires_grad_()
        t = torch.randint(0, classes, (rows,), device=dev)
        nbytes = x.numel() * x.element_size()

        def step():
            x.grad = None
            F.cross_entropy(x, t).backward()
        fwd_bwd_rows(dev, impl, time_ms, "cross_entropy", tail, reps, nbytes, 3 * nbytes, 1e6,
                     "GB/s", lambda: F.cross_entropy(x, t), step, torch)


# bp-bench's Note [Attention rows]: GPT-2 heads (E = 64, 12 heads), batch 8 at L = 1024 and
# batch 2 at 4096, batch 1 at 16384, causal or not, f32 (TF32 off) and bf16.
def attention_bench(torch, dev, time_ms, impl):
    F = torch.nn.functional
    reps = 5 if quick else 20
    torch.backends.cuda.matmul.allow_tf32 = False
    for mname, dt in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
        for b, h, n in [(8, 12, 1024), (2, 12, 4096), (1, 12, 16384)]:
            for causal in (False, True):
                tail = f" L={n}{' causal ' if causal else ' '}{mname}"
                if not wants_rows("sdpa", tail):
                    continue
                fwd = 4.0 * b * h * n * n * 64 * (0.5 if causal else 1.0)
                q, k, v = (torch.randn(b, h, n, 64, device=dev, dtype=dt).requires_grad_()
                           for _ in range(3))
                dy = torch.randn(b, h, n, 64, device=dev, dtype=dt)

                def attend():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fwd_bwd_rows(dev, impl, time_ms, "sdpa", tail, reps, fwd, 3.5 * fwd, 1e9,
                             "TFLOP/s", attend, lambda: attend().backward(dy), torch)


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
