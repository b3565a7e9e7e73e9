"""``torch.autograd.Function`` classes bridged as ops, as deployment repos write them (BEVDet's
``TRTBEVPoolv2``, mmcv's ``RoIAlignFunction`` and ``ModulatedDeformConv2dFunction``, QAT fake-quant Functions).

The model keeps calling ``Cls.apply(...)``; eager calls and gradients never change. The Function's
``symbolic(g, ...)`` (written for the TorchScript exporter) runs on torch.onnx's own TorchScript graph context
(``torch_compat.run_symbolic``), so ``torch.onnx.symbolic_helper``, ``symbolic_opsetN`` functions and the
``Value`` methods work as they did there. It is read once, at registration, with a graph input per tensor
and a placeholder per other argument of ``forward`` (a :class:`Recorder` sees each ``g.op``):

- one node in a custom domain (``g.op("mmcv::MMCVRoiAlign", input, rois, output_height_i=output_size[0],
  ...)``) is the op's ONNX node: its domain, type, inputs (in symbolic's order) and attributes (names,
  types from the ``_i``/``_f``/``_s``/``_is``/``_fs`` suffixes). Where an argument reaches the node
  (passed through, or an element of it, ``output_size[0]``) is recorded, so every tier calls ``forward``
  with the original arguments rebuilt from the node's attributes.
- standard ONNX ops only (``QuantizeLinear``/``DequantizeLinear``) are written into the graph in the call's
  place (or, with ``name=``, are the body of one custom node), built at each call with its values and
  tensor types.

Each export call is bridged with its own values (:meth:`FunctionBridge.for_call`: a tuple where the read
said int is INTS, None leaves the attribute out) and its custom node checked against what the TorchScript
exporter writes for it (:func:`check_written`). A Function whose node only a call tells (no annotation,
default or sample for an argument's kind) is described at its first call (:class:`NeedsCall`).

During export (``exporters.export``) :func:`swap_forwards` replaces ``Cls.forward`` for the duration of
``torch.export`` by a call of the op's proxy (a ``torch.library.custom_op`` in the ``opbridge_proxy``
namespace whose schema is the node's signature), so the export records one node; ``forward`` is swapped
rather than ``apply`` because modules keep ``apply`` bound under other names (mmcv's ``roi_align =
RoIAlignFunction.apply``) and torch looks ``forward`` up at each call.

Limits: a custom node's inputs must be ``forward``'s tensors (or ``None``) and its attributes ``forward``'s
arguments passed through or indexed (not computed from them); an argument that never reaches the node is
called with its default (export refuses a call with another value, bitwise), or, where forward has none and its
value leaves the node as it is (mmcv 1.x's NMSop), with the first call's value. A tensor argument symbolic reads as
a constant (``parse_args('t')``, ``.numel()``, arithmetic: pytorch-quantization's amax) is known to it only where
the export knows the value (a buffer, parameter or constant of the module): such a symbolic's ops are written into
the graph after the export, with that value (``FunctionBridge.constants``, :func:`constant_body`). A symbolic that
counts its outputs from a value (``outputs=3 if return_index else 2``) gives each call's node its count; one model
holds one count per Function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import itertools
import keyword
import math
import operator
import re
import struct
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import onnx
import torch
from onnx import helper

from bridge.core.basics import torch_compat
from bridge.core.basics.domains import ONNX_DOMAINS, is_custom
from bridge.core.basics.errors import OpBridgeError
from bridge.core.origins import class_name
from bridge.core.proxy import define_proxy_op, proxy_name, schema_text
from bridge.core.spec import Written, value_key, values_key

# NOTE: the opset a symbolic function's standard ops are read at (torch.onnx's TorchScript exporter
# default); bodies are converted to the model's opset as they are attached.
SYMBOLIC_OPSET = 17
# NOTE: the opset a symbolic written for the TorchScript exporter's early opsets runs at where its nodes are
# invalid at SYMBOLIC_OPSET (mmcv 2.x's RoIAlign writes Squeeze(axes_i=...), valid before opset 13)
LEGACY_OPSET = 11
# NOTE: the domain of the node of a standard-op symbolic registered without name=: the export writes its
# standard ops into the graph in the node's place, as the TorchScript exporter did (TensorRT reads Q/DQ there)
INLINE_DOMAIN = "opbridge_symbolic"
# NOTE: the attribute suffixes of the TorchScript exporter's g.op; a custom node carries the first five
_ATTR = re.compile(r"^(.+)_(i|f|s|t|is|fs|ss|ts|g|gs)$")
_SCHEMA_TYPES = {"i": "int", "f": "float", "s": "str", "is": "int[]", "fs": "float[]", "b": "bool"}
_KIND_NAMES = {"i": "an int", "f": "a float", "s": "a str", "is": "an int list", "fs": "a float list", "b": "a bool"}
_NO_DEFAULT = inspect.Parameter.empty


class _NeedsValue(Exception):
    """Internal: symbolic computed with a placeholder (its value is known only at the call)."""


class _Unsupported(Exception):
    """Internal: symbolic used a part of the graph context opbridge does not record."""


class _IsTensor(Exception):
    """Internal: symbolic passed argument ``name`` (read as a placeholder) to g.op as an input: a tensor."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class ReadsConstant(OpBridgeError):
    """A symbolic reads tensor argument ``name`` as a constant (``parse_args('t')``, ``.numel()``, arithmetic): it
    is read with that value where the export knows it (``FunctionBridge.constants``)."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


class NeedsCall(OpBridgeError):
    """A Function whose node only a call tells (argument kinds, values symbolic computes with): it is
    described at its first call in an export (``bridge.core.opdef``)."""

    def __init__(self, cls: type, why: str):
        super().__init__(f"{class_name(cls)}: its node is known only from a call: {why}. Got a registration "
                         "without a sample. Export a model that calls it (the call tells), or pass sample_inputs=.")


class _Arg:
    """Placeholder for argument ``name`` of ``forward`` (``path``: the indices taken from it)."""

    def __init__(self, name: str, path: tuple[int, ...] = ()):
        self.name, self.path = name, path

    def __getitem__(self, index):
        if not isinstance(index, int):
            raise _NeedsValue(f"{self.name}[{index!r}]")
        return _Arg(self.name, self.path + (index,))

    def __repr__(self) -> str:
        return self.name + "".join(f"[{i}]" for i in self.path)

    def _value(self, *_args, **_kwargs):
        raise _NeedsValue(repr(self))

    __bool__ = __int__ = __float__ = __index__ = __len__ = __iter__ = __hash__ = _value  # type: ignore[assignment]
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __neg__ = _value
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _value  # type: ignore[assignment]


class _HeldInt(int):
    """A call's int for argument ``source`` (an :class:`_Arg`): an int to symbolic (``isinstance`` checks pass,
    arithmetic gives plain ints, which read as constants), its source to the recorder."""

    source: _Arg


class _HeldFloat(float):
    """As :class:`_HeldInt`, for a float."""

    source: _Arg


class _HeldStr(str):
    """As :class:`_HeldInt`, for a str."""

    source: _Arg


_HELD = {int: _HeldInt, float: _HeldFloat, str: _HeldStr}


def _held(value: Any, source: _Arg) -> Any:
    """``value`` (a call's argument, or an element of one) as symbolic gets it in a read with the call's values:
    ints, floats and strs tagged with their source, tuples and lists rebuilt of tagged elements, bools and None as
    placeholders (a symbolic branching on one, ``if aligned:``, is read again with the values as they are),
    anything else as it is."""
    if isinstance(value, (tuple, list)):
        return type(value)(_held(v, _Arg(source.name, source.path + (i,))) for i, v in enumerate(value))
    kind = _HELD.get(type(value))
    if kind is None:
        return source if value is None or isinstance(value, bool) else value
    held = kind(value)
    held.source = source
    return held


def _untag(value: Any) -> Any:
    """An attribute value as recorded: a tagged value as its source placeholder; a tuple or list whose elements
    are the elements of one argument, in order, as that argument's placeholder."""
    if isinstance(value, (_HeldInt, _HeldFloat, _HeldStr)):
        return value.source
    if isinstance(value, (tuple, list)):
        items = [_untag(v) for v in value]
        sources = {(x.name, x.path[:-1]) for x in items if isinstance(x, _Arg) and x.path}
        if items and len(sources) == 1 and all(isinstance(x, _Arg) and x.path and x.path[-1] == i
                                               for i, x in enumerate(items)):
            name, path = sources.pop()
            return _Arg(name, path)
        return type(value)(items)
    return value


@dataclasses.dataclass
class Node:
    op_type: str
    domain: str
    inputs: list  # _Arg (a tensor argument of forward), the id of a computed value (Value.unique()), None
    attrs: dict[str, tuple[str, Any]]  # name -> (suffix, value as symbolic gave it: _Arg placeholders kept)
    outputs: list[int]  # ids of the values written


class Recorder:
    """A hook of ``torch_compat.run_symbolic``: records each ``g.op`` call as a :class:`Node`, with the
    placeholders (:class:`_Arg`) symbolic passed as attributes, and makes the call on torch's graph with a
    stand-in value for each placeholder (the graph itself is thrown away).

    Example:
        >>> rec = Recorder()
        >>> sym = lambda g, x, factor: g.op("mine::Scale", x, factor_f=factor)
        >>> _ = torch_compat.run_symbolic(sym, [torch_compat.GraphInput("x"), _Arg("factor")], 17, rec)
        >>> [(n.domain, n.op_type, n.inputs, n.attrs) for n in rec.nodes]
        [('mine', 'Scale', [x], {'factor': ('f', factor)})]
    """

    def __init__(self):
        self.nodes: list[Node] = []

    def __call__(self, write: Callable, opname: str, inputs: Sequence, outputs: int, attrs: Mapping[str, Any]):
        domain, _, op_type = opname.rpartition("::")
        domain = "" if domain == "onnx" else domain
        parsed, concrete = {}, {}
        # NOTE: sorted by keyword (name and suffix), as the TorchScript exporter adds them (its jit_utils
        # _create_node): the node's attributes come in the order torch.onnx.export(dynamo=False) writes
        for key, value in sorted(attrs.items()):
            m = _ATTR.match(key)
            if m is None:
                raise _Unsupported(f"g.op({opname!r}, {key}=...): an attribute name without a type suffix "
                                   "(_i, _f, _s, _t, _is, _fs, _ss)")
            if value is not None:  # NOTE: the TorchScript exporter leaves a None attribute out
                parsed[m.group(1)] = (m.group(2), _untag(value))
            concrete[key] = _stand_in(value, m.group(2))
        for x in inputs:
            if isinstance(x, _Arg):
                if x.path:
                    raise _Unsupported(f"g.op({opname!r}, ...) with an element {x!r} of an argument as an input")
                raise _IsTensor(x.name)
        out = write(*inputs, outputs=outputs, **concrete)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        self.nodes.append(Node(op_type, domain, [_source(x) for x in inputs], parsed, [o.unique() for o in outs]))
        return out


def _stand_in(value: Any, kind: str) -> Any:
    """``value`` with each placeholder replaced by a value of the attribute's type."""
    if isinstance(value, (list, tuple)):
        return [_stand_in(v, kind.rstrip("s")) for v in value]
    if isinstance(value, _Arg):
        return {"f": 0.0, "s": "", "is": [0], "fs": [0.0]}.get(kind, 0)
    return value


def _source(x: Any) -> Any:
    """A g.op input as recorded: forward's tensor argument (a graph input) as its placeholder, another value
    by its id."""
    value = torch_compat.graph_value(x)
    if value is None:
        return x
    name, identity = value
    return identity if name is None else _Arg(name)


def is_function_class(value: Any) -> bool:
    """Whether ``value`` is a ``torch.autograd.Function`` subclass (the class, not an instance).

    >>> is_function_class(torch.autograd.Function), is_function_class(torch.ops.aten.relu.default)
    (False, False)
    """
    return (isinstance(value, type) and issubclass(value, torch.autograd.Function)
            and value is not torch.autograd.Function)


# class -> (its own forward, whether it has its own setup_context), while swap_forwards replaces them
_SWAPPED: dict[type, tuple[Callable | None, bool]] = {}


def _static(cls: type, name: str) -> Callable | None:
    """The Function's staticmethod ``name`` as a plain function, if it has one."""
    fn = inspect.getattr_static(cls, name, None)
    return fn.__func__ if isinstance(fn, staticmethod) else fn


class Declined(OpBridgeError):
    """The symbolic registered for ``prim::PythonOp`` writes nothing for this Function (it returned None or
    raised torch.onnx's "Unsupported" for the class's name)."""


# (class, registered symbolic) -> the symbolic a call of the class runs (one object per pair: bodies key on it)
_DISPATCHED: dict[tuple[type, Callable], Callable] = {}


def symbolic_of(cls: type) -> Callable | None:
    """The symbolic the TorchScript exporter ran for a call of ``cls``: its own ``symbolic``, else the one
    registered with ``torch.onnx.register_custom_op_symbolic("prim::PythonOp", ...)`` (which dispatches on the
    class's name, ``kwargs["name"]`` or ``g.original_node.pyname()``), else None.

    Example:
        >>> class Twice(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         return x * 2
        >>> symbolic_of(Twice) is None  # no symbolic, none registered for prim::PythonOp
        True
    """
    own = _static(cls, "symbolic")
    if own is not None:
        return own
    dispatcher = torch_compat.registered_symbolic("prim::PythonOp", SYMBOLIC_OPSET)
    if dispatcher is None or str(cls.__module__).startswith("torch."):
        return None
    return _DISPATCHED.setdefault((cls, dispatcher), _dispatched(cls, dispatcher))


def symbolic_name(cls: type) -> str:
    """How messages name the symbolic of ``cls`` (:func:`symbolic_of`)."""
    if not dispatched(cls):
        return f"{class_name(cls)}.symbolic"
    dispatcher = torch_compat.registered_symbolic("prim::PythonOp", SYMBOLIC_OPSET)
    return (f"the symbolic registered for prim::PythonOp ({getattr(dispatcher, '__module__', '?')}."
            f"{getattr(dispatcher, '__qualname__', '?')}) for {class_name(cls)}")


def dispatched(cls: type) -> bool:
    """Is the symbolic of ``cls`` the one registered for ``prim::PythonOp`` (it has none of its own)?"""
    return _static(cls, "symbolic") is None and symbolic_of(cls) is not None


def _dispatched(cls: type, dispatcher: Callable) -> Callable:
    """``dispatcher`` (a ``prim::PythonOp`` symbolic) as the symbolic of ``cls``: called as the TorchScript
    exporter called it, ``dispatcher(g, *args, inplace=0, module=..., name=...)`` with ``g.original_node`` the
    call's node (:class:`PythonOpNode`)."""
    attributes = {"inplace": 0, "module": cls.__module__, "name": cls.__name__}

    def symbolic(g, *args):
        g.original_node = PythonOpNode(cls, torch_compat.python_op_node(g, args, attributes))
        try:
            out = dispatcher(g, *args, **attributes)
        except Exception as e:
            if str(e).startswith("Unsupported: ONNX export of operator"):
                raise Declined(f"{class_name(cls)}: the symbolic registered for prim::PythonOp does not export it. "
                               f"Got {str(e).splitlines()[0][:200]}. Give the class a symbolic, or register it "
                               "with name= and function=.") from None
            raise
        if out is None:
            raise Declined(f"{class_name(cls)}: the symbolic registered for prim::PythonOp writes nothing for it. "
                           "Got None. Give the class a symbolic, or register it with name= and function=.")
        return out
    symbolic.__qualname__ = f"{getattr(dispatcher, '__qualname__', 'symbolic')}[{cls.__name__}]"
    return symbolic


class PythonOpNode:
    """The ``prim::PythonOp`` node a ``prim::PythonOp`` symbolic reads as ``g.original_node``: a TorchScript
    node with the call's tensor inputs and the attributes ``inplace``, ``module``, ``name``, whose ``pyname()``
    is the class's name. Its outputs are what the symbolic writes, so reading them is refused."""

    def __init__(self, cls: type, node: Any):
        self._cls, self._node = cls, node

    def pyname(self) -> str:
        return self._cls.__name__

    def kind(self) -> str:
        return "prim::PythonOp"

    def __getattr__(self, name: str) -> Any:
        if name in ("outputs", "output", "outputsSize", "outputsAt"):
            raise _Unsupported(f"g.original_node.{name}() (the prim::PythonOp's outputs, which are what the symbolic "
                               "writes)")
        return getattr(self._node, name)


def original_forward(cls: type) -> Callable | None:
    """The Function's own ``forward`` (a plain function), also while :func:`swap_forwards` replaces it."""
    return _SWAPPED[cls][0] if cls in _SWAPPED else _static(cls, "forward")


def setup_style(cls: type) -> bool:
    """Whether the Function's own ``forward`` takes no ctx (it defines ``setup_context``), also while
    :func:`swap_forwards` replaces them."""
    return _SWAPPED[cls][1] if cls in _SWAPPED else torch_compat.function_has_setup_context(cls)


@dataclasses.dataclass(frozen=True)
class Attr:
    """An attribute of the node: ``source`` the argument of ``forward`` it comes from (``path``: the
    element), or None for a constant ``value``."""

    name: str
    kind: str  # g.op suffix: i, f, s, is, fs
    source: str | None
    path: tuple[int, ...] = ()
    value: Any = None
    optional: bool = False  # a call passes None: the node leaves the attribute out (as TorchScript did)
    # the number type forward takes the argument as, where the node's kind gives another: an int the symbolic
    # writes as a float (mmcv's CARAFE scale_factor_f), a bool as an int (mmdeploy's align_corners_i)
    number: type | None = None

    def raw(self, values: Mapping[str, Any]) -> Any:
        """The value ``forward``'s arguments ``values`` give the attribute, as the call passed it."""
        if self.source is None:
            return self.value
        v = values[self.source]
        # NOTE: a numpy array or scalar as the TorchScript exporter wrote it: its list or number (mmdeploy's
        # NcnnDetectionOutputOp gets target_stds = vars.cpu().detach().numpy())
        v = v.tolist() if type(v).__module__ == "numpy" and hasattr(v, "tolist") else v
        return functools.reduce(operator.getitem, self.path, v)

    def of(self, values: Mapping[str, Any]) -> Any:
        """The attribute's value for ``forward``'s arguments ``values``."""
        v = self.raw(values)
        return None if v is None else _as_kind(v, self.kind)

    def for_value(self, v: Any, call: bool = True) -> Attr:
        """This attribute typed as a call's value ``v`` needs it: a tuple or list where the node said one
        int or float is ints or floats (``g.op`` writes INTS for ``stride_i=(1, 1)``), a float where it said
        int is a float, None leaves it out; forward gets the number as the call passed it (:attr:`number`).
        ``call=False``: ``v`` is a file's attribute value, as onnx reads it (the number type stays the record's)."""
        if self.source is None:
            return self
        if v is None:
            return self if self.optional else dataclasses.replace(self, optional=True)
        typed = self._kind_for(v)
        number = passed_number(typed.kind, v) if call and not self.path else typed.number
        return typed if number == typed.number else dataclasses.replace(typed, number=number)

    def _kind_for(self, v: Any) -> Attr:
        base = self.kind[0]
        if isinstance(v, (list, tuple)) and base in "ifb":
            floats = base == "f" or any(isinstance(x, float) for x in v)
            kind = "fs" if floats else "is"
        elif isinstance(v, float) and base in "ib":
            kind = "f"
        elif isinstance(v, int) and not isinstance(v, bool) and self.kind in ("is", "fs"):
            kind = self.kind[0]
        else:
            kind = self.kind
        return self if kind == self.kind else dataclasses.replace(self, kind=kind)


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionBridge:
    """How one Function becomes one node: the node's signature (``inputs`` then ``attrs``) and the
    way back to ``forward``'s arguments."""

    cls: type
    forward: Callable  # the original forward (a plain function)
    setup_style: bool  # forward takes no ctx (setup_context defined)
    params: tuple[inspect.Parameter, ...]  # forward's arguments, without ctx
    domain: str
    op_type: str
    inputs: tuple[tuple[str, bool], ...]  # (forward argument, optional) per node input
    attrs: tuple[Attr, ...]
    num_outputs: int
    containers: tuple[tuple[str, type], ...] = ()  # arguments rebuilt as tuple/list
    body: Callable | None = None  # standard-op symbolic: attribute values -> written body
    fake: Callable | None = None  # the user's fake= (called with apply's arguments), for every proxy of the node
    # standard-op symbolic: the body each export call recorded, by its attribute values (``record_body``)
    bodies: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    inline: bool = False  # a standard-op symbolic's node without name=: its body goes into the graph in its place
    symbolic_node: bool = False  # the node is the custom node symbolic writes
    # standard-op symbolic: trailing outputs it returns None for (torchvision's roi_pool: (MaxRoiPool, None)),
    # which no value of the model may read
    unwritten: int = 0
    # tensor arguments symbolic reads as constants (pytorch-quantization's amax): each node's standard ops are
    # written after the export, with the value the model holds (``constant_body``)
    constants: tuple[str, ...] = ()

    @property
    def qualname(self) -> str:
        ns = re.sub(r"\W", "_", self.domain)
        return f"{ns}::{self.op_type}"

    @property
    def has_backward(self) -> bool:
        """Does the Function define its own ``backward`` (gradients through ``apply``)?"""
        return getattr(self.cls, "backward", None) is not torch.autograd.Function.backward

    @property
    def schema(self) -> str:
        """The node's signature in torch schema syntax (the proxy op's)."""
        types = ([f"Tensor{'?' if opt else ''}" for _, opt in self.inputs]
                 + [_SCHEMA_TYPES[a.kind] + ("?" if a.optional else "") for a in self.attrs])
        names = [name for name, _ in self.inputs] + [a.name for a in self.attrs]
        return schema_text([(t, "") for t in types], names, ["Tensor"] * self.num_outputs)

    def bind(self, args: Sequence, kwargs: Mapping) -> dict[str, Any]:
        """``forward``'s arguments of an ``apply`` call by name, defaults filled."""
        sig = inspect.Signature(list(self.params))
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            var = next((p.name for p in inspect.signature(self.forward).parameters.values()
                        if p.kind is p.VAR_POSITIONAL), None)
            if var is not None:  # NOTE: _spread named *args as the first call passed them
                raise OpBridgeError(f"{class_name(self.cls)}.apply: forward takes *{var}, whose count the first call "
                                    f"in this registry fixed for the node ({len(self.params)} arguments). Got "
                                    f"{len(args) + len(kwargs)} arguments. Pass as many, or register the Function in "
                                    "another registry (bridge.Registry()) for this model.") from None
            raise OpBridgeError(f"{class_name(self.cls)}.apply: {e}. Got {len(args)} arguments. Call it as its "
                                "forward takes them.") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def for_call(self, values: Mapping[str, Any]) -> FunctionBridge:
        """This node typed as the call with ``forward``'s arguments ``values`` needs it (each attribute by
        :meth:`Attr.for_value`, tuples and lists rebuilt as the call passed them); ``self`` where it fits."""
        attrs = tuple(a.for_value(a.raw(values)) for a in self.attrs)
        containers = dict(self.containers)
        containers.update((a.source, type(values[a.source])) for a in attrs
                          if a.source is not None and isinstance(values[a.source], (tuple, list)))
        # NOTE: a symbolic may count its outputs from the call's values (mmdeploy's TRTBatchedNMSop writes
        # outputs=3 if return_index else 2): the call's count, as the TorchScript exporter wrote it
        return self._typed(attrs, containers, _written_outputs(self, values))

    def for_node(self, attributes: Mapping[str, Any], outputs: int) -> FunctionBridge:
        """This node typed as a file's node with ``attributes`` (name -> value as onnx reads it: a list for
        INTS) needs it, as :meth:`for_call` types it for the call that wrote the node: INTS where the record
        said int (a tuple, or the container the record knows, for ``forward``: mmcv's ``_pair``), an
        attribute the node leaves out as None; its ``outputs`` as the node has them. A file exported in another
        process reads as it was written.

        >>> import torch
        >>> class Pool(torch.autograd.Function):
        ...     @staticmethod
        ...     def symbolic(g, x, stride: int = 1):
        ...         return g.op("mine::Pool", x, stride_i=stride)
        ...     @staticmethod
        ...     def forward(ctx, x, stride: int = 1):
        ...         return x
        >>> fb = describe(Pool)
        >>> [a.kind for a in fb.for_node({"stride": [2, 2]}, 1).attrs], fb.for_node({"stride": 2}, 1) is fb
        (['is'], True)
        """
        attrs = tuple(a.for_value(attributes.get(a.name), call=False) for a in self.attrs)
        containers = dict(self.containers)
        for a in attrs:
            if a.source is not None and not a.path and isinstance(attributes.get(a.name), list):
                containers.setdefault(a.source, tuple)
        return self._typed(attrs, containers, outputs)

    def _typed(self, attrs: tuple[Attr, ...], containers: dict[str, type], outputs: int) -> FunctionBridge:
        """This node with ``attrs``, ``containers`` and ``outputs``; ``self`` where they are its own."""
        if attrs == self.attrs and containers == dict(self.containers) and outputs == self.num_outputs:
            return self
        fb = dataclasses.replace(self, attrs=attrs, containers=tuple(containers.items()), num_outputs=outputs)
        symbolic = symbolic_of(self.cls)
        return fb if self.body is None or symbolic is None else dataclasses.replace(fb, body=_builder(fb, symbolic))

    def to_node(self, values: Mapping[str, Any]) -> list:
        """The node's arguments (inputs, then attributes) for ``forward``'s arguments ``values``. An
        argument that never reaches the node must have its default (tiers call ``forward`` with it)."""
        mapped = {n for n, _ in self.inputs} | {a.source for a in self.attrs}
        for p in self.params:
            v = values[p.name]
            if p.name not in mapped and not _same(v, p.default):
                own = inspect.signature(self.forward).parameters[p.name].default is not _NO_DEFAULT
                raise OpBridgeError(
                    f"{class_name(self.cls)}: argument '{p.name}' of forward does not reach the ONNX node its symbolic "
                    f"writes, so the kernel tiers call forward with "
                    f"{'its default' if own else 'the value the first export call gave (forward has no default)'} "
                    f"{p.default!r}. Got {p.name}={v!r}. Call apply with "
                    f"{'the default' if own else 'that value (or register the Function in another registry)'}, or "
                    "pass the value through symbolic's g.op.")
        self._check_kinds(values)
        return [values[name] for name, _ in self.inputs] + [a.of(values) for a in self.attrs]

    def _check_kinds(self, values: Mapping[str, Any]) -> None:
        """Refuse a call passing a tensor where the node has an attribute, or a number where it has an input:
        the node's signature is the first call's (BEVFusion's models pass D, H, W as ints or as 0-d tensors)."""
        wrong = [(name, "a tensor input", "a tensor (torch.tensor(...))") for name, optional in self.inputs
                 if not isinstance(values[name], torch.Tensor) and not (optional and values[name] is None)]
        wrong += [(a.source, f"{_KIND_NAMES[a.kind]} attribute", f"a Python {_KIND_NAMES[a.kind].split()[-1]} "
                   f"({'.tolist()' if a.kind in ('is', 'fs') else '.item()'})")
                  for a in self.attrs if a.source is not None and isinstance(a.raw(values), torch.Tensor)]
        if wrong:
            name, is_, fix = wrong[0]
            v = values[name]
            got = f"a tensor of shape {list(v.shape)}" if isinstance(v, torch.Tensor) else \
                f"{type(v).__name__} {v!r:.60}"
            raise OpBridgeError(f"{class_name(self.cls)}: argument '{name}' is {is_} of the node {self.qualname} (as "
                                f"the first call in this registry passed it), and this call passes another kind. Got "
                                f"{name}: {got}. Pass {fix} as that call did, or register the Function in another "
                                "registry (bridge.Registry()) for this model.")

    def to_apply(self, node_args: Sequence) -> list:
        """``forward``'s arguments rebuilt from the node's (inputs, then attributes)."""
        values = {name: v for (name, _), v in zip(self.inputs, node_args)}
        parts: dict[str, dict[tuple, Any]] = {}
        for a, v in zip(self.attrs, node_args[len(self.inputs):]):
            if a.source is not None:
                parts.setdefault(a.source, {})[a.path] = v
        containers, defaults = dict(self.containers), {p.name: p.default for p in self.params}
        numbers = {a.source: a.number for a in self.attrs if a.source is not None and not a.path}
        for name, got in parts.items():
            container = containers.get(name)
            values[name] = (_as_param(got[()], defaults[name], container, numbers.get(name)) if () in got
                            else _rebuild(got, container or tuple))
        return [values.get(p.name, p.default) for p in self.params]

    def call_forward(self, args: Sequence):
        """The original ``forward`` on ``args`` (no autograd; a fresh ctx where it takes one, whose
        ``needs_input_grad`` says no gradient is asked). Tensors go in as copies: a forward that writes
        its input in place (``x.add_(k); ctx.mark_dirty(x)``) writes and returns the copy, as the node's
        output, never the tier's input."""
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        ctx: tuple = ()
        if not self.setup_style:
            ctx = (torch.autograd.function.FunctionCtx(),)
            ctx[0].needs_input_grad = (False,) * len(args)  # type: ignore[attr-defined]  # NOTE: torch sets it in apply
        with torch.no_grad():
            return self.forward(*ctx, *args)


def _same(a, b) -> bool:
    """Whether a call's value ``a`` is the default ``b`` as the kernel tiers would see it: bitwise for
    floats (-0.0 is not 0.0, NaN is NaN), by type (True is not 1), a tensor only as itself."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    try:
        return bool(value_key(a) == value_key(b))
    except Exception:  # noqa: BLE001  an object without a plain ==
        return a is b


def _as_kind(v, kind: str):
    if kind in ("is", "fs"):
        vals = list(v) if isinstance(v, (list, tuple)) else [v]
        return [float(x) for x in vals] if kind == "fs" else [_as_kind(x, "i") for x in vals]
    if kind == "b":
        return bool(v)
    if kind == "i" and isinstance(v, bool):
        return int(v)
    if kind == "f" and isinstance(v, int):  # NOTE: a SymInt is not an int: it stays symbolic
        return float(v)
    return v


def passed_number(kind: str, v: Any) -> type | None:
    """The number type of a call's value ``v`` where an attribute of ``kind`` holds it as another (bool as int or
    float, int as float); None where the kind's own type is the value's.

    >>> passed_number("f", 2), passed_number("i", False), passed_number("f", 2.0), passed_number("i", 3)
    (<class 'int'>, <class 'bool'>, None, None)
    """
    if isinstance(v, bool) and kind in ("i", "f"):
        return bool
    return int if type(v) is int and kind == "f" else None


def _as_param(v, default: Any, container: type | None, number: type | None = None):
    if (isinstance(default, bool) or number is bool) and isinstance(v, (int, float)):
        return bool(v)
    if number is int and isinstance(v, float) and v.is_integer():
        return int(v)
    if container is not None and isinstance(v, (list, tuple)):
        return container(v)
    return v


def _rebuild(parts: dict[tuple, Any], container: type):
    """A nested sequence from its elements by index path."""
    top: dict[int, dict[tuple, Any]] = {}
    for path, v in parts.items():
        top.setdefault(path[0], {})[path[1:]] = v
    items = [top[i][()] if () in top[i] else _rebuild(top[i], container) for i in range(max(top) + 1)]
    return container(items)


# -- reading symbolic ------------------------------------------------------------------

def _run_symbolic(cls: type, symbolic: Callable, args: list) -> tuple[Recorder, list]:
    """symbolic run on torch.onnx's graph context with ``args`` (a placeholder per tensor and per argument
    read as a placeholder), each g.op recorded."""
    rec = Recorder()
    try:
        outs = torch_compat.run_symbolic(symbolic, args, SYMBOLIC_OPSET, rec)
    except torch_compat.SymbolicFailed as e:
        cause = e.__cause__
        if isinstance(cause, (OpBridgeError, _NeedsValue, _IsTensor)):
            raise cause from None
        if isinstance(cause, _Unsupported):
            raise _symbolic_error(cls, "uses torch.onnx's graph context in a way opbridge cannot read", str(cause)) \
                from None
        raise
    if not all(any(o in n.outputs for n in rec.nodes) for o in outs if o is not None):
        raise OpBridgeError(f"{symbolic_name(cls)} must return the values g.op gave. Got {outs!r}. Return "
                            "the output(s) of its g.op calls.")
    return rec, outs


def _symbolic_error(cls: type, what: str, cause: str) -> OpBridgeError:
    return OpBridgeError(
        f"{symbolic_name(cls)} {what}, which opbridge cannot read back into the call of forward. Got {cause}. "
        "Write the node with g.op only, passing forward's tensors as inputs and its other arguments (or their "
        "elements, x[0]) as attributes; or register with symbolic=False, name='ns::op' and function=... .")


def describe(cls: type, *, name: str | None = None, use_symbolic: bool = True,
             sample: tuple[tuple, dict] | None = None) -> FunctionBridge:
    """Read ``cls`` (a Function): its node (from ``symbolic``, or ``name=`` and ``forward``'s arguments)
    and the way from the node back to ``forward``'s arguments. ``sample`` (an ``apply`` call's args and
    kwargs) gives argument kinds where neither symbolic, annotations nor defaults do.

    Example:
        >>> class Scale(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x, factor=2.0):
        ...         return x * factor
        ...     @staticmethod
        ...     def symbolic(g, x, factor):
        ...         return g.op("mine::Scale", x, factor_f=factor)
        >>> fb = describe(Scale)
        >>> x = torch.ones(2)
        >>> fb.qualname, fb.schema, fb.to_node({"x": x, "factor": 3.0})[1:], fb.to_apply([x, 3.0])[1:]
        ('mine::Scale', '(Tensor x, float factor) -> Tensor', [3.0], [3.0])
    """
    forward = original_forward(cls)
    if forward is None or forward is torch.autograd.Function.forward:
        raise OpBridgeError(f"{class_name(cls)} defines no forward. Got a Function without one. Define forward.")
    params = _spread(cls, list(inspect.signature(forward).parameters.values())[0 if setup_style(cls) else 1:], sample)
    base: dict[str, Any] = dict(cls=cls, forward=forward, setup_style=setup_style(cls), params=tuple(params))
    symbolic = symbolic_of(cls) if use_symbolic else None
    constants: set[str] = set()
    try:
        read = None if symbolic is None else _read_symbolic(cls, symbolic, params, sample, constants)
    except Declined:
        if _static(cls, "symbolic") is not None or name is None:
            raise
        symbolic, read = None, None  # NOTE: the prim::PythonOp symbolic passes it by; name= names its node
    # NOTE: a symbolic reading constants is written into the graph as it writes, custom nodes (TensorRT's
    # TRT_FP8QuantizeLinear) and all, with the values of each call (constant_body)
    if _custom_node(read, constants):
        assert read is not None  # NOTE: _custom_node says so
        if sample is not None:
            _probe_sources(cls, symbolic, params, sample, read[0])
        params = _unread_defaults(cls, symbolic, params, sample, read[0])
        base["params"] = tuple(params)
        found = _from_symbolic(cls, *read, params, _given(params, sample))
        if name is not None:
            raise OpBridgeError(f"{class_name(cls)}: its symbolic names the node "
                                f"{found['domain']}::{found['op_type']}. Got name={name!r} as well. Drop name=, or "
                                "pass symbolic=False to name the node yourself.")
        return FunctionBridge(**base, **found, symbolic_node=True)
    return _plain(cls, base, name, params, sample, symbolic, read, tuple(p.name for p in params if p.name in constants))


def _spread(cls: type, params: list[inspect.Parameter], sample) -> list[inspect.Parameter]:
    """``forward``'s arguments, its ``*args`` named one by one as the call ``sample`` passes them (``args_0``, ...:
    mmdeploy's MultiLevelRoiAlign takes ``forward(g, *args)``, the feature maps then the settings): the first call
    fixes the count, as the TorchScript exporter ran such a symbolic. A variadic forward is described at its first
    call; keyword arguments besides ``*args`` are refused."""
    var = next((p for p in params if p.kind is p.VAR_POSITIONAL), None)
    _refuse_keywords(cls, params, var, sample)
    if var is None:
        return params
    if sample is None:
        raise NeedsCall(cls, f"forward takes *{var.name}, whose count only a call tells")
    named = [p for p in params if p.kind is not p.VAR_POSITIONAL]
    taken = {p.name for p in named}
    names = (n for n in (f"{var.name}_{i}" for i in itertools.count()) if n not in taken)
    spread = [inspect.Parameter(next(names), inspect.Parameter.POSITIONAL_OR_KEYWORD)
              for _ in range(len(sample[0]) - len(named))]
    # NOTE: a call filling *args fills every named argument before it: their defaults never apply
    return [*(p.replace(default=inspect.Parameter.empty) if spread else p for p in named), *spread]


def _refuse_keywords(cls: type, params: list[inspect.Parameter], var: inspect.Parameter | None, sample) -> None:
    """Refuse ``**kwargs``, and keywords beside ``*args`` (forward's keyword-only arguments, a call's keywords)."""
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) if var is not None else \
        (inspect.Parameter.VAR_KEYWORD,)
    others = [p.name for p in params if p.kind in kinds]
    if others or (var is not None and sample is not None and sample[1]):
        got = f"forward's {others}" if others else f"a call passing {sorted(sample[1])} by keyword"
        raise OpBridgeError(f"{class_name(cls)}.forward takes {'*' + var.name if var else '**kwargs'}: a node needs "
                            f"its arguments by position or name, one way. Got {got}. Call it with positional "
                            "arguments only, or name each argument of forward.")


def _custom_node(read: tuple[Recorder, list] | None, constants: set[str]) -> bool:
    """Whether symbolic's node is the custom node it writes (not when it reads a tensor as a constant: its ops,
    custom or not, are written into the graph with each call's value)."""
    return read is not None and not constants and any(is_custom(n.domain) for n in read[0].nodes)


