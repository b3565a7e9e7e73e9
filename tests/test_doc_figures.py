"""Every measured figure in README.md and docs/*.md comes from committed JSON of this code (issue #46).

Two rules:
1. NO FIGURE WITHOUT JSON: a measured figure (a time, a rate, a ratio, a node count, a measured error)
   stands only inside a generated block (``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``), and each
   block is exactly what its generator in benchmarks/ renders from its committed JSON. Outside the
   blocks, only the settings listed in SETTINGS (tolerances, idle times, sizes of downloads).
2. NO JSON OLDER THAN ITS CODE: a result JSON records the commit it measured and the files it measures
   (``provenance``, benchmarks/machine.py); none of those files was modified when it ran, and no commit
   after that one changed them. A change to a kernel, a benchmark or an op then fails here until the
   benchmark is run again. The release matrices (which releases run opbridge's tests, not how fast)
   are outside this rule, listed in MATRICES.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cli_startup  # noqa: E402
import doc_markers  # noqa: E402
import ort_matrix_table  # noqa: E402
import readme_perf  # noqa: E402
import readme_table  # noqa: E402
import spinning  # noqa: E402
import torch_matrix_table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# a measured figure: a number with a unit of time, rate, size or nodes, a ratio ("1.3x"), a measured
# error in scientific notation, or a "was N"
FIGURE = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?\s?(?:ms|µs|us|GB/s|MB/s|s|GB|MB|KB|%|nodes|-node)(?!\w)"
                    r"|\d+(?:\.\d+)?x\b|\d(?:\.\d+)?e-\d+\b|was \d+)")
# (page, figure): why it is no measurement
SETTINGS = {
    ("kernel_libraries.md", "11 MB"): "the size of mmdeploy's wheel, downloaded",
    ("kernel_libraries.md", "1e-5"): "float32's parity tolerance",
    ("parity.md", "1e-3"): "a parity tolerance", ("parity.md", "8e-3"): "a parity tolerance",
    ("parity.md", "1e-2"): "a parity tolerance", ("parity.md", "1e-5"): "a parity tolerance",
    ("parity.md", "1e-7"): "a parity tolerance",
    ("tiers.md", "10 ms"): "the idle time before a lone call",
    ("toolchain.md", "1e-5"): "the tolerance of the toolchain recipes",
    ("toolchain.md", "2%"): "the tolerance of quantized files",
}


def _json(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / name).read_text())


# block name -> what its generator renders from the committed JSON
GENERATED = {
    "performance": lambda: readme_perf.block(readme_perf.load()),
    "bench": lambda: "\n".join(readme_table.evidence(_json("results.json"))),
    "bench-native": lambda: "\n".join(readme_table.native(_json("results.json"))),
    "cli-startup": lambda: cli_startup.render(json.loads(cli_startup.DEFAULT_JSON.read_text())),
    "torch-matrix": lambda: torch_matrix_table.render(json.loads(torch_matrix_table.DEFAULT_JSON.read_text())),
    "ort-matrix": lambda: ort_matrix_table.render(json.loads(ort_matrix_table.DEFAULT_JSON.read_text())),
    "spinning": lambda: spinning.render(json.loads(spinning.DEFAULT_JSON.read_text())),
}
# result files under rule 2, and the release matrices outside it
MEASURED = ["results.json", "results/body_size.json", "results/bound.json", "results/export_time.json",
            "results/cli_startup.json", "results/spinning.json"]
MATRICES = {"results/ort_matrix.json": "which onnxruntime releases run the files, not a speed",
            "results/torch_matrix.json": "which torch releases pass the tests, not a speed"}


def _outside_blocks(text: str) -> str:
    text = re.sub(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_no_measured_figure_stands_outside_a_generated_block():
    found = [(page.name, m.group(0), line.strip()[:120])
             for page in doc_markers.pages() for line in _outside_blocks(page.read_text()).splitlines()
             for m in FIGURE.finditer(line) if (page.name, m.group(0)) not in SETTINGS]
    assert not found, "figures typed by hand (generate them from a benchmark's JSON, or remove them):\n" + "\n".join(
        f"  {page}: {figure!r} in: {line}" for page, figure, line in found)


def test_every_generated_block_is_its_generator_on_the_committed_json():
    blocks = {m.group(1): page for page in doc_markers.pages()
              for m in re.finditer(r"<!-- ([\w-]+):start -->", page.read_text())}
    export_block = "export-time"  # NOTE: tests/test_export_time_benchmark.py renders it (export_time loads torch)
    assert set(blocks) - {export_block} == set(GENERATED), "a block with no generator here, or a generator with no block"
    for name, render in GENERATED.items():
        assert doc_markers.section(blocks[name].read_text(), name) == render(), f"{name} ({blocks[name].name})"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("name", MEASURED)
def test_no_result_is_older_than_the_code_it_measures(name):
    result = _json(name)
    assert "provenance" in result, f"{name} records no provenance: run its benchmark again (benchmarks/machine.py)"
    p = result["provenance"]
    assert p["measures"] and not p["dirty"], f"{name} was measured with {p['dirty']} modified"
    subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", p["commit"], "HEAD"], check=True)
    later = _git("log", "--format=%h %s", f"{p['commit']}..HEAD", "--", *p["measures"]).strip()
    assert not later, f"{name} predates commits that changed the code it measures: run its benchmark again\n{later}"


def test_every_result_file_is_measured_or_a_matrix():
    files = {str(p.relative_to(ROOT / "benchmarks")) for p in (ROOT / "benchmarks").rglob("*.json")}
    assert files == set(MEASURED) | set(MATRICES)
