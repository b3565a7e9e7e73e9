"""mmcv 1.x and mmdeploy 1.3.1 torch.autograd.Function classes as the repos ship them, bridged with nothing changed
but their compiled extension (stood in by plain torch) and mmcv's ``is_custom_op_loaded`` (a flag here: whether
mmcv's onnxruntime ops were built): mmcv 1.7.2's NMSop (its symbolic branches on that flag and on
``ONNX_BACKEND``; a data-dependent count of kept boxes) and RoIAlignFunction (``mmcv::MMCVRoiAlign`` or standard
ops), mmdeploy 1.3.1's GridPriorsTRTOp (tensors as shape carriers, ``parse_args``) and TRTBatchedNMSop called with
``return_index`` True and False in one model. Each node is compared with what ``torch.onnx.export(dynamo=False)``
writes for the same call; parity runs in every tier that applies."""

import os

import onnx
import pytest
import torch
from test_functions import FEAT, roi_align_torch, rois
from test_upstream_functions import (
    B,
    TRTBatchedNMSop,
    batched_nms_case,
    legacy_export,
    node_identity,
    soft_nms_case,
    trt_batched_nms_fake,
)
from torch.autograd import Function
from torch.nn.modules.utils import _pair
from torch.onnx import symbolic_helper
from vision_ops import nms as vision_nms

import bridge
from bridge.core.basics.graphs import custom_nodes


@pytest.fixture
def reg():
    return bridge.Registry()


# -- mmcv 1.7.2 mmcv/onnx/info.py is_custom_op_loaded: True where mmcv's onnxruntime (or TensorRT) ops were built --
class _MMCVBuild:
    ort_ops = False


def is_custom_op_loaded() -> bool:
    """mmcv 1.x's check (it looks for the built library file); here the flag a test sets."""
    return _MMCVBuild.ort_ops


@pytest.fixture(params=[True, False], ids=["mmcv-ort-ops", "standard-ops"])
def mmcv_ops(request, monkeypatch):
    monkeypatch.setattr(_MMCVBuild, "ort_ops", request.param)
    monkeypatch.delenv("ONNX_BACKEND", raising=False)
    return request.param


def _size_helper(g, self, dim):
    """mmcv 1.7.2 mmcv/onnx/onnx_utils/symbolic_helper.py's _size_helper, as it is."""
    full_shape = g.op("Shape", self)
    from torch.onnx.symbolic_opset9 import select
    return select(g, full_shape, g.op("Constant", value_t=torch.tensor([0])), dim)


# -- mmcv 1.7.2 mmcv/ops/nms.py NMSop ----------------------------------------------------------------------------
class _NMSExt:
    """Stands in for mmcv's compiled ``nms`` (offset 0): the kept indices, best first."""

    @staticmethod
    def nms(bboxes, scores, iou_threshold, offset):
        assert offset == 0
        return vision_nms(bboxes, scores, iou_threshold)


class NMSop(Function):
    @staticmethod
    def forward(ctx, bboxes, scores, iou_threshold: float, offset: int, score_threshold: float, max_num: int):
        is_filtering_by_score = score_threshold > 0
        if is_filtering_by_score:
            valid_mask = scores > score_threshold
            bboxes, scores = bboxes[valid_mask], scores[valid_mask]
            valid_inds = torch.nonzero(valid_mask, as_tuple=False).squeeze(dim=1)
        inds = _NMSExt.nms(bboxes, scores, iou_threshold=float(iou_threshold), offset=offset)
        if max_num > 0:
            inds = inds[:max_num]
        if is_filtering_by_score:
            inds = valid_inds[inds]
        return inds

    @staticmethod
    def symbolic(g, bboxes, scores, iou_threshold, offset, score_threshold, max_num):
        has_custom_op = is_custom_op_loaded()
        # TensorRT nms plugin is aligned with original nms in ONNXRuntime
        is_trt_backend = os.environ.get("ONNX_BACKEND") == "MMCVTensorRT"
        if has_custom_op and (not is_trt_backend):
            return g.op("mmcv::NonMaxSuppression", bboxes, scores, iou_threshold_f=float(iou_threshold),
                        offset_i=int(offset))
        else:
            from torch.onnx.symbolic_opset9 import select, squeeze, unsqueeze

            boxes = unsqueeze(g, bboxes, 0)
            scores = unsqueeze(g, unsqueeze(g, scores, 0), 0)
            if max_num > 0:
                max_num = g.op("Constant", value_t=torch.tensor(max_num, dtype=torch.long))
            else:
                dim = g.op("Constant", value_t=torch.tensor(0))
                max_num = _size_helper(g, bboxes, dim)
            max_output_per_class = max_num
            iou_threshold = g.op("Constant", value_t=torch.tensor([iou_threshold], dtype=torch.float))
            score_threshold = g.op("Constant", value_t=torch.tensor([score_threshold], dtype=torch.float))
            nms_out = g.op("NonMaxSuppression", boxes, scores, max_output_per_class, iou_threshold, score_threshold)
            return squeeze(g, select(g, nms_out, 1, g.op("Constant", value_t=torch.tensor([2], dtype=torch.long))),
                           1)