def _read(cls, symbolic, args: list, passes: tuple = ()) -> tuple[Recorder, list]:
    """:func:`_run_symbolic`, the user's errors (but ``passes``) named (:func:`symbolic_raised`)."""
    try:
        return _run_symbolic(cls, symbolic, args)
    except (OpBridgeError, *passes):
        raise
    except torch_compat.SymbolicFailed as e:  # the user's symbolic, named
        raise symbolic_raised(cls, args, SYMBOLIC_OPSET, str(e)) from None


_CONSTANT = re.compile(r"Expected node type 'onnx::Constant' for argument '(\w+)'")


def symbolic_raised(cls: type, args: Sequence, opset: int, cause: str) -> OpBridgeError:
    """The error for a symbolic that raised when run with ``args`` (graph inputs for tensors, placeholders
    for the values a call gives, or the call's values)."""
    constant = _CONSTANT.search(cause)
    if constant is not None:
        return ReadsConstant(
            f"{symbolic_name(cls)} reads tensor argument '{constant.group(1)}' as a constant (parse_args 't', "
            "_get_const, .numel() on it), which opbridge gives it where the export knows the value (a buffer, "
            "parameter or constant of the module) and the argument is one of forward's tensors. Got "
            f"{cause.splitlines()[0][:200]}. Pass a tensor the module holds, or that value as a Python number or "
            "list (an attribute), or register with name= and function= (a body of your own).", constant.group(1))
    shown = ["<tensor>" if isinstance(a, torch_compat.GraphInput) else f"<{a!r}: a call's value>"
             if isinstance(a, _Arg) else f"<tensor {a.name} read as a constant>"
             if isinstance(a, torch_compat.ConstantInput) else a for a in args]
    return OpBridgeError(f"{symbolic_name(cls)} raised when run (as the TorchScript exporter runs it, at opset "
                         f"{opset}) with the arguments {shown}. Got {cause.splitlines()[0][:300]}. Fix the symbolic "
                         f"for these arguments, or call {cls.__name__}.apply with values it accepts.")


