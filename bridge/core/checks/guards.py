"""ONNX guards: an op's checks as nodes of its function body, named after the checks they state.

Each check kind builds its condition (``Check.guard``) with the :class:`GuardBuilder` here, which
makes each shared value once (one Shape, Size, min and max per input, whatever the checks reading
it); :func:`guarded_body` gathers the conditions into one guard node per input (or attribute) the
checks read, that makes onnxruntime fail when the first failing check is one of that input's.
Each node is named after the checks it states, ``opbridge_check/<qualname>/<input>/<index>.<kind>+...``,
and plain onnxruntime's error names it (the op and the input) and gives the check as
``idx=<index + 1>``. A session words a failure
by running the checks themselves on the op's inputs (``ort_kernels.function``); where it cannot read
them, :func:`guard_failure` words it from the node's name.

NOTE: guard nodes use only (op, type) pairs every supported onnxruntime (1.17 on) implements on
CPU; tests/test_ort_kernels_coverage.py holds every registered op's body to that table.

Example:
    >>> from bridge.core.checks.vocabulary import Checks, rank
    >>> guards_node_name("d::f", [(0, rank("x", 1)), (2, rank("y", 2))])
    'opbridge_check/d::f/x/0.rank+y/2.rank'
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import cast

import onnx
from onnx import TensorProto, helper

from bridge.core.basics.domains import is_onnx
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import FreshNames, ProtoMemo, drop_unread, topological, value_names, walk
from bridge.core.checks.vocabulary import Check, Checks, Compare, DtypeIs

GUARD_PREFIX = "opbridge_check"


def _part(index: int, check: Check) -> str:
    """Check ``index``'s part of a guard node's name."""
    return f"{check.input}/{index}.{check.kind}"


def guards_node_name(qualname: str, guarded: Sequence[tuple[int, Check]]) -> str:
    """The name of the guard node of ``guarded`` ((index, check) pairs): each check's part, joined by '+'."""
    return f"{GUARD_PREFIX}/{qualname}/" + "+".join(_part(i, c) for i, c in guarded)


def is_guard(node: onnx.NodeProto) -> bool:
    return node.name.startswith(GUARD_PREFIX + "/")


def guard_failure(checks: Checks, node: str) -> str:
    """The message of guard node ``node`` of ``checks``'s op failing on values no one can read back:
    what the checks it states require, without values.

    Example:
        >>> from bridge.core.checks.vocabulary import rank
        >>> checks = Checks("d::f", [rank("x", 2)])
        >>> guard_failure(checks, "opbridge_check/d::f/x/0.rank")  # doctest: +NORMALIZE_WHITESPACE
        "opbridge: d::f: input 'x' must have 2 dims. Got a value that fails it inside the model
        (onnxruntime stopped at guard node 'opbridge_check/d::f/x/0.rank'). Pass a 2-D x."
    """
    parts = node.removeprefix(f"{GUARD_PREFIX}/{checks.qualname}/").split("+")
    stated = [c for i, c in enumerate(checks) if _part(i, c) in parts]
    if len(stated) == 1:
        what, fails, fix = stated[0].what(), "fails it", stated[0].fix
    else:
        what = "its inputs must pass each check its guard states: " + "; ".join(c.what() for c in stated)
        fails, fix = "fails one of them", "Run the op eagerly on the same inputs to see which check fails."
    return (f"opbridge: {checks.qualname}: {what}. Got a value that {fails} inside the model (onnxruntime stopped "
            f"at guard node '{node}'). {fix}")


def _stated(node: str) -> tuple[str, list[tuple[str, int, str]]]:
    """The op's qualname and the (input, index, kind) of each check guard node ``node``'s name states.

    >>> _stated("opbridge_check/d::f/x/0.rank+x/2.values_ge")
    ('d::f', [('x', 0, 'rank'), ('x', 2, 'values_ge')])
    """
    qualname, _, stated = node.removeprefix(f"{GUARD_PREFIX}/").partition("/")
    parts = []
    for part in stated.split("+"):
        name, _, label = part.rpartition("/")
        index, _, kind = label.partition(".")
        if index.isdigit():
            parts.append((name, int(index), kind))
    return qualname, parts


