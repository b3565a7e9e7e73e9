"""One input-validation spec per op, shared by every tier: the names users and tiers import.

An op states its checks once, as a list built from the small vocabulary below (``rank``,
``dim_eq``, ``same_len``, ``same_shape``, ``values_in``, ``values_ge``, ``attr_len``, ``attr_le``,
``attr_ge``, ``attr_prod_le``, ``intervals_within``, ``dtype_is``, ``same_dtype``). From that one list
the bridge derives:

- the eager check (:meth:`Checks.run`): the op's eager implementation calls it, so the python tier
  (which runs eager) gives the same error; it raises :class:`CheckError` with
  ``opbridge: <qualname>: <what is wrong>. Got <actual>. <fix>``;
- the function-body guards (:func:`guarded_body`): ONNX nodes put before the op's function body,
  one guard node per input checked, that make onnxruntime fail on a violation at the node named
  ``opbridge_check/<qualname>/<input>/<index>.<kind>+...`` (the input's checks; ``idx=<index + 1>`` in
  onnxruntime's message: the first failing check); the function
  tier's session then runs the checks themselves on the values the op was given, for eager's
  message (:func:`guard_failure` words it where those values cannot be read back,
  :func:`unregistered_guard_failure` where the op is not registered in the process);
- the text the native kernels' messages are held to (tests/op_db.py's bad inputs).

Two modules of this package hold it: ``vocabulary`` (the kinds, one class each, their constructors and
the op's list) and ``guards`` (guard nodes).

Example:
    >>> import torch
    >>> checks = Checks("demo::scale", [rank("x", 2), dim_eq("x", 1, attr("width"))])
    >>> checks.run(x=torch.ones(2, 3), width=3)
    >>> checks.run(x=torch.ones(2, 4), width=3)
    Traceback (most recent call last):
    ...
    bridge.core.checks.CheckError: opbridge: demo::scale: input 'x' must have x.shape[1] == width = 3. Got shape ...
"""

from __future__ import annotations

from bridge.core.checks.guards import (
    GUARD_PREFIX,
    guard_failure,
    guarded_body,
    is_guard,
    ordered,
    unguarded,
    unreadable,
    unregistered_guard_failure,
)
from bridge.core.checks.vocabulary import (
    PRODUCT_LIMIT_MAX,
    Check,
    CheckError,
    Checks,
    DimEq,
    Expr,
    attr,
    attr_ge,
    attr_le,
    attr_len,
    attr_prod_le,
    dim,
    dim_eq,
    dtype_is,
    intervals_within,
    numel,
    rank,
    same_dtype,
    same_len,
    same_shape,
    values_ge,
    values_in,
)

__all__ = [
    "GUARD_PREFIX", "PRODUCT_LIMIT_MAX", "Check", "CheckError", "Checks", "DimEq", "Expr", "attr", "attr_ge",
    "attr_le", "attr_len", "attr_prod_le", "dim", "dim_eq", "dtype_is", "guard_failure", "guarded_body",
    "intervals_within", "is_guard", "numel", "ordered", "rank", "same_dtype", "same_len", "same_shape",
    "unguarded", "unreadable", "unregistered_guard_failure", "values_ge", "values_in",
]
