"""torch.autograd.Function classes bridged with bridge.register(Cls), as deployment repos write them
(bridge/core/functions.py): BEVDet's TRTBEVPoolv2 calling QuickCumsumCuda (nested), an mmcv-style RoIAlign
whose symbolic splits a tuple argument into two attributes, a QAT fake-quant whose symbolic writes standard
ops, and a Function without symbolic. Each runs in the python, function and native tiers with dynamic sizes;
eager outputs and gradients are the same with and without the registration."""

import importlib
import io
import json
import textwrap
import warnings
from pathlib import Path

import forkserver
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
from bridge.core.functions import classes_made
from bridge.tools.cli import main
from custom_ops.bev_pool_v2 import random_case

TESTS = Path(__file__).resolve().parent
P, N_INT, K = torch.export.Dim("points"), torch.export.Dim("intervals"), torch.export.Dim("rois")


# -- BEVDet (mmdet3d/ops/bev_pool_v2/bev_pool.py), its CUDA extension stood in by plain torch --------------
class _Ext:
    """Stands in for BEVDet's compiled ``bev_pool_v2_ext``: writes the pooled features into ``out``."""

    @staticmethod
    def bev_pool_v2_forward(depth, feat, out, ranks_depth, ranks_feat, ranks_bev, interval_lengths, interval_starts):
        c = feat.shape[-1]
        values = feat.reshape(-1, c)[ranks_feat.long()] * depth.reshape(-1)[ranks_depth.long()].unsqueeze(-1)
        out.view(-1, c).index_add_(0, ranks_bev.long(), values)


class QuickCumsumCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts,
                interval_lengths):
        ranks_bev = ranks_bev.int()
        depth = depth.contiguous().float()
        feat = feat.contiguous().float()
        out = feat.new_zeros(bev_feat_shape)
        _Ext.bev_pool_v2_forward(depth, feat, out, ranks_depth, ranks_feat, ranks_bev, interval_lengths,
                                 interval_starts)
        ctx.save_for_backward(ranks_bev, depth, feat, ranks_feat, ranks_depth)
        return out

    @staticmethod
    def backward(ctx, out_grad):
        ranks_bev, depth, feat, ranks_feat, ranks_depth = ctx.saved_tensors
        c = feat.shape[-1]
        g = out_grad.reshape(-1, c)[ranks_bev.long()]
        f = feat.reshape(-1, c)[ranks_feat.long()]
        d = depth.reshape(-1)[ranks_depth.long()]
        depth_grad = torch.zeros_like(depth).reshape(-1).index_add(0, ranks_depth.long(), (g * f).sum(-1))
        feat_grad = torch.zeros_like(feat).reshape(-1, c).index_add(0, ranks_feat.long(), g * d.unsqueeze(-1))
        return depth_grad.reshape(depth.shape), feat_grad.reshape(feat.shape), None, None, None, None, None, None


def bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts, interval_lengths):
    x = QuickCumsumCuda.apply(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts,
                              interval_lengths)
    return x.permute(0, 4, 1, 2, 3).contiguous()


class TRTBEVPoolv2(torch.autograd.Function):
    @staticmethod
    def symbolic(g, depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths,
                 out_height=128, out_width=128):
        return g.op("mmdeploy::bev_pool_v2", depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts,
                    interval_lengths, out_height_i=out_height, out_width_i=out_width)

    @staticmethod
    def forward(g, depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths,
                out_height=128, out_width=128):
        feat = feat.unsqueeze(0)
        depth = depth.unsqueeze(0)
        bev_feat_shape = (depth.shape[0], 1, out_height, out_width, feat.shape[-1])
        bev_feat = bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts,
                               interval_lengths)
        return bev_feat.squeeze(2).permute(0, 2, 3, 1)


OUT_H, OUT_W = 4, 5


class BevModel(torch.nn.Module):
    def forward(self, depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths):
        bev = TRTBEVPoolv2.apply(depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths,
                                 OUT_H, OUT_W)
        return bev * 2


def bev_frame(seed: int, keep: float = 0.8):
    depth, feat, rd, rf, rb, _, starts, lengths = random_case(grid=(OUT_W, OUT_H, 1), keep=keep, seed=seed)
    return (depth[0], feat[0], rd, rf, rb, starts, lengths)


BEV_DYNAMIC = (None, None, {0: P}, {0: P}, {0: P}, {0: N_INT}, {0: N_INT})


def quick_cumsum_samples(dtype):
    depth, feat, rd, rf, rb, shape, starts, lengths = random_case(grid=(OUT_W, OUT_H, 1), dtype=dtype)
    return [bridge.SampleInput((depth, feat, rd, rf, rb, tuple(shape[i] for i in (0, 1, 2, 3, 4)), starts, lengths))]


def bev_pool_samples(dtype):
    depth, feat, *ranks = bev_frame(0)
    return [bridge.SampleInput((depth.to(dtype), feat.to(dtype), *ranks, OUT_H, OUT_W))]


# NOTE: one C++ file holds the kernels of both nodes (mmdeploy::bev_pool_v2, bevdet::QuickCumsum): one algorithm
BEV_KERNELS = "user_ops/bevdet_pool.cc"


# -- mmcv-style RoIAlign (mmcv/ops/roi_align.py), its extension stood in by plain torch ---------------------
def _bilinear_weights(v, size, offsets, bin_size):
    """[K, A, size] weights of torchvision's/mmcv's roi_align bilinear interpolation along one axis, at the
    sample points ``v[:, None] + offsets * bin_size[:, None]`` (0 outside [-1, size])."""
    v = v[:, None] + offsets * bin_size[:, None]
    inside = (v >= -1) & (v <= size)
    v = v.clamp(min=0)
    low = v.floor()
    top = low >= size - 1
    low = torch.where(top, float(size - 1), low)
    v = torch.where(top, low, v)
    frac = (v - low) * inside
    cells = torch.arange(size, dtype=v.dtype, device=v.device)
    high = torch.where(top, low, low + 1)
    return ((cells == low[..., None]) * ((1 - frac) * inside)[..., None]
            + (cells == high[..., None]) * frac[..., None])


def roi_align_torch(input, rois, out_h, out_w, spatial_scale, sampling_ratio, aligned):
    """Stands in for mmcv's compiled roi_align_forward in mode "avg" with sampling_ratio > 0: each bin is the
    mean of sampling_ratio x sampling_ratio bilinear samples (tests/user_ops/roi_align.cc, the native kernel,
    is mmcv's and torchvision's CPU loop); vectorized, so its ONNX body is derived."""
    offset = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (rois[:, i] * spatial_scale - offset for i in range(1, 5))
    roi_w, roi_h = x2 - x1, y2 - y1
    if not aligned:
        roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
    grid = (torch.arange(sampling_ratio, dtype=input.dtype, device=input.device) + 0.5) / sampling_ratio
    rows = (torch.arange(out_h, dtype=input.dtype, device=input.device)[:, None] + grid).reshape(-1)
    cols = (torch.arange(out_w, dtype=input.dtype, device=input.device)[:, None] + grid).reshape(-1)
    wy = _bilinear_weights(y1, input.shape[2], rows, roi_h / out_h)  # [K, out_h * S, H]
    wx = _bilinear_weights(x1, input.shape[3], cols, roi_w / out_w)  # [K, out_w * S, W]
    samples = torch.einsum("kah,kchw,kbw->kcab", wy, input[rois[:, 0].long()], wx)
    k, c = samples.shape[:2]
    return samples.reshape(k, c, out_h, sampling_ratio, out_w, sampling_ratio).mean((3, 5))


