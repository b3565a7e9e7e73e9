"""OpSpec: the frozen record of one custom op, derived from its torch schema.

Everything ONNX needs (domain, version, typed attributes, the OpSchema, the
onnxscript translation) is computed from the torch ``FunctionSchema`` here, so an
op author writes the signature once.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import torch
from onnx import defs
from onnxscript import values

from bridge.core.basics import torch_compat
from bridge.core.basics.errors import OpBridgeError
from bridge.core.origins import Declared, Origin
from bridge.core.schema import build_onnx_schema

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NO_DEFAULT = inspect.Parameter.empty

AttrType = defs.OpSchema.AttrType

# NOTE: torch scalar kinds -> (ONNX attribute type, python annotation for onnxscript).
# bool has no ONNX attribute type; it travels as INT 0/1 (as ONNX's own ops do).
_SCALAR_ATTRS: dict[str, tuple[AttrType, type]] = {
    "int": (AttrType.INT, int),
    "SymInt": (AttrType.INT, int),
    "float": (AttrType.FLOAT, float),
    "bool": (AttrType.INT, bool),
    "str": (AttrType.STRING, str),
}
_LIST_ATTRS: dict[str, tuple[AttrType, Any]] = {
    "int": (AttrType.INTS, Sequence[int]),
    "SymInt": (AttrType.INTS, Sequence[int]),
    "float": (AttrType.FLOATS, Sequence[float]),
    "bool": (AttrType.INTS, Sequence[int]),
}


@dataclasses.dataclass(frozen=True)
class Param:
    """One argument of the op: a tensor input or a typed attribute."""

    name: str
    is_tensor: bool
    optional: bool = False
    attr_type: AttrType | None = None
    annotation: Any = None
    is_bool: bool = False
    default: Any = NO_DEFAULT
    mutated: bool = False
    kwarg_only: bool = False  # keyword-only in the torch schema (``def f(x, *, k)``): called by keyword

    @property
    def onnx_attribute_type(self) -> int:
        """The ``AttributeProto`` type of an attribute parameter (INT, FLOATS, ...)."""
        assert self.attr_type is not None, f"{self.name} is an input, not an attribute"
        return getattr(onnx.AttributeProto, self.attr_type.name)  # type: ignore[attr-defined]  # NOTE: stub lacks .name

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    @property
    def absent(self) -> Any:
        """The value the op takes when a node omits this attribute: None for an optional attribute (its
        torch default, if any, is written explicitly at export), else its default (NO_DEFAULT: required)."""
        return None if self.optional else self.default

    @property
    def onnx_default(self) -> onnx.AttributeProto | None:
        """The attribute's ONNX default (OpSchema, function bodies, omitted attributes filled in): the torch
        default, none for a required attribute or an optional one (absent means None there)."""
        absent = self.absent
        return None if absent is None or absent is NO_DEFAULT else self.onnx_attribute(absent)

    def onnx_attribute(self, value: Any) -> onnx.AttributeProto:
        """``value`` as this attribute of a node, its type stated (an empty list has none to infer)."""
        return onnx.helper.make_attribute(self.name, self.to_onnx_value(value), attr_type=self.onnx_attribute_type)

    def to_onnx_value(self, value: Any) -> Any:
        """The attribute value as ONNX stores it (bools become 0/1)."""
        if self.is_bool:
            return [int(v) for v in value] if isinstance(value, (list, tuple)) else int(value)
        if isinstance(value, tuple):
            return list(value)
        return value

    def from_onnx_value(self, value: Any) -> Any:
        """The attribute value as the torch op takes it."""
        if self.is_bool:
            return [bool(v) for v in value] if isinstance(value, (list, tuple)) else bool(value)
        if isinstance(value, bytes):
            return value.decode()
        return value


def parse_params(qualname: str, schema: torch.FunctionSchema) -> tuple[tuple[Param, ...], int]:
    """Params and output count from a torch schema; unsupported types raise OpBridgeError."""
    params = tuple(_param(qualname, arg) for arg in schema.arguments)
    for ret in schema.returns:
        if ret.type.kind() != "TensorType":
            raise OpBridgeError(
                f"{qualname}: return type {ret.type} has no ONNX form. Got {ret.type}. "
                "Return a Tensor or a tuple of Tensors."
            )
    return params, len(schema.returns)


def _param(qualname: str, arg: Any) -> Param:
    kind, kwarg_only = arg.type.kind(), bool(arg.kwarg_only)
    default = arg.default_value if arg.has_default_value() else NO_DEFAULT
    if kind == "TensorType":
        return Param(arg.name, True, mutated=torch_compat.writes(arg), kwarg_only=kwarg_only)
    optional = kind == "OptionalType"
    elem = str(arg.type.getElementType() if kind in ("OptionalType", "ListType") else arg.type)
    if optional and elem == "Tensor":
        return Param(arg.name, True, optional=True, default=default, kwarg_only=kwarg_only)
    table = _LIST_ATTRS if kind == "ListType" else _SCALAR_ATTRS
    if elem not in table:
        raise OpBridgeError(
            f"{qualname}: argument '{arg.name}' has type {arg.type}, which has no ONNX form. "
            f"Got {arg.type}. Use Tensor, Tensor?, int, float, bool, str (each optional too) or a list of "
            "int/float/bool."
        )
    if optional and default is NO_DEFAULT:
        # NOTE: int?/float?/... : an optional ONNX attribute without an ONNX default, omitted exactly
        # when the call passes None (``Param.absent``); a torch default other than None is written
        # explicitly at export (C++-inferred schemas give no default: None)
        default = None
    attr_type, ann = table[elem]
    return Param(arg.name, False, optional=optional, attr_type=attr_type, annotation=ann, is_bool=elem == "bool",
                 default=default, kwarg_only=kwarg_only)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """Frozen record of one registered op. Build it with :func:`bridge.op` or :func:`bridge.register`;
    change it through the op object's ``register_*`` methods (the registry swaps in a new record).

    Derived views (``onnx_schema``, ``onnx_op``) are computed once, on first use.
    """

    qualname: str
    custom_op: Any  # torch's CustomOpDef, or the OpOverload of an op defined elsewhere (bridge.register)
    params: tuple[Param, ...]
    num_outputs: int
    domain: str
    version: int = 1
    function: Body = None  # the written body, or its builder per attribute values (None: none written)
    reference: Callable | None = None
    sample_inputs: Callable | None = None
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    doc: str = ""
    custom_translation: Callable | None = None
    onnx_name: str = ""  # the ONNX op_type; defaults to the torch name
    torchbind: tuple[str, ...] = ()  # "ns::Class.method" calls this op stands for (state -> attributes)
    native_source: str | None = None  # the op's C++ kernel file, if not ort_kernels/cpu/<name>.cc
    origin: Origin = Declared()  # the form the op was given in (bridge.core.origins)
    checks: Any = None  # bridge.core.checks.Checks: the input checks every tier applies

    def __post_init__(self):  # NOTE: function= as given (onnxscript, a builder function) becomes a typed Body
        object.__setattr__(self, "function", as_body(self.qualname, self.function, self.attributes))

    # -- identity -------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        return self.qualname.split("::")[0]

    @property
    def name(self) -> str:
        """The ONNX op_type (the torch op name unless ``onnx_name`` says otherwise)."""
        return self.onnx_name or self.qualname.split("::")[1]

    @property
    def overload(self) -> torch_compat.OpOverload:
        """The torch op the exported graph calls (a proxy's, for ``origin.proxied`` ops)."""
        return torch_compat.overload_of(self.custom_op) or self.custom_op

    @property
    def tensors(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_tensor)

    @property
    def attributes(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not p.is_tensor)

    @property
    def mutated(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.mutated)

    # -- pieces (read live from torch, so a later register_fake counts) ---------------
    @property
    def has_fake(self) -> bool:
        return has_fake_kernel(self.custom_op)

    @property
    def has_autograd(self) -> bool:
        backward = self.origin.has_backward  # NOTE: a torch.autograd.Function's own
        if backward is not None:
            return backward
        backward = torch_compat.custom_op_backward(self.custom_op)  # NOTE: a torch.library.custom_op's
        if backward is not None:
            return backward
        return any(torch_compat.has_kernel(self.overload.name(), key)
                   for key in ("Autograd", "AutogradCPU", "CompositeImplicitAutograd"))

    # -- derived ONNX views ------------------------------------------------------------
    @functools.cached_property
    def onnx_schema(self) -> defs.OpSchema:
        return build_onnx_schema(self)

    @functools.cached_property
    def onnx_op(self) -> values.Op:
        """``onnxscript.values.Op`` that emits this op's node in its custom domain."""
        return values.Op(values.Opset(self.domain, self.version), self.name, self.onnx_schema)

    def bind(self, *args, **kwargs) -> dict[str, Any]:
        """Arguments by name, defaults filled, as the torch schema reads them."""
        sig = python_signature(self)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def call_args(self, values: Sequence) -> tuple[tuple, dict[str, Any]]:
        """(positional, keyword) arguments calling the op with ``values``, one per parameter in schema
        order: keyword-only parameters go by keyword.

        Example:
            >>> spec = OpSpec("d::f", None, (Param("x", True), Param("k", False, kwarg_only=True)), 1, "d")
            >>> spec.call_args(["X", 3])
            (('X',), {'k': 3})
        """
        args = tuple(v for p, v in zip(self.params, values) if not p.kwarg_only)
        return args, {p.name: v for p, v in zip(self.params, values) if p.kwarg_only}


def has_fake_kernel(op: Any) -> bool:
    """Whether torch can run ``op`` (a CustomOpDef or an OpOverload) on fake tensors: a fake kernel
    from Python (register_fake), a Meta kernel from C++, or a composite kernel that traces through."""
    if torch_compat.is_custom_op_def(op):  # torch.library.custom_op
        return torch_compat.custom_op_fake(op) is not None
    name = op.name()
    return torch_compat.fake_impl(name) is not None or any(
        torch_compat.has_kernel(name, key) for key in ("Meta", "CompositeImplicitAutograd"))


def python_signature(spec: OpSpec, annotate: bool = False) -> inspect.Signature:
    """A Python signature mirroring the torch schema (attributes annotated if asked)."""
    params = []
    defaulted = True  # NOTE: a default only where every later parameter has one (Python's rule)
    for p in reversed(spec.params):
        if not p.kwarg_only:  # NOTE: keyword-only parameters follow the others and need no default
            defaulted = defaulted and p.has_default
        ann = p.annotation if (annotate and not p.is_tensor) else inspect.Parameter.empty
        kind = inspect.Parameter.KEYWORD_ONLY if p.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(inspect.Parameter(p.name, kind, default=p.default if defaulted or p.kwarg_only else NO_DEFAULT,
                                        annotation=ann))
    return inspect.Signature(params[::-1])


def validate_qualname(qualname: str) -> tuple[str, str]:
    """Split ``ns::name``; raise OpBridgeError naming the fix when malformed."""
    parts = qualname.split("::") if isinstance(qualname, str) else []
    if len(parts) != 2 or not all(_NAME.match(x) for x in parts):
        raise OpBridgeError(
            f"op name must be 'namespace::name' with identifier parts. Got {qualname!r}. "
            "Use e.g. 'bev::bev_pool_v2'."
        )
    return parts[0], parts[1]


def function_signature(function: Any) -> tuple[str, str, list[str], list[str], int]:
    """(domain, name, inputs, attributes, num_outputs) of an onnxscript function body."""
    proto: onnx.FunctionProto = function.to_function_proto()
    attrs = list(proto.attribute) + [a.name for a in proto.attribute_proto]
    return proto.domain, proto.name, list(proto.input), attrs, len(proto.output)


@dataclasses.dataclass(frozen=True)
class SampleInput:
    """One call of an op for tests and parity tables: ``op(*args, **kwargs)``. One tensor as ``args`` is the one
    argument (as torch.onnx.export and OpInfo's SampleInput take it); a list is the arguments.

    Example:
        >>> import torch
        >>> [tuple(a.shape) for a in SampleInput(torch.ones(3)).args], SampleInput([torch.ones(2), 2]).args[1]
        ([(3,)], 2)
    """

    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.args, torch.Tensor):
            object.__setattr__(self, "args", (self.args,))
        elif isinstance(self.args, list):
            object.__setattr__(self, "args", tuple(self.args))
        elif not isinstance(self.args, tuple):
            raise OpBridgeError(f"SampleInput takes the op's arguments as a tuple. Got {type(self.args).__name__} "
                                f"{self.args!r:.80}. Pass SampleInput((x, ...)) (one tensor alone also serves).")
        if not isinstance(self.kwargs, dict):
            raise OpBridgeError(f"SampleInput takes keyword arguments as a dict. Got {type(self.kwargs).__name__}. "
                                "Pass kwargs={'name': value}.")


