"""Bad models and inputs x kernel tiers; one JSON line per (tier, case): the error or null.

Run in a subprocess by tests/test_reliability.py, so a crash is a test failure, not a dead runner.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: models, op_db

from models import pool_case, pool_dynamic_shapes  # noqa: E402
from op_db import TIERS  # noqa: E402

import bridge  # noqa: E402


def attempt(fn):
    try:
        fn()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def main():
    pool, args = pool_case()
    good = bridge.export(pool, args, dynamic_shapes=pool_dynamic_shapes())
    feed_arrays = [a.numpy() for a in args]
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 4

    def variant(edit):
        model = onnx.ModelProto()
        model.CopyFrom(good)
        edit(model)
        return model

    def bump_version(m):
        for o in m.opset_import:
            if o.domain == "bev":
                o.version = 2

    def drop_attr(m):
        node = next(n for n in m.graph.node if n.op_type == "bev_pool_v2")
        del node.attribute[:]

    def wrong_attr_type(m):
        node = next(n for n in m.graph.node if n.op_type == "bev_pool_v2")
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("bev_feat_shape", 3))

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        good_path = os.path.join(tmp, "good.onnx")
        onnx.save(good, good_path)
        data = open(good_path, "rb").read()
        truncated = os.path.join(tmp, "truncated.onnx")
        open(truncated, "wb").write(data[: len(data) // 2])
        corrupt = os.path.join(tmp, "corrupt.onnx")
        open(corrupt, "wb").write(bytes(b ^ 0x5A for b in data[:200]) + data[200:])
        for tier in TIERS:
            def run(arrays, model=good_path, tier=tier):
                sess = bridge.session(model, tier=tier, sess_options=quiet if tier != "python" else None)
                return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})

            def with_input(index, value):
                arrays = list(feed_arrays)
                arrays[index] = value
                return lambda: run(arrays)

            cases = {
                "valid": lambda: run(feed_arrays),
                "wrong_dtype": with_input(0, feed_arrays[0].astype(np.float64)),
                "wrong_index_dtype": with_input(2, feed_arrays[2].astype(np.int64)),
                "wrong_rank": with_input(1, feed_arrays[1].reshape(-1)),
                "index_out_of_range": with_input(2, np.full_like(feed_arrays[2], 10**6)),
                "negative_length": with_input(6, np.full_like(feed_arrays[6], -1)),
                "missing_attribute": lambda tier=tier: bridge.session(variant(drop_attr), tier=tier),
                "wrong_attribute_type": lambda tier=tier: bridge.session(variant(wrong_attr_type), tier=tier),
                "wrong_domain_version": lambda tier=tier: bridge.session(variant(bump_version), tier=tier),
                "truncated_file": lambda tier=tier: bridge.session(truncated, tier=tier),
                "corrupt_file": lambda tier=tier: bridge.session(corrupt, tier=tier),
            }
            if tier == "native":
                cases["missing_kernel_library"] = lambda: bridge.session(
                    good_path, tier="native", native_library=os.path.join(tmp, "nope.so"))
            for name, fn in cases.items():
                results.append({"tier": tier, "case": name, "error": attempt(fn)})
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
