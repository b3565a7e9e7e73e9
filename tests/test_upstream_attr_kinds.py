# ruff: noqa: UP006, UP035, UP045  (upstream code as shipped: typing.Optional and Tuple)
"""Functions whose attribute kinds upstream code states one way and passes another, as the repositories ship
them (their compiled kernels stood in by plain torch): mmcv 2.x's CARAFEFunction (``scale_factor: int`` written
``scale_factor_f=``), mmdeploy 1.3.1's BicubicInterpolate (a bool written ``align_corners_i=``) and mmcv's
MultiScaleDeformableAttnFunction with mmdeploy's symbolic installed on it (``im2col_step: torch.Tensor``, called with
64, written ``im2col_step_i=``), mmcv's DeformRoIPoolFunction (``offset: Optional[Tensor]`` without a default,
passed None: the node leaves the input out), mmdeploy 1.3.1's GemmOp (a standard-op symbolic renaming its inputs with
``setDebugName``). The node is what ``torch.onnx.export(dynamo=False)`` writes; forward gets each value
as the call passed it (before: 2.0, 0 and a tensor placeholder), in export's fake run and in every tier."""

from typing import Optional, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_upstream_functions import legacy_export, node_identity
from torch import Tensor
from torch.autograd import Function
from torch.nn.modules.utils import _pair

import bridge
from bridge.core.basics.graphs import custom_nodes


@pytest.fixture
def reg():
    return bridge.Registry()