def _read_symbolic(cls, symbolic, params, sample, constants: set[str]) -> tuple[Recorder, list]:
    """symbolic run on torch.onnx's graph context with a graph input per tensor argument and a placeholder
    per other argument, or where it computes with one, with the values known (then it may write standard
    ops only). An argument is a tensor where the sample passes one, its annotation says so, or symbolic
    passes it to g.op as an input (found as it runs: the read starts again). A tensor symbolic reads as a
    constant is added to ``constants`` and read again as a stand-in real tensor of the call's dtype and shape."""
    given = _given(params, sample)
    annotated, tensors = _tensors(params, given)
    needs, held, branched, doubted = None, False, None, None
    while True:
        args = (_placeholders(params, tensors, given, constants) if needs is None
                else _known_values(params, sample, tensors, held=held, constants=constants))
        try:
            g, outs = _read(cls, symbolic, args, (_NeedsValue, _IsTensor))
        except _IsTensor as e:
            tensors.add(e.name)
            continue
        except Declined:
            raise  # NOTE: the prim::PythonOp symbolic passes the class by its name, whatever the values
        except ReadsConstant as e:
            _read_as_constant(e, tensors, constants)
            continue
        except _NeedsValue as e:
            branched = str(e) if held and sample is None else branched
            needs, held = _after_use(cls, e, needs, held)
            continue
        except OpBridgeError as e:
            if doubted is None and annotated & tensors and needs is None:
                doubted = e  # NOTE: read once more with placeholders where only annotations said tensor
                tensors.difference_update(annotated)
                continue
            needs, held = _after_failure(cls, doubted or e, needs, held, params, tensors | annotated, given, sample)
            continue
        if held and not any(is_custom(n.domain) for n in g.nodes):
            held = False  # NOTE: standard ops only: read as before, with the values as they are
            continue
        if branched is not None and any(is_custom(n.domain) for n in g.nodes):
            # NOTE: read with the default, its custom node is the default's (mmdeploy's TRTBatchedNMSop writes
            # outputs=3 if return_index else 2): the call's value tells which
            raise NeedsCall(cls, f"its symbolic branches on {branched}, whose value only a call gives")
        return g, outs


