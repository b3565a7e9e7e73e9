"""Hypothesis fuzzing of the native bev_pool_v2 kernel with arbitrary (often invalid) index inputs.

Every example must either match the eager op (valid inputs) or raise an error from ONNX Runtime
(invalid inputs, with the op name in the message). Run in a subprocess: a crash is a failure.
Usage: fuzz_native.py N_EXAMPLES
"""

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: models

from models import pool_case, pool_dynamic_shapes  # noqa: E402

import bridge  # noqa: E402

B, Z, Y, X, C = 1, 2, 4, 5, 6
stats = {"ok": 0, "rejected": 0}


def build_session(tmp):
    pool, args = pool_case(grid=(X, Y, Z), c=C)
    assert pool.bev_feat_shape == [B, Z, Y, X, C]
    path = os.path.join(tmp, "pool.onnx")
    bridge.export(pool, args, path, dynamic_shapes=pool_dynamic_shapes(), functions=False)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the rejections are expected; keep stderr readable
    return bridge.session(path, tier="native", sess_options=options), pool, args


def index_arrays(limit_hint):
    return st.lists(st.integers(-3, limit_hint + 3), min_size=0, max_size=40)


def main(n_examples):
    with tempfile.TemporaryDirectory() as tmp:
        sess, pool, args = build_session(tmp)
        depth, feat = args[0].numpy(), args[1].numpy()
        names = [i.name for i in sess.get_inputs()]

        @settings(max_examples=n_examples, deadline=None, derandomize=True)
        @given(st.data())
        def check(data):
            n = data.draw(st.integers(0, 30))
            rd = data.draw(st.lists(st.integers(-2, depth.size + 2), min_size=n, max_size=n))
            rf = data.draw(st.lists(st.integers(-2, feat.size // C + 2), min_size=n, max_size=n))
            rb = data.draw(st.lists(st.integers(-2, B * Z * Y * X + 2), min_size=n, max_size=n))
            k = data.draw(st.integers(0, 8))
            starts = data.draw(st.lists(st.integers(-2, n + 2), min_size=k, max_size=k))
            lengths = data.draw(st.lists(st.integers(-2, n + 2), min_size=k, max_size=k))
            if data.draw(st.booleans()):  # half the examples: indices made valid, intervals a partition
                rd = [v % depth.size for v in rd]
                rf = [v % (feat.size // C) for v in rf]
                rb = [v % (B * Z * Y * X) for v in rb]
                cuts = sorted(set(data.draw(st.lists(st.integers(0, n), max_size=6))) | {0, n})
                starts = cuts[:-1] + data.draw(st.lists(st.just(n), max_size=2))  # trailing empty intervals
                lengths = [b - a for a, b in zip(cuts[:-1], cuts[1:])] + [0] * (len(starts) - len(cuts) + 1)
            elif data.draw(st.booleans()):  # mismatch the lengths of paired arrays
                rb = rb[: max(0, len(rb) - 1)]
            arrays = [depth, feat] + [np.asarray(v, np.int32).reshape(-1) for v in (rd, rf, rb, starts, lengths)]
            tensors = [torch.from_numpy(a) for a in arrays]
            try:
                expected = pool(*tensors)
            except ValueError:
                expected = None
            try:
                got = sess.run(None, dict(zip(names, arrays)))[0]
            except Exception as e:
                assert expected is None, f"native rejected valid input: {e}"
                assert "bev::bev_pool_v2" in str(e), str(e)
                stats["rejected"] += 1
                return
            assert expected is not None, "native accepted input that eager rejects"
            np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)
            stats["ok"] += 1

        check()
    print(f"fuzz: {stats['ok']} valid examples matched, {stats['rejected']} invalid examples rejected")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
