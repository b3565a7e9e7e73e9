"""The one place a model gets its function bodies: for each custom node, where its body comes from.

Per custom node (the main graph's, those in If/Loop/Scan bodies, and those inside attached bodies)
of a registered op, the first of:

1. the model's own function for the node (``model.functions``; kept, converted to the model's opset
   when it is at another one), unless ``replace=True``;
2. the op's written body (``OpSpec.function``, a :class:`~bridge.core.spec.Written`);
3. the body its builder gives for the node's attribute values (a :class:`~bridge.core.spec.BodyBuilder`);
4. a body derived for the node's site (``exporters.derive``): torch.onnx's own translation of the op
   where it has one, else the op's PyTorch implementation, per exact site (dtypes, dims, attribute
   values: -0.0 is not 0.0).

Every body gets the op's check guards (where its attributes allow), is converted to the model's
ONNX opset and has list constants written as tensors. Nodes of one op whose bodies differ get one
function each, told apart by ONNX function ``overload``; equal bodies (the same bytes) are one
function. Export, the function and native tiers, inlining and ``opbridge attach`` call
:func:`attach_functions`; nothing else puts a body into a model. A model whose nodes all have their
bodies is left as it is: nothing is traced.

Example:
    >>> import torch, bridge, custom_ops
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.ops.opbridge.crop(x, [1, 0, 3, 2]) * 2
    >>> bare = bridge.export(M(), (torch.randn(1, 4, 4),), functions=False, opset_version=17)
    >>> attach_functions(bare), [(f.name, onnx_opset(f)) for f in bare.functions]
    (['opbridge::crop'], [('crop', 17)])
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

import onnx
from onnx import helper

from bridge.core.checks import guarded_body, unreadable
from bridge.core.errors import OpBridgeError
from bridge.core.graphs import custom_nodes, model_value_types
from bridge.core.registry import REGISTRY, Registry, validate_body
from bridge.core.spec import BodyBuilder, OpSpec, Written, bind_attribute_defaults, node_attributes, values_key
from exporters.bodies.opsets import convert_function, onnx_opset, portable_constants
from exporters.derive.cache import CACHE
from exporters.derive.derivation import derive
from exporters.derive.sites import NoPortableBody, Untraceable, site_of

# NOTE: the overload prefix of each kind of body that can differ between nodes of one op
_OVERLOAD = {"built": "built_", "derived": "derived_"}


def guarded_copy(proto: onnx.FunctionProto, spec: OpSpec) -> onnx.FunctionProto:
    """A copy of ``proto`` (``spec``'s body, written, built or derived) with the op's check guards
    (``bridge.core.checks``) where the body keeps every attribute they read as a function attribute.

    NOTE: a check reading an attribute baked into this body (its value was known when the body was
    made; the function tier checks attribute values before a session opens) gets no guard; every
    other check keeps its own.
    """
    copy = onnx.FunctionProto()
    copy.CopyFrom(proto)  # NOTE: guarding edits the body it is given; ``proto`` may be a cached one
    if spec.checks is not None:
        names = {*copy.attribute, *(a.name for a in copy.attribute_proto)}  # without and with defaults
        kept = {p.name: p.onnx_attribute_type for p in spec.attributes if p.name in names}
        return guarded_body(copy, spec.checks, kept, skip=list(unreadable(copy, spec.checks, kept)))
    return copy


def built_body(spec: OpSpec, values: dict) -> onnx.FunctionProto:
    """The body ``spec``'s builder gives for the attribute ``values``, checked against the op."""
    assert isinstance(spec.function, BodyBuilder)
    function = spec.function.function(values)
    if not hasattr(function, "to_function_proto"):
        raise OpBridgeError(f"{spec.qualname}: its body builder returned {type(function).__name__} for {values}. Got "
                            "no onnxscript function. Return an @onnxscript.script function named like the op.")
    validate_body(spec, function)
    return function.to_function_proto()


def written_body(spec: OpSpec, opset: int | None = None) -> onnx.FunctionProto:
    """``spec``'s written body as it goes into a model: with the op's guards, at ``opset`` (None:
    its own), list constants as tensors.

    Example:
        >>> import bridge, custom_ops
        >>> spec = bridge.REGISTRY.get("opbridge::crop")
        >>> body = written_body(spec, 17)
        >>> onnx_opset(body), len(body.node) > len(spec.function.to_function_proto().node)  # guards added
        (17, True)
    """
    assert isinstance(spec.function, Written)
    # NOTE: the op's defaults bind the body's attribute references a node omits (not the inner ops' own)
    return _finished(bind_attribute_defaults(spec, spec.function.to_function_proto()), spec, opset)


def _finished(proto: onnx.FunctionProto, spec: OpSpec, opset: int | None) -> onnx.FunctionProto:
    proto = guarded_copy(proto, spec)
    return portable_constants(convert_function(proto, opset) if opset is not None else proto)


def _content(function: onnx.FunctionProto) -> bytes:
    """What tells two bodies of one op apart: their bytes, overload aside."""
    if not function.overload:
        return function.SerializeToString()
    copy = onnx.FunctionProto()
    copy.CopyFrom(function)
    copy.ClearField("overload")
    return copy.SerializeToString()


def _set_overload(proto: onnx.FunctionProto | onnx.NodeProto, overload: str) -> None:
    """``proto.overload = overload``; the plain name leaves the field unset (the same bytes as never set)."""
    if overload:
        proto.overload = overload
    else:
        proto.ClearField("overload")


class _Resolver:
    """One model's bodies, resolved node by node (see the module's docstring)."""

    def __init__(self, model: onnx.ModelProto, registry: Registry, replace: bool, ops: Collection | None):
        self.model, self.registry, self.replace, self.ops = model, registry, replace, ops
        self.opset = onnx_opset(model)
        self.types: dict[str, onnx.TypeProto] | None = None
        self.made: dict[tuple, tuple[str, onnx.FunctionProto] | None] = {}  # per (op, values or site) key
        self.resolved: set[tuple[str, str]] = set()  # ops given bodies here (replace: theirs are dropped)

    def wanted(self, node: onnx.NodeProto, local: set) -> OpSpec | None:
        """The op of ``node`` when it needs a body from here."""
        key = (node.domain, node.op_type)
        if key in self.resolved or (self.ops is not None and key not in self.ops):
            return None
        if (node.domain, node.op_type, node.overload) in local and not self.replace:
            return None
        return self.registry.find(node.domain, node.op_type)

    def body(self, spec: OpSpec, node: onnx.NodeProto) -> tuple[str, onnx.FunctionProto] | None:
        """(kind, body) of ``node`` at the model's opset, or None when its op gives none here."""
        if isinstance(spec.function, Written):
            key: tuple = (spec.qualname, "written")
        elif isinstance(spec.function, BodyBuilder):
            values = node_attributes(spec, node)
            key = (spec.qualname, "built", values_key({n: values[n] for n in spec.function.reads}))
        else:
            key = (spec.qualname, "derived", id(node))
        if key not in self.made:
            self.made[key] = self._make(spec, node)
        return self.made[key]

    def _make(self, spec: OpSpec, node: onnx.NodeProto) -> tuple[str, onnx.FunctionProto] | None:
        if isinstance(spec.function, Written):
            return "written", written_body(spec, self.opset)
        if isinstance(spec.function, BodyBuilder):
            return "built", _finished(built_body(spec, node_attributes(spec, node)), spec, self.opset)
        if self.opset is None:
            return None
        try:
            site = site_of(spec, node, self._types())
            derived = derive(spec, site, self.opset, self.registry)
        except NoPortableBody:
            return None
        except Untraceable as e:
            CACHE.fail(spec.qualname, str(e))
            return None
        return "derived", _finished(derived.proto, spec, self.opset)

    def _types(self) -> dict[str, onnx.TypeProto]:
        if self.types is None:
            types = model_value_types(self.model)
            wanted = {n for node in custom_nodes(self.model) for n in node.input if n}
            if not wanted <= types.keys():
                try:
                    types = {**model_value_types(onnx.shape_inference.infer_shapes(self.model)), **types}
                except Exception:  # noqa: BLE001  what inference cannot type is reported per node
                    pass
            self.types = types
        return self.types

    def round(self) -> list[str]:
        """Give bodies to the nodes that need them now; return the ops given one."""
        local = {(f.domain, f.name, f.overload) for f in self.model.functions}
        uses: dict[tuple[str, str], list[tuple[onnx.NodeProto, str, onnx.FunctionProto]]] = {}
        specs: dict[tuple[str, str], OpSpec] = {}
        for node in list(custom_nodes(self.model, functions=True)):
            spec = self.wanted(node, local)
            made = None if spec is None else self.body(spec, node)
            if spec is not None and made is not None:
                uses.setdefault((node.domain, node.op_type), []).append((node, *made))
                specs[(node.domain, node.op_type)] = spec
        for key, pairs in uses.items():
            self._attach(key, pairs)
            self.resolved.add(key)
        return [specs[key].qualname for key in uses]

    def _attach(self, key: tuple[str, str], pairs: list[tuple[onnx.NodeProto, str, onnx.FunctionProto]]) -> None:
        """One op's bodies into the model, each node pointing at its own: a body equal to a function
        the model has is that function; ``replace`` drops the op's earlier functions first."""
        if self.replace:
            kept = [f for f in self.model.functions if (f.domain, f.name) != key]
            del self.model.functions[:]
            self.model.functions.extend(kept)
        overloads = {_content(f): f.overload for f in self.model.functions if (f.domain, f.name) == key}
        new = {_content(proto): (kind, proto) for _, kind, proto in pairs}
        new = {data: made for data, made in new.items() if data not in overloads}
        for data, (kind, proto) in new.items():
            # NOTE: one body keeps the plain name; several are told apart as ONNX function overloads
            plain = len(new) == 1 and "" not in overloads.values()
            _set_overload(proto, "" if plain else _OVERLOAD.get(kind, "") + hashlib.sha1(data).hexdigest()[:10])
            overloads[data] = proto.overload
            self.model.functions.append(proto)
            self._import_domains(proto)
        for node, _, proto in pairs:
            _set_overload(node, overloads[_content(proto)])
        if any(overloads.values()):
            self.model.ir_version = max(self.model.ir_version, 10)  # NOTE: function overloads are IR 10

    def _import_domains(self, proto: onnx.FunctionProto) -> None:
        have = {o.domain for o in self.model.opset_import}
        for imp in proto.opset_import:
            if imp.domain not in have:
                self.model.opset_import.append(helper.make_opsetid(imp.domain, imp.version))
                have.add(imp.domain)

    def convert_stale(self) -> list[str]:
        """Convert the model's functions at another ONNX opset than the model's (a file passed
        through ``onnx.version_converter``) to the model's."""
        changed = []
        for function in self.model.functions:
            source = onnx_opset(function)
            if self.opset is not None and source is not None and source != self.opset:
                function.CopyFrom(portable_constants(convert_function(function, self.opset)))
                spec = self.registry.find(function.domain, function.name)
                changed.append(spec.qualname if spec is not None else f"{function.domain}::{function.name}")
        return changed


def attach_functions(model: onnx.ModelProto, registry: Registry | None = None, *, replace: bool = False,
                     ops: Collection[tuple[str, str]] | None = None) -> list[str]:
    """Give every custom node of ``model`` of a registered op the body it lacks, at the model's ONNX
    opset (see the module's docstring for where each comes from); return the ops given bodies or
    whose bodies were converted. ``replace=True`` replaces the model's own functions of registered
    ops with what the registry gives (restores bodies a tool broke); ``ops`` limits the work to
    those ``(domain, op type)``. Edits ``model`` in place; the caller saves it.

    Example:
        >>> import onnx, onnx.version_converter, torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.identity_conv(x, 3) + 1
        >>> old = onnx.version_converter.convert_version(bridge.export(M(), (torch.randn(1, 3, 4, 4),)), 18)
        >>> len(old.functions), attach_functions(old), [tuple(o.version for o in f.opset_import)
        ...                                              for f in old.functions]
        (0, ['opbridge::identity_conv'], [(18,)])
    """
    resolver = _Resolver(model, REGISTRY if registry is None else registry, replace, ops)
    changed = resolver.convert_stale()
    while True:  # NOTE: an attached body may call further custom ops
        added = resolver.round()
        if not added:
            return list(dict.fromkeys(changed))
        changed += added