class RoIAlignFunction(torch.autograd.Function):
    @staticmethod
    def symbolic(g, input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned):
        return g.op("mmcv::MMCVRoiAlign", input, rois, output_height_i=output_size[0], output_width_i=output_size[1],
                    spatial_scale_f=spatial_scale, sampling_ratio_i=sampling_ratio, mode_s=pool_mode,
                    aligned_i=aligned)

    @staticmethod
    def forward(ctx, input, rois, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True):
        assert pool_mode == "avg" and sampling_ratio > 0, "the stand-in computes avg pooling with fixed sampling"
        ctx.save_for_backward(rois)
        ctx.shape = input.shape
        ctx.args = (output_size, spatial_scale, sampling_ratio, aligned)
        return roi_align_torch(input, rois, output_size[0], output_size[1], spatial_scale, sampling_ratio, aligned)

    @staticmethod
    def backward(ctx, grad):
        (rois,) = ctx.saved_tensors
        with torch.enable_grad():
            x = torch.zeros(ctx.shape, dtype=grad.dtype, requires_grad=True)
            out = roi_align_torch(x, rois, ctx.args[0][0], ctx.args[0][1], *ctx.args[1:])
            (gx,) = torch.autograd.grad(out, x, grad)
        return gx, None, None, None, None, None, None


roi_align = RoIAlignFunction.apply  # NOTE: mmcv binds apply under another name, as here


class RoIModel(torch.nn.Module):
    def __init__(self, output_size=(3, 2), spatial_scale=0.5, sampling_ratio=2, aligned=True):
        super().__init__()
        self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned = \
            output_size, spatial_scale, sampling_ratio, aligned

    def forward(self, x, rois):
        return roi_align(x, rois, self.output_size, self.spatial_scale, self.sampling_ratio, "avg", self.aligned)


def rois(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 12
    wh = torch.rand(n, 2, generator=g) * 6 + 0.3
    return torch.cat([torch.randint(0, 2, (n, 1), generator=g).float(), xy, xy + wh], 1)


FEAT = torch.randn(2, 3, 8, 7, generator=torch.Generator().manual_seed(0))


def roi_fake(input, rois, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True):
    """mmcv's forward calls its compiled extension, which does not run on fake tensors: fake= says the shape."""
    return input.new_empty(rois.shape[0], input.shape[1], *output_size)


# -- QAT fake-quant: standard ONNX ops in symbolic ---------------------------------------------------------
class FakeQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, zero_point, quant_min=-128, quant_max=127):
        return torch.fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None  # straight-through

    @staticmethod
    def symbolic(g, x, scale, zero_point, quant_min=-128, quant_max=127):
        if (quant_min, quant_max) not in ((-128, 127), (0, 255)):
            raise ValueError("8-bit ranges only")
        to = onnx.TensorProto.UINT8 if quant_min == 0 else onnx.TensorProto.INT8
        zp = g.op("Cast", zero_point, to_i=to)
        q = g.op("QuantizeLinear", x, scale, zp)
        return g.op("DequantizeLinear", q, scale, zp)


def quant_fake(x, scale, zero_point, quant_min=-128, quant_max=127):
    """torch's fake_quantize has no fake kernel of its own: fake= says the shape."""
    return torch.empty_like(x)


class QuantModel(torch.nn.Module):
    def __init__(self, quant_min=-128, quant_max=127):
        super().__init__()
        self.scale = torch.tensor(0.05)
        self.zero_point = torch.tensor(3 if quant_min else 100, dtype=torch.int32)
        self.range = (quant_min, quant_max)

    def forward(self, x):
        return FakeQuantize.apply(x * 2, self.scale, self.zero_point, *self.range) + 1


# -- no symbolic: the node is named by name=, non-tensor arguments become attributes -------------------------
class ScaledShift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor, alpha: float, dims: tuple[int, ...], squash: bool):
        y = x * alpha + bias
        y = y.sum(dims, keepdim=True) + y
        return torch.tanh(y) if squash else y

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("not needed")


class ShiftModel(torch.nn.Module):
    def forward(self, x, b):
        return ScaledShift.apply(x, b, 0.5, (1,), True) - ScaledShift.apply(x, b, 2.0, (0, 1), False)


def _native_model_ready():
    from bridge.core.cppbuild import find_compiler
    return find_compiler() is not None


# -- the tests ------------------------------------------------------------------------------------------------
@pytest.fixture
def reg():
    return bridge.Registry()


def _register_bev(reg, inner: bool):
    if inner:
        bridge.register(QuickCumsumCuda, name="bevdet::QuickCumsum", sample_inputs=quick_cumsum_samples,
                        native=BEV_KERNELS, registry=reg)
    return bridge.register(TRTBEVPoolv2, native=BEV_KERNELS, sample_inputs=bev_pool_samples, registry=reg)


@pytest.mark.parametrize("tier", ["python", "function", "native"])
@pytest.mark.parametrize("inner", [False, True], ids=["outer", "both"])
def test_bevdet_trt_bev_pool(reg, tier, inner):
    op = _register_bev(reg, inner)
    spec = op.spec
    assert (spec.domain, spec.name) == ("mmdeploy", "bev_pool_v2")
    assert [p.name for p in spec.tensors] == ["depth", "feat", "ranks_depth", "ranks_feat", "ranks_bev",
                                              "interval_starts", "interval_lengths"]
    proto = bridge.export(BevModel(), bev_frame(0), registry=reg, dynamic_shapes=BEV_DYNAMIC)
    node = next(n for n in proto.graph.node if n.domain == "mmdeploy")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"out_height": 4, "out_width": 5}
    assert not [n for n in proto.graph.node if n.domain == "bevdet"]  # the inner call stays inside the node
    report = bridge.check_parity(BevModel(), bev_frame(0), registry=reg, tier=tier, dynamic_shapes=BEV_DYNAMIC,
                                 extra_args=[bev_frame(1, keep=0.5)])
    assert report.passed, report
    sizes = {r.shape for r in report.outputs}
    assert sizes == {(1, OUT_H, OUT_W, 6)}


class InnerModel(torch.nn.Module):
    """BEVDet's training-time path: the model calls bev_pool_v2 (QuickCumsumCuda) itself."""

    def forward(self, depth, feat, rd, rf, rb, starts, lengths):
        return bev_pool_v2(depth.unsqueeze(0), feat.unsqueeze(0), rd, rf, rb, (1, 1, OUT_H, OUT_W, 6), starts,
                           lengths)


def test_bevdet_inner_function_alone(reg):
    """QuickCumsumCuda called by the model itself (BEVDet's training-time path) is its own node."""
    bridge.register(QuickCumsumCuda, name="bevdet::QuickCumsum", sample_inputs=quick_cumsum_samples,
                    native=BEV_KERNELS, registry=reg)
    M = InnerModel
    proto = bridge.export(M(), bev_frame(0), registry=reg, dynamic_shapes=BEV_DYNAMIC)
    node = next(n for n in proto.graph.node if n.domain == "bevdet")
    assert node.op_type == "QuickCumsum"
    assert onnx.helper.get_attribute_value(node.attribute[0]) == [1, 1, OUT_H, OUT_W, 6]
    for tier in ("python", "function", "native"):
        bridge.assert_parity(M(), bev_frame(0), registry=reg, tier=tier, dynamic_shapes=BEV_DYNAMIC,
                             extra_args=[bev_frame(3, keep=0.4)])


