"""torch.autograd.Function classes as deployment repositories ship them, bridged with nothing changed but their
compiled extension (stood in by plain torch): mmcv 2.x's ModulatedDeformConv2dFunction (tuples into ``stride_i=``),
mmcv 2.x's RoIAlignFunction (``output_size: int`` called with a tuple; a symbolic of standard ops written with
``symbolic_opset9.sub`` for opsets before 13), a symbolic written with ``torch.onnx.symbolic_helper`` (mmdeploy's
and pytorch-quantization's style), an attribute left out for None, and Functions called with keywords, written in
place or reading ``ctx.needs_input_grad``; mmcv 2.2.0's DeformConv2dFunction (keyword defaults into attributes) and
SoftNMSop (``float(x)`` into ``g.op``, ``outputs=2``), mmdeploy 1.3.1's TRTBatchedNMSop (output count from a bool)
and ONNXNMSop (``_is_value`` branches, NonMaxSuppression). Each node is compared with what
``torch.onnx.export(dynamo=False)`` writes for the same call; parity runs in every tier that applies."""

import io
import math
import warnings
from typing import Tuple, Union  # noqa: UP035  NOTE: mmcv writes its annotations so

import mmdeploy_lib
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from test_functions import (
    BEV_DYNAMIC,
    FEAT,
    OUT_H,
    OUT_W,
    InnerModel,
    QuickCumsumCuda,
    bev_frame,
    roi_align_torch,
    rois,
)
from torch.autograd import Function
from torch.nn.modules.utils import _pair
from torch.onnx import symbolic_helper
from vision_ops import deform_conv2d
from vision_ops import nms as vision_nms

import bridge
from bridge.core.basics.graphs import custom_nodes

B = torch.export.Dim("batch")


def legacy_export(model, args, opset: int) -> onnx.ModelProto:
    """What torch.onnx's TorchScript exporter writes for ``model`` (no constant folding: nodes as written)."""
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, f, dynamo=False, opset_version=opset, do_constant_folding=False)
    return onnx.load_from_string(f.getvalue())


def node_identity(node: onnx.NodeProto, graph: onnx.GraphProto):
    """Domain, type, attributes (name, type, value) and, for each input, the graph input it is (by position)."""
    sources = [i.name for i in graph.input]
    return (node.domain, node.op_type, [(a.name, a.type, onnx.helper.get_attribute_value(a)) for a in node.attribute],
            [sources.index(i) if i in sources else "computed" for i in node.input])


# -- mmcv 2.x mmcv/ops/modulated_deform_conv.py: the callers pass _pair(...) tuples ------------------------------
class _DeformExt:
    """Stands in for mmcv's compiled ``modulated_deform_conv_forward``: writes into ``output``."""

    @staticmethod
    def modulated_deform_conv_forward(input, weight, bias, ones, offset, mask, output, columns, kernel_h, kernel_w,
                                      stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group,
                                      with_bias):
        output.copy_(deform_conv2d(input, weight, offset, mask, bias if with_bias else torch.zeros(weight.shape[0]),
                                   stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group,
                                   True))


class ModulatedDeformConv2dFunction(Function):
    @staticmethod
    def symbolic(g, input, offset, mask, weight, bias, stride, padding, dilation, groups, deform_groups):
        input_tensors = [input, offset, mask, weight]
        if bias is not None:
            input_tensors.append(bias)
        return g.op("mmcv::MMCVModulatedDeformConv2d", *input_tensors, stride_i=stride, padding_i=padding,
                    dilation_i=dilation, groups_i=groups, deform_groups_i=deform_groups)

    @staticmethod
    def forward(ctx, input: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, weight: torch.nn.Parameter,
                bias=None, stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1,
                deform_groups: int = 1) -> torch.Tensor:
        ctx.stride, ctx.padding, ctx.dilation = _pair(stride), _pair(padding), _pair(dilation)
        ctx.groups, ctx.deform_groups, ctx.with_bias = groups, deform_groups, bias is not None
        if not ctx.with_bias:
            bias = input.new_empty(0)
        kh, kw = weight.shape[2:]
        out_h = (input.shape[2] + 2 * ctx.padding[0] - (ctx.dilation[0] * (kh - 1) + 1)) // ctx.stride[0] + 1
        out_w = (input.shape[3] + 2 * ctx.padding[1] - (ctx.dilation[1] * (kw - 1) + 1)) // ctx.stride[1] + 1
        output = input.new_empty(input.shape[0], weight.shape[0], out_h, out_w)
        _DeformExt.modulated_deform_conv_forward(
            input, weight, bias, None, offset, mask, output, None, kh, kw, ctx.stride[0], ctx.stride[1],
            ctx.padding[0], ctx.padding[1], ctx.dilation[0], ctx.dilation[1], ctx.groups, ctx.deform_groups,
            ctx.with_bias)
        return output


modulated_deform_conv2d = ModulatedDeformConv2dFunction.apply


class ModulatedDeformConv2dPack(torch.nn.Module):
    """mmcv's DCNv2 layer: its own conv predicts offsets and mask; stride/padding/dilation kept as _pair tuples."""

    def __init__(self, in_channels=4, out_channels=3, kernel_size=3, stride=1, padding=1, bias=True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(1)
        self.groups, self.deform_groups = 1, 1
        self.weight = torch.nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size, generator=g))
        self.bias = torch.nn.Parameter(torch.randn(out_channels, generator=g)) if bias else None
        self.conv_offset = torch.nn.Conv2d(in_channels, 3 * kernel_size * kernel_size, kernel_size, self.stride,
                                           self.padding)
        torch.nn.init.normal_(self.conv_offset.weight, std=0.3, generator=g)

    def forward(self, x):
        o1, o2, mask = torch.chunk(self.conv_offset(x), 3, dim=1)
        return modulated_deform_conv2d(x, torch.cat((o1, o2), dim=1), torch.sigmoid(mask), self.weight, self.bias,
                                       self.stride, self.padding, self.dilation, self.groups, self.deform_groups)


def deform_fake(input, offset, mask, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, deform_groups=1):
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    kh, kw = weight.shape[2:]
    return input.new_empty(input.shape[0], weight.shape[0], (input.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1,
                           (input.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1)


@pytest.fixture
def reg():
    return bridge.Registry()


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_mmcv_deform_conv_tuples_are_ints_as_torchscript_wrote_them(reg, bias, monkeypatch):
    """mmcv's layer passes _pair tuples where forward annotates int: the node carries INTS, exactly the node the
    TorchScript exporter writes (4 inputs without bias); no annotation, sample or edit was needed."""
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=reg)
    model, x = ModulatedDeformConv2dPack(stride=2, bias=bias).eval(), torch.randn(2, 4, 9, 8)
    ours = bridge.export(model, (x,), registry=reg, opset_version=18)
    # NOTE: the TorchScript exporter traces forward's sizes as tensors and torch 2.13's fails on that traced
    # body ("Argument passed to at() was not in the map"); its node comes from symbolic alone, so the reference
    # export traces a forward of constant size
    shape = model(x).shape
    monkeypatch.setattr(ModulatedDeformConv2dFunction, "forward", staticmethod(lambda ctx, *a: torch.zeros(shape)))
    legacy = legacy_export(model, (x,), 18)
    mine = next(n for n in ours.graph.node if n.domain == "mmcv")
    theirs = next(n for n in legacy.graph.node if n.domain == "mmcv")
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    assert [(a.name, a.type) for a in mine.attribute][:2] == [("deform_groups", onnx.AttributeProto.INT),
                                                                ("dilation", onnx.AttributeProto.INTS)]
    assert onnx.helper.get_attribute_value(next(a for a in mine.attribute if a.name == "stride")) == [2, 2]
    assert len(mine.input) == len(theirs.input) == (5 if bias else 4)
    assert [o.name for o in ours.graph.output] == ["mmcv_modulated_deform_conv2d"]  # no proxy's name in the file


# NOTE: the function tier needs a body derived from forward, whose stand-in loops over kernel taps by Python ints
@pytest.mark.parametrize("tier", ["python"])
def test_mmcv_deform_conv_parity(reg, tier):
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=reg)
    model = ModulatedDeformConv2dPack(stride=1).eval()
    bridge.assert_parity(model, (torch.randn(2, 4, 7, 6),), registry=reg, tier=tier, dynamic_shapes=({0: B},),
                         extra_args=[(torch.randn(3, 4, 7, 6),)], rtol=1e-4, atol=1e-4)


@pytest.mark.long
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_mmcv_deform_conv_runs_mmdeploys_own_kernel(reg, bias):
    """The INTS node is the one mmdeploy 1.3.1's kernel library serves: its C++ kernel runs it (in_channels x 3 x 3
    a multiple of 8, which that kernel needs) and agrees with forward, with and without bias. (Long: it needs
    mmdeploy's library, tests/mmdeploy_lib.py: failing without it, unless the run says it is offline.)"""
    library = mmdeploy_lib.library()
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=reg)
    model = ModulatedDeformConv2dPack(in_channels=8, out_channels=4, bias=bias).eval()
    report = bridge.check_parity(model, (torch.randn(2, 8, 7, 6),), registry=reg, tier="native",
                                 native_library=library, dynamic_shapes=({0: B},),
                                 extra_args=[(torch.randn(1, 8, 7, 6),)], rtol=1e-4, atol=1e-4)
    assert report.passed, str(report)
    assert report.kernels == {"mmcv::MMCVModulatedDeformConv2d": library}


def test_mmcv_deform_conv_eager_and_gradients_unchanged(reg):
    model, x = ModulatedDeformConv2dPack().eval(), torch.randn(1, 4, 6, 6)
    before = model(x)
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=reg)
    bridge.export(model, (x,), registry=reg)
    assert torch.equal(model(x), before)


