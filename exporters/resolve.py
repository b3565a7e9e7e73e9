"""The one place a model gets its function bodies: for each custom node, where its body comes from.

Per custom node (the main graph's, those in If/Loop/Scan bodies, and those inside attached bodies)
of a registered op, the first of:

1. the model's own function for the node (``model.functions``; kept, converted to the model's opset
   when it is at another one), unless ``replace=True``;
2. the body the op's kind (:func:`exporters.kinds.body_kind`) makes for the node: its written body,
   the body its builder gives for the node's attribute values, or a body derived for the node's site
   (torch.onnx's own translation of the op where it has one, else the op's PyTorch implementation,
   per exact site: dtypes, dims, attribute values; -0.0 is not 0.0).

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
import re
from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

import onnx
import onnx_ir as ir

from bridge.core.basics.domains import standard_opset
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import custom_nodes, ir_custom_nodes, model_value_types, unproduced_outputs, walk
from bridge.core.registry import REGISTRY, Registry
from bridge.core.spec import OpSpec
from exporters.bodies.opsets import convert_function, onnx_opset, portable_constants
from exporters.kinds import body_kind

# NOTE: a built or derived body's doc_string names the attribute values it was made for (their
# digest): tools drop overloads and keep one body per op (onnxslim 0.1.98), doc strings they keep
_BODY_FOR = "opbridge body for attributes "
_BODY_FOR_KEY = re.compile(re.escape(_BODY_FOR) + r"([0-9a-f]{12})")


def _plain(value):
    """An attribute value as a key or a message holds it: a tensor or graph as its bytes."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.SerializeToString() if hasattr(value, "SerializeToString") else value


def attributes_key(node: onnx.NodeProto, generic: Collection[str] = ()) -> str | None:
    """The digest of ``node``'s attribute values as ONNX holds them (names sorted, values read with
    ``onnx.helper.get_attribute_value``: -0.0 is not 0.0), but those in ``generic`` (the attributes a
    body takes as function attributes: it serves any value of those): what a built or derived body
    is made for. None when an attribute refers to a function attribute (known only at the call).

    Example:
        >>> from onnx import helper
        >>> key = lambda k: attributes_key(helper.make_node("f", ["x"], ["y"], domain="d", k=k))
        >>> key(2.0) == key(2.0), key(2.0) == key(-0.5), key(0.0) == key(-0.0)
        (True, False, False)
    """
    if any(a.ref_attr_name for a in node.attribute):
        return None
    digest = hashlib.sha1()
    for attr in sorted(node.attribute, key=lambda a: a.name):
        if attr.name not in generic:
            digest.update(repr((attr.name, attr.type, _plain(onnx.helper.get_attribute_value(attr)))).encode())
    return digest.hexdigest()[:12]


def body_for(doc_string: str) -> str | None:
    """The attributes key (:func:`attributes_key`) a body's ``doc_string`` says it was made for, if any."""
    found = _BODY_FOR_KEY.search(doc_string or "")
    return found.group(1) if found else None


def _describe(node: onnx.NodeProto) -> str:
    """``node``'s attribute values, as a message shows them."""
    text = ", ".join(f"{a.name}={onnx.helper.get_attribute_value(a)!r}" for a in node.attribute
                     if not hasattr(onnx.helper.get_attribute_value(a), "SerializeToString"))
    return text if len(text) <= 200 else text[:197] + "..."


class _Local(NamedTuple):
    """What the resolver reads of one of the model's functions: its doc_string and its attributes."""

    doc: str
    generic: frozenset[str]


def _not_its_body(node: onnx.NodeProto, function: _Local) -> bool:
    """Whether ``function`` (the one ``node`` calls) says it was made for other attribute values."""
    made_for = body_for(function.doc)
    return made_for is not None and made_for != attributes_key(node, function.generic)


def _bakes(node: onnx.NodeProto, function: _Local) -> bool:
    """Whether ``function`` holds some attribute value of ``node`` as a constant (not as a function attribute)."""
    return any(a.name not in function.generic for a in node.attribute)


def _proto_local(function: onnx.FunctionProto) -> _Local:
    names = [*function.attribute, *(a.name for a in function.attribute_proto)]
    return _Local(function.doc_string, frozenset(names))


def _ir_local(function: ir.Function) -> _Local:
    return _Local(function.doc_string or "", frozenset(function.attributes))


