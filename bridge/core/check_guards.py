"""ONNX guards: an op's checks as nodes of its function body, named after the check they state.

Each check kind builds its condition (``Check.guard``) with the :class:`GuardBuilder` here;
:func:`guarded_body` chains the conditions into guard nodes that make onnxruntime fail, at a node
named ``opbridge_check/<qualname>/<input>/<index>.<kind>``, when a check fails.

NOTE: guard nodes use only (op, type) pairs every supported onnxruntime (1.17 on) implements on
CPU; tests/test_ort_kernels_coverage.py holds every registered op's body to that table.

Example:
    >>> from bridge.core.check_vocabulary import Checks, rank
    >>> guard_name("d::f", 2, rank("x", 1))
    'opbridge_check/d::f/x/2.rank'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import onnx
from onnx import TensorProto, helper

from bridge.core.check_vocabulary import Check, Checks
from bridge.core.errors import OpBridgeError
from bridge.core.graphs import walk

GUARD_PREFIX = "opbridge_check"


def guard_name(qualname: str, index: int, check: Check) -> str:
    """The name of the guard node of check ``index`` of ``qualname``'s list."""
    return f"{GUARD_PREFIX}/{qualname}/{check.input}/{index}.{check.kind}"


def _pad(n: int) -> int:
    """How many filler items make item ``n - 1`` exist; at least 8, so that the dims and items
    below 8 of one value share one padded copy."""
    return max(n, 8)


