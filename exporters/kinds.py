"""Where an op's function body comes from, decided once (:func:`body_kind`): written (``function=``,
one body for every node), built (a ``BodyBuilder``, per the attribute values it reads), translated
(torch.onnx's own translation of the op) or derived (traced from its implementation, ``exporters.derive``);
translated and derived bodies are made per site. Each kind gives its key for a node (nodes with equal
keys share one body), the body at an opset, what ``opbridge ops`` says (``status``) and what
``--show-body`` prints (``show``). The resolver, those commands and the function tier ask it.

Example:
    >>> import bridge, custom_ops
    >>> kind = body_kind(bridge.REGISTRY.get("opbridge::crop"))
    >>> type(kind).__name__, kind.status()
    ('WrittenBody', ('written', None))
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import onnx
import onnx_ir as ir
import torch

from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import ProtoMemo
from bridge.core.basics.torch_compat import torchlib_translation
from bridge.core.checks import Check, Checks, guarded_body, unreadable
from bridge.core.registry import Registry, validate_body
from bridge.core.spec import BodyBuilder, OpSpec, Written, bind_attribute_defaults, node_attributes, values_key
from exporters.bodies.opsets import convert_function, portable_constants
from exporters.derive.cache import CACHE
from exporters.derive.derivation import derive
from exporters.derive.implementation import implementation
from exporters.derive.indices import stated, stated_checks
from exporters.derive.sites import NoPortableBody, Site, Untraceable, sample_site, site_of
from exporters.fakes import fake_disagreement


def guarded_copy(proto: onnx.FunctionProto, spec: OpSpec, extra: tuple[Check, ...] = ()) -> onnx.FunctionProto:
    """A copy of ``proto`` (``spec``'s body, written, built or derived) with the op's check guards
    (``bridge.core.checks``) where the body keeps every attribute they read as a function attribute,
    and ``extra`` (a derived body's index checks) after them, but on an input a declared ``values_in`` reads.

    NOTE: a check reading an attribute baked into this body (its value was known when the body was
    made; the function tier checks attribute values before a session opens) gets no guard; every
    other check keeps its own.
    """
    copy = onnx.FunctionProto()
    copy.CopyFrom(proto)  # NOTE: guarding edits the body it is given; ``proto`` may be a cached one
    declared = tuple(spec.checks or ())
    covered = {c.input for c in declared if c.kind == "values_in"}
    added = tuple(c for c in extra if c.input not in covered)
    if added:  # NOTE: said in the body: the function tier words these guards' failures from any file
        copy.doc_string = "\n".join(filter(None, [copy.doc_string, stated(added)]))
    checks = body_checks(copy, spec)
    if checks is not None:
        names = {*copy.attribute, *(a.name for a in copy.attribute_proto)}  # without and with defaults
        kept = {p.name: p.onnx_attribute_type for p in spec.attributes if p.name in names}
        return guarded_body(copy, checks, kept, skip=list(unreadable(copy, checks, kept)))
    return copy


def body_checks(proto: onnx.FunctionProto, spec: OpSpec) -> Checks | None:
    """The checks ``proto`` (a body of ``spec``'s op) guards: the op's own, then the index checks its
    ``doc_string`` states (a derived body's, ``exporters.derive.indices``)."""
    added = stated_checks(proto.doc_string)
    return Checks(spec.qualname, [*(spec.checks or ()), *added]) if added else spec.checks


def _finished(proto: onnx.FunctionProto, spec: OpSpec, opset: int | None,
              extra: tuple[Check, ...] = ()) -> onnx.FunctionProto:
    """``proto`` as it goes into a model: with the op's guards (and ``extra``), at ``opset`` (None: its own),
    constants as tensors."""
    proto = guarded_copy(proto, spec, extra)
    return portable_constants(convert_function(proto, opset) if opset is not None else proto)


def _sample_site(spec: OpSpec, dtype: torch.dtype | None) -> Site | None:
    """The site of the op's first sample at ``dtype`` (None: float32 where the op takes it, else its first)."""
    dtype = dtype or (torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0])
    samples = spec.sample_inputs(dtype) if spec.sample_inputs is not None else []
    return sample_site(spec, samples[0]) if samples else None


def _no_samples(spec: OpSpec, made: str, make: str) -> OpBridgeError:
    return OpBridgeError(f"{spec.qualname}: its body is {made}, and it has no sample inputs to {make} one from here. "
                         "Got no samples. Register samples (op.register_samples), or export a model and read "
                         "model.functions.")


@dataclasses.dataclass(frozen=True)
class BodyKind(abc.ABC):
    """Where the bodies of ``spec``'s op come from."""

    spec: OpSpec
    name: ClassVar[str]
    overload: ClassVar[str] = ""  # NOTE: what tells its bodies apart when an op's nodes get several (ONNX overload)
    per_node: ClassVar[bool] = True  # NOTE: its bodies depend on the node, and say the values they hold (doc_string)

    @property
    def reads(self) -> tuple[str, ...]:  # NOTE: attributes every body holds the value of, None too (a builder's)
        return ()

    def key(self, node: ir.Node) -> tuple:
        """Which body serves ``node``: nodes with equal keys share one."""
        return (self.spec.qualname, self.name, id(node))

    @abc.abstractmethod
    def make(self, node: ir.Node, opset: int | None, types: Callable[[], dict[str, onnx.TypeProto]],
             registry: Registry) -> onnx.FunctionProto | None:
        """``node``'s body as it goes into a model at ``opset`` (:func:`_finished`; ``types()``: its input
        types, asked only where the body needs them); None where there is none."""

    @abc.abstractmethod
    def status(self, dtype: torch.dtype | None = None, opset: int = 20, registry: Registry | None = None, *,
               try_it: bool = True) -> tuple[str, str | None]:
        """What ``opbridge ops`` says: ``(kind, note)``, or ``("none", reason)``; ``try_it=False`` derives nothing."""

    @abc.abstractmethod
    def show(self, dtype: torch.dtype | None = None, opset: int = 20, registry: Registry | None = None) -> str:
        """What ``--show-body`` prints: a comment line saying which body, then its onnx.printer text
        (where bodies differ per node, the one for the op's first sample at ``dtype``)."""


@dataclasses.dataclass(frozen=True)
class WrittenBody(BodyKind):
    """One body, written, for every node."""

    written: Written
    name = "written"
    per_node = False

    def key(self, node):
        return (self.spec.qualname, self.name)

    def at(self, opset: int | None = None) -> onnx.FunctionProto:
        """The body as it goes into a model at ``opset`` (:func:`_finished`), made once per op and opset."""
        key = f"{id(self.spec)}/{opset}".encode()  # NOTE: a spec is frozen: a new registration is a new spec
        made = _WRITTEN.get(key)
        if made is None or made[0] is not self.spec:
            # NOTE: the op's defaults bind the body's attribute references a node omits (not the inner ops' own)
            made = (self.spec, _finished(bind_attribute_defaults(self.spec, self.written.to_function_proto()),
                                         self.spec, opset))
            _WRITTEN.put(key, made)
        body = onnx.FunctionProto()
        body.CopyFrom(made[1])
        return body

    def make(self, node, opset, types, registry):
        return self.at(opset)

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        return "written", None

    def show(self, dtype=None, opset=20, registry=None):
        return f"# {self.spec.qualname}: written body\n" + onnx.printer.to_text(self.written.to_function_proto())


_WRITTEN = ProtoMemo(size=64)  # id(spec)/opset -> (spec, its written body); the spec kept, so its id stays its own


@dataclasses.dataclass(frozen=True)
class BuiltBody(BodyKind):
    """A body per the attribute values the builder reads: nodes with equal values share one."""

    builder: BodyBuilder
    name = "built"
    overload = "built_"

    @property
    def reads(self) -> tuple[str, ...]:
        return self.builder.reads

    def key(self, node):
        values = node_attributes(self.spec, ir.serde.serialize_node(node))
        return (self.spec.qualname, self.name, values_key({n: values[n] for n in self.reads}))

    def built(self, values: dict) -> onnx.FunctionProto:
        """The body the builder gives for the attribute ``values``, checked against the op."""
        function = self.builder.function(values)
        if not hasattr(function, "to_function_proto"):
            raise OpBridgeError(f"{self.spec.qualname}: its body builder returned {type(function).__name__} for "
                                f"{values}. Got no onnxscript function. Return an @onnxscript.script function "
                                "named like the op.")
        validate_body(self.spec, function)
        return function.to_function_proto()

    def make(self, node, opset, types, registry):
        return _finished(self.built(node_attributes(self.spec, ir.serde.serialize_node(node))), self.spec, opset)

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        return "written", self.builder.note

    def show(self, dtype=None, opset=20, registry=None):
        site = _sample_site(self.spec, dtype)
        if site is None:
            raise _no_samples(self.spec, "built per attribute values", "build")
        text = onnx.printer.to_text(self.built(dict(site.attrs)))
        return f"# {self.spec.qualname}: written body built for {site.describe()}\n" + text


@dataclasses.dataclass(frozen=True)
class DerivedBody(BodyKind):
    """A body traced from the op's implementation per site (with torch.onnx's ``translation`` of it, if
    given); none where it cannot be traced."""

    translation: Any = None
    name = "derived"
    overload = "derived_"

    @property
    def reads(self) -> tuple[str, ...]:  # NOTE: made per node: each attribute is the node's, read or baked in
        return tuple(p.name for p in self.spec.attributes)

    def make(self, node, opset, types, registry):
        if opset is None:
            return None
        try:
            site = site_of(self.spec, ir.serde.serialize_node(node), types())
            body = derive(self.spec, site, opset, registry, translation=self.translation)
            return _finished(body.proto, self.spec, opset, body.checks)
        except NoPortableBody:
            return None
        except Untraceable as e:
            CACHE.fail(self.spec.qualname, str(e))
            return None

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        try:
            implementation(self.spec)
            site = _sample_site(self.spec, dtype) if try_it else None
            if site is not None:
                derive(self.spec, site, opset, registry, translation=self.translation)
        except NoPortableBody as e:
            # NOTE: a fake of another dtype than the forward's makes the derived body fail to load against the node
            # the fake types: the fake's disagreement is the reason to give then
            lie = fake_disagreement(self.spec)
            return "none", e.reason if lie is None else lie.rstrip(".")
        return "derived", ("derived at each export (no sample inputs to try it here)"
                           if try_it and site is None else None)

    def show(self, dtype=None, opset=20, registry=None):
        site, reused = _sample_site(self.spec, dtype), self.translation
        if site is None:
            if reused is None:
                implementation(self.spec)  # NOTE: no implementation to derive from says so first
            raise _no_samples(self.spec, "derived at each export site", "derive")
        body = derive(self.spec, site, opset, registry, translation=reused)
        origin = "its implementation" if reused is None else f"torch.onnx's translation {reused.name}"
        baked = ", ".join(f"{n}={v!r}" for n, v in body.fixed) or "none"
        head = (f"# {self.spec.qualname}: derived from {origin} at {site.describe()} "
                f"(attributes read from the node: {', '.join(body.parametric) or 'none'}; baked in: {baked})")
        return head + "\n" + onnx.printer.to_text(body.proto)


@dataclasses.dataclass(frozen=True)
class TranslatedBody(DerivedBody):
    """torch.onnx's own translation of the op (torch_lib's, by qualified name), for an op with no body, no
    ``translation=`` and no proxy op: exported per site, every attribute baked in (``exporters.derive``)."""

    name = "translated"

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        return "translated", (f"torch.onnx's translation ({self.translation.name}, onnxscript torch_lib), exported "
                              "at the model's opset per attribute values")


def body_kind(spec: OpSpec) -> BodyKind:
    """Where ``spec``'s bodies come from: its written body, its builder, torch.onnx's translation of
    the op, else its implementation (the one place that decides)."""
    if isinstance(spec.function, Written):
        return WrittenBody(spec, spec.function)
    if isinstance(spec.function, BodyBuilder):
        return BuiltBody(spec, spec.function)
    reused = None if spec.custom_translation is not None or spec.origin.proxied else torchlib_translation(spec.qualname)
    return DerivedBody(spec) if reused is None else TranslatedBody(spec, reused)
