"""One input-validation spec per op, shared by every tier.

An op states its checks once, as a list built from the small vocabulary below (``rank``,
``dim_eq``, ``same_len``, ``same_shape``, ``values_in``, ``values_ge``, ``attr_len``, ``attr_le``,
``attr_ge``, ``attr_prod_le``, ``intervals_within``, ``dtype_is``, ``same_dtype``). From that one list
the bridge derives:

- the eager check (:meth:`Checks.run`): the op's eager implementation calls it, so the python tier
  (which runs eager) gives the same error; it raises :class:`CheckError` with
  ``opbridge: <qualname>: <what is wrong>. Got <actual>. <fix>``;
- the function-body guards (:func:`guarded_body`): ONNX nodes appended to the op's function body,
  one per check, that make onnxruntime fail on a violation with a node named
  ``opbridge_check/<qualname>/<input>/<index>.<kind>``; :func:`explain_failure` turns that failure back
  into the eager message (the function tier's session does this);
- the text the native kernels' messages are held to (tests/op_db.py's bad inputs).

Example:
    >>> import torch
    >>> checks = Checks("demo::scale", [rank("x", 2), dim_eq("x", 1, attr("width"))])
    >>> checks.run(x=torch.ones(2, 3), width=3)
    >>> checks.run(x=torch.ones(2, 4), width=3)
    Traceback (most recent call last):
    ...
    bridge.core.checks.CheckError: opbridge: demo::scale: input 'x' must have x.shape[1] == width = 3. Got shape (2, 4). Pass matching sizes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import onnx
import torch
from onnx import TensorProto, helper
from torch._subclasses.fake_tensor import is_fake

from bridge.core.errors import OpBridgeError

GUARD_PREFIX = "opbridge_check"
# onnxruntime names a node of an inlined function '_inlfunc_<function>_<node name>' (measured on
# onnxruntime 1.32); only the node's own name is matched, wherever it sits in the message.
# A torchbind method's qualname has a dot: ns::Class.method.
_GUARD_NAME = re.compile(GUARD_PREFIX + r"/([A-Za-z_][\w]*::[A-Za-z_][\w.]*)/(\w+)/(\d+)\.\w+")


VALUE_KINDS = frozenset({"values_in", "values_ge", "intervals_within"})  # checks that read tensor values
ATTRIBUTE_KINDS = frozenset({"attr_len", "attr_le", "attr_ge", "attr_prod_le"})  # checks that read attributes only


class CheckError(OpBridgeError, ValueError):
    """An input fails one of its op's checks (a ValueError too, as torch ops raise for bad values)."""


# -- expressions: sizes an input check compares against ---------------------------------------------

class Expr:
    """An integer computed from the call: eagerly from tensors and attributes, in ONNX as an int64
    [1] tensor. Every ONNX form is total: it never fails, whatever the inputs (a missing dim or
    attribute item reads as -1), so guards never trip over inputs an earlier check rejects.

    NOTE: eager values are never passed through int(): under tracing (export, derived bodies)
    sizes and attributes may be symbolic, and int() would specialize them."""

    def eval(self, env: dict) -> int:
        raise NotImplementedError

    def onnx(self, b: _Builder) -> str:
        raise NotImplementedError

    def __floordiv__(self, other: Expr | int) -> Expr:
        return _FloorDiv(self, _expr(other))

    def __mul__(self, other: Expr | int) -> Expr:
        return _Mul(self, _expr(other))


def _expr(value: Expr | int) -> Expr:
    return value if isinstance(value, Expr) else Const(int(value))


@dataclasses.dataclass(frozen=True)
class Const(Expr):
    value: int

    def eval(self, env):
        return self.value

    def onnx(self, b):
        return b.const([self.value])

    def __str__(self):
        return str(self.value)