# -- mmcv 2.x mmcv/ops/carafe.py (CARAFEFunction.forward and symbolic as shipped; the kernel stood in) ----------
class _CarafeExt:
    @staticmethod
    def carafe_forward(features, masks, rfeatures, routput, rmasks, output, kernel_size, group_size, scale_factor):
        n, c, h, w = features.shape
        cols = F.unfold(features, kernel_size, padding=(kernel_size - 1) // 2)
        cols = cols.view(n, group_size, c // group_size, kernel_size ** 2, h, w)
        cols = cols.repeat_interleave(scale_factor, 4).repeat_interleave(scale_factor, 5)
        m = masks.view(n, group_size, 1, kernel_size ** 2, h * scale_factor, w * scale_factor)
        output.copy_((cols * m).sum(3).view(n, c, h * scale_factor, w * scale_factor))


class CARAFEFunction(Function):

    @staticmethod
    def symbolic(g, features: Tensor, masks: Tensor, kernel_size: int,
                 group_size: int, scale_factor: int) -> Tensor:
        return g.op(
            'mmcv::MMCVCARAFE',
            features,
            masks,
            kernel_size_i=kernel_size,
            group_size_i=group_size,
            scale_factor_f=scale_factor)

    @staticmethod
    def forward(ctx, features: Tensor, masks: Tensor, kernel_size: int,
                group_size: int, scale_factor: int) -> Tensor:
        assert scale_factor >= 1
        assert masks.size(1) == kernel_size * kernel_size * group_size
        assert masks.size(-1) == features.size(-1) * scale_factor
        assert masks.size(-2) == features.size(-2) * scale_factor
        assert features.size(1) % group_size == 0
        assert (kernel_size - 1) % 2 == 0 and kernel_size >= 1
        ctx.kernel_size = kernel_size
        ctx.group_size = group_size
        ctx.scale_factor = scale_factor
        ctx.feature_size = features.size()
        ctx.mask_size = masks.size()

        n, c, h, w = features.size()
        output = features.new_zeros((n, c, h * scale_factor, w * scale_factor))
        routput = features.new_zeros(output.size(), requires_grad=False)
        rfeatures = features.new_zeros(features.size(), requires_grad=False)
        rmasks = masks.new_zeros(masks.size(), requires_grad=False)
        _CarafeExt.carafe_forward(
            features,
            masks,
            rfeatures,
            routput,
            rmasks,
            output,
            kernel_size=kernel_size,
            group_size=group_size,
            scale_factor=scale_factor)

        if features.requires_grad or masks.requires_grad or \
                torch.__version__ == 'parrots':
            ctx.save_for_backward(features, masks, rfeatures)
        return output


carafe = CARAFEFunction.apply


class CARAFE(torch.nn.Module):  # mmcv's CARAFE module (its forward's call)
    def __init__(self, kernel_size: int, group_size: int, scale_factor: int):
        super().__init__()
        assert isinstance(kernel_size, int) and isinstance(group_size, int) and isinstance(scale_factor, int)
        self.kernel_size = kernel_size
        self.group_size = group_size
        self.scale_factor = scale_factor

    def forward(self, features: Tensor, masks: Tensor) -> Tensor:
        return carafe(features, masks, self.kernel_size, self.group_size, self.scale_factor)


# -- mmdeploy 1.3.1 mmdeploy/pytorch/functions/interpolate.py (BicubicInterpolate as shipped) -------------------
class BicubicInterpolate(Function):

    @staticmethod
    def symbolic(g, input, scale_factor, align_corners):
        """Symbolic function for creating onnx op."""
        return g.op(
            'mmdeploy::TRTBicubicInterpolate',
            input,
            scale_factor_f=scale_factor,
            align_corners_i=align_corners)

    @staticmethod
    def forward(g, input, scale_factor, align_corners):
        """Run forward."""
        return F.interpolate(
            input,
            scale_factor=scale_factor,
            mode='bicubic',
            align_corners=align_corners)


class Bicubic(torch.nn.Module):  # interpolate__tensorrt's call for mode='bicubic'
    def __init__(self, align_corners):
        super().__init__()
        self.align_corners = align_corners

    def forward(self, x):
        return BicubicInterpolate.apply(x, [2.0, 2.0], self.align_corners)


# -- mmcv mmcv/ops/multi_scale_deform_attn.py (forward as shipped; its CUDA kernel stood in by mmcv's own pytorch
# version) with mmdeploy 1.3.1's ms_deform_attn_default installed as its symbolic, as mmdeploy's rewriter does
def multi_scale_deformable_attn_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights):
    bs, _, num_heads, embed_dims = value.shape
    _, num_queries, num_heads, num_levels, num_points, _ = sampling_locations.shape
    value_list = value.split([H_ * W_ for H_, W_ in value_spatial_shapes], dim=1)
    sampling_grids = 2 * sampling_locations - 1
    sampling_value_list = []
    for level, (H_, W_) in enumerate(value_spatial_shapes):
        value_l_ = value_list[level].flatten(2).transpose(1, 2).reshape(bs * num_heads, embed_dims, H_, W_)
        sampling_grid_l_ = sampling_grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampling_value_l_ = F.grid_sample(value_l_, sampling_grid_l_, mode='bilinear', padding_mode='zeros',
                                          align_corners=False)
        sampling_value_list.append(sampling_value_l_)
    attention_weights = attention_weights.transpose(1, 2).reshape(bs * num_heads, 1, num_queries,
                                                                  num_levels * num_points)
    output = (torch.stack(sampling_value_list, dim=-2).flatten(-2) *
              attention_weights).sum(-1).view(bs, num_heads * embed_dims, num_queries)
    return output.transpose(1, 2).contiguous()


class _MsdaExt:
    @staticmethod
    def ms_deform_attn_forward(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                               attention_weights, im2col_step):
        return multi_scale_deformable_attn_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights)


class MultiScaleDeformableAttnFunction(Function):

    @staticmethod
    def forward(ctx, value: torch.Tensor, value_spatial_shapes: torch.Tensor,
                value_level_start_index: torch.Tensor,
                sampling_locations: torch.Tensor,
                attention_weights: torch.Tensor,
                im2col_step: torch.Tensor) -> torch.Tensor:
        ctx.im2col_step = im2col_step
        sampling_locations = sampling_locations.type_as(value)
        attention_weights = attention_weights.type_as(value)
        output = _MsdaExt.ms_deform_attn_forward(
            value,
            value_spatial_shapes,
            value_level_start_index,
            sampling_locations,
            attention_weights,
            im2col_step=ctx.im2col_step)
        ctx.save_for_backward(value, value_spatial_shapes,
                              value_level_start_index, sampling_locations,
                              attention_weights)
        return output


