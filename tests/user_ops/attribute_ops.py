"""User ops whose attributes carry meaning (issues #32, #34), each with a C++ kernel, in their own registry:
an optional attribute whose None differs from its default, an attribute whose op default differs from
the ONNX op its body calls, a keyword-only attribute, an int[] attribute that may be empty (a derived body), and
float and float[] attributes whose sign of zero changes the result."""

import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge

REGISTRY = bridge.Registry()
ATTRDEMO = values.Opset("attrdemo", 1)


def _samples(*calls):
    return lambda dtype: [bridge.SampleInput((torch.randn(3, 5).to(dtype), *args), kwargs) for args, kwargs in calls]


def _shift_body(k):
    step = float(100 if k is None else k)

    @script(ATTRDEMO, default_opset=op)
    def shift(x):
        return op.Add(x, op.CastLike(op.Constant(value_float=step), x))

    return shift


@bridge.op("attrdemo::shift", fake=lambda x, k=3: torch.empty_like(x), function=_shift_body, native="attr_shift.cc",
           sample_inputs=_samples(((None,), {}), ((7,), {})), registry=REGISTRY)
def shift_op(x: torch.Tensor, k: int | None = 3) -> torch.Tensor:
    """x + k; x + 100 when k is None (None is not the default 3)."""
    return x + (100 if k is None else k)


@script(ATTRDEMO, default_opset=op)
def leaky(x, slope: float):
    return op.LeakyRelu(x, alpha=slope)  # NOTE: LeakyRelu's own default alpha is 0.01


@bridge.op("attrdemo::leaky", fake=lambda x, slope=0.1: torch.empty_like(x), function=leaky,
           native="attr_leaky.cc", sample_inputs=_samples(((), {}), ((0.3,), {})), registry=REGISTRY)
def leaky_op(x: torch.Tensor, slope: float = 0.1) -> torch.Tensor:
    """Leaky ReLU whose default slope (0.1) is not ONNX LeakyRelu's (0.01)."""
    return torch.nn.functional.leaky_relu(x, slope)


@script(ATTRDEMO, default_opset=op)
def scale(x, k: int):
    return op.Mul(x, op.CastLike(op.Constant(value_int=k), x))


@bridge.op("attrdemo::scale", fake=lambda x, *, k: torch.empty_like(x), function=scale, native="attr_scale.cc",
           sample_inputs=_samples(((), {"k": 3})), registry=REGISTRY)
def scale_op(x: torch.Tensor, *, k: int) -> torch.Tensor:
    """x * k, k keyword-only."""
    return x * k


@bridge.op("attrdemo::offsets", fake=lambda x, steps: torch.empty_like(x), native="attr_offsets.cc",
           sample_inputs=_samples((([],), {}), (([2, 5],), {})), registry=REGISTRY)
def offsets_op(x: torch.Tensor, steps: list[int]) -> torch.Tensor:
    """x + sum(steps); steps may be empty. No written body: the function tier's is derived."""
    return x + sum(steps)


@bridge.op("attrdemo::scale_add", fake=lambda x, *, k, b=0.5: torch.empty_like(x), registry=REGISTRY)
def scale_add_op(x: torch.Tensor, *, k: int, b: float = 0.5) -> torch.Tensor:
    """x * k + b, keyword-only k and b. No written body, no C++ kernel: the function tier's body is derived."""
    return x * k + b


@script(ATTRDEMO, default_opset=op)
def divide(x, d: float):
    return op.Div(x, op.CastLike(op.Constant(value_float=d), x))


@bridge.op("attrdemo::divide", fake=lambda x, d: torch.empty_like(x), function=divide, native="attr_divide.cc",
           sample_inputs=_samples(((2.0,), {}), ((-0.0,), {})), registry=REGISTRY)
def divide_op(x: torch.Tensor, d: float) -> torch.Tensor:
    """x / d: x / 0.0 and x / -0.0 are infinities of opposite signs."""
    return x / d


@bridge.op("attrdemo::divide_all", fake=lambda x, ds: torch.empty_like(x), native="attr_divide_all.cc",
           sample_inputs=_samples((([2.0, -0.0],), {})), registry=REGISTRY)
def divide_all_op(x: torch.Tensor, ds: list[float]) -> torch.Tensor:
    """x divided by each of ds in turn. No written body: the function tier's is derived."""
    for d in ds:
        x = x / d
    return x if ds else x.clone()  # NOTE: a custom op's output may not alias its input


def _ignoring_bias():
    @script(ATTRDEMO, default_opset=op)
    def scaled_bias(x, bias):  # NOTE: written for the call without bias only: it never reads `bias`
        return op.Mul(x, op.CastLike(op.Constant(value_float=0.0), x))

    return scaled_bias


def _scaled_bias_body(k):
    if k == 0:
        return _ignoring_bias()
    step = float(k)

    @script(ATTRDEMO, default_opset=op)
    def scaled_bias(x, bias):
        return op.Add(op.Mul(x, op.CastLike(op.Constant(value_float=step), x)), bias)

    return scaled_bias


@bridge.op("attrdemo::scaled_bias", fake=lambda x, bias=None, k=1: torch.empty_like(x), function=_scaled_bias_body,
           registry=REGISTRY)
def scaled_bias_op(x: torch.Tensor, bias: torch.Tensor | None = None, k: int = 1) -> torch.Tensor:
    """x * k + bias. Its body builder gives one body per k (ONNX function overloads); k == 0's never reads bias."""
    return x * k if bias is None else x * k + bias