@dataclasses.dataclass(frozen=True)
class Dim(Expr):
    input: str
    axis: int

    def eval(self, env):
        t = env[self.input]
        return t.shape[self.axis] if -t.dim() <= self.axis < t.dim() else -1

    def onnx(self, b):
        shape = b.shape1(self.input)  # [1, *shape]
        if self.axis >= 0:
            padded = b.node("Concat", [shape, b.const([-1] * (self.axis + 1))], axis=0)
            return b.node("Slice", [padded, b.const([self.axis + 1]), b.const([self.axis + 2])])
        padded = b.node("Concat", [b.const([-1] * -self.axis), shape], axis=0)
        end = self.axis + 1 if self.axis != -1 else 2**62
        value = b.node("Slice", [padded, b.const([self.axis]), b.const([end])])
        present = b.node("GreaterOrEqual", [b.rank(self.input), b.const([-self.axis])])
        return b.node("Where", [present, value, b.const([-1])])

    def __str__(self):
        return f"{self.input}.shape[{self.axis}]"


@dataclasses.dataclass(frozen=True)
class Numel(Expr):
    input: str

    def eval(self, env):
        return env[self.input].numel()

    def onnx(self, b):
        return b.node("Reshape", [b.node("Size", [b.input(self.input)]), b.const([1])])

    def __str__(self):
        return f"{self.input}.numel()"


@dataclasses.dataclass(frozen=True)
class Attr(Expr):
    """A scalar int attribute; ``attr(name)[i]`` an item of an ints attribute, ``.prod(stop)`` the
    product of its first ``stop`` items."""

    name: str

    def eval(self, env):
        return env[self.name]

    def onnx(self, b):
        return b.node("Reshape", [b.attr(self.name), b.const([1])])

    def __getitem__(self, index: int) -> Expr:
        return _AttrItem(self.name, index)

    def prod(self, stop: int) -> Expr:
        return _AttrProd(self.name, stop)

    def __str__(self):
        return self.name


@dataclasses.dataclass(frozen=True)
class _AttrItem(Expr):
    name: str
    index: int

    def eval(self, env):
        v = list(env[self.name])
        return v[self.index] if self.index < len(v) else -1

    def onnx(self, b):
        padded = b.node("Concat", [b.attr(self.name), b.const([-1] * (self.index + 1))], axis=0)
        return b.node("Slice", [padded, b.const([self.index]), b.const([self.index + 1])])

    def __str__(self):
        return f"{self.name}[{self.index}]"


@dataclasses.dataclass(frozen=True)
class _AttrProd(Expr):
    name: str
    stop: int

    def eval(self, env):
        return math.prod(list(env[self.name])[:self.stop])

    def onnx(self, b):
        part = b.node("Slice", [b.attr(self.name), b.const([0]), b.const([self.stop])])
        return b.node("ReduceProd", [part], keepdims=1)

    def __str__(self):
        return f"prod({self.name}[:{self.stop}])"


@dataclasses.dataclass(frozen=True)
class _FloorDiv(Expr):
    a: Expr
    b: Expr

    def eval(self, env):
        return self.a.eval(env) // max(self.b.eval(env), 1)

    def onnx(self, b):
        # NOTE: ONNX integer Div truncates; sizes are >= 0, where that is floor division.
        return b.node("Div", [self.a.onnx(b), b.node("Max", [self.b.onnx(b), b.const([1])])])

    def __str__(self):
        return f"{self.a} // {self.b}"


@dataclasses.dataclass(frozen=True)
class _Mul(Expr):
    a: Expr
    b: Expr

    def eval(self, env):
        return self.a.eval(env) * self.b.eval(env)

    def onnx(self, b):
        return b.node("Mul", [self.a.onnx(b), self.b.onnx(b)])

    def __str__(self):
        return f"{self.a} * {self.b}"


def dim(input: str, axis: int) -> Expr:
    """``input.shape[axis]`` (-1 when the input has no such axis)."""
    return Dim(input, axis)


def numel(input: str) -> Expr:
    """The number of elements of ``input``."""
    return Numel(input)


def attr(name: str) -> Attr:
    """An attribute's value: an int, or (indexed, ``.prod(stop)``) items of an ints attribute."""
    return Attr(name)