class GuardBuilder:
    """Appends nodes to a function body, with fresh value names; the same pure node (a constant, a
    Shape, a reduction) is made once per body."""

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

    def node(self, op_type: str, inputs: list[str], *, name: str = "", **attrs) -> str:
        """The output of a new (or the memoized equal) ``op_type`` node; a named node is never shared."""
        key = (op_type, tuple(inputs), tuple(sorted((k, repr(v)) for k, v in attrs.items())))
        if not name and key in self.memo:
            return self.memo[key]
        out = self.fresh()
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        if not name:
            self.memo[key] = out
        return out

    def const(self, values, scalar: bool = False) -> str:
        if scalar:
            return self.node("Constant", [], value_int=int(values))
        return self.node("Constant", [], value_ints=[int(v) for v in values])

    def input(self, name: str) -> str:
        if name not in self.inputs:
            raise OpBridgeError(f"a check names input '{name}', which the function body {self.proto.name} does not "
                                f"have. Got inputs {list(self.proto.input)}. Name a tensor input of the op.")
        return name

    def attr(self, name: str) -> str:
        """The value of int/ints attribute ``name`` (a Constant referring to it)."""
        kind = self.attr_types.get(name)
        if kind not in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS):
            got = "no such attribute" if kind is None else onnx.AttributeProto.AttributeType.Name(kind)
            raise OpBridgeError(f"a check reads attribute '{name}', which is not an int or ints attribute of "
                                f"{self.proto.name}. Got {got}. Name an int/ints attribute of the op.")
        if ("attr", name) in self.memo:
            return self.memo[("attr", name)]
        # NOTE: cast: onnx's stub takes only its AttributeType, not the plain int the enum is at runtime
        ref = onnx.AttributeProto(name="value_int" if kind == onnx.AttributeProto.INT else "value_ints",
                                  ref_attr_name=name, type=cast(onnx.AttributeProto.AttributeType, kind))
        out = self.memo[("attr", name)] = self.fresh()
        node = helper.make_node("Constant", [], [out])
        node.attribute.append(ref)
        self.nodes.append(node)
        return out

    # -- values the check kinds build on (every one total: it never fails on any input) --------------

    def shape1(self, name: str) -> str:
        """``[1, *shape]`` of input ``name``: never zero-size, even for a scalar."""
        return self.node("Shape", [self.node("Unsqueeze", [self.input(name), self.const([0])])])

    def numel(self, value: str) -> str:
        """The element count of ``value`` as an int64 scalar (compared with a [1] value, it gives [1])."""
        return self.node("Size", [value])

    def numel1(self, value: str) -> str:
        """The element count of ``value`` as int64 [1]."""
        return self.node("Reshape", [self.numel(value), self.const([1])])

    def rank(self, name: str) -> str:
        """The rank of input ``name`` as int64 [1]."""
        return self.node("Sub", [self.numel(self.shape1(name)), self.const([1])])

    def dim(self, name: str, axis: int) -> str:
        """``name.shape[axis]`` as int64 [1]; -1 when there is no such axis."""
        shape = self.shape1(name)  # [1, *shape]
        if axis >= 0:
            padded = self.node("Concat", [shape, self.const([-1] * _pad(axis + 1))], axis=0)
            return self.node("Slice", [padded, self.const([axis + 1]), self.const([axis + 2])])
        padded = self.node("Concat", [self.const([-1] * _pad(-axis)), shape], axis=0)
        end = axis + 1 if axis != -1 else 2**62
        value = self.node("Slice", [padded, self.const([axis]), self.const([end])])
        present = self.node("GreaterOrEqual", [self.rank(name), self.const([-axis])])
        return self.node("Where", [present, value, self.const([-1])])

    def attr_item(self, name: str, index: int, missing: int = -1) -> str:
        """Item ``index`` of ints attribute ``name`` as int64 [1]; ``missing`` when it has no such item."""
        padded = self.node("Concat", [self.attr(name), self.const([missing] * _pad(index + 1))], axis=0)
        return self.node("Slice", [padded, self.const([index]), self.const([index + 1])])

    def double(self, value: str) -> str:
        return self.node("Cast", [value], to=TensorProto.DOUBLE)

    def is_empty(self, value: str) -> str:
        """True [1] when ``value`` has no elements."""
        return self.node("Equal", [self.numel(value), self.const([0])])

    def reduce(self, op_type: str, value: str) -> str:
        """``op_type`` (ReduceMin, ReduceMax) of ``value``, as [1]; of [0] when ``value`` is empty:
        its callers pass an empty value by :meth:`is_empty`.

        NOTE: onnxruntime 1.17 fails reducing an empty tensor (later releases give the type's
        max/min); a 0 of the value's type is appended then (Pad by 0 or 1)."""
        flat = self.node("Reshape", [value, self.const([-1])])
        pads = self.node("Concat", [self.const([0]), self.node("Cast", [self.is_empty(value)], to=TensorProto.INT64)],
                         axis=0)
        return self.node(op_type, [self.node("Pad", [flat, pads])], keepdims=1)

    def reduce_double(self, op_type: str, name: str) -> str:
        """:meth:`reduce` of input ``name`` as float64 [1] (exact for int32 and float values)."""
        return self.double(self.reduce(op_type, self.input(name)))

    def shape_key(self, name: str, drop_last: int) -> str:
        """The shape of input ``name`` with its last ``drop_last`` dims masked, then its rank, as one
        int64 vector: two keys are equal exactly when the ranks and the kept dims are.

        NOTE: no value here is ever zero-size (OpenVINO mishandles those): the shape is read off
        ``Unsqueeze(x, 0)`` and the dims masked rather than sliced away."""
        shape = self.shape1(name)  # [1, *shape]: position 0 stands for the rank
        r = self.rank(name)
        stop = self.node("Squeeze", [self.node("Add", [r, self.const([1])])])
        position = self.node("Range", [self.const(0, scalar=True), stop, self.const(1, scalar=True)])
        kept = self.node("And", [self.node("Greater", [position, self.const([0])]),
                                 self.node("LessOrEqual", [position, self.node("Sub", [r, self.const([drop_last])])])])
        return self.node("Where", [kept, shape, self.node("Neg", [self.node("Add", [r, self.const([2])])])])

    def equal_vectors(self, x: str, y: str) -> str:
        """True [1] when int64 vectors x and y are equal (total: unequal lengths are unequal)."""
        nx, ny = self.numel1(x), self.numel1(y)
        n = self.node("Max", [nx, ny])
        # NOTE: both padded with a value no dim or rank key takes to the longer length
        px = self.node("Pad", [x, self.node("Concat", [self.const([0]), self.node("Sub", [n, nx])], axis=0),
                               self.const(-7, scalar=True)])
        py = self.node("Pad", [y, self.node("Concat", [self.const([0]), self.node("Sub", [n, ny])], axis=0),
                               self.const(-9, scalar=True)])
        same = self.node("Cast", [self.node("Equal", [px, py])], to=TensorProto.INT64)
        return self.node("Cast", [self.node("ReduceMin", [same], keepdims=1)], to=TensorProto.BOOL)


# -- guarded bodies ------------------------------------------------------------------------------------

def _chain(b: GuardBuilder, qualname: str, guarded: Sequence[tuple[int, Check]]) -> str:
    """The guards of ``guarded`` ((index, check) pairs), chained; the last guard's output.

    NOTE: ONNX has no Assert. A guard is ``Gather(data, Where(ok, [0], [1]))`` with a one-item
    ``data``: index 1 is out of bounds. ``data`` is the previous guard's output ([0]), so guards
    fail in list order, like the eager check (two nodes per check)."""
    chain = b.const([0])
    for index, check in guarded:
        bad = b.node("Where", [check.guard(b), b.const([0]), b.const([1])])
        chain = b.node("Gather", [chain, bad], name=guard_name(qualname, index, check))
    return chain