def mmcv_nms(boxes, scores, iou_threshold, offset=0, score_threshold=0, max_num=-1):
    """mmcv 1.7.2's nms (tensors only): the Function's indices, and the kept boxes with their scores."""
    assert boxes.size(1) == 4
    assert boxes.size(0) == scores.size(0)
    assert offset in (0, 1)
    inds = NMSop.apply(boxes, scores, iou_threshold, offset, score_threshold, max_num)
    dets = torch.cat((boxes[inds], scores[inds].reshape(-1, 1)), dim=1)
    return dets, inds


class NMSModel(torch.nn.Module):
    """As mmdet 2.x's batched_nms calls it: nms_cfg ``dict(type='nms', iou_threshold=0.5)``, the rest nms's
    defaults (or a score threshold and a cap, as RPN heads' configs pass them)."""

    def __init__(self, **cfg):
        super().__init__()
        self.cfg = cfg

    def forward(self, boxes, scores):
        return mmcv_nms(boxes, scores, **self.cfg)


# NOTE: mmcv 1.7.2's batched_nms finds its nms op by name (eval(nms_cfg['type'])): mmcv's nms, as above
nms = mmcv_nms


# -- mmcv 1.7.2 mmcv/ops/nms.py batched_nms (axis-aligned boxes): one nms of offset boxes, or, past split_thr boxes
# and not under torch.onnx.is_in_onnx_export(), one nms per class in a loop over torch.unique(idxs) -------------------
def batched_nms(boxes, scores, idxs, nms_cfg, class_agnostic=False):
    if nms_cfg is None:
        scores, inds = scores.sort(descending=True)
        boxes = boxes[inds]
        return torch.cat([boxes, scores[:, None]], -1), inds
    nms_cfg_ = nms_cfg.copy()
    class_agnostic = nms_cfg_.pop("class_agnostic", class_agnostic)
    if class_agnostic:
        boxes_for_nms = boxes
    else:
        max_coordinate = boxes.max()
        offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
        boxes_for_nms = boxes + offsets[:, None]
    nms_type = nms_cfg_.pop("type", "nms")
    nms_op = eval(nms_type)
    split_thr = nms_cfg_.pop("split_thr", 10000)
    # Won't split to multiple nms nodes when exporting to onnx
    if boxes_for_nms.shape[0] < split_thr or torch.onnx.is_in_onnx_export():
        dets, keep = nms_op(boxes_for_nms, scores, **nms_cfg_)
        boxes = boxes[keep]
        scores = dets[:, -1]
    else:
        max_num = nms_cfg_.pop("max_num", -1)
        total_mask = scores.new_zeros(scores.size(), dtype=torch.bool)
        scores_after_nms = scores.new_zeros(scores.size())
        for id in torch.unique(idxs):
            mask = (idxs == id).nonzero(as_tuple=False).view(-1)
            dets, keep = nms_op(boxes_for_nms[mask], scores[mask], **nms_cfg_)
            total_mask[mask[keep]] = True
            scores_after_nms[mask[keep]] = dets[:, -1]
        keep = total_mask.nonzero(as_tuple=False).view(-1)
        scores, inds = scores_after_nms[keep].sort(descending=True)
        keep = keep[inds]
        boxes = boxes[keep]
        if max_num > 0:
            keep = keep[:max_num]
            boxes = boxes[:max_num]
            scores = scores[:max_num]
    boxes = torch.cat([boxes, scores[:, None]], -1)
    return boxes, keep


class BatchedNMSModel(torch.nn.Module):
    """As mmdet 2.x's bbox heads call it: ``batched_nms(boxes, scores, labels, cfg.nms)``, here with a split_thr
    below the box count, so eager loops over the classes (mmdet's default 10000 does so on crowded images)."""

    def forward(self, boxes, scores, labels):
        return batched_nms(boxes, scores, labels, dict(type="nms", iou_threshold=0.5, split_thr=8))


def nms_fake(bboxes, scores, *rest):  # NOTE: mmcv's kernel keeps a data-dependent count
    return bboxes.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.long)


