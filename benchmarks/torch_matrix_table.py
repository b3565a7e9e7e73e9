"""Render a torch-matrix JSON (``benchmarks/torch_matrix.py``) as a markdown table; optionally put it
into the README between ``<!-- torch-matrix:start -->`` and ``<!-- torch-matrix:end -->``.

    python benchmarks/torch_matrix_table.py [benchmarks/results/torch_matrix.json] [--readme README.md]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import doc_markers
from ort_matrix_table import ROOT

DEFAULT_JSON = ROOT / "benchmarks" / "results" / "torch_matrix.json"
BLOCK = "torch-matrix"
START, END = doc_markers.markers(BLOCK)
# NOTE: the glog prefix of torch's C++ warnings (level, date, time, thread id) differs per run
GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ ")


def counts(tests: dict) -> str:
    """``"612 passed, 2 failed, 1 xfailed"``: the non-zero counts of one release's test run."""
    if "error" in tests:
        return f"did not run ({tests['error'][:60]})"
    return ", ".join(f"{tests[k]} {k}" for k in ("passed", "failed", "xfailed", "skipped") if tests.get(k)) or "none"


def kept(release: dict) -> str:
    """Whether ``pip install -e .`` left the torch that was installed first."""
    before, after = release.get("torch"), release.get("torch_after_opbridge")
    return "yes" if before and before == after else f"**no** ({before} -> {after})"


def row(release: dict) -> str:
    if "error" in release and "tests" not in release:
        return f"| {release['requested']} | not installed: {release['error'][:120]} | | | | |"
    tests, main = release["tests"], release.get("main", {})
    failing = "; ".join(f"`{t.split('::', 1)[-1]}`" for t in tests.get("failures", {})) or "-"
    check = (f"{'pass' if main.get('passed') else '**fail**'} ({main.get('parity') or 'no parity line'})"
             if main else "not run")
    noise = "; ".join(f"`{GLOG_PREFIX.sub('', line)[:100]}`" for line in main.get("foreign_stderr", [])) or "none"
    return f"| {release['torch']} | {kept(release)} | {counts(tests)} | {failing} | {check} | {noise} |"


def render(result: dict) -> str:
    """The markdown table (plus one line saying what was run) of one torch-matrix result."""
    lines = ["| torch | kept by `pip install -e .` | tests | failing | `opbridge check` | other stderr lines |",
             "|---|---|---|---|---|---|"]
    lines += [row(r) for r in result["releases"]]
    dates = sorted({r["date"] for r in result["releases"]})
    commits = sorted({r["commit"][:10] for r in result["releases"]})
    lines += ["", f"Each row: a fresh venv (Python {result['python']}), `pip install torch==V` first, then "
              f"`pip install -e \".[test]\"`; tests ({subsets(result)}) with `-m 'not slow'` in one process; "
              f"commit {', '.join(commits)}; {', '.join(dates)}."]
    return "\n".join(lines)


def subsets(result: dict) -> str:
    """Which test files ran, per release where releases ran different subsets."""
    runs: dict[tuple, list] = {}
    for r in result["releases"]:
        runs.setdefault(tuple(r.get("test_files", result["tests"])), []).append(r["requested"])
    files = {k: "`" + " ".join(Path(t).name for t in k) + "`" for k in runs}
    if len(runs) == 1:
        return files.popitem()[1]
    return "; ".join(f"{', '.join(v)}: {files[k]}" for k, v in runs.items())


def main(argv: list[str] | None = None) -> str:
    return doc_markers.table_main(BLOCK, render, DEFAULT_JSON, __doc__.split("\n")[0], argv)

if __name__ == "__main__":
    main(sys.argv[1:])
