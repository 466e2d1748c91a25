#!/usr/bin/env python3
"""Backplane <-> NumPy safetensors interop (registered with ctest when python3 can import
numpy and safetensors).

1. nn_interop_tool writes a file; safetensors.numpy reads it: every zoo.<dtype> tensor must
   follow the shared formula (bf16, which NumPy lacks, is decoded from the raw bytes), and a
   NumPy forward pass of the saved MLP on the saved input must give Backplane's output.
2. NumPy writes a file (zoo + an MLP with its input and expected output); nn_interop_tool
   checks the zoo and runs the MLP in Backplane.

usage: interop_test.py --tool build/bin/nn_interop_tool --workdir DIR [--device cpu:0]
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

ZOO = ["f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"]
NP_DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32,
             "i64": np.int64, "u8": np.uint8, "bool": np.bool_}


def zoo_values(name: str) -> np.ndarray:
    i = np.arange(24, dtype=np.int64)
    k = (i * 7) % 23
    if name == "bool":
        v = (i % 3 == 0).astype(np.float64)
    elif name == "u8":
        v = ((i * 37) % 251).astype(np.float64)
    elif name in ("i32", "i64"):
        v = ((k - 11) * 1000003).astype(np.float64)
    else:
        v = (k - 11) * 0.25
    return v.reshape(2, 3, 4)


def read_bf16_raw(path: str, key: str) -> np.ndarray:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        info = header[key]
        begin, end = info["data_offsets"]
        f.seek(8 + n + begin)
        raw = np.frombuffer(f.read(end - begin), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


def mlp_forward(state, x):
    h = np.maximum(x.astype(np.float64) @ state["0.weight"].T.astype(np.float64) + state["0.bias"], 0)
    return h @ state["2.weight"].T.astype(np.float64) + state["2.bias"]


class Checks:
    def __init__(self):
        self.failures = 0

    def check(self, ok: bool, what: str):
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failures += 1


def run_tool(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    return r.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--device", default="cpu:0")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    c = Checks()

    # 1. Backplane writes, NumPy reads.
    path = os.path.join(args.workdir, "from_backplane.safetensors")
    c.check(run_tool(args.tool, "write", path, args.device) == 0, "nn_interop_tool write")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    c.check(n % 8 == 0, "header length is a multiple of 8")
    c.check(header.get("__metadata__", {}).get("format") == "pt", "metadata format=pt")
    numpy_keys = [k for k in header if k != "__metadata__" and header[k]["dtype"] != "BF16"]
    tensors = {}
    from safetensors import safe_open
    with safe_open(path, framework="numpy") as f:
        for k in numpy_keys:
            tensors[k] = f.get_tensor(k)
    for name in ZOO:
        key = "zoo." + name
        if key not in header:
            print(f"SKIP {key} (not written on this device)")
            continue
        got = read_bf16_raw(path, key) if name == "bf16" else tensors[key]
        ok = got.shape == (2, 3, 4) and np.array_equal(got.astype(np.float64), zoo_values(name))
        if name != "bf16":
            ok = ok and got.dtype == NP_DTYPES[name]
        c.check(ok, f"{key} written by Backplane reads back in NumPy")
    y = mlp_forward(tensors, tensors["input"])
    err = np.linalg.norm(y - tensors["output"]) / np.linalg.norm(y)
    c.check(err < 1e-5, f"NumPy forward of the saved MLP matches Backplane's output (rel {err:.2e})")

    # 2. NumPy writes, Backplane reads.
    rng = np.random.default_rng()
    state = {
        "0.weight": rng.uniform(-0.5, 0.5, (4, 3)).astype(np.float32),
        "0.bias": rng.uniform(-0.5, 0.5, (4,)).astype(np.float32),
        "2.weight": rng.uniform(-0.5, 0.5, (1, 4)).astype(np.float32),
        "2.bias": rng.uniform(-0.5, 0.5, (1,)).astype(np.float32),
    }
    x = rng.uniform(-2, 2, (6, 3)).astype(np.float32)
    out = dict(state)
    out["input"] = x
    out["expected_output"] = mlp_forward(state, x).astype(np.float32)
    for name in ZOO:
        if name != "bf16":
            out["zoo." + name] = zoo_values(name).astype(NP_DTYPES[name])
    path2 = os.path.join(args.workdir, "from_numpy.safetensors")
    save_file(out, path2)
    c.check(run_tool(args.tool, "check", path2, args.device) == 0,
            "Backplane reads every dtype NumPy wrote")
    c.check(run_tool(args.tool, "forward", path2, args.device) == 0,
            "Backplane's forward of the NumPy-written MLP matches NumPy")

    print(f"{c.failures} failure(s)")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