def _wait_inputs(b: GuardBuilder, proto: onnx.FunctionProto, chain: str) -> dict[str, str]:
    """{input: the same value re-read through ``Reshape(x, Shape(x) + chain)``} for each input the
    body reads: every body node waits for all guards, and no guard is dead code. A Reshape to its
    own shape aliases its input in onnxruntime: no copy.

    NOTE: through Unsqueeze/Squeeze, so a scalar input makes no zero-size shape value."""
    read = {n for node in proto.node for n in node.input}
    renames = {}
    for x in proto.input:
        if x in read:
            lifted = b.node("Unsqueeze", [x, b.const([0])])
            moved = b.node("Reshape", [lifted, b.node("Add", [b.node("Shape", [lifted]), chain])], allowzero=1)
            renames[x] = b.node("Squeeze", [moved, b.const([0])])
    return renames


def _wait_outputs(out: onnx.FunctionProto, attr_types: dict[str, int], chain: str) -> None:
    """A body that reads no input: its outputs wait for the guards instead."""
    tail = GuardBuilder(out, attr_types)
    for k, y in enumerate(list(out.output)):
        last = f"{GUARD_PREFIX}_out{k}"
        for node in out.node:
            node.output[:] = [last if o == y else o for o in node.output]
        shape = tail.node("Add", [tail.node("Shape", [last]), chain])
        tail.nodes.append(helper.make_node("Reshape", [last, shape], [y], allowzero=1))
    out.node.extend(tail.nodes)


def _rename_inputs(node: onnx.NodeProto, renames: dict[str, str]) -> None:
    """Rename the values ``node`` reads, in its subgraphs too (outer-scope references)."""
    for inner in walk([node]):
        inner.input[:] = [renames.get(n, n) for n in inner.input]


def _guard(proto: onnx.FunctionProto, qualname: str, guarded: Sequence[tuple[int, Check]],
           attr_types: dict[str, int]) -> onnx.FunctionProto:
    b = GuardBuilder(proto, attr_types)
    chain = _chain(b, qualname, guarded)
    renames = _wait_inputs(b, proto, chain)
    out = onnx.FunctionProto()
    out.CopyFrom(proto)
    del out.node[:]
    out.node.extend(b.nodes)
    for node in proto.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        _rename_inputs(copy, renames)
        out.node.append(copy)
    if not renames:
        _wait_outputs(out, attr_types, chain)
    return out


def guarded_body(proto: onnx.FunctionProto, checks: Checks, attr_types: dict[str, int],
                 skip: Sequence[int] = ()) -> onnx.FunctionProto:
    """``proto`` with one guard per check (but the indices in ``skip``): onnxruntime fails, at a
    node named after the check, before the body runs, when a check fails.

    Example:
        >>> import onnx
        >>> from bridge.core.check_vocabulary import Checks, rank
        >>> body = onnx.helper.make_function("d", "f", ["x"], ["y"], [onnx.helper.make_node("Neg", ["x"], ["y"])],
        ...                                  [onnx.helper.make_opsetid("", 20)])
        >>> out = guarded_body(body, Checks("d::f", [rank("x", 2)]), {})
        >>> [n.name for n in out.node if n.name]
        ['opbridge_check/d::f/x/0.rank']
    """
    guarded = [(i, c) for i, c in enumerate(checks) if c.guarded and i not in skip]
    return _guard(proto, checks.qualname, guarded, attr_types) if guarded else proto


def unreadable(proto: onnx.FunctionProto, checks: Checks, attr_types: dict[str, int]) -> dict[int, str]:
    """``{index: why}`` of the checks reading an input or an int/ints attribute ``proto`` lacks:
    each check is built as a guard over ``proto`` (a check without a guard by its input alone).
    Used to validate a check list against an op's signature and to leave out the guards of
    attributes a derived body bakes in.

    Example:
        >>> import onnx
        >>> from bridge.core.check_vocabulary import Checks, rank
        >>> body = onnx.helper.make_function("d", "f", ["x"], ["y"], [onnx.helper.make_node("Neg", ["x"], ["y"])],
        ...                                  [onnx.helper.make_opsetid("", 20)])
        >>> list(unreadable(body, Checks("d::f", [rank("x", 1), rank("z", 1)]), {}))
        [1]
    """
    found = {}
    for index, check in enumerate(checks):
        try:
            if check.guarded:
                check.guard(GuardBuilder(proto, attr_types))
            elif check.input not in proto.input:
                raise OpBridgeError(f"a check names input '{check.input}'. Got inputs {list(proto.input)}. "
                                    "Name a tensor input.")
        except OpBridgeError as e:
            found[index] = str(e).removeprefix("opbridge: ")
    return found


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