def test_mmcv_deform_conv_file_runs_where_the_function_was_only_registered(reg, tmp_path):
    """A process that registers the Function and loads the file (``opbridge --ops mmcv_ops run``, a deploying
    process) has the record registration gave (stride: INT, from forward's annotation); the file's node carries
    the _pair tuples as INTS. The session retypes the record as the file was written, as the exporting process
    did, in every tier, and onnx's checker then knows the node."""
    model, x = ModulatedDeformConv2dPack(stride=2).eval(), torch.randn(2, 4, 9, 8)
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=reg)
    path = tmp_path / "mdcn.onnx"
    bridge.export(model, (x,), path, registry=reg)
    loading = bridge.Registry()
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=loading)
    stride = next(p for p in loading.get("mmcv::MMCVModulatedDeformConv2d").attributes if p.name == "stride")
    assert stride.attr_type == onnx.AttributeProto.INT  # NOTE: what registration alone knows
    sess = bridge.session(path, tier="python", registry=loading)
    got = sess.run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    stride = next(p for p in loading.get("mmcv::MMCVModulatedDeformConv2d").attributes if p.name == "stride")
    assert stride.attr_type == onnx.AttributeProto.INTS
    onnx.checker.check_model(onnx.load(path), full_check=True)


class PairPool(Function):
    """An mmcv-style Function of its own domain (no other test registers it): forward annotates int, the layer
    passes _pair tuples."""

    @staticmethod
    def symbolic(g, x, kernel: int = 1, stride: int = 1):
        return g.op("pairpool::PairPool", x, kernel_i=kernel, stride_i=stride)

    @staticmethod
    def forward(ctx, x, kernel: int = 1, stride: int = 1):
        return torch.nn.functional.avg_pool2d(x, _pair(kernel), _pair(stride))


class PairPoolModel(torch.nn.Module):
    def forward(self, x):
        return PairPool.apply(x, _pair(2), _pair(2)) * 3


def test_tools_see_a_functions_schema_once_a_use_tells_its_types(reg, tmp_path):
    """Registration alone cannot know a Function's attribute types (mmcv passes tuples where forward annotates
    int): its ONNX schema is registered at its first use, so onnx.checker, onnxslim and onnxsim read a file in a
    process that only registered the Function as they read it in one that never did; after an export or a
    session (which type the record from the call or the file) the schema is there, with the file's types."""
    x = torch.randn(1, 2, 6, 6)
    bridge.register(PairPool, registry=reg)
    path = tmp_path / "pool.onnx"
    bridge.export(PairPoolModel(), (x,), path, registry=reg)
    assert onnx.defs.get_schema("PairPool", 1, "pairpool").attributes["stride"].type == onnx.AttributeProto.INTS
    reg.remove("pairpool::PairPool")  # NOTE: the exporting process ends
    loading = bridge.Registry()
    bridge.register(PairPool, registry=loading)
    assert not onnx.defs.has("PairPool", "pairpool")
    onnx.checker.check_model(onnx.load(path), full_check=True)
    sess = bridge.session(path, tier="python", registry=loading)
    np.testing.assert_allclose(sess.run(None, {"x": x.numpy()})[0], PairPoolModel()(x).numpy(), rtol=1e-6)
    assert onnx.defs.get_schema("PairPool", 1, "pairpool").attributes["stride"].type == onnx.AttributeProto.INTS
    onnx.checker.check_model(onnx.load(path), full_check=True)
    loading.remove("pairpool::PairPool")
    assert not onnx.defs.has("PairPool", "pairpool")


def test_a_file_whose_nodes_of_one_function_disagree_in_types_is_refused(reg, tmp_path):
    """Export writes one signature per Function; a file edited to hold an INT and an INTS stride is refused,
    naming both nodes, not run with one of them misread."""
    model, x = ModulatedDeformConv2dPack().eval(), torch.randn(1, 4, 6, 6)
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=reg)
    proto = bridge.export(model, (x,), registry=reg)
    node = next(n for n in proto.graph.node if n.domain == "mmcv")
    twin = onnx.NodeProto()
    twin.CopyFrom(node)
    twin.name, twin.output[0] = "twin", "twin_out"
    stride = next(a for a in twin.attribute if a.name == "stride")
    stride.CopyFrom(onnx.helper.make_attribute("stride", 1))
    proto.graph.node.append(twin)
    proto.graph.output.append(onnx.helper.make_tensor_value_info("twin_out", onnx.TensorProto.FLOAT, None))
    loading = bridge.Registry()
    bridge.register(ModulatedDeformConv2dFunction, fake=deform_fake, registry=loading)
    with pytest.raises(bridge.OpBridgeError, match=r"ModulatedDeformConv2dFunction: nodes '.*' and 'twin' of "
                                                   r"mmcv::MMCVModulatedDeformConv2d carry attributes of other types"):
        bridge.session(proto, tier="python", registry=loading)


# -- an attribute the call leaves None: TorchScript leaves it out of the node --------------------------------------
class ScaledNorm(Function):
    @staticmethod
    def symbolic(g, x, eps=None, scale=1.0):
        return g.op("mine::ScaledNorm", x, eps_f=eps, scale_f=scale)

    @staticmethod
    def forward(ctx, x, eps=None, scale=1.0):
        return x / (x.norm(dim=-1, keepdim=True) + (1e-12 if eps is None else eps)) * scale


class NormModel(torch.nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return ScaledNorm.apply(x, self.eps, 2.0)


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_a_none_attribute_is_left_out_as_torchscript_did(reg, eps):
    bridge.register(ScaledNorm, registry=reg)
    model, x = NormModel(eps), torch.randn(3, 5)
    ours = bridge.export(model, (x,), registry=reg, opset_version=17)
    legacy = legacy_export(model, (x,), 17)
    mine, theirs = (next(n for n in p.graph.node if n.domain == "mine") for p in (ours, legacy))
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    assert [a.name for a in mine.attribute] == (["scale"] if eps is None else ["eps", "scale"])
    bridge.assert_parity(model, (x,), registry=reg, tier="python")
    bridge.assert_parity(model, (x,), registry=reg)


# -- calls as users write them ------------------------------------------------------------------------------------
class AddBias(Function):
    """No symbolic: the node is named by name=; forward reads ctx.needs_input_grad as mmcv's forwards do."""

    @staticmethod
    def forward(ctx, x, bias=1.0, axis=-1):
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(x)
        return x + bias + x.mean(axis, keepdim=True)


class KeywordModel(torch.nn.Module):
    def forward(self, x):
        return AddBias.apply(x, bias=5.0) * 2 + AddBias.apply(x, axis=0, bias=0.5)


def _apply_takes_keywords() -> bool:
    """torch before 2.13 refuses ``Function.apply(x, bias=...)`` in eager ("apply() takes no keyword arguments")."""
    try:
        AddBias.apply(torch.ones(1), bias=0.0)
    except TypeError:
        return False
    return True


@pytest.mark.skipif(not _apply_takes_keywords(), reason="this torch's Function.apply takes no keyword arguments, "
                                                        "in eager too: the model cannot run")
@pytest.mark.parametrize("tier", ["python", "function"])
def test_apply_with_keywords_and_needs_input_grad(reg, tier):
    op = bridge.register(AddBias, name="mine::add_bias", registry=reg)  # no annotation: the first call tells
    x = torch.randn(3, 4)
    proto = bridge.export(KeywordModel(), (x,), registry=reg)
    assert [p.name for p in op.spec.attributes] == ["bias", "axis"]
    values = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in proto.graph.node
              if n.domain == "mine"]
    assert values == [{"axis": -1, "bias": 5.0}, {"axis": 0, "bias": 0.5}]
    bridge.assert_parity(KeywordModel(), (x,), registry=reg, tier=tier)


class Halve(Function):
    """No symbolic; the int default says int, the caller passes 0.5: the attribute is the float the call gave."""

    @staticmethod
    def forward(ctx, x, k=1):
        return x * k


def test_a_float_where_the_default_is_int_stays_a_float(reg):
    bridge.register(Halve, name="mine::halve", registry=reg)

    class M(torch.nn.Module):
        def forward(self, x):
            return Halve.apply(x, 0.5)

    x = torch.randn(2, 3)
    proto = bridge.export(M(), (x,), registry=reg)
    (attr,) = next(n for n in proto.graph.node if n.domain == "mine").attribute
    assert (attr.name, attr.type, attr.f) == ("k", onnx.AttributeProto.FLOAT, 0.5)
    bridge.assert_parity(M(), (x,), registry=reg, tier="python")
    bridge.assert_parity(M(), (x,), registry=reg)


class AddInPlace(Function):
    """Writes its input in place and marks it dirty, as in-place activations (mmcv's, inplace-abn) do."""

    @staticmethod
    def symbolic(g, x, k):
        return g.op("mine::AddInPlace", x, k_f=k)

    @staticmethod
    def forward(ctx, x, k):
        x.add_(k)
        ctx.mark_dirty(x)
        return x


@pytest.mark.parametrize("tier", ["python", "function"])
def test_an_in_place_function(reg, tier):
    bridge.register(AddInPlace, registry=reg)

    class M(torch.nn.Module):
        def forward(self, x):
            return AddInPlace.apply(x * 1, 2.5) * 3

    bridge.assert_parity(M(), (torch.randn(4, 2),), registry=reg, tier=tier)


class Offset(Function):
    """An argument that reaches no attribute: the kernel tiers call forward with its default."""

    @staticmethod
    def symbolic(g, x, scale, shift=0.0):
        return g.op("mine::Offset", x, scale_f=scale)

    @staticmethod
    def forward(ctx, x, scale, shift=0.0):
        return x * scale + math.copysign(2.0, shift)


class NanDefault(Function):
    @staticmethod
    def symbolic(g, x, scale, fill=float("nan")):
        return g.op("mine::NanDefault", x, scale_f=scale)

    @staticmethod
    def forward(ctx, x, scale, fill=float("nan")):
        return torch.nan_to_num(x * scale, nan=0.0) if math.isnan(fill) else x


