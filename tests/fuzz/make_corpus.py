#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_safetensors into tests/fuzz/corpus/safetensors/ (committed;
re-run only to change it). Needs nothing but the standard library."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "safetensors")


def file_of(header, data=b"", pad=True):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {
        "empty_header": file_of({}),
        "metadata_only": file_of({"__metadata__": {"format": "pt"}}),
        "one_f32": file_of({"w": entry("F32", [2], 0, 8)}, struct.pack("<2f", 1.5, -2.0)),
        "scalar_and_empty": file_of({"s": entry("F64", [], 0, 8), "e": entry("I64", [0, 3], 8, 8)},
                                    struct.pack("<d", 3.25)),
        "every_dtype": file_of({
            "a": entry("F32", [1], 0, 4), "b": entry("F64", [1], 4, 12),
            "c": entry("F16", [2], 12, 16), "d": entry("BF16", [2], 16, 20),
            "e": entry("I32", [1], 20, 24), "f": entry("I64", [1], 24, 32),
            "g": entry("U8", [2], 32, 34), "h": entry("BOOL", [2], 34, 36),
            "__metadata__": {"k": "v"}}, bytes(34) + b"\x00\x01"),
        "mlp_state": file_of({
            "0.weight": entry("F32", [4, 3], 0, 48), "0.bias": entry("F32", [4], 48, 64),
            "2.weight": entry("F32", [1, 4], 64, 80), "2.bias": entry("F32", [1], 80, 84)},
            bytes(84)),
        "unpadded": file_of({"x": entry("U8", [3], 0, 3)}, b"abc", pad=False),
        "overlap": file_of({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12)),
        "bad_dtype": file_of({"a": entry("F8_E4M3", [1], 0, 1)}, bytes(1)),
        "negative_dim": file_of({"a": entry("F32", [-1], 0, 4)}, bytes(4)),
        "truncated": b"\x10\x00\x00",
        "length_too_big": struct.pack("<Q", 1 << 40) + b"{}",
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {OUT}")


if __name__ == "__main__":
    main()
