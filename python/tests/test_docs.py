"""Every Python block of README.md and docs/*.md, run as printed against the installed package
(the convention is docs/contributing.md's; tests/docs/doc_blocks.py finds the blocks and joins
a block marked `<!-- doctest: continue -->` to the one before it). Each program runs in a
fresh namespace in its own empty folder, so files it writes land there."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doc_blocks", ROOT / "tests/docs/doc_blocks.py")
doc_blocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doc_blocks)

PROGRAMS = doc_blocks.programs(ROOT, "python")


def test_the_readme_has_a_python_example():
    assert any(p.page == "README" for p in PROGRAMS)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.key)
def test_block_runs_as_printed(program, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = compile(program.source, f"{program.page}.md:{program.line + 1}", "exec")
    exec(code, {"__name__": "__doc_block__"})
    assert capsys.readouterr().out.strip(), "a documented example prints what it shows"
