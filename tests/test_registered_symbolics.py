"""Ops whose ONNX node a symbolic registered with ``torch.onnx.register_custom_op_symbolic`` writes, as upstream
code registers them: the ONNX custom-op tutorial's ``mynamespace::custom_group_norm`` -> ``mydomain::testgroupnorm``
(its C++ op stood in by a ``torch.library.custom_op`` of plain torch), mmdeploy's tutorial's symbolic for
torchvision's ``deform_conv2d`` written with ``symbolic_helper.parse_args`` (the op defined with torchvision's
schema, ``tests/vision_ops.py``), and a symbolic of standard ops only. Each node is compared with what
``torch.onnx.export(dynamo=False)`` writes for the same call; parity runs in every tier that applies."""

import warnings

import onnx
import pytest
import torch
import vision_ops
from test_upstream_functions import legacy_export, node_identity
from torch.onnx import register_custom_op_symbolic
from torch.onnx.symbolic_helper import parse_args

import bridge

vision_ops.define("regsym_tv")  # torchvision's deform_conv2d schema, in a namespace of its own


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
    so only symbolics of the user's code take the op over."""
    ns = fresh_name().partition("::")[0] + "_tv"
    vision_ops.define(ns)

    def nms_symbolic(g, boxes, scores, iou_threshold):
        return g.op("NonMaxSuppression", boxes, scores)

    nms_symbolic.__module__ = "torchvision.ops._register_onnx_ops"
    register_custom_op_symbolic(f"{ns}::nms", nms_symbolic, 11)
    assert bridge.core.registered.registered_origin(getattr(torch.ops, ns).nms.default) is None
    register_custom_op_symbolic(f"{ns}::roi_align", my_group_norm, 11)  # a user's symbolic: honoured
    assert bridge.core.registered.registered_origin(getattr(torch.ops, ns).roi_align.default).symbolic is my_group_norm