def unregistered_guard_failure(node: str, error: str) -> str:
    """The message of guard node ``node`` failing (``error``: onnxruntime's text) in the body of an op this
    process has not registered: its checks are not known here, only what the node's name states (the op,
    the input, each check's index and kind) and the check onnxruntime's ``idx=<index + 1>`` names.

    Example:
        >>> node = "opbridge_check/mine::gather_rows/idx/0.values_in"
        >>> unregistered_guard_failure(node, f"... Gather node. Name:'_inlfunc_f_{node}' Status Message: indices "
        ...                            "element out of data bounds, idx=1 must be within the inclusive range [-1,0]")
        ... # doctest: +NORMALIZE_WHITESPACE
        "opbridge: mine::gather_rows: input 'idx' failed its check 0 (values_in) inside the model, at guard node
        'opbridge_check/mine::gather_rows/idx/0.values_in'. Got onnxruntime's message: indices element out of data
        bounds, idx=1 must be within the inclusive range [-1,0] (its idx=1 is the check's number plus one, not a
        value of the input). Fix the input; for the op's own message (what the check requires, and the value that
        fails it), import the module that registers mine::gather_rows before opening the session (on the command
        line: --ops MODULE)."
    """
    qualname, parts = _stated(node)
    # NOTE: onnxruntime's text is read only for what it adds (the status message, idx=): which guard stopped
    # is known by the node's own name
    status = error.partition("Status Message: ")[2].strip() or error.strip()
    code = re.search(r"\bidx=(\d+)\b", status)
    failed = [p for p in parts if code is not None and p[1] == int(code.group(1)) - 1] or parts
    inputs = list(dict.fromkeys(name for name, _, _ in failed))
    checks = ", ".join(f"{index} ({kind})" for _, index, kind in failed)
    what = (f"input '{inputs[0]}'" if len(inputs) == 1 else "inputs " + ", ".join(f"'{i}'" for i in inputs)) + \
        (f" failed its check {checks}" if len(failed) == 1 else f" failed one of its checks {checks}")
    why = f" (its idx={code.group(1)} is the check's number plus one, not a value of the input)" if code else ""
    return (f"opbridge: {qualname}: {what} inside the model, at guard node '{node}'. Got onnxruntime's message: "
            f"{status}{why}. Fix the input; for the op's own message (what the check requires, and the value that "
            f"fails it), import the module that registers {qualname} before opening the session (on the command "
            "line: --ops MODULE).")


def _pad(n: int) -> int:
    """How many filler items make item ``n - 1`` exist; at least 8, so that the dims and items
    below 8 of one value share one padded copy."""
    return max(n, 8)