def _bad(args, index, edit):
    args = [a.clone() for a in args]
    edit(args[index])
    return tuple(args)


def _set(position, value):
    def edit(t):
        t[position] = value
    return edit


# (model, registration, good inputs, bad input: argument index, edit, the native kernel's message)
# NOTE: the stand-in extension ignores the intervals (BEVDet's CUDA one reads past the points), so eager
# refuses no interval: the native kernel does
BAD_INPUTS = {
    "ranks_bev": (BevModel, "bev", bev_frame(0), 4, _set(0, 10**6),
                  r"mmdeploy::bev_pool_v2: input 'ranks_bev' has value 1000000 at position 0, outside \[0, 20\)"),
    "ranks_feat": (BevModel, "bev", bev_frame(0), 3, _set(-1, 30),
                   r"mmdeploy::bev_pool_v2: input 'ranks_feat' has value 30 at position \d+, outside \[0, 30\)"),
    "interval": (BevModel, "bev", bev_frame(0), 6, _set(-1, 10**6),
                 r"mmdeploy::bev_pool_v2: interval \d+ \(start \d+, length 1000000\) is not within the \d+ points"),
    "batch index": (lambda: RoIModel(), "roi", (FEAT, rois(3, 0)), 1, _set((1, 0), 2.0),
                    r"mmcv::MMCVRoiAlign: input 'rois' has batch index 2 in row 1, outside \[0, 2\)"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_native_kernels_refuse_what_eager_refuses(reg, case):
    """An index out of range: eager raises, and the native kernel names the input (never reads out of bounds)."""
    factory, which, args, index, edit, message = BAD_INPUTS[case]
    if which == "bev":
        _register_bev(reg, inner=False)
    else:
        bridge.register(RoIAlignFunction, fake=roi_fake, native="user_ops/roi_align.cc", sample_inputs=roi_samples,
                        registry=reg)
    bad = _bad(args, index, edit)
    if case != "interval":
        with pytest.raises((IndexError, RuntimeError)):
            factory()(*bad)
    sess = bridge.session(bridge.export(factory(), args, registry=reg).SerializeToString(), tier="native",
                          registry=reg)
    np.testing.assert_allclose(bridge.parity.run_ort(sess, args)[0], factory()(*args).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(bridge.OpBridgeError, match=message):
        bridge.parity.run_ort(sess, bad)


def test_bevdet_eager_and_gradients_unchanged(reg):
    def run():
        depth, feat, rd, rf, rb, shape, starts, lengths = random_case(grid=(OUT_W, OUT_H, 1), seed=4)
        depth.requires_grad_(True)
        feat.requires_grad_(True)
        out = bev_pool_v2(depth, feat, rd, rf, rb, tuple(shape), starts, lengths)
        (out * torch.linspace(0, 1, out.numel()).reshape(out.shape)).sum().backward()
        return out.detach(), depth.grad, feat.grad

    before = run()
    _register_bev(reg, inner=True)
    bridge.export(BevModel(), bev_frame(0), registry=reg, dynamic_shapes=BEV_DYNAMIC)
    after = run()
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert before[1].abs().sum() > 0 and before[2].abs().sum() > 0
    assert "forward" in QuickCumsumCuda.__dict__ and QuickCumsumCuda.__dict__["forward"].__func__.__name__ == "forward"


def roi_samples(dtype):
    return [bridge.SampleInput((FEAT.to(dtype), rois(3, 0).to(dtype), (3, 2), 0.5, 2, "avg", True))]


@pytest.mark.parametrize("tier", ["python", "function", "native"])
def test_mmcv_roi_align(reg, tier):
    op = bridge.register(RoIAlignFunction, fake=roi_fake, native="user_ops/roi_align.cc", sample_inputs=roi_samples,
                         registry=reg)
    # NOTE: the attributes in the order the TorchScript exporter writes them (by g.op keyword)
    assert [(p.name, p.attr_type.name if p.attr_type else "tensor") for p in op.spec.params] == [
        ("input", "tensor"), ("rois", "tensor"), ("aligned", "INT"), ("mode", "STRING"), ("output_height", "INT"),
        ("output_width", "INT"), ("sampling_ratio", "INT"), ("spatial_scale", "FLOAT")]
    # NOTE: one attribute set per tier keeps the file quick; the node test below covers the other
    model = RoIModel((2, 4), 0.25, 3, aligned=False) if tier == "function" else RoIModel()
    bridge.assert_parity(model, (FEAT, rois(5, 0)), registry=reg, tier=tier, dynamic_shapes=(None, {0: K}),
                         extra_args=[(FEAT, rois(9, 1)), (FEAT, rois(1, 2))])


def test_mmcv_roi_align_at_zero_rois_is_right_or_refused_in_every_tier(reg):
    """onnxruntime dies (SIGFPE) running the derived roi_align body at 0 rois: the body's check at 0 and 1
    rois runs in a child process, so the export lives on, and the body records the size; the function tier
    refuses that size (the process would end) and the other tiers give eager's empty result."""
    bridge.register(RoIAlignFunction, fake=roi_fake, native="user_ops/roi_align.cc", sample_inputs=roi_samples,
                    registry=reg)
    model = bridge.export(RoIModel(), (FEAT, rois(5, 0)), registry=reg, dynamic_shapes=(None, {0: K}))
    expected = RoIModel()(FEAT, rois(0, 0)).numpy()
    assert expected.shape == (0, 3, 3, 2)
    crashed = [f.doc_string for f in model.functions if "onnxruntime dies" in f.doc_string]
    for tier in ("python", "native", "function"):
        sess = bridge.session(model.SerializeToString(), tier=tier, registry=reg)
        if tier == "function" and crashed:
            assert "where input 'rois' has size 0 in dim 0" in crashed[0]
            with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: mmcv::MMCVRoiAlign: its function body makes "
                               r"onnxruntime die \(SIG\w+.*Got model input 'rois' of size 0 in dim 0.*Run such inputs"):
                bridge.parity.run_ort(sess, (FEAT, rois(0, 0)))
        else:
            np.testing.assert_array_equal(bridge.parity.run_ort(sess, (FEAT, rois(0, 0)))[0], expected)
        # NOTE: the refusal is of that size only
        np.testing.assert_allclose(bridge.parity.run_ort(sess, (FEAT, rois(1, 2)))[0],
                                   RoIModel()(FEAT, rois(1, 2)).numpy(), rtol=1e-5, atol=1e-5)


def test_mmcv_roi_align_at_zero_rois_is_refused_by_the_native_tier_running_its_body(reg):
    """Without a C++ kernel the native tier runs the op's function body: it refuses the size onnxruntime dies
    at as the function tier does."""
    bridge.register(RoIAlignFunction, fake=roi_fake, sample_inputs=roi_samples, registry=reg)
    model = bridge.export(RoIModel(), (FEAT, rois(5, 0)), registry=reg, dynamic_shapes=(None, {0: K}))
    sess = bridge.session(model.SerializeToString(), tier="native", registry=reg)
    assert sess.kernels == {"mmcv::MMCVRoiAlign": "function body"}
    if any("onnxruntime dies" in f.doc_string for f in model.functions):
        with pytest.raises(bridge.OpBridgeError, match=r"function body makes onnxruntime die .*Got model input 'rois' "
                                                       r"of size 0 in dim 0"):
            bridge.parity.run_ort(sess, (FEAT, rois(0, 0)))
    else:
        np.testing.assert_array_equal(bridge.parity.run_ort(sess, (FEAT, rois(0, 0)))[0],
                                      RoIModel()(FEAT, rois(0, 0)).numpy())
    np.testing.assert_allclose(bridge.parity.run_ort(sess, (FEAT, rois(1, 2)))[0], RoIModel()(FEAT, rois(1, 2)).numpy(),
                               rtol=1e-5, atol=1e-5)


class KeptRoIModel(torch.nn.Module):
    """roi_align on the rois the model keeps (left edge at ``low`` or more): their count is computed inside."""

    def forward(self, x, rois, low):
        return roi_align(x, rois[rois[:, 1] >= low], (3, 2), 0.5, 2, "avg", True)


def test_mmcv_roi_align_at_zero_rois_computed_in_the_model_is_refused_by_the_function_tier(reg):
    """The rois count that makes onnxruntime die is computed inside the model (no model input carries it):
    the function tier runs the part of the model that computes it first, and refuses that size."""
    bridge.register(RoIAlignFunction, fake=roi_fake, native="user_ops/roi_align.cc", sample_inputs=roi_samples,
                    registry=reg)
    model = bridge.export(KeptRoIModel(), (FEAT, rois(5, 0), torch.tensor(0.0)), registry=reg,
                          dynamic_shapes=(None, {0: K}, None))
    none_kept, all_kept = (FEAT, rois(5, 0), torch.tensor(100.0)), (FEAT, rois(5, 0), torch.tensor(0.0))
    assert KeptRoIModel()(*none_kept).shape == (0, 3, 3, 2)
    crashed = any("onnxruntime dies" in f.doc_string for f in model.functions)
    for tier in ("python", "function"):
        sess = bridge.session(model.SerializeToString(), tier=tier, registry=reg)
        if tier == "function" and crashed:
            with pytest.raises(bridge.OpBridgeError, match=r"die \(SIG\w+.*its input 'rois', computed in the model\) "
                                                           r"of size 0 in dim 0"):
                bridge.parity.run_ort(sess, none_kept)
        else:
            np.testing.assert_array_equal(bridge.parity.run_ort(sess, none_kept)[0], KeptRoIModel()(*none_kept).numpy())
        np.testing.assert_allclose(bridge.parity.run_ort(sess, all_kept)[0], KeptRoIModel()(*all_kept).numpy(),
                                   rtol=1e-5, atol=1e-5)


def _refusal(model: onnx.ModelProto, tier: str, reg, args) -> str | None:
    """The message a ``tier`` session of ``model`` refuses ``args`` with (None where it runs them)."""
    sess = bridge.session(model.SerializeToString(), tier=tier, registry=reg)
    try:
        bridge.parity.run_ort(sess, args)
    except bridge.OpBridgeError as e:
        return str(e)
    return None


def test_mmcv_roi_align_at_zero_rois_stays_refused_in_every_tier_once_inlined(reg, tmp_path):
    """Inlining drops the bodies and their doc strings: the inlined model carries the crash size in its
    ``opbridge.crashes`` metadata entry (bridge.export(inline=True), `opbridge inline`, check_parity(inline=True)),
    and every tier refuses that size with the attached file's message, not a process killed by SIGFPE."""
    bridge.register(RoIAlignFunction, fake=roi_fake, sample_inputs=roi_samples, registry=reg)
    path = tmp_path / "roi.onnx"
    model = bridge.export(RoIModel(), (FEAT, rois(5, 0)), path, registry=reg, dynamic_shapes=(None, {0: K}))
    flat = bridge.export(RoIModel(), (FEAT, rois(5, 0)), registry=reg, dynamic_shapes=(None, {0: K}), inline=True)
    # NOTE: a process that does not register the op inlines the file with the bodies' own input names
    assert main(["-q", "inline", str(path), "-o", str(tmp_path / "flat.onnx")]) == 0
    flat_cli = onnx.load(tmp_path / "flat.onnx")
    assert not flat.functions and not flat_cli.functions
    attached = _refusal(model, "function", reg, (FEAT, rois(0, 0)))
    if attached is None:  # NOTE: an onnxruntime that runs the body at 0 rois: nothing recorded, nothing refused
        assert not flat.metadata_props and not flat_cli.metadata_props
        return
    assert attached.startswith("opbridge: mmcv::MMCVRoiAlign: its function body makes onnxruntime die (SIG")
    assert [p.key for p in flat.metadata_props] == ["opbridge.crashes"] == [p.key for p in flat_cli.metadata_props]
    for tier in ("python", "native", "function"):
        for inlined in (flat, flat_cli):
            assert _refusal(inlined, tier, reg, (FEAT, rois(0, 0))) == attached
            sess = bridge.session(inlined.SerializeToString(), tier=tier, registry=reg)
            np.testing.assert_allclose(bridge.parity.run_ort(sess, (FEAT, rois(1, 2)))[0],
                                       RoIModel()(FEAT, rois(1, 2)).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(bridge.OpBridgeError) as caught:
        bridge.check_parity(RoIModel(), (FEAT, rois(5, 0)), registry=reg, dynamic_shapes=(None, {0: K}),
                            extra_args=[(FEAT, rois(0, 0))], inline=True)
    assert str(caught.value) == attached


def _roi_in_a_branch(node: onnx.NodeProto, branch: str, rois_value: str | None) -> onnx.GraphProto:
    """An If branch calling roi_align (``node``'s copy) on the outer ``rois``, or (``rois_value``) on a
    value of its own copied from it, declared [``rois_value``'s dim, 5]."""
    call = onnx.NodeProto()
    call.CopyFrom(node)
    call.name, call.output[:] = f"{branch}_roi", [f"{branch}_y"]
    nodes, values = [call], []
    if rois_value is not None:
        nodes.insert(0, onnx.helper.make_node("Identity", ["rois"], [f"{branch}_rois"]))
        call.input[:] = ["x", f"{branch}_rois"]
        values.append(onnx.helper.make_tensor_value_info(f"{branch}_rois", onnx.TensorProto.FLOAT,
                                                         [rois_value or None, 5]))
    return onnx.helper.make_graph(nodes, branch, [], [onnx.helper.make_tensor_value_info(
        f"{branch}_y", onnx.TensorProto.FLOAT, None)], value_info=values)


def test_mmcv_roi_align_at_zero_rois_inside_an_if_or_loop_body_is_refused_by_the_function_tier(reg):
    """The body of a node inside an If branch (or a Loop body) makes onnxruntime die at 0 rois as in the main
    graph: the size is refused where a model input dim carries it (the outer rois, or a branch value whose dim is
    named after it); where none does, the session is refused, saying why (its size is known only while
    the branch runs)."""
    bridge.register(RoIAlignFunction, fake=roi_fake, sample_inputs=roi_samples, registry=reg)
    main_graph = bridge.export(RoIModel(), (FEAT, rois(5, 0)), registry=reg, dynamic_shapes=(None, {0: K}))
    if not any("onnxruntime dies" in f.doc_string for f in main_graph.functions):
        pytest.skip("this onnxruntime runs the roi_align body at 0 rois")
    node = next(n for n in main_graph.graph.node if n.op_type == "MMCVRoiAlign")
    dim = main_graph.graph.input[1].type.tensor_type.shape.dim[0].dim_param
    inputs = [*main_graph.graph.input, onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])]
    for rois_value in (None, dim, ""):
        graph = onnx.helper.make_graph([onnx.helper.make_node(
            "If", ["c"], ["y"], then_branch=_roi_in_a_branch(node, "then", rois_value),
            else_branch=_roi_in_a_branch(node, "else", rois_value))], "g", inputs,
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
        model = onnx.helper.make_model(graph, opset_imports=main_graph.opset_import, ir_version=main_graph.ir_version)
        feed = {"x": FEAT.numpy(), "rois": rois(1, 2).numpy(), "c": np.array(True)}
        if rois_value == "":
            with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: mmcv::MMCVRoiAlign: its function body makes "
                               r"onnxruntime die \(SIG\w+.*inside an If/Loop body reads value '(?:then|else)_rois'.*Got value "
                               r"'(?:then|else)_rois' with dim 0 unnamed\. Run this model with tier='python' or 'native'"):
                bridge.session(model.SerializeToString(), tier="function", registry=reg)
            continue
        sess = bridge.session(model.SerializeToString(), tier="function", registry=reg)
        np.testing.assert_allclose(sess.run(None, feed)[0], RoIModel()(FEAT, rois(1, 2)).numpy(), rtol=1e-5, atol=1e-5)
        with pytest.raises(bridge.OpBridgeError, match=r"die \(SIG\w+.*Got model input 'rois' of size 0 in dim 0"):
            sess.run(None, {**feed, "rois": rois(0, 0).numpy()})
    # NOTE: the same in a Loop body (one trip, the outer rois)
    body = _roi_in_a_branch(node, "body", None)
    body.input.extend([onnx.helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
                       onnx.helper.make_tensor_value_info("go", onnx.TensorProto.BOOL, [])])
    body.node.insert(0, onnx.helper.make_node("Identity", ["go"], ["go_on"]))
    body.output.insert(0, onnx.helper.make_tensor_value_info("go_on", onnx.TensorProto.BOOL, []))
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Loop", ["trips", "c"], ["y"], body=body)], "g", inputs,
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(1, np.int64), "trips")])
    model = onnx.helper.make_model(graph, opset_imports=main_graph.opset_import, ir_version=main_graph.ir_version)
    sess = bridge.session(model.SerializeToString(), tier="function", registry=reg)
    feed = {"x": FEAT.numpy(), "rois": rois(1, 2).numpy(), "c": np.array(True)}
    np.testing.assert_allclose(sess.run(None, feed)[0][0], RoIModel()(FEAT, rois(1, 2)).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(bridge.OpBridgeError, match=r"die \(SIG\w+.*Got model input 'rois' of size 0 in dim 0"):
        sess.run(None, {**feed, "rois": rois(0, 0).numpy()})


def test_mmcv_roi_align_forward_gets_original_arguments(reg):
    """The python tier calls forward with output_size as the tuple apply took, aligned as a bool."""
    seen = []
    original = RoIAlignFunction.forward

    def spy(ctx, input, rois, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True):
        seen.append((output_size, spatial_scale, sampling_ratio, pool_mode, aligned))
        return original(ctx, input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned)

    class Spied(RoIAlignFunction):
        forward = staticmethod(spy)

    class M(torch.nn.Module):
        def forward(self, x, r):
            return Spied.apply(x, r, (3, 2), 0.5, 2, "avg", False)

    bridge.register(Spied, fake=roi_fake, registry=reg)
    sess = bridge.session(bridge.export(M(), (FEAT, rois(4, 0)), registry=reg).SerializeToString(), tier="python",
                          registry=reg)
    seen.clear()
    sess.run(None, {"x": FEAT.numpy(), "r": rois(4, 0).numpy()})
    assert seen == [((3, 2), 0.5, 2, "avg", False)]
    assert type(seen[0][4]) is bool and type(seen[0][0]) is tuple


def test_mmcv_node_is_what_the_torchscript_exporter_writes(reg):
    """The node of bridge.export equals the node torch.onnx.export(dynamo=False) writes from symbolic, at that
    exporter's default opset (17); the file's derived body, converted to opset 17, runs in the function tier."""
    bridge.register(RoIAlignFunction, fake=roi_fake, registry=reg)
    model, args = RoIModel((2, 4), 0.25, 3, aligned=False), (FEAT, rois(5, 0))
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, f, dynamo=False, opset_version=17)
    legacy_graph = onnx.load_from_string(f.getvalue()).graph
    proto = bridge.export(model, args, registry=reg, opset_version=17)
    ours_graph = proto.graph
    legacy = next(n for n in legacy_graph.node if n.domain == "mmcv")
    ours = next(n for n in ours_graph.node if n.domain == "mmcv")

    def identity(node, graph):
        """Domain, type, attributes (name, type, value) in the node's order, and where each input comes from."""
        sources = [i.name for i in graph.input]
        attrs = [(a.name, a.type, onnx.helper.get_attribute_value(a)) for a in node.attribute]
        return (node.domain, node.op_type, attrs, [sources.index(i) if i in sources else i for i in node.input],
                len(node.output))

    assert identity(ours, ours_graph) == identity(legacy, legacy_graph)
    assert identity(ours, ours_graph)[2][:2] == [("aligned", onnx.AttributeProto.INT, 0),
                                                 ("mode", onnx.AttributeProto.STRING, b"avg")]
    assert list(ours.input) == ["x", "rois"]
    sess = bridge.session(proto.SerializeToString(), tier="function", registry=reg)
    np.testing.assert_allclose(bridge.parity.run_ort(sess, args)[0], model(*args).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tier", ["python", "function", "native"])
@pytest.mark.parametrize("qrange", [(-128, 127), (0, 255)])
def test_fake_quant_standard_ops(reg, tier, qrange):
    op = bridge.register(FakeQuantize, name="qat::FakeQuantize", fake=quant_fake, registry=reg)
    assert [p.name for p in op.spec.tensors] == ["x", "scale", "zero_point"]
    assert [p.name for p in op.spec.attributes] == ["quant_min", "quant_max"]
    model = QuantModel(*qrange)
    x = torch.randn(3, 7) * 4
    d = torch.export.Dim("n")
    proto = bridge.export(model, (x,), registry=reg, dynamic_shapes=({0: d},))
    body = next(f for f in proto.functions if f.name == "FakeQuantize")
    assert [n.op_type for n in body.node] == ["Cast", "QuantizeLinear", "DequantizeLinear"]
    bridge.assert_parity(model, (x,), registry=reg, tier=tier, dynamic_shapes=({0: d},),
                         extra_args=[(torch.randn(11, 7) * 3,)])
    inlined = bridge.export(model, (x,), registry=reg, dynamic_shapes=({0: d},), inline=True)
    assert {n.op_type for n in inlined.graph.node} >= {"QuantizeLinear", "DequantizeLinear"}


def test_a_symbolic_failing_for_other_attribute_values_is_named(reg):
    """symbolic is read once at registration; a body for other values runs it again at export, and
    what it raises there is one opbridge error naming the Function's symbolic (not a builder the user
    never wrote) and the call's values, not a bare traceback."""
    bridge.register(FakeQuantize, name="qat::FakeQuantize", fake=quant_fake, registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"FakeQuantize\.symbolic raised when run \(as the TorchScript "
                       r"exporter runs it, at opset 17\) with the arguments \['<tensor>', '<tensor>', "
                       r"'<tensor>', 0, 15\]\. Got ValueError: 8-bit ranges only\. Fix the symbolic"):
        bridge.export(QuantModel(0, 15), (torch.randn(3, 7),), registry=reg)


def test_fake_quant_gradient_unchanged(reg):
    x = torch.randn(5, requires_grad=True)
    FakeQuantize.apply(x, torch.tensor(0.1), torch.tensor(0, dtype=torch.int32)).sum().backward()
    before = x.grad.clone()
    bridge.register(FakeQuantize, name="qat::FakeQuantize", fake=quant_fake, registry=reg)
    bridge.export(QuantModel(), (torch.randn(3, 7),), registry=reg)
    x.grad = None
    FakeQuantize.apply(x, torch.tensor(0.1), torch.tensor(0, dtype=torch.int32)).sum().backward()
    torch.testing.assert_close(x.grad, before, rtol=0, atol=0)
    assert torch.equal(before, torch.ones(5))


@pytest.mark.parametrize("tier", ["python", "function", "native"])
def test_function_without_symbolic(reg, tier):
    op = bridge.register(ScaledShift, name="mine::scaled_shift", native="user_ops/scaled_shift.cc", registry=reg,
                         sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(4, 3, dtype=dtype),
                                                                          torch.randn(3, dtype=dtype), 0.5, (1,), True))])
    assert [(p.name, p.attr_type.name if p.attr_type else "tensor") for p in op.spec.params] == [
        ("x", "tensor"), ("bias", "tensor"), ("alpha", "FLOAT"), ("dims", "INTS"), ("squash", "INT")]
    n = torch.export.Dim("n")
    args = (torch.randn(4, 3), torch.randn(3))
    proto = bridge.export(ShiftModel(), args, registry=reg, dynamic_shapes=({0: n}, None))
    nodes = [n for n in proto.graph.node if n.domain == "mine"]
    assert [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes] == [
        {"alpha": 0.5, "dims": [1], "squash": 1}, {"alpha": 2.0, "dims": [0, 1], "squash": 0}]
    bridge.assert_parity(ShiftModel(), args, registry=reg, tier=tier, dynamic_shapes=({0: n}, None),
                         extra_args=[(torch.randn(9, 3), torch.randn(3))])


