"""bev_pool_v2: BEVDet's voxel pooling of (depth x image feature) frustum points into a BEV grid.

Semantics (as BEVDet defines them): for each interval ``i``, every point ``p`` in
``[interval_starts[i], interval_starts[i] + interval_lengths[i])`` adds
``depth.flatten()[ranks_depth[p]] * feat.reshape(-1, C)[ranks_feat[p]]`` into the BEV cell
``ranks_bev[interval_starts[i]]``. The output (B, Z, Y, X, C) starts at zero and is
returned as (B, C, Z, Y, X). float16 accumulates in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import torch
from onnxscript import BOOL, DOUBLE, INT64, script, values
from onnxscript import opset20 as op

import bridge
from bridge import SampleInput, checks

DOMAIN = values.Opset("bev", 1)
DOUBLE_ZERO = onnx.helper.make_tensor("zero", onnx.TensorProto.DOUBLE, [], [0.0])
# NOTE: [0.0]: the zero element put after the depth values, broadcast to the zero feature row
DOUBLE_ZERO1 = onnx.helper.make_tensor("zero", onnx.TensorProto.DOUBLE, [1], [0.0])
FLOAT_ZERO1 = onnx.helper.make_tensor("zero", onnx.TensorProto.FLOAT, [1], [0.0])
FLOAT32 = onnx.TensorProto.FLOAT
# NOTE: 1e-300 is zero once cast to float32 or float16 and nonzero only in float64: the function
# body's test for a float64 input (cast to bool).
WIDE_PROBE = onnx.helper.make_tensor("probe", onnx.TensorProto.DOUBLE, [], [1e-300])
# NOTE: points per padded chunk in the function body, one batched MatMul row each: onnxruntime's
# batched MatMul pays per row, so 16 (1.6x fewer rows than 8 at BEVDet size, where the mean
# interval is ~18 points) is faster although it pads more.
CHUNK = 16
SLOTS = list(range(CHUNK))
# NOTE: the entry put after ranks_feat (and ranks_bev), which padding reads by index -1: its value -1
# picks the zero feature row put last
INT32_PAD = onnx.helper.make_tensor("pad", onnx.TensorProto.INT32, [1], [-1])
_INDEX_NAMES = ("ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths")


POINTS = "ranks_depth, ranks_feat and ranks_bev must have one entry per point"
# NOTE: the op's one validation spec: eager (below), the function body's guards, the function
# tier's messages and the native kernel's messages (tests/op_db.py) all follow this list.
# Only the interval's first ranks_bev entry picks its cell (BEVDet's semantics): ranks_bev need
# not be constant within an interval, and every tier uses ranks_bev[interval_starts[i]].
CHECKS = [
    checks.rank("depth", 5, what="input 'depth' must be (B,N,D,H,W)", fix="Pass 5-D depth."),
    checks.rank("feat", 5, what="input 'feat' must be (B,N,H,W,C)", fix="Pass 5-D feat."),
    checks.same_dtype("feat", "depth", floating=True, fix="Cast both to one floating dtype."),
    *(checks.dtype_is(name, [torch.int32], fix=f"Use {name}.int().") for name in _INDEX_NAMES),
    *(checks.rank(name, 1, fix=f"Use {name}.flatten().") for name in _INDEX_NAMES),
    checks.attr_len("bev_feat_shape", 5, what="attribute 'bev_feat_shape' must be [B, Z, Y, X, C]",
                    fix="Pass 5 sizes."),
    checks.attr_ge("bev_feat_shape", 0, what="attribute 'bev_feat_shape' must be [B, Z, Y, X, C] >= 0",
                   fix="Pass sizes >= 0."),
    # NOTE: as the native kernel: every product of the sizes (cells, elements, bytes) fits int64
    checks.attr_prod_le("bev_feat_shape", 2**60, what="attribute 'bev_feat_shape' describes more elements than "
                        "memory can hold (at most 2**60)", fix="Pass the grid's real sizes."),
    checks.dim_eq("feat", 4, checks.attr("bev_feat_shape")[4],
                  what="attribute bev_feat_shape[4] (C) = {value} must equal feat.shape[4]",
                  fix="Pass the feature channel count as C."),
    checks.same_len("ranks_feat", "ranks_depth", what=POINTS, fix="Pass equal lengths."),
    checks.same_len("ranks_bev", "ranks_depth", what=POINTS, fix="Pass equal lengths."),
    checks.same_len("interval_lengths", "interval_starts", fix="Pass one length per interval."),
    checks.values_in("ranks_depth", 0, checks.numel("depth")),
    # NOTE: feature rows from the leading dims, not numel // C: with C = 0 the rows are still there
    checks.values_in("ranks_feat", 0, checks.dim("feat", 0) * checks.dim("feat", 1) * checks.dim("feat", 2)
                     * checks.dim("feat", 3)),
    checks.values_in("ranks_bev", 0, checks.attr("bev_feat_shape").prod(4)),
    checks.values_ge("interval_lengths", 0, fix="Fix the intervals."),
    checks.intervals_within("interval_starts", "interval_lengths", checks.numel("ranks_depth"),
                            fix="Fix interval_starts/lengths."),
]


def _expand_intervals(ranks_bev, interval_starts, interval_lengths):
    """(point index, BEV cell) of every point covered by an interval (int64)."""
    lengths = interval_lengths.long()
    starts = interval_starts.long()
    interval_of = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    point = starts[interval_of] + torch.arange(interval_of.numel()) - offsets[interval_of]
    return point, ranks_bev.long()[starts[interval_of]]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _fake(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts, interval_lengths):
    bev_pool_v2_op.check_shapes(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts,
                                interval_lengths)
    b, z, y, x, c = bev_feat_shape
    return feat.new_empty((b, c, z, y, x))


@torch.library.custom_op("bev::bev_pool_v2_backward", mutates_args=(), device_types="cpu")
def bev_pool_v2_backward(grad_out: torch.Tensor, depth: torch.Tensor, feat: torch.Tensor,
                         ranks_depth: torch.Tensor, ranks_feat: torch.Tensor, ranks_bev: torch.Tensor,
                         interval_starts: torch.Tensor, interval_lengths: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of bev_pool_v2 for depth and feat (accumulated in float32 for float16)."""
    acc = _acc_dtype(feat.dtype)
    point, cell = _expand_intervals(ranks_bev, interval_starts, interval_lengths)
    # NOTE: flatten(0, 3), not reshape(-1, C): with C = 0 the -1 would be ambiguous
    g = grad_out.to(acc).permute(0, 2, 3, 4, 1).flatten(0, 3)[cell]
    rd, rf = ranks_depth.long()[point], ranks_feat.long()[point]
    d = depth.to(acc).reshape(-1)
    f = feat.to(acc).flatten(0, 3)
    grad_depth = torch.zeros(depth.numel(), dtype=acc).index_add_(0, rd, (g * f[rf]).sum(-1))
    grad_feat = torch.zeros(f.shape, dtype=acc).index_add_(0, rf, g * d[rd].unsqueeze(-1))
    return grad_depth.reshape(depth.shape).to(depth.dtype), grad_feat.reshape(feat.shape).to(feat.dtype)