class GuardBuilder:
    """Appends nodes to a function body, with fresh value names; the same pure node (a constant, a
    Shape, a reduction) is made once per body."""

    def __init__(self, proto: onnx.FunctionProto, attr_types: dict[str, int], integers: frozenset[str] = frozenset()):
        self.proto = proto
        self.attr_types = attr_types  # attribute name -> AttributeProto type (INT, INTS)
        self.integers = integers  # inputs a dtype check holds to integer dtypes: no NaN to look for
        self.nodes: list[onnx.NodeProto] = []
        self.memo: dict[tuple, str] = {}
        self.names = FreshNames(value_names(proto))
        self.inputs = set(proto.input)

    def fresh(self) -> str:
        return self.names.numbered(f"{GUARD_PREFIX}_v")

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

    def const(self, values, scalar: bool = False, dtype: int = TensorProto.INT64) -> str:
        """A constant of element type ``dtype`` (int64, or a float type) as a tensor (``value=``, the
        form every tool reads): a scalar, or 1-D."""
        number = int if dtype == TensorProto.INT64 else float
        items = [number(values)] if scalar else [number(v) for v in values]
        tensor = helper.make_tensor("value", dtype, [] if scalar else [len(items)], items)
        return self.node("Constant", [], value=tensor)

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

    def numel1(self, value: str) -> str:
        """The element count of ``value`` as int64 [1] (of an input: the product of its shape,
        which shares the input's one Shape with its rank and dims)."""
        if value in self.inputs:
            return self.node("ReduceProd", [self.shape1(value)], keepdims=1)
        return self.node("Reshape", [self.node("Size", [value]), self.const([1])])

    def rank(self, name: str) -> str:
        """The rank of input ``name`` as int64 [1]."""
        return self.node("Sub", [self.node("Size", [self.shape1(name)]), self.const([1])])

    def _padded_shape(self, name: str, axis: int) -> str:
        """``[1, *shape, -1, -1, ...]``: a missing dim past the end reads -1."""
        return self.node("Concat", [self.shape1(name), self.const([-1] * _pad(axis + 1))], axis=0)

    def dim(self, name: str, axis: int) -> str:
        """``name.shape[axis]`` as int64 [1]; -1 when there is no such axis."""
        if axis >= 0:
            padded = self._padded_shape(name, axis)
            return self.node("Slice", [padded, self.const([axis + 1]), self.const([axis + 2])])
        shape = self.shape1(name)  # [1, *shape]
        padded = self.node("Concat", [self.const([-1] * _pad(-axis)), shape], axis=0)
        end = axis + 1 if axis != -1 else 2**62
        value = self.node("Slice", [padded, self.const([axis]), self.const([end])])
        present = self.node("GreaterOrEqual", [self.rank(name), self.const([-axis])])
        return self.node("Where", [present, value, self.const([-1])])

    def dims_prod(self, name: str, start: int, stop: int) -> str:
        """The product of ``name.shape[start:stop]`` (``0 <= start < stop``), a missing dim read as
        -1 as :meth:`dim` reads it, as int64 [1]: one reduction for what would be a Mul per dim."""
        padded = self._padded_shape(name, stop - 1)
        return self.node("ReduceProd", [self.node("Slice", [padded, self.const([start + 1]), self.const([stop + 1])])],
                         keepdims=1)

    def attr_item(self, name: str, index: int) -> str:
        """Item ``index`` of ints attribute ``name`` as int64 [1]; -1 when it has no such item."""
        padded = self.node("Concat", [self.attr(name), self.const([-1] * _pad(index + 1))], axis=0)
        return self.node("Slice", [padded, self.const([index]), self.const([index + 1])])

    def flat_double(self, value: str) -> str:
        """``value`` flattened, as float64."""
        return self.node("Cast", [self.node("Reshape", [value, self.const([-1])])], to=TensorProto.DOUBLE)

    def least(self, value: str, flat_double: bool = False, sources: Sequence[str] = ()) -> str:
        """The least element of ``value`` as float64 [1] (exact for int32 and float values); +inf when
        it is empty, so that an empty value passes every lower bound; -inf when it holds a NaN, so
        that it fails every bound, as eager's ``t.min()`` (NaN) does. ``flat_double``: ``value`` is
        1-D float64 already, computed from the inputs ``sources``.

        NOTE: onnxruntime 1.17 fails reducing an empty tensor: the reduction always sees one +inf
        more (no emptiness test, no Pad, shared by every check reading ``value``). Its ReduceMin
        skips a NaN after the first element: NaNs are made -inf first, unless every source is an
        input a dtype check holds to integers."""
        return self._extreme("ReduceMin", value, flat_double, sources, math.inf)

    def most(self, value: str, flat_double: bool = False, sources: Sequence[str] = ()) -> str:
        """The greatest element of ``value`` as float64 [1]; -inf when it is empty, +inf when it holds
        a NaN (as :meth:`least`)."""
        return self._extreme("ReduceMax", value, flat_double, sources, -math.inf)

    def _extreme(self, reduce: str, value: str, flat_double: bool, sources: Sequence[str], empty: float) -> str:
        """``reduce`` over ``value`` (float64, flat) and ``empty``; each NaN made ``-empty`` first (NaN !=
        NaN), unless no NaN can be there."""
        flat = value if flat_double else self.flat_double(value)
        if not all(s in self.integers for s in (sources or [value])):
            number = self.node("Equal", [flat, flat])
            flat = self.node("Where", [number, flat, self.const([-empty], dtype=TensorProto.DOUBLE)])
        padded = self.node("Concat", [flat, self.const([empty], dtype=TensorProto.DOUBLE)], axis=0)
        return self.node(reduce, [padded], keepdims=1)

    def shape_key(self, name: str, drop_last: int) -> str:
        """The shape of input ``name`` with its last ``drop_last`` dims masked, then its rank, as one
        int64 vector: two keys are equal exactly when the ranks and the kept dims are.

        NOTE: no value here is ever zero-size (OpenVINO mishandles those): the shape is read off
        ``Unsqueeze(x, 0)`` and the dims masked rather than sliced away."""
        shape = self.shape1(name)  # [1, *shape]: position 0 stands for the rank
        if not drop_last:
            return shape  # NOTE: nothing to mask; the rank is the key's length (equal_vectors compares it)
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
        # NOTE: each padded with a value no dim or rank key takes (-7, -9) to the longer length
        px, py = (self.node("Pad", [v, self.node("Concat", [self.const([0]), self.node("Sub", [n, nv])], axis=0),
                                    self.const(fill, scalar=True)]) for v, nv, fill in ((x, nx, -7), (y, ny, -9)))
        same = self.node("Cast", [self.node("Equal", [px, py])], to=TensorProto.INT64)
        return self.node("Cast", [self.node("ReduceMin", [same], keepdims=1)], to=TensorProto.BOOL)