# -- checks ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Check:
    """One condition on one input (or attribute): ``violation(env)`` gives the ``Got`` text of a
    failure (None when it holds); ``ok(b)`` the ONNX bool [1] that is true when it holds (None:
    nothing to guard at run time, onnxruntime's type check does it)."""

    kind: str
    input: str
    what: Callable[[dict], str]  # what must hold, with the call's values (env) filled in
    violation: Callable[[dict], str | None]
    ok: Callable[[Any], str] | None
    fix: str
    static: str  # what must hold, without values (for messages where the values are unknown)

    def message(self, qualname: str, env: dict, got: str) -> str:
        return f"opbridge: {qualname}: {self.what(env)}. Got {got}. {self.fix}"


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _reduce(b, op_type: str, input: str) -> str:
    """ReduceMin/ReduceMax of ``input`` as float64 [1] (exact for int32 and float values; an
    empty input gives the type's max/min, which passes)."""
    return b.node("Cast", [b.node(op_type, [b.input(input)], keepdims=0)], to=TensorProto.DOUBLE, reshape=True)


def _double(b, expr: Expr) -> str:
    return b.node("Cast", [expr.onnx(b)], to=TensorProto.DOUBLE)


def rank(input: str, n: int, *, at_least: bool = False, what: str | None = None, fix: str | None = None) -> Check:
    """``input`` has ``n`` dims (``at_least``: n or more)."""
    text = what or f"input '{input}' must have {'at least ' if at_least else ''}{n} dim{'' if n == 1 else 's'}"
    bad = (lambda t: t.dim() < n) if at_least else (lambda t: t.dim() != n)
    return Check(
        "rank", input, lambda env: text, lambda env: f"shape {_shape(env[input])}" if bad(env[input]) else None,
        lambda b: b.node("GreaterOrEqual" if at_least else "Equal", [b.rank(input), b.const([n])]),
        fix or f"Pass a {n}-D {input}.", text)


def dim_eq(input: str, axis: int, size: Expr | int, *, what: str | None = None, fix: str | None = None) -> Check:
    """``input.shape[axis] == size``; ``what`` may use ``{value}`` (the size) and ``{size}`` (its text)."""
    size = _expr(size)
    template = what or "input '{input}' must have {input}.shape[{axis}] == {size} = {value}"

    def text(env):
        return template.format(input=input, axis=axis, size=size, value=size.eval(env))

    return Check(
        "dim_eq", input, text,
        lambda env: f"shape {_shape(env[input])}" if Dim(input, axis).eval(env) != size.eval(env) else None,
        lambda b: b.node("Equal", [Dim(input, axis).onnx(b), size.onnx(b)]),
        fix or "Pass matching sizes.", template.format(input=input, axis=axis, size=size, value=str(size)))


def same_len(input: str, other: str, *, what: str | None = None, fix: str | None = None) -> Check:
    """1-D ``input`` has as many entries as ``other``."""
    text = what or f"inputs '{other}' and '{input}' must have equal length"
    return Check(
        "same_len", input, lambda env: text,
        lambda env: (f"lengths {env[other].numel()} and {env[input].numel()}"
                     if env[other].numel() != env[input].numel() else None),
        lambda b: b.node("Equal", [Numel(input).onnx(b), Numel(other).onnx(b)]),
        fix or f"Pass one {input} entry per {other} entry.", text)


def _shape_key(b, input: str, drop_last: int) -> str:
    """The shape of ``input`` with its last ``drop_last`` dims masked, then its rank, as one int64
    vector: two keys are equal exactly when the ranks and the kept dims are.

    NOTE: no value here is ever zero-size (OpenVINO mishandles those): the shape is read off
    ``Unsqueeze(x, 0)`` and the dims masked rather than sliced away."""
    shape = b.shape1(input)  # [1, *shape]: position 0 stands for the rank
    r = b.rank(input)
    position = b.node("Range", [b.const(0, scalar=True), b.node("Squeeze", [b.node("Add", [r, b.const([1])])]),
                                b.const(1, scalar=True)])
    kept = b.node("And", [b.node("Greater", [position, b.const([0])]),
                          b.node("LessOrEqual", [position, b.node("Sub", [r, b.const([drop_last])])])])
    return b.node("Where", [kept, shape, b.node("Neg", [b.node("Add", [r, b.const([2])])])])


