"""The PyTorch code an op's body is derived from: a custom_op's own function, or the composite
kernel of an op defined elsewhere."""

from __future__ import annotations

from collections.abc import Callable

import torch

from bridge.core.basics import torch_compat
from bridge.core.functional import SUFFIX, functional_on_copies
from bridge.core.spec import OpSpec
from exporters.derive.sites import NoPortableBody, Untraceable


def _python_impl(overload: torch_compat.OpOverload) -> Callable:
    qualname = overload.name().split(".")[0]
    opdef = torch_compat.custom_op_def(qualname)
    if opdef is not None and (fn := torch_compat.python_impl(opdef)) is not None:
        return fn
    if torch_compat.has_kernel(qualname, "CompositeImplicitAutograd"):
        return overload.decompose
    raise Untraceable("its kernel is C++ (no PyTorch implementation or composite kernel to trace)")


def implementation(spec: OpSpec) -> Callable:
    """The PyTorch code the op's body is derived from, called with the op's arguments in schema order.

    A custom_op's own function; an op defined elsewhere, its composite (CompositeImplicitAutograd)
    kernel; the functional twin of a mutating op, the op's implementation on copies of the tensors it
    writes (returning its results, then their new values). Raises ``NoPortableBody`` when there is none
    (an op torch.onnx translates is traced as itself instead: ``exporters.kinds.TranslatedBody``).

    Example:
        >>> import torch, bridge, custom_ops
        >>> fn = implementation(bridge.REGISTRY.get("opbridge::crop"))
        >>> tuple(fn(torch.ones(1, 4, 4), [0, 0, 2, 3]).shape)
        (1, 3, 2)
    """
    try:
        mutating = spec.qualname.removesuffix(SUFFIX)
        if mutating != spec.qualname and torch_compat.op_exists(mutating):
            ns, _, name = mutating.partition("::")
            original = getattr(getattr(torch.ops, ns), name).default
            written = [i for i, a in enumerate(torch_compat.schema_of(original).arguments) if torch_compat.writes(a)]
            if written:
                return functional_on_copies(_python_impl(original), written)
        return _python_impl(spec.overload)
    except Untraceable as e:
        raise NoPortableBody(spec.qualname, str(e)) from None
