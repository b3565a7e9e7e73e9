"""Helpers for testing ops: a module around one op call, and the op x dtype x sample case table."""

from __future__ import annotations

import dataclasses

import torch

from bridge.core.checks import DimEq
from bridge.core.spec import OpSpec, SampleInput

_TENSOR = object()  # a tensor slot of a sample (None stays an omitted optional input)


class OpModule(torch.nn.Module):
    """``forward(*tensors)`` calls ``spec``'s op with the sample's non-tensor args fixed.

    >>> import torch, bridge, custom_ops
    >>> spec = bridge.REGISTRY.get("opbridge::crop")
    >>> m, args = OpModule.from_sample(spec, spec.sample_inputs(torch.float32)[0])
    >>> tuple(m(*args).shape)
    (3, 2, 4)
    """

    def __init__(self, spec: OpSpec, template: tuple, kwargs: dict):
        super().__init__()
        self.spec, self.template, self.call_kwargs = spec, template, kwargs

    @classmethod
    def from_sample(cls, spec: OpSpec, sample: SampleInput) -> tuple[OpModule, tuple]:
        tensors = tuple(a for a in sample.args if isinstance(a, torch.Tensor))
        template = tuple(_TENSOR if isinstance(a, torch.Tensor) else a for a in sample.args)
        return cls(spec, template, dict(sample.kwargs)), tensors

    def forward(self, *tensors):
        it = iter(tensors)
        args = [next(it) if a is _TENSOR else a for a in self.template]
        out = self.spec.overload(*args, **self.call_kwargs)
        if not self.spec.mutated:
            return out
        # a mutating op's results are the new values of what it wrote (read after the call)
        names = [p.name for p in self.spec.params]
        written = tuple(args[names.index(m)] for m in self.spec.mutated)
        return written if out is None else (out, *written)


def free_dims(spec: OpSpec, tensors) -> tuple[dict, ...]:
    """``dynamic_shapes`` for an op's tensor inputs (as ``OpModule`` takes them): every dim
    ``Dim.AUTO`` but those a ``dim_eq`` check ties to an attribute, which export would specialise.

    >>> import torch, bridge, custom_ops
    >>> spec = bridge.REGISTRY.get("opbridge::identity_conv")
    >>> sorted(free_dims(spec, [torch.zeros(1, 3, 4, 4)])[0])  # dim 1 is the channels attribute
    [0, 2, 3]
    """
    pinned = {(c.input, c.axis) for c in spec.checks or () if isinstance(c, DimEq)}
    return tuple({i: torch.export.Dim.AUTO for i in range(t.dim())
                  if (p.name, i) not in pinned and (p.name, i - t.dim()) not in pinned}
                 for p, t in zip(spec.tensors, tensors))


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of a parity table: op x dtype x sample."""

    spec: OpSpec
    dtype: torch.dtype
    sample: SampleInput

    @property
    def id(self) -> str:
        parts = (self.spec.qualname, str(self.dtype).replace("torch.", ""), self.sample.name)
        return "-".join(p for p in parts if p)  # NOTE: an unnamed sample adds no empty part


def cases(registry, dtypes=None) -> list[Case]:
    """Every (op, dtype, sample) the registry declares; ``dtypes`` narrows the dtypes."""
    out: list[Case] = []
    for spec in registry:
        if spec.sample_inputs is None:
            continue
        for dtype in spec.dtypes:
            if dtypes is not None and dtype not in dtypes:
                continue
            out.extend(Case(spec, dtype, s) for s in spec.sample_inputs(dtype))
    return out


@dataclasses.dataclass
class ModelCase:
    """A model with example inputs: what ``opbridge export/check --model MOD:FACTORY`` expects.

    ``extra_args`` are further input sets run through the same exported file (dynamic shapes).
    """

    model: torch.nn.Module
    args: tuple
    dynamic_shapes: object = None
    extra_args: tuple = ()
    name: str = ""
