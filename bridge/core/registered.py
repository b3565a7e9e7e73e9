"""Ops whose ONNX node is written by a symbolic registered with ``torch.onnx.register_custom_op_symbolic``
(the ONNX custom-op tutorial's ``mynamespace::custom_group_norm`` -> ``mydomain::testgroupnorm``, mmdeploy's
tutorial's ``torchvision::deform_conv2d`` -> ``custom::deform_conv2d``): the TorchScript exporter honoured it,
``torch.onnx.export(dynamo=True)`` ignores it.

One origin, :class:`RegisteredSymbolic` (the op and its symbolic), bridged as the ``torch.autograd.Function``
(``bridge.core.functions``) that stands for one call of the op (:func:`function_class`): its ``forward`` calls
the op's implementation, its ``symbolic`` is the registered one, given the call's non-tensor arguments as the
TorchScript exporter gave them to an op's symbolic (graph constants, ``torch_compat.torchscript_argument``).
So the node is read, typed per call, checked against what ``torch.onnx.export(dynamo=False)`` writes for the
call, inlined where it writes standard ops only, and run in every tier exactly as a Function's. During
``bridge.export`` :func:`op_calls` sends each call of the op to that Function's export forward.

An argument that reaches no node input or attribute (the tutorial's ``eps``, written ``epsilon_f=0.``) is
called, in every tier, with the value the op's first call in an export gave it; a call with another value is
refused (``FunctionBridge.to_node``).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from bridge.core.basics import torch_compat
from bridge.core.basics.errors import OpBridgeError
from bridge.core.functions import SYMBOLIC_OPSET, original_forward
from bridge.core.spec import SampleInput

# NOTE: namespaces whose symbolics torch.onnx ships itself (its own translations stand for those ops)
_TORCH_OWN = frozenset({"aten", "prim", "prims", "onnx", "quantized", "_caffe2", "higher_order", "_operator"})
# NOTE: packages whose registered symbolics stand for ops torch.onnx translates itself (torchvision registers
# nms, roi_align, roi_pool when imported; torch.onnx's torch_lib translates the first two): those are left to
# torch.onnx where its translation takes the op's arguments (torch_compat.torchlib_translation)
_SHIPPED = ("torch.", "torchvision.")
_ANNOTATIONS = {"Tensor": torch.Tensor, "int": int, "SymInt": int, "float": float, "bool": bool, "str": str,
                "int[]": tuple[int, ...], "SymInt[]": tuple[int, ...], "float[]": tuple[float, ...]}
_NO_DEFAULT = inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class RegisteredSymbolic:
    """An op (its default overload) and the symbolic registered for it with
    ``torch.onnx.register_custom_op_symbolic``."""

    op: torch_compat.OpOverload
    symbolic: Callable

    @property
    def qualname(self) -> str:
        return self.op.name()

    @property
    def symbolic_name(self) -> str:
        return f"{getattr(self.symbolic, '__module__', '?')}.{getattr(self.symbolic, '__qualname__', self.symbolic)}"


def registered_origin(op: Any) -> RegisteredSymbolic | None:
    """The registered symbolic of ``op`` (an OpOverload, its default) where a user registered one for it (not one
    torch.onnx ships for its own namespaces, nor one torchvision registers for its ops), else None."""
    if not isinstance(op, torch_compat.OpOverload) or op.namespace in _TORCH_OWN:
        return None
    if torch_compat.overload_name(op) != "default":
        return None
    symbolic = torch_compat.registered_symbolic(op.name(), SYMBOLIC_OPSET)
    if symbolic is None or (_shipped(symbolic) and torch_compat.torchlib_translation(op.name()) is not None):
        return None
    return RegisteredSymbolic(op, symbolic)


def unused_aten_symbolic(op: Any) -> Callable | None:
    """The symbolic a user registered for ATen op ``op`` (``register_custom_op_symbolic('::grid_sampler', ...)``,
    as mmdeploy's symbolic rewrites do), which the TorchScript exporter wrote and opbridge does not use (the file
    holds torch.onnx's own translation); None for any other op or symbolic."""
    if not isinstance(op, torch_compat.OpOverload) or op.namespace != "aten":
        return None
    symbolic = torch_compat.registered_symbolic(op.name(), SYMBOLIC_OPSET)
    return None if symbolic is None or _shipped(symbolic) else symbolic


def _shipped(symbolic: Callable) -> bool:
    """Whether ``symbolic`` is one torch or torchvision registers itself (``_SHIPPED``), not a user's."""
    return str(getattr(symbolic, "__module__", "")).startswith(_SHIPPED)


_CLASSES: dict[tuple[torch_compat.OpOverload, Callable], type] = {}
_ORIGINS: dict[type, RegisteredSymbolic] = {}


def origin_of(cls: Any) -> RegisteredSymbolic | None:
    """The origin a class made by :func:`function_class` stands for, else None."""
    return _ORIGINS.get(cls)


def _parameter(origin: RegisteredSymbolic, arg: Any) -> inspect.Parameter:
    kind = str(arg.type)
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if base not in _ANNOTATIONS:
        raise OpBridgeError(f"{origin.qualname}: argument '{arg.name}' has type {arg.type}, which a node its "
                            f"registered symbolic ({origin.symbolic_name}) writes cannot carry. Got {arg.type}. Bridge "
                            "the op without its symbolic (bridge.register(..., symbolic=False)).")
    default = arg.default_value if arg.has_default_value() else (None if optional else _NO_DEFAULT)
    # NOTE: keyword-only: every argument is passed by name (opbridge binds the op's call itself), so the defaults
    # a first call gives (call_defaults) may follow arguments without one
    return inspect.Parameter(arg.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=_ANNOTATIONS[base])


def _implementation(op: torch_compat.OpOverload) -> Callable:
    """What the Function's forward calls: a ``torch.library.custom_op``'s own function (derivation traces it for
    the function tier), else the op."""
    opdef = torch_compat.custom_op_def(op.name())
    fn = torch_compat.python_impl(opdef) if opdef is not None else None
    return fn if fn is not None else op


def function_class(origin: RegisteredSymbolic) -> type:
    """The ``torch.autograd.Function`` standing for one call of ``origin``'s op (one class per op and symbolic, for
    the process): ``forward`` takes the op's arguments by name and calls the op's implementation; ``symbolic`` is
    the registered one, its non-tensor arguments given as the TorchScript exporter gave them (graph constants).

    Example:
        >>> import torch
        >>> lib = torch.library.Library("regdoc", "DEF")
        >>> _ = lib.define("scale(Tensor x, float s) -> Tensor")
        >>> lib.impl("scale", lambda x, s: x * s, "CompositeExplicitAutograd")
        >>> sym = lambda g, x, s: g.op("doc::Scale", x, s_f=s)  # noqa: E731
        >>> cls = function_class(RegisteredSymbolic(torch.ops.regdoc.scale.default, sym))
        >>> cls.forward(None, torch.ones(2), 3.0).tolist(), str(inspect.signature(cls.forward))
        ([3.0, 3.0], '(ctx, *, x: torch.Tensor, s: float)')
    """
    key = (origin.op, origin.symbolic)
    if key in _CLASSES:
        return _CLASSES[key]
    _parameters(origin)  # NOTE: an argument no node can carry is refused before a class exists
    impl = caller(origin.op, _implementation(origin.op))

    def forward(ctx, *args, **kwargs):
        return impl(*args, **kwargs)

    def symbolic(g, *args):
        return origin.symbolic(g, *(torch_compat.torchscript_argument(g, a) for a in args))

    ns, _, name = origin.qualname.partition("::")
    cls = type(name, (torch.autograd.Function,), {"forward": staticmethod(forward), "symbolic": staticmethod(symbolic),
                                                  "__module__": f"torch.ops.{ns}", "__qualname__": name})
    _CLASSES[key], _ORIGINS[cls] = cls, origin
    call_defaults(cls, {})
    return cls


def caller(op: torch_compat.OpOverload, fn: Callable) -> Callable:
    """``fn`` (the op, or its implementation) called with the op's arguments in schema order (or by name):
    its keyword-only ones by name. The fake of a :func:`function_class`'s node is ``caller(op, op)``: the op's
    own fake on fake tensors."""
    schema = torch_compat.schema_of(op)
    names = [a.name for a in schema.arguments]
    kwonly = {a.name for a in schema.arguments if a.kwarg_only}

    def call(*args, **kwargs):
        values = dict(zip(names, args), **kwargs)
        return fn(*(values[n] for n in names if n not in kwonly), **{n: values[n] for n in names if n in kwonly})
    return call


def needs_call(cls: type) -> list[str]:
    """The non-tensor arguments of ``cls``'s op (a :func:`function_class`) without a default in its schema: a call
    gives them one (:func:`call_defaults`), which an argument no node carries is then called with."""
    return [p.name for p in _parameters(_ORIGINS[cls])
            if p.default is _NO_DEFAULT and p.annotation is not torch.Tensor]


def call_defaults(cls: type, values: Mapping[str, Any]) -> None:
    """The op's arguments as ``cls.forward`` takes them: each one :func:`needs_call` names that ``values`` (a call's
    arguments by name) has, with that value as its default; the others as the schema says (``values`` empty: the
    schema's alone, as a new registration starts)."""
    forward: Any = original_forward(cls)
    wanted = set(needs_call(cls)) & set(values)
    forward.__signature__ = inspect.Signature(
        [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD),
         *(p.replace(default=values[p.name]) if p.name in wanted else p for p in _parameters(_ORIGINS[cls]))])