def ms_deform_attn_default(
    g,
    value,
    value_spatial_shapes,
    value_level_start_index,
    sampling_locations,
    attention_weights,
    im2col_step=64,
):
    """Rewrite msda symbolic function for all backend."""
    return g.op(
        'mmdeploy::MMCVMultiScaleDeformableAttention',
        value,
        value_spatial_shapes,
        value_level_start_index,
        sampling_locations,
        attention_weights,
        im2col_step_i=im2col_step,
    )


class MSDA(torch.nn.Module):  # MultiScaleDeformableAttention.forward's call, im2col_step=64
    def __init__(self):
        super().__init__()
        self.im2col_step = 64
        self.register_buffer("spatial_shapes", torch.tensor([[6, 8], [3, 4]]))
        self.register_buffer("level_start_index", torch.tensor([0, 48]))

    def forward(self, value, sampling_locations, attention_weights):
        return MultiScaleDeformableAttnFunction.apply(value, self.spatial_shapes, self.level_start_index,
                                                      sampling_locations, attention_weights, self.im2col_step)


def _msda_fake(value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
               im2col_step):
    bs, nq, nh = sampling_locations.shape[:3]
    return value.new_empty(bs, nq, nh * value.shape[3])


# -- mmcv 2.x mmcv/ops/deform_roi_pool.py (DeformRoIPoolFunction as shipped; its kernel stood in by a plain
# reduction: the test is about the node's inputs, not the pooling)
class _DrpExt:
    @staticmethod
    def deform_roi_pool_forward(input, rois, offset, output, pooled_height, pooled_width, spatial_scale,
                                sampling_ratio, gamma):
        pooled = input[rois[:, 0].long()].mean((2, 3)) * spatial_scale * rois[:, 3:].mean(1, keepdim=True)
        shift = gamma * offset.mean((1, 2, 3)).view(-1, 1, 1, 1) if offset.numel() else 0.0
        output.copy_(pooled[:, :, None, None].expand(output.shape) + shift)


class DeformRoIPoolFunction(Function):

    @staticmethod
    def symbolic(g, input, rois, offset, output_size, spatial_scale,
                 sampling_ratio, gamma):
        inputs = [input, rois]
        if offset is not None:
            inputs = [input, rois, offset]
        return g.op(
            'mmcv::MMCVDeformRoIPool',
            *inputs,
            pooled_height_i=output_size[0],
            pooled_width_i=output_size[1],
            spatial_scale_f=spatial_scale,
            sampling_ratio_f=sampling_ratio,
            gamma_f=gamma,
        )

    @staticmethod
    def forward(ctx,
                input: Tensor,
                rois: Tensor,
                offset: Optional[Tensor],
                output_size: Tuple[int, ...],
                spatial_scale: float = 1.0,
                sampling_ratio: int = 0,
                gamma: float = 0.1) -> Tensor:
        if offset is None:
            offset = input.new_zeros(0)
        ctx.output_size = _pair(output_size)
        ctx.spatial_scale = float(spatial_scale)
        ctx.sampling_ratio = int(sampling_ratio)
        ctx.gamma = float(gamma)

        assert rois.size(1) == 5, 'RoI must be (idx, x1, y1, x2, y2)!'

        output_shape = (rois.size(0), input.size(1), ctx.output_size[0],
                        ctx.output_size[1])
        output = input.new_zeros(output_shape)

        _DrpExt.deform_roi_pool_forward(
            input,
            rois,
            offset,
            output,
            pooled_height=ctx.output_size[0],
            pooled_width=ctx.output_size[1],
            spatial_scale=ctx.spatial_scale,
            sampling_ratio=ctx.sampling_ratio,
            gamma=ctx.gamma)

        ctx.save_for_backward(input, rois, offset)
        return output


class DeformRoIPool(torch.nn.Module):  # mmcv's module: offset None unless given
    def __init__(self, output_size, spatial_scale=1.0, sampling_ratio=0, gamma=0.1):
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        self.gamma = float(gamma)

    def forward(self, input: Tensor, rois: Tensor, offset: Optional[Tensor] = None) -> Tensor:
        return DeformRoIPoolFunction.apply(input, rois, offset, self.output_size, self.spatial_scale,
                                           self.sampling_ratio, self.gamma)