def _tensors(params, given: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(the arguments only an annotation says are tensors, every argument read as a tensor first). An annotation
    may be wrong: the sample's value wins (mmcv's MultiScaleDeformableAttnFunction annotates ``im2col_step:
    torch.Tensor``, its callers pass 64), and a symbolic that fails on the annotated tensors is read once more with
    placeholders there (passed to g.op as inputs they are tensors again; failing again, the first error stands)."""
    annotated = {p.name for p in params if p.name not in given and _kind_of_annotation(p.annotation) == "tensor"}
    return annotated, {p.name for p in params if isinstance(given.get(p.name), torch.Tensor)} | annotated


def _read_as_constant(e: ReadsConstant, tensors: set[str], constants: set[str]) -> None:
    """After symbolic read tensor argument ``e.name`` as a constant: read it as one (added to ``constants``, as the
    TorchScript exporter read a module's constant: its value), unless it is no tensor or was read so already."""
    if e.name not in tensors or e.name in constants:
        raise e
    constants.add(e.name)


def _after_use(cls, e: _NeedsValue, needs: str | None, held: bool) -> tuple[str, bool]:
    """The next read of :func:`_read_symbolic` after symbolic computed with a placeholder: with the values known
    (first tagged, then as they are: it may branch on a bool, ``if aligned:``), or none (a call tells)."""
    if held:
        return needs or "", False
    if needs is not None:
        raise NeedsCall(cls, f"it computes with {e}, whose value the registration does not know") from None
    return f"a use of {e}", True


def _after_failure(cls, e: OpBridgeError, needs: str | None, held: bool, params, tensors: set[str],
                   given: Mapping[str, Any], sample) -> tuple[str, bool]:
    """The next read of :func:`_read_symbolic` after symbolic raised: with placeholders it may check the values
    (``isinstance``), so with the values known (first tagged, then as they are); else the error, or a deferral to
    the first call where only a call tells which arguments are tensors."""
    if held and not isinstance(e, NeedsCall):
        return needs or "", False
    cause = str(e).split(". Got ", 1)[-1].split(". Fix the symbolic", 1)[0]
    if needs is None and not isinstance(e, NeedsCall):
        return f"what it raised with placeholders ({cause})", True
    unknown = [p.name for p in params if p.name not in tensors and p.name not in given
               and p.default in (_NO_DEFAULT, None) and _kind_of_annotation(p.annotation) is None]
    if sample is None and unknown and not isinstance(e, NeedsCall):
        raise NeedsCall(cls, f"which of {unknown} are tensors only a call tells, and symbolic fails without "
                             f"({cause})") from None
    raise e


def _placeholders(params, tensors: set[str], given: Mapping[str, Any], constants: Iterable[str] = ()) -> list:
    """A graph input per tensor (typed as the sample's), a placeholder per other argument."""
    return [_tensor_input(p.name, given, constants) if p.name in tensors else _Arg(p.name) for p in params]


def _tensor_input(name: str, given: Mapping[str, Any], constants: Iterable[str] = ()) -> Any:
    """A tensor argument as symbolic gets it: a graph input, or (in ``constants``) a stand-in real tensor."""
    value = given.get(name)
    if name in constants:
        return (torch_compat.ConstantInput(name, *_typed(value)) if isinstance(value, torch.Tensor)
                else torch_compat.ConstantInput(name))
    return _graph_input(name, value) if isinstance(value, torch.Tensor) else torch_compat.GraphInput(name)


_PROBE = 65537  # NOTE: probe numbers from here, 7 apart: exact in float32, unlike any value a symbolic adds


def _probe_sources(cls, symbolic, params, sample, g: Recorder) -> None:
    """Give each attribute of ``g``'s custom node that symbolic wrote from ``float(x)`` or ``int(x)`` of an argument
    (or an element of one: mmcv's ``iou_threshold_f=float(iou_threshold)``, ``int(output_size[0])``; the builtin
    returns a plain number, so the tag is lost) that argument as its source. symbolic is read once more with each
    number no attribute carries replaced by a distinct probe; an attribute holding a probe is written from it; and
    once per such bool, flipped. A symbolic that refuses the probes keeps its node as read (the unmapped arguments
    are named later; :func:`check_written` checks each call's node)."""
    node = next(n for n in g.nodes if is_custom(n.domain))
    if all(isinstance(v, _Arg) for _, v in node.attrs.values()):
        return
    tensors = {x.name for x in node.inputs if isinstance(x, _Arg)}
    mapped = tensors | {v.name for _, v in node.attrs.values() if isinstance(v, _Arg)}
    args = _known_values(params, sample, tensors)
    _probe_numbers(cls, symbolic, node, [(p, a) for p, a in zip(params, args)], mapped)
    # NOTE: a bool is read as it is (symbolic may branch on it): the attribute that flips with it is written from it
    for i, p in enumerate(params):
        if p.name in mapped or type(args[i]) is not bool:
            continue
        flipped = _probe(cls, symbolic, args[:i] + [not args[i]] + args[i + 1:])
        for name, (kind, value) in list(node.attrs.items()):
            found = flipped.get(name, (None, None))[1]
            if type(value) is bool and value is args[i] and type(found) is bool and found is not value:
                node.attrs[name] = (kind, _Arg(p.name))


def _probe_numbers(cls, symbolic, node: Node, given: list[tuple[Any, Any]], mapped: set[str]) -> None:
    """:func:`_probe_sources` for numbers: each (param, value) of ``given`` not ``mapped`` read with distinct probes."""
    probes: dict[int | float, _Arg] = {}

    def probe(value, source: _Arg):
        if isinstance(value, (tuple, list)):
            return type(value)(probe(v, _Arg(source.name, source.path + (i,))) for i, v in enumerate(value))
        if type(value) not in (int, float):
            return value
        number = type(value)(_PROBE + 7 * len(probes))
        probes[number] = source
        return number

    probed = _probe(cls, symbolic, [a if p.name in mapped else probe(a, _Arg(p.name)) for p, a in given])
    for name, (kind, value) in list(node.attrs.items()):
        found = probed.get(name, (None, None))[1]
        if not isinstance(value, _Arg) and type(found) in (int, float) and found in probes:
            node.attrs[name] = (kind, probes[found])


def _unread_defaults(cls, symbolic, params, sample, g: Recorder) -> list[inspect.Parameter]:
    """``params`` with a default for each argument of forward that has none, never reaches ``g``'s custom node, and
    whose value leaves that node as it is (mmcv 1.x's NMSop writes ``mmcv::NonMaxSuppression`` without its
    ``score_threshold`` and ``max_num``): the call's value (``sample``), which the kernel tiers then call forward
    with and every later call must pass (:meth:`FunctionBridge.to_node`), as a default would be. An argument the
    node depends on otherwise (an attribute computed from it) keeps no default (:func:`_check_names` names it)."""
    node = next(n for n in g.nodes if is_custom(n.domain))
    inputs = {x.name for x in node.inputs if isinstance(x, _Arg)}
    mapped = inputs | {v.name for _, v in node.attrs.values() if isinstance(v, _Arg)}
    unread = [p.name for p in params if p.name not in mapped and p.default is _NO_DEFAULT]
    if not unread:
        return list(params)
    if sample is None:
        raise NeedsCall(cls, f"argument(s) {unread} of forward never reach its node and have no default: a call "
                             "gives the values the node stands for")
    given = _given(params, sample)
    tensors = {p.name for p in params if isinstance(given.get(p.name), torch.Tensor)} | inputs
    free = _node_free_of(cls, symbolic, params, _known_values(params, sample, tensors),
                         [n for n in unread if n in given])
    return [p.replace(default=given[p.name]) if p.name in free else p for p in params]


def _node_free_of(cls, symbolic, params, args: list, names: list[str]) -> set[str]:
    """Those of ``names`` (arguments of forward) whose value leaves the custom node symbolic writes for ``args`` (the
    call's values) as it is: read again with each changed (:func:`_other_value`), its attributes are the same."""
    written = _probe(cls, symbolic, args)
    free = set()
    for i, p in enumerate(params):
        other = _other_value(args[i]) if p.name in names else None
        if other is not None and written and _probe(cls, symbolic, args[:i] + [other] + args[i + 1:]) == written:
            free.add(p.name)
    return free


def _other_value(value: Any) -> Any:
    """A value of ``value``'s type unlike it (a probe number, the other bool), or None for other types."""
    if type(value) is bool:
        return not value
    return type(value)(_PROBE) if type(value) in (int, float) and value != _PROBE else None


def _probe(cls, symbolic, args: list) -> dict[str, tuple[str, Any]]:
    """The attributes of the custom node symbolic writes for ``args``; none where it refuses them."""
    try:
        return next(n for n in _run_symbolic(cls, symbolic, args)[0].nodes if is_custom(n.domain)).attrs
    except Exception:  # noqa: BLE001  NOTE: a symbolic checking its values (assert points in [1, 5]) refuses them
        return {}


def _from_symbolic(cls, g: Recorder, outs: list, params, given: Mapping[str, Any]) -> dict[str, Any]:
    """The custom node symbolic writes (a dict of FunctionBridge fields)."""
    node = next(n for n in g.nodes if is_custom(n.domain))
    if None in outs:
        raise _symbolic_error(cls, "returns None for an output of its custom node", f"it returned {outs}")
    if len(g.nodes) != 1 or outs != node.outputs:
        _refuse_computed_inputs(cls, g, node)
        raise _symbolic_error(cls, "writes a custom node together with other nodes",
                              f"{[f'{n.domain}::{n.op_type}' if n.domain else n.op_type for n in g.nodes]}")
    inputs = _node_inputs(cls, node, {p.name: _may_be_none(p) for p in params})
    attrs = [_passed_as(_node_attr(cls, key, kind, value), params, given) for key, (kind, value) in node.attrs.items()]
    _check_names(cls, inputs, attrs, params)
    _check_paths(cls, attrs, given)
    containers = tuple((p.name, type(p.default)) for p in params if isinstance(p.default, (tuple, list)))
    return dict(domain=node.domain, op_type=node.op_type, inputs=tuple(inputs), attrs=tuple(attrs),
                num_outputs=len(outs), containers=containers)


def _passed_as(attr: Attr, params, given: Mapping[str, Any]) -> Attr:
    """``attr`` with the number type forward takes its argument as (:attr:`Attr.number`): the sample's value's,
    else the default's, else the annotation's."""
    param = next((p for p in params if p.name == attr.source), None)
    if param is None or attr.path:
        return attr
    value = given.get(param.name, param.default)
    if value is _NO_DEFAULT or value is None:
        value = {"i": 0, "b": False}.get(_kind_of_annotation(param.annotation) or "")
    number = passed_number(attr.kind, value)
    return attr if number is None else dataclasses.replace(attr, number=number)


def _refuse_computed_inputs(cls, g: Recorder, node: Node) -> None:
    """Raise where symbolic computes inputs of its custom node with other nodes (mmdeploy's GridPriorsTRTOp passes
    ``ConstantOfShape`` of the feature map's height and width, shape carriers): no tier can give such a node's
    inputs back to forward as the arguments they were computed from."""
    made = {o: n for n in g.nodes if n is not node for o in n.outputs}
    computed = [(i, made[x]) for i, x in enumerate(node.inputs) if type(x) is int and x in made]
    if not computed:
        return
    raise OpBridgeError(
        f"{symbolic_name(cls)} gives its {node.domain}::{node.op_type} node input(s) it computes with other nodes "
        f"({', '.join(f'input {i} from {n.op_type}' for i, n in computed)}), so no kernel tier can call forward "
        "with the arguments they were computed from. Got the nodes "
        f"{[f'{n.domain}::{n.op_type}' if n.domain else n.op_type for n in g.nodes]}. Leave the Function "
        "unregistered (export then traces its forward as plain torch code), or register it with symbolic=False, "
        "name='ns::op' and function=... (a node of forward's own arguments).")


def _check_names(cls, inputs: list[tuple[str, bool]], attrs: list[Attr], params) -> None:
    """The node's inputs and attributes have distinct names (no Python keyword) and every argument of forward
    without a default reaches it."""
    names = [n for n, _ in inputs] + [a.name for a in attrs]
    if len(set(names)) != len(names) or any(keyword.iskeyword(n) for n in names):
        raise _symbolic_error(cls, "names two inputs or attributes alike (or with a Python keyword)", str(names))
    mapped = {n for n, _ in inputs} | {a.source for a in attrs}
    missing = [p.name for p in params if p.name not in mapped and p.default is _NO_DEFAULT]
    if missing:
        raise _symbolic_error(cls, f"never passes argument(s) {missing} to its node (they have no default)",
                              f"node inputs {[n for n, _ in inputs]}, attributes {[a.name for a in attrs]}")


def _may_be_none(param: inspect.Parameter) -> bool:
    """Whether forward's argument may be None: its default is None, or its annotation allows None (mmcv's
    ``offset: Optional[Tensor]``, ``Tensor | None``, or either as text).

    >>> sig = inspect.signature(lambda a: None)
    >>> [_may_be_none(sig.parameters["a"].replace(annotation=a)) for a in (typing.Optional[torch.Tensor],
    ...                                                                    "Tensor | None", torch.Tensor)]
    [True, True, False]
    """
    if param.default is None:
        return True
    if isinstance(param.annotation, str):
        text = param.annotation.replace(" ", "")
        return text.startswith("Optional[") or "None" in text.split("|")
    return type(None) in typing.get_args(param.annotation)


def _node_inputs(cls, node: Node, optional: Mapping[str, bool]) -> list[tuple[str, bool]]:
    """The custom node's inputs: (forward's tensor argument, optional: ``_may_be_none``) each."""
    inputs = []
    for x in node.inputs:
        if x is None:
            raise _symbolic_error(cls, "passes None as an input", "g.op(..., None, ...)")
        if not isinstance(x, _Arg) or x.path:
            raise _symbolic_error(cls, "gives the custom node an input that is not one of forward's tensors", repr(x))
        inputs.append((x.name, optional[x.name]))
    return inputs


def _node_attr(cls, key: str, kind: str, value) -> Attr:
    if kind not in _SCHEMA_TYPES:
        raise _symbolic_error(cls, f"writes attribute {key}_{kind} (a tensor, graph or string-list attribute) on its "
                                   "custom node", f"{key}_{kind}")
    if isinstance(value, _Arg):
        return Attr(key, kind, value.name, value.path)
    if isinstance(value, (list, tuple)) and any(isinstance(v, _Arg) for v in value):
        raise _symbolic_error(cls, f"builds attribute {key}_{kind} as a list of arguments", repr(value))
    return Attr(key, kind, None, (), _as_kind(value, kind))


def _check_paths(cls, attrs: list[Attr], given: Mapping[str, Any]) -> None:
    """Each argument that reaches the node by elements reaches it by all of them (0..n-1; n: the length of the
    call's value in ``given``, where a call gave one)."""
    by_source: dict[str, list[tuple]] = {}
    for a in attrs:
        if a.source is not None:
            by_source.setdefault(a.source, []).append(a.path)
    for source, paths in by_source.items():
        if () in paths:
            continue
        firsts = sorted({p[0] for p in paths})
        if firsts != list(range(len(firsts))):
            raise _symbolic_error(cls, f"passes only some elements of '{source}' to its node",
                                  f"indices {sorted(paths)}")
        value = given.get(source)
        if isinstance(value, (tuple, list)) and len(firsts) < len(value):
            lost = ", ".join(f"{source}[{i}]" for i in range(len(firsts), len(value)))
            raise OpBridgeError(
                f"{symbolic_name(cls)} writes no attribute from {lost}, so no tier can call forward with the value "
                f"the call gave (the node does not carry it). Got {source}={value!r}, attributes "
                f"{[(a.name, f'{a.source}' + ''.join(f'[{i}]' for i in a.path)) for a in attrs if a.source]}. Fix "
                "the symbolic to write it (an attribute from each element), or register with symbolic=False, name= "
                "and function=.")


def _given(params, sample) -> dict[str, Any]:
    """``forward``'s arguments that ``sample`` (an ``apply`` call's args and kwargs) passes, by name."""
    if sample is None:
        return {}
    return dict(inspect.Signature(list(params)).bind_partial(*sample[0], **sample[1]).arguments)


def _known_values(params, sample, tensors: set[str], held: bool = False, constants: Iterable[str] = ()) -> list:
    """Values to run symbolic with: tensors stay graph inputs, other arguments from ``sample`` or their
    defaults; a placeholder where one has neither. ``held``: each value tagged with its argument (:func:`_held`),
    for a symbolic that checks its arguments (``isinstance(output_size, tuple)``) before passing them to g.op."""
    given = _given(params, sample)
    out: list[Any] = []
    for p in params:
        v = given.get(p.name, p.default)
        if p.name in tensors or isinstance(v, torch.Tensor):
            out.append(_tensor_input(p.name, given, constants))
        elif v is _NO_DEFAULT or (v is None and p.name not in given):
            out.append(_Arg(p.name))  # NOTE: an argument symbolic must pass through as it is stays a placeholder
        else:
            out.append(_held(v, _Arg(p.name)) if held else v)
    return out


# -- a node from forward's arguments (no symbolic, or standard ops only) ------------------

_ANNOTATIONS = {torch.Tensor: "tensor", bool: "b", int: "i", float: "f", str: "s"}  # NOTE: bool before int


def _kind_of_value(v) -> str | None:
    """'tensor', an attribute suffix, or None where ``v`` says nothing."""
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return "is" if all(isinstance(x, int) for x in v) else "fs"
    return next((k for t, k in _ANNOTATIONS.items() if isinstance(v, t)), None)


def _kind_of_annotation(ann) -> str | None:
    """The argument kind an annotation states; ``Optional[X]`` (``X | None``) states X's.

    >>> _kind_of_annotation(typing.Optional[torch.Tensor]), _kind_of_annotation("int | None")
    ('tensor', 'i')
    """
    if isinstance(ann, str):
        text = ann.replace(" ", "")
        text = text[len("Optional["):-1] if text.startswith("Optional[") else text.removesuffix("|None")
        ann = {"int": int, "float": float, "str": str, "bool": bool, "Tensor": torch.Tensor,
               "torch.Tensor": torch.Tensor}.get(text, ann)
    inner = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) in (typing.Union, types.UnionType) and len(inner) == 1:
        ann = inner[0]
    if ann in _ANNOTATIONS:
        return _ANNOTATIONS[ann]
    args = getattr(ann, "__args__", None) or ()
    if getattr(ann, "__origin__", None) in (list, tuple, Sequence) and args and args[0] in (int, float):
        return "is" if args[0] is int else "fs"
    return None


