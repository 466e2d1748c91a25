#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (committed;
re-run only to change them). Needs nothing but the standard library."""
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


def write_corpus(name, seeds):
    out = os.path.join(HERE, "corpus", name)
    os.makedirs(out, exist_ok=True)
    for key, data in seeds.items():
        with open(os.path.join(out, key), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
    print(f"wrote {len(seeds)} seeds to {out}")


DEVICE_STRINGS = {
    "cpu": "cpu", "cuda0": "cuda:0", "cuda12": "cuda:12", "opencl3": "opencl:3",
    "under_score": "my_dev2:7", "max_index": "x:2147483647", "too_big": "x:2147483648",
    "negative": "cuda:-1", "plus": "cuda:+1", "leading_zero": "cuda:01", "upper": "CUDA:0",
    "no_index": "cuda:", "no_type": ":0", "trailing": "cuda:1x", "empty": "",
    "two_colons": "cuda:0:1", "digit_first": "9cuda:0", "space": "cuda :0", "nul": "cu\0da:0",
}

CONFIGS = {
    "readme": """device = "cuda:0"
[plugins]
paths = ["/opt/backplane/plugins"]
allow = ["cpu", "cuda"]
deny  = ["opencl"]
[matmul]
allow_tf32 = false
[debug]
sync = "warn"
""",
    "empty": "",
    "device_only": 'device = "cpu"\n',
    "sync_error": '[debug]\nsync = "error"\n',
    "sync_bad": '[debug]\nsync = "loud"\n',
    "tf32_string": '[matmul]\nallow_tf32 = "yes"\n',
    "unknown_key": 'colour = "blue"\n',
    "unknown_nested": "[plugins]\nsearch = []\n",
    "paths_not_list": '[plugins]\npaths = "/opt"\n',
    "list_of_ints": "[plugins]\nallow = [1, 2]\n",
    "plugins_scalar": "plugins = 3\n",
    "dotted": 'plugins.allow = ["cpu"]\nmatmul.allow_tf32 = true\n',
    "inline_table": '[debug]\nsync = { mode = "warn" }\n',
    "array_of_tables": "[[plugins]]\npaths = []\n",
    "syntax_error": "device = \n[plugins\n",
    "unicode": 'device = "cpu\\u00e9"\n# \u00fc\n',
    "duplicate": 'device = "cpu"\ndevice = "cuda"\n',
    "multiline": 'device = """cuda:0"""\n',
}

# bp_plugin_api as this host sees it (plugin_abi.h, x86-64): struct_size, abi_major, abi_minor,
# name, device_type, version, then the function slots in order. Re-run when the table grows.
SLOTS = ["error_free", "init", "shutdown", "device_count", "device_properties", "stream_create",
         "stream_destroy", "stream_synchronize", "event_create", "event_destroy", "event_record",
         "stream_wait_event", "event_synchronize", "event_elapsed_ms", "mem_alloc", "mem_free",
         "mem_host_pointer", "memory_stats", "memory_reset_peak", "memory_empty_cache",
         "host_alloc", "host_free", "memset", "copy_h2d", "copy_d2h", "copy_d2d", "copy_peer",
         "find_kernel", "launch", "list_ops"]
EVENTS = ["event_create", "event_destroy", "event_record", "stream_wait_event",
          "event_synchronize"]
HEADER = 8 + 4 + 4 + 3 * 8
FULL = HEADER + 8 * len(SLOTS)
MINOR1_OFFSET = HEADER + 8 * SLOTS.index("list_ops")


def table(declared=FULL, major=1, minor=1, unset=(), ids=("cpu", "cpu", "1.0.0"), null_ids=()):
    """A fuzz_plugin_table input: declared size, the table's bytes, the identity strings."""
    body = struct.pack("<QII", declared, major, minor)
    body += b"".join(struct.pack("<Q", 0 if k in null_ids else 1) for k in range(3))
    body += b"".join(struct.pack("<Q", 0 if s in unset else 0x1000 + i)
                     for i, s in enumerate(SLOTS))
    body = body[:min(declared, FULL)]
    return struct.pack("<H", declared) + body + b"\0".join(x.encode() for x in ids)