def test_an_argument_that_reaches_no_attribute_is_compared_bitwise(reg):
    """-0.0 is not the default 0.0 (forward computes -2 where the default gives +2): refused, naming the
    argument; a NaN default called with NaN is the default."""
    bridge.register(Offset, registry=reg)
    bridge.register(NanDefault, registry=reg)

    class M(torch.nn.Module):
        def __init__(self, shift):
            super().__init__()
            self.shift = shift

        def forward(self, x):
            return Offset.apply(x, 2.0, self.shift)

    x = torch.randn(3)
    bridge.assert_parity(M(0.0), (x,), registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"argument 'shift' of forward does not reach the ONNX node .* "
                                                   r"Got shift=-0\.0"):
        bridge.export(M(-0.0), (x,), registry=reg)

    class N(torch.nn.Module):
        def forward(self, x):
            return NanDefault.apply(x, 2.0, float("nan"))

    bridge.assert_parity(N(), (torch.tensor([1.0, float("nan")]),), registry=reg, tier="python")


# -- symbolics written with torch.onnx.symbolic_helper ---------------------------------------------------------
class ClampScale(Function):
    """A custom node written the way mmdeploy's and pytorch-quantization's symbolics are: parse_args, _is_value."""

    @staticmethod
    @symbolic_helper.parse_args("v", "f", "i", "b")
    def symbolic(g, x, scale, axis, keep):
        assert not symbolic_helper._is_value(scale) and symbolic_helper._is_value(x)
        return g.op("mine::ClampScale", x, scale_f=scale, axis_i=axis, keep_i=keep)

    @staticmethod
    def forward(ctx, x, scale, axis, keep):
        y = x.clamp(-1, 1) * scale
        return y if keep else y - y.mean(axis, keepdim=True)


def test_a_symbolic_using_symbolic_helper(reg):
    bridge.register(ClampScale, registry=reg)

    class M(torch.nn.Module):
        def forward(self, x):
            return ClampScale.apply(x, 3.0, 1, False)

    x = torch.randn(2, 5) * 2
    ours = bridge.export(M(), (x,), registry=reg, opset_version=17)
    legacy = legacy_export(M(), (x,), 17)
    mine, theirs = (next(n for n in p.graph.node if n.domain == "mine") for p in (ours, legacy))
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    bridge.assert_parity(M(), (x,), registry=reg, tier="python")
    bridge.assert_parity(M(), (x,), registry=reg)


# -- mmcv 2.x mmcv/ops/roi_align.py: a symbolic of standard ops, written for opsets before 13 ----------------------
class _RoIAlignExt:
    """Stands in for mmcv's compiled ``roi_align_forward`` (avg mode, sampling_ratio > 0): writes into ``output``."""

    @staticmethod
    def roi_align_forward(input, rois, output, argmax_y, argmax_x, aligned_height, aligned_width, spatial_scale,
                          sampling_ratio, pool_mode, aligned):
        output.copy_(roi_align_torch(input, rois, aligned_height, aligned_width, spatial_scale, sampling_ratio,
                                     aligned))


class RoIAlignFunction(Function):
    @staticmethod
    def symbolic(g, input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned):
        from torch.onnx import TensorProtoDataType
        from torch.onnx.symbolic_opset9 import sub

        def select(g, self, dim, index):
            return g.op("Gather", self, index, axis_i=dim)

        batch_indices = select(g, rois, 1, g.op("Constant", value_t=torch.tensor([0], dtype=torch.long)))
        batch_indices = g.op("Squeeze", batch_indices, axes_i=[1])
        batch_indices = g.op("Cast", batch_indices, to_i=TensorProtoDataType.INT64)
        rois = select(g, rois, 1, g.op("Constant", value_t=torch.tensor([1, 2, 3, 4], dtype=torch.long)))
        if aligned:
            offset = g.op("Constant", value_t=torch.tensor([0.5 / spatial_scale], dtype=torch.float32))
            rois = sub(g, rois, offset)
        return g.op("RoiAlign", input, rois, batch_indices, output_height_i=output_size[0],
                    output_width_i=output_size[1], spatial_scale_f=spatial_scale,
                    sampling_ratio_i=max(0, sampling_ratio), mode_s=pool_mode)

    @staticmethod
    def forward(ctx, input: torch.Tensor, rois: torch.Tensor, output_size: int, spatial_scale: float = 1.0,
                sampling_ratio: int = 0, pool_mode: str = "avg", aligned: bool = True) -> torch.Tensor:
        ctx.output_size, ctx.spatial_scale, ctx.sampling_ratio = _pair(output_size), spatial_scale, sampling_ratio
        ctx.pool_mode, ctx.aligned = 0 if pool_mode == "max" else 1, aligned
        assert rois.size(1) == 5, "RoI must be (idx, x1, y1, x2, y2)!"
        output = input.new_zeros((rois.size(0), input.size(1), ctx.output_size[0], ctx.output_size[1]))
        _RoIAlignExt.roi_align_forward(input, rois, output, None, None, ctx.output_size[0], ctx.output_size[1],
                                       ctx.spatial_scale, ctx.sampling_ratio, ctx.pool_mode, ctx.aligned)
        return output


class RoIAlign(torch.nn.Module):
    """mmcv 2.x's layer: output_size kept as a _pair tuple, passed to a forward annotated ``output_size: int``."""

    def __init__(self, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True):
        super().__init__()
        self.output_size, self.spatial_scale = _pair(output_size), float(spatial_scale)
        self.sampling_ratio, self.pool_mode, self.aligned = int(sampling_ratio), pool_mode, aligned

    def forward(self, input, rois):
        return RoIAlignFunction.apply(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                                      self.pool_mode, self.aligned)


def big_rois(n: int, seed: int) -> torch.Tensor:
    """Boxes of at least one cell after spatial_scale 0.5 (where ONNX RoiAlign and mmcv's kernel agree)."""
    r = rois(n, seed)
    r[:, 3:] = r[:, 1:3] + (r[:, 3:] - r[:, 1:3]).clamp(min=2.5)
    return r


def test_mmcv2_roi_align_writes_its_standard_ops_into_the_graph(reg):
    """No name=, no fake=: the symbolic's standard ops stand in the graph as the TorchScript exporter wrote them
    (Squeeze(axes_i=...) is valid before opset 13 only: the ops are converted to the file's opset), the
    tuple where forward annotates int included; parity holds for boxes of a cell or more."""
    bridge.register(RoIAlignFunction, registry=reg)
    model = RoIAlign((3, 2), spatial_scale=0.5, sampling_ratio=2, aligned=True)
    args = (FEAT, big_rois(5, 0))
    proto = bridge.export(model, args, registry=reg, dynamic_shapes=(None, {0: torch.export.Dim("k")}))
    assert not proto.functions and {n.domain for n in proto.graph.node} == {""}
    assert [o.name for o in proto.graph.output] == ["ro_i_align_function"]
    legacy = legacy_export(model, args, 12)
    assert [n.op_type for n in proto.graph.node if n.op_type != "Constant"] == \
        [n.op_type for n in legacy.graph.node if n.op_type != "Constant"]
    ours, theirs = (next(n for n in p.graph.node if n.op_type == "RoiAlign") for p in (proto, legacy))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in ours.attribute}
    assert {k: v for k, v in attrs.items() if k != "coordinate_transformation_mode"} == \
        {a.name: onnx.helper.get_attribute_value(a) for a in theirs.attribute}
    assert attrs["output_height"] == 3 and attrs["output_width"] == 2
    report = bridge.check_parity(model, args, registry=reg, dynamic_shapes=(None, {0: torch.export.Dim("k")}),
                                 extra_args=[(FEAT, big_rois(3, 1))], rtol=1e-4, atol=1e-5)
    assert report.passed, str(report)
    assert report.symbolics == ("test_upstream_functions.RoIAlignFunction",)


def test_a_symbolic_that_disagrees_with_its_forward_is_named(reg):
    """mmcv 2.x's symbolic is not its forward for boxes under one cell (ONNX RoiAlign widens them to one): the
    check fails, and the report names the symbolic as what disagrees, not a kernel."""
    bridge.register(RoIAlignFunction, registry=reg)
    model = RoIAlign((2, 2), spatial_scale=0.5, sampling_ratio=2, aligned=True)
    small = rois(6, 3)
    small[:, 3:] = small[:, 1:3] + 0.6  # NOTE: 0.3 of a cell after spatial_scale
    report = bridge.check_parity(model, (FEAT, small), registry=reg)
    assert not report.passed and report.outputs[0].max_abs > 0.05
    assert "standard ops written by test_upstream_functions.RoIAlignFunction.symbolic stand for its forward here: " \
           "where they compute a failing output, the symbolic disagrees with its own forward" in str(report)