@bev_pool_v2_backward.register_fake
def _(grad_out, depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths):
    return torch.empty_like(depth), torch.empty_like(feat)


def _setup_context(ctx, inputs, output):
    depth, feat, ranks_depth, ranks_feat, ranks_bev, _, interval_starts, interval_lengths = inputs
    ctx.save_for_backward(depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths)


def _backward(ctx, grad_out):
    grad_depth, grad_feat = bev_pool_v2_backward(grad_out, *ctx.saved_tensors)
    return grad_depth, grad_feat, None, None, None, None, None, None


@script(DOMAIN, default_opset=op)
def bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths,
                bev_feat_shape: Sequence[int]):
    # NOTE: segment sums that never mix cells and that onnxruntime runs fast and deterministically.
    # The guards (CHECKS) run first: every index below is in range.
    # 1. Intervals, in the order given, are cut into chunks of CHUNK points, the last one padded;
    #    padding reads index -1: a zero depth value and a zero feature row put at the end (0 * 0 = 0).
    #    A chunk's sum is one batched MatMul row: [1, CHUNK] depth values x [CHUNK, C] feature rows.
    # 2. Every chunk row is added into its cell of the zero grid by one ScatterElements-add, in row
    #    order (onnxruntime runs it serially: deterministic, a cell's rows add in its intervals'
    #    order, so no sort is needed); a cell's first row lands exactly (0 + row = row: MatMul's
    #    sums start at +0, never -0.0).
    # Only a cell's own points meet in a sum, so an Inf/NaN/huge value stays in its cell (global
    # prefix-sum differences were tried and dropped: one Inf/NaN or huge value spoils every later
    # cell). Chunk sums accumulate in float64 for float64 input, else in float32 (float16 too);
    # the rest in float64.
    # NOTE: GatherElements, not Gather, for every gather of single elements (all 1-D here): onnxruntime's
    # Gather copies each element as a row of its own, several times slower per element
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    zero1, one1, minus1 = op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), op.Constant(value_ints=[-1])
    width = op.Constant(value_ints=[CHUNK])
    shape = op.Constant(value_ints=bev_feat_shape)
    lengths = op.Cast(interval_lengths, to=INT64.dtype)
    starts = op.Cast(interval_starts, to=INT64.dtype)
    pad = op.Constant(value=INT32_PAD)
    # an empty interval may start at the end: the pad entry (its cell is never read: it has no rows)
    cell = op.GatherElements(op.Concat(ranks_bev, pad, axis=0), starts)
    # 1. chunks: the interval (owner) of each row, the points of its slots (-1 pads)
    chunks = op.Div(op.Add(lengths, op.Constant(value_ints=[CHUNK - 1])), width)
    chunk_offsets = op.CumSum(chunks, zero, exclusive=1)
    n_rows = op.ReduceSum(chunks, keepdims=1)
    # NOTE: Tile, not Expand: symbolic_shape_infer (auto_merge) asserts on an Expand to a size computed
    # from the values; nor ConstantOfShape, which onnx.version_converter cannot take below opset 20
    marker = op.ScatterElements(op.Tile(zero1, op.Add(n_rows, one1)), chunk_offsets,
                                op.Expand(one, op.Shape(chunks)), reduction="add")
    owner = op.Sub(op.CumSum(op.Slice(marker, zero1, n_rows), zero), one)
    # NOTE: the row index as a CumSum over the rows (not Range(0, n_rows)): onnxruntime's symbolic
    # shape inference (quant_pre_process, no auto_merge) then sees it has owner's length
    row = op.CumSum(op.Expand(one, op.Shape(owner)), zero, exclusive=1)
    done = op.Mul(op.Sub(row, op.GatherElements(chunk_offsets, owner)), width)
    slots = op.Constant(value_ints=SLOTS)
    valid = op.Less(slots, op.Unsqueeze(op.Sub(op.GatherElements(lengths, owner), done), minus1))
    # flat: GatherElements takes indices of its data's rank
    point = op.Reshape(op.Where(valid, op.Add(op.Unsqueeze(op.Add(op.GatherElements(starts, owner), done), minus1),
                                              slots), minus1), minus1)
    rf = op.Reshape(op.GatherElements(op.Concat(ranks_feat, pad, axis=0), point), op.Constant(value_ints=[-1, CHUNK]))
    depth_flat = op.Reshape(depth, minus1)
    # NOTE: Flatten, not Reshape to [-1, C]: with C = 0 the -1 would be ambiguous
    feat_rows = op.Flatten(feat, axis=4)
    # NOTE: the zero row's shape [1, C] is that of the first feature row (with no rows, no slot reads it).
    # Not Concat([1], Shape(feat, start=4)): onnx-graphsurgeon 0.6.1 folds a Shape with start= to the
    # whole shape; nor a Gather from the bev_feat_shape constant: symbolic_shape_infer misreads it
    pad_row = op.Shape(op.Slice(feat_rows, zero1, one1))
    # 2. every row's element (cell, c) at cell * C + c of the flat grid
    # NOTE: flat (1-D), not axis 0 of [cells, C]: onnxruntime's ScatterElements costs ~3x per element
    # on the 2-D grid. C is the product of pad_row ([1, C]), for the reasons noted there.
    row_cell = op.Cast(op.GatherElements(cell, owner), to=INT64.dtype)
    channels = op.ReduceProd(pad_row, keepdims=0)
    flat = op.Reshape(op.Add(op.Mul(op.Unsqueeze(row_cell, minus1), channels), op.Range(zero, channels, one)), minus1)
    chunk_shape = op.Constant(value_ints=[-1, 1, CHUNK])
    # NOTE: depth values gathered per point (by ranks_depth), then per padded slot: one gather over the
    # padded slots fewer than gathering their depth indices first
    if op.Cast(op.CastLike(op.Constant(value=WIDE_PROBE), feat), to=BOOL.dtype):
        z64 = op.Constant(value=DOUBLE_ZERO1)
        d64 = op.GatherElements(op.Concat(op.Cast(op.GatherElements(depth_flat, ranks_depth), to=DOUBLE.dtype), z64,
                                          axis=0), point)
        f64 = op.Gather(op.Concat(op.Cast(feat_rows, to=DOUBLE.dtype), op.Expand(z64, pad_row), axis=0), rf)
        part = op.MatMul(op.Reshape(d64, chunk_shape), f64)
    else:
        z32 = op.Constant(value=FLOAT_ZERO1)
        d32 = op.GatherElements(op.Concat(op.Cast(op.GatherElements(depth_flat, ranks_depth), to=FLOAT32), z32, axis=0),
                                point)
        f32 = op.Gather(op.Concat(op.Cast(feat_rows, to=FLOAT32), op.Expand(z32, pad_row), axis=0), rf)
        part = op.Cast(op.MatMul(op.Reshape(d32, chunk_shape), f32), to=DOUBLE.dtype)
    # NOTE: the grid in float64 for every input type: float16 converters (onnxconverter-common) turn every
    # float32 tensor into float16, and onnxruntime has no float16 ScatterElements-add
    acc = op.ScatterElements(op.Reshape(op.Expand(op.Constant(value=DOUBLE_ZERO), shape), minus1), flat,
                             op.Reshape(part, minus1), axis=0, reduction="add")
    # NOTE: allowzero: a zero size in bev_feat_shape (an empty grid) is a size, not "copy this dim"
    return op.Transpose(op.CastLike(op.Reshape(acc, shape, allowzero=1), feat), perm=[0, 4, 1, 2, 3])


