"""Where an op's function body comes from, decided once (:func:`body_kind`): one typed kind per
source, each with its behaviour. The resolver (``exporters.resolve``), ``opbridge ops --bodies`` and
``--show-body``, and the function tier ask the kind; nothing else decides.

- :class:`WrittenBody`: the body the user wrote (``function=``, a ``Written``), one for every node;
- :class:`BuiltBody`: the body a ``BodyBuilder`` gives per the attribute values it reads;
- :class:`TranslatedBody`: torch.onnx's own translation of the op (onnxscript's torch_lib), exported
  at the model's opset per site, every attribute baked in;
- :class:`DerivedBody`: a body traced from the op's PyTorch implementation, per site (``exporters.derive``).

Each kind gives its key for a node (which nodes share one body), the body at an opset (with the op's
check guards, converted, list constants as tensors), its status (``opbridge ops``: kind and note) and
its text (``--show-body``).

Example:
    >>> import bridge, custom_ops
    >>> kind = body_kind(bridge.REGISTRY.get("opbridge::crop"))
    >>> type(kind).__name__, kind.status()
    ('WrittenBody', ('written', None))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import onnx
import onnx_ir as ir
import torch

from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import ProtoMemo
from bridge.core.basics.torch_compat import torchlib_translation
from bridge.core.checks import guarded_body, unreadable
from bridge.core.registry import Registry, validate_body
from bridge.core.spec import BodyBuilder, OpSpec, Written, bind_attribute_defaults, node_attributes, values_key
from exporters.bodies.opsets import convert_function, portable_constants
from exporters.derive.cache import CACHE
from exporters.derive.derivation import derive
from exporters.derive.implementation import implementation
from exporters.derive.sites import NoPortableBody, Untraceable, sample_site, site_of

Types = Callable[[], dict[str, onnx.TypeProto]]  # NOTE: a node's input types, asked only where a body needs them


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


def _finished(proto: onnx.FunctionProto, spec: OpSpec, opset: int | None) -> onnx.FunctionProto:
    proto = guarded_copy(proto, spec)
    return portable_constants(convert_function(proto, opset) if opset is not None else proto)


def _first_sample(spec: OpSpec, dtype: torch.dtype | None):
    """The op's first sample at ``dtype`` (None: float32 where the op takes it, else its first dtype), or None."""
    if dtype is None:
        dtype = torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]
    samples = spec.sample_inputs(dtype) if spec.sample_inputs is not None else []
    return samples[0] if samples else None


def _no_samples(spec: OpSpec, made: str) -> OpBridgeError:
    """What ``--show-body`` says of an op whose bodies are ``made`` per node and that has no sample."""
    return OpBridgeError(f"{spec.qualname}: its body is {made}, and it has no sample inputs to "
                         f"{'derive' if made.startswith('derived') else 'build'} one from here. Got no samples. "
                         "Register samples (op.register_samples), or export a model and read model.functions.")