def _equal_vectors(b, x: str, y: str) -> str:
    """True [1] when int64 vectors x and y are equal (total: unequal lengths are unequal)."""
    nx = b.node("Reshape", [b.node("Size", [x]), b.const([1])])
    ny = b.node("Reshape", [b.node("Size", [y]), b.const([1])])
    n = b.node("Max", [nx, ny])
    # NOTE: both padded with a value no dim or rank key takes to the longer length
    px = b.node("Pad", [x, b.node("Concat", [b.const([0]), b.node("Sub", [n, nx])], axis=0), b.const(-7, scalar=True)])
    py = b.node("Pad", [y, b.node("Concat", [b.const([0]), b.node("Sub", [n, ny])], axis=0), b.const(-9, scalar=True)])
    same = b.node("Cast", [b.node("Equal", [px, py])], to=TensorProto.INT64)
    return b.node("Cast", [b.node("ReduceMin", [same], keepdims=1)], to=TensorProto.BOOL)


def same_shape(input: str, other: str, *, drop_last: int = 0, what: str | None = None,
               fix: str | None = None) -> Check:
    """``input`` has the rank of ``other`` and its shape (``drop_last``: but for the last dims)."""
    text = what or f"input '{input}' must have the shape of '{other}'"

    def key(t):
        return (t.dim(), tuple(t.shape[:t.dim() - drop_last]) if t.dim() >= drop_last else None)

    return Check(
        "same_shape", input, lambda env: text,
        lambda env: (f"{_shape(env[other])} and {_shape(env[input])}"
                     if key(env[input]) != key(env[other]) or key(env[input])[1] is None else None),
        lambda b: b.node("And", [_equal_vectors(b, _shape_key(b, input, drop_last), _shape_key(b, other, drop_last)),
                                 b.node("GreaterOrEqual", [b.rank(input), b.const([drop_last])])]),
        fix or f"Pass {input} shaped like {other}.", text)


def values_in(input: str, low: Expr | int, high: Expr | int, *, fix: str | None = None) -> Check:
    """Every value of ``input`` lies in ``[low, high)`` (an empty input passes).

    NOTE: compared in float64 in the guard (exact for int32 indices and float values); a NaN fails
    the eager check, while onnxruntime's min/max reductions may skip it."""
    low, high = _expr(low), _expr(high)

    def violation(env):
        t = env[input]
        if not t.numel():
            return None
        least, most = t.min().item(), t.max().item()  # NOTE: Python numbers: no int32 overflow of the bounds
        return None if least >= low.eval(env) and most < high.eval(env) else f"min {least}, max {most}"

    def ok(b):
        return b.node("And", [b.node("GreaterOrEqual", [_reduce(b, "ReduceMin", input), _double(b, low)]),
                              b.node("Less", [_reduce(b, "ReduceMax", input), _double(b, high)])])

    return Check("values_in", input,
                 lambda env: f"input '{input}' values must lie in [{low.eval(env)}, {high.eval(env)})",
                 violation, ok, fix or f"Check {input} against the sizes it indexes.",
                 f"input '{input}' values must lie in [{low}, {high})")


def values_ge(input: str, low: int, *, fix: str | None = None) -> Check:
    """Every value of ``input`` is ``>= low`` (compared as :func:`values_in` does)."""
    text = f"input '{input}' values must be >= {low}"
    return Check(
        "values_ge", input, lambda env: text,
        lambda env: (f"min {env[input].min().item()}" if env[input].numel() and not env[input].min().item() >= low
                     else None),
        lambda b: b.node("GreaterOrEqual", [_reduce(b, "ReduceMin", input), _double(b, Const(low))]),
        fix or f"Pass {input} >= {low}.", text)


def attr_len(name: str, n: int, *, what: str | None = None, fix: str | None = None) -> Check:
    """Ints attribute ``name`` has ``n`` items."""
    text = what or f"attribute '{name}' must have {n} items"
    return Check(
        "attr_len", name, lambda env: text,
        lambda env: str(list(env[name])) if len(env[name]) != n else None,
        lambda b: b.node("Equal", [b.node("Reshape", [b.node("Size", [b.attr(name)]), b.const([1])]), b.const([n])]),
        fix or f"Pass {n} values.", text)


def attr_le(name: str, pairs: Sequence[tuple[int, int]], *, what: str, fix: str) -> Check:
    """``name[i] <= name[j]`` for each ``(i, j)`` of ``pairs`` (an ints attribute)."""

    def violation(env):
        items = [attr(name)[k].eval(env) for pair in pairs for k in pair]
        return str(list(env[name])) if any(a > b for a, b in zip(items[::2], items[1::2])) else None

    def ok(b):
        result = None
        for i, j in pairs:
            one = b.node("LessOrEqual", [attr(name)[i].onnx(b), attr(name)[j].onnx(b)])
            result = one if result is None else b.node("And", [result, one])
        return result

    return Check("attr_le", name, lambda env: what, violation, ok, fix, what)


