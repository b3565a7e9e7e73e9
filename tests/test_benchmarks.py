"""The benchmark scripts run and check their own answers (no timing is asserted here)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_bev_pool_v2_benchmark_runs(tmp_path):
    import bev_pool_v2

    # a smaller size than BEVDet-R50's 59 depth bins: the suite's quick run below covers that size
    result = bev_pool_v2.main(["--quick", "--repeats", "1", "--depth-bins", "8", "--json", str(tmp_path / "r.json")])
    assert 20_000 < result["points"] < 40_000 and result["config"]["channels"] == 64
    import machine

    lower = machine.cpu_isa_paths()[1:]  # each path below this CPU's best, forced by its own library build
    assert set(result["median_ms"]) == {"memcpy (floor)", "ORT native", "ORT native 1 thread", "ORT native, lone call",
                                        "ORT native 1 thread, lone call", "memcpy (floor), lone call", "ORT function",
                                        "eager torch", *(f"ORT native, {isa} path" for isa in lower)}
    assert result["isa_paths"]["ORT native"] == machine.cpu_isa_paths()[0]
    assert [result["isa_paths"][f"ORT native, {isa} path"] for isa in lower] == lower  # what each library reported
    assert result["machine"]["cpu_model"] and result["machine"]["caches"]
    q1, q3 = result["floor_quartiles_ms"]["memcpy (floor)"]
    assert 0 < q1 <= q3
    checks = result["checks"]
    assert checks["native_deterministic"] and checks["native_same_on_1_and_2_threads"]
    assert checks["native_vs_float64_max_abs"] < 1e-4
    # the lone targets are against the floor back to back
    ms, ratios = result["median_ms"], result["ratios"]
    assert ratios["native lone / floor lone"] == ms["ORT native, lone call"] / ms["memcpy (floor), lone call"]
    assert ratios["native lone, 1 -> 2 threads speedup"] == ms["ORT native 1 thread, lone call"] / ms[
        "ORT native, lone call"]
    assert [name for name, *_ in bev_pool_v2.target_rows(result)] == [
        "native / floor", *(["native avx2 / floor"] if "avx2" in lower else []), "native lone / floor lone"]
    assert all(result["checks"][f"native {isa} path vs float64 max abs"] < 1e-4 for isa in lower)
    if "avx2" in lower:  # the AVX2 and AVX-512 paths sum with the same FMAs in the same order
        assert result["checks"]["native avx2 path bitwise equal to avx512"]
    assert (tmp_path / "r.json").exists()


def test_lone_calls_come_after_every_back_to_back_round(monkeypatch):
    """bev_pool_v2.measure: the rounds with lone calls (and their sleeps) run after all back-to-back
    rounds, and each native lone call follows the floor's pair (bev_pool_v2's NOTE on idle time)."""
    import bev_pool_v2

    phases = []
    real = bev_pool_v2.rounds

    def recording(fns, repeats, lone=()):
        phases.append((list(fns), tuple(lone)))
        return real(fns, repeats, lone)

    monkeypatch.setattr(bev_pool_v2, "rounds", recording)
    bev_pool_v2.measure(1, quick=True, config={"depth_bins": 2})
    (first, first_lone), (second, second_lone) = phases
    assert first_lone == () and "ORT native" in first
    floor = bev_pool_v2.FLOOR
    assert second == [floor, bev_pool_v2.NATIVE_LONE, floor + " again", bev_pool_v2.NATIVE_1T_LONE,
                      bev_pool_v2.FLOOR_LONE]
    assert set(second_lone) == {bev_pool_v2.NATIVE_LONE, bev_pool_v2.NATIVE_1T_LONE, bev_pool_v2.FLOOR_LONE}


def test_round_robin_times_lone_calls_once_after_idle(monkeypatch):
    import bev_pool_v2

    calls, sleeps = [], []
    monkeypatch.setattr(bev_pool_v2.time, "sleep", lambda s: (sleeps.append(s), calls.append("sleep")))
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "lone")}
    ms = bev_pool_v2.round_robin(fns, 2, lone=("lone",))
    assert set(ms) == {"a", "b", "lone"} and all(v >= 0 for v in ms.values())
    round_ = ["a", "a", "b", "b", "sleep", "lone"]
    assert calls == ["a", "b", "lone"] + round_ * 2  # one warm-up call each, then the rounds in order
    assert sleeps == [bev_pool_v2.LONE_IDLE_S] * 2


@pytest.mark.long
def test_benchmark_suite_quick_run(tmp_path):
    import doc_markers
    import readme_table
    import run

    result = run.main(["--quick", "--json", str(tmp_path / "all.json")])
    assert set(result) == {"machine", "export", "session", "models", "bevdet_r50", "scaling", "scaling_frames"}
    assert [r["batch"] for r in result["scaling_frames"]["rows"]] == [1, 2]
    assert [r["points"] for r in result["scaling"]["rows"]] == sorted(r["points"] for r in result["scaling"]["rows"])
    assert set(result["models"]["demo"]["ms"]) == {"eager torch", "ORT function", "ORT native", "ORT python"}
    assert set(result["models"]["identity"]["ms"]) == {"eager torch", "ORT function", "ORT native"}
    # the README's evidence blocks render from this JSON
    readme = tmp_path / "evidence.md"
    readme.write_text(doc_markers.page_with("bench").read_text())
    readme_table.main(["--json", str(tmp_path / "all.json"), "--readme", str(readme)])
    assert "<!-- bench:start -->" in readme.read_text()


def test_cli_startup_block_is_the_committed_result(tmp_path):
    import json

    import cli_startup
    import doc_markers

    result = json.loads(cli_startup.DEFAULT_JSON.read_text())
    assert doc_markers.section(doc_markers.page_with(cli_startup.BLOCK).read_text(),
                               cli_startup.BLOCK) == cli_startup.render(result)
    assert {cli_startup.HELP, cli_startup.TORCH} <= set(result["median_s"])
    # the script itself, one round (its figures are not asserted: this is no timed test)
    fresh = cli_startup.main(["--repeats", "1", "--json", str(tmp_path / "c.json")])
    assert fresh["ratio"] > 0 and (tmp_path / "c.json").exists()
    assert set(fresh["median_s"]) == {cli_startup.HELP, cli_startup.TORCH, cli_startup.CACHE}
    assert "`opbridge cache` " in cli_startup.render(fresh)


def test_body_size_benchmark_runs(tmp_path):
    import body_size

    result = body_size.main(["--quick", "--json", str(tmp_path / "b.json")])
    bodies = result["bodies"]
    assert {"bev::bev_pool_v2", "opbridge::crop", "opbridge::paste"} <= set(bodies)
    for sizes in bodies.values():  # the guards add nodes; branches only add
        assert sizes["unguarded"]["nodes"] <= sizes["nodes"] <= sizes["nodes_with_branches"]
    assert set(result["bev_pool_v2"]["median_ms"]) == {"eager torch", "ORT function"}
    assert (tmp_path / "b.json").exists()


@pytest.mark.long
def test_bound_benchmark_runs(tmp_path):
    import bound
    import machine

    result = bound.main(["--quick", "--json", str(tmp_path / "bound.json")])
    assert list(result["paths"]) == machine.cpu_isa_paths()  # every path this CPU runs, best first
    for p in result["paths"].values():
        assert p["real_ms"] > 0 and p["l1_ms"] > 0
    assert (tmp_path / "bound.json").exists()


def test_readme_performance_block_is_the_committed_results():
    """README's performance block is what benchmarks/readme_perf.py makes of the committed JSON (no
    hand-typed figure), and it renders a fresh quick run of the suite too."""
    import doc_markers
    import readme_perf

    page = doc_markers.page_with(readme_perf.BLOCK)
    assert page.name == "README.md"
    results = readme_perf.load()
    assert doc_markers.section(page.read_text(), readme_perf.BLOCK) == readme_perf.block(results)
    rows = [line for line in readme_perf.block(results).splitlines() if line.startswith("| ")][1:]
    targets = [row for row in rows if not row.endswith("| for context |")]
    assert len(targets) == 8 and all(row.endswith((": met |", ": **not met** |")) for row in targets)  # one per target
    assert results["run"]["bevdet_r50"]["machine"]["cpu_model"] in page.read_text()