N = torch.export.Dim("n")
NMS_DYNAMIC = ({0: N}, {0: N})


# -- mmcv 1.7.2 mmcv/ops/roi_align.py RoIAlignFunction: mmcv::MMCVRoiAlign where mmcv's ops were built, else standard
# ops (_slice_helper, symbolic_opset9's squeeze and sub) --------------------------------------------------------
class _RoIAlignExt:
    """Stands in for mmcv's compiled ``roi_align_forward`` (avg mode, sampling_ratio > 0): writes into ``output``."""

    @staticmethod
    def roi_align_forward(input, rois, output, argmax_y, argmax_x, aligned_height, aligned_width, spatial_scale,
                          sampling_ratio, pool_mode, aligned):
        assert pool_mode == 1
        output.copy_(roi_align_torch(input, rois, aligned_height, aligned_width, spatial_scale, sampling_ratio,
                                     aligned))


class RoIAlignFunction(Function):
    @staticmethod
    def symbolic(g, input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned):
        has_custom_op = is_custom_op_loaded()
        if has_custom_op:
            return g.op("mmcv::MMCVRoiAlign", input, rois, output_height_i=output_size[0],
                        output_width_i=output_size[1], spatial_scale_f=spatial_scale, sampling_ratio_i=sampling_ratio,
                        mode_s=pool_mode, aligned_i=aligned)
        else:
            from torch.onnx import TensorProtoDataType
            from torch.onnx.symbolic_helper import _slice_helper
            from torch.onnx.symbolic_opset9 import squeeze, sub

            # batch_indices = rois[:, 0].long()
            batch_indices = _slice_helper(g, rois, axes=[1], starts=[0], ends=[1])
            batch_indices = squeeze(g, batch_indices, 1)
            batch_indices = g.op("Cast", batch_indices, to_i=TensorProtoDataType.INT64)
            # rois = rois[:, 1:]
            rois = _slice_helper(g, rois, axes=[1], starts=[1], ends=[5])
            if aligned:
                # rois -= 0.5/spatial_scale
                aligned_offset = g.op("Constant", value_t=torch.tensor([0.5 / spatial_scale], dtype=torch.float32))
                rois = sub(g, rois, aligned_offset)
            # roi align
            return g.op("RoiAlign", input, rois, batch_indices, output_height_i=output_size[0],
                        output_width_i=output_size[1], spatial_scale_f=spatial_scale,
                        sampling_ratio_i=max(0, sampling_ratio), mode_s=pool_mode)

    @staticmethod
    def forward(ctx, input: torch.Tensor, rois: torch.Tensor, output_size: int, spatial_scale: float = 1.0,
                sampling_ratio: int = 0, pool_mode: str = "avg", aligned: bool = True) -> torch.Tensor:
        ctx.output_size = _pair(output_size)
        ctx.spatial_scale = spatial_scale
        ctx.sampling_ratio = sampling_ratio
        assert pool_mode in ("max", "avg")
        ctx.pool_mode = 0 if pool_mode == "max" else 1
        ctx.aligned = aligned
        ctx.input_shape = input.size()
        assert rois.size(1) == 5, "RoI must be (idx, x1, y1, x2, y2)!"
        output_shape = (rois.size(0), input.size(1), ctx.output_size[0], ctx.output_size[1])
        output = input.new_zeros(output_shape)
        if ctx.pool_mode == 0:
            argmax_y = input.new_zeros(output_shape)
            argmax_x = input.new_zeros(output_shape)
        else:
            argmax_y = input.new_zeros(0)
            argmax_x = input.new_zeros(0)
        _RoIAlignExt.roi_align_forward(input, rois, output, argmax_y, argmax_x, aligned_height=ctx.output_size[0],
                                       aligned_width=ctx.output_size[1], spatial_scale=ctx.spatial_scale,
                                       sampling_ratio=ctx.sampling_ratio, pool_mode=ctx.pool_mode,
                                       aligned=ctx.aligned)
        ctx.save_for_backward(rois, argmax_y, argmax_x)
        return output


roi_align = RoIAlignFunction.apply


class RoIAlign(torch.nn.Module):
    """mmcv 1.7.2's layer (use_torchvision=False): output_size kept as a _pair tuple."""

    def __init__(self, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True):
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        self.pool_mode = pool_mode
        self.aligned = aligned

    def forward(self, input, rois):
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.pool_mode,
                         self.aligned)


def big_rois(n: int, seed: int) -> torch.Tensor:
    """Boxes of at least one cell after spatial_scale 0.5 (where ONNX RoiAlign and mmcv's kernel agree)."""
    r = rois(n, seed)
    r[:, 3:] = r[:, 1:3] + (r[:, 3:] - r[:, 1:3]).clamp(min=2.5)
    return r