def attr_ge(name: str, low: int, *, what: str | None = None, fix: str | None = None) -> Check:
    """Every item of ints attribute ``name`` is ``>= low``."""
    text = what or f"attribute '{name}' items must be >= {low}"

    def ok(b):
        padded = b.node("Concat", [b.attr(name), b.const([low])], axis=0)  # NOTE: an empty list passes
        return b.node("GreaterOrEqual", [b.node("ReduceMin", [padded], keepdims=1), b.const([low])])

    return Check("attr_ge", name, lambda env: text,
                 lambda env: str(list(env[name])) if any(v < low for v in env[name]) else None, ok,
                 fix or f"Pass {name} items >= {low}.", text)


def attr_prod_le(name: str, limit: int, *, what: str | None = None, fix: str | None = None) -> Check:
    """The product of the items of ints attribute ``name`` (zeros counted as 1, so it bounds every
    partial product too) is at most ``limit``: sizes whose products (cells, elements, bytes) would
    overflow int64 are refused before anything multiplies them.

    NOTE: the guard multiplies in float64, whose rounding cannot move a product across a power of
    two such as 2**60; eager multiplies Python ints (exact)."""
    text = what or f"attribute '{name}' must describe at most {limit} elements"

    def ok(b):
        one = b.node("Cast", [b.const([1])], to=TensorProto.DOUBLE)
        items = b.node("Max", [b.node("Cast", [b.attr(name)], to=TensorProto.DOUBLE), one])
        product = b.node("ReduceProd", [b.node("Concat", [items, one], axis=0)], keepdims=1)  # NOTE: [] passes
        return b.node("LessOrEqual", [product, b.node("Cast", [b.const([limit])], to=TensorProto.DOUBLE)])

    def violation(env):
        items = list(env[name])
        if not all(isinstance(v, int) for v in items):
            return None  # NOTE: symbolic sizes (tracing): comparing them would guard on them; the run checks
        return str(items) if math.prod(max(v, 1) for v in items) > limit else None

    return Check("attr_prod_le", name, lambda env: text, violation, ok, fix or f"Pass smaller {name} sizes.", text)


def intervals_within(starts: str, lengths: str, points: Expr | int, *, fix: str | None = None) -> Check:
    """Every interval ``[starts[i], starts[i] + lengths[i])`` lies in ``[0, points]`` (the
    lengths' sign and count are separate checks)."""
    points = _expr(points)

    def violation(env):
        s, n = env[starts].long(), min(env[starts].numel(), env[lengths].numel())
        if n == 0:
            return None
        s, e = s[:n], s[:n] + env[lengths].long()[:n]
        if int(s.min()) < 0 or int(e.max()) > points.eval(env):
            return f"starts from {int(s.min())}, ends up to {int(e.max())}"
        return None

    def ok(b):
        n = b.node("Min", [Numel(starts).onnx(b), Numel(lengths).onnx(b)])
        s = b.node("Cast", [b.node("Slice", [b.input(starts), b.const([0]), n])], to=TensorProto.INT64)
        length = b.node("Cast", [b.node("Slice", [b.input(lengths), b.const([0]), n])], to=TensorProto.INT64)
        low = b.node("ReduceMin", [s], keepdims=1)  # NOTE: empty: int64 max, passes
        high = b.node("ReduceMax", [b.node("Add", [s, length])], keepdims=1)
        return b.node("And", [b.node("GreaterOrEqual", [low, b.const([0])]),
                              b.node("LessOrEqual", [high, points.onnx(b)])])

    what = f"intervals [{starts}, {starts} + {lengths}) must lie in [0, {{}}] points"
    return Check("intervals_within", starts, lambda env: what.format(points.eval(env)), violation, ok,
                 fix or f"Fix {starts}/{lengths}.", what.format(points))