def body_doc(node: onnx.NodeProto, body: onnx.FunctionProto) -> str:
    """``body``'s ``doc_string`` naming the attribute values of ``node`` it was made for (first line):
    those it holds as constants; a body that takes every attribute of the node as a function
    attribute serves every node and says nothing."""
    doc_string, local = body.doc_string, _proto_local(body)
    key = attributes_key(node, local.generic)
    if key is None or not _bakes(node, local):
        return doc_string
    rest = "\n".join(line for line in (doc_string or "").splitlines() if not line.startswith(_BODY_FOR))
    baked = onnx.NodeProto()
    baked.attribute.extend(a for a in node.attribute if a.name not in local.generic)
    return f"{_BODY_FOR}{key}: {_describe(baked)}" + (f"\n{rest}" if rest else "")


class _Body(NamedTuple):
    """A body made for some nodes: its kind's overload prefix (:attr:`~exporters.kinds.BodyKind.overload`),
    the function, and its bytes as made, with no overload (what tells two bodies of one op apart;
    serialized once)."""

    prefix: str
    function: ir.Function
    data: bytes


def _content(function: ir.Function) -> bytes:
    """``function``'s bytes as onnx-ir writes them, with no overload: a body made here compares
    with a function the model already has."""
    proto = ir.serde.serialize_function(function)
    proto.ClearField("overload")
    return proto.SerializeToString()


def _needs_body(node: onnx.NodeProto, local: Mapping[tuple[str, str, str], _Local], registry: Registry,
                replace: bool, ops: Collection | None) -> OpSpec | None:
    """The op of ``node`` when it needs a body from the resolver: it has none in ``local`` (the
    model's functions: identifier -> doc_string), ``replace``, or the one it calls is not its own:
    made for other attribute values (:func:`body_for`), or, for an op whose bodies depend on them
    (built or derived), saying nothing of what it was made for."""
    key = (node.domain, node.op_type, node.overload)
    if ops is not None and key[:2] not in ops:
        return None
    spec = registry.find(key[0], key[1])
    if key not in local or replace or spec is None:
        return spec
    function = local[key]
    if _not_its_body(node, function) or (body_for(function.doc) is None and body_kind(spec).per_node
                                         and attributes_key(node) is not None and _bakes(node, function)):
        return spec
    return None


def _complete(model: onnx.ModelProto, registry: Registry, replace: bool, ops: Collection | None,
              nodes: Iterable[onnx.NodeProto]) -> bool:
    """Whether the resolver has nothing to do on ``model``: every function at the model's opset and
    every custom node (``nodes``) of a registered op with its own body, none calling a body made for
    other attribute values (read from the protos: nothing converted)."""
    opset = onnx_opset(model)
    if opset is not None and any(onnx_opset(f) not in (None, opset) for f in model.functions):
        return False
    local = {(f.domain, f.name, f.overload): _proto_local(f) for f in model.functions}
    for node in nodes:
        if _needs_body(node, local, registry, replace, ops):
            return False
        key = (node.domain, node.op_type, node.overload)
        if (ops is None or key[:2] in ops) and key in local and _not_its_body(node, local[key]):
            return False  # NOTE: an op the registry lacks: refused by the resolver (_refuse_foreign_bodies)
    return True


def _refuse_foreign_bodies(model: ir.Model, ops: Collection | None) -> None:
    """Raise when a custom node still calls a body made for other attribute values (its op is not
    registered, or the registry gave it no body): onnxruntime would run another node's body."""
    for node in ir_custom_nodes(model):
        function = model.functions.get(node.op_identifier())
        if function is None or (ops is not None and (node.domain, node.op_type) not in ops):
            continue
        proto = ir.serde.serialize_node(node)
        if _not_its_body(proto, _ir_local(function)):
            raise OpBridgeError(
                f"node {node.name!r} of {node.domain}::{node.op_type} calls a function body made for other "
                f"attribute values (a tool merged or renamed the op's bodies: onnxslim keeps one body per op and "
                f"drops node overloads). Got attributes {_describe(proto)}; the body was made for attributes key "
                f"{body_for(function.doc_string or '')}, the node's is "
                f"{attributes_key(proto, frozenset(function.attributes))}. Import the module "
                "that registers the op (the resolver then rebuilds the node's own body: `opbridge attach`, "
                "bridge.session), or export the file again.")


def _alike(types: list[onnx.TypeProto | None]) -> onnx.TypeProto | None:
    """The tensor type of one value that its function's calls (one type each) agree on: a dim that differs
    is unknown; None where a call gives it no shape, or the calls differ in dtype or rank."""
    first = types[0].tensor_type if types[0] is not None else None
    if first is None or any(t is None or not t.tensor_type.HasField("shape") or t.tensor_type.elem_type
                            != first.elem_type or len(t.tensor_type.shape.dim) != len(first.shape.dim) for t in types):
        return None
    common = onnx.TypeProto()
    common.CopyFrom(types[0])
    known = [t for t in types if t is not None]  # NOTE: all of them (checked above)
    for k, dim in enumerate(common.tensor_type.shape.dim):
        if any(t.tensor_type.shape.dim[k] != dim for t in known):
            dim.Clear()  # NOTE: a body derived for it has that dim dynamic, so it serves every call
    return common