OPS_MODULE = textwrap.dedent("""
    import torch
    import bridge

    class Scale(torch.autograd.Function):
        @staticmethod
        def symbolic(g, x, factor):
            return g.op("fndemo::Scale", x, factor_f=factor)

        @staticmethod
        def forward(ctx, x, factor):
            return x * factor

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    class NoGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor):
            return x + 1

    class Untold(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

    bridge.register(Scale)
    bridge.register(NoGrad, name="fndemo::NoGrad")
    bridge.register(Untold, name="fndemo::Untold")
""")


def test_opbridge_ops_lists_registered_functions(tmp_path):
    """``opbridge ops`` shows each registered Function as its node, names the class, and says whether
    the Function has its own backward."""
    (tmp_path / "fnmod.py").write_text(OPS_MODULE)
    r = forkserver.run(["-m", "bridge", "--ops", "fnmod.py", "ops", "--json"], cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["op"]: row for row in json.loads(r.stdout)}
    assert rows["fndemo::Scale"]["function_class"] == "fnmod.Scale"
    assert rows["fndemo::Scale"]["attributes"] == {"factor": "FLOAT"}
    assert rows["fndemo::Scale"]["autograd"] is True and rows["fndemo::NoGrad"]["autograd"] is False
    assert rows["opbridge::crop"]["function_class"] is None
    text = forkserver.run(["-m", "bridge", "--ops", "fnmod.py", "ops"], cwd=tmp_path,
                          timeout=300).stdout
    assert "note: fndemo::Scale is the node of torch.autograd.Function fnmod.Scale (bridge.register)" in text
    assert "note: torch.autograd.Function fnmod.Untold is registered; its node is described at its first call" in text
    assert "fndemo::Untold" not in rows