def dtype_is(input: str, dtypes: Sequence[torch.dtype], *, fix: str | None = None) -> Check:
    """``input``'s dtype is one of ``dtypes`` (no guard: onnxruntime checks types before running)."""
    text = f"input '{input}' must be {' or '.join(str(d).replace('torch.', '') for d in dtypes)}"
    return Check("dtype_is", input, lambda env: text,
                 lambda env: f"{env[input].dtype}" if env[input].dtype not in dtypes else None,
                 None, fix or f"Cast {input}.", text)


def same_dtype(input: str, other: str, *, floating: bool = False, fix: str | None = None) -> Check:
    """``input`` has ``other``'s dtype (``floating``: a floating one); no guard (onnxruntime's type check)."""
    text = f"inputs '{other}' and '{input}' must share one {'floating ' if floating else ''}dtype"

    def violation(env):
        a, b = env[other].dtype, env[input].dtype
        return f"{a} and {b}" if a != b or (floating and not a.is_floating_point) else None

    return Check("same_dtype", input, lambda env: text, violation, None, fix or f"Cast {input} to {other}'s dtype.",
                 text)


# -- the op's check list ---------------------------------------------------------------------------

class Checks:
    """An op's checks, in order; the first that fails is the error every tier reports.

    Example:
        >>> import torch
        >>> c = Checks("demo::take", [values_in("index", 0, numel("data"))])
        >>> c.first_failure({"data": torch.ones(3), "index": torch.tensor([0, 5])})
        "opbridge: demo::take: input 'index' values must lie in [0, 3). Got min 0, max 5. Check index against the sizes it indexes."
    """

    def __init__(self, qualname: str, checks: Sequence[Check]):
        self.qualname = qualname
        self.checks = tuple(checks)

    def __iter__(self):
        return iter(self.checks)

    def __len__(self) -> int:
        return len(self.checks)

    def first_failure(self, env: dict) -> str | None:
        """The message of the first failing check on ``env`` ({param name: value}), or None.

        Checks that read tensor values are skipped on fake (traced) tensors: they have no values;
        the traced program's body carries them as guards instead."""
        traced = any(is_fake(v) for v in env.values() if isinstance(v, torch.Tensor))
        omitted = any(v is None for v in env.values())
        for check in self.checks:
            if traced and check.kind in VALUE_KINDS:
                continue
            try:
                got = check.violation(env)
            except (AttributeError, TypeError):
                if omitted:
                    continue  # NOTE: a check over an omitted optional input does not apply
                raise
            if got is not None:
                return check.message(self.qualname, env, got)
        return None

    def run(self, **env) -> None:
        """Raise :class:`CheckError` for the first failing check (the eager check)."""
        message = self.first_failure(env)
        if message is not None:
            raise CheckError(message)

    def run_shapes(self, **env) -> None:
        """:meth:`run` with only the checks that read no tensor values (for fake kernels)."""
        Checks(self.qualname, [c for c in self.checks if c.kind not in VALUE_KINDS]).run(**env)

    def attribute_failure(self, attrs: dict) -> str | None:
        """:meth:`first_failure` of the checks that read attributes only (a node's, before running)."""
        return Checks(self.qualname, [c for c in self.checks if c.kind in ATTRIBUTE_KINDS]).first_failure(attrs)

    def guard_name(self, index: int) -> str:
        return f"{GUARD_PREFIX}/{self.qualname}/{self.checks[index].input}/{index}.{self.checks[index].kind}"


# -- ONNX guards -----------------------------------------------------------------------------------

