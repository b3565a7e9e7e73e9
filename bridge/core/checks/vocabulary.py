"""The check vocabulary: sizes (:class:`Expr`), one class per check kind, the constructors users
call (``rank``, ``dim_eq``, ...), and an op's check list (:class:`Checks`).

Each kind states, in one class, what must hold (``what``; a failure's message is ``opbridge:
<qualname>: <what>. Got <violation>. <fix>``), its eager violation (``violation``), its ONNX guard
(``guard``, over a builder from ``bridge.core.checks.guards``) and whether it reads tensor values
(``reads_values``). A new kind is a subclass here plus a constructor.

Example:
    >>> import torch
    >>> check = values_ge("x", 0)
    >>> check.kind, check.reads_values, check.violation({"x": torch.tensor([1, -2])})
    ('values_ge', True, 'min -2')
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from onnx import TensorProto

from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.torch_compat import is_fake

# NOTE: a product check bounds sizes so far below 2**63 that int64 products of them cannot wrap
PRODUCT_LIMIT_MAX = 2**61


class CheckError(OpBridgeError, ValueError):
    """An input fails one of its op's checks (a ValueError too, as torch ops raise for bad values)."""


@dataclasses.dataclass(frozen=True)
class Compare:
    """One comparison a guard states, ``lhs <op> rhs`` (``op``: Equal, GreaterOrEqual, Less,
    LessOrEqual): ``lhs`` an ONNX [1] value of element type ``dtype``; ``rhs`` a number or a [1]
    value (of type ``rhs_dtype``, cast to ``dtype`` when it differs; None: ``dtype``). The guard
    builder makes one comparison node for all an op's comparisons of one op and types."""

    op: str
    lhs: str
    rhs: str | int | float
    dtype: int = TensorProto.INT64
    rhs_dtype: int | None = None


# -- expressions: sizes an input check compares against ---------------------------------------------

class Expr:
    """An integer computed from the call: eagerly from tensors and attributes, in ONNX as an int64
    [1] tensor. Every ONNX form is total: it never fails, whatever the inputs (a missing dim or
    attribute item reads as -1), so guards never trip over inputs an earlier check rejects.

    NOTE: eager values are never passed through int(): under tracing (export, derived bodies)
    sizes and attributes may be symbolic, and int() would specialize them."""

    def eval(self, env: dict) -> int:
        raise NotImplementedError

    def onnx(self, b: Any) -> str:
        raise NotImplementedError

    def rhs(self, b: Any) -> str | int:
        """The right-hand side of a :class:`Compare`: the int of a constant, else :meth:`onnx`."""
        return self.onnx(b)

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

    def rhs(self, b):
        return self.value

    def __str__(self):
        return str(self.value)


@dataclasses.dataclass(frozen=True)
class Dim(Expr):
    """``input.shape[axis]`` (-1 when the input has no such axis)."""

    input: str
    axis: int

    def eval(self, env):
        t = env[self.input]
        return t.shape[self.axis] if -t.dim() <= self.axis < t.dim() else -1

    def onnx(self, b):
        return b.dim(self.input, self.axis)

    def __str__(self):
        return f"{self.input}.shape[{self.axis}]"


@dataclasses.dataclass(frozen=True)
class Numel(Expr):
    """The number of elements of ``input``."""

    input: str

    def eval(self, env):
        return env[self.input].numel()

    def onnx(self, b):
        return b.numel1(b.input(self.input))

    def __str__(self):
        return f"{self.input}.numel()"


@dataclasses.dataclass(frozen=True)
class Attr(Expr):
    """An attribute's value: a scalar int attribute; ``attr(name)[i]`` an item of an ints attribute,
    ``.prod(stop)`` the product of its first ``stop`` items."""

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
        return b.attr_item(self.name, self.index)

    def __str__(self):
        return f"{self.name}[{self.index}]"