# -- guarded bodies ------------------------------------------------------------------------------------

def _holds(b: GuardBuilder, items: Sequence[str | Compare], positions: list[int] | None = None) -> str:
    """One bool vector, item by item in order, of ``items``: bool [1] values, and comparisons made
    one node per (op, types) with their right-hand numbers in one constant, then put in order;
    given ``positions``, left as made and the item of each entry put in ``positions``.

    NOTE: what makes the guards lean: the ranks, lengths and bounds of every check of an op are
    compared in a handful of nodes, not one node (and one And) each."""
    groups: dict[tuple, list[int]] = {}
    for k, item in enumerate(items):
        key: tuple = ("bool",) if isinstance(item, str) else (
            item.op, item.dtype, "number" if isinstance(item.rhs, (int, float)) else item.rhs_dtype or item.dtype)
        groups.setdefault(key, []).append(k)

    def vector(values: list[str]) -> str:
        return values[0] if len(values) == 1 else b.node("Concat", values, axis=0)

    parts, order = [], []
    for key, members in groups.items():
        order += members
        if key == ("bool",):
            parts.append(vector([cast(str, items[k]) for k in members]))
            continue
        compares = [cast(Compare, items[k]) for k in members]
        op_type, dtype, rhs_type = key
        if rhs_type == "number":
            rhs = b.const([c.rhs for c in compares], dtype=dtype)
        else:
            rhs = vector([cast(str, c.rhs) for c in compares])
            rhs = rhs if rhs_type == dtype else b.node("Cast", [rhs], to=dtype)
        parts.append(b.node(op_type, [vector([c.lhs for c in compares]), rhs]))
    holds = vector(parts)
    if positions is not None:
        positions += order
    elif order != sorted(order):
        holds = b.node("Gather", [holds, b.const([order.index(k) for k in range(len(items))])])
    return holds


def _guard_node(b: GuardBuilder, qualname: str, guarded: Sequence[tuple[int, Check]]) -> str:
    """The guard nodes of ``guarded`` ((index, check) pairs), one per input (or attribute) the
    checks read, each named after its checks; the output of the last, int64 zeros [1] (nothing
    reads it in the file: onnxruntime runs it all the same, :func:`ordered` reads it).

    NOTE: ONNX has no Assert. A guard is ``Gather([0], i)``: index 0 is the only one in bounds.
    Per condition, 0 where it holds and ``M - (index + 1)`` where it fails (``M`` past every
    check): the greatest is the first failing check, as in the eager check (conditions in any
    order), and a constant table gives each input's guard its ``index + 1`` when the check is one of
    that input's (0 otherwise): exactly one guard fails, whatever order onnxruntime runs them in,
    and onnxruntime's message gives its name (the op and the input) and ``idx=<index + 1>`` (the
    check). Each guard gathers from the one before it (its zeros, [0] again): the last one's
    output waits for them all. One input: one guard over the codes, with 0 where a condition holds."""
    items: list[str | Compare] = []
    codes: list[int] = []
    for index, check in guarded:
        conditions = check.guard(b)
        items += conditions
        codes += [index + 1] * len(conditions)
    by_input: dict[str, list[tuple[int, Check]]] = {}
    for index, check in guarded:
        by_input.setdefault(check.input, []).append((index, check))
    groups = list(by_input.values())
    if len(groups) == 1:
        codes_if_failing = b.node("Where", [_holds(b, items), b.const([0]), b.const(codes)])  # NOTE: [0] broadcasts
        return b.node("Gather", [b.const([0]), codes_if_failing], name=guards_node_name(qualname, guarded))
    past = max(codes) + 1
    positions: list[int] = []
    holds = _holds(b, items, positions)
    first = b.node("ReduceMax", [b.node("Where", [holds, b.const([0]), b.const([past - codes[k] for k in positions])])],
                   keepdims=0)
    table = [[0] * len(groups) for _ in range(past)]  # NOTE: row 0: every check holds
    for g, group in enumerate(groups):
        for index, _ in group:
            table[past - (index + 1)][g] = index + 1
    tensor = helper.make_tensor("value", TensorProto.INT64, [past, len(groups)], [c for row in table for c in row])
    indices = b.node("Gather", [b.node("Constant", [], value=tensor), first])
    split = helper.make_node("Split", [indices, b.const([1] * len(groups))], [b.fresh() for _ in groups], axis=0)
    b.nodes.append(split)
    out = b.const([0])
    for group, index in zip(groups, split.output):
        out = b.node("Gather", [out, index], name=guards_node_name(qualname, group))
    return out


