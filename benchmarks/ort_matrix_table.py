"""Render an ORT-matrix JSON (``benchmarks/ort_matrix.py``) as a markdown table; optionally put it
into the docs between ``<!-- ort-matrix:start -->`` and ``<!-- ort-matrix:end -->`` (``--readme``:
the page, README.md or docs/*.md, that holds the markers; ``--readme PAGE``: that page).

    python benchmarks/ort_matrix_table.py [benchmarks/results/ort_matrix.json] [--readme [PAGE]]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import doc_markers

from bridge.core.cppbuild import cache_folder  # noqa: F401  (the matrices keep their venvs in the one cache)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "ort_matrix.json"
BLOCK = "ort-matrix"
START, END = doc_markers.markers(BLOCK)
TIERS = ("function", "native")


def refusal(error: str) -> str:
    """A short reason for a file onnxruntime would not load (its own words, shortened)."""
    m = re.search(r"[Uu]nsupported model IR version: (\d+), max supported IR version: (\d+)", error)
    if m:
        return f"IR {m.group(1)} > {m.group(2)}"
    m = re.search(r"[Oo]pset (\d+) is under development", error)
    if m:
        top = re.search(r"is till opset (\d+)", error)
        return f"opset {m.group(1)} > {top.group(1)}" if top else f"opset {m.group(1)} unknown"
    m = re.search(r"Could not find an implementation for (\w+\(\d+\))", error)
    if m:
        return f"no kernel for {m.group(1)}"
    if error.startswith("not exported"):
        return "not exported"
    return error.split("\n")[0][:60]


def cell(rows: list[dict]) -> str:
    """One opset and tier: how many files pass, and which fail for which reason."""
    passed = [r for r in rows if r["status"] == "pass"]
    if len(passed) == len(rows):
        return f"{len(passed)}/{len(rows)} pass"
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r["status"] != "pass":
            reasons.setdefault(refusal(r["error"]) if r["status"] == "error" else r["status"], []).append(r["case"])
    if not passed and len(reasons) == 1 and all(r["status"] == "error" for r in rows):
        return f"refused ({next(iter(reasons))})"
    why = "; ".join(f"{reason}: {', '.join(sorted(set(names)))}" for reason, names in sorted(reasons.items()))
    return f"{len(passed)}/{len(rows)} pass; {why}"


def _cells(v: dict, opsets: list, shapes: str) -> list[str]:
    cells = []
    for o in opsets:
        if not v["rows"]:
            cells.append(f"not run ({v.get('error', '?')[:50]})")
            continue
        rows = [r for r in v["rows"] if r["opset"] == o and r.get("shapes", "static") == shapes]
        per_tier = {t: cell([r for r in rows if r["tier"] == t]) for t in TIERS}
        same = len(set(per_tier.values())) == 1
        cells.append(per_tier["function"] if same else "; ".join(f"{t}: {c}" for t, c in per_tier.items()))
    return cells


def render(result: dict) -> str:
    """The markdown table (plus one line saying what was run) of one matrix result: one row per
    onnxruntime release and kind of shapes (static, dynamic), one column per opset; a cell says both
    tiers' result when they agree."""
    opsets, kinds = result["opsets"], result.get("shapes", ["static"])
    head = ["onnxruntime (numpy)", "shapes"] + [f"opset {o}" for o in opsets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in result["versions"]:
        label = f"{v['onnxruntime']} ({v['numpy']})" if v.get("onnxruntime") else f"{v['requested']} (not installed)"
        for kind in kinds:
            lines.append("| " + " | ".join([label, kind, *_cells(v, opsets, kind)]) + " |")
    ir = result.get("ir_versions", {})
    lines.append("| file IR version | | " + " | ".join(str(ir.get(str(o), "?")) for o in opsets) + " |")
    made = result["exported_with"]
    dims = result.get("dynamic_dims", {})
    dynamic = (" Dynamic files: the demo with its own dynamic shapes, each seed op with every input dimension "
               "`Dim.AUTO` but those its attributes fix (symbolic input dimensions per file: "
               + ", ".join(f"{k} {n}" for k, n in dims.items()) + ")." if dims else "")
    lines.append("")
    lines.append(f"Each cell: {len(result['cases'])} files ({', '.join(result['cases'])}) in the function tier "
                 "(the file as exported) and in the native tier (the library registered); one result when both "
                 f"agree. Files exported once per opset and kind of shapes by "
                 f"opbridge (torch {made['torch']}, onnx {made['onnx']}); native: `opbridge build` (C API "
                 f"{result['c_api']}) built with onnxruntime {made['onnxruntime']}; each onnxruntime in its own venv "
                 f"with only onnxruntime + numpy; outputs compared with eager torch at the parity tolerances; "
                 f"{result['date']}.{dynamic}")
    for why in result.get("export_errors", []):
        lines.append(f"- not exported: {why[:300]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    return doc_markers.table_main(BLOCK, render, DEFAULT_JSON, __doc__.split("\n")[0], argv)

if __name__ == "__main__":
    main(sys.argv[1:])
