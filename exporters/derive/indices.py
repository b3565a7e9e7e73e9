"""Range checks a derived body gets for the op inputs its trace indexes with: torch refuses an index
outside ``[0, size)`` of gather, scatter, index_select, embedding and take_along_dim, where ONNX's
Gather/GatherElements/ScatterElements wrap a negative one (a silent result) or fail with onnxruntime's
own words. Each becomes ``checks.values_in(input, 0, <that dim of the indexed tensor>)``, as if the op
declared it: the body's guard refuses it with the op's message (``exporters.kinds``).

NOTE: only an index that is an op input (through value-keeping views and copies) gets one; an index
the implementation computes is not checked (docs/ops.md, derived bodies). The guarded body's
``doc_string`` states them (:func:`stated`): a session reads them back from any file (:func:`stated_checks`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from bridge.core.checks import Check, Expr, dim, values_in

_aten = torch.ops.aten
# NOTE: (indexed tensor, dim, index) argument positions; dim None: dim 0 (embedding's weight rows)
_INDEXING = {
    _aten.gather.default: (0, 1, 2), _aten.scatter.src: (0, 1, 2), _aten.scatter.value: (0, 1, 2),
    _aten.scatter_add.default: (0, 1, 2), _aten.scatter_reduce.two: (0, 1, 2), _aten.index_select.default: (0, 1, 2),
    _aten.embedding.default: (0, None, 1), _aten.take_along_dim.default: (0, 2, 1),
}
# NOTE: ops that keep every value of their first argument (an index's values reach the indexing op whole)
_KEEPING = {_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default, _aten.expand.default,
            _aten.clone.default, _aten.contiguous.default, _aten.unsqueeze.default, _aten.squeeze.dim,
            _aten.squeeze.dims, _aten.squeeze.default, _aten.permute.default, _aten.transpose.int, _aten.t.default,
            _aten.alias.default, _aten.flatten.using_ints, _aten._to_copy.default, _aten.to.dtype}


def _source(node, inputs: dict[str, str]) -> str | None:
    """The op input whose values ``node`` holds, all of them (None: a computed value)."""
    while isinstance(node, torch.fx.Node):
        if node.name in inputs:
            return inputs[node.name]
        if node.op != "call_function" or node.target not in _KEEPING or not _integral(node.args[0]):
            return None
        node = node.args[0]
    return None


def _integral(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and not val.dtype.is_complex


def _size(size, shapes: dict[str, tuple]) -> Expr | int | None:
    """``size`` (an int or a symbolic dim) as a check bound: a static int, or the dim of an op input
    that has that very size."""
    if isinstance(size, int):
        return size
    for name, shape in shapes.items():
        for axis, d in enumerate(shape):
            if isinstance(d, torch.SymInt) and str(d) == str(size):  # NOTE: the same symbol: the same size
                return dim(name, axis)
    return None


def _check(node, inputs: dict[str, str], shapes: dict[str, tuple]) -> Check | None:
    """The range check of ``node`` (an fx node) where it indexes with an op input, else None."""
    where = _INDEXING.get(node.target) if node.op == "call_function" else None
    if where is None or len(node.args) <= max(k for k in where if k is not None):
        return None
    data, axis, index = node.args[where[0]], 0 if where[1] is None else node.args[where[1]], node.args[where[2]]
    name = _source(index, inputs)
    val = data.meta.get("val") if isinstance(data, torch.fx.Node) else None
    if name is None or not isinstance(axis, int) or not isinstance(val, torch.Tensor) or not val.dim():
        return None
    high = _size(val.shape[axis % val.dim()], shapes)
    return None if high is None else values_in(name, 0, high)


def index_checks(program, by_name: dict[str, tuple]) -> tuple[Check, ...]:
    """``values_in`` checks for the op inputs ``program`` (a torch.export trace whose placeholders
    ``by_name`` gives the roles of) indexes with, one per input and bound, in trace order."""
    inputs = {n: role[2].name for n, role in by_name.items() if role[0] == "tensor"}
    shapes = {inputs[node.name]: tuple(node.meta["val"].shape) for node in program.graph.nodes
              if node.op == "placeholder" and node.name in inputs}
    found: list[Check] = []
    for node in program.graph.nodes:
        check = _check(node, inputs, shapes)
        if check is not None and check not in found:
            found.append(check)
    return tuple(found)


_STATED = re.compile(r"^opbridge index check: input '(\w+)' values must lie in \[0, (?:(\d+)|(\w+)\.shape\[(\d+)\])\)$",
                     re.MULTILINE)


def stated(checks: Sequence[Check]) -> str:
    """The ``doc_string`` lines of a body that say it guards ``checks`` (:func:`index_checks`' kind).

    Example:
        >>> stated_checks(stated([values_in("idx", 0, dim("x", 1)), values_in("i", 0, 4)]))
        (ValuesIn(input='idx', ...), ValuesIn(input='i', ...))
    """
    return "\n".join(f"opbridge index check: {c.what()}" for c in checks)


def stated_checks(doc_string: str) -> tuple[Check, ...]:
    """The index checks a body's ``doc_string`` states (:func:`stated`)."""
    return tuple(values_in(m[1], 0, int(m[2]) if m[2] else dim(m[3], int(m[4])))
                 for m in _STATED.finditer(doc_string or ""))
