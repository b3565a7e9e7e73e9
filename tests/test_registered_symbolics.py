"""Ops whose ONNX node a symbolic registered with ``torch.onnx.register_custom_op_symbolic`` writes, as upstream
code registers them: the ONNX custom-op tutorial's ``mynamespace::custom_group_norm`` -> ``mydomain::testgroupnorm``
(its C++ op stood in by a ``torch.library.custom_op`` of plain torch), mmdeploy's tutorial's symbolic for
torchvision's ``deform_conv2d`` written with ``symbolic_helper.parse_args`` (the op defined with torchvision's
schema, ``tests/vision_ops.py``), and a symbolic of standard ops only. Each node is compared with what
``torch.onnx.export(dynamo=False)`` writes for the same call; parity runs in every tier that applies."""

import itertools
import math
import types
import warnings

import onnx
import pytest
import torch
import vision_ops
from onnxscript.function_libs.torch_lib.registration import default_registry
from test_upstream_functions import legacy_export, node_identity
from torch.onnx import register_custom_op_symbolic
from torch.onnx.symbolic_helper import parse_args

import bridge
from bridge.core.basics import torch_compat

vision_ops.define("regsym_tv")  # torchvision's deform_conv2d schema, in a namespace of its own
vision_ops.define("torchvision")  # the names and schemas torch_lib keys its translations by


def custom_nodes(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in proto.graph.node if n.domain not in ("", "ai.onnx")]


@pytest.fixture
def reg():
    return bridge.Registry()


# -- the ONNX tutorial: custom_group_norm(X, num_groups, scale, bias, eps) -> mydomain::testgroupnorm -------------
def _group_norm(x: torch.Tensor, num_groups: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                eps: float) -> torch.Tensor:
    """The tutorial's kernel (groups of channels normalized per sample, then scale and bias per channel), the
    group count read from its tensor without a Python int (traceable, so the function tier derives its body)."""
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    group = torch.floor(torch.arange(c, dtype=x.dtype) * num_groups.to(x.dtype)[0] / c)
    same = (group[:, None] == group[None, :]).to(x.dtype)  # [C, C]: channels of one group
    count = same.sum(1) * flat.shape[-1]
    mean = (flat.sum(-1) @ same) / count
    var = ((flat * flat).sum(-1) @ same) / count - mean * mean
    out = (flat - mean[..., None]) / torch.sqrt(var[..., None] + eps)
    return (out * scale[:, None] + bias[:, None]).reshape(x.shape)


custom_group_norm = torch.library.custom_op("mynamespace::custom_group_norm", _group_norm, mutates_args=())
custom_group_norm.register_fake(lambda x, num_groups, scale, bias, eps: torch.empty_like(x))
# the same op a second time, exported without bridge.register (the warning is said once per op)
custom_group_norm_b = torch.library.custom_op("mynamespace::custom_group_norm_b", _group_norm, mutates_args=())
custom_group_norm_b.register_fake(lambda x, num_groups, scale, bias, eps: torch.empty_like(x))


def my_group_norm(g, input, num_groups, scale, bias, eps):
    return g.op("mydomain::testgroupnorm", input, num_groups, scale, bias, epsilon_f=0.)


def my_group_norm_b(g, input, num_groups, scale, bias, eps):
    return g.op("mydomain::testgroupnorm_b", input, num_groups, scale, bias, epsilon_f=0.)


register_custom_op_symbolic("mynamespace::custom_group_norm", my_group_norm, 9)
register_custom_op_symbolic("mynamespace::custom_group_norm_b", my_group_norm_b, 9)


class CustomModel(torch.nn.Module):
    def forward(self, x, num_groups, scale, bias):
        return torch.ops.mynamespace.custom_group_norm(x, num_groups, scale, bias, 0.)


class CustomModelB(torch.nn.Module):
    def forward(self, x, num_groups, scale, bias):
        return torch.ops.mynamespace.custom_group_norm_b(x, num_groups, scale, bias, 0.)


GROUP_NORM_ARGS = (torch.randn(3, 2, 1, 2), torch.tensor([2.]), torch.tensor([1., 1.]), torch.tensor([0., 0.]))


