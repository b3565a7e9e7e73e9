"""paste: PIL-style ``Image.paste(patch, (left, top))`` on tensors; returns a new image.

``patch`` (..., h, w) lands at (left, top) in ``image`` (..., H, W), clipped to the image.
Gradients: the image gets the output gradient with the pasted region zeroed; the patch gets
the ``crop`` of the output gradient at its box.
"""

from __future__ import annotations

import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
from bridge import SampleInput, checks

DOMAIN = values.Opset("opbridge", 1)


# NOTE: the op's one validation spec: eager, fake, the function body's guards and every tier's messages.
CHECKS = [
    checks.rank("image", 2, at_least=True, what="input 'image' must be (..., H, W)", fix="Pass a 2-D or larger image."),
    checks.same_shape("patch", "image", drop_last=2, fix="Match the leading dims.",
                      what="inputs 'image' (..., H, W) and 'patch' (..., h, w) must have equal leading dims"),
    checks.same_dtype("patch", "image", fix="Cast the patch to the image dtype."),
]


def _fake(image, patch, left, top):
    paste_op.check_shapes(image, patch, left, top)
    return torch.empty_like(image)


def _setup_context(ctx, inputs, output):
    image, patch, left, top = inputs
    ctx.patch_shape, ctx.left, ctx.top = patch.shape, left, top


def _backward(ctx, grad):
    h, w = ctx.patch_shape[-2:]
    box = [ctx.left, ctx.top, ctx.left + w, ctx.top + h]
    grad_image = torch.ops.opbridge.paste(grad, grad.new_zeros(ctx.patch_shape), ctx.left, ctx.top)
    return grad_image, torch.ops.opbridge.crop(grad, box), None, None


@script(DOMAIN, default_opset=op)
def paste(image, patch, left: int, top: int):
    # NOTE: each image pixel gathers from the patch (padded with one zero row/column, where
    # indices outside the patch point); a mask keeps the image outside the pasted region.
    hw, phw = op.Shape(image, start=-2), op.Shape(patch, start=-2)
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    ph, pw = op.Gather(phw, 0), op.Gather(phw, 1)
    pr = op.Sub(op.Range(zero, op.Gather(hw, 0), one), op.Constant(value_int=top))
    pc = op.Sub(op.Range(zero, op.Gather(hw, 1), one), op.Constant(value_int=left))
    in_r = op.And(op.GreaterOrEqual(pr, zero), op.Less(pr, ph))
    in_c = op.And(op.GreaterOrEqual(pc, zero), op.Less(pc, pw))
    padded = op.Pad(patch, op.Constant(value_ints=[0, 0, 1, 1]), None, op.Constant(value_ints=[-2, -1]))
    moved = op.Gather(op.Gather(padded, op.Where(in_r, pr, ph), axis=-2), op.Where(in_c, pc, pw), axis=-1)
    mask = op.And(op.Unsqueeze(in_r, op.Constant(value_ints=[-1])), op.Unsqueeze(in_c, op.Constant(value_ints=[0])))
    return op.Where(mask, moved, image)


def reference(image: torch.Tensor, patch: torch.Tensor, left: int, top: int) -> torch.Tensor:
    """Independent reference: a per-pixel loop over the patch."""
    out = image.clone()
    h, w = image.shape[-2:]
    for i in range(patch.shape[-2]):
        for j in range(patch.shape[-1]):
            if 0 <= top + i < h and 0 <= left + j < w:
                out[..., top + i, left + j] = patch[..., i, j]
    return out


def sample_inputs(dtype: torch.dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(0)
    image = torch.randn(3, 6, 7, generator=g).to(dtype)
    patch = torch.randn(3, 3, 4, generator=g).to(dtype)
    return [
        SampleInput((image, patch, 2, 1), name="inside"),
        SampleInput((image, patch, -2, 4), name="overhang"),
        SampleInput((image, patch, 20, 0), name="outside"),
        SampleInput((image, torch.randn(3, 0, 2, generator=g).to(dtype), 1, 1), name="empty_patch"),
    ]


@bridge.op(
    "opbridge::paste", fake=_fake, backward=_backward, setup_context=_setup_context,
    function=paste, reference=reference, sample_inputs=sample_inputs, checks=CHECKS,
    dtypes=(torch.float32, torch.float16, torch.float64),
)
def paste_op(image: torch.Tensor, patch: torch.Tensor, left: int, top: int) -> torch.Tensor:
    """PIL-style paste of ``patch`` into a copy of ``image`` at (left, top), clipped to the image."""
    paste_op.check(image, patch, left, top)
    out = image.clone()
    h, w = image.shape[-2:]
    ph, pw = patch.shape[-2:]
    y0, y1, x0, x1 = max(top, 0), min(top + ph, h), max(left, 0), min(left + pw, w)
    if y0 < y1 and x0 < x1:
        out[..., y0:y1, x0:x1] = patch[..., y0 - top:y1 - top, x0 - left:x1 - left]
    return out
