"""The benchmark scripts run and check their own answers (no timing is asserted here)."""

import sys
from pathlib import Path

import pytest

import bridge

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def test_bev_pool_v2_benchmark_runs(tmp_path):
    import bev_pool_v2

    # a smaller size than BEVDet-R50's 59 depth bins: the suite's quick run below covers that size
    result = bev_pool_v2.main(["--quick", "--repeats", "1", "--depth-bins", "8", "--json", str(tmp_path / "r.json")])
    assert 20_000 < result["points"] < 40_000 and result["config"]["channels"] == 64
    import machine

    lower = machine.cpu_isa_paths()[1:]  # each path below this CPU's best, forced by its own library build
    assert set(result["median_ms"]) == {"floor", "floor 1 thread", "ORT native", "ORT native 1 thread",
                                        "ORT native, indices in L1", "ORT native, lone call",
                                        "ORT native 1 thread, lone call", "floor, lone call", "ORT function",
                                        "eager torch", *(f"ORT native, {isa} path" for isa in lower)}
    # the floor runs on the threads of the native contender it is held against, and read what it should
    threads = result["threads"]
    assert threads["floor"] == threads["ORT native"] == threads["floor, lone call"] == threads["ORT native, lone call"] == 2
    assert threads["floor 1 thread"] == threads["ORT native 1 thread"] == 1
    assert result["checks"]["floor read each input byte once"] and result["checks"]["floor 1 thread read each input byte once"]
    # what the run ran under: CPU, ISA path, date, load
    assert result["conditions"]["start"]["date"].startswith("20") and len(result["conditions"]["end"]["load_average"]) == 3
    # every ratio with its spread (q1 <= median <= q3), every target with a verdict that follows it
    for name, (q1, med, q3) in result["ratio_quartiles"].items():
        assert q1 <= med <= q3 and result["ratios"][name] == med, name
    assert set(result["verdicts"]) == {name for name, *_ in bev_pool_v2.target_rows(result)}
    assert result["isa_paths"]["ORT native"] == machine.cpu_isa_paths()[0]
    assert [result["isa_paths"][f"ORT native, {isa} path"] for isa in lower] == lower  # what each library reported
    assert result["machine"]["cpu_model"] and result["machine"]["caches"]
    q1, q3 = result["quartiles_ms"]["floor"]
    assert 0 < q1 <= q3
    checks = result["checks"]
    assert checks["native_deterministic"] and checks["native_same_on_1_and_2_threads"]
    assert checks["native_vs_float64_max_abs"] < 1e-4
    # with one round, each ratio is the ratio of the two times
    ms, ratios = result["median_ms"], result["ratios"]
    assert ratios["native lone / floor lone"] == pytest.approx(ms["ORT native, lone call"] / ms["floor, lone call"])
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
    assert set(result) == {"machine", "export", "session", "models", "bevdet_r50", "scaling", "scaling_frames",
                           "provenance"}
    assert result["provenance"]["commit"] and "benchmarks/run.py" in result["provenance"]["measures"]
    assert [r["batch"] for r in result["scaling_frames"]["rows"]] == [1, 2]
    assert [r["points"] for r in result["scaling"]["rows"]] == sorted(r["points"] for r in result["scaling"]["rows"])
    assert set(result["models"]["demo"]["ms"]) == {"eager torch", "ORT function", "ORT native", "ORT python"}
    assert set(result["models"]["identity"]["ms"]) == {"eager torch", "ORT function", "ORT native"}
    # the README's evidence blocks render from this JSON
    readme = tmp_path / "evidence.md"
    readme.write_text(doc_markers.page_with("bench").read_text())
    readme_table.main(["--json", str(tmp_path / "all.json"), "--readme", str(readme)])
    assert doc_markers.section(readme.read_text(), "bench") == "\n".join(readme_table.evidence(result))


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
    hand-typed figure): every target with a verdict, the run's CPU, date and ISA paths."""
    import doc_markers
    import readme_perf

    page = doc_markers.page_with(readme_perf.BLOCK)
    assert page.name == "README.md"
    results = readme_perf.load()
    assert doc_markers.section(page.read_text(), readme_perf.BLOCK) == readme_perf.block(results)
    rows = [line for line in readme_perf.block(results).splitlines() if line.startswith("| ")][1:]
    targets = [row for row in rows if not row.endswith("| for context |")]
    assert len(targets) == 8 and all(row.endswith((": met |", ": **not met** |", ": undecided (the spread straddles it) |"))
                                     for row in targets)  # one per target
    b = results["run"]["bevdet_r50"]
    text = page.read_text()
    assert b["machine"]["cpu_model"] in text and b["conditions"]["start"]["date"][:10] in text
    assert "memcpy" not in doc_markers.section(text, readme_perf.BLOCK)  # the floor is floor_op's, thread-matched
    # a row per ISA path this run's CPU runs, each against the floor on the same threads
    assert sum(f"{isa} path" in row for row in rows for isa in b["machine"]["isa_paths_available"]) >= len(
        b["machine"]["isa_paths_available"])