class _Resolver:
    """One onnx-ir model's bodies, resolved node by node (see the module's docstring)."""

    def __init__(self, model: ir.Model, registry: Registry, replace: bool, ops: Collection | None):
        self.model, self.registry, self.replace, self.ops = model, registry, replace, ops
        self.opset = standard_opset(model.opset_imports.items())
        self.inferred: dict[str, onnx.TypeProto] | None = None
        self.called: dict[tuple, dict[str, onnx.TypeProto] | None] = {}  # a local function's values' types
        self.made: dict[tuple, _Body | None] = {}  # per (op, values or site) key
        self.resolved: set[tuple[str, str]] = set()  # ops given bodies here (replace: theirs are dropped)

    def body(self, spec: OpSpec, node: ir.Node) -> _Body | None:
        """The body of ``node`` at the model's opset, or None when its op gives none here."""
        kind = body_kind(spec)
        key = kind.key(node)
        if key not in self.made:
            made = kind.make(node, self.opset, lambda: self._types(node), self.registry)
            if made is not None and kind.per_node:
                made.doc_string = body_doc(ir.serde.serialize_node(node), made)
            self.made[key] = None if made is None else _Body(
                kind.overload, ir.serde.deserialize_function(made), made.SerializeToString())
        return self.made[key]

    def _types(self, node: ir.Node) -> dict[str, onnx.TypeProto]:
        """The types of ``node``'s inputs: as the model records them, else as ONNX shape inference gives
        them; inside a model-local function, as its calls give them (:meth:`_called_types`)."""
        inputs = [v for v in node.inputs if v is not None and v.name]
        types, function = self._known(node, inputs)
        untyped = [str(v.name) for v in inputs if not types.get(str(v.name), onnx.TypeProto()).tensor_type.HasField(
            "shape")]
        if function is not None and untyped and self.called[function.identifier()] is not None:
            op, name = f"{node.domain}::{node.op_type}", f"{function.domain}::{function.name}"
            raise OpBridgeError(
                f"{op} inside the function {name} needs its input types to get a body, and the calls of {name} do "
                f"not give them. Got no type and shape for {', '.join(map(repr, untyped))} at every call of {name} "
                "(unknown there, or another dtype or rank at another call). Give the values the calls read types "
                f"and shapes (onnx.shape_inference.infer_shapes), call {name} at one dtype and rank, give {op} a "
                "written body (op.register_function), or use tier='python' or 'native'.")
        return types

    def _known(self, node: ir.Node, inputs: list[ir.Value]) -> tuple[dict[str, onnx.TypeProto], ir.Function | None]:
        """The types known of ``inputs`` (``node``'s), and the model-local function ``node`` sits in, if any."""
        types = {str(v.name): ir.serde.serialize_value(v).type for v in inputs if v.type is not None}
        if len(types) == len(inputs):
            return types, None
        function = None if node.graph is self.model.graph else next(
            (f for f in self.model.functions.values()
             if node.graph is f.graph or any(node.graph is g for g in f.subgraphs())), None)
        if function is not None:
            # NOTE: a function's values are named in its body only: the graph's value of that name is another
            return {**(self._called_types(function) or {}), **types}, function
        if self.inferred is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(ir.serde.serialize_model(self.model))
                self.inferred = model_value_types(inferred)
            except Exception:  # noqa: BLE001  what inference cannot type is reported per node
                self.inferred = {}
        return {**self.inferred, **types}, None

    def _called_types(self, function: ir.Function) -> dict[str, onnx.TypeProto] | None:
        """The types of ``function``'s values that every call of it gives alike (:func:`_alike`): ONNX shape
        inference over its body at each call's input types and attribute values; None when nothing calls it."""
        identifier = function.identifier()
        if identifier not in self.called:
            self.called[identifier] = None  # NOTE: while its calls are read (ONNX forbids a function calling itself)
            found = [self._body_types(function, n) for n in ir_custom_nodes(self.model)
                     if n.op_identifier() == identifier]
            self.called[identifier] = {n: t for n in found[0] if (t := _alike([f.get(n) for f in found]))} \
                if found else None
        return self.called[identifier]

    def _body_types(self, function: ir.Function, call: ir.Node) -> dict[str, onnx.TypeProto]:
        """The types ONNX shape inference gives ``function``'s values called by ``call``: its body as a graph
        whose inputs have the types of the call's, its attribute references bound to the call's values."""
        body, caller = ir.serde.serialize_function(function), ir.serde.serialize_node(call)
        given = {a.name: a for a in (*body.attribute_proto, *caller.attribute)}
        for inner in walk(body.node):
            for ref in [a for a in inner.attribute if a.ref_attr_name]:
                inner.attribute.remove(ref)
                if ref.ref_attr_name in given:
                    inner.attribute.add().CopyFrom(given[ref.ref_attr_name])
                    inner.attribute[-1].name = ref.name
        outer = self._known(call, [v for v in call.inputs if v is not None and v.name])[0]
        inputs = [onnx.helper.make_value_info(formal, outer[actual])
                  for formal, actual in zip(body.input, caller.input) if actual in outer]
        imports = {**self.model.opset_imports, **function.opset_imports}
        model = onnx.helper.make_model(
            onnx.helper.make_graph(body.node, body.name, inputs, []),
            functions=[ir.serde.serialize_function(f) for f in self.model.functions.values() if f is not function],
            opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in imports.items()])
        try:
            return model_value_types(onnx.shape_inference.infer_shapes(model))
        except Exception:  # noqa: BLE001  what inference cannot type is reported per node
            return {v.name: v.type for v in inputs}

    def round(self) -> list[str]:
        """Give bodies to the nodes that need them now; return the ops given one."""
        local = {i: _ir_local(f) for i, f in self.model.functions.items()}
        uses: dict[tuple[str, str], list[tuple[ir.Node, _Body]]] = {}
        specs: dict[tuple[str, str], OpSpec] = {}
        bodiless: set[tuple[str, str]] = set()  # NOTE: ops with a node its kind gives no body (a failed derivation)
        for node in ir_custom_nodes(self.model):
            op = (node.domain, node.op_type)
            spec = None if op in self.resolved else _needs_body(
                ir.serde.serialize_node(node), local, self.registry, self.replace, self.ops)
            made = None if spec is None else self.body(spec, node)
            if spec is not None and made is not None:
                uses.setdefault(op, []).append((node, made))
                specs[op] = spec
            elif spec is not None:
                bodiless.add(op)
        for op, pairs in uses.items():
            self._attach(op, pairs, plain=op not in bodiless)
            self.resolved.add(op)
        return [specs[op].qualname for op in uses]

    def _attach(self, op: tuple[str, str], pairs: list[tuple[ir.Node, _Body]], plain: bool = True) -> None:
        """One op's bodies into the model, each node pointing at its own: a body equal to a function
        the model has is that function; ``replace`` drops the op's earlier functions first. ``plain=False``
        (a node of the op got no body): no body takes the plain name, which that node calls."""
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
            digest = hashlib.sha1(body.data).hexdigest()[:10]
            alone = plain and len(new) == 1 and "" not in overloads.values()
            body.function.overload = "" if alone else body.prefix + digest
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
            source = standard_opset(function.opset_imports.items())
            if self.opset is not None and source is not None and source != self.opset:
                proto = portable_constants(convert_function(ir.serde.serialize_function(function), self.opset))
                proto.doc_string = function.doc_string or ""  # NOTE: what the body was made for stays said
                self.model.functions[identifier] = ir.serde.deserialize_function(proto)
                spec = self.registry.find(function.domain, function.name)
                changed.append(spec.qualname if spec is not None else f"{function.domain}::{function.name}")
        return changed


