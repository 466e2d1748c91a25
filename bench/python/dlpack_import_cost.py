"""Backplane's part of a C++ DLPack import from PyTorch, without Python in the loop.

Runs `_dlpack_c_exchange_ns` interleaved in its "managed" mode (PyTorch's
managed_tensor_from_py_object and deleter alone) and its "import" mode (the same plus
Backplane's import into a bp::Tensor and the drop), ROUNDS times each, and prints both
distributions' minimum and 10th percentile and their difference, ours (Note [DLPack import
cost] in core/src/tensor/tensor_native.cpp). Pin it to one core (taskset -c N) for stable
numbers. Usage: python3 bench/python/dlpack_import_cost.py [--rounds 61] [--n 30000]
"""
import argparse
import json

import torch

import backplane as bp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=61)
    ap.add_argument("--n", type=int, default=30000)
    args = ap.parse_args()
    t = torch.randn(64, 64)
    f = bp._core._dlpack_c_exchange_ns
    managed, imported = [], []
    for _ in range(args.rounds):
        managed.append(f(t, None, args.n, "managed"))
        imported.append(f(t, None, args.n, "import"))
    managed.sort()
    imported.sort()
    p10 = args.rounds // 10
    row = {
        "torch": torch.__version__,
        "managed_min_ns": round(managed[0], 1),
        "managed_p10_ns": round(managed[p10], 1),
        "import_min_ns": round(imported[0], 1),
        "import_p10_ns": round(imported[p10], 1),
        "ours_min_ns": round(imported[0] - managed[0], 1),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