class _Builder:
    """Appends nodes to a function body, with fresh value names."""

    def __init__(self, proto: onnx.FunctionProto, attr_types: dict[str, int]):
        self.proto = proto
        self.attr_types = attr_types  # attribute name -> AttributeProto type (INT, INTS)
        self.nodes: list[onnx.NodeProto] = []
        self.memo: dict[tuple, str] = {}
        self.count = 0
        self.used = {n for node in proto.node for n in (*node.input, *node.output)} | set(proto.input)
        self.inputs = set(proto.input)

    def fresh(self) -> str:
        while True:
            self.count += 1
            name = f"{GUARD_PREFIX}_v{self.count}"
            if name not in self.used:
                self.used.add(name)
                return name

    def node(self, op_type: str, inputs: list[str], *, name: str = "", reshape: bool = False, **attrs) -> str:
        # NOTE: the same pure node (a constant, a Shape, a reduction) is made once per body
        key = (op_type, tuple(inputs), tuple(sorted((k, repr(v)) for k, v in attrs.items())), reshape)
        if not name and key in self.memo:
            return self.memo[key]
        out = self.fresh()
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        if reshape:
            out = self.node("Reshape", [out, self.const([1])])
        if not name:
            self.memo[key] = out
        return out

    def const(self, values, scalar: bool = False) -> str:
        if scalar:
            return self.node("Constant", [], value_int=int(values))
        return self.node("Constant", [], value_ints=[int(v) for v in values])

    def shape1(self, name: str) -> str:
        """``[1, *shape]`` of input ``name``: never zero-size, even for a scalar."""
        return self.node("Shape", [self.node("Unsqueeze", [self.input(name), self.const([0])])])

    def rank(self, name: str) -> str:
        """The rank of input ``name`` as int64 [1]."""
        return self.node("Sub", [self.node("Reshape", [self.node("Size", [self.shape1(name)]), self.const([1])]),
                                 self.const([1])])

    def input(self, name: str) -> str:
        if name not in self.inputs:
            raise OpBridgeError(f"a check names input '{name}', which the function body {self.proto.name} does not "
                                f"have. Got inputs {list(self.proto.input)}. Name a tensor input of the op.")
        return name

    def attr(self, name: str) -> str:
        kind = self.attr_types.get(name)
        if kind not in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS):
            raise OpBridgeError(f"a check reads attribute '{name}', which is not an int or ints attribute of "
                                f"{self.proto.name}. Got "
                                f"{'no such attribute' if kind is None else onnx.AttributeProto.AttributeType.Name(kind)}"
                                ". Name an int/ints attribute of the op.")
        if ("attr", name) in self.memo:
            return self.memo[("attr", name)]
        ref = onnx.AttributeProto(name="value_int" if kind == onnx.AttributeProto.INT else "value_ints",
                                  ref_attr_name=name, type=kind)
        out = self.memo[("attr", name)] = self.fresh()
        node = helper.make_node("Constant", [], [out])
        node.attribute.append(ref)
        self.nodes.append(node)
        return out


def unreadable(proto: onnx.FunctionProto, checks: Checks, attr_types: dict[str, int]) -> dict[int, str]:
    """``{index: why}`` of the checks reading an input or an int/ints attribute ``proto`` lacks:
    each check is built as a guard over ``proto`` (a check without a guard, ``ok`` None, by its
    input alone). Used to validate a check list against an op's signature and to leave out the
    guards of attributes a derived body bakes in.

    Example:
        >>> import onnx
        >>> body = onnx.helper.make_function("d", "f", ["x"], ["y"], [onnx.helper.make_node("Neg", ["x"], ["y"])],
        ...                                  [onnx.helper.make_opsetid("", 20)])
        >>> list(unreadable(body, Checks("d::f", [rank("x", 1), rank("z", 1)]), {}))
        [1]
    """
    found = {}
    for index, check in enumerate(checks):
        try:
            if check.ok is None and check.input not in proto.input:
                raise OpBridgeError(f"a check names input '{check.input}'. Got inputs {list(proto.input)}. "
                                    "Name a tensor input.")
            guarded_body(proto, Checks(checks.qualname, [check]), attr_types)
        except OpBridgeError as e:
            found[index] = str(e).removeprefix("opbridge: ")
    return found