def _cases():
    g = torch.Generator().manual_seed(0)
    masks = torch.rand(1, 9, 8, 10, generator=g).softmax(1)
    rois = torch.tensor([[0, 2., 2., 13., 11.], [1, 0., 4., 19., 17.], [0, 6., 1., 21., 14.]])
    return {
        "deform-roi-pool-no-offset": (DeformRoIPoolFunction, {}, DeformRoIPool((3, 3), 0.5, 2, 0.1),
                                      (torch.randn(2, 4, 10, 12, generator=g), rois)),
        "carafe": (CARAFEFunction, {}, CARAFE(3, 1, 2), (torch.randn(1, 4, 4, 5, generator=g), masks)),
        "bicubic": (BicubicInterpolate, {}, Bicubic(False), (torch.randn(1, 3, 5, 6, generator=g),)),
        "bicubic-aligned": (BicubicInterpolate, {}, Bicubic(True), (torch.randn(1, 3, 5, 6, generator=g),)),
        "msda": (MultiScaleDeformableAttnFunction, {"fake": _msda_fake}, MSDA(),
                 (torch.randn(1, 60, 2, 4, generator=g), torch.rand(1, 5, 2, 2, 3, 2, generator=g),
                  torch.rand(1, 5, 2, 2, 3, generator=g).softmax(-1))),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_attribute_kinds_as_upstream_passes_them(reg, monkeypatch, case):
    cls, options, model, args = _cases()[case]
    if cls is MultiScaleDeformableAttnFunction:
        monkeypatch.setattr(cls, "symbolic", ms_deform_attn_default, raising=False)
    theirs = legacy_export(model, args, 18)
    bridge.register(cls, registry=reg, **options)  # NOTE: as shipped: no sample_inputs, no annotations changed
    ours = bridge.export(model, args, opset_version=18, registry=reg)
    assert [node_identity(n, ours.graph) for n in custom_nodes(ours)] == \
        [node_identity(n, theirs.graph) for n in custom_nodes(theirs)]
    for tier in ("python", "function"):
        assert bridge.check_parity(model, args, tier=tier, registry=reg).passed, tier


def test_a_file_read_where_the_function_was_only_registered_calls_forward_with_an_int(reg):
    """A process that only registers CARAFEFunction reads scale_factor=2.0 (FLOAT) off the node: forward, which
    annotates it int, gets 2 (new_zeros takes no float size)."""
    _, _, model, args = _cases()["carafe"]
    bridge.register(CARAFEFunction, registry=reg)
    proto = bridge.export(model, args, opset_version=18, registry=reg)
    fresh = bridge.Registry()
    bridge.register(CARAFEFunction, registry=fresh)
    sess = bridge.session(proto.SerializeToString(), tier="python", registry=fresh)
    torch.testing.assert_close(torch.from_numpy(bridge.parity.run_ort(sess, args)[0]), model(*args))


def _corner_pool(mode: int):
    """mmcv 1.x corner_pool.py's shape: four Functions, one node type, told apart by mode_i."""
    class CornerPoolFunction(Function):
        @staticmethod
        def symbolic(g, input):
            return g.op('mmcv::MMCVCornerPool', input, mode_i=int(mode))

        @staticmethod
        def forward(ctx, input):
            return input.cummax(2 + mode % 2)[0]
    return CornerPoolFunction


def test_a_second_function_writing_one_node_type_names_the_first(reg):
    top, left = _corner_pool(0), _corner_pool(1)
    bridge.register(top, registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"op 'mmcv::MMCVCornerPool' is already registered \(by "
                                                   r".*CornerPoolFunction \(torch\.autograd\.Function, bridged\)\).*"
                                                   r"told apart by an attribute, cannot each be bridged"):
        bridge.register(left, registry=reg)


# -- mmdeploy 1.3.1 mmdeploy/pytorch/functions/linear.py (GemmOp as shipped): a standard-op symbolic that renames
# its inputs with setDebugName
class GemmOp(Function):
    """Create onnx::Gemm op."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        out = input @ weight.transpose(0, 1)
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def symbolic(g, input, weight, bias=None):
        input.setDebugName('A')
        weight.setDebugName('B')
        args = ['Gemm', input, weight]
        if bias is not None:
            bias.setDebugName('C')
            args.append(bias)
        return g.op(*args, alpha_f=1.0, beta_f=1.0, transA_i=0, transB_i=1)


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return GemmOp.apply(x.relu(), self.fc.weight, self.fc.bias)


def test_a_standard_op_symbolic_renaming_its_inputs_writes_a_connected_graph(reg):
    """Before: the Gemm read 'A' and 'B', which nothing wrote (onnx.checker: not topologically sorted)."""
    bridge.register(GemmOp, registry=reg)
    model, x = _Linear(), torch.randn(5, 8)
    ours = bridge.export(model, (x,), registry=reg)
    assert [n.op_type for n in ours.graph.node if n.op_type != "Constant"] == ["Relu", "Gemm"]
    assert bridge.check_parity(model, (x,), registry=reg).passed


class _LinearNoBias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        return GemmOp.apply(x, self.w)


def test_an_argument_none_by_default_and_at_the_call_is_an_absent_input(reg):
    """GemmOp called without bias, registered as shipped (no sample): bias is None by default and at the call, an
    optional tensor left out (before: its kind 'known neither from symbolic, an annotation, a default nor a
    sample')."""
    bridge.register(GemmOp, registry=reg)
    model, x = _LinearNoBias(), torch.randn(5, 8)
    gemm = [n for n in bridge.export(model, (x,), registry=reg).graph.node if n.op_type == "Gemm"]
    assert len(gemm) == 1 and [i for i in gemm[0].input if i] == ["x", "w"]  # NOTE: "" is an absent input
    assert bridge.check_parity(model, (x,), registry=reg).passed


class ShiftNoSymbolic(Function):  # no symbolic: the node is named at register; offset Optional, no default
    @staticmethod
    def forward(ctx, x: Tensor, offset: Optional[Tensor], scale: float = 2.0):
        return x * scale if offset is None else x * scale + offset


class _Shift(torch.nn.Module):
    def __init__(self, with_offset):
        super().__init__()
        self.with_offset = with_offset

    def forward(self, x):
        return ShiftNoSymbolic.apply(x, x.flip(0) if self.with_offset else None, 3.0)


@pytest.mark.parametrize("with_offset", [False, True], ids=["offset-none", "offset-given"])
def test_an_optional_tensor_without_default_is_optional_without_symbolic_too(reg, with_offset):
    """The same rule as DeformRoIPool's symbolic path: ``Optional[Tensor]`` with no default may be left out (before:
    without symbolic only a None default made an input optional, and a None offset was refused)."""
    bridge.register(ShiftNoSymbolic, name="test::ShiftNoSymbolic", registry=reg)
    model, x = _Shift(with_offset), torch.randn(4, 3)
    node, = custom_nodes(bridge.export(model, (x,), registry=reg))
    assert len([i for i in node.input if i]) == (2 if with_offset else 1)
    for tier in ("python", "function"):
        assert bridge.check_parity(model, (x,), registry=reg, tier=tier).passed


# -- mmdeploy 1.3.1 mmdeploy/pytorch/functions/interpolate.py: interpolate__tensorrt's shape, its Function class made
# by a class statement inside the rewrite (ctx.origin_func stood in by F.interpolate)
def interpolate__tensorrt(input, size=None, scale_factor=None, mode='bilinear', align_corners=None,
                          recompute_scale_factor=None):

    class BicubicInterpolate(Function):

        def __init__(self) -> None:
            super().__init__()

        @staticmethod
        def symbolic(g, input, scale_factor, align_corners):
            """Symbolic function for creating onnx op."""
            return g.op(
                'mmdeploy::TRTBicubicInterpolate',
                input,
                scale_factor_f=scale_factor,
                align_corners_i=align_corners)

        @staticmethod
        def forward(g, input, scale_factor, align_corners):
            """Run forward."""
            return F.interpolate(input, scale_factor=scale_factor, mode='bicubic', align_corners=align_corners)

    if 'bicubic' == mode:
        if isinstance(scale_factor, float):
            scale_factor = [scale_factor, scale_factor]
        return BicubicInterpolate.apply(input, scale_factor, align_corners)
    return F.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor)


class TwoBicubic(torch.nn.Module):
    def forward(self, x):
        y = interpolate__tensorrt(x, scale_factor=2.0, mode='bicubic', align_corners=False)
        return interpolate__tensorrt(y, scale_factor=2.0, mode='bicubic', align_corners=False)


def test_a_function_class_made_inside_the_function_calling_it_is_named_not_traced_silently(reg):
    """Each call makes a new class, which no registration can name: export traces its forward as plain torch and
    says so, once (before: no word, and the file silently held Resize nodes for the plugin node)."""
    with pytest.warns(UserWarning, match=r"interpolate__tensorrt\.<locals>\.BicubicInterpolate has a symbolic, "
                                         r"which is not used.* made during export .* Define the class at module "
                                         r"level") as caught:
        proto = bridge.export(TwoBicubic(), (torch.randn(1, 2, 4, 4),), registry=reg)
    assert len([w for w in caught if "made during export" in str(w.message)]) == 1
    assert not list(custom_nodes(proto)) and [n.op_type for n in proto.graph.node].count("Resize") == 2
    assert "__init_subclass__" not in torch.autograd.Function.__dict__


# -- mmdeploy 1.3.1 mmdeploy/codebase/mmdet/ops/detection_output.py (NcnnDetectionOutputOp's symbolic as shipped;
# its forward, torch.rand of the output's shape, stood in by one that reads target_stds), called as
# base_dense_head__predict_by_feat__ncnn calls it: target_stds a numpy array (vars.cpu().detach().numpy())
class NcnnDetectionOutputOp(Function):

    @staticmethod
    def symbolic(g, loc, conf, anchor, score_threshold=0.35, nms_threshold=0.45, nms_top_k=100, keep_top_k=100,
                 num_class=81, target_stds=[0.1, 0.1, 0.2, 0.2]):  # noqa: B006  as shipped
        return g.op('mmdeploy::DetectionOutput', loc, conf, anchor, score_threshold_f=score_threshold,
                    nms_threshold_f=nms_threshold, nms_top_k_i=nms_top_k, keep_top_k_i=keep_top_k,
                    num_class_i=num_class, vars_f=target_stds, outputs=1)

    @staticmethod
    def forward(ctx, loc, conf, anchor, score_threshold=0.35, nms_threshold=0.45, nms_top_k=100, keep_top_k=100,
                num_class=81, target_stds=[0.1, 0.1, 0.2, 0.2]):  # noqa: B006  as shipped
        stds = torch.as_tensor(np.asarray(target_stds, dtype=np.float32))
        return (loc.reshape(-1, 4) * stds + anchor[:, 0].reshape(-1, 4)).reshape(1, -1, 4) * score_threshold


class NcnnHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stds = np.array([0.1, 0.1, 0.2, 0.2], dtype=np.float32)

    def forward(self, bboxes, scores, priors):
        return NcnnDetectionOutputOp.apply(bboxes, scores, priors, 0.02, 0.45, 5000, 200, 81, self.stds)


def test_a_numpy_array_passed_to_g_op_is_the_list_torchscript_wrote(reg):
    """Before: refused, the symbolic said to 'compute the attribute from the call's values'. Now the node's FLOATS
    are the array's, as torch.onnx.export(dynamo=False) writes them; forward gets the list back from a file."""
    bridge.register(NcnnDetectionOutputOp, registry=reg)
    args = (torch.rand(1, 1, 40), torch.rand(1, 1, 10 * 81), torch.rand(1, 2, 40))
    ours = bridge.export(NcnnHead(), args, registry=reg)
    legacy = legacy_export(NcnnHead(), args, 17)
    assert [node_identity(n, ours.graph) for n in custom_nodes(ours)] == \
        [node_identity(n, legacy.graph) for n in custom_nodes(legacy)]
    assert bridge.check_parity(NcnnHead(), args, registry=reg, tier="python").passed
