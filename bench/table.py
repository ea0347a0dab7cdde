"""The results table in bench/README.md, generated from bench/results/*/*.json (never typed by hand).

    python -m bench.table            # rewrite the table between the markers in bench/README.md
    python -m bench.table --print    # print it
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import BENCH, RESULTS

START, END = "<!-- results:start (python -m bench.table) -->", "<!-- results:end -->"


def load(results: Path = RESULTS) -> list[dict]:
    out = []
    for path in sorted(results.glob("*/*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "measure" in data and "value" in data:
            data["_path"] = path.relative_to(results.parent).as_posix()
            out.append(data)
    return out


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def table(rows: list[dict]) -> str:
    lines = [
        "| machine | measure | value | goal | met | median | spread (min–max, n) | GPU | versions (verl / vLLM / torch) | file |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r.get("machine", ""), r["measure"])):
        sp = r.get("spread") or {}
        v = r.get("versions") or {}
        met = {True: "yes", False: "**no**", None: "—"}[r.get("goal_met")]
        spread = f"{_fmt(sp.get('min'))}–{_fmt(sp.get('max'))}, {sp.get('n', 0)}" if sp.get("n") else "—"
        lines.append(
            f"| {r.get('machine', '?')} | {r['measure']} | {_fmt(r['value'])} {r.get('unit', '')} | {r.get('goal') or '—'} "
            f"| {met} | {_fmt(r.get('median'))} | {spread} | {r.get('gpu') or 'none'} "
            f"| {v.get('verl') or '—'} / {v.get('vllm') or '—'} / {v.get('torch') or '—'} | [{Path(r['_path']).name}]({r['_path']}) |"
        )
    return "\n".join(lines)


def update_readme(readme: Path = BENCH / "README.md", results: Path = RESULTS) -> str:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme} lacks the table markers {START} … {END}")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table(load(results))}\n{END}{tail}"
    readme.write_text(new)
    return new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.table")
    p.add_argument("--print", action="store_true", help="print the table instead of writing bench/README.md")
    a = p.parse_args(argv)
    if a.print:
        print(table(load()))
    else:
        update_readme()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
