"""crop: PIL-style ``Image.crop(box)`` on tensors (..., H, W); pixels outside the image are 0.

``box = [left, top, right, bottom]`` (right/bottom exclusive). The gradient is written with
``paste``: the output gradient is pasted at (left, top) into zeros of the image's shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
from bridge import SampleInput, checks

DOMAIN = values.Opset("opbridge", 1)


BOX = "attribute 'box' must be [left, top, right, bottom]"
# NOTE: the op's one validation spec: eager, fake, the function body's guards and every tier's messages.
CHECKS = [
    checks.rank("img", 2, at_least=True, what="input 'img' must be an image (..., H, W)",
                fix="Pass at least a 2-D tensor."),
    checks.attr_len("box", 4, what=BOX, fix="Pass a valid box."),
    checks.attr_le("box", [(0, 2), (1, 3)], what=BOX + " with right >= left and bottom >= top",
                   fix="Pass a valid box."),
]


def _fake(img, box):
    crop_op.check_shapes(img, box)
    return img.new_empty((*img.shape[:-2], box[3] - box[1], box[2] - box[0]))


def _setup_context(ctx, inputs, output):
    img, box = inputs
    ctx.image_shape, ctx.box = img.shape, list(box)


def _backward(ctx, grad):
    left, top = ctx.box[0], ctx.box[1]
    zeros = grad.new_zeros(ctx.image_shape)
    return torch.ops.opbridge.paste(zeros, grad, left, top), None


@script(DOMAIN, default_opset=op)
def crop(img, box: Sequence[int]):
    # NOTE: one zero row/column is padded at the end; indices outside the image point there.
    b = op.Constant(value_ints=box)
    hw = op.Shape(img, start=-2)
    h, w = op.Gather(hw, 0), op.Gather(hw, 1)
    one = op.Constant(value_int=1)
    rows = op.Range(op.Gather(b, 1), op.Gather(b, 3), one)
    cols = op.Range(op.Gather(b, 0), op.Gather(b, 2), one)
    zero = op.Constant(value_int=0)
    src_r = op.Where(op.And(op.GreaterOrEqual(rows, zero), op.Less(rows, h)), rows, h)
    src_c = op.Where(op.And(op.GreaterOrEqual(cols, zero), op.Less(cols, w)), cols, w)
    padded = op.Pad(img, op.Constant(value_ints=[0, 0, 1, 1]), None, op.Constant(value_ints=[-2, -1]))
    return op.Gather(op.Gather(padded, src_r, axis=-2), src_c, axis=-1)


def reference(img: torch.Tensor, box) -> torch.Tensor:
    """Independent reference: a per-pixel loop over the output."""
    left, top, right, bottom = box
    h, w = img.shape[-2:]
    out = torch.zeros((*img.shape[:-2], bottom - top, right - left), dtype=img.dtype)
    for i in range(bottom - top):
        for j in range(right - left):
            if 0 <= top + i < h and 0 <= left + j < w:
                out[..., i, j] = img[..., top + i, left + j]
    return out


def sample_inputs(dtype: torch.dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(0)
    img = torch.randn(3, 6, 7, generator=g).to(dtype)
    return [
        SampleInput((img, [1, 2, 5, 4]), name="inside"),
        SampleInput((img, [-2, -1, 3, 8]), name="overhang"),
        SampleInput((img, [9, 9, 11, 10]), name="outside"),
        SampleInput((img, [2, 2, 2, 5]), name="empty"),
        SampleInput((torch.randn(2, 1, 4, 4, generator=g).to(dtype), [0, 0, 4, 4]), name="batched_full"),
    ]


@bridge.op(
    "opbridge::crop", fake=_fake, backward=_backward, setup_context=_setup_context,
    function=crop, reference=reference, sample_inputs=sample_inputs, checks=CHECKS,
    dtypes=(torch.float32, torch.float16, torch.float64),
)
def crop_op(img: torch.Tensor, box: list[int]) -> torch.Tensor:
    """PIL-style crop of ``img`` (..., H, W) to ``box`` = [left, top, right, bottom]; outside is 0."""
    crop_op.check(img, box)
    left, top, right, bottom = box
    h, w = img.shape[-2:]
    out = img.new_zeros((*img.shape[:-2], bottom - top, right - left))
    y0, y1, x0, x1 = max(top, 0), min(bottom, h), max(left, 0), min(right, w)
    if y0 < y1 and x0 < x1:
        out[..., y0 - top:y1 - top, x0 - left:x1 - left] = img[..., y0:y1, x0:x1]
    return out