def test_tutorial_group_norm_is_the_node_its_registered_symbolic_writes(reg):
    with pytest.warns(UserWarning, match=r"mynamespace::custom_group_norm is written as the node its registered "
                                         r"symbolic test_registered_symbolics.my_group_norm writes"):
        bridge.register("mynamespace::custom_group_norm", registry=reg)
    ours = bridge.export(CustomModel(), GROUP_NORM_ARGS, registry=reg, opset_version=17)
    legacy = legacy_export(CustomModel(), GROUP_NORM_ARGS, 17)
    (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
    assert node_identity(mine, ours.graph) == node_identity(theirs, legacy.graph) == \
        ("mydomain", "testgroupnorm", [("epsilon", onnx.AttributeProto.FLOAT, 0.0)], [0, 1, 2, 3])


@pytest.mark.parametrize("tier", ["python", "function", "native"])
def test_tutorial_group_norm_runs_in_every_tier(reg, tier):
    """python: the op itself; function: a body derived from its custom_op's function; native: the tutorial's kernel
    for the node (tests/user_ops/testgroupnorm.cc)."""
    samples = lambda dtype: [bridge.SampleInput((torch.randn(2, 4, 3).to(dtype), torch.tensor([2.]),  # noqa: E731
                                                 torch.ones(4), torch.zeros(4), 0.))]  # the op's call
    bridge.register("mynamespace::custom_group_norm", native="user_ops/testgroupnorm.cc", sample_inputs=samples,
                    registry=reg)
    args = (torch.randn(2, 4, 3, 2), torch.tensor([2.]), torch.randn(4), torch.randn(4))
    proto = bridge.export(CustomModel(), args, registry=reg)
    assert [(n.domain, n.op_type) for n in custom_nodes(proto)] == [("mydomain", "testgroupnorm")]
    bridge.assert_parity(CustomModel(), args, registry=reg, tier=tier, rtol=1e-4, atol=1e-5)


def test_an_argument_no_node_carries_keeps_the_first_calls_value(reg):
    """``eps`` reaches no node (the symbolic writes epsilon_f=0.): every tier calls the op with the first call's
    value, and a call with another value is refused rather than computed with the wrong one."""
    op = bridge.register("mynamespace::custom_group_norm", registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"described at its first call in an export"):
        op.spec  # noqa: B018  the node is known from the first call on

    class TwoEps(torch.nn.Module):
        def forward(self, x, num_groups, scale, bias):
            y = torch.ops.mynamespace.custom_group_norm(x, num_groups, scale, bias, 0.)
            return torch.ops.mynamespace.custom_group_norm(y, num_groups, scale, bias, 1e-5)

    with pytest.raises(bridge.OpBridgeError, match=r"argument 'eps'.*default 0.0. Got eps=1e-05"):
        bridge.export(TwoEps(), GROUP_NORM_ARGS, registry=reg)


def test_export_alone_honours_the_registered_symbolic_and_says_so_once(reg):
    with pytest.warns(UserWarning, match=r"mynamespace::custom_group_norm_b .*my_group_norm_b.*dynamo=True\) "
                                         r"ignores"):
        ours = bridge.export(CustomModelB(), GROUP_NORM_ARGS, registry=reg)
    assert [(n.domain, n.op_type) for n in custom_nodes(ours)] == [("mydomain", "testgroupnorm_b")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per op and process
        bridge.export(CustomModelB(), GROUP_NORM_ARGS, registry=reg)
    bridge.assert_parity(CustomModelB(), GROUP_NORM_ARGS, registry=reg, tier="python")


def test_symbolic_false_writes_the_ops_own_node(reg):
    bridge.register("mynamespace::custom_group_norm", symbolic=False, registry=reg)
    proto = bridge.export(CustomModel(), GROUP_NORM_ARGS, registry=reg)
    assert [(n.domain, n.op_type) for n in custom_nodes(proto)] == [("mynamespace", "custom_group_norm")]


# -- mmdeploy's tutorial: a parse_args symbolic registered for torchvision's deform_conv2d ---------------------
@parse_args("v", "v", "v", "v", "v", "i", "i", "i", "i", "i", "i", "i", "i", "none")
def deform_symbolic(g, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                    n_weight_grps, n_offset_grps, use_mask):
    """mmdeploy's tutorial's symbolic, with the node carrying every tensor and integer (so a kernel can run it)."""
    return g.op("custom::deform_conv2d", input, weight, offset, mask, bias, stride_h_i=stride_h, stride_w_i=stride_w,
                pad_h_i=pad_h, pad_w_i=pad_w, dilation_h_i=dil_h, dilation_w_i=dil_w, groups_i=n_weight_grps,
                deform_groups_i=n_offset_grps)


register_custom_op_symbolic("regsym_tv::deform_conv2d", deform_symbolic, 9)


class DeformConv2d(torch.nn.Module):
    """torchvision's DeformConv2d layer as it calls the op (offset predicted by a conv, as the tutorial's model)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv1 = torch.nn.Conv2d(3, 18, 3)
        self.weight = torch.nn.Parameter(torch.randn(3, 3, 3, 3, generator=g))
        self.bias = torch.nn.Parameter(torch.randn(3, generator=g))

    def forward(self, x):
        offset = self.conv1(x)
        mask = torch.zeros((x.shape[0], 0), dtype=x.dtype)
        return torch.ops.regsym_tv.deform_conv2d(x, self.weight, offset, mask, self.bias, 1, 1, 0, 0, 1, 1, 1, 1,
                                                 False)


def test_mmdeploy_deform_conv2d_symbolic_with_parse_args_writes_its_node(reg):
    """parse_args reads the call's integers from graph constants, as the TorchScript exporter gave them: the
    node's INT attributes are the call's; use_mask ("none": left alone) reaches no node."""
    bridge.register("regsym_tv::deform_conv2d", registry=reg)
    model, x = DeformConv2d().eval(), torch.rand(1, 3, 10, 10)
    ours = bridge.export(model, (x,), registry=reg, opset_version=17)
    legacy = legacy_export(model, (x,), 17)
    (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
    assert node_identity(mine, ours.graph)[:3] == node_identity(theirs, legacy.graph)[:3]
    assert [a.name for a in mine.attribute][:3] == ["deform_groups", "dilation_h", "dilation_w"]
    bridge.assert_parity(model, (x,), registry=reg, tier="python", rtol=1e-4, atol=1e-4)


def test_mmdeploy_tutorial_node_without_the_weights_is_a_clear_error(reg, fresh_name):
    """The tutorial's first symbolic writes custom::deform_conv2d(input, offset): no tier could run the op from that
    node (weight, mask and bias are gone), which the export says, naming them."""
    ns = fresh_name().partition("::")[0] + "_tv"
    vision_ops.define(ns)

    @parse_args("v", "v", "v", "v", "v", "i", "i", "i", "i", "i", "i", "i", "i", "none")
    def symbolic(g, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                 n_weight_grps, n_offset_grps, use_mask):
        return g.op("custom::deform_conv2d", input, offset)

    register_custom_op_symbolic(f"{ns}::deform_conv2d", symbolic, 9)
    with pytest.warns(UserWarning, match=ns):
        bridge.register(f"{ns}::deform_conv2d", registry=reg)

    class Model(torch.nn.Module):
        def forward(self, x, w, offset, b):
            return getattr(torch.ops, ns).deform_conv2d(x, w, offset, x.new_zeros(1, 0), b, 1, 1, 0, 0, 1, 1, 1, 1,
                                                        False)

    args = (torch.rand(1, 3, 10, 10), torch.rand(3, 3, 3, 3), torch.rand(1, 18, 8, 8), torch.rand(3))
    with pytest.raises(bridge.OpBridgeError, match=r"never passes argument\(s\) \['weight', 'mask', 'bias'\]"):
        bridge.export(Model(), args, registry=reg)


# -- a registered symbolic of standard ops only: written into the graph, as the TorchScript exporter did --------
_lib = torch.library.Library("regsym_std", "DEF")
_lib.define("scaled_add(Tensor x, Tensor y, float alpha) -> Tensor")
_lib.impl("scaled_add", lambda x, y, alpha: x + alpha * y, "CompositeExplicitAutograd")
torch.library.register_fake("regsym_std::scaled_add", lambda x, y, alpha: torch.empty_like(x), lib=_lib)


@parse_args("v", "v", "f")
def scaled_add_symbolic(g, x, y, alpha):
    return g.op("Add", x, g.op("Mul", y, g.op("Constant", value_t=torch.tensor(alpha, dtype=torch.float32))))


register_custom_op_symbolic("regsym_std::scaled_add", scaled_add_symbolic, 9)


def test_standard_op_symbolic_is_written_into_the_graph(reg):
    class Model(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.regsym_std.scaled_add(x, y, 0.5)

    bridge.register("regsym_std::scaled_add", registry=reg)
    args = (torch.randn(2, 3), torch.randn(2, 3))
    ours = bridge.export(Model(), args, registry=reg, opset_version=17)
    legacy = legacy_export(Model(), args, 17)
    assert [n.op_type for n in ours.graph.node] == [n.op_type for n in legacy.graph.node] == \
        ["Constant", "Mul", "Add"]
    assert custom_nodes(ours) == [] and not any(f.domain == "opbridge_symbolic" for f in ours.functions)
    bridge.assert_parity(Model(), args, registry=reg)


def test_symbolics_torchvision_registers_for_its_own_ops_are_left_to_torch_onnx(fresh_name):
    """torchvision registers symbolics for nms and roi_align when imported; torch.onnx translates those ops itself,
    so only symbolics of the user's code take the op over (and torchvision's where torch.onnx does not translate
    the op: below, roi_pool)."""
    ns = fresh_name().partition("::")[0] + "_tv"
    vision_ops.define(ns)

    def nms_symbolic(g, boxes, scores, iou_threshold):
        return g.op("NonMaxSuppression", boxes, scores)

    nms_symbolic.__module__ = "torchvision.ops._register_onnx_ops"
    register_custom_op_symbolic("torchvision::nms", nms_symbolic, 11)
    assert bridge.core.registered.registered_origin(torch.ops.torchvision.nms.default) is None
    register_custom_op_symbolic(f"{ns}::nms", nms_symbolic, 11)  # an op torch.onnx does not translate: honoured
    assert bridge.core.registered.registered_origin(getattr(torch.ops, ns).nms.default).symbolic is nms_symbolic
    register_custom_op_symbolic(f"{ns}::roi_align", my_group_norm, 11)  # a user's symbolic: honoured
    assert bridge.core.registered.registered_origin(getattr(torch.ops, ns).roi_align.default).symbolic is my_group_norm


# -- torchvision 0.28.0 torchvision/ops/_register_onnx_ops.py: roi_pool's symbolic as shipped (the argmax output
# returned as None) and registered as `import torchvision` registers it; the op defined with torchvision's schema,
# its C++ kernel stood in by torchvision's CPU algorithm as a loop
_TV = torch.library.Library("torchvision", "FRAGMENT")
_TV.define("roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
           "-> (Tensor, Tensor)")


def _roi_pool(input, rois, spatial_scale, pooled_height, pooled_width):
    """Caffe's RoI max pooling as torchvision's CPU kernel computes it: corners rounded half away from zero, bins
    from floor/ceil, an empty bin 0 (argmax -1); argmax the flat h * W + w of the maximum."""
    c, h, w = input.shape[1:]
    out = input.new_zeros(rois.shape[0], c, pooled_height, pooled_width)
    argmax = torch.full(out.shape, -1, dtype=torch.int32)
    for r, (b, *box) in enumerate(rois.tolist()):
        x1, y1, x2, y2 = (math.floor(v * spatial_scale + 0.5) for v in box)
        bin_h, bin_w = max(y2 - y1 + 1, 1) / pooled_height, max(x2 - x1 + 1, 1) / pooled_width
        for i, j in itertools.product(range(pooled_height), range(pooled_width)):
            h0, h1 = (min(max(v + y1, 0), h) for v in (math.floor(i * bin_h), math.ceil((i + 1) * bin_h)))
            w0, w1 = (min(max(v + x1, 0), w) for v in (math.floor(j * bin_w), math.ceil((j + 1) * bin_w)))
            if h1 > h0 and w1 > w0:
                out[r, :, i, j], at = input[int(b), :, h0:h1, w0:w1].reshape(c, -1).max(1)
                argmax[r, :, i, j] = ((at // (w1 - w0) + h0) * w + at % (w1 - w0) + w0).int()
    return out, argmax


_TV.impl("roi_pool", _roi_pool, "CPU")
torch.library.register_fake("torchvision::roi_pool", lambda input, rois, spatial_scale, pooled_height, pooled_width: (
    input.new_empty(rois.shape[0], input.shape[1], pooled_height, pooled_width),
    torch.empty(rois.shape[0], input.shape[1], pooled_height, pooled_width, dtype=torch.int32)), lib=_TV)


@parse_args("v", "v", "f", "i", "i")
def roi_pool(g, input, rois, spatial_scale, pooled_height, pooled_width):
    roi_pool = g.op(
        "MaxRoiPool", input, rois, pooled_shape_i=(pooled_height, pooled_width), spatial_scale_f=spatial_scale
    )
    return roi_pool, None


roi_pool.__module__ = "torchvision.ops._register_onnx_ops"
register_custom_op_symbolic("torchvision::roi_pool", roi_pool, 11)


class RoIPool(torch.nn.Module):  # torchvision.ops.roi_pool's call
    def __init__(self, argmax=False):
        super().__init__()
        self.argmax = argmax

    def forward(self, input, rois):
        output, argmax = torch.ops.torchvision.roi_pool(input, rois, 0.25, 3, 2)
        return (output, argmax) if self.argmax else output


ROI_ARGS = (torch.randn(2, 4, 9, 11), torch.tensor([[0, 2., 3., 30., 25.], [1, 10., 0., 41., 33.], [0, 5., 5., 6., 6.]]))


def test_torchvision_roi_pool_symbolic_returning_none_for_argmax_is_its_maxroipool(reg):
    """torchvision's own symbolic, as shipped: torch.onnx's torch_lib translation takes other arguments (input,
    boxes, output_size, spatial_scale), so the symbolic stands for the op (before: torch.onnx's raw
    ConversionError); its None for argmax leaves that output unwritten, as the TorchScript exporter did (before:
    refused); the node is MaxRoiPool with one output, node for node what torch.onnx.export(dynamo=False) writes."""
    ours = bridge.export(RoIPool(), ROI_ARGS, registry=reg, opset_version=17)
    legacy = legacy_export(RoIPool(), ROI_ARGS, 17)
    assert [node_identity(n, ours.graph) for n in ours.graph.node] == \
        [node_identity(n, legacy.graph) for n in legacy.graph.node] == \
        [("", "MaxRoiPool", [("pooled_shape", onnx.AttributeProto.INTS, [3, 2]),
                             ("spatial_scale", onnx.AttributeProto.FLOAT, 0.25)], [0, 1])]
    assert len(ours.graph.node[0].output) == 1 and not ours.functions
    bridge.assert_parity(RoIPool(), ROI_ARGS, registry=reg)


def test_a_model_reading_an_output_its_symbolic_leaves_unwritten_is_refused(reg):
    with pytest.raises(bridge.OpBridgeError, match=r"torchvision\.roi_pool\.symbolic returns None for "
                                                   r"output\(s\) \[1\] .* but the model uses it\."):
        bridge.export(RoIPool(argmax=True), ROI_ARGS, registry=reg)


# -- mmdeploy 1.3.1 mmdeploy/pytorch/symbolics/grid_sampler.py, registered as its symbolic rewriter registers it
@parse_args('v', 'v', 'i', 'i', 'i')
def grid_sampler(g, input, grid, interpolation_mode, padding_mode, align_corners=False):
    return g.op('mmdeploy::grid_sampler', input, grid, interpolation_mode_i=interpolation_mode,
                padding_mode_i=padding_mode, align_corners_i=align_corners)


class GridSample(torch.nn.Module):
    def forward(self, x, grid):
        return torch.nn.functional.grid_sample(x, grid, mode='bilinear', padding_mode='zeros', align_corners=False)


def test_a_symbolic_registered_for_an_aten_op_is_named_as_unused(reg):
    """The TorchScript exporter wrote mmdeploy::grid_sampler; opbridge writes torch.onnx's GridSample and says so
    (before: no word), once per op."""
    args = (torch.randn(1, 3, 8, 8), torch.rand(1, 5, 5, 2) * 2 - 1)
    register_custom_op_symbolic('::grid_sampler', grid_sampler, 17)
    try:
        assert [n.domain for n in custom_nodes(legacy_export(GridSample(), args, 17))] == ["mmdeploy"]
        with pytest.warns(UserWarning, match=r"aten::grid_sampler is written as torch\.onnx's own translation, not "
                                             r"the node of the symbolic registered for it \(.*grid_sampler\)") as w:
            ours = bridge.export(GridSample(), args, registry=reg)
            bridge.export(GridSample(), args, registry=reg)
        assert len([x for x in w if "aten::grid_sampler" in str(x.message)]) == 1
        assert [n.op_type for n in ours.graph.node] == ["GridSample"]
    finally:
        torch.onnx.unregister_custom_op_symbolic('::grid_sampler', 17)


def test_a_torch_lib_translation_takes_keyword_only_arguments_by_name(monkeypatch):
    """torch.onnx passes a keyword-only schema argument by name: a translation taking it as keyword-only serves
    the op (before: bound positionally, it was read as taking none, and the op's symbolic was used instead);
    one that cannot take the op's arguments still does not."""
    lib = torch.library.Library("opbridge_kwonly", "DEF")
    lib.define("scaled(Tensor x, *, float scale=1.0) -> Tensor")

    def by_name(x, *, scale=1.0):
        return x

    def first_only(x, /):
        return x

    monkeypatch.setitem(default_registry._registry, "opbridge_kwonly::scaled",
                        types.SimpleNamespace(overloads=[by_name]))
    assert torch_compat.torchlib_translation("opbridge_kwonly::scaled") is by_name
    monkeypatch.setitem(default_registry._registry, "opbridge_kwonly::scaled",
                        types.SimpleNamespace(overloads=[first_only]))
    assert torch_compat.torchlib_translation("opbridge_kwonly::scaled") is None