def _is_guard_value(name: str) -> bool:
    return name.startswith(GUARD_PREFIX)


def ordered(proto: onnx.FunctionProto) -> bool:
    """Make the body of a guarded function wait for its guard, in place: each input the body reads
    becomes ``Squeeze(Unsqueeze(x, max(guard)), [0])`` (its outputs, when it reads none), which
    aliases ``x`` in onnxruntime (no copy) and makes every body node run after the guard. Whether
    there was a guard to order after.

    NOTE: what a session runs (the function tier). The file's guard reads the inputs beside the
    body, with nothing ordering the two: onnxruntime runs it all the same (unread, it is not
    pruned), but may run a body node first (measured: a Gather with a bad index failed before the
    guard); any dependence on the guard's values hides the inputs' shapes from shape inference and
    from every tool that folds or slims a file.

    Example:
        >>> import onnx
        >>> from bridge.core.checks.vocabulary import Checks, rank
        >>> body = onnx.helper.make_function("d", "f", ["x"], ["y"], [onnx.helper.make_node("Neg", ["x"], ["y"])],
        ...                                  [onnx.helper.make_opsetid("", 20)])
        >>> out = guarded_body(body, Checks("d::f", [rank("x", 2)]), {})
        >>> [n.op_type for n in out.node][-2:], ordered(out), [n.op_type for n in out.node][-3:]
        (['Cast', 'Where'], True, ['Unsqueeze', 'Squeeze', 'Neg'])
    """
    if proto.ByteSize() > _ORDERED_BODY_MAX:
        return _order(proto)
    key = ProtoMemo.key(proto)
    done = _ORDERED.get(key)
    if done is None:
        done = proto.SerializeToString() if _order(proto) else b""
        _ORDERED.put(key, done)
    elif done:
        proto.ParseFromString(done)
    return bool(done)


# NOTE: every session of the function tier orders the bodies of its file (~1 ms a body of 200 nodes);
# one opened again on the same file (workers, reloads) takes the ordered body from here, by the
# digest of the body as given (b"": nothing to order). Bodies past 1 MiB (large constants) are not
# kept: the memo holds their bytes, and their ordering costs little beside hashing them.
_ORDERED = ProtoMemo()
_ORDERED_BODY_MAX = 1 << 20


def _order(proto: onnx.FunctionProto) -> bool:
    """:func:`ordered`'s work: the file's ties (:func:`_tie`) out, the inputs' waits in."""
    untied(proto)
    nodes = list(proto.node)
    # NOTE: the last guard: its output reads every guard before it (_guard_node)
    at = max((i for i, n in enumerate(nodes) if is_guard(n)), default=None)
    if at is None:
        return False
    body = [n for n in nodes if not all(_is_guard_value(o) for o in n.output)]
    read = {i for n in walk(body) for i in n.input}  # NOTE: what the body (every node but the guard's) reads
    names = FreshNames(value_names(proto))
    chain, zero = names(f"{GUARD_PREFIX}_chain"), names(f"{GUARD_PREFIX}_zero")
    waits = [helper.make_node("ReduceMax", [nodes[at].output[0]], [chain], keepdims=1),
             helper.make_node("Constant", [], [zero], value=helper.make_tensor("value", TensorProto.INT64, [1], [0]))]
    for source, waited in _waiting(proto, nodes, body, read, names):
        lifted = names(f"{GUARD_PREFIX}_lifted")
        waits += [helper.make_node("Unsqueeze", [source, chain], [lifted]),
                  helper.make_node("Squeeze", [lifted, zero], [waited])]
    # NOTE: output waits read the body's last values: after every node; input waits right after the guard
    at = len(nodes) if not read & set(proto.input) else at + 1
    for k, wait in enumerate(waits):
        proto.node.insert(at + k, wait)  # NOTE: in place: rebuilding the list copies every node (sessions pay it)
    # NOTE: a tool may order a body's nodes any valid way (onnxslim puts body nodes before the guard): those
    # that now read a wait placed after them move after it; a body in opbridge's own order is left as it is
    moved = topological(proto.node)
    if moved is not None:
        del proto.node[:]
        proto.node.extend(moved)
    return True