def _usage(g: Recorder) -> dict[str, str]:
    """What a run of a standard-op symbolic tells of each argument's kind."""
    kinds: dict[str, str] = {}
    for n in g.nodes:
        for x in n.inputs:
            if isinstance(x, _Arg):
                kinds[x.name] = "tensor"
        for kind, value in n.attrs.values():
            if isinstance(value, _Arg) and not value.path and kind in _SCHEMA_TYPES:
                kinds.setdefault(value.name, kind)
    return kinds


def _plain(cls, base: dict, name: str | None, params, sample, symbolic, read,
           constants: tuple[str, ...] = ()) -> FunctionBridge:
    """The node of a Function without symbolic, or whose symbolic (``read``: its run) writes standard ops (or
    reads ``constants``: tensor arguments read as constants)."""
    inline = name is None and symbolic is not None
    if inline:  # NOTE: written into the graph as symbolic's standard ops; the name never reaches a file
        name = INLINE_DOMAIN + "::" + re.sub(r"\W", "_", class_name(cls))
    if name is None:
        raise OpBridgeError(f"{class_name(cls)}: it has no symbolic, so its ONNX node needs a name. Got name=None. "
                            f"Pass name='ns::{cls.__name__}' to bridge.register.")
    if not inline and read is not None and None in read[1]:
        raise OpBridgeError(
            f"{symbolic_name(cls)} returns None for output(s) {[i for i, o in enumerate(read[1]) if o is None]}, "
            f"which custom node {name} must give: a body of its standard ops has no value of that output's type "
            f"for them. Got name={name!r}. Register it without name= (its ops are written into the graph, those "
            "outputs unwritten, as torch.onnx.export(dynamo=False) wrote them), or with symbolic=False, name= and "
            "function=... giving every output.")
    domain, _, op_type = name.partition("::")
    given = _given(params, sample)
    usage = {} if read is None else _usage(read[0])
    inputs, attrs, containers = [], [], []
    for p in params:
        kind = _plain_kind(cls, p, usage, given, sample)
        if kind == "tensor":
            inputs.append((p.name, _may_be_none(p)))
            continue
        attrs.append(Attr(p.name, kind, p.name))
        value = given.get(p.name, p.default)
        if isinstance(value, (tuple, list)):
            containers.append((p.name, type(value)))
    # NOTE: without symbolic, as many outputs as forward's return annotation names (one without one)
    fb = FunctionBridge(**base, domain=domain, op_type=op_type, inputs=tuple(inputs), attrs=tuple(attrs),
                        num_outputs=_returned_tensors(cls) if read is None else len(read[1]),
                        containers=tuple(containers), inline=inline,
                        constants=constants, unwritten=0 if read is None else read[1].count(None))
    return fb if symbolic is None else dataclasses.replace(fb, body=_builder(fb, symbolic))


