"""What bev_pool_v2's input-check guards cost in the function tier, at BEVDet-R50 size.

    python benchmarks/guard_cost.py [--repeats N]

1. the guards alone: a one-node model whose function body is ``Identity(ranks_depth)`` plus the
   op's guards (bridge.checks.guarded_body), against the same body without them;
2. the whole function tier: the exported file's guarded body against the unguarded one.
Both timed round-robin (medians), 2 intra-op threads, as benchmarks/bev_pool_v2.py does.
Measured on the shared 2-core dev box (load average ~5.5, 10 repeats): the guards alone (one
guard node for the 19 checks, issue #27) 0.71 ms at 248k points, 13.5k intervals, against a
~88-93 ms function tier there (under 1%; whole tier guarded 92.6 ms, unguarded 87.9 ms, within that
box's run-to-run noise). Before: 0.33 ms, the guards then a node pair per check.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bridge  # noqa: E402
import custom_ops  # noqa: E402,F401
from benchmarks import bev_pool_v2 as bench  # noqa: E402
from bridge.core.checks import guarded_body  # noqa: E402


def guards_alone(spec, inputs, shape, repeats: int) -> dict[str, float]:
    names = [p.name for p in spec.tensors]

    def model(guard: bool) -> bytes:
        body = helper.make_function("bev", "g", names, ["y"], [helper.make_node("Identity", ["ranks_depth"], ["y"])],
                                    [helper.make_opsetid("", 20)], attributes=["bev_feat_shape"])
        if guard:
            body = guarded_body(body, spec.checks, {"bev_feat_shape": onnx.AttributeProto.INTS})
        node = helper.make_node("g", names, ["y"], domain="bev", bev_feat_shape=shape)
        types = [TensorProto.FLOAT] * 2 + [TensorProto.INT32] * 5
        inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)]
        graph = helper.make_graph([node], "m", inputs, [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("bev", 1)],
                                 functions=[body]).SerializeToString()

    feed = dict(zip(names, [t.numpy() for t in inputs]))
    guarded = ort.InferenceSession(model(True), bench.session_options(2))
    plain = ort.InferenceSession(model(False), bench.session_options(2))
    return bench.round_robin({"guards alone": lambda: guarded.run(None, feed),
                              "no guards": lambda: plain.run(None, feed)}, repeats)


def whole_tier(spec, inputs, shape, repeats: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.onnx")
        bridge.export(bench.Pool(shape), inputs, path)
        proto = onnx.load(path)
    raw = onnx.ModelProto()
    raw.CopyFrom(proto)
    for i, f in enumerate(raw.functions):
        if (f.domain, f.name) == (spec.domain, spec.name):
            raw.functions[i].CopyFrom(spec.function.to_function_proto())  # the unguarded body
    guarded = bridge.session(proto, tier="function", sess_options=bench.session_options(2))
    plain = bridge.session(raw, tier="function", sess_options=bench.session_options(2))
    feed = bridge.parity.ort_feed(guarded, inputs)
    assert np.array_equal(guarded.run(None, feed)[0], plain.run(None, feed)[0])
    return bench.round_robin({"function tier, guarded": lambda: guarded.run(None, feed),
                              "function tier, no guards": lambda: plain.run(None, feed)}, repeats)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    spec = bridge.REGISTRY.get("bev::bev_pool_v2")
    inputs, shape = bench.bevdet_inputs()
    times = {**guards_alone(spec, inputs, shape, args.repeats * 10), **whole_tier(spec, inputs, shape, args.repeats)}
    for name, ms in times.items():
        print(f"{name:28s} {ms:9.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
