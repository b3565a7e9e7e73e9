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
bodies is left as it is: nothing is traced, nothing converted.

The resolver works on an onnx-ir model (:func:`attach_functions_ir`): bodies go into
``model.functions`` as ``ir.Function``, each node's ``overload`` names its own. The bodies are made
as protos (onnxscript, the check guards, ``onnx.version_converter``) and converted once each;
:func:`attach_functions` converts a ``ModelProto`` once and writes it back once.

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
from collections.abc import Collection, Mapping
from typing import NamedTuple

import onnx
import onnx_ir as ir

from bridge.core.checks import guarded_body, unreadable
from bridge.core.domains import is_onnx
from bridge.core.errors import OpBridgeError
from bridge.core.graphs import ProtoMemo, custom_nodes, ir_custom_nodes, model_value_types
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
    # NOTE: one op (its spec is frozen: a new registration is a new spec) at one opset has one
    # written body: it is made once, not per model a session opens (guards and opset conversion are costly)
    key = f"{id(spec)}/{opset}".encode()
    made = _WRITTEN.get(key)
    if made is None or made[0] is not spec:
        # NOTE: the op's defaults bind the body's attribute references a node omits (not the inner ops' own)
        made = (spec, _finished(bind_attribute_defaults(spec, spec.function.to_function_proto()), spec, opset))
        _WRITTEN.put(key, made)
    body = onnx.FunctionProto()
    body.CopyFrom(made[1])
    return body


_WRITTEN = ProtoMemo(size=64)  # id(spec)/opset -> (spec, its written body); the spec kept, so its id stays its own


def _finished(proto: onnx.FunctionProto, spec: OpSpec, opset: int | None) -> onnx.FunctionProto:
    proto = guarded_copy(proto, spec)
    return portable_constants(convert_function(proto, opset) if opset is not None else proto)


def _standard_opset(imports: Mapping[str, int]) -> int | None:
    """The standard-ONNX opset among onnx-ir ``opset_imports`` (:func:`onnx_opset` of a proto)."""
    versions = [v for d, v in imports.items() if is_onnx(d)]
    return max(versions) if versions else None


class _Body(NamedTuple):
    """A body made for some nodes: its kind (``written``, ``built``, ``derived``), the function, and
    its bytes as made, with no overload (what tells two bodies of one op apart; serialized once)."""

    kind: str
    function: ir.Function
    data: bytes


def _content(function: ir.Function) -> bytes:
    """``function``'s bytes as onnx-ir writes them, with no overload: a body made here compares
    with a function the model already has."""
    proto = ir.serde.serialize_function(function)
    proto.ClearField("overload")
    return proto.SerializeToString()


def _needs_body(key: tuple[str, str, str], local: Collection, registry: Registry, replace: bool,
                ops: Collection | None) -> OpSpec | None:
    """The op of a node ``(domain, op type, overload)`` when that node needs a body from the resolver."""
    if (ops is not None and key[:2] not in ops) or (key in local and not replace):
        return None
    return registry.find(key[0], key[1])


def _complete(model: onnx.ModelProto, registry: Registry, replace: bool, ops: Collection | None) -> bool:
    """Whether the resolver has nothing to do on ``model``: every function at the model's opset and
    every custom node of a registered op with its body (read from the protos: nothing converted)."""
    opset = onnx_opset(model)
    if opset is not None and any(onnx_opset(f) not in (None, opset) for f in model.functions):
        return False
    local = {(f.domain, f.name, f.overload) for f in model.functions}
    return not any(_needs_body((n.domain, n.op_type, n.overload), local, registry, replace, ops)
                   for n in custom_nodes(model, functions=True))