def node_attributes(spec: OpSpec, node: onnx.NodeProto) -> dict[str, Any]:
    """The attribute values of ``node`` (a node of ``spec``'s op) as the torch op takes them; an omitted
    attribute gets the op's default (None for an optional attribute: ``Param.absent``). Raises
    OpBridgeError for an omitted attribute without a default or one that refers to a function's
    attribute (a value known only at the call).

    Example:
        >>> from onnx import helper
        >>> p = Param("k", False, attr_type=AttrType.INT, annotation=int, default=2)
        >>> spec = OpSpec("d::f", None, (Param("x", True), p), 1, "d")
        >>> node_attributes(spec, helper.make_node("f", ["x"], ["y"], domain="d"))
        {'k': 2}
    """
    given = {a.name: a for a in node.attribute}
    values = {}
    for p in spec.attributes:
        attr = given.get(p.name)
        if attr is not None and attr.ref_attr_name:
            raise OpBridgeError(f"{spec.qualname}: attribute '{p.name}' of node {node.name!r} refers to the "
                                f"enclosing function's attribute @{attr.ref_attr_name}. Got a value known only at the "
                                "call. Call the op with constant attributes.")
        if attr is not None:
            values[p.name] = p.from_onnx_value(onnx.helper.get_attribute_value(attr))
        elif p.absent is not NO_DEFAULT:
            values[p.name] = p.absent
        else:
            raise OpBridgeError(f"{spec.qualname}: node {node.name!r} lacks its attribute '{p.name}'. Got "
                                f"{sorted(given)}. Give the node every attribute the op declares.")
    return values