def reference(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts,
              interval_lengths) -> torch.Tensor:
    """Independent reference: a plain loop over intervals and points, accumulating in float64."""
    b, z, y, x, c = bev_feat_shape
    out = np.zeros((b * z * y * x, c), np.float64)
    d = depth.double().numpy().reshape(-1)
    f = feat.double().numpy().reshape(-1 if c else int(np.prod(feat.shape[:4])), c)
    rd, rf, rb = ranks_depth.numpy(), ranks_feat.numpy(), ranks_bev.numpy()
    for start, length in zip(interval_starts.tolist(), interval_lengths.tolist()):
        for p in range(start, start + length):
            out[rb[start]] += d[rd[p]] * f[rf[p]]
    return torch.from_numpy(out.reshape(b, z, y, x, c).transpose(0, 4, 1, 2, 3).copy()).to(feat.dtype)


def voxel_pooling_prepare(coords: torch.Tensor, grid: Sequence[int]):
    """BEVDet's ``voxel_pooling_prepare_v2`` from integer voxel coordinates.

    ``coords`` is (B, N, D, H, W, 3) with (x, y, z) voxel indices per frustum point;
    ``grid`` is (X, Y, Z). Points outside the grid are dropped, the rest sorted by BEV
    cell. Returns int32 (ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths).
    """
    b, n, d, h, w, _ = coords.shape
    gx, gy, gz = grid
    ranks_depth = torch.arange(b * n * d * h * w, dtype=torch.int64)
    ranks_feat = torch.arange(b * n * h * w).reshape(b, n, 1, h, w).expand(b, n, d, h, w).reshape(-1)
    batch = torch.arange(b).reshape(b, 1, 1, 1, 1).expand(b, n, d, h, w).reshape(-1)
    xyz = coords.reshape(-1, 3).long()
    keep = ((xyz >= 0) & (xyz < torch.tensor([gx, gy, gz]))).all(-1)
    xyz, batch, ranks_depth, ranks_feat = xyz[keep], batch[keep], ranks_depth[keep], ranks_feat[keep]
    ranks_bev = batch * (gz * gy * gx) + xyz[:, 2] * (gy * gx) + xyz[:, 1] * gx + xyz[:, 0]
    order = torch.argsort(ranks_bev, stable=True)
    ranks_bev, ranks_depth, ranks_feat = ranks_bev[order], ranks_depth[order], ranks_feat[order]
    change = torch.ones(ranks_bev.numel(), dtype=torch.bool)
    change[1:] = ranks_bev[1:] != ranks_bev[:-1]
    starts = torch.nonzero(change).flatten()
    lengths = torch.diff(starts, append=torch.tensor([ranks_bev.numel()]))
    return tuple(t.int().contiguous() for t in (ranks_depth, ranks_feat, ranks_bev, starts, lengths))


