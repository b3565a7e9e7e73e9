"""The onnxruntime release matrix: the README shows the committed result; the slow test reruns it
(one venv per release, pip needs the network the first time; venvs cached outside the repo)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import doc_markers  # noqa: E402
import ort_matrix_table  # noqa: E402


def test_readme_table_is_the_committed_matrix_result():
    result = json.loads(ort_matrix_table.DEFAULT_JSON.read_text())
    page = doc_markers.page_with(ort_matrix_table.BLOCK).read_text()
    assert doc_markers.section(page, ort_matrix_table.BLOCK) == ort_matrix_table.render(result)


def test_refusals_are_shortened_to_their_reason():
    assert ort_matrix_table.refusal("Fail: ... Model::Model(...) Unsupported model IR version: 11, max supported "
                                    "IR version: 10") == "IR 11 > 10"


@pytest.mark.slow
def test_every_release_runs_every_file_it_can_load(tmp_path):
    import ort_matrix

    result = ort_matrix.main(["--json", str(tmp_path / "matrix.json")])
    assert (tmp_path / "matrix.json").exists()
    for version in result["versions"]:
        assert version["rows"], version
        for row in version["rows"]:
            if row["status"] == "error":  # only a file newer than the release (IR version or opset) is refused
                assert "Unsupported model IR version" in row["error"] or "opset" in row["error"].lower(), row
            else:
                assert row["status"] == "pass", row
    oldest = result["versions"][0]
    assert oldest["onnxruntime"].startswith("1.17")
    assert all(r["status"] == "pass" for r in oldest["rows"] if r["opset"] <= 20)
