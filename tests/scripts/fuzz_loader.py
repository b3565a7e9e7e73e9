"""Fuzz target: damaged ONNX files and hostile attributes into bridge.session (every tier) and run().

Run in a subprocess by tests/test_hostile.py, so a crash (segfault, abort) fails that test. Every
example must end in success or an OpBridgeError; anything else is printed and exits 1.
    python tests/scripts/fuzz_loader.py EXAMPLES
"""

import sys

import numpy as np
import onnx
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
import custom_ops  # noqa: F401
from bridge.core.basics.errors import OpBridgeError

EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 50


class Pool(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.crop(torch.ops.opbridge.identity_conv(x, 2), [0, 0, 2, 3])


SEED = bridge.export(Pool(), (torch.randn(1, 2, 4, 4),))
BYTES = SEED.SerializeToString()
FEED = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
counts = {"ok": 0, "refused": 0}


def attempt(model, tier):
    try:
        sess = bridge.session(model, tier=tier)
        sess.run(None, {sess.get_inputs()[0].name: FEED})
        counts["ok"] += 1
    except OpBridgeError:
        counts["refused"] += 1
    except Exception as e:  # onnxruntime's own errors from run() are fine too, as long as nothing crashes
        if type(e).__module__.startswith("onnxruntime"):
            counts["refused"] += 1
        else:
            raise


@st.composite
def damaged(draw):
    data = bytearray(BYTES)
    kind = draw(st.sampled_from(["flip", "truncate", "attribute", "shape"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "truncate":
        return bytes(data[:draw(st.integers(0, len(data) - 1))])
    model = onnx.ModelProto()
    model.CopyFrom(SEED)
    node = next(n for n in model.graph.node if n.op_type == "crop")
    if kind == "attribute":
        value = draw(st.one_of(st.lists(st.integers(-2**40, 2**40), min_size=1, max_size=6), st.integers(-2**40, 2**40),
                               st.floats(allow_nan=True), st.text(max_size=5)))
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("box", value))
    else:
        dims = draw(st.lists(st.integers(0, 5), min_size=0, max_size=5))
        model.graph.input[0].type.tensor_type.shape.Clear()
        for d in dims:
            model.graph.input[0].type.tensor_type.shape.dim.add().dim_value = d
    return model.SerializeToString()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(damaged(), st.sampled_from(bridge.TIERS))
def fuzz(data, tier):
    attempt(data, tier)


if __name__ == "__main__":
    fuzz()
    print(f"fuzz_loader: {EXAMPLES} examples, {counts['ok']} ran, {counts['refused']} refused cleanly, 0 crashes")