def voxel_pooling_prepare_v2(coords: torch.Tensor, grid: Sequence[int]):
    """:func:`voxel_pooling_prepare` with BEVDet's return order:
    ``ranks_bev, ranks_depth, ranks_feat, interval_starts, interval_lengths`` (int32)."""
    ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths = voxel_pooling_prepare(coords, grid)
    return ranks_bev, ranks_depth, ranks_feat, interval_starts, interval_lengths


def random_case(b=1, n=2, d=4, h=3, w=5, c=6, grid=(5, 4, 2), keep=0.8, dtype=torch.float32, seed=0):
    """Random depth/feat and prepared ranks; ``keep`` is roughly the fraction of points in the grid."""
    g = torch.Generator().manual_seed(seed)
    gx, gy, gz = grid
    span = torch.tensor([gx, gy, gz], dtype=torch.float32) / keep ** (1 / 3)
    coords = (torch.rand(b, n, d, h, w, 3, generator=g) * span).floor().long()
    ranks = voxel_pooling_prepare(coords, grid)
    depth = torch.rand(b, n, d, h, w, generator=g).softmax(2).to(dtype)
    feat = torch.randn(b, n, h, w, c, generator=g).to(dtype)
    rd, rf, rb, starts, lengths = ranks
    return (depth, feat, rd, rf, rb, [b, gz, gy, gx, c], starts, lengths)


