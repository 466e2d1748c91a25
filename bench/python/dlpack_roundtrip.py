"""DLPack exchange latency: backplane.from_dlpack and Tensor.__dlpack__ (consumed by
torch.from_dlpack) against torch.from_dlpack of a torch tensor, in the same run, interleaved
(goal: not slower than PyTorch).

    python bench/python/dlpack_roundtrip.py [--device cuda:0] [--n 20000] [--rounds 3] [--json F]

Rows (microseconds per exchange, median of the rounds; one 1024-element float32 tensor):
  import      backplane.from_dlpack(torch_tensor)        vs torch.from_dlpack(torch_tensor)
  export      torch.from_dlpack(backplane_tensor)        vs torch.from_dlpack(torch_tensor)
  round trip  backplane.from_dlpack(torch.from_dlpack(backplane_tensor))
                                                         vs torch.from_dlpack twice
Without PyTorch the reference is NumPy (cpu only): numpy.from_dlpack.
"""
import argparse
import json
import statistics
import time

import backplane as bp


def per_call(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0" if bp.num_gpus() else "cpu:0")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = bp.device(args.device)
    ours = bp.rand(1024, device=dev)
    try:
        import torch
        x = torch.rand(1024, device=args.device.replace("cpu:0", "cpu"))
        ref = f"torch {torch.__version__}"
        theirs_from = torch.from_dlpack
    except ImportError:
        import numpy as np
        if dev.type != "cpu":
            raise SystemExit("dlpack_roundtrip: without PyTorch only --device cpu:0 runs")
        x = np.random.rand(1024).astype(np.float32)
        ref = f"numpy {np.__version__}"
        theirs_from = np.from_dlpack
    assert bp.from_dlpack(x).data_ptr() == (x.data_ptr() if hasattr(x, "data_ptr")
                                            else x.ctypes.data)
    cases = {
        "import": (lambda: bp.from_dlpack(x), lambda: theirs_from(x)),
        "export": (lambda: theirs_from(ours), lambda: theirs_from(x)),
        "round trip": (lambda: bp.from_dlpack(theirs_from(ours)),
                       lambda: theirs_from(theirs_from(x))),
    }
    for a, b in cases.values():
        per_call(a, 500)
        per_call(b, 500)
    res = {k: ([], []) for k in cases}
    for _ in range(args.rounds):
        for k, (a, b) in cases.items():
            res[k][0].append(per_call(a, args.n))
            res[k][1].append(per_call(b, args.n))
    bp.synchronize()
    print(f"DLPack exchange on {dev} ({dev.name}); reference: {ref}")
    print(f"| {'metric (us per exchange, median)':<34} | backplane | reference | ratio |")
    print(f"|{'-' * 36}|-----------|-----------|-------|")
    out = {"device": str(dev), "reference": ref, "rows": []}
    for k, (a, b) in res.items():
        m, t = statistics.median(a), statistics.median(b)
        print(f"| {k:<34} | {m:9.2f} | {t:9.2f} | {m / t:5.2f} |")
        out["rows"].append({"metric": k, "backplane_us": m, "reference_us": t, "ratio": m / t})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
