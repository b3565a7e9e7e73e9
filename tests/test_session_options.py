"""SessionOptions a caller passes: reusable for more sessions, never kept by opbridge, never given
a library twice. (Reuse across the three tiers, python included, runs in the python tier's
subprocess: tests/test_python_tier.py::test_one_session_options_serves_every_tier_in_turn.)"""

import gc
import os
import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from models import pool_case
from onnx import TensorProto, helper

import bridge
from ort_kernels.base import libraries


class Identity(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 2)


@pytest.fixture(scope="module")
def proto():
    return bridge.export(Identity(), (torch.ones(1, 2, 3, 3),))


def test_sessions_keep_no_options_alive(proto):
    """1,000 native sessions, each on its own options: once the sessions are gone, so are the options
    (they were kept for ever, one per session)."""
    n = int(os.environ.get("OPBRIDGE_SESSIONS", "1000"))
    refs = []
    for _ in range(n):
        options = ort.SessionOptions()
        refs.append(weakref.ref(options))
        sess = bridge.session(proto, tier="native", sess_options=options)
        del sess, options
    gc.collect()
    assert sum(r() is not None for r in refs) == 0


def test_options_reused_in_one_tier_get_the_library_once(proto):
    options = ort.SessionOptions()
    x = np.full((1, 2, 3, 3), 5, np.float32)
    for _ in range(3):
        sess = bridge.session(proto, tier="native", sess_options=options)
        assert float(sess.run(None, {"x": x})[0].max()) == 5.0
    assert len(libraries(options)) == 1  # recorded in the options themselves, registered once


def test_options_stay_usable_for_plain_onnxruntime(proto, tmp_path):
    """After opbridge sessions on them, the caller's options still open a plain model."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    bridge.session(proto, tier="native", sess_options=options)
    bridge.session(proto, tier="function", sess_options=options)
    graph = onnx_relu()
    sess = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.array([-1.0, 2.0], np.float32)})[0].tolist() == [0.0, 2.0]
    assert options.intra_op_num_threads == 1


def test_function_tier_on_options_with_a_library_runs_the_body():
    """A kernel of a library in the options would win over the model-local body; the function tier
    moves its nodes to private domains then, so the body runs: a bad input gets the body's guard
    message (the eager one), not the C++ kernel's."""
    pool, args = pool_case()
    model = bridge.export(pool, args)
    options = ort.SessionOptions()
    native = bridge.session(model, tier="native", sess_options=options)
    assert libraries(options)
    feed = bridge.parity.ort_feed(native, args)
    bad = dict(feed, ranks_depth=np.full_like(feed["ranks_depth"], 10**6))
    with pytest.raises(Exception, match=r"has value 1000000 at position 0, outside \[0, 120\)"):
        native.run(None, bad)
    sess = bridge.session(model, tier="function", sess_options=options)
    expected = pool(*args).numpy()
    np.testing.assert_allclose(sess.run(None, feed)[0], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(bridge.OpBridgeError, match=r"input 'ranks_depth' values must lie in \[0, 120\)"):
        sess.run(None, bad)
    assert type(sess) is type(native) is type(bridge.session(model, tier="function"))  # one session class


def onnx_relu() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