def _waiting(proto: onnx.FunctionProto, nodes: list[onnx.NodeProto], body: list[onnx.NodeProto], read: set[str],
             names: FreshNames) -> list[tuple[str, str]]:
    """(value, the name it has once it waited for the guard), the body renamed to read the second: the inputs the
    body reads; for a body that reads no input, its outputs (the body then writes ``<y>_unchecked``)."""
    pairs = [(x, names(f"{x}_checked")) for x in proto.input if x in read]
    if pairs:
        renames = dict(pairs)
        for node in body:
            _rename_inputs(node, renames)
        return pairs
    produced = {o for n in nodes for o in n.output}  # NOTE: top-level: the outputs that may wait
    pairs = [(names(f"{y}_unchecked"), y) for y in proto.output if y in produced]
    outputs = {b: a for a, b in pairs}
    for node in body:
        if any(o in outputs for o in node.output):
            node.output[:] = [outputs.get(o, o) for o in node.output]
    return pairs


def unguarded(proto: onnx.FunctionProto) -> onnx.FunctionProto:
    """``proto`` without its guard (what a file written for deployment carries): every guard value
    nothing but the guard reads removed. A body without a guard comes back as it is.

    Example:
        >>> import onnx
        >>> from bridge.core.checks.vocabulary import Checks, rank
        >>> body = onnx.helper.make_function("d", "f", ["x"], ["y"], [onnx.helper.make_node("Neg", ["x"], ["y"])],
        ...                                  [onnx.helper.make_opsetid("", 20)])
        >>> [(n.op_type, list(n.input)) for n in unguarded(guarded_body(body, Checks("d::f", [rank("x", 2)]), {})).node]
        [('Neg', ['x'])]
    """
    if not any(is_guard(n) for n in proto.node):
        return proto
    out = onnx.FunctionProto()
    out.CopyFrom(proto)
    untied(out)
    drop_unread(out, [n for n in out.node if all(_is_guard_value(o) for o in n.output)])
    return out


def _rename_inputs(node: onnx.NodeProto, renames: dict[str, str]) -> None:
    """Rename the values ``node`` reads, in its subgraphs too (outer-scope references)."""
    for inner in walk([node]):
        if any(n in renames for n in inner.input):  # NOTE: rewriting a node's inputs costs; most keep theirs
            inner.input[:] = [renames.get(n, n) for n in inner.input]


