#!/usr/bin/env python3
"""docs.doc_blocks: the code-block convention of tests/docs/doc_blocks.py refuses what it must
(an unknown language, a marker that does not apply, a continuation with nothing before it, a
syntax-checked command naming a missing file) and joins continuations into one program."""
import pathlib
import subprocess
import sys
import tempfile
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import doc_blocks  # noqa: E402


def tree(readme, page=""):
    d = pathlib.Path(tempfile.mkdtemp(prefix="bp-doc-blocks-"))
    (d / "docs").mkdir()
    (d / "tools").mkdir()
    (d / "tools" / "real.sh").write_text("true\n")
    (d / "README.md").write_text(readme)
    if page:
        (d / "docs" / "page.md").write_text(page)
    return d


class DocBlocks(unittest.TestCase):
    def test_continuations_join_their_program(self):
        d = tree("x\n", "```cpp\nint a = 1;\n```\n\n<!-- doctest: continue -->\n```cpp\n"
                        "a += 1;\n```\n\n```python\nprint(1)\n```\n```text\nout\n```\n")
        progs = doc_blocks.programs(d)
        self.assertEqual([p.key for p in progs], ["page:cpp1", "page:python1"])
        self.assertEqual(progs[0].source, "int a = 1;\n\na += 1;\n")

    def test_unknown_language_is_refused(self):
        with self.assertRaisesRegex(SystemExit, "```js block"):
            doc_blocks.programs(tree("```js\nx\n```\n"))

    def test_untagged_block_is_refused(self):
        with self.assertRaisesRegex(SystemExit, "a ``` block"):
            doc_blocks.programs(tree("```\nx\n```\n"))

    def test_marker_must_apply(self):
        with self.assertRaisesRegex(SystemExit, "does not apply to cpp"):
            doc_blocks.programs(tree("<!-- doctest: syntax -->\n```cpp\nint a;\n```\n"))

    def test_continue_needs_a_block_before(self):
        with self.assertRaisesRegex(SystemExit, "no earlier python block"):
            doc_blocks.programs(tree("<!-- doctest: continue -->\n```python\nx\n```\n"))

    def test_syntax_check_catches_errors_and_missing_paths(self):
        good = tree("<!-- doctest: syntax -->\n```sh\nbash tools/real.sh\n```\n")
        self.assertEqual(doc_blocks.run_sh(good, good, "README:sh1"), 0)
        bad = tree("<!-- doctest: syntax -->\n```sh\nbash tools/missing.sh\n```\n")
        self.assertEqual(doc_blocks.run_sh(bad, bad, "README:sh1"), 1)
        broken = tree("<!-- doctest: syntax -->\n```sh\nif then fi (\n```\n")
        self.assertNotEqual(doc_blocks.run_sh(broken, broken, "README:sh1"), 0)

    def test_a_failing_shell_block_fails(self):
        d = tree("```sh\nfalse\necho never\n```\n")
        self.assertNotEqual(doc_blocks.run_sh(d, d, "README:sh1"), 0)

    def test_cpp_generation_makes_one_function_per_program(self):
        d = tree("x\n", "```cpp\n#include <cstdio>\nstd::puts(\"a\");\n```\n\n```cpp\n"
                        "std::puts(\"b\");\n```\n")
        out = d / "gen"
        doc_blocks.gen_cpp(d, out)
        src = (out / "page.cpp").read_text()
        self.assertIn("static void cpp1() {", src)
        self.assertIn("static void cpp2() {", src)
        self.assertEqual(src.count("#include <cstdio>"), 1)
        self.assertIn("bp_docs_page(page \"page\" cpp1 cpp2)", (out / "docs_programs.cmake").read_text())


if __name__ == "__main__":
    unittest.main()
