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


def test_the_committed_matrix_ran_static_and_dynamic_files_in_both_tiers():
    result = json.loads(ort_matrix_table.DEFAULT_JSON.read_text())
    assert result["shapes"] == ["static", "dynamic"]
    for version in result["versions"]:
        kinds = {(r["shapes"], r["tier"]) for r in version["rows"]}
        assert kinds == {(s, t) for s in ("static", "dynamic") for t in ort_matrix_table.TIERS}, version["requested"]
    assert all(n > 0 for n in result["dynamic_dims"].values()), result["dynamic_dims"]


def _row(case, shapes, tier, status="pass", error=""):
    return {"case": case, "opset": 17, "shapes": shapes, "tier": tier, "status": status, "error": error}


def test_table_shows_a_static_and_a_dynamic_row_per_release():
    rows = [_row(c, s, t) for c in ("demo", "crop") for s in ("static", "dynamic") for t in ("function", "native")]
    rows[4] = _row("crop", "static", "function", "error", "Could not find an implementation for ReduceProd(13)")
    rows[6] = _row("demo", "dynamic", "function", "error", "not exported: OpBridgeError: opbridge: no")
    result = {"opsets": [17], "shapes": ["static", "dynamic"], "cases": ["demo", "crop"], "c_api": 17,
              "ir_versions": {"17": 8}, "dynamic_dims": {"demo": 2, "crop": 3}, "date": "2026-11-25",
              "exported_with": {"torch": "2.13.0", "onnx": "1.23.2", "onnxruntime": "1.32.0"},
              "versions": [{"requested": "1.17.3", "onnxruntime": "1.17.3", "numpy": "1.26.4", "rows": rows}]}
    lines = ort_matrix_table.render(result).splitlines()
    assert lines[2] == ("| 1.17.3 (1.26.4) | static | function: 1/2 pass; no kernel for ReduceProd(13): crop; "
                        "native: 2/2 pass |")
    assert lines[3] == "| 1.17.3 (1.26.4) | dynamic | function: 1/2 pass; not exported: demo; native: 2/2 pass |"
    assert "demo 2, crop 3" in lines[6]


@pytest.mark.slow
def test_every_release_runs_every_file_it_can_load(tmp_path):
    import ort_matrix

    result = ort_matrix.main(["--json", str(tmp_path / "matrix.json")])
    assert (tmp_path / "matrix.json").exists()
    for version in result["versions"]:
        assert version["rows"], version
        for row in version["rows"]:
            if row["status"] == "error":  # only a file newer than the release (IR version or opset) is refused
                assert not row["error"].startswith("not exported"), row
                assert "Unsupported model IR version" in row["error"] or "opset" in row["error"].lower(), row
            else:
                assert row["status"] == "pass", row
    oldest = result["versions"][0]
    assert oldest["onnxruntime"].startswith("1.17")
    assert all(r["status"] == "pass" for r in oldest["rows"] if r["opset"] <= 20)
