"""Bad inputs across tiers (the table's, and bad models), soak (RSS bounded), concurrency: each where
a crash is possible, in a subprocess, so a crash is a failure rather than a dead test runner."""

import json
import os
import re
import threading
from pathlib import Path

import forkserver
import numpy as np
import pytest
from op_db import OPS, TIERS, bad_input_params

import bridge
import custom_ops.demo as demo

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
SOAK_RUNS = int(os.environ.get("OPBRIDGE_SOAK_RUNS", "2000"))  # --heavy: 10,000
RSS_BOUND = 32 * 2**20  # bytes of growth allowed over the soak (warm-up excluded)
# NOTE: 2,000 sessions per tier, not 5,000: a session costs 5-50 ms on 2 shared cores (--heavy: 10,000)
SESSIONS = int(os.environ.get("OPBRIDGE_SESSIONS", "2000"))
# NOTE: RSS growth allowed: one step of ~0.9 MiB seen once (allocator arenas), then 300 bytes a session;
# the python tier grew ~1,600 bytes a session when it leaked
SESSION_STEP, SESSION_BOUND = 2**20, 300


def script(name, *args):
    r = forkserver.run([str(ROOT / "tests/scripts" / name), *map(str, args)], env=ENV, timeout=900)
    assert r.returncode == 0, f"{name} died (rc={r.returncode}):\n{r.stderr[-3000:]}"
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def bad_inputs():
    """{(op, case, tier): {"type", "error"}} for the table's bad inputs and their valid controls."""
    return {(d["op"], d["case"], d["tier"]): d for d in script("bad_inputs.py")}


@pytest.mark.parametrize("entry,bad,tier", bad_input_params("bad_input"))
def test_bad_input_is_rejected(bad_inputs, entry, bad, tier):
    result = bad_inputs[(entry.qualname, bad.name, tier)]
    assert result["error"] is not None, f"tier {tier} accepted the bad input"
    assert result["type"] == "OpBridgeError", result  # one error class in every tier
    if tier in bad.detail:
        assert bad.detail[tier] in result["error"], result["error"]


@pytest.mark.parametrize("entry,bad,tier", bad_input_params("bad_input_message"))
def test_bad_input_error_names_op_and_input(bad_inputs, entry, bad, tier):
    message = bad_inputs[(entry.qualname, bad.name, tier)]["error"] or ""
    assert entry.qualname in message, message
    assert re.search(rf"(?<!\w){re.escape(bad.input)}(?!\w)", message), (bad.input, message)
    missing = [fragment for fragment in bad.error if fragment not in message]
    assert not missing, (missing, message)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("entry", OPS, ids=[e.qualname for e in OPS])
def test_valid_controls_run_in_every_tier(bad_inputs, entry, tier):
    controls = {case: r for (op, case, t), r in bad_inputs.items()
                if op == entry.qualname and t == tier and case.startswith("valid:")}
    assert controls and all(r["error"] is None for r in controls.values()), controls


@pytest.fixture(scope="module")
def matrix():
    return {(d["tier"], d["case"]): d["error"] for d in script("bad_model_matrix.py")}


EXPECTED = {
    "wrong_dtype": "must be float32 (tensor(float)). Got float64",
    "wrong_index_dtype": "must be int32 (tensor(int32)). Got int64",
    "wrong_rank": "input 'feat' must have 5 dims",
    "missing_attribute": "lacks required attribute 'bev_feat_shape' (INTS)",
    "wrong_attribute_type": "has attribute 'bev_feat_shape' of type INT, the op declares INTS",
    "wrong_domain_version": "imported at domain version 2, but the registered op is version 1",
    "truncated_file": "is not a readable ONNX model (truncated or corrupt?)",
    "corrupt_file": "is not a readable ONNX model (truncated or corrupt?)",
}
OUT_OF_RANGE = {
    "function": "opbridge: bev::bev_pool_v2: input 'ranks_depth' values must lie in [0, ",
    "native": "bev::bev_pool_v2: input 'ranks_depth' has value 1000000 at position 0",
    "python": "opbridge: bev::bev_pool_v2: input 'ranks_depth' values must lie in [0, ",
}


@pytest.mark.parametrize("tier", TIERS)
def test_bad_input_matrix(matrix, tier):
    assert matrix[(tier, "valid")] is None
    for case, needle in EXPECTED.items():
        assert matrix[(tier, case)] is not None and needle in matrix[(tier, case)], (tier, case, matrix[(tier, case)])
    assert OUT_OF_RANGE[tier] in matrix[(tier, "index_out_of_range")]
    assert "'interval_lengths'" in matrix[(tier, "negative_length")]  # the op's check, in every tier


def test_missing_kernel_library(matrix):
    assert "no native kernel library at" in matrix[("native", "missing_kernel_library")]


@pytest.mark.long
@pytest.mark.parametrize("tier", TIERS)
def test_soak_rss_bounded(tier):
    (result,) = script("soak.py", tier, SOAK_RUNS)
    growth = result["rss_after"] - result["rss_before"]
    assert result["same_result"] and result["errors"] == SOAK_RUNS // 10, result
    assert growth < RSS_BOUND, f"RSS grew {growth / 2**20:.1f} MiB over {SOAK_RUNS} runs ({tier})"


@pytest.mark.long
@pytest.mark.parametrize("tier", TIERS)
def test_sessions_do_not_grow_rss(tier):
    """Opening sessions one after another, each dropped: RSS stays flat after a warm-up, in every tier
    (measured ~140 bytes a session in each; the python tier registered onnxruntime-extensions into
    fresh options per session, which keeps ~1.6 KB each until the process ends)."""
    (result,) = script("session_soak.py", tier, SESSIONS)
    growth = result["rss_after"] - result["rss_before"]
    assert growth < SESSION_STEP + SESSION_BOUND * SESSIONS, f"RSS grew {growth / SESSIONS:.0f} bytes a session over {SESSIONS} ({tier})"


@pytest.mark.parametrize("tier", ["function", "native"])
def test_eight_threads_share_a_session(tier):
    case = demo.build()
    path_proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    sess = bridge.session(path_proto, tier=tier)
    feeds = [bridge.parity.ort_feed(sess, a) for a in (case.args, *case.extra_args)]
    expected = [sess.run(None, f)[0] for f in feeds]
    failures, barrier = [], threading.Barrier(8)

    def worker(k):
        barrier.wait()
        for i in range(5):
            j = (k + i) % len(feeds)
            if not np.array_equal(sess.run(None, feeds[j])[0], expected[j]):
                failures.append((k, i))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["function", "native"])
def test_heavy_soak_100k_runs(tier):
    (result,) = script("soak.py", tier, 100_000)
    assert result["same_result"] and result["rss_after"] - result["rss_before"] < RSS_BOUND, result