@dataclasses.dataclass(frozen=True)
class _AttrProd(Expr):
    name: str
    stop: int

    def eval(self, env):
        return math.prod(list(env[self.name])[:self.stop])

    def onnx(self, b):
        # NOTE: a missing item counts as 1, as in eager; the [1] appended keeps the product from
        # reducing an empty tensor (onnxruntime 1.17 fails there)
        items = b.node("Slice", [b.attr(self.name), b.const([0]), b.const([self.stop])])
        return b.node("ReduceProd", [b.node("Concat", [items, b.const([1])], axis=0)], keepdims=1)

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

    def _factors(self) -> list[Expr]:
        return [f for e in (self.a, self.b) for f in (e._factors() if isinstance(e, _Mul) else [e])]

    def onnx(self, b):
        # NOTE: a run of dims of one input (dim(x, 0) * dim(x, 1) * ...) is one ReduceProd of its shape
        out, factors = None, self._factors()
        while factors:
            first, run = factors[0], 1
            if isinstance(first, Dim) and first.axis >= 0:
                while run < len(factors) and factors[run] == Dim(first.input, first.axis + run):
                    run += 1
            value = b.dims_prod(first.input, first.axis, first.axis + run) if run > 1 else first.onnx(b)
            out = value if out is None else b.node("Mul", [out, value])
            factors = factors[run:]
        return out

    def __str__(self):
        return f"{self.a} * {self.b}"


# NOTE: the sizes users name: each class is its own constructor
dim, numel, attr = Dim, Numel, Attr


# -- check kinds -------------------------------------------------------------------------------------

def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _value(size: Expr, env: dict | None) -> int | Expr:
    """``size``'s value in ``env``; itself (its text) without one."""
    return size if env is None else size.eval(env)