def test_unregistered_function_with_symbolic_warns_once(reg):
    ex = importlib.import_module("exporters.export")
    ex._WARNED_FUNCTIONS.discard(RoIAlignFunction)
    with pytest.warns(UserWarning, match=r"RoIAlignFunction has a symbolic.*bridge.register\(RoIAlignFunction\)"):
        proto = bridge.export(RoIModel(), (FEAT, rois(3, 0)), registry=reg)
    assert not [n for n in proto.graph.node if n.domain == "mmcv"]  # traced through, as torch does
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bridge.export(RoIModel(), (FEAT, rois(3, 0)), registry=reg)  # once per Function


def test_register_functions_option(reg):
    proto = bridge.export(RoIModel(), (FEAT, rois(3, 0)), registry=reg, register_functions=True,
                          dynamic_shapes=(None, {0: K}), functions=False)
    assert [n.op_type for n in proto.graph.node if n.domain == "mmcv"] == ["MMCVRoiAlign"]
    assert "mmcv::MMCVRoiAlign" in reg
    bridge.assert_parity(RoIModel(), (FEAT, rois(3, 0)), registry=reg, tier="python", dynamic_shapes=(None, {0: K}))


class NumpyOp(torch.autograd.Function):
    """Its forward leaves torch (an extension that needs real data), so it does not run on fake tensors."""

    @staticmethod
    def forward(ctx, x, k: int):
        return torch.from_numpy(np.roll(x.detach().numpy(), k).copy())

    @staticmethod
    def symbolic(g, x, k):
        return g.op("npdemo::Roll", x, shift_i=k)


