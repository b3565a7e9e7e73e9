"""identity_conv: a 1x1 convolution with identity weights over ``channels`` channels (output == input).

Written as its original form is: a C++ op kernel plus the torchbind class
``opbridge::IdentityConvClass(channels)`` in one shared library (``csrc/identity_conv.cpp``); fake,
fake class and autograd registered from Python; bridged with ``bridge.register`` only. The op's
schema is declared here from its string, so importing this module compiles nothing: the library is
built (``bridge.build_torch_extension``: cached, verified, one progress line; g++ needed once) on
the op's first eager call or the class's first construction (``IdentityConvClass(...)`` below, or
``load_library()`` before ``torch.classes.opbridge.IdentityConvClass`` or unpickling one). Export
needs no library (fake kernels), nor do ONNX sessions of an exported file.
Export turns ``obj.forward(x)`` into ``identity_conv(x, channels=<obj state>)``. ``channels`` is
checked against the input's channel dim, so a wrong attribute is an error, not a silent copy.
"""

from __future__ import annotations

from pathlib import Path

import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
from bridge import SampleInput, checks

DOMAIN = values.Opset("opbridge", 1)
SOURCE = Path(__file__).with_name("csrc") / "identity_conv.cpp"
LIBRARY = "opbridge_identity_conv"
QUALNAME = "opbridge::identity_conv"
CLASS = "opbridge::IdentityConvClass"
SCHEMA = "identity_conv(Tensor x, int channels) -> Tensor"

# NOTE: kept for the life of the process: torch drops a Library's registrations when it is collected
_LIB = torch.library.Library("opbridge", "FRAGMENT")
_LIB.define(SCHEMA)
_loaded: list[Path] = []  # the C++ library's path, once loaded


def load_library() -> Path:
    """Build (once per source, torch version and compiler; cached and verified) and load the C++
    library: the op's CPU kernel and the torchbind class, whose fake class is registered with it."""
    if not _loaded:
        path = bridge.build_torch_extension(LIBRARY, [SOURCE], purpose=f"the C++ library of {QUALNAME} and {CLASS}")
        bridge.torch_compat.register_fake_class(CLASS, FakeIdentityConvClass)
        _loaded.append(path)
    return _loaded[0]


def _first_call(x, channels):
    # NOTE: the op's kernel until the library is loaded (CompositeExplicitAutograd: the library's CPU
    # kernel, once loaded, comes first for CPU tensors); a call landing here afterwards has no kernel.
    if _loaded:
        raise bridge.OpBridgeError(f"{QUALNAME} has a CPU kernel only. Got a tensor on {x.device}. "
                                   "Move the input to the CPU.")
    load_library()
    return torch.ops.opbridge.identity_conv.default(x, channels)


_LIB.impl("identity_conv", _first_call, "CompositeExplicitAutograd")


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


torch.library.register_fake(QUALNAME, _fake)
torch.library.register_autograd(QUALNAME, _backward, setup_context=_setup_context)
identity_conv_op = bridge.register(
    QUALNAME, function=identity_conv, reference=reference, sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.float64), torchbind=[f"{CLASS}.forward"],
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


def IdentityConvClass(channels: int):
    """A new ``torch.classes.opbridge.IdentityConvClass(channels)`` (the library is loaded first)."""
    load_library()
    return torch.classes.opbridge.IdentityConvClass(channels)
