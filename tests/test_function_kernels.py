"""The native-tier cases of tests/test_functions.py ran what their tier says (issue #46): each node
whose op has a C++ kernel (``native=``) ran that kernel from the native library, named in
``report.kernels``, not its function body; an op whose ``symbolic`` writes standard ONNX ops only
(QAT fake-quant) leaves no custom node, so the native tier has no kernel to run for it, and says so."""

from pathlib import Path

import pytest
import torch
from test_functions import (
    BEV_DYNAMIC,
    FEAT,
    BevModel,
    FakeQuantize,
    K,
    QuantModel,
    RoIAlignFunction,
    RoIModel,
    ScaledShift,
    ScaleFn,
    ShiftModel,
    _register_bev,
    bev_frame,
    quant_fake,
    roi_fake,
    roi_samples,
    rois,
)

import bridge
from bridge.core.basics.graphs import custom_nodes

USER_OPS = Path(__file__).resolve().parent / "user_ops"


def _bev(reg):
    _register_bev(reg, inner=True)
    return BevModel(), bev_frame(0), BEV_DYNAMIC, {"mmdeploy::bev_pool_v2"}


def _roi(reg):
    bridge.register(RoIAlignFunction, fake=roi_fake, native="user_ops/roi_align.cc", sample_inputs=roi_samples,
                    registry=reg)
    return RoIModel(), (FEAT, rois(5, 0)), (None, {0: K}), {"mmcv::MMCVRoiAlign"}


def _shift(reg):
    bridge.register(ScaledShift, name="mine::scaled_shift", native="user_ops/scaled_shift.cc", registry=reg,
                    sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(4, 3, dtype=dtype),
                                                                     torch.randn(3, dtype=dtype), 0.5, (1,), True))])
    return ShiftModel(), (torch.randn(4, 3), torch.randn(3)), ({0: torch.export.Dim("n")}, None), {"mine::scaled_shift"}


def _scale(reg):
    bridge.register(ScaleFn, native="user_ops/fn_scale.cc", registry=reg,
                    sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(3, 2).to(dtype), 1.5))])

    class M(torch.nn.Module):
        def forward(self, x):
            return ScaleFn.apply(x, 1.5) + ScaleFn.apply(x, -3.0)

    return M(), (torch.randn(4, 3),), ({0: torch.export.Dim("n")},), {"fndemo::Scale"}


@pytest.mark.parametrize("case", [_bev, _roi, _shift, _scale], ids=["bevdet", "roi_align", "scaled_shift", "scale"])
def test_native_tier_runs_the_cpp_kernel_of_each_function_node(case):
    reg = bridge.Registry()
    model, args, dynamic, ops = case(reg)
    proto = bridge.export(model, args, registry=reg, dynamic_shapes=dynamic)
    assert {f"{n.domain}::{n.op_type}" for n in custom_nodes(proto)} == ops
    report = bridge.check_parity(model, args, registry=reg, tier="native", dynamic_shapes=dynamic)
    assert report.passed, report
    assert set(report.kernels) == ops, report.kernels
    for op, where in report.kernels.items():  # a library file, not "function body"
        assert where.endswith(".so") and Path(where).is_file(), (op, where)


def test_fake_quant_has_no_node_for_the_native_tier():
    """FakeQuantize's symbolic writes QuantizeLinear/DequantizeLinear inside its node's body: the
    native tier has no kernel for it, its node runs the body (named so in report.kernels)."""
    reg = bridge.Registry()
    bridge.register(FakeQuantize, name="qat::FakeQuantize", fake=quant_fake, registry=reg)
    model, x = QuantModel(), torch.randn(3, 7)
    report = bridge.check_parity(model, (x,), registry=reg, tier="native")
    assert report.passed, report
    assert report.kernels == {"qat::FakeQuantize": "function body"}, report.kernels
    assert reg.get("qat::FakeQuantize").native_source is None and not (USER_OPS / "qat_op_FakeQuantize.cc").exists()
