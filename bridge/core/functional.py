"""The functional twin of a mutating op, derived from its schema.

``ns::op(Tensor x, Tensor(a!) out) -> ()`` gets ``ns::op_functional(Tensor x, Tensor out) -> Tensor``:
same arguments, returns the op's own results followed by the new value of each mutated tensor.
The twin is what the exporter emits; its ONNX node keeps the original op's name, because ONNX
has no mutation: the node *is* the op in functional form.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from bridge.core.basics import torch_compat
from bridge.core.spec import OpSpec

SUFFIX = "_functional"


def twin_schema(spec: OpSpec) -> str:
    """The twin's schema string (without its name): alias annotations dropped, mutated values returned."""
    schema = str(torch_compat.schema_of(spec.overload))
    args = schema[schema.index("("):schema.rindex(") ->") + 1]
    args = re.sub(r"Tensor\([a-z0-9]+!?\)", "Tensor", args)
    returns = [str(r.type) for r in torch_compat.schema_of(spec.overload).returns] + ["Tensor"] * len(spec.mutated)
    ret = returns[0] if len(returns) == 1 else "(" + ", ".join(returns) + ")"
    return f"{args} -> {ret}"


def functional_on_copies(fn, written: list[int]):
    """``fn`` (a mutating op's implementation) run on copies of the arguments at ``written``: returns
    its results, then the new values of what it wrote (one tuple), leaving the caller's tensors as they were."""
    def functional(*args):
        args = list(args)
        for i in written:
            args[i] = args[i].clone()
        out = fn(*args)
        outs = () if out is None else (tuple(out) if isinstance(out, (tuple, list)) else (out,))
        return (*outs, *(args[i] for i in written))
    return functional


def define_twin(spec: OpSpec):
    """Define the twin torch op ``<qualname>_functional`` (once per mutating op); return its CustomOpDef."""
    names = [p.name for p in spec.params]
    mutated_index = [names.index(m) for m in spec.mutated]
    overload = spec.overload

    on_copies = functional_on_copies(overload, mutated_index)

    def functional(*args):
        result = on_copies(*args)
        return result[0] if len(result) == 1 else result

    twin = torch.library.custom_op(spec.qualname + SUFFIX, functional, mutates_args=(), schema=twin_schema(spec))
    twin.register_fake(functional)  # under fake tensors the original op runs its own fake kernel
    return twin


def twin_spec(spec: OpSpec, twin) -> OpSpec:
    """The twin's record: ``spec``'s pieces, the twin torch op, ONNX name = the mutating op's name.

    Derived anew whenever ``spec`` changes (a piece attached later), over the same torch op.
    """
    params = tuple(dataclasses.replace(p, mutated=False) for p in spec.params)
    return dataclasses.replace(
        spec, qualname=spec.qualname + SUFFIX, custom_op=twin, params=params,
        num_outputs=spec.num_outputs + len(spec.mutated), onnx_name=spec.name,
        doc=f"functional form of {spec.qualname}: returns the new values of {list(spec.mutated)}",
    )