def value_key(value: Any) -> Any:
    """A hashable key that tells apart every attribute value a body may bake in: ``-0.0`` from ``0.0``,
    ``True`` from ``1``, and gives every NaN one key (floats by ``repr``), lists as tuples.

    Example:
        >>> value_key(-0.0) == value_key(0.0), value_key(float("nan")) == value_key(float("nan"))
        (False, True)
    """
    if isinstance(value, (list, tuple)):
        return tuple(value_key(v) for v in value)
    return type(value).__name__, repr(value) if isinstance(value, float) else value


def values_key(values: dict[str, Any] | Sequence[tuple[str, Any]]) -> tuple:
    """:func:`value_key` of each ``(name, value)``, sorted by name."""
    pairs = values.items() if isinstance(values, dict) else values
    return tuple(sorted((n, value_key(v)) for n, v in pairs))


@dataclasses.dataclass(frozen=True)
class Written:
    """A body written once for every node of the op: an onnxscript function (or any object whose
    ``to_function_proto()`` gives the op's FunctionProto), or the FunctionProto itself. The op's check
    guards are added where the body goes into a model (``exporters.resolve``), not here.

    Example:
        >>> from onnx import helper
        >>> proto = helper.make_function("d", "f", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
        ...                              [helper.make_opsetid("", 20)])
        >>> import types
        >>> Written(types.SimpleNamespace(to_function_proto=lambda: proto)).to_function_proto().name
        'f'
    """

    source: Any

    def to_function_proto(self) -> onnx.FunctionProto:
        """The body as written (a fresh copy each call)."""
        if isinstance(self.source, onnx.FunctionProto):
            return copy.deepcopy(self.source)
        return self.source.to_function_proto()