def test_fake_error_names_function_and_fake(reg):
    bridge.register(NumpyOp, registry=reg)

    class M(torch.nn.Module):
        def forward(self, x):
            return NumpyOp.apply(x, 2) + 1

    with pytest.raises(bridge.OpBridgeError, match=r"NumpyOp: its forward does not run on fake tensors.*Pass fake="):
        bridge.export(M(), (torch.randn(6),), registry=reg)
    reg.remove("npdemo::Roll")
    bridge.register(NumpyOp, fake=lambda x, k: torch.empty_like(x), registry=reg)
    for tier in ("python",):
        bridge.assert_parity(M(), (torch.randn(6),), registry=reg, tier=tier)


def test_register_errors(reg):
    class NoKinds(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

    with pytest.raises(bridge.OpBridgeError, match="needs a name"):
        bridge.register(NoKinds, registry=reg)
    pending = bridge.register(NoKinds, name="mine::nokinds", registry=reg)  # NOTE: no kinds: the first call tells
    with pytest.raises(bridge.OpBridgeError, match=r"NoKinds: its node is described at its first call in an export"):
        pending.spec  # noqa: B018
    with pytest.raises(bridge.OpBridgeError, match=r"NoKinds is already registered"):
        bridge.register(NoKinds, name="mine::nokinds", registry=reg)

    class Helper(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def symbolic(g, x):
            from torch.onnx import symbolic_helper
            return g.op("mine::H", x, n_i=symbolic_helper._get_tensor_rank(x))

    bridge.register(Helper, registry=reg)  # NOTE: x's kind unknown: the first call tells, and its rank

    class M(torch.nn.Module):
        def forward(self, x):
            return Helper.apply(x)

    proto = bridge.export(M(), (torch.ones(2, 3),), registry=reg)
    assert [(a.name, a.i) for a in proto.graph.node[0].attribute] == [("n", 2)]  # as TorchScript wrote it
    with pytest.raises(bridge.OpBridgeError, match=r"Helper.symbolic writes attribute 'n' = 3 for this call, where "
                                                   r"the node read first holds 2"):
        bridge.export(M(), (torch.ones(2, 3, 4),), registry=reg)


class ScaleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor=2.0):
        ctx.factor = factor
        return x * factor

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None

    @staticmethod
    def symbolic(g, x, factor):
        return g.op("fndemo::Scale", x, factor_f=factor)


@pytest.mark.parametrize("tier", ["native", "python", "function"])
def test_native_kernel_for_function_node(reg, tier):
    """native= gives the node its symbolic writes a C++ kernel (tests/user_ops/fn_scale.cc)."""
    op = bridge.register(ScaleFn, native="user_ops/fn_scale.cc", registry=reg,
                         sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(3, 2).to(dtype), 1.5))])
    assert op.spec.sample_inputs(torch.float32)[0].args[1] == 1.5  # apply's call, as the node takes it
    assert Path(op.spec.native_source) == TESTS / "user_ops" / "fn_scale.cc"

    class M(torch.nn.Module):
        def forward(self, x):
            return ScaleFn.apply(x, 1.5) + ScaleFn.apply(x, -3.0)

    n = torch.export.Dim("n")
    bridge.assert_parity(M(), (torch.randn(4, 3),), registry=reg, tier=tier, dynamic_shapes=({0: n},),
                         extra_args=[(torch.randn(7, 3),)])