def edge_case(dtype=torch.float32):
    """Zero-length intervals (first, middle, trailing at start == points), two intervals on one cell,
    and points no interval covers."""
    depth, feat, _, _, _, shape, _, _ = random_case(dtype=dtype, seed=5)
    rd = torch.tensor([0, 5, 9, 17, 33, 2, 8, 40], dtype=torch.int32)
    rf = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], dtype=torch.int32)
    rb = torch.tensor([3, 3, 7, 7, 7, 3, 11, 12], dtype=torch.int32)
    starts = torch.tensor([0, 0, 2, 5, 5, 8], dtype=torch.int32)
    lengths = torch.tensor([0, 2, 3, 0, 1, 0], dtype=torch.int32)
    return (depth, feat, rd, rf, rb, shape, starts, lengths)


def empty_grid_case(dtype=torch.float32):
    """A grid with Z = 0 (no cells): no points, no intervals; the output is (B, C, 0, Y, X)."""
    depth, feat, _, _, _, (b, _, y, x, c), _, _ = random_case(dtype=dtype, seed=6)
    none = torch.zeros(0, dtype=torch.int32)
    return (depth, feat, none, none, none, [b, 0, y, x, c], none, none)


def mixed_cells_case(dtype=torch.float32):
    """Intervals whose points have different ranks_bev: the interval's first entry picks the cell
    (BEVDet's semantics; every tier agrees, none rejects it)."""
    depth, feat, _, _, _, shape, _, _ = random_case(dtype=dtype, seed=7)
    rd = torch.tensor([0, 5, 9, 17, 33], dtype=torch.int32)
    rf = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    rb = torch.tensor([3, 7, 7, 12, 3], dtype=torch.int32)
    return (depth, feat, rd, rf, rb, shape, torch.tensor([0, 2], dtype=torch.int32),
            torch.tensor([2, 3], dtype=torch.int32))


