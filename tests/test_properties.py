"""Hypothesis property tests (generated from tests/op_db.py): every op x tier x dtype against the
op's independent reference, on inputs the table's strategies draw (random shapes, empty tensors,
zero points, duplicate cells, huge values, NaN/Inf), plus each entry's fixed examples.

Models are single custom nodes built with onnx.helper (no torch.export per example), sessions
cached per (op, attributes, dtypes, tier). Example counts: OPBRIDGE_EXAMPLES (default 12 per
test; `pytest --heavy` raises it to 200).
"""

from __future__ import annotations

import functools
import os

import onnxruntime as ort
import pytest
import torch
from hypothesis import example, given, settings
from onnx import helper
from op_db import property_params

import bridge

EXAMPLES = int(os.environ.get("OPBRIDGE_EXAMPLES", "12"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True)


@functools.cache
def _session(qualname: str, attrs: tuple, types: tuple, tier: str):
    spec = bridge.REGISTRY.functional(bridge.REGISTRY.get(qualname))
    names = [p.name for p in spec.tensors]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)]
    outputs = [helper.make_empty_tensor_value_info(f"y{i}") for i in range(spec.num_outputs)]
    node = helper.make_node(spec.name, names, [o.name for o in outputs], domain=spec.domain, **dict(attrs))
    model = helper.make_model(helper.make_graph([node], "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(spec.domain, 1)])
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return bridge.session(model, tier=tier, sess_options=options if tier != "python" else None)


def _freeze(value):
    return tuple(value) if isinstance(value, list) else value


def check_op(entry, tier: str, dtype, args: tuple) -> None:
    """Run the op in ``tier`` on ``args`` and compare with the reference (NaN matches NaN)."""
    spec = entry.spec
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    attrs = tuple((p.name, _freeze(p.to_onnx_value(a))) for p, a in zip(spec.params, args) if not p.is_tensor)
    types = tuple(helper.np_dtype_to_tensor_dtype(t.numpy().dtype) for t in tensors)
    sess = _session(spec.qualname, attrs, types, tier)
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensors)})
    expected = spec.reference(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected)
    rtol, atol = entry.tolerance(dtype, tier, "property")
    for e, g in zip(expected, got):
        row = bridge.compare("out", e, g, rtol=rtol, atol=atol)
        assert row.passed, (tier, row)


@pytest.mark.parametrize("entry,tier,dtype", property_params())
def test_property(entry, tier, dtype):
    # the op's first sample first: a tier that cannot run this dtype says so before hypothesis starts
    check_op(entry, tier, dtype, entry.samples(dtype)[0].args)

    @SETTINGS
    @given(entry.strategy(dtype))
    def prop(args):
        check_op(entry, tier, dtype, args)

    for make in entry.examples:
        prop = example(entry.args(make(dtype)))(prop)
    prop()