K = torch.export.Dim("k")


# -- mmdeploy 1.3.1 mmdeploy/codebase/mmdet/models/task_modules/prior_generators/anchor.py GridPriorsTRTOp --------
class GridPriorsTRTOp(Function):
    @staticmethod
    def forward(ctx, base_anchors, feat_h, feat_w, stride_h: int, stride_w: int):
        """Generate grid priors by base anchors."""
        # torch>=1.13 has runtime error
        # when using torch.arange in autograd function
        output = getattr(GridPriorsTRTOp, "output", None)
        if output is not None:
            return output
        device = base_anchors.device
        dtype = base_anchors.dtype
        shift_x = torch.arange(0, feat_w, device=device).to(dtype) * stride_w
        shift_y = torch.arange(0, feat_h, device=device).to(dtype) * stride_h

        def _meshgrid(x, y, row_major=True):
            # use shape instead of len to keep tracing while exporting to onnx
            xx = x.repeat(y.shape[0])
            yy = y.view(-1, 1).repeat(1, x.shape[0]).view(-1)
            if row_major:
                return xx, yy
            else:
                return yy, xx

        shift_xx, shift_yy = _meshgrid(shift_x, shift_y)
        shifts = torch.stack([shift_xx, shift_yy, shift_xx, shift_yy], dim=-1)
        all_anchors = base_anchors[None, :, :] + shifts[:, None, :]
        all_anchors = all_anchors.view(-1, 4)
        return all_anchors

    @staticmethod
    @symbolic_helper.parse_args("v", "v", "v", "i", "i")
    def symbolic(g, base_anchors, feat_h, feat_w, stride_h: int, stride_w: int):
        """Map ops to onnx symbolics."""
        # zero_h and zero_w is used to provide shape to GridPriorsTRT
        feat_h = symbolic_helper._unsqueeze_helper(g, feat_h, [0])
        feat_w = symbolic_helper._unsqueeze_helper(g, feat_w, [0])
        zero_h = g.op("ConstantOfShape", feat_h, value_t=torch.tensor([0], dtype=torch.long))
        zero_w = g.op("ConstantOfShape", feat_w, value_t=torch.tensor([0], dtype=torch.long))
        return g.op("mmdeploy::GridPriorsTRT", base_anchors, zero_h, zero_w, stride_h_i=stride_h, stride_w_i=stride_w)


grid_priors_trt = GridPriorsTRTOp.apply


def single_level_grid_priors(base_anchors, strides, featmap_size, level_idx, dtype=torch.float32, device="cpu"):
    """mmdet 3.x AnchorGenerator.single_level_grid_priors (the origin mmdeploy's rewrite calls)."""
    base_anchors = base_anchors.to(device).to(dtype)
    feat_h, feat_w = featmap_size
    stride_w, stride_h = strides[level_idx]
    shift_x = torch.arange(0, feat_w, device=device).to(dtype) * stride_w
    shift_y = torch.arange(0, feat_h, device=device).to(dtype) * stride_h
    shift_yy, shift_xx = torch.meshgrid(shift_y, shift_x, indexing="ij")
    shift_xx, shift_yy = shift_xx.reshape(-1), shift_yy.reshape(-1)
    shifts = torch.stack([shift_xx, shift_yy, shift_xx, shift_yy], dim=-1)
    all_anchors = base_anchors[None, :, :] + shifts[:, None, :]
    return all_anchors.view(-1, 4)


class AnchorPriors(torch.nn.Module):
    """mmdeploy's TensorRT rewrite of single_level_grid_priors, called as mmdet's AnchorHead calls it: the feature
    map's size from ``cls_score.shape[-2:]`` (a traced size, not an int, at export), one level, strides (8, 8)."""

    def __init__(self, scales=(4.0, 8.0), ratios=(0.5, 1.0, 2.0), stride=8, data=True):
        super().__init__()
        self.data = data  # NOTE: False: .detach() where mmdeploy's rewrite reads .data (the fix export names)
        w = torch.tensor([stride * s / r ** 0.5 for r in ratios for s in scales])
        h = torch.tensor([stride * s * r ** 0.5 for r in ratios for s in scales])
        self.base_anchors = [torch.stack([-0.5 * w, -0.5 * h, 0.5 * w, 0.5 * h], dim=-1)]
        self.strides = [(stride, stride)]

    def forward(self, cls_score):
        featmap_size = cls_score.shape[-2:]
        level_idx, dtype, device = 0, cls_score.dtype, cls_score.device
        feat_h, feat_w = featmap_size
        output = single_level_grid_priors(self.base_anchors[level_idx], self.strides, featmap_size, level_idx, dtype,
                                          device)
        output = output.data if self.data else output.detach()
        if isinstance(feat_h, int) and isinstance(feat_w, int):
            return output
        base_anchors = self.base_anchors[level_idx].to(device).to(dtype)
        stride_w, stride_h = self.strides[level_idx]
        GridPriorsTRTOp.output = output
        return grid_priors_trt(base_anchors, feat_h, feat_w, stride_h, stride_w)