def _returned_tensors(cls: type[torch.autograd.Function]) -> int:
    """How many tensors ``forward``'s return annotation names (mmcv's ``-> Tuple[torch.Tensor, torch.Tensor]``: 2);
    1 without one, or for another annotation.

    >>> class Split(torch.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x) -> tuple[torch.Tensor, torch.Tensor]:
    ...         return x, x
    >>> _returned_tensors(Split)
    2
    """
    forward = original_forward(cls)  # NOTE: not cls.forward: described at its first call, its export forward is in
    if forward is None:
        return 1
    try:
        returned = inspect.signature(forward, eval_str=True).return_annotation
    except Exception:  # noqa: BLE001  NOTE: a string annotation naming what its module lacks: no answer
        return 1
    items = typing.get_args(returned) if typing.get_origin(returned) is tuple else ()
    return len(items) if items and all(_kind_of_annotation(a) == "tensor" for a in items) else 1


def _plain_kind(cls, p: inspect.Parameter, usage: Mapping[str, str], given: Mapping[str, Any], sample) -> str:
    """The kind of forward's argument ``p`` (tensor, or an attribute type) on the plain path: from symbolic's use,
    the annotation, the sample's value or the default."""
    kind = (usage.get(p.name) or _kind_of_annotation(p.annotation)
            or _kind_of_value(given.get(p.name)) or _kind_of_value(p.default))
    if kind is None and p.default is None and sample is not None and given.get(p.name) is None:
        kind = "tensor"  # NOTE: None by default and at the call (mmdeploy's GemmOp bias=None): an absent input
    if kind is None and sample is None:
        raise NeedsCall(cls, f"the kind of argument '{p.name}' of forward (tensor, or which attribute type) is "
                             "known neither from symbolic, an annotation nor a default")
    if kind is None:
        raise OpBridgeError(
            f"{class_name(cls)}: the kind of argument '{p.name}' of forward (tensor, or which attribute type) is "
            "known neither from symbolic, an annotation, a default nor a sample. Got "
            f"{p.name}={given.get(p.name, p.default)!r}. Annotate forward ({p.name}: torch.Tensor / int / float / "
            "bool / str / tuple[int, ...]) or pass sample_inputs= to bridge.register.")
    return kind


