"""DLPack exchange latency: backplane.from_dlpack and Tensor.__dlpack__ (consumed by
torch.from_dlpack) against torch.from_dlpack of a torch tensor, and the DLPack 1.3 C exchange
API (__dlpack_c_exchange_api__) of both libraries called from C++, in the same run, interleaved
(goals: not slower than PyTorch; an exchange with PyTorch through the C API at most 0.2 us).

    python bench/python/dlpack_roundtrip.py [--device cuda:0] [--n 20000] [--rounds 3] [--json F]

Python rows (microseconds per exchange, median of the rounds; one 1024-element float32 tensor):
  import      backplane.from_dlpack(torch_tensor)        vs torch.from_dlpack(torch_tensor)
  export      torch.from_dlpack(backplane_tensor)        vs torch.from_dlpack(torch_tensor)
  round trip  backplane.from_dlpack(torch.from_dlpack(backplane_tensor))
                                                         vs torch.from_dlpack twice
  capsule     t.__dlpack__() and the capsule dropped     vs the same on a torch tensor
C API rows (nanoseconds per call in a C++ loop, backplane._core._dlpack_c_exchange_ns; the
reference column is PyTorch's own table on a torch tensor):
  C managed export    managed_tensor_from_py_object_no_sync + deleter
  C dltensor view     dltensor_from_py_object_no_sync
  C work stream       current_work_stream of the tensor's device
  C import torch->backplane (C++)
                      what a C++ consumer pays per tensor: torch's managed_tensor_from_py_object,
                      our import into a bp::Tensor (from_dlpack's path, stream check included),
                      the tensor dropped and torch's deleter run (no reference: PyTorch's C++
                      has no Python-free consumer of a table; goal: at most 0.2 us)
  C torch->backplane  torch's managed_tensor_from_py_object + our managed_tensor_to_py_object
                      + the new tensor dropped           vs torch's from + torch's to_py_object
  C backplane->torch  our managed_tensor_from_py_object + torch's managed_tensor_to_py_object
                      + dropped                          vs torch's from + torch's to_py_object
Without PyTorch the reference is NumPy (cpu only): numpy.from_dlpack, and the C rows have no
reference (NumPy has no exchange table); the C exchange rows then use backplane both ways.
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


def c_api_rows(ours, theirs, torch, args):
    """The C exchange API rows: {metric: (backplane ns, reference ns or None)}, medians of the
    rounds, the two libraries interleaved."""
    ns = bp._core._dlpack_c_exchange_ns
    n = args.n * 5
    cases = {
        "C managed export": (lambda: ns(ours, None, n, "managed"),
                             theirs is not None and (lambda: ns(theirs, None, n, "managed"))),
        "C dltensor view": (lambda: ns(ours, None, n, "dltensor"),
                            theirs is not None and (lambda: ns(theirs, None, n, "dltensor"))),
        "C work stream": (lambda: ns(ours, None, n, "stream"),
                          theirs is not None and (lambda: ns(theirs, None, n, "stream"))),
    }
    if torch is not None:
        same = lambda: ns(theirs, torch.Tensor, args.n, "exchange")  # noqa: E731
        cases["C torch->backplane"] = (lambda: ns(theirs, bp.Tensor, args.n, "exchange"), same)
        cases["C backplane->torch"] = (lambda: ns(ours, torch.Tensor, args.n, "exchange"), same)
        cases["C import torch->backplane (C++)"] = (lambda: ns(theirs, None, n, "import"), None)
    else:
        cases["C import backplane->backplane (C++)"] = (lambda: ns(ours, None, n, "import"), None)
        cases["C backplane->backplane"] = (lambda: ns(ours, bp.Tensor, args.n, "exchange"),
                                           None)
    for a, b in cases.values():  # warm-up
        a()
        b and b()
    res = {k: ([], []) for k in cases}
    for _ in range(args.rounds):
        for k, (a, b) in cases.items():
            res[k][0].append(a())
            if b:
                res[k][1].append(b())
    return {k: (statistics.median(a), statistics.median(b) if b else None)
            for k, (a, b) in res.items()}


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
        torch_mod = torch
        ref = f"torch {torch.__version__}"
        theirs_from = torch.from_dlpack
    except ImportError:
        import numpy as np
        torch_mod = None
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
    cases["capsule"] = (lambda: ours.__dlpack__(), lambda: x.__dlpack__())
    for _ in range(args.rounds):
        res.setdefault("capsule", ([], []))
        res["capsule"][0].append(per_call(cases["capsule"][0], args.n))
        res["capsule"][1].append(per_call(cases["capsule"][1], args.n))
    if torch_mod is not None and not hasattr(torch_mod.Tensor, "__dlpack_c_exchange_api__"):
        print(f"torch {torch_mod.__version__} has no __dlpack_c_exchange_api__: the C rows run "
              f"without a reference")
        torch_mod = None
    c_rows = c_api_rows(ours, x if torch_mod else None, torch_mod, args)
    bp.synchronize()
    print(f"DLPack exchange on {dev} ({dev.name}); reference: {ref}")
    print(f"| {'metric (us per exchange, median)':<34} | backplane | reference | ratio |")
    print(f"|{'-' * 36}|-----------|-----------|-------|")
    out = {"device": str(dev), "reference": ref, "rows": []}
    for k, (a, b) in res.items():
        m, t = statistics.median(a), statistics.median(b)
        print(f"| {k:<34} | {m:9.2f} | {t:9.2f} | {m / t:5.2f} |")
        out["rows"].append({"metric": k, "backplane_us": m, "reference_us": t, "ratio": m / t})
    print()
    print(f"| {'C exchange API (ns per call, median)':<34} | backplane | reference | ratio |")
    print(f"|{'-' * 36}|-----------|-----------|-------|")
    for k, (m, t) in c_rows.items():
        ts = f"{t:9.1f}" if t is not None else f"{'-':>9}"
        rs = f"{m / t:5.2f}" if t else f"{'-':>5}"
        print(f"| {k:<34} | {m:9.1f} | {ts} | {rs} |")
        out["rows"].append({"metric": k, "backplane_ns": m, "reference_ns": t,
                            "ratio": m / t if t else None})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