TABLES = {
    "complete": table(),
    "no_events": table(unset=EVENTS),
    "minor0": table(declared=MINOR1_OFFSET, minor=0),
    "newer_plugin": table(declared=FULL + 64, minor=7),
    "identity_only": table(declared=HEADER),
    "too_small": table(declared=12),
    "major2": table(major=2),
    "no_launch": table(unset=("launch",)),
    "no_error_free": table(unset=("error_free",)),
    "half_events": table(unset=("event_record", "event_synchronize")),
    "upper_type": table(ids=("cuda", "CUDA", "1")),
    "digit_type": table(ids=("x", "9x", "1")),
    "colon_type": table(ids=("x", "a:b", "1")),
    "empty_type": table(ids=("x", "", "1")),
    "null_type": table(null_ids=(1,)),
    "null_name": table(null_ids=(0, 2)),
}


def wstr(b):
    return struct.pack("<I", len(b)) + b


# The TCP store's requests (Note [TCP store protocol]): one per seed, and a pipelined session.
SECRET = b"0123456789abcdef0123456789abcdef"
STORE_REQUESTS = {
    "hello": b"\x08" + wstr(SECRET),
    "set": b"\x01" + wstr(b"bp/g0/rdzv/claim/1") + wstr(b"world=2;check=1"),
    "get": b"\x02" + struct.pack("<II", 5000, 2) + wstr(b"a") + wstr(b"bp/g0/post/1"),
    "try_get": b"\x03" + wstr(b"bp/g0/abort"),
    "add": b"\x04" + wstr(b"bp/g0/rdzv/claims") + struct.pack("<q", 1),
    "erase": b"\x05" + struct.pack("<I", 2) + wstr(b"x") + wstr(b"y"),
    "on_disconnect": b"\x06" + wstr(b"bp/g0/abort") + wstr(b"rank 1 exited"),
    "leave": b"\x07",
    "session": b"\x08" + wstr(SECRET) + b"\x01" + wstr(b"k") + wstr(b"v") + b"\x04" + wstr(b"c")
    + struct.pack("<q", -3) + b"\x02" + struct.pack("<II", 0, 1) + wstr(b"k") + b"\x07",
    "huge_count": b"\x02" + struct.pack("<I", 1000) + b"\xff\xff\xff\xff",
    "huge_erase": b"\x05\xff\xff\xff\x7f",
    "huge_value": b"\x01" + wstr(b"k") + struct.pack("<I", 1 << 30),
}
# Replies: kind byte (0 ack, 1 counter, 2 maybe, 3 values, 4 hello), keys asked, the bytes.
STORE_REPLIES = {
    "ack": b"\x00\x00\x00",
    "counter": b"\x01\x00" + struct.pack("<q", 42),
    "maybe_found": b"\x02\x00\x01" + wstr(b"value"),
    "maybe_missing": b"\x02\x00\x00",
    "values": b"\x03\x02\x00" + wstr(b"one") + wstr(b"two"),
    "values_missing": b"\x03\x03\x01" + struct.pack("<I", 2) + wstr(b"a") + wstr(b"b"),
    "values_too_many_missing": b"\x03\x01\x01" + struct.pack("<I", 5),
    "hello_refused": b"\x04\x00\x01",
    "huge_value": b"\x02\x00\x01" + struct.pack("<I", 1 << 31),
}


def main():
    write_corpus("device_string", DEVICE_STRINGS)
    write_corpus("store_request", STORE_REQUESTS)
    write_corpus("store_reply", STORE_REPLIES)
    write_corpus("config", CONFIGS)
    write_corpus("plugin_table", TABLES)
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
