#!/usr/bin/env python3
"""Backplane <-> PyTorch safetensors round trip, for a machine with torch (the GPU machine).

    python3 -m pip install torch safetensors numpy      # if needed
    python3 tests/nn/torch_roundtrip.py --tool build/bin/nn_interop_tool [--device cuda:0]
    python3 tests/nn/torch_roundtrip.py build        (the same, with build/bin/nn_interop_tool)

Checks, each printed as PASS/FAIL:
  1. Backplane writes a file on --device (nn_interop_tool write): safetensors.torch.load_file
     reads every dtype (f32 f64 f16 bf16 i32 i64 u8 bool) with the values of the shared
     formula, and a torch.nn.Sequential(Linear(3,4), ReLU, Linear(4,1)) given the saved state
     dict (load_state_dict, strict) reproduces the output Backplane saved beside it.
  2. PyTorch writes a file (safetensors.torch.save_file: a freshly initialised model's
     state_dict, an input and torch's output, plus the dtype zoo): Backplane reads every dtype
     (nn_interop_tool check) and its forward on --device gives torch's output
     (nn_interop_tool forward, relative error <= 1e-5).
Exit status 0 when every check passes.
"""
import argparse
import os
import subprocess
import sys
import tempfile

ZOO = ["f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"]


def zoo_values(torch, name):
    i = torch.arange(24, dtype=torch.int64)
    k = (i * 7) % 23
    if name == "bool":
        v = (i % 3 == 0).to(torch.float64)
    elif name == "u8":
        v = ((i * 37) % 251).to(torch.float64)
    elif name in ("i32", "i64"):
        v = ((k - 11) * 1000003).to(torch.float64)
    else:
        v = (k - 11).to(torch.float64) * 0.25
    return v.reshape(2, 3, 4)


def torch_dtypes(torch):
    return {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
            "bf16": torch.bfloat16, "i32": torch.int32, "i64": torch.int64,
            "u8": torch.uint8, "bool": torch.bool}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default="", help="build folder holding bin/nn_interop_tool")
    ap.add_argument("--tool", default="", help="path to nn_interop_tool")
    ap.add_argument("--device", default="", help="Backplane device (default: cuda:0, else cpu:0)")
    ap.add_argument("--workdir", default="", help="where to write the files (default: a temp dir)")
    args = ap.parse_args()
    if not args.tool:
        if not args.build:
            ap.error("give --tool PATH or a build folder")
        args.tool = os.path.join(args.build, "bin", "nn_interop_tool")
    if not os.access(args.tool, os.X_OK):
        print(f"FAIL  {args.tool} is not an executable (build the nn_interop_tool target)")
        return 1

    import torch
    from safetensors.torch import load_file, save_file

    workdir = args.workdir or tempfile.mkdtemp(prefix="bp_torch_roundtrip_")
    os.makedirs(workdir, exist_ok=True)
    dev_args = [args.device] if args.device else []
    failures = 0

    def check(ok, what):
        nonlocal failures
        print(("PASS  " if ok else "FAIL  ") + what, flush=True)
        failures += 0 if ok else 1

    def tool(*a):
        r = subprocess.run([args.tool, *a, *dev_args], capture_output=True, text=True)
        for line in (r.stdout + r.stderr).splitlines():
            print("      | " + line)
        return r.returncode

    print(f"torch {torch.__version__}, files in {workdir}")
    print("== 1. Backplane writes, PyTorch reads")
    path = os.path.join(workdir, "from_backplane.safetensors")
    check(tool("write", path) == 0, "nn_interop_tool write " + path)
    state = load_file(path)
    dts = torch_dtypes(torch)
    for name in ZOO:
        key = "zoo." + name
        if key not in state:
            print(f"SKIP  {key}: not written (the device has no f64)")
            continue
        t = state[key]
        ok = t.dtype == dts[name] and tuple(t.shape) == (2, 3, 4) and \
            torch.equal(t.to(torch.float64), zoo_values(torch, name))
        check(ok, f"{key}: dtype {t.dtype}, shape {tuple(t.shape)}, values match the formula")
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    net.load_state_dict({k: state[k] for k in ("0.weight", "0.bias", "2.weight", "2.bias")})
    with torch.no_grad():
        y = net(state["input"])
    err = ((y - state["output"]).norm() / state["output"].norm()).item()
    check(err <= 1e-5, f"torch forward with Backplane's weights equals Backplane's output "
                       f"(relative error {err:.2e})")

    print("== 2. PyTorch writes, Backplane reads")
    torch.manual_seed(1234)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x = torch.rand(7, 3) * 4 - 2
    with torch.no_grad():
        y = net(x)
    out = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    out["input"] = x
    out["expected_output"] = y
    for name in ZOO:
        out["zoo." + name] = zoo_values(torch, name).to(dts[name])
    path2 = os.path.join(workdir, "from_torch.safetensors")
    save_file(out, path2, metadata={"format": "pt"})
    print("      torch output: " + ", ".join(f"{v:.7g}" for v in y.flatten().tolist()))
    check(tool("check", path2) == 0, "Backplane reads every dtype torch wrote")
    check(tool("forward", path2) == 0, "Backplane's forward of torch's model equals torch's output")

    print(f"== {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