@dataclasses.dataclass(frozen=True)
class BodyKind:
    """Where the bodies of ``spec``'s op come from (one subclass per source)."""

    spec: OpSpec
    name: ClassVar[str]
    overload: ClassVar[str] = ""  # NOTE: what tells its bodies apart when an op's nodes get several (ONNX overload)
    per_node: ClassVar[bool] = True  # NOTE: its bodies depend on the node, and say the values they hold (doc_string)

    @property
    def reads(self) -> tuple[str, ...]:
        """The attributes whose values every body of this kind holds (None included): a builder's."""
        return ()

    def key(self, node: ir.Node) -> tuple:
        """Which body serves ``node``: nodes with equal keys share one (made once)."""
        return (self.spec.qualname, self.name, id(node))

    def make(self, node: ir.Node, opset: int | None, types: Types, registry: Registry) -> onnx.FunctionProto | None:
        """The body of ``node`` as it goes into a model at ONNX ``opset`` (None: the body's own):
        with the op's check guards, converted, list constants as tensors; None when there is none."""
        raise NotImplementedError

    def status(self, dtype: torch.dtype | None = None, opset: int = 20, registry: Registry | None = None, *,
               try_it: bool = True) -> tuple[str, str | None]:
        """What ``opbridge ops`` says of the body: ``(kind, note)``, ``("none", reason)`` when there is none.
        ``try_it=False`` makes none (a trace and an export per op for a derived one)."""
        raise NotImplementedError

    def show(self, dtype: torch.dtype | None = None, opset: int = 20, registry: Registry | None = None) -> str:
        """The body as ``opbridge ops --show-body`` prints it: a comment line saying which, then
        onnx.printer text (for the op's first sample at ``dtype`` where bodies differ per node)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class WrittenBody(BodyKind):
    """The body written once for every node (``function=``: an onnxscript function).

    Example:
        >>> import bridge, custom_ops
        >>> kind = body_kind(bridge.REGISTRY.get("opbridge::crop"))
        >>> body = kind.at(17)
        >>> onnx_opset = {o.domain: o.version for o in body.opset_import}[""]
        >>> onnx_opset, len(body.node) > len(kind.written.to_function_proto().node)  # guards added
        (17, True)
    """

    written: Written
    name = "written"
    per_node = False

    def key(self, node: ir.Node) -> tuple:
        return (self.spec.qualname, self.name)

    def at(self, opset: int | None = None) -> onnx.FunctionProto:
        """The body as it goes into a model: with the op's guards, at ``opset`` (None: its own), list
        constants as tensors (a fresh copy each call)."""
        # NOTE: one op (its spec is frozen: a new registration is a new spec) at one opset has one
        # written body: it is made once, not per model a session opens (guards and opset conversion are costly)
        key = f"{id(self.spec)}/{opset}".encode()
        made = _WRITTEN.get(key)
        if made is None or made[0] is not self.spec:
            # NOTE: the op's defaults bind the body's attribute references a node omits (not the inner ops' own)
            proto = bind_attribute_defaults(self.spec, self.written.to_function_proto())
            made = (self.spec, _finished(proto, self.spec, opset))
            _WRITTEN.put(key, made)
        body = onnx.FunctionProto()
        body.CopyFrom(made[1])
        return body

    def make(self, node: ir.Node, opset: int | None, types: Types, registry: Registry) -> onnx.FunctionProto | None:
        return self.at(opset)

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        return "written", None

    def show(self, dtype=None, opset=20, registry=None):
        return f"# {self.spec.qualname}: written body\n" + onnx.printer.to_text(self.written.to_function_proto())


_WRITTEN = ProtoMemo(size=64)  # id(spec)/opset -> (spec, its written body); the spec kept, so its id stays its own


@dataclasses.dataclass(frozen=True)
class BuiltBody(BodyKind):
    """The body a builder gives per the attribute values it reads (``function=`` a Python function of
    attributes): nodes with equal values share one."""

    builder: BodyBuilder
    name = "built"
    overload = "built_"

    @property
    def reads(self) -> tuple[str, ...]:
        return self.builder.reads

    def key(self, node: ir.Node) -> tuple:
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

    def make(self, node: ir.Node, opset: int | None, types: Types, registry: Registry) -> onnx.FunctionProto | None:
        values = node_attributes(self.spec, ir.serde.serialize_node(node))
        return _finished(self.built(values), self.spec, opset)

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        return "written", self.builder.note

    def show(self, dtype=None, opset=20, registry=None):
        sample = _first_sample(self.spec, dtype)
        if sample is None:
            raise _no_samples(self.spec, "built per attribute values")
        site = sample_site(self.spec, sample)
        head = f"# {self.spec.qualname}: written body built for {site.describe()}\n"
        return head + onnx.printer.to_text(self.built(dict(site.attrs)))


@dataclasses.dataclass(frozen=True)
class DerivedBody(BodyKind):
    """A body derived from the op's implementation per site (dtypes, dims, attribute values:
    ``exporters.derive``); none where it cannot be traced."""

    name = "derived"
    overload = "derived_"

    def translation(self) -> Any | None:
        """The torch.onnx translation the body is exported with (None: traced from the implementation)."""
        return None

    def origin(self) -> str:
        return "its implementation"

    def make(self, node: ir.Node, opset: int | None, types: Types, registry: Registry) -> onnx.FunctionProto | None:
        if opset is None:
            return None
        try:
            site = site_of(self.spec, ir.serde.serialize_node(node), types())
            derived = derive(self.spec, site, opset, registry, translation=self.translation())
        except NoPortableBody:
            return None
        except Untraceable as e:
            CACHE.fail(self.spec.qualname, str(e))
            return None
        return _finished(derived.proto, self.spec, opset)

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        try:
            implementation(self.spec)
        except NoPortableBody as e:
            return "none", e.reason
        if not try_it:
            return "derived", None
        sample = _first_sample(self.spec, dtype)
        if sample is None:
            return "derived", "derived at each export (no sample inputs to try it here)"
        try:
            derive(self.spec, sample_site(self.spec, sample), opset, registry, translation=self.translation())
        except NoPortableBody as e:
            return "none", e.reason
        return "derived", None

    def show(self, dtype=None, opset=20, registry=None):
        sample = _first_sample(self.spec, dtype)
        if sample is None:
            if self.translation() is None:
                implementation(self.spec)  # NOTE: no implementation to derive from says so first
            raise _no_samples(self.spec, "derived at each export site")
        site = sample_site(self.spec, sample)
        body = derive(self.spec, site, opset, registry, translation=self.translation())
        baked = ", ".join(f"{n}={v!r}" for n, v in body.fixed) or "none"
        head = (f"# {self.spec.qualname}: derived from {self.origin()} at {site.describe()} "
                f"(attributes read from the node: {', '.join(body.parametric) or 'none'}; baked in: {baked})")
        return head + "\n" + onnx.printer.to_text(body.proto)


@dataclasses.dataclass(frozen=True)
class TranslatedBody(DerivedBody):
    """torch.onnx's own translation of the op (onnxscript's torch_lib, keyed by the op's qualified name),
    for an op with no written body, no ``translation=`` of its own and no proxy op: the op still
    exports as one node in its own domain and name, and this translation, exported at the model's
    opset per site, is its body (every attribute baked in: a translation reads them as Python values)."""

    function: Any
    name = "translated"

    def translation(self) -> Any | None:
        return self.function

    def origin(self) -> str:
        return f"torch.onnx's translation {self.function.name}"

    def status(self, dtype=None, opset=20, registry=None, *, try_it=True):
        return "translated", (f"torch.onnx's translation ({self.function.name}, onnxscript torch_lib), exported at "
                              "the model's opset per attribute values")


def body_kind(spec: OpSpec) -> BodyKind:
    """Where ``spec``'s bodies come from: its written body, its builder, torch.onnx's translation of
    the op, else its implementation (the one place that decides).

    Example:
        >>> import bridge, custom_ops
        >>> body_kind(bridge.REGISTRY.get("opbridge::crop")).name
        'written'
    """
    if isinstance(spec.function, Written):
        return WrittenBody(spec, spec.function)
    if isinstance(spec.function, BodyBuilder):
        return BuiltBody(spec, spec.function)
    reused = None if spec.custom_translation is not None or spec.origin.proxied else torchlib_translation(spec.qualname)
    return DerivedBody(spec) if reused is None else TranslatedBody(spec, reused)