def test_floor_reads_each_input_byte_once_and_writes_the_output(tmp_path):
    """The floor (floor_op.py) moves each byte once: its checksum is the sum of every input word, so an
    input read twice, skipped or read in part changes it; its output is written whole (zeros). Above
    64k points it runs on the session's 2 intra-op threads, as the kernel does."""
    import bev_pool_v2
    import floor_op

    inputs, shape = bev_pool_v2.bevdet_inputs(depth_bins=20)
    assert inputs[2].numel() > 64 * 1024  # the parallel path of both kernels
    for threads in (1, 2):
        sess = floor_op.floor_session(inputs, shape, bev_pool_v2.session_options(threads))
        feed = {i.name: v.numpy() for i, v in zip(sess.get_inputs(), inputs, strict=True)}
        out, total = sess.run(None, feed)
        assert out.shape == (1, shape[4], *shape[1:4]) and not out.any()
        assert int(total[0]) == floor_op.checksum(inputs) != 0
        feed["feat"] = feed["feat"].copy()
        feed["feat"].reshape(-1)[-1] += 1.0  # the last word of one input: read too
        assert int(sess.run(None, feed)[1][0]) != floor_op.checksum(inputs)
    assert "bench::bev_pool_v2_floor" not in {spec.qualname for spec in bridge.REGISTRY}  # its own registry


def test_verdicts_hold_across_the_spread():
    """A target is met only when the whole interquartile range meets it (issue #46: a lone call's median
    1.26x met <= 1.3x while its range was 1.13-1.45)."""
    from spread import spread, verdict

    assert verdict([1.13, 1.26, 1.45], 1.3, upper=True) == "undecided"
    assert verdict([1.1, 1.2, 1.29], 1.3, upper=True) == "met"
    assert verdict([1.31, 1.4, 1.5], 1.3, upper=True) == "not met"
    assert verdict([24.0, 30.0, 40.0], 25.0, upper=False) == "undecided"
    # per-round ratios: a load that slows both contenders of one round cancels
    assert spread([1.0, 2.0, 1.0, 2.0], [1.0, 2.0, 1.0, 2.0]) == [1.0, 1.0, 1.0]
    # unpaired rounds: the widest range the two quartiles allow
    q = spread([1.0, 2.0, 1.0, 2.0], [1.0, 2.0, 1.0, 2.0], paired=False)
    assert q[0] < 1.0 < q[2]


def test_readme_performance_verdicts_follow_the_spread():
    """readme_perf's rows: a target whose median meets it but whose range does not is not "met"."""
    import copy

    import readme_perf

    results = copy.deepcopy(readme_perf.load())
    b = results["run"]["bevdet_r50"]
    bound = b["targets"]["native_vs_floor_max"]
    b["ratio_quartiles"]["native / floor"] = [bound * 0.9, bound * 0.95, bound * 1.1]
    first = [line for line in readme_perf.block(results).splitlines() if line.startswith("| native bev_pool_v2")]
    assert len(first) == 1 and first[0].endswith("undecided (the spread straddles it) |"), first
    b["ratio_quartiles"]["native / floor"] = [bound * 0.8, bound * 0.85, bound * 0.9]
    first = [line for line in readme_perf.block(results).splitlines() if line.startswith("| native bev_pool_v2")]
    assert first[0].endswith(": met |"), first


def test_importing_the_benchmarks_leaves_the_environment_alone():
    """bev_pool_v2.py, bound.py and run.py set OMP_WAIT_POLICY only when they start the process: a test
    importing them at collection must not hand it to every later test and child (issue #46)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import bev_pool_v2, bound, run; "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    out = subprocess.run([sys.executable, "-c", code, str(bench)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


@pytest.mark.parametrize("script", ["bound", "body_size"])
def test_a_quick_run_keeps_the_committed_results(script, monkeypatch, tmp_path):
    """``--quick`` (a smoke run) writes no JSON unless told where: the committed results stay the full
    run's (issue #46: ``bound.py --quick`` overwrote results/bound.json)."""
    import importlib

    import machine

    module = importlib.import_module(script)
    committed = tmp_path / "committed.json"
    monkeypatch.setattr(module, "DEFAULT_JSON", str(committed))
    monkeypatch.setattr(module, "measure", lambda *a, **k: {"stub": True})
    monkeypatch.setattr(module, "report", lambda r: "stub")
    module.main(["--quick"])
    assert not committed.exists()
    module.main(["--quick", "--json", str(tmp_path / "asked.json")])
    assert (tmp_path / "asked.json").exists() and not committed.exists()
    assert machine.json_path(None, False, "r.json") == "r.json"
    # run.py has no default file; export_time.py takes the same rule
    assert "machine.json_path(args.json, quick, str(DEFAULT_JSON))" in (BENCH / "export_time.py").read_text()


def test_every_benchmark_with_a_main_runs_it_as_a_script():
    """A script whose command line is ``main`` calls it when run (bound.py once lost its guard)."""
    for script in sorted(BENCH.glob("*.py")):
        text = script.read_text()
        if "\ndef main(" in text:
            guard = '\nif __name__ == "__main__":\n'
            after = text.rsplit("\ndef main(", 1)[1]  # the guard comes after main, and its block calls it
            block = after.split(guard, 1)[1].split("\n\n", 1)[0] if guard in after else ""
            assert "main(" in block, script.name


@pytest.mark.parametrize("name", ["spread", "machine", "floor_op"])
def test_benchmark_helpers_examples_run(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0, result
