"""Time to read safetensors files of 10k-80k entries (issue 28: the header parse was quadratic).

    python3 bench/python/safetensors_header.py

Each file holds N one-element f32 tensors; the best of three reads of the header alone
(backplane.serialization.load_metadata) and of the whole file (backplane.load). Linear: doubling
N doubles both.
"""
import json
import os
import struct
import tempfile
import time

import backplane as bp

for n in (10_000, 20_000, 40_000, 80_000):
    header = {f"t{i:06d}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
              for i in range(n)}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "many.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"\0" * (4 * n))
    best_meta = best_load = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        bp.serialization.load_metadata(path)
        t1 = time.perf_counter()
        d = bp.load(path)
        t2 = time.perf_counter()
        best_meta, best_load = min(best_meta, t1 - t0), min(best_load, t2 - t1)
    assert len(d) == n
    os.remove(path)
    os.rmdir(folder)
    print(f"{n:6d} entries: header {len(h)/1e6:.2f} MB, header-only read {best_meta*1e3:7.1f} ms, "
          f"load (parse + {n} tensors) {best_load*1e3:8.1f} ms", flush=True)
