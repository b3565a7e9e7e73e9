"""The op registry: frozen, validated records of every op the bridge knows."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator
from typing import Any

import onnx
import onnx_ir as ir
from onnx import defs

from bridge.core.basics import torch_compat
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import custom_nodes, ir_custom_nodes
from bridge.core.functional import define_twin, twin_spec
from bridge.core.spec import OpSpec, Written, explicit_attributes, function_signature


class Registry:
    """All ops the bridge knows, by qualified name. Records are frozen and validated on entry;
    a change is a new record swapped in (:meth:`replace`), never a mutation.

    Example:
        >>> reg = Registry()
        >>> len(reg)
        0
        >>> reg.get("nope::op")
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: op 'nope::op' is not registered. Got 'nope::op'. ...
    """

    def __init__(self) -> None:
        self._ops: dict[str, OpSpec] = {}
        self._twins: dict[str, OpSpec] = {}  # functional twins of mutating ops, by the op's qualname
        self.generation = 0  # bumped on every change: caches derived from the registry key on it
        self._by_onnx_name: tuple[int, dict] = (-1, {})  # (generation, (domain, op_type) -> spec): find()
        # NOTE: onnx's schema table is process-wide: an op also registered elsewhere (another
        # registry) gets its schema back when this registry forgets the op.
        self._displaced: dict[str, defs.OpSchema] = {}
        self._schemas: set[str] = set()  # the ops whose ONNX schema this registry registered
        # NOTE: torch.autograd.Function classes whose node only a call tells (bridge.core.opdef): class ->
        # the options of their bridge.register, until an export's first call describes them; and torchbind
        # methods ("ns::Class.method") registered without their state's names, until an export's object tells them
        self.deferred: dict[type | str, dict[str, Any]] = {}

    def __iter__(self) -> Iterator[OpSpec]:
        return iter(sorted(self._ops.values(), key=lambda s: s.qualname))

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, qualname: object) -> bool:
        return qualname in self._ops

    def get(self, qualname: str) -> OpSpec:
        """The spec of ``qualname``; unknown names raise with the closest registered names."""
        try:
            return self._ops[qualname]
        except KeyError:
            close = difflib.get_close_matches(str(qualname), list(self._ops), n=3)
            hint = f"Did you mean {', '.join(close)}?" if close else \
                f"Registered: {', '.join(sorted(self._ops)) or 'none'}."
            raise OpBridgeError(
                f"op {qualname!r} is not registered. Got {qualname!r}. {hint} "
                "Declare it with @bridge.op or import the module that does (on the command line: "
                "`opbridge --ops MODULE ...`)."
            ) from None

    def exportable(self) -> list[OpSpec]:
        """Specs that become ONNX nodes: functional ops, and the functional twins of mutating ones."""
        return sorted([s for s in self._ops.values() if not s.mutated] + list(self._twins.values()),
                      key=lambda s: s.qualname)

    def functional(self, spec: OpSpec) -> OpSpec:
        """The spec that stands for ``spec`` in ONNX: itself, or its functional twin if it mutates."""
        return self._twins[spec.qualname] if spec.mutated else spec

    def declared(self, spec: OpSpec) -> OpSpec:
        """The op as declared that ``spec`` stands for in ONNX (the inverse of :meth:`functional`): a
        functional twin's mutating op (``opbridge::numpy_sin`` for ``numpy_sin_functional``), else ``spec``.
        User-facing lists name ops by it, as ``opbridge ops`` does."""
        return next((s for s in self._ops.values() if s.mutated and self._twins.get(s.qualname) is spec), spec)

    def find(self, domain: str, op_type: str) -> OpSpec | None:
        """The spec an ONNX node (domain, op_type) came from, if any."""
        # NOTE: called per node by every walk over a model (sessions, tiers): an index rebuilt when
        # the registry changes, not a sorted scan per call
        if self._by_onnx_name[0] != self.generation:
            index: dict[tuple[str, str], OpSpec] = {}
            for spec in self.exportable():
                index.setdefault((spec.domain, spec.name), spec)
            self._by_onnx_name = (self.generation, index)
        return self._by_onnx_name[1].get((domain, op_type))

    def for_torchbind(self, class_name: str, method: str) -> OpSpec | None:
        """The op standing for ``class_name.method`` (class as ``ns::Class``), if declared."""
        wanted = f"{class_name}.{method}"
        return next((s for s in self._ops.values() if wanted in s.torchbind), None)

    def for_overload(self, overload) -> OpSpec | None:
        """The spec of a torch OpOverload (a declared op or a functional twin), if registered."""
        name = overload.name().split(".")[0] if hasattr(overload, "name") else ""  # NOTE: no op or twin is named ""
        return (self._ops.get(name) or next((t for t in self._twins.values() if t.qualname == name), None)
                or next((s for s in self._ops.values() if s.origin.proxied and s.overload == overload), None))

    def for_function(self, cls: type) -> OpSpec | None:
        """The record of the ``torch.autograd.Function`` class ``cls``, if registered."""
        return next((s for s in self._ops.values() if (fb := s.origin.function) is not None and fb.cls is cls), None)

    def check_free(self, qualname: str) -> None:
        """Raise if ``qualname`` is taken: a second declaration is an error, not an override."""
        held = self._ops.get(qualname)
        if held is not None:
            # NOTE: the holder named: two Functions whose symbolics write one node type (mmcv 1.x's four corner
            # pools, told apart by mode_i) meet here, and the second does not know the first
            raise OpBridgeError(
                f"op {qualname!r} is already registered (by {held.doc.splitlines()[0] if held.doc else 'another'}). "
                "Got a second declaration. Give the new op another name, or remove the first declaration (Functions "
                "whose symbolics write one node type, told apart by an attribute, cannot each be bridged: one op "
                "type has one record)."
            )

    def add(self, spec: OpSpec) -> OpSpec:
        """Validate and add ``spec``; the ONNX schema is registered with onnx for checking."""
        self.check_free(spec.qualname)
        clash = self.find(spec.domain, spec.name)
        if clash is not None:
            raise OpBridgeError(
                f"ONNX name {spec.domain}::{spec.name} is already used by {clash.qualname!r}. "
                f"Got it again for {spec.qualname!r}. Pass domain= to put one op elsewhere."
            )
        _validate(spec)
        twin = None
        if spec.mutated:
            twin = twin_spec(spec, define_twin(spec))
            try:
                _validate_function(twin)
            except OpBridgeError:
                torch_compat.destroy_custom_op(twin.custom_op)  # the twin goes with the failed declaration
                raise
        # NOTE: a Function's node types are known from a call or a file (Origin.typed_by_use): its schema then
        self._store(spec, twin, schema=not spec.origin.typed_by_use)
        return spec

    def settle(self, spec: OpSpec) -> None:
        """Register ``spec``'s ONNX schema where :meth:`add` left it to the op's first use (a Function's: an
        export's call, or a file's node, tells its attribute types; until then tools such as onnx.checker,
        onnxslim and onnxsim see no schema of the node's op, as before the op was registered)."""
        if spec.qualname not in self._schemas:
            self._register_schema(spec.qualname, self.functional(spec))

    def replace(self, spec: OpSpec) -> OpSpec:
        """Swap in a changed record of a registered op (same qualname, validated like a new one)."""
        old = self.get(spec.qualname)
        if (spec.domain, spec.name, spec.version) != (old.domain, old.name, old.version):
            raise OpBridgeError(f"{spec.qualname}: a registered op keeps its ONNX identity. Got "
                                f"{spec.domain}::{spec.name} v{spec.version} for {old.domain}::{old.name} "
                                f"v{old.version}. Register a new op instead.")
        _validate(spec)
        twin = twin_spec(spec, self._twins[spec.qualname].custom_op) if spec.mutated else None
        if twin is not None:
            _validate_function(twin)
        self._store(spec, twin)
        return spec

    def _store(self, spec: OpSpec, twin: OpSpec | None, *, schema: bool = True) -> None:
        if schema:
            self._register_schema(spec.qualname, twin or spec)
        self._ops[spec.qualname] = spec
        if twin is not None:
            self._twins[spec.qualname] = twin
        self.generation += 1

    def _register_schema(self, qualname: str, onnx_spec: OpSpec) -> None:
        displaced = _schema(onnx_spec) if qualname not in self._schemas else None
        _register_onnx_schema(onnx_spec)
        if displaced is not None:
            self._displaced[qualname] = displaced
        self._schemas.add(qualname)

    def remove(self, qualname: str) -> None:
        """Forget an op (tests use this); its ONNX schema is deregistered too."""
        spec = self._twins.pop(qualname, None) or self._ops[qualname]
        self._ops.pop(qualname)
        self.generation += 1
        if qualname in self._schemas and _schema(spec) is not None:
            defs.deregister_schema(spec.name, spec.version, spec.domain)
        self._schemas.discard(qualname)
        displaced = self._displaced.pop(qualname, None)
        if displaced is not None:
            defs.register_schema(displaced)

    def missing(self, spec: OpSpec) -> list[str]:
        """What ``spec`` still lacks, as short phrases (empty when complete). A function body is not
        among them: without one, export derives it from the implementation (``opbridge ops`` says
        whether it can)."""
        gaps = []
        if not spec.has_fake:
            gaps.append("fake kernel (register_fake / fake=): export and shape inference need it")
        if spec.reference is None:
            gaps.append("reference implementation (register_reference / reference=): parity tests need an "
                        "independent result")
        if spec.sample_inputs is None:
            gaps.append("sample inputs (register_samples / sample_inputs=): opcheck and parity tables need them")
        return gaps

    def check_complete(self, qualname: str | None = None) -> dict[str, list[str]]:
        """Map each op (or just ``qualname``) to what it lacks; complete ops map to ``[]``.

        Example:
            >>> import bridge, custom_ops
            >>> bridge.REGISTRY.check_complete("bev::bev_pool_v2")
            {'bev::bev_pool_v2': []}
        """
        specs = [self.get(qualname)] if qualname else list(self)
        return {s.qualname: self.missing(s) for s in specs}


def fill_attributes(model: onnx.ModelProto | ir.Model, registry: Registry) -> bool:
    """Give every node of a registered op in ``model`` (a proto or onnx-ir's; graphs, subgraphs, model-local
    functions) each attribute it omits that the op gives a default (``bridge.core.spec.explicit_attributes``):
    files other tools wrote run with the op's defaults in every tier, inlined too. Edits ``model`` in place;
    returns whether a node changed."""
    changed = False
    for node in ir_custom_nodes(model) if isinstance(model, ir.Model) else custom_nodes(model, functions=True):
        spec = registry.find(node.domain, node.op_type)
        if spec is not None and explicit_attributes(spec, node):
            changed = True
    return changed


def _validate(spec: OpSpec) -> None:
    """A translation takes the op's parameters; a written body mirrors the op (a twin's, if it mutates)."""
    if spec.custom_translation is not None:
        got = list(inspect.signature(spec.custom_translation).parameters)
        want = [p.name for p in spec.params]
        if got != want:
            raise OpBridgeError(f"{spec.qualname}: translation parameters must mirror the op schema. "
                                f"Got {got}. Use {want}.")
    if not spec.mutated:
        _validate_function(spec)


def _validate_function(spec: OpSpec) -> None:
    if isinstance(spec.function, Written):  # NOTE: a builder's bodies are checked as they are built
        validate_body(spec, spec.function)


def validate_body(spec: OpSpec, function) -> None:
    """Raise OpBridgeError where the onnxscript ``function`` does not mirror ``spec``'s op (name,
    domain, inputs, attributes, outputs)."""
    domain, name, inputs, attrs, n_out = function_signature(function)
    want_inputs = [p.name for p in spec.tensors]
    want_attrs = {p.name for p in spec.attributes}
    problems = []
    if (domain, name) != (spec.domain, spec.name):
        problems.append(f"it is {domain}::{name}, the node is {spec.domain}::{spec.name} "
                        f"(use @onnxscript.script(Opset({spec.domain!r}, {spec.version})) and name it {spec.name})")
    if inputs != want_inputs:
        problems.append(f"inputs {inputs} != op tensors {want_inputs}")
    if not set(attrs) <= want_attrs:
        problems.append(f"attributes {sorted(set(attrs) - want_attrs)} are not op attributes {sorted(want_attrs)}")
    if n_out != spec.num_outputs:
        problems.append(f"{n_out} outputs, the op has {spec.num_outputs}")
    if problems:
        raise OpBridgeError(f"{spec.qualname}: function body does not match the op. Got: "
                            + "; ".join(problems) + ". Make the function mirror the op schema.")


def _schema(spec: OpSpec) -> defs.OpSchema | None:
    """onnx's schema of exactly ``spec``'s (domain, name, version), if registered.

    NOTE: ``defs.has(name, version, domain)`` also answers True for an older version of the op (it
    asks "is there a schema at most this version"), so version 2 after version 1 must compare
    ``since_version``.
    """
    if not defs.has(spec.name, spec.version, spec.domain):
        return None
    schema = defs.get_schema(spec.name, spec.version, spec.domain)
    return schema if schema.since_version == spec.version else None


def _register_onnx_schema(spec: OpSpec) -> None:
    # NOTE: registered so onnx.checker(full_check=True) and shape inference know the node;
    # the inference function keeps `optimize=True` from erasing the output type.
    old = _schema(spec)
    if old is not None:
        defs.deregister_schema(spec.name, spec.version, spec.domain)
    try:
        defs.register_schema(spec.onnx_schema)
    except defs.SchemaError as e:
        if old is not None:
            defs.register_schema(old)  # NOTE: nothing half-done: the schema that was there stays
        raise OpBridgeError(f"{spec.qualname}: onnx refused the schema of {spec.domain}::{spec.name} "
                            f"v{spec.version}. Got SchemaError: {str(e)[:300]}. Use another domain or "
                            "version.") from None


REGISTRY = Registry()
