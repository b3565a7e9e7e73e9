"""identity_conv: a 1x1 convolution with identity weights over ``channels`` channels (output == input).

Written as its original form is: a C++ ``TORCH_LIBRARY(opbridge, m)`` op plus the torchbind class
``opbridge::IdentityConvClass(channels)`` in one shared library (``csrc/identity_conv.cpp``), built
with torch.utils.cpp_extension on first import (cached), loaded with ``torch.ops.load_library``;
fake, fake class and autograd registered from Python; bridged with ``bridge.register`` only.
Export turns ``obj.forward(x)`` into ``identity_conv(x, channels=<obj state>)``. ``channels`` is
checked against the input's channel dim, so a wrong attribute is an error, not a silent copy.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from onnxscript import opset20 as op
from onnxscript import script, values
from torch.utils import cpp_extension

import bridge
from bridge import SampleInput, checks
from bridge.core.progress import step

DOMAIN = values.Opset("opbridge", 1)
SOURCE = Path(__file__).with_name("csrc") / "identity_conv.cpp"
LIBRARY = "opbridge_identity_conv"


def load_library() -> None:
    """Build (once per source and torch version, cached) and load the C++ library into torch.

    The cache lives in ``$OPBRIDGE_CACHE_DIR`` or ``~/.cache/opbridge``; a build that finished leaves
    a ``built.ok`` marker, so later processes load the library directly, without the build tools.
    """
    if torch._C._jit_get_schemas_for_operator("opbridge::identity_conv"):
        return
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    folder = Path(os.environ.get("OPBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "opbridge") / "torch_ext" / key
    built = folder / f"{LIBRARY}.so"
    if (folder / "built.ok").is_file() and built.is_file():
        torch.ops.load_library(str(built))
        return
    folder.mkdir(parents=True, exist_ok=True)
    with step("building C++ library identity_conv + IdentityConvClass (once)"):
        cpp_extension.load(name=LIBRARY, sources=[str(SOURCE)], build_directory=str(folder),
                           is_python_module=False, verbose=False)
    (folder / "built.ok").write_text(str(built) + "\n")


load_library()


# NOTE: the op's one validation spec (fake, function-body guards, python and function tiers); the
# C++ eager kernel (csrc/identity_conv.cpp) and the native kernel check the same and say the same.
CHECKS = [
    checks.rank("x", 2, at_least=True, what="input 'x' must be (N, channels, ...)", fix="Pass x.dim() >= 2."),
    checks.dim_eq("x", 1, checks.attr("channels"), what="input 'x' must be (N, channels={value}, ...)",
                  fix="Pass channels=x.shape[1]."),
]


def _fake(x, channels):
    identity_conv_op.check_shapes(x, channels)
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


torch.library.register_fake("opbridge::identity_conv", _fake)
torch.library.register_autograd("opbridge::identity_conv", _backward, setup_context=_setup_context)
identity_conv_op = bridge.register(
    "opbridge::identity_conv", function=identity_conv, reference=reference, sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.float64), torchbind=["opbridge::IdentityConvClass.forward"],
    checks=CHECKS,
)


class FakeIdentityConvClass:
    """Fake (tracing) stand-in of IdentityConvClass: same state, fake forward."""

    def __init__(self, channels: int):
        self.channels = channels

    @classmethod
    def __obj_unflatten__(cls, flat):
        return cls(**dict(flat))

    def forward(self, x):
        return _fake(x, self.channels)


torch._library.fake_class_registry.register_fake_class("opbridge::IdentityConvClass", FakeIdentityConvClass)


def IdentityConvClass(channels: int):
    """A new ``torch.classes.opbridge.IdentityConvClass(channels)``."""
    return torch.classes.opbridge.IdentityConvClass(channels)