# -- mmdeploy 1.3.1 TRTBatchedNMSop called with return_index False and True in one model (outputs=2, then 3) --------
class TwoHeadsNMS(torch.nn.Module):
    """Two detection heads in one model, as a two-stage detector's RPN (no index) and its RoI head (with index) call
    mmdeploy's multiclass_nms_static: the Function's output count flips with return_index between its calls."""

    def __init__(self, first=False, second=True):
        super().__init__()
        self.first, self.second = first, second

    def call(self, boxes, scores, output_index):
        boxes = boxes if boxes.dim() == 4 else boxes.unsqueeze(2)
        return TRTBatchedNMSop.apply(boxes, scores, int(scores.shape[-1]), -1, 4, 0.5, 0.05, -1, output_index)

    def forward(self, boxes, scores):
        return self.call(boxes, scores, self.first) + self.call(boxes * 2, scores.flip(-1), self.second)


# == the tests ====================================================================================================
def nms_case(n: int, seed: int):
    boxes, scores = soft_nms_case(n, seed)
    return boxes, scores


def test_mmcv1_nms_writes_the_node_of_each_branch_and_keeps_a_data_dependent_count(reg, mmcv_ops):
    """mmdet's call (iou_threshold alone; offset, score_threshold and max_num nms()'s defaults): with mmcv's ops
    built, mmcv::NonMaxSuppression(iou_threshold, offset), which carries neither score_threshold nor max_num (forward
    has no default for them: the first call's values are the ones the kernel tiers call it with); without, standard
    NonMaxSuppression plus Gather and Squeeze in the graph. Each as the TorchScript exporter wrote it; the count of kept
    boxes follows the data in every run."""
    bridge.register(NMSop, registry=reg, fake=nms_fake)
    model, args = NMSModel(iou_threshold=0.5), nms_case(12, 0)
    ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=NMS_DYNAMIC)
    legacy = legacy_export(model, args, 17)
    if mmcv_ops:
        (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
        assert node_identity(mine, ours.graph) == node_identity(theirs, legacy.graph)
        assert node_identity(mine, ours.graph)[:3] == (
            "mmcv", "NonMaxSuppression", [("iou_threshold", onnx.AttributeProto.FLOAT, 0.5),
                                          ("offset", onnx.AttributeProto.INT, 0)])
    else:
        assert not list(custom_nodes(ours))
        # NOTE: the symbolic's ops; the caller's boxes[inds] follows (GatherND here, Gather in TorchScript's file)
        kinds = [n.op_type for n in ours.graph.node if n.op_type != "Constant"][:8]
        assert kinds == [n.op_type for n in legacy.graph.node if n.op_type != "Constant"][:8] == \
            ["Unsqueeze", "Unsqueeze", "Unsqueeze", "Shape", "Gather", "NonMaxSuppression", "Gather", "Squeeze"]
    kept = [len(model(*nms_case(n, s))[1]) for n, s in ((12, 0), (7, 1), (30, 2))]
    assert len(set(kept)) == 3  # NOTE: three runs, three counts of kept boxes
    for tier in ("python",) if mmcv_ops else ("function", "python"):
        bridge.assert_parity(model, args, registry=reg, tier=tier, dynamic_shapes=NMS_DYNAMIC,
                             extra_args=[nms_case(7, 1), nms_case(30, 2)])


def test_mmcv1_nms_with_a_score_threshold_and_a_cap(reg, mmcv_ops):
    """An RPN-like config (score_threshold 0.3, max_num 3): the standard branch writes both into NonMaxSuppression's
    inputs; mmcv's node carries neither (as TorchScript wrote it: mmcv's onnxruntime kernel applies neither, an
    upstream gap), so the kernel tiers call forward with the first call's values, and a later export with other
    values is refused, naming the argument and the value the node stands for."""
    bridge.register(NMSop, registry=reg, fake=nms_fake)
    model, args = NMSModel(iou_threshold=0.5, score_threshold=0.3, max_num=3), nms_case(12, 0)
    ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=NMS_DYNAMIC)
    legacy = legacy_export(model, args, 17)
    if mmcv_ops:
        (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
        assert node_identity(mine, ours.graph) == node_identity(theirs, legacy.graph)
        assert [a.name for a in mine.attribute] == ["iou_threshold", "offset"]
    else:
        nms = next(n for n in ours.graph.node if n.op_type == "NonMaxSuppression")
        assert len(nms.input) == 5 and not list(custom_nodes(ours))
    bridge.assert_parity(model, args, registry=reg, tier="python", dynamic_shapes=NMS_DYNAMIC,
                         extra_args=[nms_case(7, 1), nms_case(30, 2)])
    assert 0 < len(model(*args)[1]) <= 3
    if mmcv_ops:
        with pytest.raises(bridge.OpBridgeError, match=r"argument 'score_threshold' of forward does not reach the ONNX "
                                                       r"node .* the value the first export call gave \(forward has no "
                                                       r"default\) 0\.3\. Got score_threshold=0\.2\."):
            bridge.export(NMSModel(iou_threshold=0.5, score_threshold=0.2, max_num=3), args, registry=reg)


def test_mmcv1_batched_nms_exports_the_branch_it_writes_for_onnx(reg, mmcv_ops):
    """Traced with torch.onnx.is_in_onnx_export() True, as torch.onnx.export(dynamo=True) traces: one nms node over
    the class-offset boxes (the branch mmcv writes for export; the per-class loop over torch.unique cannot be
    traced), mmcv's node where its ops were built; its results equal eager's per-class loop, box for box."""
    bridge.register(NMSop, registry=reg, fake=nms_fake)
    g = torch.Generator().manual_seed(3)
    model = BatchedNMSModel()
    cases = [(*nms_case(n, s), torch.randint(0, 3, (n,), generator=g)) for n, s in ((12, 0), (30, 2), (9, 1))]
    # NOTE: mmcv's `shape[0] < split_thr` is a guard torch.export keeps (as torch.onnx.export's trace does): n >= 8
    boxes_n = torch.export.Dim("boxes_n", min=8)
    dynamic = ({0: boxes_n}, {0: boxes_n}, {0: boxes_n})
    ours = bridge.export(model, cases[0], registry=reg, opset_version=17, dynamic_shapes=dynamic)
    kinds = [(n.domain, n.op_type) for n in ours.graph.node]
    assert kinds.count(("mmcv", "NonMaxSuppression") if mmcv_ops else ("", "NonMaxSuppression")) == 1, kinds
    assert not any(op in {t for _, t in kinds} for op in ("Loop", "Unique")), kinds
    for tier in ("python",) if mmcv_ops else ("function", "python"):
        bridge.assert_parity(model, cases[0], registry=reg, tier=tier, dynamic_shapes=dynamic, extra_args=cases[1:])


def test_mmcv1_nms_tensorrt_backend_takes_the_standard_branch(reg, monkeypatch):
    """ONNX_BACKEND=MMCVTensorRT sends the symbolic to standard ops even with mmcv's ops built: read as the call's
    environment has it."""
    monkeypatch.setattr(_MMCVBuild, "ort_ops", True)
    monkeypatch.setenv("ONNX_BACKEND", "MMCVTensorRT")
    bridge.register(NMSop, registry=reg, fake=nms_fake)
    model, args = NMSModel(iou_threshold=0.5), nms_case(12, 0)
    ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=NMS_DYNAMIC)
    assert not list(custom_nodes(ours))
    assert [n.op_type for n in ours.graph.node].count("NonMaxSuppression") == 1
    bridge.assert_parity(model, args, registry=reg, dynamic_shapes=NMS_DYNAMIC, extra_args=[nms_case(30, 2)])