# -- a standard-op symbolic that reads its input's type, as pytorch-quantization's _onnx_int8_helper does -----------
class QuantizeHalfAware(Function):
    @staticmethod
    @symbolic_helper.parse_args("v", "f", "i")
    def symbolic(g, inputs, scale, zero_point):
        input_type = inputs.type().scalarType()
        if input_type == "Half":  # NOTE: Q/DQ constrained to float32 in onnxruntime, as the QAT helper says
            inputs = g.op("Cast", inputs, to_i=onnx.TensorProto.FLOAT)
        s = g.op("Constant", value_t=torch.tensor(scale, dtype=torch.float32))
        zp = g.op("Constant", value_t=torch.tensor(zero_point, dtype=torch.int8))
        out = g.op("DequantizeLinear", g.op("QuantizeLinear", inputs, s, zp), s, zp)
        return g.op("Cast", out, to_i=onnx.TensorProto.FLOAT16) if input_type == "Half" else out

    @staticmethod
    def forward(ctx, inputs, scale, zero_point):
        q = torch.clamp(torch.round(inputs.float() / scale) + zero_point, -128, 127)
        return ((q - zero_point) * scale).to(inputs.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_standard_op_symbolic_sees_its_inputs_types(reg, dtype):
    """The ops a symbolic writes for a float16 input (Cast around Q/DQ) differ from float32's: each call's body is
    run with its tensors typed, as the TorchScript exporter typed them."""
    bridge.register(QuantizeHalfAware, registry=reg)

    class M(torch.nn.Module):
        def forward(self, x):
            return QuantizeHalfAware.apply(x, 0.05, 3)

    x = (torch.randn(4, 6) * 3).to(dtype)
    proto = bridge.export(M(), (x,), registry=reg)
    ops = [n.op_type for n in proto.graph.node if n.op_type != "Constant"]
    assert ops == (["Cast", "QuantizeLinear", "DequantizeLinear", "Cast"] if dtype == torch.float16
                   else ["QuantizeLinear", "DequantizeLinear"])
    bridge.assert_parity(M(), (x,), registry=reg, atol=1e-3)


# -- torch.onnx's symbolic helpers, as upstream symbolics call them ------------------------------------------------
class CropTail(Function):
    """Standard ops through torch.onnx's helpers: the last ``keep`` rows of each item, a unit axis added and
    dropped, the row count read off the input's type, and a shift by symbolic_opset9.sub."""

    @staticmethod
    @symbolic_helper.parse_args("v", "i", "f")
    def symbolic(g, x, keep, shift):
        from torch.onnx.symbolic_opset9 import sub
        rows = symbolic_helper._get_tensor_dim_size(x, 1)
        assert rows is not None and symbolic_helper._get_tensor_sizes(x)[1] == rows and x.node() is not None
        assert isinstance(x.debugName(), str) and isinstance(keep, int)
        tail = symbolic_helper._slice_helper(g, x, axes=[1], starts=[rows - keep], ends=[rows])
        tail = symbolic_helper._squeeze_helper(g, symbolic_helper._unsqueeze_helper(g, tail, [0]), [0])
        size = g.op("Cast", symbolic_helper._size_helper(g, tail, g.op("Constant", value_t=torch.tensor(1))),
                    to_i=onnx.TensorProto.FLOAT)
        out = sub(g, tail, g.op("Constant", value_t=torch.tensor(shift, dtype=torch.float32)))
        return g.op("Add", out, size).setType(x.type())

    @staticmethod
    def forward(ctx, x, keep, shift):
        return x[:, x.shape[1] - keep:] - shift + keep


class TailModel(torch.nn.Module):
    def forward(self, x):
        return CropTail.apply(x, 2, 0.25)


def test_a_symbolic_of_torch_onnx_helpers(reg):
    bridge.register(CropTail, registry=reg)
    x = torch.randn(3, 5)
    proto = bridge.export(TailModel(), (x,), registry=reg, opset_version=17)
    legacy = legacy_export(TailModel(), (x,), 17)
    assert [n.op_type for n in proto.graph.node if n.op_type != "Constant"] == \
        [n.op_type for n in legacy.graph.node if n.op_type != "Constant"]
    assert {"Slice", "Unsqueeze", "Squeeze", "Shape", "Gather", "Sub", "Add"} <= {n.op_type for n in proto.graph.node}
    bridge.assert_parity(TailModel(), (x,), registry=reg, dynamic_shapes=({0: B},), extra_args=[(torch.randn(2, 5),)])


def test_bevdet_quick_cumsum_registered_alone_as_bevdet_ships_it(reg):
    """BEVDet's QuickCumsumCuda has no annotations and BEVDet no samples for it: registered with nothing but its
    node's name, the model's call tells which arguments are tensors and that bev_feat_shape is ints."""
    op = bridge.register(QuickCumsumCuda, name="bevdet::QuickCumsum", registry=reg)
    M = InnerModel
    proto = bridge.export(M(), bev_frame(0), registry=reg, dynamic_shapes=BEV_DYNAMIC)
    node = next(n for n in proto.graph.node if n.domain == "bevdet")
    assert [p.name for p in op.spec.tensors] == ["depth", "feat", "ranks_depth", "ranks_feat", "ranks_bev",
                                                 "interval_starts", "interval_lengths"]
    assert [(a.name, onnx.helper.get_attribute_value(a)) for a in node.attribute] == \
        [("bev_feat_shape", [1, 1, OUT_H, OUT_W, 6])]
    for tier in ("python", "function"):
        bridge.assert_parity(M(), bev_frame(0), registry=reg, tier=tier, dynamic_shapes=BEV_DYNAMIC,
                             extra_args=[bev_frame(3, keep=0.4)])


# -- mmcv 2.x mmcv/ops/roi_align_rotated.py: a symbolic that checks its arguments, and writes output_width_i=out_h --
class RoIAlignRotatedFunction(Function):
    @staticmethod
    def symbolic(g, input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise):
        if isinstance(output_size, int):
            out_h = output_size
            out_w = output_size
        elif isinstance(output_size, tuple):
            assert len(output_size) == 2
            assert isinstance(output_size[0], int)
            assert isinstance(output_size[1], int)
            out_h, out_w = output_size
        else:
            raise TypeError('"output_size" must be an integer or tuple of integers')
        return g.op("mmcv::MMCVRoIAlignRotated", input, rois, output_height_i=out_h, output_width_i=out_h,
                    spatial_scale_f=spatial_scale, sampling_ratio_i=sampling_ratio, aligned_i=aligned,
                    clockwise_i=clockwise)

    @staticmethod
    def forward(ctx, input, rois, output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False):
        ctx.output_size = _pair(output_size)  # NOTE: mmcv's compiled kernel stood in by pooling each roi's image
        pooled = torch.nn.functional.adaptive_avg_pool2d(input, list(ctx.output_size)) * spatial_scale
        return pooled[rois[:, 0].long()] + rois[:, 5, None, None, None]


class FixedRoIAlignRotatedFunction(RoIAlignRotatedFunction):
    """The same Function with the symbolic writing output_width_i=out_w."""

    @staticmethod
    def symbolic(g, input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise):
        out_h, out_w = (output_size, output_size) if isinstance(output_size, int) else output_size
        return g.op("mmcv::MMCVRoIAlignRotated", input, rois, output_height_i=out_h, output_width_i=out_w,
                    spatial_scale_f=spatial_scale, sampling_ratio_i=sampling_ratio, aligned_i=aligned,
                    clockwise_i=clockwise)


class RoIAlignRotated(torch.nn.Module):
    def __init__(self, function, output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False):
        super().__init__()
        self.function, self.output_size, self.spatial_scale = function, _pair(output_size), float(spatial_scale)
        self.sampling_ratio, self.aligned, self.clockwise = int(sampling_ratio), aligned, clockwise

    def forward(self, input, rois):
        return self.function.apply(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                                   self.aligned, self.clockwise)


ROTATED_ARGS = (torch.randn(2, 3, 8, 8), torch.tensor([[0, 1., 2, 3, 4, 0.5], [1, 2, 2, 5, 3, 0.1]]))


@pytest.mark.parametrize("size", [(7, 7), (7, 5)])
def test_mmcv_rotated_roi_align_symbolic_writing_out_h_for_width_is_named(reg, size):
    """The symbolic checks its arguments (isinstance), so it is read with the call's values; it writes output_width
    from output_size[0], so output_size[1] reaches no attribute and no tier could call forward with it: export
    refuses, naming the symbolic and the element (at (7, 7) too: the node cannot tell the two apart)."""
    bridge.register(RoIAlignRotatedFunction, registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"RoIAlignRotatedFunction.symbolic writes no attribute from "
                                                   r"output_size\[1\].*Got output_size=\(7, [75]\).*'output_width', "
                                                   r"'output_size\[0\]'"):
        bridge.export(RoIAlignRotated(RoIAlignRotatedFunction, size, 0.5), ROTATED_ARGS, registry=reg)


@pytest.mark.parametrize("size", [(7, 7), (7, 5), 3])
def test_mmcv_rotated_roi_align_symbolic_that_checks_its_arguments_is_the_node_torchscript_wrote(reg, size):
    bridge.register(FixedRoIAlignRotatedFunction, registry=reg)
    model = RoIAlignRotated(FixedRoIAlignRotatedFunction, size, 0.5)
    model.output_size = size  # NOTE: an int reaches the symbolic's isinstance(output_size, int) branch
    ours = bridge.export(model, ROTATED_ARGS, registry=reg, opset_version=17)
    legacy = legacy_export(model, ROTATED_ARGS, 17)
    (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
    h, w = _pair(size)
    assert node_identity(mine, ours.graph) == node_identity(theirs, legacy.graph)
    assert [(a.name, onnx.helper.get_attribute_value(a)) for a in mine.attribute][:4] == \
        [("aligned", 1), ("clockwise", 0), ("output_height", h), ("output_width", w)]
    bridge.assert_parity(model, ROTATED_ARGS, registry=reg, tier="python")


# -- mmcv 2.2.0 mmcv/ops/deform_conv.py: symbolic keyword defaults (bias=False, im2col_step=32) into attributes,
# a bool into bias_i, _pair tuples into stride_i=; forward sizes its output with int(...) of a helper staticmethod --
class _DeformConvExt:
    """Stands in for mmcv's compiled ``deform_conv_forward``: writes into ``output`` (mask all ones)."""

    @staticmethod
    def deform_conv_forward(input, weight, offset, output, columns, ones, kW, kH, dW, dH, padW, padH, dilationW,
                            dilationH, group, deformable_group, im2col_step):
        mask = offset.new_ones(offset.shape[0], offset.shape[1] // 2, *offset.shape[2:])
        output.copy_(deform_conv2d(input, weight, offset, mask, torch.zeros(weight.shape[0]), dH, dW, padH, padW,
                                   dilationH, dilationW, group, deformable_group, True))


class DeformConv2dFunction(Function):
    @staticmethod
    def symbolic(g, input, offset, weight, stride, padding, dilation, groups, deform_groups, bias=False,
                 im2col_step=32):
        return g.op("mmcv::MMCVDeformConv2d", input, offset, weight, stride_i=stride, padding_i=padding,
                    dilation_i=dilation, groups_i=groups, deform_groups_i=deform_groups, bias_i=bias,
                    im2col_step_i=im2col_step)

    @staticmethod
    def forward(ctx, input, offset, weight, stride=1, padding=0, dilation=1, groups: int = 1, deform_groups: int = 1,
                bias: bool = False, im2col_step: int = 32):
        if input is not None and input.dim() != 4:
            raise ValueError(f"Expected 4D tensor as input, got {input.dim()}D tensor instead.")
        assert bias is False, "Only support bias is False."
        ctx.stride, ctx.padding, ctx.dilation = _pair(stride), _pair(padding), _pair(dilation)
        ctx.groups, ctx.deform_groups, ctx.im2col_step = groups, deform_groups, im2col_step
        ctx.device = input.device.type
        input = input.type_as(offset)
        weight = weight.type_as(input)
        ctx.save_for_backward(input, offset, weight)
        output = input.new_empty([int(i) for i in DeformConv2dFunction._output_size(ctx, input, weight)])
        ctx.bufs_ = [input.new_empty(0), input.new_empty(0)]  # columns, ones
        cur_im2col_step = min(ctx.im2col_step, input.size(0))
        assert (input.size(0) % cur_im2col_step) == 0, "batch size must be divisible by im2col_step"
        _DeformConvExt.deform_conv_forward(
            input, weight, offset, output, ctx.bufs_[0], ctx.bufs_[1], kW=weight.size(3), kH=weight.size(2),
            dW=ctx.stride[1], dH=ctx.stride[0], padW=ctx.padding[1], padH=ctx.padding[0], dilationW=ctx.dilation[1],
            dilationH=ctx.dilation[0], group=ctx.groups, deformable_group=ctx.deform_groups,
            im2col_step=cur_im2col_step)
        return output

    @staticmethod
    def _output_size(ctx, input, weight):
        channels = weight.size(0)
        output_size = (input.size(0), channels)
        for d in range(input.dim() - 2):
            in_size = input.size(d + 2)
            pad = ctx.padding[d]
            kernel = ctx.dilation[d] * (weight.size(d + 2) - 1) + 1
            stride_ = ctx.stride[d]
            output_size += ((in_size + (2 * pad) - kernel) // stride_ + 1,)
        if not all(map(lambda s: s > 0, output_size)):
            raise ValueError("convolution input is too small (output would be " + "x".join(map(str, output_size)) + ")")
        return output_size


class DeformConv2d(torch.nn.Module):
    """mmcv's DeformConv2d layer (offsets from the caller), its attributes as its __init__ keeps them."""

    def __init__(self, in_channels=4, out_channels=3, kernel_size=3, stride=1, padding=1, deform_groups=1):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.kernel_size, self.stride, self.padding = _pair(kernel_size), _pair(stride), _pair(padding)
        self.dilation, self.groups, self.deform_groups, self.im2col_step = _pair(1), 1, deform_groups, 32
        self.weight = torch.nn.Parameter(torch.randn(out_channels, in_channels, *self.kernel_size, generator=g))

    def forward(self, x, offset):
        return DeformConv2dFunction.apply(x, offset, self.weight, self.stride, self.padding, self.dilation,
                                          self.groups, self.deform_groups, False, self.im2col_step)


def test_mmcv_deform_conv_v1_keyword_defaults_and_a_bool_are_the_node_torchscript_wrote(reg, monkeypatch):
    """The symbolic's keyword defaults are attributes (im2col_step=32), False is bias_i=0, the layer's _pair tuples
    INTS: the node the TorchScript exporter wrote. forward's stand-in makes tensors without device= (as the
    CUDA extension's callers never needed to): the node's shape inference runs it on CPU fake tensors."""
    bridge.register(DeformConv2dFunction, registry=reg)
    model = DeformConv2d(deform_groups=2)
    args = (torch.randn(2, 4, 6, 5), torch.randn(2, 36, 6, 5))
    ours = bridge.export(model, args, registry=reg, opset_version=17)
    bridge.assert_parity(model, args, registry=reg, tier="python", rtol=1e-4, atol=1e-4)
    # NOTE: forward's int(...) of its sizes and its im2col_step assert fix the batch when it runs on fake tensors:
    # a dynamic batch takes fake= (the real extension needs it anyway)
    dynamic = bridge.Registry()
    bridge.register(DeformConv2dFunction, registry=dynamic, fake=lambda x, offset, weight, stride, padding, *rest:
                    deform_fake(x, offset, None, weight, None, stride, padding))
    bridge.assert_parity(model, args, registry=dynamic, tier="python", rtol=1e-4, atol=1e-4,
                         dynamic_shapes=({0: B}, {0: B}),
                         extra_args=[(torch.randn(3, 4, 6, 5), torch.randn(3, 36, 6, 5))])
    # NOTE: as for ModulatedDeformConv2dFunction above, the TorchScript exporter cannot trace the stand-in's sizes
    shape = model(*args).shape
    monkeypatch.setattr(DeformConv2dFunction, "forward", staticmethod(lambda ctx, *a: torch.zeros(shape)))
    legacy = legacy_export(model, args, 17)
    (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in mine.attribute}
    assert (attrs["bias"], attrs["im2col_step"], attrs["stride"], attrs["deform_groups"]) == (0, 32, [1, 1], 2)


# -- mmcv 2.2.0 mmcv/ops/nms.py SoftNMSop: g.op(..., outputs=2), forward returning a tuple, float()/int() of the
# arguments inside symbolic, an output of data-dependent length -------------------------------------------------
class _SoftNMSExt:
    """Stands in for mmcv's compiled ``softnms`` (CPU): writes the rescored boxes into ``dets``, returns the kept
    indices, best first."""

    @staticmethod
    def softnms(boxes, scores, dets, iou_threshold, sigma, min_score, method, offset):
        x1, y1, x2, y2 = boxes.unbind(1)
        areas = (x2 - x1 + offset) * (y2 - y1 + offset)
        scores, live, keep = scores.clone(), list(range(len(boxes))), []
        while live:
            best = max(live, key=lambda j: (float(scores[j]), -j))
            keep.append(best)
            live.remove(best)
            rest = torch.tensor(live, dtype=torch.long)
            w = (torch.minimum(x2[best], x2[rest]) - torch.maximum(x1[best], x1[rest]) + offset).clamp(min=0)
            h = (torch.minimum(y2[best], y2[rest]) - torch.maximum(y1[best], y1[rest]) + offset).clamp(min=0)
            iou = w * h / (areas[best] + areas[rest] - w * h)
            weight = (torch.where(iou > iou_threshold, 1 - iou, 1.0) if method == 1 else
                      torch.exp(-iou * iou / sigma) if method == 2 else (iou <= iou_threshold).float())
            scores[rest] *= weight
            live = [j for j in live if scores[j] >= min_score]
        dets[:len(keep), :4], dets[:len(keep), 4] = boxes[keep], scores[keep]
        return torch.tensor(keep, dtype=torch.long)


class SoftNMSop(Function):
    @staticmethod
    def forward(ctx, boxes, scores, iou_threshold: float, sigma: float, min_score: float, method: int, offset: int):
        dets = boxes.new_empty((boxes.size(0), 5), device="cpu")
        inds = _SoftNMSExt.softnms(boxes.cpu(), scores.cpu(), dets.cpu(), iou_threshold=float(iou_threshold),
                                   sigma=float(sigma), min_score=float(min_score), method=int(method),
                                   offset=int(offset))
        return dets, inds

    @staticmethod
    def symbolic(g, boxes, scores, iou_threshold, sigma, min_score, method, offset):
        from packaging import version
        assert version.parse(torch.__version__) >= version.parse("1.7.0")
        nms_out = g.op("mmcv::SoftNonMaxSuppression", boxes, scores, iou_threshold_f=float(iou_threshold),
                       sigma_f=float(sigma), min_score_f=float(min_score), method_i=int(method), offset_i=int(offset),
                       outputs=2)
        return nms_out


def soft_nms(boxes, scores, iou_threshold=0.3, sigma=0.5, min_score=1e-3, method="linear", offset=0):
    """mmcv's soft_nms (tensors only): the Function's dets cut to the kept count."""
    method_dict = {"naive": 0, "linear": 1, "gaussian": 2}
    dets, inds = SoftNMSop.apply(boxes.cpu(), scores.cpu(), float(iou_threshold), float(sigma), float(min_score),
                                 method_dict[method], int(offset))
    dets = dets[:inds.size(0)]
    return dets.to(device=boxes.device), inds.to(device=boxes.device)


class SoftNMSModel(torch.nn.Module):
    def __init__(self, method="linear"):
        super().__init__()
        self.method = method

    def forward(self, boxes, scores):
        return soft_nms(boxes, scores, 0.3, sigma=0.5, min_score=0.05, method=self.method)


def soft_nms_fake(boxes, scores, *rest):  # NOTE: mmcv's kernel keeps a data-dependent count
    return boxes.new_empty(boxes.size(0), 5), boxes.new_empty(torch.library.get_ctx().new_dynamic_size(),
                                                              dtype=torch.long)


def soft_nms_case(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    corner = torch.rand(n, 2, generator=g) * 20
    return torch.cat((corner, corner + 2 + torch.rand(n, 2, generator=g) * 8), 1), torch.rand(n, generator=g)


@pytest.mark.parametrize("method", ["linear", "gaussian"])
def test_mmcv_soft_nms_two_outputs_of_data_dependent_length(reg, method):
    bridge.register(SoftNMSop, registry=reg, fake=soft_nms_fake)
    model, args = SoftNMSModel(method), soft_nms_case(12, 0)
    n = torch.export.Dim("n")
    ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=({0: n}, {0: n}))
    legacy = legacy_export(model, args, 17)
    (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
    # NOTE: inputs not compared: the TorchScript exporter writes soft_nms's boxes.cpu() as nodes before it
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    assert [a.name for a in mine.attribute] == ["iou_threshold", "method", "min_score", "offset", "sigma"]
    assert len(mine.output) == len(theirs.output) == 2
    bridge.assert_parity(model, args, registry=reg, tier="python", dynamic_shapes=({0: n}, {0: n}),
                         extra_args=[soft_nms_case(7, 1), soft_nms_case(30, 2)])


class Twice(Function):
    """float(k) * 2 and not flag: attributes computed from arguments, which no probe maps back."""

    @staticmethod
    def symbolic(g, x, k, flag):
        return g.op("mine::Twice", x, k_f=float(k) * 2, flag_i=not flag)

    @staticmethod
    def forward(ctx, x, k, flag):
        return x if flag else x * k * 2


def test_attributes_computed_from_float_of_an_argument_are_still_refused(reg):
    bridge.register(Twice, registry=reg)

    class M(torch.nn.Module):
        def forward(self, x):
            return Twice.apply(x, 1.5, False)

    with pytest.raises(bridge.OpBridgeError, match=r"Twice\.symbolic never passes argument\(s\) \['k', 'flag'\]"):
        bridge.export(M(), (torch.randn(3),), registry=reg)


# -- mmdeploy 1.3.1 mmdeploy/mmcv/ops/nms.py TRTBatchedNMSop: outputs=3 or 2 as a bool argument says, attributes
# written from constants (is_normalized_i=False) and from an argument renamed (topk_i=pre_topk), a tuple returned --
def _trt_batched_nms(boxes, scores, num_classes, pre_topk, after_topk, iou_threshold, score_threshold,
                     background_label_id=-1, return_index=False):
    """Stands in for TensorRT's batchedNMS plugin (mmdeploy's own forward returns random tensors of the output
    shapes): per class NMS above score_threshold, the best after_topk per image, padded with zeros and label -1."""
    batch, num_boxes, _ = scores.shape
    k = min(num_boxes, after_topk)
    dets, labels = scores.new_zeros(batch, k, 5), torch.full((batch, k), -1, dtype=torch.long)
    index = torch.full((batch, k), -1, dtype=torch.long)
    for b in range(batch):
        found = []
        for c in range(num_classes):
            s = scores[b, :, c]
            kept = vision_nms(boxes[b, :, 0], s, iou_threshold)
            found += [(float(s[i]), c, int(i)) for i in kept if s[i] > score_threshold]
        found = sorted(found, key=lambda t: (-t[0], t[1], t[2]))[:k]
        for j, (score, c, i) in enumerate(found):
            dets[b, j, :4], dets[b, j, 4], labels[b, j], index[b, j] = boxes[b, i, 0], score, c, i
    return (dets, labels, index) if return_index else (dets, labels)


class TRTBatchedNMSop(Function):
    @staticmethod
    def forward(ctx, boxes, scores, num_classes: int, pre_topk: int, after_topk: int, iou_threshold: float,
                score_threshold: float, background_label_id: int = -1, return_index: bool = False):
        return _trt_batched_nms(boxes, scores, num_classes, pre_topk, after_topk, iou_threshold, score_threshold,
                                background_label_id, return_index)

    @staticmethod
    def symbolic(g, boxes, scores, num_classes: int, pre_topk: int, after_topk: int, iou_threshold: float,
                 score_threshold: float, background_label_id: int = -1, return_index: bool = False):
        return g.op("mmdeploy::TRTBatchedNMS", boxes, scores, num_classes_i=num_classes,
                    background_label_id_i=background_label_id, iou_threshold_f=iou_threshold,
                    score_threshold_f=score_threshold, topk_i=pre_topk, keep_topk_i=after_topk, is_normalized_i=False,
                    clip_boxes_i=False, return_index_i=return_index, outputs=3 if return_index else 2)


class MulticlassNMSStatic(torch.nn.Module):
    """mmdeploy's multiclass_nms_static (its TensorRT rewrite of _multiclass_nms), defaults as mmdet configs pass."""

    def __init__(self, output_index=False, max_output_boxes_per_class=5, iou_threshold=0.5, score_threshold=0.05,
                 pre_top_k=-1, keep_top_k=4):
        super().__init__()
        self.output_index, self.max_output_boxes_per_class = output_index, max_output_boxes_per_class
        self.iou_threshold, self.score_threshold = iou_threshold, score_threshold
        self.pre_top_k, self.keep_top_k = pre_top_k, keep_top_k

    def forward(self, boxes, scores):
        boxes = boxes if boxes.dim() == 4 else boxes.unsqueeze(2)
        keep_top_k = self.max_output_boxes_per_class if self.keep_top_k < 0 else min(
            self.max_output_boxes_per_class, self.keep_top_k)
        nms_output = TRTBatchedNMSop.apply(boxes, scores, int(scores.shape[-1]), self.pre_top_k, keep_top_k,
                                           self.iou_threshold, self.score_threshold, -1, self.output_index)
        dets, labels = nms_output[0], nms_output[1]
        box_index = None if len(nms_output) <= 2 else nms_output[2]
        batch_size = boxes.size(0)
        dets = dets.reshape([batch_size, *dets.shape[1:]])
        labels = labels.reshape([batch_size, *labels.shape[1:]])
        return (dets, labels, box_index) if self.output_index else (dets, labels)


def trt_batched_nms_fake(boxes, scores, num_classes, pre_topk, after_topk, iou_threshold, score_threshold,
                         background_label_id=-1, return_index=False):
    k = min(scores.shape[1], after_topk)
    outs = (scores.new_empty(scores.shape[0], k, 5), scores.new_empty(scores.shape[0], k, dtype=torch.long))
    return outs + (scores.new_empty(scores.shape[0], k, dtype=torch.long),) if return_index else outs


def batched_nms_case(batch: int, seed: int, n: int = 9, classes: int = 3):
    boxes, _ = soft_nms_case(batch * n, seed)
    g = torch.Generator().manual_seed(seed)
    return boxes.reshape(batch, n, 4), torch.rand(batch, n, classes, generator=g)


@pytest.mark.parametrize("output_index", [False, True], ids=["dets-labels", "with-index"])
def test_mmdeploy_trt_batched_nms_outputs_as_a_bool_argument_says(reg, output_index):
    bridge.register(TRTBatchedNMSop, registry=reg, fake=trt_batched_nms_fake)
    model, args = MulticlassNMSStatic(output_index), batched_nms_case(2, 0)
    ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=({0: B}, {0: B}))
    legacy = legacy_export(model, args, 17)
    (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    assert len(mine.output) == len(theirs.output) == (3 if output_index else 2)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in mine.attribute}
    assert (attrs["is_normalized"], attrs["topk"], attrs["keep_topk"], attrs["num_classes"]) == (0, -1, 4, 3)
    bridge.assert_parity(model, args, registry=reg, tier="python", dynamic_shapes=({0: B}, {0: B}),
                         extra_args=[batched_nms_case(3, 1)])


def test_mmdeploy_trt_batched_nms_min_of_box_count_and_keep_top_k_stays_dynamic(reg):
    """The fake's ``min(num_boxes, after_topk)`` (mmdeploy's forward computes ``out_boxes`` so) with a dynamic box
    count: the outputs' dim is that min, not the example's keep_top_k (before: torch.onnx's second trace ran the
    fake with Python's min on the example sizes and the file declared 4 rows, also for 3 boxes)."""
    bridge.register(TRTBatchedNMSop, registry=reg, fake=trt_batched_nms_fake)
    n = torch.export.Dim("n")
    model, args, shapes = MulticlassNMSStatic(), batched_nms_case(2, 0, n=9), ({0: B, 1: n}, {0: B, 1: n})
    proto = bridge.export(model, args, registry=reg, dynamic_shapes=shapes)
    rows = {o.name: o.type.tensor_type.shape.dim[1].dim_param for o in proto.graph.output}
    assert all(r.replace(" ", "") == "Min(4,n)" for r in rows.values()), rows
    few = batched_nms_case(2, 1, n=3)
    report = bridge.check_parity(model, few, registry=reg, tier="python", dynamic_shapes=shapes)
    # NOTE: check_parity also compares the file's declared dims with eager's (3 rows, where 4 were declared)
    assert report.passed and [tuple(o.shape) for o in report.outputs] == [(2, 3, 5), (2, 3)], report


# -- mmdeploy 1.3.1 mmdeploy/mmcv/ops/nms.py ONNXNMSop: a standard-op symbolic branching on _is_value (the caller
# passes thresholds as tensors, the box count as an int), an output of data-dependent length -------------------
def _mmcv_nms(boxes, scores, iou_threshold, offset=0, score_threshold=0, max_num=-1):
    """Stands in for mmcv.ops.nms (its NMSop and compiled kernel): the kept indices, best first."""
    valid = torch.nonzero(scores > score_threshold, as_tuple=False).squeeze(1)
    inds = valid[vision_nms(boxes[valid], scores[valid], iou_threshold)]
    return None, inds[:max_num] if max_num > 0 else inds


class ONNXNMSop(Function):
    @staticmethod
    def forward(ctx, boxes, scores, max_output_boxes_per_class: int, iou_threshold: float, score_threshold: float):
        batch_size, num_class, _ = scores.shape
        score_threshold = float(score_threshold)
        iou_threshold = float(iou_threshold)
        indices = []
        for batch_id in range(batch_size):
            for cls_id in range(num_class):
                _boxes = boxes[batch_id, ...]
                _scores = scores[batch_id, cls_id, ...].contiguous()
                _, box_inds = _mmcv_nms(_boxes, _scores, iou_threshold, offset=0, score_threshold=score_threshold,
                                        max_num=max_output_boxes_per_class)
                batch_inds = torch.zeros_like(box_inds) + batch_id
                cls_inds = torch.zeros_like(box_inds) + cls_id
                indices.append(torch.stack([batch_inds, cls_inds, box_inds], dim=-1))
        indices = torch.cat(indices)
        return indices

    @staticmethod
    def symbolic(g, boxes, scores, max_output_boxes_per_class: int, iou_threshold: float, score_threshold: float):
        if not symbolic_helper._is_value(max_output_boxes_per_class):
            max_output_boxes_per_class = g.op("Constant", value_t=torch.tensor(max_output_boxes_per_class,
                                                                               dtype=torch.long))
        if not symbolic_helper._is_value(iou_threshold):
            iou_threshold = g.op("Constant", value_t=torch.tensor([iou_threshold], dtype=torch.float))
        if not symbolic_helper._is_value(score_threshold):
            score_threshold = g.op("Constant", value_t=torch.tensor([score_threshold], dtype=torch.float))
        return g.op("NonMaxSuppression", boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold)


class MulticlassNMS(torch.nn.Module):
    """mmdeploy's _multiclass_nms up to the Function (torch >= 1.13): thresholds made tensors, scores permuted."""

    def __init__(self, max_output_boxes_per_class=3, iou_threshold=0.5, score_threshold=0.05):
        super().__init__()
        self.max_output_boxes_per_class = max_output_boxes_per_class
        self.iou_threshold, self.score_threshold = iou_threshold, score_threshold

    def forward(self, boxes, scores):
        iou_threshold = torch.tensor([self.iou_threshold], dtype=torch.float32)
        score_threshold = torch.tensor([self.score_threshold], dtype=torch.float32)
        scores = scores.permute(0, 2, 1)
        return ONNXNMSop.apply(boxes, scores, self.max_output_boxes_per_class, iou_threshold, score_threshold)


def onnx_nms_fake(boxes, scores, *rest):  # NOTE: mmcv's nms keeps a data-dependent count
    return boxes.new_empty(torch.library.get_ctx().new_dynamic_size(), 3, dtype=torch.long)


def test_mmdeploy_onnx_nms_standard_op_symbolic_branching_on_is_value(reg, monkeypatch):
    """The thresholds reach the symbolic as graph values (_is_value: passed on as they are), the box count as an
    int (a Constant): NonMaxSuppression is written into the graph, and onnxruntime's agrees with forward."""
    bridge.register(ONNXNMSop, registry=reg, fake=onnx_nms_fake)
    model, args = MulticlassNMS(), batched_nms_case(2, 0)
    ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=({0: B}, {0: B}))
    assert [n.op_type for n in ours.graph.node if n.op_type == "NonMaxSuppression"] == ["NonMaxSuppression"]
    assert not list(custom_nodes(ours))
    for tier in ("python", "function"):
        bridge.assert_parity(model, args, registry=reg, tier=tier, dynamic_shapes=({0: B}, {0: B}),
                             extra_args=[batched_nms_case(3, 1), batched_nms_case(1, 2)])
    # NOTE: the TorchScript exporter cannot trace the stand-in's loops; its node comes from symbolic alone
    shape = model(*args).shape
    monkeypatch.setattr(ONNXNMSop, "forward", staticmethod(lambda ctx, *a: torch.zeros(shape, dtype=torch.long)))
    legacy = legacy_export(model, args, 17)
    mine, theirs = (next(n for n in p.graph.node if n.op_type == "NonMaxSuppression") for p in (ours, legacy))
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    assert len(mine.input) == len(theirs.input) == 5


class MaxWithIndex(Function):
    """A standard-op symbolic leaving its second output unwritten, as torchvision's roi_pool symbolic does."""

    @staticmethod
    def forward(ctx, x, k: int = 2):
        return torch.nn.functional.max_pool2d(x, k, return_indices=True)

    @staticmethod
    def symbolic(g, x, k=2):
        return g.op("MaxPool", x, kernel_shape_i=[k, k], strides_i=[k, k]), None


def test_a_named_custom_node_whose_symbolic_leaves_an_output_unwritten_is_refused_at_registration(reg):
    """Before: name= made a custom node whose body gave the int64 indices a float placeholder, and the function
    tier's session failed in onnxruntime ("Type (tensor(int64)) of output arg ... does not match"). Now refused
    when registered, naming the output and both ways that work."""
    with pytest.raises(bridge.OpBridgeError, match=r"MaxWithIndex\.symbolic returns None for output\(s\) \[1\], which "
                                            r"custom node mine::max_with_index must give.*Register it without name="):
        bridge.register(MaxWithIndex, name="mine::max_with_index", registry=reg)
    bridge.register(MaxWithIndex, registry=reg)

    class Model(torch.nn.Module):
        def forward(self, x):
            out, _ = MaxWithIndex.apply(x, 2)
            return out * 2

    x = torch.randn(1, 2, 6, 6)
    proto = bridge.export(Model(), (x,), registry=reg)
    assert [n.op_type for n in proto.graph.node] == ["MaxPool", "Mul"] and not proto.functions
    bridge.assert_parity(Model(), (x,), registry=reg)


class IntervalSum(Function):
    """BEVFusion's QuickCumsumCuda forward shape (mmdet3d/ops/bev_pool/bev_pool.py): interval starts from a mask
    (``torch.where(kept)[0]``, a size computed from data) inside, a statically shaped output."""

    @staticmethod
    def forward(ctx, x, ranks, cells: int):
        kept = torch.ones(x.shape[0], device=x.device, dtype=torch.bool)
        kept[1:] = ranks[1:] != ranks[:-1]
        interval_starts = torch.where(kept)[0].int()
        out = x.new_zeros(cells, x.shape[1])
        out.index_add_(0, ranks, x)
        return out + interval_starts.numel() * 0


def test_a_forward_with_a_size_computed_from_data_inside_exports_and_runs(reg):
    """Before: export stopped in torch's raw PendingUnbackedSymbolNotFound (the forward, run as its node's fake,
    made a size from data it does not return); torch.onnx.export(dynamo=True) exports it."""
    bridge.register(IntervalSum, name="bevfusion::interval_sum", registry=reg)

    class Model(torch.nn.Module):
        def forward(self, x, ranks):
            return IntervalSum.apply(x, ranks, 6) * 2

    args = (torch.randn(10, 3), torch.tensor([0, 0, 1, 1, 2, 3, 3, 3, 4, 5]))
    proto = bridge.export(Model(), args, registry=reg)
    assert [n.op_type for n in proto.graph.node if n.domain == "bevfusion"] == ["interval_sum"]
    for tier in ("python", "function"):
        bridge.assert_parity(Model(), args, registry=reg, tier=tier)


class GridSum(Function):
    """BEVFusion's QuickCumsumCuda call shape (``QuickCumsumCuda.apply(x, geom_feats, ranks, B, D, H, W)``): one
    model passes a value as an element of a Parameter (BaseTransform's ``self.nx[2]``), another as a number."""

    @staticmethod
    def forward(ctx, x, ranks, cells, weight):
        return x.new_zeros(cells, x.shape[1]).index_add_(0, ranks, x) * weight


class GridModel(torch.nn.Module):
    def __init__(self, as_parameter: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5, 2.0]), requires_grad=False) if as_parameter else None

    def forward(self, x, ranks):
        return GridSum.apply(x, ranks, 6, self.w[1] if self.w is not None else 2.0)


@pytest.mark.parametrize("first", [True, False])
def test_one_function_called_with_a_tensor_and_with_a_number_for_one_argument_is_refused_clearly(reg, first):
    """Before: torch's raw 'Expected a value of type 'Tensor' for argument 'weight' but instead found type
    'float'' from the node's proxy op (the node's signature is the first call's). Now refused naming the argument,
    both kinds and the two fixes; another registry takes the other kind."""
    bridge.register(GridSum, name="bevfusion::grid_sum", registry=reg)
    args = (torch.randn(10, 3), torch.tensor([0, 0, 1, 1, 2, 3, 3, 3, 4, 5]))
    bridge.assert_parity(GridModel(first), args, registry=reg, tier="python")
    kind = (r"a float attribute .* Got weight: a tensor of shape \[\]\. Pass a Python float \(\.item\(\)\)"
            if not first else r"a tensor input .* Got weight: float 2\.0\. Pass a tensor \(torch\.tensor\(\.\.\.\)\)")
    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: .*GridSum: argument 'weight' is " + kind +
                       r" as that call did, or register the Function in another registry"):
        bridge.export(GridModel(not first), args, registry=reg)
    other = bridge.Registry()
    bridge.register(GridSum, name="bevfusion::grid_sum", registry=other)
    for tier in ("python", "function"):
        bridge.assert_parity(GridModel(not first), args, registry=other, tier=tier)