def sample_inputs(dtype: torch.dtype) -> list[SampleInput]:
    return [
        SampleInput(edge_case(dtype), name="edge_intervals"),
        SampleInput(empty_grid_case(dtype), name="empty_grid"),
        SampleInput(mixed_cells_case(dtype), name="mixed_cells"),
        SampleInput(random_case(dtype=dtype), name="small"),
        SampleInput(random_case(b=2, n=3, d=5, h=4, w=4, c=3, grid=(3, 3, 1), keep=0.9, dtype=dtype, seed=1),
                    name="batch2_dense"),
        SampleInput(random_case(keep=0.05, dtype=dtype, seed=2), name="sparse"),
    ]


@bridge.op(
    "bev::bev_pool_v2", fake=_fake, backward=_backward, setup_context=_setup_context,
    function=bev_pool_v2, reference=reference, sample_inputs=sample_inputs, checks=CHECKS,
    dtypes=(torch.float32, torch.float16, torch.float64), device_types="cpu",
)
def bev_pool_v2_op(depth: torch.Tensor, feat: torch.Tensor, ranks_depth: torch.Tensor,
                   ranks_feat: torch.Tensor, ranks_bev: torch.Tensor, bev_feat_shape: list[int],
                   interval_starts: torch.Tensor, interval_lengths: torch.Tensor) -> torch.Tensor:
    """BEVDet bev_pool_v2: pool depth-weighted image features into a (B, C, Z, Y, X) BEV grid.

    BEVDet's own call order: ``bev_feat_shape`` (a tuple or list ``(B, Z, Y, X, C)``) comes before
    ``interval_starts``; keyword calls by argument name work too.
    """
    args = (depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts, interval_lengths)
    bev_pool_v2_op.check(*args)
    acc = _acc_dtype(feat.dtype)
    b, z, y, x, c = bev_feat_shape
    point, cell = _expand_intervals(ranks_bev, interval_starts, interval_lengths)
    values_ = feat.to(acc).flatten(0, 3)[ranks_feat.long()[point]] * \
        depth.to(acc).reshape(-1)[ranks_depth.long()[point]].unsqueeze(-1)
    out = torch.zeros(b * z * y * x, c, dtype=acc).index_add_(0, cell, values_)
    return out.reshape(b, z, y, x, c).permute(0, 4, 1, 2, 3).contiguous().to(feat.dtype)
