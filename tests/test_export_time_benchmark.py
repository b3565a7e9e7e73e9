"""benchmarks/export_time.py: its breakdown of a process, its committed block, and a --quick run (no
timing is asserted here: the figures are the benchmark's, on a quiet machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_breakdown_gives_each_phase_its_own_time():
    from export_time import breakdown

    events = [(1.0, "torch.export", "..."), (2.0, "torch.export", "done (1.0 s)"),
              (2.5, "onnx.checker (full)", "..."), (2.75, "onnx.checker (full)", "done (0.2 s)"),
              (3.0, "onnxruntime session (function tier)", "..."),
              (3.5, "onnxruntime session (function tier)", "done (0.5 s)"),
              (3.75, "eager + onnxruntime run 1", "..."), (4.0, "building C++ library x (once; cached)", "..."),
              (6.0, "building C++ library x (once; cached)", "done (2.0 s)"),
              (6.5, "eager + onnxruntime run 1", "done (2.8 s)"),
              (7.0, "localize: eager intermediates", "..."), (7.5, "localize: eager intermediates", "failed")]
    parts = breakdown(events, 8.0)
    # the gap before a top-level step is the work leading to it; the build is taken out of the run
    assert parts == {"startup": 1.0, "export": 1.75, "session": 0.75, "runs + parity": 1.0, "C++ builds": 2.0,
                     "other steps": 1.0, "report + exit": 0.5}
    assert sum(parts.values()) == pytest.approx(8.0)
    assert breakdown([], 2.5)["startup"] == 2.5  # python -c 'import torch': no progress lines


def test_export_time_block_is_the_committed_result():
    import doc_markers
    import export_time

    result = json.loads(export_time.DEFAULT_JSON.read_text())
    page = doc_markers.page_with(export_time.BLOCK).read_text()
    assert doc_markers.section(page, export_time.BLOCK) == export_time.render(result)
    assert set(result["export"]["cases"]) == {f"{m}, {s} shapes" for m in ("demo", "roi_align", "derived")
                                              for s in ("dynamic", "static")}
    assert result["export"]["max_ratio"] == max(r["ratio"] for r in result["export"]["cases"].values())


@pytest.mark.long
def test_export_time_quick_run(tmp_path):
    out = tmp_path / "e.json"
    # NOTE: a process of its own: the benchmark defines ops (torchvision::roi_align, a derived-body op) once
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "export_time.py"), "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    cases = result["export"]["cases"]
    assert len(cases) == 6 and all(r["ratio"] > 0 and set(r["median_s"]) == {"bridge.export", "torch.onnx.export"}
                                   for r in cases.values())
    warm = result["check"]["warm"]
    assert set(warm["median_s"]) == {"opbridge check", "plain export + session", "python -c 'import torch'"}
    for name, parts in warm["breakdown_s"].items():  # the phases add up to the process's wall time
        assert sum(parts.values()) == pytest.approx(warm["median_s"][name], rel=0.02, abs=0.05)
        assert parts["export"] > 0 and parts["session"] > 0 and parts["runs + parity"] > 0
    assert result["check"]["cold"] is None and "opbridge check" in done.stdout