class _Resolver:
    """One onnx-ir model's bodies, resolved node by node (see the module's docstring)."""

    def __init__(self, model: ir.Model, registry: Registry, replace: bool, ops: Collection | None):
        self.model, self.registry, self.replace, self.ops = model, registry, replace, ops
        self.opset = _standard_opset(model.opset_imports)
        self.inferred: dict[str, onnx.TypeProto] | None = None
        self.made: dict[tuple, _Body | None] = {}  # per (op, values or site) key
        self.resolved: set[tuple[str, str]] = set()  # ops given bodies here (replace: theirs are dropped)

    def body(self, spec: OpSpec, node: ir.Node) -> _Body | None:
        """The body of ``node`` at the model's opset, or None when its op gives none here."""
        if isinstance(spec.function, Written):
            key: tuple = (spec.qualname, "written")
        elif isinstance(spec.function, BodyBuilder):
            values = node_attributes(spec, ir.serde.serialize_node(node))
            key = (spec.qualname, "built", values_key({n: values[n] for n in spec.function.reads}))
        else:
            key = (spec.qualname, "derived", id(node))
        if key not in self.made:
            made = self._make(spec, node)
            self.made[key] = None if made is None else _Body(
                made[0], ir.serde.deserialize_function(made[1]), made[1].SerializeToString())
        return self.made[key]

    def _make(self, spec: OpSpec, node: ir.Node) -> tuple[str, onnx.FunctionProto] | None:
        if isinstance(spec.function, Written):
            return "written", written_body(spec, self.opset)
        proto = ir.serde.serialize_node(node)  # NOTE: what a built or derived body is made for, as ONNX has it
        if isinstance(spec.function, BodyBuilder):
            return "built", _finished(built_body(spec, node_attributes(spec, proto)), spec, self.opset)
        if self.opset is None:
            return None
        try:
            site = site_of(spec, proto, self._types(node))
            derived = derive(spec, site, self.opset, self.registry)
        except NoPortableBody:
            return None
        except Untraceable as e:
            CACHE.fail(spec.qualname, str(e))
            return None
        return "derived", _finished(derived.proto, spec, self.opset)

    def _types(self, node: ir.Node) -> dict[str, onnx.TypeProto]:
        """The types of ``node``'s inputs: as the model records them, else as ONNX shape inference gives them."""
        inputs = [v for v in node.inputs if v is not None and v.name]
        types = {str(v.name): ir.serde.serialize_value(v).type for v in inputs if v.type is not None}
        if len(types) == len(inputs):
            return types
        if self.inferred is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(ir.serde.serialize_model(self.model))
                self.inferred = model_value_types(inferred)
            except Exception:  # noqa: BLE001  what inference cannot type is reported per node
                self.inferred = {}
        return {**self.inferred, **types}

    def round(self) -> list[str]:
        """Give bodies to the nodes that need them now; return the ops given one."""
        local = set(self.model.functions)
        uses: dict[tuple[str, str], list[tuple[ir.Node, _Body]]] = {}
        specs: dict[tuple[str, str], OpSpec] = {}
        for node in ir_custom_nodes(self.model):
            op = (node.domain, node.op_type)
            spec = None if op in self.resolved else _needs_body(
                (*op, node.overload), local, self.registry, self.replace, self.ops)
            made = None if spec is None else self.body(spec, node)
            if spec is not None and made is not None:
                uses.setdefault(op, []).append((node, made))
                specs[op] = spec
        for op, pairs in uses.items():
            self._attach(op, pairs)
            self.resolved.add(op)
        return [specs[op].qualname for op in uses]

    def _attach(self, op: tuple[str, str], pairs: list[tuple[ir.Node, _Body]]) -> None:
        """One op's bodies into the model, each node pointing at its own: a body equal to a function
        the model has is that function; ``replace`` drops the op's earlier functions first."""
        functions = self.model.functions
        if self.replace:
            for identifier in [i for i in functions if i[:2] == op]:
                del functions[identifier]
        overloads = {_content(f): f.overload for f in functions.values() if (f.domain, f.name) == op}
        # NOTE: made bodies compare by the bytes they were made with; against the op's functions
        # already there, by what onnx-ir writes of each (both sides written alike)
        bodies = dict.fromkeys(body for _, body in pairs)  # NOTE: nodes of one key share one body
        contents = {body: _content(body.function) if overloads else body.data for body in bodies}
        new = {data: body for body, data in contents.items() if data not in overloads}
        for data, body in new.items():
            # NOTE: one body keeps the plain name; several are told apart as ONNX function overloads
            plain = len(new) == 1 and "" not in overloads.values()
            digest = hashlib.sha1(body.data).hexdigest()[:10]
            body.function.overload = "" if plain else _OVERLOAD.get(body.kind, "") + digest
            overloads[data] = body.function.overload
            functions[body.function.identifier()] = body.function
            for domain, version in body.function.opset_imports.items():
                self.model.opset_imports.setdefault(domain, version)
        for node, body in pairs:
            node.overload = overloads[contents[body]]
        if any(overloads.values()):
            self.model.ir_version = max(self.model.ir_version, 10)  # NOTE: function overloads are IR 10

    def convert_stale(self) -> list[str]:
        """Convert the model's functions at another ONNX opset than the model's (a file passed
        through ``onnx.version_converter``) to the model's."""
        changed = []
        for identifier, function in list(self.model.functions.items()):
            source = _standard_opset(function.opset_imports)
            if self.opset is not None and source is not None and source != self.opset:
                proto = portable_constants(convert_function(ir.serde.serialize_function(function), self.opset))
                self.model.functions[identifier] = ir.serde.deserialize_function(proto)
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

    The work is :func:`attach_functions_ir`'s, on the model converted to onnx-ir once and written
    back once. A model with nothing to do (every body there, at its opset) is neither converted nor
    touched: opening a session on a complete file costs one walk over its protos.

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
    registry = REGISTRY if registry is None else registry
    if _complete(model, registry, replace, ops):
        return []
    converted = ir.serde.deserialize_model(model)
    changed = attach_functions_ir(converted, registry, replace=replace, ops=ops)
    if changed:
        written = ir.serde.serialize_model(converted)
        # NOTE: the resolver adds no value to the graph: its value_info stays the file's own (onnx-ir
        # writes one per initializer too, which files from onnx.version_converter lack)
        del written.graph.value_info[:]
        written.graph.value_info.extend(model.graph.value_info)
        model.CopyFrom(written)
    return changed


def attach_functions_ir(model: ir.Model, registry: Registry | None = None, *, replace: bool = False,
                        ops: Collection[tuple[str, str]] | None = None) -> list[str]:
    """:func:`attach_functions` on an onnx-ir model (``torch.onnx``'s ``ONNXProgram.model``): the
    bodies go into ``model.functions``, each node's ``overload`` names its own.

    Example:
        >>> import onnx_ir as ir, torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.crop(x, [1, 0, 3, 2]) * 2
        >>> bare = ir.serde.deserialize_model(bridge.export(M(), (torch.randn(1, 4, 4),), functions=False))
        >>> attach_functions_ir(bare), list(bare.functions)
        (['opbridge::crop'], [('opbridge', 'crop', '')])
    """
    resolver = _Resolver(model, REGISTRY if registry is None else registry, replace, ops)
    changed = resolver.convert_stale()
    while added := resolver.round():  # NOTE: an attached body may call further custom ops
        changed += added
    return list(dict.fromkeys(changed))