@dataclasses.dataclass(frozen=True)
class Check:
    """One condition on one input (or attribute) ``input``; ``text`` says what must hold and ``fix``
    is the advice of its message.

    A kind's name (``kind``, in guard names and messages) is its class name in snake case."""

    input: str
    fix: str
    text: str

    kind: ClassVar[str] = ""
    reads_values: ClassVar[bool] = False  # reads tensor values: skipped on fake (traced) tensors
    reads_attributes_only: ClassVar[bool] = False  # checkable from a node's attributes, before running: attr_*
    guarded: ClassVar[bool] = True  # has an ONNX guard (else onnxruntime's own type check does it)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        cls.reads_attributes_only = cls.kind.startswith("attr_")

    def what(self, env: dict | None = None) -> str:
        """What must hold, with the call's values (``env``) filled in; without ``env``, in words
        (for messages where the values are unknown)."""
        return self.text

    def violation(self, env: dict) -> str | None:
        """The ``Got`` text of a failure on ``env`` ({param name: value}), None when it holds."""
        raise NotImplementedError

    def guard(self, b: Any) -> list[str | Compare]:
        """What must hold in ONNX (built with ``b``, a ``checks.guards`` builder): bool [1] values and
        :class:`Compare` that must all hold."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Rank(Check):
    n: int
    at_least: bool

    def violation(self, env):
        t = env[self.input]
        bad = t.dim() < self.n if self.at_least else t.dim() != self.n
        return f"shape {_shape(t)}" if bad else None

    def guard(self, b):
        # NOTE: the length of [1, *shape] against n + 1: one node fewer than the rank itself
        return [Compare("GreaterOrEqual" if self.at_least else "Equal", b.node("Shape", [b.shape1(self.input)]),
                        self.n + 1)]


@dataclasses.dataclass(frozen=True)
class DimEq(Check):
    axis: int
    size: Expr

    def what(self, env=None):
        # NOTE: ``text`` may use {input}, {axis}, {size} (its text) and {value} (its value)
        return self.text.format(input=self.input, axis=self.axis, size=self.size, value=_value(self.size, env))

    def violation(self, env):
        bad = Dim(self.input, self.axis).eval(env) != self.size.eval(env)
        return f"shape {_shape(env[self.input])}" if bad else None

    def guard(self, b):
        return [Compare("Equal", b.dim(self.input, self.axis), self.size.rhs(b))]


@dataclasses.dataclass(frozen=True)
class SameLen(Check):
    other: str

    def violation(self, env):
        a, b = env[self.other].numel(), env[self.input].numel()
        return f"lengths {a} and {b}" if a != b else None

    def guard(self, b):
        return [Compare("Equal", b.numel1(b.input(self.input)), b.numel1(b.input(self.other)))]


@dataclasses.dataclass(frozen=True)
class SameShape(Check):
    other: str
    drop_last: int

    def _key(self, t):
        return t.dim(), tuple(t.shape[:t.dim() - self.drop_last]) if t.dim() >= self.drop_last else None

    def violation(self, env):
        mine, theirs = self._key(env[self.input]), self._key(env[self.other])
        bad = mine != theirs or mine[1] is None
        return f"{_shape(env[self.other])} and {_shape(env[self.input])}" if bad else None

    def guard(self, b):
        same = b.equal_vectors(b.shape_key(self.input, self.drop_last), b.shape_key(self.other, self.drop_last))
        if not self.drop_last:
            return [same]  # NOTE: every rank is >= 0
        return [b.node("And", [same, b.node("GreaterOrEqual", [b.rank(self.input), b.const([self.drop_last])])])]


@dataclasses.dataclass(frozen=True)
class ValuesIn(Check):
    """NOTE: compared in float64 in the guard (exact for int32 indices and float values); a NaN
    fails the eager check, and the guard (its least and most value are then -inf and +inf)."""

    low: Expr
    high: Expr
    reads_values: ClassVar[bool] = True

    def what(self, env=None):
        return self.text.format(low=_value(self.low, env), high=_value(self.high, env))

    def violation(self, env):
        t = env[self.input]
        if not t.numel():
            return None
        least, most = t.min().item(), t.max().item()  # NOTE: Python numbers: no int32 overflow of the bounds
        return None if least >= self.low.eval(env) and most < self.high.eval(env) else f"min {least}, max {most}"

    def guard(self, b):
        x = b.input(self.input)  # NOTE: an empty input's least is +inf, its most -inf: it passes
        return [Compare("GreaterOrEqual", b.least(x), self.low.rhs(b), TensorProto.DOUBLE, TensorProto.INT64),
                Compare("Less", b.most(x), self.high.rhs(b), TensorProto.DOUBLE, TensorProto.INT64)]


@dataclasses.dataclass(frozen=True)
class ValuesGe(Check):
    low: int
    reads_values: ClassVar[bool] = True

    def violation(self, env):
        t = env[self.input]
        return f"min {t.min().item()}" if t.numel() and not t.min().item() >= self.low else None

    def guard(self, b):
        return [Compare("GreaterOrEqual", b.least(b.input(self.input)), self.low, TensorProto.DOUBLE)]


@dataclasses.dataclass(frozen=True)
class AttrLen(Check):
    n: int

    def violation(self, env):
        return str(list(env[self.input])) if len(env[self.input]) != self.n else None

    def guard(self, b):
        return [Compare("Equal", b.node("Shape", [b.attr(self.input)]), self.n)]


@dataclasses.dataclass(frozen=True)
class AttrLe(Check):
    pairs: tuple[tuple[int, int], ...]

    def violation(self, env):
        items = [attr(self.input)[k].eval(env) for pair in self.pairs for k in pair]
        return str(list(env[self.input])) if any(a > b for a, b in zip(items[::2], items[1::2])) else None

    def guard(self, b):
        return [Compare("LessOrEqual", b.attr_item(self.input, i), b.attr_item(self.input, j)) for i, j in self.pairs]


@dataclasses.dataclass(frozen=True)
class AttrGe(Check):
    low: int

    def violation(self, env):
        return str(list(env[self.input])) if any(v < self.low for v in env[self.input]) else None

    def guard(self, b):
        padded = b.node("Concat", [b.attr(self.input), b.const([self.low])], axis=0)  # NOTE: an empty list passes
        return [Compare("GreaterOrEqual", b.node("ReduceMin", [padded], keepdims=1), self.low)]


@dataclasses.dataclass(frozen=True)
class AttrProdLe(Check):
    """NOTE: the guard is exact without a float64 product (onnxruntime 1.17 has no float64
    ReduceProd): a float32 product, within a factor 2 of the true one (for fewer than 2**22
    items), tells whether the int64 product can wrap (above 2**62); where it cannot, the int64
    product is exact and is compared. A float32 product over 2**62 means a true one over 2**61,
    which no allowed ``limit`` admits."""

    limit: int

    def violation(self, env):
        items = list(env[self.input])
        if not all(isinstance(v, int) for v in items):
            return None  # NOTE: symbolic sizes (tracing): comparing them would guard on them; the run checks
        return str(items) if math.prod(max(v, 1) for v in items) > self.limit else None

    def guard(self, b):
        items = b.node("Max", [b.attr(self.input), b.const([1])])  # NOTE: zeros count as 1
        padded = b.node("Concat", [items, b.const([1])], axis=0)  # NOTE: an empty list passes
        approx = b.node("ReduceProd", [b.node("Cast", [padded], to=TensorProto.FLOAT)], keepdims=1)
        wrap = b.const([2.0**62], dtype=TensorProto.FLOAT)
        no_wrap = b.node("LessOrEqual", [approx, wrap])
        # NOTE: where the product could wrap, it is not taken at all (signed overflow)
        exact = b.node("ReduceProd", [b.node("Where", [no_wrap, padded, b.const([1])])], keepdims=1)
        return [no_wrap, Compare("LessOrEqual", exact, self.limit)]


@dataclasses.dataclass(frozen=True)
class IntervalsWithin(Check):
    lengths: str
    points: Expr
    reads_values: ClassVar[bool] = True

    def what(self, env=None):
        return self.text.format(points=_value(self.points, env))

    def violation(self, env):
        n = min(env[self.input].numel(), env[self.lengths].numel())
        if n == 0:
            return None
        s = env[self.input].long()[:n]
        e = s + env[self.lengths].long()[:n]
        if int(s.min()) < 0 or int(e.max()) > self.points.eval(env):
            return f"starts from {int(s.min())}, ends up to {int(e.max())}"
        return None

    def guard(self, b):
        # NOTE: in float64 (exact for int32 starts and lengths); the first n of each, n the shorter
        # length; no intervals: the least start is +inf, the greatest end -inf, and it passes
        n = b.node("Min", [b.numel1(b.input(self.input)), b.numel1(b.input(self.lengths))])
        s = b.node("Slice", [b.flat_double(b.input(self.input)), b.const([0]), n])
        length = b.node("Slice", [b.flat_double(b.input(self.lengths)), b.const([0]), n])
        ends = b.node("Add", [s, length])
        sources = (self.input, self.lengths)
        return [Compare("GreaterOrEqual", b.least(s, flat_double=True, sources=sources), 0, TensorProto.DOUBLE),
                Compare("LessOrEqual", b.most(ends, flat_double=True, sources=sources), self.points.rhs(b),
                        TensorProto.DOUBLE, TensorProto.INT64)]


@dataclasses.dataclass(frozen=True)
class DtypeIs(Check):
    dtypes: tuple[torch.dtype, ...]
    guarded: ClassVar[bool] = False

    def violation(self, env):
        return f"{env[self.input].dtype}" if env[self.input].dtype not in self.dtypes else None


@dataclasses.dataclass(frozen=True)
class SameDtype(Check):
    other: str
    floating: bool
    guarded: ClassVar[bool] = False

    def violation(self, env):
        a, b = env[self.other].dtype, env[self.input].dtype
        return f"{a} and {b}" if a != b or (self.floating and not a.is_floating_point) else None


# -- the constructors users call ---------------------------------------------------------------------

def rank(input: str, n: int, *, at_least: bool = False, what: str | None = None, fix: str | None = None) -> Check:
    """``input`` has ``n`` dims (``at_least``: n or more)."""
    text = what or f"input '{input}' must have {'at least ' if at_least else ''}{n} dim{'' if n == 1 else 's'}"
    return Rank(input, fix or f"Pass a {n}-D {input}.", text, n, at_least)


def dim_eq(input: str, axis: int, size: Expr | int, *, what: str | None = None, fix: str | None = None) -> Check:
    """``input.shape[axis] == size``; ``what`` may use ``{value}`` (the size) and ``{size}`` (its text)."""
    text = what or "input '{input}' must have {input}.shape[{axis}] == {size} = {value}"
    return DimEq(input, fix or "Pass matching sizes.", text, axis, _expr(size))


def same_len(input: str, other: str, *, what: str | None = None, fix: str | None = None) -> Check:
    """1-D ``input`` has as many entries as ``other``."""
    return SameLen(input, fix or f"Pass one {input} entry per {other} entry.",
                   what or f"inputs '{other}' and '{input}' must have equal length", other)


def same_shape(input: str, other: str, *, drop_last: int = 0, what: str | None = None,
               fix: str | None = None) -> Check:
    """``input`` has the rank of ``other`` and its shape (``drop_last``: but for the last dims)."""
    return SameShape(input, fix or f"Pass {input} shaped like {other}.",
                     what or f"input '{input}' must have the shape of '{other}'", other, drop_last)


def values_in(input: str, low: Expr | int, high: Expr | int, *, fix: str | None = None) -> Check:
    """Every value of ``input`` lies in ``[low, high)`` (an empty input passes)."""
    return ValuesIn(input, fix or f"Check {input} against the sizes it indexes.",
                    f"input '{input}' values must lie in [{{low}}, {{high}})", _expr(low), _expr(high))


def values_ge(input: str, low: int, *, fix: str | None = None) -> Check:
    """Every value of ``input`` is ``>= low`` (compared as :func:`values_in` does)."""
    return ValuesGe(input, fix or f"Pass {input} >= {low}.", f"input '{input}' values must be >= {low}", low)


def attr_len(name: str, n: int, *, what: str | None = None, fix: str | None = None) -> Check:
    """Ints attribute ``name`` has ``n`` items."""
    return AttrLen(name, fix or f"Pass {n} values.", what or f"attribute '{name}' must have {n} items", n)


def attr_le(name: str, pairs: Sequence[tuple[int, int]], *, what: str, fix: str) -> Check:
    """``name[i] <= name[j]`` for each ``(i, j)`` of ``pairs`` (an ints attribute)."""
    return AttrLe(name, fix, what, tuple((int(i), int(j)) for i, j in pairs))


def attr_ge(name: str, low: int, *, what: str | None = None, fix: str | None = None) -> Check:
    """Every item of ints attribute ``name`` is ``>= low``."""
    return AttrGe(name, fix or f"Pass {name} items >= {low}.", what or f"attribute '{name}' items must be >= {low}",
                  low)


def attr_prod_le(name: str, limit: int, *, what: str | None = None, fix: str | None = None) -> Check:
    """The product of the items of ints attribute ``name`` (zeros counted as 1, so it bounds every
    partial product too) is at most ``limit`` (at most ``PRODUCT_LIMIT_MAX``): sizes whose
    products (cells, elements, bytes) would overflow int64 are refused before anything multiplies them."""
    if not 1 <= limit <= PRODUCT_LIMIT_MAX:
        raise OpBridgeError(f"attr_prod_le('{name}') bounds a product by {limit}. Got a limit outside "
                            f"[1, 2**61]. Pass a limit from 1 to {PRODUCT_LIMIT_MAX}.")
    return AttrProdLe(name, fix or f"Pass smaller {name} sizes.",
                      what or f"attribute '{name}' must describe at most {limit} elements", limit)


def intervals_within(starts: str, lengths: str, points: Expr | int, *, fix: str | None = None) -> Check:
    """Every interval ``[starts[i], starts[i] + lengths[i])`` lies in ``[0, points]`` (the
    lengths' sign and count are separate checks)."""
    text = f"intervals [{starts}, {starts} + {lengths}) must lie in [0, {{points}}] points"
    return IntervalsWithin(starts, fix or f"Fix {starts}/{lengths}.", text, lengths, _expr(points))


def dtype_is(input: str, dtypes: Sequence[torch.dtype], *, fix: str | None = None) -> Check:
    """``input``'s dtype is one of ``dtypes`` (no guard: onnxruntime checks types before running)."""
    text = f"input '{input}' must be {' or '.join(str(d).replace('torch.', '') for d in dtypes)}"
    return DtypeIs(input, fix or f"Cast {input}.", text, tuple(dtypes))


def same_dtype(input: str, other: str, *, floating: bool = False, fix: str | None = None) -> Check:
    """``input`` has ``other``'s dtype (``floating``: a floating one); no guard (onnxruntime's type check)."""
    text = f"inputs '{other}' and '{input}' must share one {'floating ' if floating else ''}dtype"
    return SameDtype(input, fix or f"Cast {input} to {other}'s dtype.", text, other, floating)


# -- the op's check list ---------------------------------------------------------------------------

class Checks:
    """An op's checks, in order; the first that fails is the error every tier reports.

    Example:
        >>> import torch
        >>> c = Checks("demo::take", [values_in("index", 0, numel("data"))])
        >>> c.first_failure({"data": torch.ones(3), "index": torch.tensor([0, 5])})
        "opbridge: demo::take: input 'index' values must lie in [0, 3). Got min 0, max 5. Check index against ..."
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
            if traced and check.reads_values:
                continue
            try:
                got = check.violation(env)
            except (AttributeError, TypeError):
                if omitted:
                    continue  # NOTE: a check over an omitted optional input does not apply
                raise
            if got is not None:
                return f"opbridge: {self.qualname}: {check.what(env)}. Got {got}. {check.fix}"
        return None

    def run(self, **env) -> None:
        """Raise :class:`CheckError` for the first failing check (the eager check)."""
        message = self.first_failure(env)
        if message is not None:
            raise CheckError(message)

    def run_shapes(self, **env) -> None:
        """:meth:`run` with only the checks that read no tensor values (for fake kernels)."""
        Checks(self.qualname, [c for c in self.checks if not c.reads_values]).run(**env)

    def attribute_failure(self, attrs: dict) -> str | None:
        """:meth:`first_failure` of the checks that read attributes only (a node's, before running)."""
        return Checks(self.qualname, [c for c in self.checks if c.reads_attributes_only]).first_failure(attrs)
