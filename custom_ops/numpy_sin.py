"""numpy_sin: writes ``sin(input)`` into ``output`` through NumPy (a mutating op).

The seeds' mutating pattern (``mutates_args={"output"}``); it returns nothing. For export the
bridge derives its functional twin ``numpy_sin_functional(input, output) -> Tensor`` (the new
``output``); the function body and C++ kernel below are that functional form's.
"""

from __future__ import annotations

import numpy as np
import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
from bridge import SampleInput, checks

# NOTE: the op's one validation spec: eager, fake, the function body's guards and every tier's messages.
CHECKS = [
    checks.same_shape("output", "input", fix="Pass output=torch.empty_like(input)."),
    checks.same_dtype("output", "input", fix="Pass output=torch.empty_like(input)."),
]


def _fake(input, output):
    numpy_sin_op.check_shapes(input, output)


@script(values.Opset("opbridge", 1), default_opset=op)
def numpy_sin(input, output):
    return op.Sin(input)


def reference(input: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """Independent reference: the new value of ``output``, from torch.sin in float64."""
    return torch.sin(input.double()).to(input.dtype)


def sample_inputs(dtype: torch.dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g).to(dtype)
    return [SampleInput((x, torch.empty_like(x)), name="matrix"),
            SampleInput((x[0], torch.zeros_like(x[0])), name="vector"),
            SampleInput((x[0, 0], torch.zeros_like(x[0, 0])), name="scalar")]


@bridge.op("opbridge::numpy_sin", mutates_args=("output",), fake=_fake, function=numpy_sin, reference=reference,
           sample_inputs=sample_inputs, dtypes=(torch.float32, torch.float64), device_types="cpu",
           checks=CHECKS)
def numpy_sin_op(input: torch.Tensor, output: torch.Tensor) -> None:
    """Write ``np.sin(input)`` into ``output`` (CPU tensors)."""
    numpy_sin_op.check(input, output)
    # NOTE: sin(+-inf) is NaN, as in torch and ONNX, without numpy's RuntimeWarning
    with np.errstate(invalid="ignore"):
        output.copy_(torch.from_numpy(np.asarray(np.sin(input.numpy()))))  # asarray: 0-d gives a scalar