def attach_functions(model: onnx.ModelProto, registry: Registry | None = None, *, replace: bool = False,
                     ops: Collection[tuple[str, str]] | None = None,
                     nodes: Iterable[onnx.NodeProto] | None = None) -> list[str]:
    """Give every custom node of ``model`` of a registered op the body it lacks, at the model's ONNX
    opset (see the module's docstring for where each comes from); return the ops given bodies or
    whose bodies were converted. ``replace=True`` replaces the model's own functions of registered
    ops with what the registry gives (restores bodies a tool broke); ``ops`` limits the work to
    those ``(domain, op type)``; ``nodes`` are the model's custom nodes (functions' too) where the
    caller has walked it already (a session's plan). Edits ``model`` in place; the caller saves it.

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
    # NOTE: a body a tool emptied or cut (onnx-ir cannot read it) is no body: its op's is attached instead
    broken = [f for f in model.functions if unproduced_outputs(f) and registry.find(f.domain, f.name) is not None
              and (ops is None or (f.domain, f.name) in ops)]
    for f in broken:
        model.functions.remove(f)
    if _complete(model, registry, replace, ops, custom_nodes(model, functions=True) if nodes is None else nodes):
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
    _refuse_foreign_bodies(model, ops)
    return list(dict.fromkeys(changed))
