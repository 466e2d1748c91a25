"""Generates the benchmark tables of docs/benchmarks.md from docs/bench-data/*.json.

MkDocs runs this as a hook (mkdocs.yml `hooks:`): in benchmarks.md, a line
`<!-- bench-table NAME -->` becomes the table of docs/bench-data/NAME.json, headed by the date,
the machine and the command that measured it. A data file without a date, machine or command, a table that no page places, or a placeholder
naming a missing file stops the build. Run as a script it prints the page's generated
Markdown (`python3 docs/hooks/bench_tables.py docs/benchmarks.md`).

A data file is one JSON object:
  {"title": ..., "date": ..., "machine": ..., "command": ..., "note": (optional) ...,
   "columns": [header, ...], "rows": [[cell, ...], ...]}
or, for a table written by `python3 bench/compare.py --json FILE`, the same header keys with
"compare": the list that compare.py wrote (metric, device, value, unit, reference, ratio,
samples); its columns are generated.
"""
import json
import pathlib
import re
import sys

DATA = pathlib.Path(__file__).resolve().parent.parent / "bench-data"
REQUIRED = ("title", "date", "machine", "command")
PLACEHOLDER = re.compile(r"^<!-- bench-table ([A-Za-z0-9_.-]+) -->$", re.M)


def _cell(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v).replace("|", "\\|")


def _spread(samples):
    if not samples or len(samples) < 2:
        return ""
    return f" [{min(samples):.3g}-{max(samples):.3g}]"


def _compare_rows(rows):
    columns = ["metric", "device", "Backplane", "reference", "unit", "ratio", "reference impl"]
    out = []
    for r in rows:
        ratio = r.get("ratio")
        out.append([r["metric"], r["device"], _cell(r["value"]) + _spread(r.get("samples")),
                    _cell(r.get("reference")) + _spread(r.get("reference_samples")),
                    r.get("unit", ""), f"{ratio:.2f}" if ratio else "-",
                    r.get("reference_impl") or "-"])
    return columns, out


def load(name):
    path = DATA / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"benchmarks: no data file {path} for <!-- bench-table {name} -->")
    except json.JSONDecodeError as e:
        raise SystemExit(f"benchmarks: {path}: invalid JSON: {e}")
    missing = [k for k in REQUIRED if not str(data.get(k, "")).strip()]
    if missing:
        raise SystemExit(f"benchmarks: {path} lacks {', '.join(missing)} (every table says "
                         "what was measured, when, on which machine and with which command)")
    if "compare" in data:
        data["columns"], data["rows"] = _compare_rows(data["compare"])
    cols = data.get("columns")
    rows = data.get("rows")
    if not cols or not isinstance(rows, list):
        raise SystemExit(f"benchmarks: {path} needs 'columns' and 'rows' (or 'compare')")
    for i, row in enumerate(rows):
        if len(row) != len(cols):
            raise SystemExit(f"benchmarks: {path}: row {i} has {len(row)} cells, "
                             f"the header {len(cols)}")
    return data


def render(name):
    d = load(name)
    lines = [f"**{d['title']}**", "",
             f"*Measured {d['date']} on {d['machine']}; command: `{d['command']}`*", ""]
    if d.get("note"):
        lines += [d["note"], ""]
    lines.append("| " + " | ".join(_cell(c) for c in d["columns"]) + " |")
    lines.append("|" + "---|" * len(d["columns"]))
    for row in d["rows"]:
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def expand(markdown):
    placed = set(PLACEHOLDER.findall(markdown))
    unplaced = sorted(p.stem for p in DATA.glob("*.json")) if DATA.is_dir() else []
    unplaced = [n for n in unplaced if n not in placed]
    if unplaced:
        raise SystemExit("benchmarks: data files no page places: " + ", ".join(unplaced))
    return PLACEHOLDER.sub(lambda m: render(m.group(1)), markdown)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "benchmarks.md":
        return markdown
    return expand(markdown)


if __name__ == "__main__":
    print(expand(pathlib.Path(sys.argv[1]).read_text(encoding="utf-8")))