def _parameters(origin: RegisteredSymbolic) -> list[inspect.Parameter]:
    return [_parameter(origin, a) for a in torch_compat.schema_of(origin.op).arguments]


def bind(origin: RegisteredSymbolic, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The op's arguments of a call by name, defaults filled (as the op's schema reads them)."""
    schema = torch_compat.schema_of(origin.op)
    params = [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY if a.kwarg_only
                                else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=a.default_value if a.has_default_value() else _NO_DEFAULT)
              for a in schema.arguments]
    try:
        bound = inspect.Signature(params).bind(*args, **kwargs)
    except TypeError as e:
        raise OpBridgeError(f"{origin.qualname}: {e}. Got {len(args)} arguments and keywords {sorted(kwargs)}. Call "
                            "the op as its schema takes it.") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def keyword_samples(origin: RegisteredSymbolic, sample_inputs: Callable) -> Callable:
    """``sample_inputs`` (calls of the op) as calls by name, as the Function standing for the op takes them."""
    def samples(dtype):
        return [SampleInput((), bind(origin, tuple(s.args), s.kwargs), s.name) for s in sample_inputs(dtype)]
    return samples


_WARNED: set[str] = set()


def warn_used(origin: RegisteredSymbolic) -> None:
    """Say once per op and process that the registered symbolic writes the op's node, which torch.onnx's
    default exporter would ignore."""
    if origin.qualname in _WARNED:
        return
    _WARNED.add(origin.qualname)
    warnings.warn(f"opbridge: {origin.qualname} is written as the node its registered symbolic "
                  f"{origin.symbolic_name} writes (as torch.onnx.export(dynamo=False) wrote it; "
                  "torch.onnx.export(dynamo=True) ignores torch.onnx.register_custom_op_symbolic). Got a symbolic "
                  f"registered for {origin.qualname}. Pass symbolic=False to bridge.register({origin.qualname!r}) "
                  "to write the op's own node instead.", stacklevel=4)


class _OpCalls(TorchFunctionMode):
    def __init__(self, classes: dict, routes: dict, reach: Callable[[torch_compat.OpOverload], type | None],
                 before: Callable[[type, dict], None]):
        super().__init__()
        self.classes, self.routes, self.reach, self.before = classes, routes, reach, before

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = func
        if isinstance(op, torch_compat.OpOverloadPacket):  # NOTE: torch.ops.ns.op(...): its one overload
            op = getattr(op, "default", None) if op.overloads() == ["default"] else None
        if not isinstance(op, torch_compat.OpOverload) or op.namespace in _TORCH_OWN:
            return func(*args, **kwargs)
        if op not in self.classes:
            self.classes[op] = self.reach(op)
        cls = self.classes[op]
        if cls is None:
            return func(*args, **kwargs)
        values = bind(_ORIGINS[cls], tuple(args), kwargs)
        self.before(cls, values)
        return self.routes[cls](**values)


def op_calls(classes: dict[torch_compat.OpOverload, type], routes: dict[type, Callable],
             reach: Callable[[torch_compat.OpOverload], type | None], before: Callable[[type, dict], None]):
    """While active (around ``torch.export``), each call of an op in ``classes`` (op -> its :func:`function_class`)
    goes to ``routes[cls]`` (the Function's export forward), called with the op's arguments by name after
    ``before(cls, values)``; an op met for the first time is looked up with ``reach(op)`` (its class, registered
    and routed, or None: the op runs as it is)."""
    return _OpCalls(dict(classes), routes, reach, before)
