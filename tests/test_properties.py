"""Hypothesis property tests: every op, every tier, against the op's independent reference.

Random shapes, empty inputs, zero points, duplicate cells, extreme values and NaN/Inf. Models
are single custom nodes built with onnx.helper (no torch.export per example), sessions cached
per (op, attributes, dtypes, tier). Example counts: OPBRIDGE_EXAMPLES (default 12 per test;
`pytest --heavy` raises it to 200).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import bridge
from bridge.dtypes import TORCH_TO_ONNX
from custom_ops.bev_pool_v2 import voxel_pooling_prepare

EXAMPLES = int(os.environ.get("OPBRIDGE_EXAMPLES", "12"))
TIERS = ("function", "native", "python")
FLOATS = (torch.float32, torch.float64, torch.float16)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@functools.lru_cache(maxsize=None)
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


def check_op(qualname: str, tier: str, args: tuple, rtol=None, atol=None):
    """Run the op in ``tier`` on ``args`` and compare with the reference (NaN matches NaN)."""
    spec = bridge.REGISTRY.get(qualname)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if tier == "python" and any(t.dtype not in (torch.float32, torch.int32, torch.int64) for t in tensors):
        return  # the python tier runs float32 only: its guard has its own tests
    attrs = tuple((p.name, p.to_onnx_value(a)) for p, a in zip(spec.params, args) if not p.is_tensor)
    attrs = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs)
    sess = _session(qualname, attrs, tuple(TORCH_TO_ONNX[t.dtype] for t in tensors), tier)
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensors)})
    expected = spec.reference(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for e, g in zip(expected, got):
        row = bridge.compare("out", e, g, rtol=rtol, atol=atol)
        assert row.passed, (tier, row)


def values(dtype, shape, draw, extreme=True):
    """A tensor of normal values, sometimes with NaN/Inf/huge entries sprinkled in."""
    n = int(np.prod(shape))
    base = torch.from_numpy(np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(n))
    if extreme and n and draw(st.booleans()):
        special = draw(st.lists(st.sampled_from([np.nan, np.inf, -np.inf, 6e4, -6e4, 0.0]), min_size=1, max_size=3))
        idx = draw(st.lists(st.integers(0, n - 1), min_size=len(special), max_size=len(special)))
        base[idx] = torch.tensor(special, dtype=torch.float64)
    return base.reshape(shape).to(dtype)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_identity_conv(tier, dtype):
    @SETTINGS
    @given(st.data())
    def prop(data):
        shape = data.draw(st.lists(st.integers(0, 4), min_size=2, max_size=4))
        x = values(dtype, shape, data.draw)
        check_op("opbridge::identity_conv", tier, (x, shape[1]))

    prop()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_crop(tier, dtype):
    @SETTINGS
    @given(st.data())
    def prop(data):
        lead = data.draw(st.lists(st.integers(0, 3), min_size=0, max_size=2))
        h, w = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6))
        img = values(dtype, (*lead, h, w), data.draw)
        left, top = data.draw(st.integers(-4, 8)), data.draw(st.integers(-4, 8))
        box = [left, top, left + data.draw(st.integers(0, 6)), top + data.draw(st.integers(0, 6))]
        check_op("opbridge::crop", tier, (img, box))

    prop()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_paste(tier, dtype):
    @SETTINGS
    @given(st.data())
    def prop(data):
        lead = data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
        image = values(dtype, (*lead, data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6))), data.draw)
        patch = values(dtype, (*lead, data.draw(st.integers(0, 5)), data.draw(st.integers(0, 5))), data.draw)
        check_op("opbridge::paste", tier, (image, patch, data.draw(st.integers(-6, 8)), data.draw(st.integers(-6, 8))))

    prop()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_numpy_sin(tier, dtype):
    @SETTINGS
    @given(st.data())
    def prop(data):
        shape = data.draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
        x = values(dtype, shape, data.draw)
        check_op("opbridge::numpy_sin", tier, (x, torch.zeros_like(x)), rtol=1e-6 if dtype == torch.float32 else None)

    prop()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_bev_pool_v2(tier, dtype):
    @SETTINGS
    @given(st.data())
    def prop(data):
        b, n, d, h, w, c = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 4)),
                            data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5)))
        grid = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 2)))
        rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
        # spread 0..3x the grid: from every point kept (many duplicate cells) to zero points kept
        spread = data.draw(st.sampled_from([0.5, 1.0, 3.0, 100.0]))
        coords = torch.from_numpy(np.floor(rng.random((b, n, d, h, w, 3)) * np.array(grid) * spread)).long()
        ranks = voxel_pooling_prepare(coords, grid)
        depth = values(dtype, (b, n, d, h, w), data.draw, extreme=False).abs()
        feat = values(dtype, (b, n, h, w, c), data.draw)
        shape = [b, grid[2], grid[1], grid[0], c]
        # float16 sums in float32 in every tier, but the per-tier summation order differs
        tol = {"rtol": 2e-3, "atol": 2e-3} if dtype == torch.float16 else {"rtol": 1e-4} \
            if dtype == torch.float32 else {}
        check_op("bev::bev_pool_v2", tier, (depth, feat, *ranks, shape), **tol)

    prop()
