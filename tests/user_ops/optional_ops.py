"""A user's op with an optional tensor input (``Tensor | None``), in its own folder with its kernel."""

import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge


@script(values.Opset("optdemo", 1), default_opset=op)
def clip_min(x, lo):
    return op.Clip(x, lo)  # Clip's min is optional in ONNX too: an omitted `lo` stays omitted


def _reference(x, lo=None):
    return x.clone() if lo is None else torch.where(x < lo, lo, x)


@bridge.op("optdemo::clip_min", fake=lambda x, lo=None: torch.empty_like(x), function=clip_min,
           reference=_reference, native="clip_min.cc", dtypes=(torch.float32,),
           sample_inputs=lambda dtype: [
               bridge.SampleInput((torch.randn(3, 4).to(dtype), None), name="lo_omitted"),
               bridge.SampleInput((torch.randn(3, 4).to(dtype), torch.tensor(0.2).to(dtype)), name="lo_given")])
def clip_min_op(x: torch.Tensor, lo: torch.Tensor | None = None) -> torch.Tensor:
    """max(x, lo), or a copy of x when lo is omitted."""
    return x.clone() if lo is None else torch.maximum(x, lo)
