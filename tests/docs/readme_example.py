#!/usr/bin/env python3
"""Writes README.md's first C++ code block as a program, exactly as printed: its #include lines
at file scope, every other line unchanged inside main(). Should the block show a mixed-device
op, which throws bp::DeviceMismatch only where a GPU exists, the program reports it and exits 0.

    readme_example.py README.md OUT.cpp"""
import re
import sys

readme, out = sys.argv[1], sys.argv[2]
text = open(readme, encoding="utf-8").read()
m = re.search(r"^```(?:cpp|c\+\+)\n(.*?)^```", text, re.S | re.M)
if not m:
    sys.exit(f"{readme}: no ```cpp code block")
lines = m.group(1).splitlines()
includes = [l for l in lines if l.startswith("#include")]
body = [l for l in lines if not l.startswith("#include")]
src = [f"// Generated from the first C++ code block of {readme} by tests/docs/readme_example.py;",
       "// the block's lines are unchanged.", *includes, "#include <cstdio>  // the wrapper's", "",
       "int main() {", "  try {", *body,
       "  } catch (const bp::DeviceMismatch& e) {",
       '    std::printf("\\n(the README\'s x + y threw bp::DeviceMismatch: %s)\\n", e.what());',
       "  }", "  return 0;", "}", ""]
new = "\n".join(src)
try:
    if open(out, encoding="utf-8").read() == new:
        sys.exit(0)
except OSError:
    pass
open(out, "w", encoding="utf-8").write(new)
