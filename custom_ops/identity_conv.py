"""identity_conv: a 1x1 convolution with identity weights over ``channels`` channels (output == input).

The stateless form of the seeds' ``IdentityConvClass(channels)``; ``channels`` is checked
against the input's channel dim, so a wrong attribute is an error, not a silent copy.
"""

from __future__ import annotations

import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
from bridge import SampleInput

DOMAIN = values.Opset("opbridge", 1)


def _check(x: torch.Tensor, channels: int) -> None:
    if x.dim() < 2 or x.shape[1] != channels:
        raise ValueError(
            f"opbridge: identity_conv expects input (N, channels, ...) with channels={channels}. "
            f"Got shape {tuple(x.shape)}. Pass channels=x.shape[1]."
        )


def _fake(x, channels):
    _check(x, channels)
    return torch.empty_like(x)


def _backward(ctx, grad):
    return grad, None


def _setup_context(ctx, inputs, output):
    pass


@script(DOMAIN, default_opset=op)
def identity_conv(x, channels: int):
    return op.Identity(x)


def reference(x: torch.Tensor, channels: int) -> torch.Tensor:
    """Independent reference: an actual conv with an identity kernel, in float64."""
    weight = torch.eye(channels, dtype=torch.float64).reshape(channels, channels, *([1] * (x.dim() - 2)))
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}
    return conv[x.dim()](x.double(), weight).to(x.dtype)


def sample_inputs(dtype: torch.dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(0)
    return [
        SampleInput((torch.randn(2, 3, 5, 4, generator=g).to(dtype), 3), name="nchw"),
        SampleInput((torch.randn(1, 1, 7, generator=g).to(dtype), 1), name="ncw"),
        SampleInput((torch.randn(0, 4, 2, 2, generator=g).to(dtype), 4), name="empty_batch"),
    ]


@bridge.op(
    "opbridge::identity_conv", fake=_fake, backward=_backward, setup_context=_setup_context,
    function=identity_conv, reference=reference, sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.float64),
)
def identity_conv_op(x: torch.Tensor, channels: int) -> torch.Tensor:
    """1x1 convolution with identity weights: returns a copy of ``x`` (N, channels, ...)."""
    _check(x, channels)
    return x.clone()