def test_mmcv1_roi_align_with_mmcv_ops_is_mmcvs_node(reg, monkeypatch):
    """is_custom_op_loaded() True: mmcv::MMCVRoiAlign with every attribute (aligned as an int, mode a string), the
    node the TorchScript exporter writes; forward serves it in the python tier, for any number of boxes."""
    monkeypatch.setattr(_MMCVBuild, "ort_ops", True)
    bridge.register(RoIAlignFunction, registry=reg)
    model, args = RoIAlign((3, 2), spatial_scale=0.5, sampling_ratio=2, aligned=True), (FEAT, rois(5, 0))
    ours = bridge.export(model, args, registry=reg, dynamic_shapes=(None, {0: K}))
    legacy = legacy_export(model, args, 17)
    (mine,), (theirs,) = custom_nodes(ours), custom_nodes(legacy)
    assert node_identity(mine, ours.graph) == node_identity(theirs, legacy.graph)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in mine.attribute}
    assert attrs == {"aligned": 1, "mode": b"avg", "output_height": 3, "output_width": 2, "sampling_ratio": 2,
                     "spatial_scale": 0.5}
    report = bridge.check_parity(model, args, registry=reg, tier="python", dynamic_shapes=(None, {0: K}),
                                 extra_args=[(FEAT, rois(3, 1)), (FEAT, rois(9, 2))])
    assert report.passed and all(o.max_abs == 0 for o in report.outputs), str(report)


