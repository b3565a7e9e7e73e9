"""The benchmark scripts run and check their own answers (no timing is asserted here)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_bev_pool_v2_benchmark_runs(tmp_path):
    import bev_pool_v2

    result = bev_pool_v2.main(["--repeats", "1", "--json", str(tmp_path / "r.json")])
    assert 150_000 < result["points"] < 260_000 and result["channels"] == 80
    assert set(result["median_ms"]) == {"eager torch", "ORT native", "ORT function"}
    assert (tmp_path / "r.json").exists()


def test_benchmark_suite_quick_run(tmp_path):
    import run

    result = run.main(["--quick", "--json", str(tmp_path / "all.json")])
    assert set(result) == {"machine", "export", "demo_run", "scaling", "session"}
    assert [r["points"] for r in result["scaling"]["rows"]] == sorted(r["points"] for r in result["scaling"]["rows"])
    assert set(result["demo_run"]) == {"eager torch", "ORT function", "ORT native", "ORT python"}