def guarded_body(proto: onnx.FunctionProto, checks: Checks, attr_types: dict[str, int],
                 skip: Sequence[int] = ()) -> onnx.FunctionProto:
    """``proto`` with one guard per check (but the indices in ``skip``): onnxruntime fails, at a
    node named after the check, before the body runs, when a check fails.

    NOTE: ONNX has no Assert. A guard is ``Gather([0], Cast(Not(ok)))``: index 1 is out of
    bounds. Guards are chained (each index adds the previous guard's 0 output), so they fail in
    list order, like the eager check; the body's tensor inputs are then re-read through
    ``Reshape(x, Shape(x) + last guard)``, so every body node waits for all guards and no guard is
    dead code. A Reshape to its own shape aliases its input in onnxruntime: no copy.

    Example:
        >>> import onnx
        >>> body = onnx.helper.make_function("d", "f", ["x"], ["y"], [onnx.helper.make_node("Neg", ["x"], ["y"])],
        ...                                  [onnx.helper.make_opsetid("", 20)])
        >>> out = guarded_body(body, Checks("d::f", [rank("x", 2)]), {})
        >>> [n.name for n in out.node if n.name]
        ['opbridge_check/d::f/x/0.rank']
    """
    guarded = [(i, c) for i, c in enumerate(checks) if c.ok is not None and i not in skip]
    if not guarded:
        return proto
    b = _Builder(proto, attr_types)
    data = b.const([0])
    chain = None
    for index, check in guarded:
        bad = b.node("Cast", [b.node("Not", [check.ok(b)])], to=TensorProto.INT64)
        if chain is not None:
            bad = b.node("Add", [bad, chain])
        chain = b.node("Gather", [data, bad], name=checks.guard_name(index))
    read = {n for node in proto.node for n in node.input}
    renames = {}
    for x in proto.input:
        if x in read:
            # NOTE: through Unsqueeze/Squeeze, so a scalar input makes no zero-size shape value
            lifted = b.node("Unsqueeze", [x, b.const([0])])
            moved = b.node("Reshape", [lifted, b.node("Add", [b.node("Shape", [lifted]), chain])], allowzero=1)
            renames[x] = b.node("Squeeze", [moved, b.const([0])])
    out = onnx.FunctionProto()
    out.CopyFrom(proto)
    del out.node[:]
    out.node.extend(b.nodes)
    for node in proto.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        _rename_inputs(copy, renames)
        out.node.append(copy)
    if not renames:  # NOTE: a body that reads no input: the outputs wait for the guards instead
        tail = _Builder(out, attr_types)
        for k, y in enumerate(list(out.output)):
            last = f"{GUARD_PREFIX}_out{k}"
            for node in out.node:
                node.output[:] = [last if o == y else o for o in node.output]
            shape = tail.node("Add", [tail.node("Shape", [last]), chain])
            tail.nodes.append(helper.make_node("Reshape", [last, shape], [y], allowzero=1))
        out.node.extend(tail.nodes)
    return out


def _rename_inputs(node: onnx.NodeProto, renames: dict[str, str]) -> None:
    """Rename the values ``node`` reads, in its subgraphs too (outer-scope references)."""
    node.input[:] = [renames.get(n, n) for n in node.input]
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for inner in g.node:
                _rename_inputs(inner, renames)


class GuardedFunction:
    """An op's onnxscript function body whose ``to_function_proto()`` carries the op's guards;
    everything else is the onnxscript function's own."""

    def __init__(self, function: Any, checks: Checks, attr_types: dict[str, int]):
        self.function = function
        self.checks = checks
        self.attr_types = attr_types

    def to_function_proto(self) -> onnx.FunctionProto:
        return guarded_body(self.function.to_function_proto(), self.checks, self.attr_types)

    def __getattr__(self, name: str):
        if "function" not in self.__dict__:  # NOTE: copy/pickle look up attributes before __init__ ran
            raise AttributeError(name)
        return getattr(self.__dict__["function"], name)

    def __repr__(self) -> str:
        return f"<guarded {self.function!r}: {len(self.checks)} checks>"


def failed_guard(error: BaseException | str) -> tuple[str, str, int] | None:
    """(op qualname, input, check index) of the guard an onnxruntime error stopped at, else None.

    Example:
        >>> failed_guard("running Gather node. Name:'_inlfunc_f_opbridge_check/d::f/x/3.rank' Status Message: ...")
        ('d::f', 'x', 3)
    """
    m = _GUARD_NAME.search(str(error))
    return (m.group(1), m.group(2), int(m.group(3))) if m else None


def explain_failure(checks: Checks, index: int, envs: Sequence[dict], node: str) -> str:
    """The message for guard ``index`` of ``checks`` failing: the eager message when one of
    ``envs`` (the op's inputs at its nodes, where known) fails a check, else the check's text
    without values."""
    for env in envs:
        try:
            message = checks.first_failure(env)
        except Exception:  # noqa: BLE001  an env that cannot be evaluated is skipped
            message = None
        if message is not None:
            return message
    check = checks.checks[index]
    return (f"opbridge: {checks.qualname}: {check.static}. Got a value that fails it inside the model "
            f"(onnxruntime stopped at guard node '{node}'). {check.fix}")