def _ort(proto: onnx.ModelProto, args) -> torch.Tensor:
    import onnxruntime
    sess = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0])


def test_mmcv1_roi_align_standard_ops_are_torchscripts_and_disagree_from_opset_16(reg, monkeypatch):
    """is_custom_op_loaded() False: Slice, Squeeze, Cast, Slice, Sub, RoiAlign in the graph, as the TorchScript
    exporter wrote them. mmcv 1.x's symbolic was written for opset 11, where RoiAlign's coordinate_transformation_mode
    defaults to output_half_pixel; from opset 16 it defaults to half_pixel, so aligned=True shifts the boxes twice: the
    file computes what the TorchScript exporter's own opset-17 file computes (an upstream limit: the symbolic is
    right below opset 16 only), and the parity report names the symbolic as what disagrees."""
    monkeypatch.setattr(_MMCVBuild, "ort_ops", False)
    bridge.register(RoIAlignFunction, registry=reg)
    model, args = RoIAlign((3, 2), spatial_scale=0.5, sampling_ratio=2, aligned=True), (FEAT, big_rois(5, 0))
    ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=(None, {0: K}))
    legacy = legacy_export(model, args, 17)
    assert not ours.functions and not list(custom_nodes(ours))
    kinds = [n.op_type for n in ours.graph.node if n.op_type != "Constant"]
    assert kinds == [n.op_type for n in legacy.graph.node if n.op_type != "Constant"] == \
        ["Slice", "Squeeze", "Cast", "Slice", "Sub", "RoiAlign"]
    torch.testing.assert_close(_ort(ours, args), _ort(legacy, args), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_ort(legacy_export(model, args, 11), args), model(*args), rtol=1e-4, atol=1e-5)
    report = bridge.check_parity(model, args, registry=reg, rtol=1e-4, atol=1e-5)
    assert not report.passed and report.outputs[0].max_abs > 0.5
    assert "standard ops written by test_upstream_mmcv1.RoIAlignFunction.symbolic stand for its forward here" in \
        str(report)


def test_mmcv1_roi_align_both_branches_in_one_process(monkeypatch):
    """The branch is read per registration, as the flag stands then: a registry made with mmcv's ops built keeps
    mmcv's node after the flag flips, and one made after writes standard ops."""
    model, args = RoIAlign((2, 2), spatial_scale=0.5, sampling_ratio=2), (FEAT, big_rois(4, 3))
    with_ops, without = bridge.Registry(), bridge.Registry()
    monkeypatch.setattr(_MMCVBuild, "ort_ops", True)
    bridge.register(RoIAlignFunction, registry=with_ops)
    first = bridge.export(model, args, registry=with_ops)
    monkeypatch.setattr(_MMCVBuild, "ort_ops", False)
    bridge.register(RoIAlignFunction, registry=without)
    second = bridge.export(model, args, registry=without)
    assert [n.op_type for n in custom_nodes(first)] == ["MMCVRoiAlign"]
    assert not list(custom_nodes(second)) and "RoiAlign" in [n.op_type for n in second.graph.node]


def test_mmdeploy_grid_priors_shape_carriers_are_refused_naming_the_cause(reg, monkeypatch):
    """GridPriorsTRTOp's symbolic feeds its node ConstantOfShape(feat_h), ConstantOfShape(feat_w): inputs computed
    from forward's arguments, which no kernel tier can give back to forward. The refusal (at the first call: only a
    call tells feat_h is a tensor) names the inputs, the nodes and the two ways out."""
    monkeypatch.setattr(GridPriorsTRTOp, "output", None, raising=False)
    h, w = torch.export.Dim("h", min=2), torch.export.Dim("w", min=2)
    with pytest.raises(bridge.OpBridgeError, match=r"GridPriorsTRTOp\.symbolic gives its mmdeploy::GridPriorsTRT node "
                                                   r"input\(s\) it computes with other nodes \(input 1 from "
                                                   r"ConstantOfShape, input 2 from ConstantOfShape\).*Leave the "
                                                   r"Function unregistered"):
        bridge.register(GridPriorsTRTOp, registry=reg)
        bridge.export(AnchorPriors(data=False), (torch.randn(1, 2, 5, 7),), registry=reg,
                      dynamic_shapes=({2: h, 3: w},))