def _shared_constants(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with their Constant nodes first and each distinct constant made once (the guards
    and the body share their [0], [1], attribute reads, ...); other nodes keep their order.

    NOTE: a Constant reads nothing, so it may move first; one giving a function output stays."""
    first: dict[bytes, str] = {}
    renames: dict[str, str] = {}
    constants, rest = [], []
    for node in nodes:
        if node.op_type != "Constant" or not is_onnx(node.domain) or node.output[0] in outputs:
            rest.append(node)
            continue
        key = b"".join(a.SerializeToString(deterministic=True) for a in node.attribute)
        if key in first:
            renames[node.output[0]] = first[key]
        else:
            first[key] = node.output[0]
            constants.append(node)
    for node in rest:
        _rename_inputs(node, renames)
    return constants + rest


def guarded_body(proto: onnx.FunctionProto, checks: Checks, attr_types: dict[str, int],
                 skip: Sequence[int] = ()) -> onnx.FunctionProto:
    """``proto`` with one guard per check (but the indices in ``skip``): onnxruntime fails, at a
    node named after the check, before the body runs, when a check fails. Each output the body
    writes reads the guard's result (:func:`_tie`): no tool removes the guard as dead code.

    Example:
        >>> import onnx
        >>> from bridge.core.checks.vocabulary import Checks, rank
        >>> body = onnx.helper.make_function("d", "f", ["x"], ["y"], [onnx.helper.make_node("Neg", ["x"], ["y"])],
        ...                                  [onnx.helper.make_opsetid("", 20)])
        >>> out = guarded_body(body, Checks("d::f", [rank("x", 2)]), {})
        >>> [n.name for n in out.node if n.name]
        ['opbridge_check/d::f/x/0.rank', 'opbridge_tie/y']
    """
    guarded = [(i, c) for i, c in enumerate(checks) if c.guarded and i not in skip]
    if not guarded:
        return proto
    integers = frozenset(c.input for c in checks if isinstance(c, DtypeIs)
                         and not any(d.is_floating_point or d.is_complex for d in c.dtypes))
    b = GuardBuilder(proto, attr_types, integers)
    guard = _guard_node(b, checks.qualname, guarded)
    out = onnx.FunctionProto()
    out.CopyFrom(proto)
    del out.node[:]
    out.node.extend(_shared_constants([*b.nodes, *proto.node], set(proto.output)))
    _tie(out, guard, b)
    return out


def _tie(proto: onnx.FunctionProto, guard: str, b: GuardBuilder) -> None:
    """Make each output of ``proto`` that a node writes read the guard's result, in place: the node
    writes ``<y>_unchecked``, and ``y = Where(flag, y_unchecked, y_unchecked)`` with ``flag`` false
    (the guard's zeros as a bool scalar): the same value, bit for bit, with the shape and type
    inference sees.

    NOTE: without it nothing reads the guard: onnxscript's optimizer and rewriter (what torch.onnx
    runs) remove it as dead code. :func:`unguarded` and :func:`ordered` take the ties out again."""
    produced = {o for n in proto.node for o in n.output}
    outputs = [y for y in proto.output if y in produced]
    if not outputs:
        return
    names = FreshNames(b.names.taken | value_names(proto))
    flag = names(f"{GUARD_PREFIX}_flag")
    nodes = [helper.make_node("ReduceMax", [guard], [names(f"{GUARD_PREFIX}_max")], keepdims=0)]
    nodes.append(helper.make_node("Cast", [nodes[0].output[0]], [flag], to=TensorProto.BOOL))
    renames = {y: names(f"{y}_unchecked") for y in outputs}
    for node in proto.node:
        if any(o in renames for o in node.output):
            node.output[:] = [renames.get(o, o) for o in node.output]
    nodes += [helper.make_node("Where", [flag, renames[y], renames[y]], [y], name=f"{TIE_PREFIX}{y}") for y in outputs]
    proto.node.extend(nodes)


TIE_PREFIX = "opbridge_tie/"  # NOTE: not a guard node (is_guard): the body's outputs pass through it


def untied(proto: onnx.FunctionProto) -> bool:
    """Take :func:`_tie`'s nodes out of ``proto``, in place (each output written by its own node
    again); whether there were any."""
    ties = [n for n in proto.node if n.name.startswith(TIE_PREFIX)]
    if not ties:
        return False
    back = {n.input[1]: n.output[0] for n in ties}
    kept = [n for n in proto.node if not n.name.startswith(TIE_PREFIX)]
    for node in kept:
        if any(o in back for o in node.output):
            node.output[:] = [back.get(o, o) for o in node.output]
    del proto.node[:]
    proto.node.extend(kept)
    drop_unread(proto, [n for n in kept if all(o.startswith((f"{GUARD_PREFIX}_flag", f"{GUARD_PREFIX}_max"))
                                               for o in n.output)])
    return True


def unreadable(proto: onnx.FunctionProto, checks: Checks, attr_types: dict[str, int]) -> dict[int, str]:
    """``{index: why}`` of the checks reading an input or an int/ints attribute ``proto`` lacks:
    each check is built as a guard over ``proto`` (a check without a guard by its input alone).
    Used to validate a check list against an op's signature and to leave out the guards of
    attributes a derived body bakes in.

    Example:
        >>> import onnx
        >>> from bridge.core.checks.vocabulary import Checks, rank
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