def explicit_attributes(spec: OpSpec, node: onnx.NodeProto | ir.Node) -> bool:
    """Write into ``node`` (a node of ``spec``'s op, a proto or onnx-ir's) each attribute it omits that has an
    ONNX default (:attr:`Param.onnx_default`, the op's torch default), so every tier and every function body reads
    the op's value, not a default of its own; returns whether an attribute was added. The node's
    attributes then come in the op's order (:attr:`OpSpec.attributes`; others after them, as they were).

    Example:
        >>> from onnx import helper
        >>> p = Param("slope", False, attr_type=AttrType.FLOAT, annotation=float, default=0.1)
        >>> spec = OpSpec("d::f", None, (Param("x", True), p), 1, "d")
        >>> node = helper.make_node("f", ["x"], ["y"], domain="d")
        >>> explicit_attributes(spec, node), round(node.attribute[0].f, 6), explicit_attributes(spec, node)
        (True, 0.1, False)
        >>> k = Param("k", False, attr_type=AttrType.INT, annotation=int)
        >>> node = helper.make_node("g", ["x"], ["y"], domain="d", k=2, slope=0.5)  # written sorted by name
        >>> explicit_attributes(OpSpec("d::g", None, (Param("x", True), p, k), 1, "d"), node)
        False
        >>> [a.name for a in node.attribute]
        ['slope', 'k']
    """
    if isinstance(node, ir.Node):  # NOTE: one implementation: the work is done on a proto of the names alone
        names = onnx.NodeProto(attribute=[onnx.AttributeProto(name=n) for n in node.attributes])
        changed = explicit_attributes(spec, names)
        for a in names.attribute:  # NOTE: each taken out and put back: the node's attributes in the proto's order
            node.attributes[a.name] = (node.attributes.pop(a.name) if a.name in node.attributes
                                       else ir.serde.deserialize_attribute(a))
        return changed
    given = {a.name for a in node.attribute}
    filled = [d for d in (p.onnx_default for p in spec.attributes if p.name not in given) if d is not None]
    node.attribute.extend(filled)
    # NOTE: a translation's node takes its attribute order from an OpSchema, whose C++ map loses the op's order
    rank = {p.name: i for i, p in enumerate(spec.attributes)}
    node.attribute.sort(key=lambda a: rank.get(a.name, len(rank)))  # NOTE: stable: others keep their order
    return bool(filled)