# -- BEVFormer_tensorrt det2trt/models/functions/multi_head_attn.py: the FP16 plugin class subclasses the FP32 one ---
class _QKV(Function):
    @staticmethod
    def symbolic(g, query, key, value):
        return g.op("QKVTRT", query, key, value)

    @staticmethod
    def forward(ctx, query, key, value):
        query = query / math.sqrt(query.shape[-1])
        return torch.matmul(torch.matmul(query, key.permute(0, 2, 1)).softmax(-1), value)


class _QKV2(_QKV):
    @staticmethod
    def symbolic(g, query, key, value):
        return g.op("QKVTRT2", query, key, value)


class HeadAttention(torch.nn.Module):
    """MultiheadAttentionTRT's shape: in_proj, heads folded into the batch, qkv, out_proj."""

    def __init__(self, qkv, e=16, h=2):
        super().__init__()
        self.inp, self.out, self.h, self.qkv = torch.nn.Linear(e, 3 * e), torch.nn.Linear(e, e), h, qkv

    def forward(self, x):
        b, n, e = x.shape
        q, k, v = self.inp(x).chunk(3, -1)

        def heads(t):
            return t.reshape(b, n, self.h, e // self.h).transpose(1, 2).reshape(b * self.h, n, e // self.h)

        o = self.qkv(heads(q), heads(k), heads(v))
        return self.out(o.reshape(b, self.h, n, e // self.h).transpose(1, 2).reshape(b, n, e))


def test_a_function_inheriting_its_parents_forward_gets_its_own_body(reg):
    """Before: with both plugin classes registered, the subclass's body was traced through the parent's export
    forward (swapped in first, then read as the subclass's own) and torch.onnx could not translate it: no body,
    the function tier refused trt::QKVTRT2. Now each class's own forward is read before any is swapped."""
    bridge.register(_QKV, symbolic=False, name="trt::QKVTRT", registry=reg)
    bridge.register(_QKV2, symbolic=False, name="trt::QKVTRT2", registry=reg)
    torch.manual_seed(0)
    x, dims = torch.randn(1, 50, 16), ({1: torch.export.Dim("L", min=2)},)
    for qkv, name in ((_QKV2.apply, "QKVTRT2"), (_QKV.apply, "QKVTRT")):
        model = HeadAttention(qkv).eval()
        proto = bridge.export(model, (x,), registry=reg, dynamic_shapes=dims)
        assert [f.name for f in proto.functions] == [name]
        got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {proto.graph.input[0].name: x.numpy()})[0]
        np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
        bridge.assert_parity(model, (x,), registry=reg, tier="function", dynamic_shapes=dims,
                             extra_args=[(torch.randn(1, 30, 16),)])


class GridPoints(Function):
    """mmcv's _Voxelization shape (mmcv/ops/voxelize.py): an argument whose kind only the call tells
    (``voxel_size: Union[tuple, float]``), and a return annotation naming the outputs."""

    @staticmethod
    def forward(ctx, points: torch.Tensor, voxel_size: Union[tuple, float]) -> Tuple[torch.Tensor, torch.Tensor]:  # noqa: UP006, UP007
        cells = torch.floor(points[:, :2] / torch.tensor(voxel_size))
        return cells, points[:, 2:] * 2


def test_a_function_described_at_its_first_call_has_the_outputs_its_annotation_names(reg):
    """Before: described at its first call in an export (the kind of voxel_size only the call tells), the node had
    1 output: the annotation was read from the export forward swapped in, and export said to annotate it."""
    bridge.register(GridPoints, name="mmcv::grid_points", registry=reg)

    class Model(torch.nn.Module):
        def forward(self, points):
            cells, rest = GridPoints.apply(points, [0.5, 0.25])
            return cells.sum(1), rest

    points = torch.randn(20, 4)
    proto = bridge.export(Model(), (points,), registry=reg)
    assert [len(n.output) for n in proto.graph.node if n.domain == "mmcv"] == [2]
    for tier in ("python", "function"):
        bridge.assert_parity(Model(), (points,), registry=reg, tier=tier)


# -- mmdeploy mmdeploy/codebase/mmrotate/models/roi_heads/roi_extractors.py: forward(g, *args) ----------------------
class MultiLevelRotatedRoiAlign(Function):
    def __init__(self) -> None:
        super().__init__()

    @staticmethod
    def symbolic(g, *args):
        aligned = args[-1]
        featmap_strides = args[-2]
        finest_scale = args[-3]
        roi_scale_factor = args[-4]
        sampling_ratio = args[-5]
        clockwise = args[-6]
        output_size = args[-7]
        inputs = args[:len(featmap_strides)]
        rois = args[len(featmap_strides)]
        return g.op('mmdeploy::MMCVMultiLevelRotatedRoiAlign', rois, *inputs, output_height_i=output_size[1],
                    output_width_i=output_size[0], clockwise_i=clockwise, sampling_ratio_i=sampling_ratio,
                    roi_scale_factor_f=roi_scale_factor, finest_scale_i=finest_scale,
                    featmap_strides_f=featmap_strides, aligned_i=aligned)

    @staticmethod
    def forward(g, *args):
        featmap_strides = args[-2]
        output_size = args[-7]
        inputs = args[:len(featmap_strides)]
        rois = args[len(featmap_strides)]
        # NOTE: mmdeploy's forward returns rois.new_zeros(...) (TensorRT computes it); a value from every feature map
        # stands in, so parity compares something
        pooled = sum(f.mean((2, 3)) / s for f, s in zip(inputs, featmap_strides))
        return pooled[:, :, None, None].expand(rois.shape[0], -1, output_size[1], output_size[0]) + rois[:, :1, None, None]


class RotatedExtractor(torch.nn.Module):
    """mmdeploy's rotated_single_roi_extractor__forward__tensorrt call: the feature maps spread, then the settings."""

    featmap_strides, finest_scale = [4, 8], 56

    def forward(self, f0, f1, rois):
        out_size, sampling_ratio, clockwise, aligned = (7, 7), 2, True, True
        featmap_strides = [float(s) for s in self.featmap_strides]
        return MultiLevelRotatedRoiAlign.apply(f0, f1, rois, out_size, clockwise, sampling_ratio, 1.0,
                                               self.finest_scale, featmap_strides, aligned)


def test_a_function_whose_forward_takes_star_args_exports_the_node_its_symbolic_writes(reg):
    """Before: register refused forward(g, *args) ('Name each argument'), and export's warning suggested that
    register. Now the first call names the arguments (args_0, ...): the node as mmdeploy's symbolic writes it."""
    bridge.register(MultiLevelRotatedRoiAlign, registry=reg)
    args = (torch.randn(1, 4, 16, 16), torch.randn(1, 4, 8, 8), torch.rand(5, 6) * 30)
    proto = bridge.export(RotatedExtractor(), args, registry=reg)
    node = next(n for n in proto.graph.node if n.domain == "mmdeploy")
    names = [i.name for i in proto.graph.input]
    assert node.op_type == "MMCVMultiLevelRotatedRoiAlign" and list(node.input) == [names[2], names[0], names[1]]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {
        "aligned": 1, "clockwise": 1, "featmap_strides": [4.0, 8.0], "finest_scale": 56, "output_height": 7,
        "output_width": 7, "roi_scale_factor": 1.0, "sampling_ratio": 2}
    for tier in ("python", "function"):
        bridge.assert_parity(RotatedExtractor(), args, registry=reg, tier=tier)

    class OneLevel(torch.nn.Module):  # NOTE: a head with another count of feature maps: another node signature
        def forward(self, f0, rois):
            return MultiLevelRotatedRoiAlign.apply(f0, rois, (7, 7), True, 2, 1.0, 56, [4.0], True)

    with pytest.raises(bridge.OpBridgeError, match=r"MultiLevelRotatedRoiAlign\.apply: forward takes \*args, whose "
                       r"count the first call in this registry fixed for the node \(10 arguments\)\. Got 9 arguments\. "
                       r"Pass as many, or register the Function in another registry"):
        bridge.export(OneLevel(), (args[0], args[2]), registry=reg)


class SplitAt(Function):
    """No symbolic, two tensors returned, annotated as mmcv's _DynamicScatter.forward is."""

    @staticmethod
    def forward(ctx, feats: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return feats[:, :k] * 2, feats[:, k:] + 1


class SplitUntold(Function):
    @staticmethod
    def forward(ctx, feats: torch.Tensor, k: int):
        return feats[:, :k] * 2, feats[:, k:] + 1


def test_a_function_without_symbolic_has_the_outputs_its_return_annotation_names(reg):
    """Before: one output always, and export said "forward returned ['FakeTensor', 'FakeTensor']; the node has 1
    tensor output(s)" (mmcv's _DynamicScatter, registered with name=)."""
    bridge.register(SplitAt, name="mine::split_at", registry=reg)

    class Model(torch.nn.Module):
        def forward(self, x):
            a, b = SplitAt.apply(x, 2)
            return a * b.sum()

    args = (torch.randn(3, 5),)
    proto = bridge.export(Model(), args, registry=reg)
    assert [len(n.output) for n in proto.graph.node if n.domain == "mine"] == [2]
    for tier in ("python", "function"):
        bridge.assert_parity(Model(), args, registry=reg, tier=tier)
    bridge.register(SplitUntold, name="mine::split_untold", registry=reg)

    class Untold(torch.nn.Module):
        def forward(self, x):
            return SplitUntold.apply(x, 2)

    with pytest.raises(bridge.OpBridgeError, match=r"SplitUntold: forward returned \['FakeTensor', 'FakeTensor'\]; "
                                                   r"the node has 1 tensor output\(s\) \(without symbolic, as many as "
                                                   r"forward's return annotation names"):
        bridge.export(Untold(), args, registry=reg)


class GridSampler2D(Function):
    """BEVFormer_tensorrt's _GridSampler2D (det2trt/models/functions/grid_sampler.py): a TensorRT plugin's node
    written in ONNX's own domain."""

    @staticmethod
    def symbolic(g, input, grid, interpolation_mode, padding_mode, align_corners):
        return g.op("GridSampler2DTRT", input, grid, interpolation_mode_i=interpolation_mode,
                    padding_mode_i=padding_mode, align_corners_i=align_corners)

    @staticmethod
    def forward(ctx, input, grid, interpolation_mode, padding_mode, align_corners):
        modes = {0: "bilinear", 1: "nearest"}, {0: "zeros", 1: "border", 2: "reflection"}
        return torch.nn.functional.grid_sample(input, grid, modes[0][interpolation_mode],
                                               modes[1][padding_mode], bool(align_corners))


class Sampled(torch.nn.Module):
    def forward(self, x, grid):
        return GridSampler2D.apply(x, grid, 0, 0, False)


def test_a_plugin_node_in_onnxs_own_domain_names_the_registration_that_works():
    """Before: "writes nodes that are valid ONNX at neither opset 17 nor 11 ... Write the node as the ONNX operator
    documentation gives it", which misread a TensorRT plugin for a mistyped ONNX operator."""
    args = (torch.randn(1, 2, 5, 6), torch.rand(1, 4, 3, 2) * 2 - 1)
    reg = bridge.Registry()
    bridge.register(GridSampler2D, registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"GridSampler2D\.symbolic writes \['GridSampler2DTRT'\] in ONNX's "
                                                   r"own domain.*Register the class with symbolic=False, "
                                                   r"name='trt::GridSampler2DTRT'"):
        bridge.export(Sampled(), args, registry=reg)
    reg = bridge.Registry()
    bridge.register(GridSampler2D, symbolic=False, name="trt::GridSampler2DTRT", registry=reg)
    proto = bridge.export(Sampled(), args, registry=reg)
    assert [(n.domain, n.op_type) for n in proto.graph.node] == [("trt", "GridSampler2DTRT")]
    for tier in ("python", "function"):
        bridge.assert_parity(Sampled(), args, registry=reg, tier=tier)