# -- a Function inside a torch.cond branch (dynamo traces the branches: the export forward is opaque to it) ------
class CondRoIModel(torch.nn.Module):
    """roi_align only when there are rois (mmdet's guard against an empty batch, written as torch.cond); with
    ``unguarded``, the branch is taken by the rois' values (taken at 0 rois too)."""

    def __init__(self, unguarded: bool = False):
        super().__init__()
        self.unguarded = unguarded

    def forward(self, x, rois):
        return torch.cond(rois.sum() >= 0 if self.unguarded else rois.shape[0] > 0,
                          lambda x, r: roi_align(x, r, (3, 2), 0.5, 2, "avg", True),
                          lambda x, r: r.new_zeros(r.shape[0], x.shape[1], 3, 2), (x, rois))


@pytest.mark.parametrize("inline", [False, True], ids=["attached", "inlined"])
@pytest.mark.parametrize("tier", ["python", "function"])
def test_mmcv_roi_align_inside_torch_cond(reg, tier, inline):
    bridge.register(RoIAlignFunction, fake=roi_fake, sample_inputs=roi_samples, registry=reg)
    model = bridge.export(CondRoIModel(), (FEAT, rois(5, 0)), registry=reg, dynamic_shapes=(None, {0: K}),
                          inline=inline)
    branches = [[(x.domain, x.op_type) for x in a.g.node] for n in model.graph.node if n.op_type == "If"
                for a in n.attribute]
    assert (branches[0] == [("mmcv", "MMCVRoiAlign")]) != inline
    sess = bridge.session(model.SerializeToString(), tier=tier, registry=reg)
    # NOTE: at 0 rois the guard takes the other branch: onnxruntime never runs the body it dies in there
    for n, seed in ((5, 0), (1, 2), (9, 1), (0, 3)):
        expected = CondRoIModel()(FEAT, rois(n, seed)).numpy()
        np.testing.assert_allclose(bridge.parity.run_ort(sess, (FEAT, rois(n, seed)))[0], expected, rtol=1e-5,
                                   atol=1e-5)


def test_mmcv_roi_align_in_the_branch_taken_at_zero_rois_is_refused_by_the_function_tier(reg):
    bridge.register(RoIAlignFunction, fake=roi_fake, sample_inputs=roi_samples, registry=reg)
    model = bridge.export(CondRoIModel(unguarded=True), (FEAT, rois(5, 0)), registry=reg,
                          dynamic_shapes=(None, {0: K}))
    if not any("onnxruntime dies" in f.doc_string for f in model.functions):
        pytest.skip("this onnxruntime runs the derived roi_align body at 0 rois: nothing to refuse")
    sess = bridge.session(model.SerializeToString(), tier="function", registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"die \(SIG\w+.*Got model input 'rois' of size 0 in dim 0"):
        bridge.parity.run_ort(sess, (FEAT, rois(0, 3)))
    np.testing.assert_allclose(bridge.parity.run_ort(sess, (FEAT, rois(3, 3)))[0],
                               CondRoIModel(unguarded=True)(FEAT, rois(3, 3)).numpy(), rtol=1e-5, atol=1e-5)


# -- a derived body called from a body written for another op --------------------------------------------------
MMCV = values.Opset("mmcv", 1)


@script(values.Opset("nested", 1), default_opset=op)
def doubled_roi_align(x, r):
    y = MMCV.MMCVRoiAlign(x, r, aligned=1, mode="avg", output_height=3, output_width=2, sampling_ratio=2,
                          spatial_scale=0.5)
    return op.Add(y, y)


class DoubledRoIModel(torch.nn.Module):
    # NOTE: its input named as the written body's: the resolver derives the nested node's body from that value
    def forward(self, x, r):
        return torch.ops.nested.doubled_roi_align(x, r)