def bind_attribute_defaults(spec: OpSpec, proto: onnx.FunctionProto) -> onnx.FunctionProto:
    """``proto`` (a body of ``spec``'s op, edited in place) with the op's ONNX defaults as its attributes'
    defaults: a call that omits one binds the body's references (``LeakyRelu(alpha=@slope)``) to the op's
    value, not to the inner op's own default (LeakyRelu's 0.01)."""
    defaults = {p.name: p.onnx_default for p in spec.attributes if p.onnx_default is not None}
    bound = [name for name in proto.attribute if name in defaults]
    keep = [name for name in proto.attribute if name not in defaults]
    del proto.attribute[:]
    proto.attribute.extend(keep)
    proto.attribute_proto.extend(defaults[name] for name in bound)
    return proto


class BodyBuilder:
    """A written function body that depends on attribute values: ``build`` is a plain Python function whose
    parameters are (some of) the op's attributes, called with a node's attribute values (as the torch op
    takes them) and returning the onnxscript function for those values. Export calls it once per
    distinct set of values at the model's nodes; each result becomes an ONNX function overload.

    Example:
        >>> p = Param("k", False, attr_type=AttrType.INT, annotation=int)
        >>> builder = BodyBuilder("d::f", lambda k: f"body for k={k}", (p,))
        >>> builder.reads, builder.function({"k": 3}), builder.note
        (('k',), 'body for k=3', 'built per attribute values (k)')
        >>> BodyBuilder("d::f", lambda n: None, (p,))
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: d::f: a body builder takes the op's attributes by name. ...
    """

    def __init__(self, qualname: str, build: Callable, attributes: Sequence[Param]):
        names = [p.name for p in attributes]
        try:
            params = inspect.signature(build).parameters.values()
        except (TypeError, ValueError):
            raise OpBridgeError(f"{qualname}: function= is neither an onnxscript function nor a Python function "
                                f"of the op's attributes. Got {build!r}. Pass one of those.") from None
        for q in params:
            if q.name not in names or q.kind in (q.VAR_POSITIONAL, q.VAR_KEYWORD, q.POSITIONAL_ONLY):
                raise OpBridgeError(f"{qualname}: a body builder takes the op's attributes by name. Got parameter "
                                    f"{q.name!r}. Name its parameters after attributes of the op: {names}.")
        self.qualname, self.build = qualname, build
        self.reads = tuple(q.name for q in params)
        self.note = f"built per attribute values ({', '.join(self.reads) or 'none read'})"
        self._built: dict[tuple, Any] = {}

    def function(self, values: dict[str, Any]) -> Any:
        """The onnxscript function for the attribute ``values`` (built once per distinct value set)."""
        read = {n: values[n] for n in self.reads}
        key = values_key(read)  # NOTE: -0.0 and 0.0 are two bodies, every NaN one
        if key not in self._built:
            try:
                self._built[key] = self.build(**read)
            except OpBridgeError:
                raise
            except Exception as e:  # noqa: BLE001  the user's builder: its error, named
                raise OpBridgeError(f"{self.qualname}: the body builder failed for {read}. Got "
                                    f"{type(e).__name__}: {e}. Fix the builder for these values.") from e
        return self._built[key]

    def __repr__(self) -> str:
        return f"<body builder of {self.qualname}: {getattr(self.build, '__name__', self.build)!r}>"


def as_body(qualname: str, function: Any, attributes: Sequence[Param]) -> Body:
    """``function=`` as an op keeps it: an onnxscript function (anything giving a FunctionProto) as
    :class:`Written`, a plain Python function of (some of) the op's ``attributes`` as a
    :class:`BodyBuilder`; None and typed bodies as they are."""
    if function is None or isinstance(function, (Written, BodyBuilder)):
        return function
    if isinstance(function, (values.OnnxFunction, values.TracedOnnxFunction)) or hasattr(function, "to_function_proto"):
        return Written(function)
    if not callable(function):
        raise OpBridgeError(f"{qualname}: function= takes an onnxscript function or a Python function of the op's "
                            f"attributes. Got {type(function).__name__}. Pass one of those.")
    return BodyBuilder(qualname, function, attributes)


# NOTE: an op's written body: one for every node, built per attribute values, or none (derived or
# translated where it goes into a model: exporters.resolve decides)
Body = Written | BodyBuilder | None
