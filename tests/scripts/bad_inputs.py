"""Feed bad inputs to the native kernels; print one JSON line per case with the error (or null).

Models are single custom nodes with fully symbolic shapes, so nothing but the kernel's own
checks stands between the bad input and memory. Run in a subprocess by tests/test_native.py:
a crash (abort, segfault) kills only this process, and the test sees it as a failure.
"""

import json
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import bridge
import custom_ops  # noqa: F401
from custom_ops.bev_pool_v2 import random_case

F, I = TensorProto.FLOAT, TensorProto.INT32


def single_node(domain, op_type, inputs, attrs):
    """A model of one custom node; every input dim symbolic."""
    node = helper.make_node(op_type, [n for n, _, _ in inputs], ["y"], domain=domain, **attrs)
    vis = [helper.make_tensor_value_info(n, t, [f"{n}_{i}" for i in range(rank)]) for n, t, rank in inputs]
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(domain, 1)])
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return bridge.session(model, tier="native", sess_options=options)


def run(sess, arrays):
    try:
        sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})
        return None
    except Exception as e:  # ORT turns the kernel's status into an exception
        return str(e)


def main():
    results = {}
    names = ["depth", "feat", "ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths"]
    bev = single_node("bev", "bev_pool_v2", [(n, F if i < 2 else I, 5 if i < 2 else 1) for i, n in enumerate(names)],
                      {"bev_feat_shape": [1, 2, 4, 5, 6]})
    base = [t.numpy() for t in random_case()[:7]]

    def bev_case(name, index, change):
        arrays = [a.copy() for a in base]
        arrays[index] = change(arrays[index])
        results[name] = run(bev, arrays)

    bev_case("valid", 0, lambda a: a)
    bev_case("ranks_depth_high", 2, lambda a: np.where(np.arange(a.size) == 3, 10**6, a).astype(np.int32))
    bev_case("ranks_depth_negative", 2, lambda a: np.where(np.arange(a.size) == 0, -1, a).astype(np.int32))
    bev_case("ranks_feat_high", 3, lambda a: np.full_like(a, 10**6))
    bev_case("ranks_bev_high", 4, lambda a: np.full_like(a, 10**6))
    bev_case("length_negative", 6, lambda a: np.where(np.arange(a.size) == 1, -5, a).astype(np.int32))
    bev_case("interval_past_end", 5, lambda a: a + 10**5)
    bev_case("interval_start_negative", 5, lambda a: a - 10**5)
    bev_case("short_ranks_feat", 3, lambda a: a[:-1])
    bev_case("short_lengths", 6, lambda a: a[:-1])
    bev_case("feat_wrong_channels", 1, lambda a: np.zeros(a.shape[:4] + (7,), np.float32))
    bev_case("depth_empty", 0, lambda a: np.zeros((0,) + a.shape[1:], np.float32))
    results["bev_bad_attribute"] = None
    try:
        single_node("bev", "bev_pool_v2", [(n, F if i < 2 else I, 5 if i < 2 else 1) for i, n in enumerate(names)],
                    {"bev_feat_shape": [1, 2, 3]})
    except Exception as e:
        results["bev_bad_attribute"] = str(e)

    ident = single_node("opbridge", "identity_conv", [("x", F, 4)], {"channels": 3})
    results["identity_valid"] = run(ident, [np.zeros((1, 3, 2, 2), np.float32)])
    results["identity_wrong_channels"] = run(ident, [np.zeros((1, 4, 2, 2), np.float32)])
    paste = single_node("opbridge", "paste", [("image", F, 3), ("patch", F, 3)], {"left": 1, "top": -1})
    results["paste_valid"] = run(paste, [np.zeros((2, 5, 5), np.float32), np.ones((2, 9, 9), np.float32)])
    results["paste_leading_dims"] = run(paste, [np.zeros((2, 5, 5), np.float32), np.zeros((3, 2, 2), np.float32)])
    crop = single_node("opbridge", "crop", [("img", F, 3)], {"box": [-3, -3, 9, 2]})
    results["crop_valid"] = run(crop, [np.ones((2, 4, 4), np.float32)])
    results["crop_empty_image"] = run(crop, [np.ones((2, 0, 0), np.float32)])
    try:
        single_node("opbridge", "crop", [("img", F, 3)], {"box": [3, 0, 1, 1]})
        results["crop_bad_box"] = None
    except Exception as e:
        results["crop_bad_box"] = str(e)
    for name, message in results.items():
        print(json.dumps({"case": name, "error": message}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