def _builder(fb: FunctionBridge, symbolic: Callable) -> Callable:
    """A body builder (a Python function of the node's attributes, by name) for a standard-op symbolic: the
    body an export's call recorded for those values (its tensors typed, as the TorchScript exporter typed
    them: a symbolic may branch on ``x.type().scalarType()``), else symbolic run with untyped tensors."""
    def build(**values):
        return fb.bodies.get(values_key(values)) or _body(fb, symbolic, values)
    build.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # NOTE: inspect reads it
        [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY) for a in fb.attrs])
    build.__name__ = fb.op_type
    return build


def _valid_at(nodes: Iterable[onnx.NodeProto], opset: int) -> str | None:
    """Why ``nodes`` (standard ops) are not valid ONNX at ``opset``, or None where they are."""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version, ctx.opset_imports = onnx.IR_VERSION, {"": opset}
    for node in nodes:
        try:
            onnx.checker.check_node(node, ctx)
        except onnx.checker.ValidationError as e:
            return f"{node.op_type} at opset {opset}: {str(e).strip().splitlines()[0]}"
    return None


def standard_graph(cls: type, symbolic: Callable, args: list, opset: int) -> onnx.GraphProto:
    """What ``symbolic`` writes for one call (``args``: a ``torch_compat.GraphInput`` per tensor, the
    call's other values as given) on torch.onnx's own TorchScript graph context at ``opset``."""
    try:
        return onnx.load_from_string(torch_compat.run_symbolic(symbolic, args, opset)).graph
    except torch_compat.SymbolicFailed as e:
        raise symbolic_raised(cls, args, opset, str(e)) from None


def _body(fb: FunctionBridge, symbolic: Callable, values: Mapping[str, Any],
          tensors: Mapping[str, Any] | None = None) -> Written:
    """The node's body for attribute ``values``: the standard ops symbolic writes for those values, run as
    the TorchScript exporter ran it (``SYMBOLIC_OPSET``; a symbolic written for an opset before 13, say
    ``Squeeze(axes_i=...)``, at ``LEGACY_OPSET``: the body is converted to the model's opset as it is
    attached); ``tensors`` (a call's, by name) type its inputs."""
    if fb.constants:
        raise OpBridgeError(
            f"{symbolic_name(fb.cls)} reads tensor argument(s) {list(fb.constants)} as constants, so the ops it "
            f"writes depend on each call's value, which a {fb.qualname} node does not carry. Got a node of it to "
            "give a body to (registered with name=, or in a file written before). Register it without name= and "
            "export the model again (its ops are written with the value the module holds), or pass function=.")
    apply_args = fb.to_apply([None] * len(fb.inputs) + [values[a.name] for a in fb.attrs])
    args = [(_graph_input(p.name, tensors[p.name]) if tensors and tensors.get(p.name) is not None
             else torch_compat.GraphInput(p.name)) if p.name in dict(fb.inputs) else v
            for p, v in zip(fb.params, apply_args)]
    why = []
    for opset in (SYMBOLIC_OPSET, LEGACY_OPSET):
        graph = standard_graph(fb.cls, symbolic, args, opset)
        custom = [f"{n.domain}::{n.op_type}" for n in graph.node if n.domain not in ONNX_DOMAINS]
        if custom:
            raise _symbolic_error(fb.cls, "writes a custom node together with other nodes", str(custom))
        invalid = _valid_at(graph.node, opset)
        if invalid is None:
            return Written(_as_function(fb, graph, opset))
        why.append(invalid)
    unknown = sorted({n.op_type for n in graph.node if not n.domain and not onnx.defs.has(n.op_type)})
    if unknown:  # NOTE: BEVFormer_tensorrt's g.op("GridSampler2DTRT", ...): a TensorRT plugin found by op type
        raise OpBridgeError(
            f"{symbolic_name(fb.cls)} writes {unknown} in ONNX's own domain, which has no such operator (a TensorRT "
            f"plugin's node, found by its op type). Got g.op({unknown[0]!r}, ...) without a domain. Register the "
            f"class with symbolic=False, name='trt::{unknown[0]}' (one node of a custom domain, run from forward in "
            f"every tier), or write the node in a domain: g.op('trt::{unknown[0]}', ...).")
    raise OpBridgeError(f"{symbolic_name(fb.cls)} writes nodes that are valid ONNX at neither opset "
                        f"{SYMBOLIC_OPSET} nor {LEGACY_OPSET}, so no model opset can hold them. Got {'; '.join(why)}. "
                        "Write the node as the ONNX operator documentation gives it for one of those opsets.")


def _as_function(fb: FunctionBridge, graph: onnx.GraphProto, opset: int) -> onnx.FunctionProto:
    """``graph`` (inputs named as ``forward``'s tensors) as the node's FunctionProto."""
    nodes = list(graph.node)
    outputs = []
    for i, out in enumerate(graph.output):
        name = out.name
        if name in {x.name for x in graph.input} or name in outputs:  # NOTE: a function output is its own value
            name = f"{fb.op_type}_out{i}"
            nodes.append(helper.make_node("Identity", [out.name], [name]))
        outputs.append(name)
    # NOTE: an output symbolic returns None for: an empty placeholder, which nothing reads (export refuses a model
    # reading it) and so no file keeps
    for i in range(len(outputs), fb.num_outputs):
        outputs.append(f"{fb.op_type}_unwritten{i}")
        nodes.append(helper.make_node("Constant", [], [outputs[-1]], value=helper.make_tensor(
            outputs[-1], onnx.TensorProto.FLOAT, [0], [])))
    return helper.make_function(fb.domain, fb.op_type, [name for name, _ in fb.inputs], outputs, nodes,
                                [helper.make_opsetid("", opset)])


# -- the torch side: proxy op, export-time swap ------------------------------------------------

def _outputs(fb: FunctionBridge, out, what: str):
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    tensors = all(isinstance(o, torch.Tensor) for o in outs)
    if tensors and len(outs) != fb.num_outputs and (fb.body is not None or fb.symbolic_node):
        raise OpBridgeError(
            f"{symbolic_name(fb.cls)} writes {fb.num_outputs} output(s) where forward returns {len(outs)}, so its "
            "ops cannot stand for the call (torch.onnx.export(dynamo=False) refuses it too: 'produced an incorrect "
            f"number of outputs'). Got {what} returning {len(outs)} tensors. Return one value per output of forward "
            "from the symbolic, or register with symbolic=False, name= and function=.")
    if len(outs) != fb.num_outputs or not tensors:
        told = "" if fb.body is not None or fb.symbolic_node else (
            " (without symbolic, as many as forward's return annotation names: annotate it -> Tuple[torch.Tensor, "
            "torch.Tensor] for two)")
        raise OpBridgeError(f"{class_name(fb.cls)}: {what} returned {[type(o).__name__ for o in outs]}; the node "
                            f"has {fb.num_outputs} tensor output(s){told}. Return tensors only, as many as the node "
                            "has.")
    return outs[0] if fb.num_outputs == 1 else outs


def define_proxy(fb: FunctionBridge) -> Any:
    """The proxy op (``bridge.core.proxy.define_proxy_op``, traced: derivation traces its Python kernel) the
    export records for ``fb``'s node: its kernel rebuilds ``forward``'s arguments and runs the original
    forward; its fake is ``fb.fake`` (called with ``apply``'s arguments) or that forward on fake tensors.
    Redefined only when the signature changes."""
    fake = fb.fake

    def kernel(*node_args):
        return _outputs(fb, fb.call_forward(fb.to_apply(node_args)), "forward")

    def traced_fake(*node_args):
        if fake is not None:
            return _outputs(fb, fake(*fb.to_apply(node_args)), "fake=")
        try:
            with torch_compat.data_sizes_kept_inside():
                out = fb.call_forward(fb.to_apply(node_args))
        except OpBridgeError:
            raise
        except Exception as e:  # noqa: BLE001  the forward's own error, named once
            line = (str(e).strip().splitlines() or [""])[0][:200]
            raise OpBridgeError(
                f"{class_name(fb.cls)}: its forward does not run on fake tensors, which export needs for the node's "
                f"output shapes. Got {type(e).__name__}: {line}. Pass fake= to bridge.register({fb.cls.__name__}, "
                "fake=...) (a function of apply's arguments returning empty outputs), or register the Functions its "
                "forward calls.") from None
        return _outputs(fb, out, "forward")

    # NOTE: one proxy op per signature (a digest of it in the name): a call typed otherwise (a tuple where the first
    # said int) gets its own op, never a redefinition of one another record or an earlier export still names
    digest = hashlib.sha256(fb.schema.encode()).hexdigest()[:8]
    return define_proxy_op(proxy_name("fn", fb.domain, fb.op_type, digest), fb.schema, kernel, traced_fake,
                           traced=True)


def export_forward(at_call: Callable[[Mapping[str, Any]], tuple[FunctionBridge, Any, Callable]],
                   fb: FunctionBridge) -> Callable:
    """What ``cls.forward`` is during export: the call recorded as one node. ``at_call(values)`` gives, for
    ``forward``'s arguments of this call, the node typed for them, its proxy op and the argument check."""
    def forward(*args, **kwargs):
        values = fb.bind(args, kwargs)
        node, proxy, check = at_call(values)
        node_args = node.to_node(values)
        check(tuple(node_args), {})
        return proxy(*node_args)
    return forward


def record_body(fb: FunctionBridge, values: Mapping[str, Any]) -> None:
    """For a standard-op symbolic's node: the body for the call ``values`` (forward's arguments), built with
    the call's tensor types and kept for the node's attribute values (the builder gives it); one call whose
    types give the same values another body is refused, as one node cannot hold two."""
    symbolic = symbolic_of(fb.cls)
    if fb.body is None or symbolic is None or fb.constants:  # NOTE: constants: written after the export
        return
    attrs = {a.name: a.of(values) for a in fb.attrs}
    body = _body(fb, symbolic, attrs, {name: values[name] for name, _ in fb.inputs})
    key = values_key({name: _as_held(v) for name, v in attrs.items()})  # NOTE: what the builder reads off the node
    seen = fb.bodies.setdefault(key, body)
    if seen.to_function_proto().SerializeToString() != body.to_function_proto().SerializeToString():
        raise OpBridgeError(
            f"{symbolic_name(fb.cls)} writes other ops for inputs of other types with the same attribute "
            f"values {attrs}, and one {fb.qualname} node holds one body for them. Got two calls whose tensors "
            "differ in dtype or rank. Call it with one dtype per set of values, or register with name= and "
            "function= (a body of your own).")


