"""identity_conv: a 1x1 convolution with identity weights over ``channels`` channels (output == input).

Also the op behind the torchbind class ``opbridge_classes::IdentityConvClass(channels)``
(C++ in ``csrc/identity_conv_class.cpp``, built with torch.utils.cpp_extension on first use):
export turns ``obj.forward(x)`` into ``identity_conv(x, channels=<obj state>)``. ``channels`` is
checked against the input's channel dim, so a wrong attribute is an error, not a silent copy.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
from bridge import SampleInput
from bridge.progress import step

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
    """Independent reference: output channel c gathers input channel c (an identity weight picks
    exactly one input; NaN/Inf stay in their channel, as the 1x1 identity conv defines)."""
    return x.index_select(1, torch.arange(channels)).clone()


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
    dtypes=(torch.float32, torch.float16, torch.float64), torchbind=["opbridge_classes::IdentityConvClass.forward"],
)
def identity_conv_op(x: torch.Tensor, channels: int) -> torch.Tensor:
    """1x1 convolution with identity weights: returns a copy of ``x`` (N, channels, ...)."""
    _check(x, channels)
    return x.clone()


class FakeIdentityConvClass:
    """Fake (tracing) stand-in of IdentityConvClass: same state, fake forward."""

    def __init__(self, channels: int):
        self.channels = channels

    @classmethod
    def __obj_unflatten__(cls, flat):
        return cls(**dict(flat))

    def forward(self, x):
        return _fake(x, self.channels)


@functools.cache
def load_identity_conv_class():
    """Build (once, cached) and load the torchbind class; register its fake class. Returns the class.

    The build uses torch.utils.cpp_extension (g++ and ninja); the cache lives in
    ``$OPBRIDGE_CACHE_DIR`` or ``~/.cache/opbridge``.
    """
    from torch.utils import cpp_extension

    cache = Path(os.environ.get("OPBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "opbridge") / "torchbind"
    cache.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).with_name("csrc") / "identity_conv_class.cpp"
    with step("building/loading torchbind class IdentityConvClass"):
        cpp_extension.load(name="opbridge_classes", sources=[str(source)], build_directory=str(cache),
                           is_python_module=False, verbose=False)
    torch._library.fake_class_registry.register_fake_class(
        "opbridge_classes::IdentityConvClass", FakeIdentityConvClass)
    return torch.classes.opbridge_classes.IdentityConvClass


def IdentityConvClass(channels: int):
    """A new ``torch.classes.opbridge_classes.IdentityConvClass(channels)`` (builds on first use)."""
    return load_identity_conv_class()(channels)
