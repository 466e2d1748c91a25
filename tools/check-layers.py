#!/usr/bin/env python3
"""Checks that core/src's layers depend only downwards, and draws the dependency graph.

Usage: check-layers.py [--dot FILE] [SOURCE_ROOT]
       check-layers.py --self-test   (the checker on a made-up tree with one upward include)

core/src holds one folder a layer. A file depends on a layer when it includes one of that
layer's internal headers ("tensor/tensor_internal.hpp") or one of the public headers the layer
implements (<backplane/tensor.hpp>; PUBLIC below). An include of a layer ranked higher than the
including file's own is an upward arrow and fails the check, naming the file, the line and both
layers. Prints one summary line per layer (what it depends on) and the total.
"""
import pathlib
import re
import sys

# The layers, lowest first; layers of one rank may not include each other.
LAYERS = [
    ("runtime", 0), ("tensor", 1), ("autograd", 2), ("profiler", 3), ("graph", 4),
    ("nn", 5), ("serialize", 6), ("train", 7), ("dist", 8),
]
RANK = dict(LAYERS)
# Public headers (core/include/backplane) by the layer that implements them.
PUBLIC = {
    "export.hpp": "runtime", "errors.hpp": "runtime", "dtype.hpp": "runtime",
    "ops.hpp": "runtime", "device.hpp": "runtime", "runtime.hpp": "runtime",
    "tensor.hpp": "tensor", "functions.hpp": "tensor", "nn_functional.hpp": "tensor",
    "nn_conv.hpp": "nn", "profiler.hpp": "profiler", "graph.hpp": "graph",
    "nn.hpp": "nn", "serialize.hpp": "serialize", "train.hpp": "train",
    "optim.hpp": "train", "lr_scheduler.hpp": "train", "checkpoint.hpp": "train",
    "dist.hpp": "dist", "dist_store.hpp": "dist", "parallel.hpp": "dist",
}
INTERNAL = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"')
EXTERNAL = re.compile(r"^\s*#\s*include\s+<backplane/([a-z_]+\.hpp)>")


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for layer, text in (("runtime", '#include "tensor/tensor_internal.hpp"\n'),
                            ("tensor", '#include "runtime/device_state.hpp"\n')):
            (root / "core" / "src" / layer).mkdir(parents=True)
            (root / "core" / "src" / layer / "a.cpp").write_text(text)
        (root / "core" / "include" / "backplane").mkdir(parents=True)
        bad = main(["check-layers.py", str(root)])
        (root / "core" / "src" / "runtime" / "a.cpp").write_text("#include <vector>\n")
        good = main(["check-layers.py", str(root)])
    ok = bad == 1 and good == 0
    print("self-test:", "passed" if ok else f"FAILED (upward tree gave {bad}, clean tree {good})")
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    dot = None
    if len(argv) > 2 and argv[1] == "--dot":
        dot, argv = argv[2], [argv[0]] + argv[3:]
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).parents[1])
    src, inc = root / "core" / "src", root / "core" / "include" / "backplane"
    edges, bad = {}, []

    def scan(path, layer):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = INTERNAL.match(line)
            dep = m.group(1) if m else None
            if not dep:
                m = EXTERNAL.match(line)
                dep = PUBLIC.get(m.group(1)) if m else None
            if not dep or dep == layer:
                continue
            if dep not in RANK:
                bad.append(f"{path.relative_to(root)}:{n}: includes unknown layer '{dep}'")
                continue
            edges.setdefault(layer, {}).setdefault(dep, 0)
            edges[layer][dep] += 1
            if RANK[dep] >= RANK[layer]:
                bad.append(f"{path.relative_to(root)}:{n}: layer '{layer}' (rank {RANK[layer]}) "
                           f"includes layer '{dep}' (rank {RANK[dep]}): {line.strip()}")

    for path in sorted(src.rglob("*")):
        if path.suffix not in (".cpp", ".hpp", ".h"):
            continue
        layer = path.relative_to(src).parts[0]
        if layer not in RANK:
            bad.append(f"{path.relative_to(root)}: not in a layer folder "
                       f"({', '.join(name for name, _ in LAYERS)})")
            continue
        scan(path, layer)
    for path in sorted(inc.glob("*.hpp")):
        if path.name in PUBLIC:
            scan(path, PUBLIC[path.name])

    for name, rank in LAYERS:
        deps = ", ".join(f"{d} ({c})" for d, c in sorted(edges.get(name, {}).items(),
                                                         key=lambda kv: RANK[kv[0]]))
        print(f"  {name:<10} rank {rank}  depends on: {deps or '-'}")
    n = sum(sum(d.values()) for d in edges.values())
    print(f"core/src layers: {len(LAYERS)} folders, {n} includes across layers, "
          f"{len(bad)} upward or misplaced")
    for b in bad:
        print("  " + b)
    if dot:
        with open(dot, "w") as f:
            f.write("digraph layers {\n  rankdir=BT;\n")
            for a, ds in edges.items():
                for d, c in ds.items():
                    colour = "red" if RANK[d] >= RANK[a] else "black"
                    f.write(f'  "{a}" -> "{d}" [label="{c}", color={colour}];\n')
            f.write("}\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