def _as_held(v: Any) -> Any:
    """An attribute value as an ONNX node holds it (floats as float32; past its range +-inf).

    NOTE: no tensor made for the rounding: one made while torch.export traces is traced into the graph.

    >>> _as_held([0.1, 1e39, -1e39, 3])
    [0.10000000149011612, inf, -inf, 3]
    """
    if isinstance(v, (list, tuple)):
        return [_as_held(x) for x in v]
    if not isinstance(v, float):
        return v
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _graph_input(name: str, value: Any) -> torch_compat.GraphInput:
    """A tensor of the call (real, fake or traced) as a graph input: its dtype, its sizes (a dynamic one None)."""
    return torch_compat.GraphInput(name, *_typed(value))


def _typed(value: Any) -> tuple[torch.dtype, tuple[int | None, ...]]:
    """A tensor's dtype and sizes (a dynamic one None)."""
    return value.dtype, tuple(d if isinstance(d, int) else None for d in value.shape)


def constant_body(fb: FunctionBridge, node_values: Mapping[str, Any], opset: int) -> onnx.GraphProto:
    """The ops ``fb``'s symbolic writes for one node whose constants the export knows (``FunctionBridge.
    constants``), as ``torch.onnx.export(dynamo=False)`` wrote them where the value was a constant of the module:
    ``node_values`` holds, by ``forward``'s argument name, each attribute's value, each constant's tensor and, for
    every other tensor input, its ``torch_compat.GraphInput`` (the graph's inputs, named as those arguments)."""
    symbolic = symbolic_of(fb.cls)
    assert symbolic is not None and fb.constants  # NOTE: asked of a standard-op symbolic reading constants only
    apply_args = fb.to_apply([node_values.get(name) for name, _ in fb.inputs]
                             + [node_values[a.name] for a in fb.attrs])
    args = [torch_compat.ConstantInput(p.name, v.dtype, tuple(v.shape), v) if p.name in fb.constants else v
            for p, v in zip(fb.params, apply_args)]
    graph = standard_graph(fb.cls, symbolic, args, opset)
    invalid = _valid_at([n for n in graph.node if n.domain in ONNX_DOMAINS], opset)
    if invalid is not None:
        raise OpBridgeError(f"{symbolic_name(fb.cls)} writes nodes the model's opset {opset} cannot hold. Got "
                            f"{invalid}. Export at the opset the symbolic was written for.")
    return graph


def check_written(fb: FunctionBridge, values: Mapping[str, Any], opset: int = SYMBOLIC_OPSET) -> None:
    """Raise OpBridgeError unless the custom node ``fb`` writes for the call ``values`` is the node the
    symbolic writes for that call on torch.onnx's own TorchScript graph context (what
    ``torch.onnx.export(dynamo=False)`` writes): its domain, type, inputs and attributes (names, types,
    values)."""
    symbolic = symbolic_of(fb.cls)
    if symbolic is None or not fb.symbolic_node:
        return
    graph = standard_graph(fb.cls, symbolic, _call_args(fb, values), opset)
    theirs = [n for n in graph.node if n.domain not in ONNX_DOMAINS]
    if len(graph.node) != 1 or len(theirs) != 1:
        raise _symbolic_error(fb.cls, "writes other nodes for this call than for the arguments it was read with",
                              str([f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.node]))
    node = theirs[0]
    _check_attributes(fb, values, {a.name: helper.get_attribute_value(a) for a in node.attribute})
    inputs = [name if values[name] is not None else "" for name, _ in fb.inputs]
    while inputs and not inputs[-1]:
        inputs.pop()
    if (node.domain, node.op_type, list(node.input)) != (fb.domain, fb.op_type, inputs):
        raise _symbolic_error(fb.cls, "writes another node for this call than for the arguments it was read with",
                              f"{node.domain}::{node.op_type}{list(node.input)}, read as "
                              f"{fb.domain}::{fb.op_type}{inputs}")


def _call_args(fb: FunctionBridge, values: Mapping[str, Any]) -> list:
    """symbolic's arguments for the call ``values``: a graph input per tensor, the call's other values as given."""
    return [_graph_input(p.name, values[p.name]) if isinstance(values[p.name], torch.Tensor) else values[p.name]
            for p in fb.params]


def _written_outputs(fb: FunctionBridge, values: Mapping[str, Any]) -> int:
    """How many outputs symbolic gives its custom node for the call ``values`` (``fb.num_outputs`` where ``fb``'s
    node is not symbolic's custom node)."""
    symbolic = symbolic_of(fb.cls)
    if symbolic is None or not fb.symbolic_node:
        return fb.num_outputs
    return len(standard_graph(fb.cls, symbolic, _call_args(fb, values), SYMBOLIC_OPSET).output)


def _check_attributes(fb: FunctionBridge, values: Mapping[str, Any], written: Mapping[str, Any]) -> None:
    """Raise unless the attributes ``fb`` writes for the call ``values`` are ``written`` (the TorchScript
    exporter's, by name)."""
    ours = {a.name: a.of(values) for a in fb.attrs}
    for name in sorted(set(ours) | set(written)):
        mine, its = ours.get(name), written.get(name)
        its = its.decode() if isinstance(its, bytes) else its
        if _same_attribute(mine, its):
            continue
        source = next((a.source for a in fb.attrs if a.name == name), None)
        where = (f"the argument it was read from gives {mine!r}: it computes the attribute from the call's "
                 "values, so the kernel tiers could not call forward with them again" if source is not None else
                 f"the node read first holds {mine!r}: it computes the attribute from something other than "
                 "forward's arguments (an input's type), and one node type holds one value")
        raise OpBridgeError(
            f"{symbolic_name(fb.cls)} writes attribute '{name}' = {its!r} for this call, where {where}. Got "
            f"the call { {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)} }. Pass the "
            "argument to g.op as it is (or an element of it), or register with symbolic=False, name='ns::op'.")


def _same_attribute(mine: Any, its: Any) -> bool:
    """Whether the value opbridge writes is the one the TorchScript exporter writes (an INT for a bool,
    floats as float32 as ONNX holds them)."""
    if isinstance(mine, (list, tuple)) or isinstance(its, (list, tuple)):
        return (isinstance(mine, (list, tuple)) and isinstance(its, (list, tuple)) and len(mine) == len(its)
                and all(_same_attribute(a, b) for a, b in zip(mine, its)))
    if isinstance(its, float) and isinstance(mine, (int, float)):
        return value_key(_as_held(float(mine))) == value_key(its)
    if isinstance(mine, bool):
        mine = int(mine)
    return value_key(mine) == value_key(its)


def function_classes() -> list[type]:
    """Every ``torch.autograd.Function`` subclass loaded in this process that has a ``symbolic`` (its own, or
    the one registered for ``prim::PythonOp``: :func:`symbolic_of`)."""
    def below(cls: type) -> Iterator[type]:
        sub: type
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)
    return sorted({cls for cls in below(torch.autograd.Function) if symbolic_of(cls) is not None},
                  key=class_name)


@contextlib.contextmanager
def classes_made() -> Iterator[list[type]]:
    """While active, each ``torch.autograd.Function`` subclass created is appended to the list it yields: a class
    statement run inside the function that calls it (mmdeploy's rewrites), a new class per call, which
    :func:`function_classes` did not find before.

    Example:
        >>> with classes_made() as made:
        ...     class Local(torch.autograd.Function):
        ...         pass
        >>> [c.__name__ for c in made], "__init_subclass__" in torch.autograd.Function.__dict__
        (['Local'], False)
    """
    made: list[type] = []
    # NOTE: an outer export's recorder (nested exports) is called too, and put back on exit
    before = torch.autograd.Function.__dict__.get("__init_subclass__")

    def record(cls: type[torch.autograd.Function], **kwargs: Any) -> None:
        made.append(cls)
        if before is None:
            super(torch.autograd.Function, cls).__init_subclass__(**kwargs)
        else:
            before.__func__(cls, **kwargs)

    torch.autograd.Function.__init_subclass__ = classmethod(record)  # type: ignore[assignment,method-assign]
    try:
        yield made
    finally:
        if before is None:
            del torch.autograd.Function.__init_subclass__
        else:
            torch.autograd.Function.__init_subclass__ = before  # type: ignore[method-assign]


@contextlib.contextmanager
def swap_forwards(routes: Mapping[type, Callable], watch: Callable[..., Callable | None] | None = None,
                  watched: Iterable[type] = ()):
    """While active, ``Cls.forward`` of each class in ``routes`` is its export forward, called with ``apply``'s
    arguments (no ctx: the class gets a ``setup_context`` that does nothing, so ``apply`` binds keywords to
    ``forward``'s parameters by the signature the export forward carries, the original's); each class in
    ``watched`` calls ``watch(cls, args, kwargs)`` (``apply``'s arguments) when reached, whose answer (an export
    forward, or None for the original) serves that call. Restored on exit."""
    saved: list[tuple[type, str, Any]] = []
    watched = tuple(watched)
    # NOTE: before any swap: a subclass inheriting its parent's forward (BEVFormer_tensorrt's _QKV2(_QKV)) would
    # read the parent's export forward once the parent is swapped
    originals = {cls: (original_forward(cls), setup_style(cls)) for cls in (*routes, *watched)}

    def swap(cls: type, attr: str, value: Any) -> None:
        if attr == "forward":
            _SWAPPED[cls] = originals[cls]
        saved.append((cls, attr, cls.__dict__.get(attr, _NO_DEFAULT)))
        # NOTE: torch.cond's branches are traced by dynamo, which cannot follow a forward that reads a symbolic
        setattr(cls, attr, staticmethod(torch_compat.opaque_to_dynamo(value) if attr == "forward" else value))

    def watcher(cls: type, original: Callable, ctx: bool) -> Callable:
        def forward(*args, **kwargs):
            route = watch(cls, args[ctx:], kwargs) if watch is not None else None
            return original(*args, **kwargs) if route is None else route(*args[ctx:], **kwargs)
        return forward

    try:
        for cls, route in routes.items():
            own, style = originals[cls]
            assert own is not None  # NOTE: routes are of described Functions, which have a forward
            params = list(inspect.signature(own).parameters.values())[0 if style else 1:]
            route.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # NOTE: apply binds by it
            swap(cls, "forward", route)
            swap(cls, "setup_context", lambda ctx, inputs, output: None)
        for cls in watched:
            original, style = originals[cls]
            if cls not in routes and original is not None:
                swap(cls, "forward", watcher(cls, original, not style))
        yield
    finally:
        for cls, attr, old in reversed(saved):
            _SWAPPED.pop(cls, None)
            if old is _NO_DEFAULT:
                delattr(cls, attr)
            else:
                setattr(cls, attr, old)