def test_mmdeploy_grid_priors_unregistered_traces_as_its_rewrite_computes(reg, monkeypatch):
    """The way out the refusal names: left unregistered, export warns that the symbolic is unused and traces forward,
    which returns the anchors mmdeploy's rewrite computed with the traced sizes. mmdeploy's rewrite reads them with
    ``.data``, which torch.export refuses (named, with .detach() as the fix); with .detach() the anchors follow the
    feature map's size in every run (the TorchScript exporter writes mmdeploy::GridPriorsTRT, a TensorRT plugin)."""
    monkeypatch.setattr(GridPriorsTRTOp, "output", None, raising=False)
    x = torch.randn(1, 2, 5, 7)
    h, w = torch.export.Dim("h", min=2), torch.export.Dim("w", min=2)
    with pytest.warns(UserWarning, match=r"GridPriorsTRTOp has a symbolic, which torch\.export does not use"), \
            pytest.raises(bridge.OpBridgeError, match=r"a value the model takes from a tensor's \.data .* Read it with "
                                                      r"\.detach\(\) instead"):
        bridge.export(AnchorPriors(), (x,), registry=reg, dynamic_shapes=({2: h, 3: w},))
    model = AnchorPriors(data=False)
    monkeypatch.setattr(GridPriorsTRTOp, "output", None)
    ours = bridge.export(model, (x,), registry=reg, dynamic_shapes=({2: h, 3: w},))
    assert not list(custom_nodes(ours))
    monkeypatch.setattr(GridPriorsTRTOp, "output", None)
    legacy = legacy_export(AnchorPriors(), (x,), 17)  # NOTE: as mmdeploy ships it (with .detach() torch 2.13's
    assert [n.op_type for n in custom_nodes(legacy)] == ["GridPriorsTRT"]  # TorchScript exporter fails an assert)
    monkeypatch.setattr(GridPriorsTRTOp, "output", None)
    bridge.assert_parity(model, (x,), registry=reg, dynamic_shapes=({2: h, 3: w},),
                         extra_args=[(torch.randn(1, 2, 3, 9),), (torch.randn(1, 2, 8, 4),)])
    assert model(torch.randn(1, 2, 3, 9)).shape == (3 * 9 * 6, 4)


@pytest.mark.parametrize("first, second", [(False, True), (True, False)], ids=["dets-then-index", "index-then-dets"])
def test_mmdeploy_trt_batched_nms_two_output_counts_in_one_model_are_refused(reg, first, second):
    """return_index False at one call and True at another: 2 outputs and 3 for one node type. The second call is
    refused before its fake runs, naming both counts and the way out."""
    bridge.register(TRTBatchedNMSop, registry=reg, fake=trt_batched_nms_fake)
    model, args = TwoHeadsNMS(first, second), batched_nms_case(2, 0)
    counts = (3, 2) if first else (2, 3)
    with pytest.raises(bridge.OpBridgeError, match=rf"TRTBatchedNMSop: its symbolic gives the mmdeploy::TRTBatchedNMS "
                                                   rf"node {counts[0]} output\(s\) at one call of the model and "
                                                   rf"{counts[1]} at another .*'return_index': {second}\}}\. Pass the "
                                                   r"value that sets the count alike"):
        bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=({0: B}, {0: B}))


def test_mmdeploy_trt_batched_nms_return_index_flips_between_exports_of_one_registry(reg):
    """One registry, exports with return_index False, True, False: each call's node has the output count the
    TorchScript exporter writes for it (the record is retyped), and each file agrees with forward."""
    bridge.register(TRTBatchedNMSop, registry=reg, fake=trt_batched_nms_fake)
    for same in (False, True, False):
        model, args = TwoHeadsNMS(same, same), batched_nms_case(2, 0)
        ours = bridge.export(model, args, registry=reg, opset_version=17, dynamic_shapes=({0: B}, {0: B}))
        legacy = legacy_export(model, args, 17)
        mine, theirs = custom_nodes(ours), custom_nodes(legacy)
        assert [len(n.output) for n in mine] == [len(n.output) for n in theirs] == [3 if same else 2] * 2
        assert [node_identity(n, ours.graph)[:3] for n in mine] == [node_identity(n, legacy.graph)[:3] for n in theirs]
        assert len(ours.graph.output) == (6 if same else 4)
        bridge.assert_parity(model, args, registry=reg, tier="python", dynamic_shapes=({0: B}, {0: B}),
                             extra_args=[batched_nms_case(3, 1)])