def test_a_crashing_derived_body_called_from_a_written_body_is_refused_by_the_function_tier(reg):
    """roi_align's derived body (onnxruntime dies in it at 0 rois) called by the body written for another op:
    what that node reads exists only while the written body runs, so the function tier refuses the attached
    file when the session is made (it would otherwise die at 0 rois); the inlined file refuses 0 rois alone,
    and the python tier gives eager's result."""
    bridge.register(RoIAlignFunction, fake=roi_fake, sample_inputs=roi_samples, registry=reg)

    @bridge.op("nested::doubled_roi_align", fake=lambda x, r: x.new_empty(r.shape[0], x.shape[1], 3, 2),
               function=doubled_roi_align, registry=reg)
    def doubled(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return roi_align(x, r, (3, 2), 0.5, 2, "avg", True) * 2

    export = dict(registry=reg, dynamic_shapes=(None, {0: K}))
    model = bridge.export(DoubledRoIModel(), (FEAT, rois(5, 0)), **export)
    if not any("onnxruntime dies" in f.doc_string for f in model.functions):
        pytest.skip("this onnxruntime runs the derived roi_align body at 0 rois: nothing to refuse")
    with pytest.raises(bridge.UnsupportedInTier, match=r"^opbridge: mmcv::MMCVRoiAlign: its function body makes "
                       r"onnxruntime die .*the body of nested::doubled_roi_align \(not derived.*Run this model with "
                       r"tier='python' or 'native', or inline it"):
        bridge.session(model.SerializeToString(), tier="function", registry=reg)
    python = bridge.session(model.SerializeToString(), tier="python", registry=reg)
    inlined = bridge.session(bridge.export(DoubledRoIModel(), (FEAT, rois(5, 0)), inline=True, **export)
                             .SerializeToString(), tier="function", registry=reg)
    for n, seed in ((1, 2), (0, 3)):
        expected = DoubledRoIModel()(FEAT, rois(n, seed)).numpy()
        np.testing.assert_allclose(bridge.parity.run_ort(python, (FEAT, rois(n, seed)))[0], expected, rtol=1e-5,
                                   atol=1e-5)
        if n:
            np.testing.assert_allclose(bridge.parity.run_ort(inlined, (FEAT, rois(n, seed)))[0], expected,
                                       rtol=1e-5, atol=1e-5)
        else:
            with pytest.raises(bridge.OpBridgeError, match=r"die \(SIG\w+.*of size 0 in dim 0"):
                bridge.parity.run_ort(inlined, (FEAT, rois(n, seed)))



# NOTE: torch ops defined once per process (a test's bridge.op would define them again at the next test)
@torch.library.custom_op("nested::doubled_boxes", mutates_args=())
def _doubled_boxes(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return roi_align(x, r, (3, 2), 0.5, 2, "avg", True) * 2


_doubled_boxes.register_fake(lambda x, r: x.new_empty(r.shape[0], x.shape[1], 3, 2))


@script(values.Opset("nested", 1), default_opset=op)
def doubled_boxes(x, r):
    y = MMCV.MMCVRoiAlign(x, r, aligned=1, mode="avg", output_height=3, output_width=2, sampling_ratio=2,
                          spatial_scale=0.5)
    return op.Add(y, y)


class RenamedRoIModel(torch.nn.Module):
    # NOTE: as users write it: the model's values are named apart from the written body's formals (x, r)
    def forward(self, feat, boxes):
        return torch.ops.nested.doubled_boxes(feat, boxes)


def test_a_derived_body_called_from_a_written_body_is_typed_at_its_call_not_by_name(reg):
    """The body written for nested::doubled_boxes calls mmcv's roi_align with its formals x and r, which name no
    value of the model (feat, boxes): the resolver types them at the call and derives roi_align's body there;
    the function tier refuses the file for the size onnxruntime dies at (where it said 'is not a registered
    function/op'), and the python tier gives eager's results."""
    bridge.register(RoIAlignFunction, fake=roi_fake, sample_inputs=roi_samples, registry=reg)
    bridge.register("nested::doubled_boxes", function=doubled_boxes, registry=reg)
    model = bridge.export(RenamedRoIModel(), (FEAT, rois(5, 0)), registry=reg, dynamic_shapes=(None, {0: K}))
    assert [i.name for i in model.graph.input] == ["feat", "boxes"]
    assert sorted((f.domain, f.name) for f in model.functions) == [("mmcv", "MMCVRoiAlign"),
                                                                   ("nested", "doubled_boxes")]
    if any("onnxruntime dies" in f.doc_string for f in model.functions):
        with pytest.raises(bridge.UnsupportedInTier, match=r"^opbridge: mmcv::MMCVRoiAlign: its function body makes "
                           r"onnxruntime die .*the body of nested::doubled_boxes .*reading value 'r'"):
            bridge.session(model.SerializeToString(), tier="function", registry=reg)
    python = bridge.session(model.SerializeToString(), tier="python", registry=reg)
    for n, seed in ((5, 0), (1, 2), (0, 3)):
        np.testing.assert_allclose(bridge.parity.run_ort(python, (FEAT, rois(n, seed)))[0],
                                   RenamedRoIModel()(FEAT, rois(n, seed)).numpy(), rtol=1e-5, atol=1e-5)


@torch.library.custom_op("nested::running_sum", mutates_args=())
def _running_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, -1) * 0.5


@torch.library.custom_op("nested::shifted_sum", mutates_args=())
def _shifted_sum(a: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(a, -1) * 0.5 + shift


_running_sum.register_fake(torch.empty_like)
_shifted_sum.register_fake(lambda a, shift: torch.empty_like(a))
NESTED = values.Opset("nested", 1)


@script(NESTED, default_opset=op)
def shifted_sum(a, shift):
    return op.Add(NESTED.running_sum(a), shift)


def _register_sums(reg, dtypes=(torch.float32,)):
    bridge.register("nested::running_sum", dtypes=dtypes, registry=reg)
    bridge.register("nested::shifted_sum", function=shifted_sum, dtypes=dtypes, registry=reg)


class TwoShapesModel(torch.nn.Module):
    def forward(self, small, large, bias):
        return torch.ops.nested.shifted_sum(small, bias), torch.ops.nested.shifted_sum(large, bias)


@pytest.mark.parametrize("tier", ["function", "python"])
def test_a_derived_body_inside_a_written_body_called_at_two_shapes_serves_both(reg, tier):
    """nested::shifted_sum's written body (formals a, shift) calls the derived nested::running_sum; the model
    calls it at [2, 5] and [3, 4]: the inner node's one body is derived with the dims its calls disagree on
    dynamic, and both tiers give eager's results."""
    _register_sums(reg)
    args = (torch.randn(2, 5), torch.randn(3, 4), torch.randn(()))
    model = bridge.export(TwoShapesModel(), args, registry=reg)
    assert ("nested", "running_sum") in {(f.domain, f.name) for f in model.functions}
    sess = bridge.session(model.SerializeToString(), tier=tier, registry=reg)
    for got, expected in zip(bridge.parity.run_ort(sess, args), TwoShapesModel()(*args)):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_a_derived_body_inside_a_written_body_called_at_two_dtypes_is_refused(reg):
    """One node inside a written body gets one body: calls at float32 and float64 give it no one type, and the
    resolver says so (naming the op, the function it sits in and what to do) instead of leaving it body-less."""
    _register_sums(reg, dtypes=(torch.float32, torch.float64))

    class TwoDtypes(torch.nn.Module):
        def forward(self, a, b, bias):
            return torch.ops.nested.shifted_sum(a, bias), torch.ops.nested.shifted_sum(b, bias.double())

    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: nested::running_sum inside the function "
                       r"nested::shifted_sum needs its input types .*Got no type and shape for 'a' at every call "
                       r".*call nested::shifted_sum at one dtype and rank"):
        bridge.export(TwoDtypes(), (torch.randn(2, 5), torch.randn(3, 4, dtype=torch.float64), torch.randn(())),
                      registry=reg)


def test_a_derived_body_inside_a_function_is_typed_with_the_attribute_values_of_its_call(reg):
    """A model-local function (user::flat_sum, attribute k) flattens its input with axis=@k before the derived
    nested::running_sum: the resolver types the inner node at the call's k (2: [6, 4], not the [2, 12] of
    the default axis), and plain onnxruntime runs the attached file as eager computes it."""
    bridge.register("nested::running_sum", registry=reg)
    flat = onnx.helper.make_node("Flatten", ["a"], ["t"])
    flat.attribute.add(name="axis", type=onnx.AttributeProto.INT, ref_attr_name="k")
    body = onnx.helper.make_function("user", "flat_sum", ["a"], ["b"], [
        flat, onnx.helper.make_node("running_sum", ["t"], ["b"], domain="nested")],
        [onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid("nested", 1)], attributes=["k"])
    graph = onnx.helper.make_graph([onnx.helper.make_node("flat_sum", ["x"], ["y"], domain="user", k=2)], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, functions=[body], opset_imports=[
        onnx.helper.make_opsetid(d, v) for d, v in (("", 18), ("user", 1), ("nested", 1))])
    assert bridge.attach_functions(model, reg) == ["nested::running_sum"]
    x = torch.rand(2, 3, 4)
    got = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, _running_sum(x.reshape(6, 4)).numpy(), rtol=1e-6)


def test_classes_made_nests_and_puts_back_what_was_there():
    """An export inside an export (or one already recording) records into both lists, and each exit puts back
    what it found: before, the inner exit deleted the outer recorder, and the outer exit then raised."""
    assert "__init_subclass__" not in torch.autograd.Function.__dict__
    with classes_made() as outer:
        class First(torch.autograd.Function):
            pass
        with classes_made() as inner:
            class Second(torch.autograd.Function):
                pass
        class Third(torch.autograd.Function):
            pass
    class Fourth(torch.autograd.Function):
        pass
    assert [c.__name__ for c in outer] == ["First", "Second", "Third"]
    assert [c.__name__ for c in inner] == ["Second"]
    assert "__init_subclass__" not in torch.autograd.Function.__dict__
