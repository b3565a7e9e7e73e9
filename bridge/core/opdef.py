"""The op object: ``@bridge.op`` declares a torch custom op and returns a :class:`BridgeOp` that the
bridge's pieces attach to, as torch's ``CustomOpDef`` takes ``register_fake``/``register_autograd``.

Every ``register_*`` call swaps a new frozen record into the registry; nothing is mutated.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from bridge.core.basics import torch_compat
from bridge.core.basics.domains import refuse_reserved
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.torch_compat import torchlib_translation
from bridge.core.checks import Check, Checks, unreadable
from bridge.core.functions import (
    NeedsCall,
    check_written,
    class_name,
    define_proxy,
    describe,
    is_function_class,
    record_body,
)
from bridge.core.origins import Existing, FunctionClass, Proxied, RegisteredSymbolicOp, TorchbindMethod
from bridge.core.proxy import (
    class_schemas,
    define_method_proxy,
    define_op_proxy,
    ensure_fake_class,
    is_composite_only,
    method_schema,
    specialisation_check,
    state_types,
    user_fake_class,
)
from bridge.core.registered import (
    RegisteredSymbolic,
    call_defaults,
    caller,
    function_class,
    keyword_samples,
    needs_call,
    origin_of,
    registered_origin,
    warn_used,
)
from bridge.core.registry import REGISTRY, Registry
from bridge.core.spec import (
    OpSpec,
    SampleInput,
    function_signature,
    has_fake_kernel,
    parse_params,
    validate_qualname,
)


def resolve_native(path: str | os.PathLike | None, base: str | os.PathLike | None, qualname: str) -> str | None:
    """An op's C++ kernel file as an absolute path (None for none): relative paths are read against
    ``base`` (the folder of the module that declares the op), never the current folder."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    p = p.resolve()
    if not p.is_file():
        raise OpBridgeError(f"{qualname}: native kernel source not found. Got native={os.fspath(path)!r}, tried "
                            f"{str(p)!r}. Give a path relative to the module that declares the op, or an absolute one.")
    return str(p)


def _folder_of(filename: str | None) -> str | None:
    """The folder of a source file; None for code without one (a REPL, doctest, exec)."""
    if not filename or filename.startswith("<"):
        return None
    return os.path.dirname(os.path.abspath(filename))


def _caller_folder(depth: int = 2) -> str | None:
    return _folder_of(sys._getframe(depth).f_code.co_filename)


class BridgeOp:
    """A registered op: call it like the torch op; attach pieces with the ``register_*`` methods.

    Example:
        >>> import torch, bridge
        >>> reg = bridge.Registry()
        >>> @bridge.op("demo::halve", fake=lambda x: torch.empty_like(x), registry=reg)
        ... def halve(x: torch.Tensor) -> torch.Tensor:
        ...     return x / 2
        >>> halve(torch.ones(2)).tolist()
        [0.5, 0.5]
        >>> @halve.register_reference
        ... def _(x):
        ...     return x * 0.5
        >>> reg.check_complete("demo::halve")["demo::halve"][0].startswith("sample inputs")
        True
    """

    def __init__(self, qualname: str, registry: Registry, custom_op: Any = None):
        self.qualname = qualname
        self._registry = registry
        self._custom_op = custom_op  # torch's CustomOpDef when the bridge defined the torch op

    @property
    def spec(self) -> OpSpec:
        """The op's current record in its registry."""
        return self._registry.get(self.qualname)

    def __call__(self, *args, **kwargs):
        return self.spec.overload(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<bridge op {self.qualname}>"

    def __getattr__(self, name: str):
        # NOTE: everything else (register_kernel, register_torch_dispatch, ...) is torch's own.
        custom = self.__dict__.get("_custom_op")
        if custom is None:
            raise AttributeError(name)
        return getattr(custom, name)

    # -- torch pieces --------------------------------------------------------------------
    def register_fake(self, fn: Callable) -> Callable:
        """The fake (meta) kernel: output shapes and dtypes from input shapes (torch.library)."""
        self._torch_op("register_fake").register_fake(fn)
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None) -> None:
        """The backward formula (torch.library)."""
        self._torch_op("register_autograd").register_autograd(backward, setup_context=setup_context)

    def _torch_op(self, what: str):
        if self._custom_op is None:
            raise OpBridgeError(f"{self.qualname}: {what} needs the op's torch.library definition. Got an op "
                                f"defined elsewhere. Call torch.library.{what}({self.qualname!r}, ...) instead.")
        return self._custom_op

    # -- bridge pieces -------------------------------------------------------------------
    def _attach(self, **changes) -> None:
        self._registry.replace(with_checks(dataclasses.replace(self.spec, **changes)))

    def register_checks(self, *checks: Check) -> Checks:
        """The op's input checks, stated once (``bridge.core.checks`` vocabulary): the eager
        implementation runs them with :meth:`check`, the function body gets them as guards, the
        function tier reports a failed guard with the eager message. Replaces earlier checks.

        Example:
            >>> import torch, bridge
            >>> from bridge import checks
            >>> reg = bridge.Registry()
            >>> @bridge.op("demo::first", fake=lambda x, n: x.new_empty(n), registry=reg)
            ... def first(x: torch.Tensor, n: int) -> torch.Tensor:
            ...     first.check(x, n)
            ...     return x[:n].clone()
            >>> _ = first.register_checks(checks.rank("x", 1), checks.values_ge("x", 0))
            >>> first(torch.tensor([-1, 2]), 1)  # an index-like int tensor
            Traceback (most recent call last):
            ...
            bridge.core.checks.CheckError: opbridge: demo::first: input 'x' values must be >= 0. Got min -1. ...
        """
        found = Checks(self.qualname, checks)
        self._attach(checks=found)
        return found

    def check(self, *args, **kwargs) -> None:
        """Run the op's checks on a call (as the op takes it); raise ``bridge.core.checks.CheckError``
        naming the op and the input. No checks registered: nothing to do."""
        spec = self.spec
        if spec.checks is not None:
            spec.checks.run(**spec.bind(*args, **kwargs))

    def check_shapes(self, *args, **kwargs) -> None:
        """:meth:`check` without the checks that read tensor values (for fake kernels)."""
        spec = self.spec
        if spec.checks is not None:
            spec.checks.run_shapes(**spec.bind(*args, **kwargs))

    def register_function(self, function=None):
        """The model-local ONNX function body (an onnxscript function named like the op, in its domain),
        or a body builder: a Python function of (some of) the op's attributes, by name, returning the
        onnxscript function for those values (called at export per distinct set of values).

        Call form ``op.register_function(body)`` or decorator ``@op.register_function``.
        """
        warn_override(self.qualname, "function=")
        return self._piece("function", function)

    def register_reference(self, reference: Callable | None = None):
        """An independent implementation (a plain loop) parity and property tests compare against."""
        return self._piece("reference", reference)

    def register_samples(self, sample_inputs: Callable | None = None):
        """``sample_inputs(dtype) -> list[SampleInput]`` for opcheck, parity tables and native typing."""
        return self._piece("sample_inputs", sample_inputs)

    def _piece(self, field: str, value):
        """Attach ``value`` as ``field`` (call form), or return the decorator that does (``value`` None)."""
        def attach(fn):
            self._attach(**{field: fn})
            return fn
        return attach if value is None else attach(value)

    def register_native(self, source: str | os.PathLike) -> None:
        """The op's C++ kernel file for the native tier; a relative path is read against the folder
        of the calling module."""
        self._attach(native_source=resolve_native(source, _caller_folder(), self.qualname))


_WARNED: set[str] = set()  # ops whose override of torch.onnx's translation was warned about


def warn_override(qualname: str, given: str) -> None:
    """Warn (once per op and process) where ``given`` (``function=``, ``translation=``) replaces the
    translation torch.onnx already has for ``qualname``."""
    existing = torchlib_translation(qualname)
    if existing is None or qualname in _WARNED:
        return
    _WARNED.add(qualname)
    warnings.warn(f"opbridge: {qualname}: {given} replaces torch.onnx's own translation of the op ({existing.name}, "
                  f"onnxscript torch_lib). Got {given} for an op torch.onnx translates. Drop {given} to reuse that "
                  "translation as the op's body.", stacklevel=3)


def with_checks(spec: OpSpec) -> OpSpec:
    """``spec`` once every name its checks read is a tensor input or an int/ints attribute (checked over
    a stub body with the op's signature; they become guard nodes where a body goes into a model)."""
    if spec.checks is None:
        return spec
    attr_types = {p.name: p.onnx_attribute_type for p in spec.attributes}
    tensors = [p.name for p in spec.tensors]
    stub = onnx.helper.make_function(spec.domain, spec.name, tensors, ["y"],
                                     [onnx.helper.make_node("Identity", tensors[:1], ["y"])],
                                     [onnx.helper.make_opsetid("", 20)], list(attr_types))
    for index, why in unreadable(stub, spec.checks, attr_types).items():
        raise OpBridgeError(f"{spec.qualname}: check {index} ({spec.checks.checks[index].kind}) reads a name the op "
                            f"does not have: {why} Fix the check list.")
    return spec


def torch_origin(qualname: str) -> str | None:
    """Where torch's op ``qualname`` comes from, or None when torch has no such op."""
    if not torch_compat.op_exists(qualname):
        return None
    opdef = torch_compat.custom_op_def(qualname)
    if opdef is not None:
        fn = torch_compat.python_impl(opdef)
        assert fn is not None  # a CustomOpDef keeps the function it was made from
        return (f"torch.library.custom_op in module {fn.__module__!r}, "
                f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}")
    return "defined in C++ (TORCH_LIBRARY, e.g. loaded with torch.ops.load_library) or with torch.library.define"


def resolve_overload(op: Any) -> torch_compat.OpOverload:
    """The torch OpOverload behind ``op``: ``"ns::name"`` (``"ns::name.overload"``),
    ``torch.ops.ns.name`` (``.default``), or a CustomOpDef."""
    if isinstance(op, BridgeOp):
        raise OpBridgeError(f"{op.qualname} is already bridged. Got its op object. Attach more pieces with "
                            "op.register_function(...), op.register_reference(...) and the like.")
    if (custom := torch_compat.overload_of(op)) is not None:  # torch.library.custom_op's CustomOpDef
        return custom
    if isinstance(op, torch_compat.OpOverloadPacket):
        op = op.default
    if isinstance(op, torch_compat.OpOverload):
        return op
    if isinstance(op, str):
        name, _, overload = op.partition(".")
        ns, short = validate_qualname(name)
        if not torch_compat.op_exists(name):
            raise OpBridgeError(f"torch has no op {name!r}. Got {op!r}. Import or load what defines it first "
                                "(the package, or torch.ops.load_library(path) for a C++ library).")
        packet = getattr(getattr(torch.ops, ns), short)
        if overload and overload not in packet.overloads():
            raise OpBridgeError(f"{name} has no overload {overload!r}. Got {op!r}. Use one of "
                                f"{packet.overloads()}.")
        return getattr(packet, overload or "default")
    raise OpBridgeError(f"bridge.register takes an op: 'ns::name', torch.ops.ns.name(.default) or a CustomOpDef. "
                        f"Got {type(op).__name__}. Pass the op itself.")


def _check_version(qualname: str, version: Any) -> None:
    if not isinstance(version, int) or version < 1:
        raise OpBridgeError(f"{qualname}: version must be an int >= 1. Got {version!r}. Use version=1.")


def _check_dtypes(op: Any, dtypes: Any) -> None:
    if isinstance(dtypes, (str, torch.dtype)) or not dtypes or not all(isinstance(d, torch.dtype) for d in dtypes):
        what = class_name(op) if isinstance(op, type) else str(op)
        raise OpBridgeError(f"{what}: dtypes must be a sequence of torch dtypes. Got {dtypes!r}. Pass e.g. "
                            "dtypes=(torch.float32, torch.float16).")


def _torchbind_target(op: Any) -> str | None:
    """``"ns::Class.method"`` when ``op`` names a method of a torchbind class, else None."""
    if not isinstance(op, str) or "." not in op:
        return None
    class_name = op.rpartition(".")[0]
    return op if "::" in class_name and class_schemas(class_name) else None


def register(
    op: Any,
    *,
    function=None,
    reference: Callable | None = None,
    sample_inputs: Callable | None = None,
    native: str | os.PathLike | None = None,
    fake: Callable | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    domain: str | None = None,
    version: int = 1,
    torchbind: Sequence[str] = (),
    translation: Callable | None = None,
    names: dict[str, str] | None = None,
    attributes: Sequence[str] | None = None,
    checks: Sequence[Check] | None = None,
    name: str | None = None,
    symbolic: bool = True,
    registry: Registry | None = None,
) -> BridgeOp:
    """Bridge an op that already exists: another package's ``torch.library.custom_op``, a C++
    ``TORCH_LIBRARY`` op, an op whose only kernel is CompositeImplicitAutograd (C++ libraries using
    the old ``torch::RegisterOperators`` API, e.g. torch-scatter), or a method of a torchbind class
    (``"ns::Class.method"``). The schema is read from torch; the op's own kernel stays the eager
    truth (never redefined nor wrapped), its own fake/meta kernel is used (``fake=`` registers one
    only when it has none). Returns the op object, as :func:`op` does.

    A composite-only op given ``fake=``, a torchbind method, and an op given ``names=`` are bridged
    through a proxy op (``bridge.core.proxy``): export records the call as one node in the op's own
    domain and name, and eager calls outside export still run the op itself.
    ``names={"_0": "src", ...}`` renames arguments (C++-inferred schemas name them ``_0``, ``_1``,
    ...) for ONNX inputs, attributes and messages; an op's proxy keeps its names for the whole process
    (torch ops cannot be undefined), so registering the op again (another registry) with other
    ``names=`` is an error. The proxy's fake is the latest ``fake=`` given for the op: it serves every
    registry holding the op. A proxy calls the op's keyword-only arguments (and its fake's) by the
    op's own names.

    ``function=`` is an onnxscript function, or a Python function of (some of) the op's attributes
    returning one per set of attribute values (a body builder, called at export per distinct values).
    An op torch.onnx already translates (onnxscript's torch_lib, e.g. torchvision's ``nms``,
    ``roi_align``, ``deform_conv2d``) given neither ``function=`` nor ``translation=`` takes that
    translation as its body; giving either replaces it, with a warning (once per op) naming both.
    An op with a symbolic registered with ``torch.onnx.register_custom_op_symbolic`` is written as the node that
    symbolic writes, as ``torch.onnx.export(dynamo=False)`` wrote it (``bridge.core.registered``, with a warning
    once per op); ``symbolic=False`` writes the op's own node instead.
    A method's node is named ``Class_method`` in the class's namespace; its inputs are the
    method's tensors, its attributes the object's ``__obj_flatten__`` state (types from its schema,
    names from ``attributes=[...]``, the ``function=`` body's attributes, or else the object of the first export of
    a model holding one: ``PendingMethod`` until then); ``fake`` takes
    ``(*tensors, *state)``.

    Example:
        >>> import torch, bridge
        >>> lib = torch.library.Library("vendor_doc", "DEF")
        >>> _ = lib.define("scale(Tensor x, float s) -> Tensor")
        >>> lib.impl("scale", lambda x, s: x * s, "CPU")
        >>> reg = bridge.Registry()
        >>> scale = bridge.register("vendor_doc::scale", fake=lambda x, s: torch.empty_like(x), registry=reg)
        >>> [p.name for p in scale.spec.params], scale(torch.ones(2), 3.0).tolist()
        (['x', 's'], [3.0, 3.0])
        >>> _ = lib.define("shift(Tensor _0, int? _1) -> Tensor")
        >>> lib.impl("shift", lambda x, k: x + (k or 0), "CompositeImplicitAutograd")
        >>> shift = bridge.register("vendor_doc::shift", fake=lambda x, k: torch.empty_like(x),
        ...                         names={"_0": "x", "_1": "k"}, registry=reg)
        >>> [p.name for p in shift.spec.params], shift.spec.overload.name()
        (['x', 'k'], 'opbridge_proxy::vendor_doc__shift')
    """
    reg = REGISTRY if registry is None else registry
    _check_dtypes(op, dtypes)
    base = _caller_folder()
    if is_function_class(op):
        refused = {"domain": domain, "translation": translation, "names": names, "attributes": attributes,
                   "checks": checks, "torchbind": torchbind or None}
        given = sorted(k for k, v in refused.items() if v is not None)
        if given:
            raise OpBridgeError(f"{class_name(op)}: {', '.join(given)} do not apply to a torch.autograd.Function. Got "
                                f"{given}. Drop them: the node comes from its symbolic (or name=).")
        return _register_function(op, function=function, reference=reference, sample_inputs=sample_inputs,
                                  native=resolve_native(native, base, class_name(op)), fake=fake, dtypes=dtypes,
                                  version=version, name=name, use_symbolic=symbolic, registry=reg)
    if name is not None:
        raise OpBridgeError(f"bridge.register: name= applies to a torch.autograd.Function. Got it for {op!r}. Drop "
                            "it.")
    method = _torchbind_target(op)
    if method is not None:
        refuse_reserved(method, domain)
        _check_version(method, version)
        if torchbind:
            raise OpBridgeError(f"{method}: torchbind= lists methods an op stands for. Got it for a method. Drop it: "
                                "the method's node stands for itself.")
        return _register_method(method, function=function, reference=reference, sample_inputs=sample_inputs,
                                fake=fake, dtypes=dtypes, domain=domain, version=version, translation=translation,
                                names=names, attributes=attributes, native=resolve_native(native, base, method),
                                checks=checks, registry=reg)
    overload = resolve_overload(op)
    if torch_compat.overload_name(overload) != "default":
        raise OpBridgeError(f"{overload.name()}: only the default overload can be bridged. Got overload "
                            f"{torch_compat.overload_name(overload)!r}. Wrap it in a torch.library.custom_op with its "
                            "own name.")
    origin = registered_origin(overload) if symbolic else None
    if origin is not None:
        return _register_symbolic(origin, function=function, reference=reference, sample_inputs=sample_inputs,
                                  native=resolve_native(native, base, overload.name()), fake=fake, dtypes=dtypes,
                                  version=version, registry=reg,
                                  refused={"domain": domain, "translation": translation, "names": names,
                                           "attributes": attributes, "checks": checks, "torchbind": torchbind or None})
    qualname = overload.name()
    reg.check_free(qualname)
    refuse_reserved(qualname, domain)
    _check_version(qualname, version)
    for what, value in (("function=", function), ("translation=", translation)):
        if value is not None:
            warn_override(qualname, what)
    if attributes is not None:
        raise OpBridgeError(f"{qualname}: attributes= names a torchbind object's state. Got it for an op. Drop it: "
                            "an op's attributes come from its schema.")
    custom = op if torch_compat.is_custom_op_def(op) else None
    target, origin = _torch_side(qualname, overload, custom, fake, names)
    signature = parse_params(qualname, torch_compat.schema_of(target if origin.proxied else overload))
    reg.add(_spec(qualname, target, signature, domain=domain or overload.namespace, version=version,
                  function=function, reference=reference, sample_inputs=sample_inputs, dtypes=dtypes,
                  translation=translation, checks=checks, doc=origin.describe(qualname),
                  torchbind=tuple(torchbind), origin=origin,
                  native_source=resolve_native(native, base, qualname)))
    return BridgeOp(qualname, reg, custom)


def _spec(qualname: str, custom_op: Any, signature: tuple, *, domain: str, version: int, function, reference,
          sample_inputs, dtypes: Sequence[torch.dtype], translation, checks, doc: str, **identity: Any) -> OpSpec:
    """The one place an ``OpSpec`` is built (``op``, ``register`` and torchbind methods): the torch
    side (``custom_op``, ``signature`` = parsed params and output count) and the op's pieces, its
    checks validated (:func:`with_checks`); ``identity`` holds the optional fields (proxy, ONNX name, ...)."""
    params, n_out = signature
    checks = checks if checks is None or isinstance(checks, Checks) else Checks(qualname, checks)
    return with_checks(OpSpec(qualname=qualname, custom_op=custom_op, params=params, num_outputs=n_out, domain=domain,
                              version=version, function=function, reference=reference, sample_inputs=sample_inputs,
                              dtypes=tuple(dtypes), doc=doc, custom_translation=translation, checks=checks,
                              **identity))


def _torch_side(qualname: str, overload, custom, fake: Callable | None, names: dict[str, str] | None) -> tuple:
    """(the op export records, its origin: ``Proxied`` when that is a proxy): the fake registered or checked,
    a proxy op defined where torch cannot keep the op opaque or ``names=`` renames it."""
    target = custom if custom is not None else overload
    composite = custom is None and is_composite_only(overload)
    if composite and fake is not None:
        # NOTE: torch refuses a fake for a composite-only op and export traces into its (C++)
        # code; a proxy op carries the fake and export records the call through it.
        return define_op_proxy(overload, fake, names), Proxied(op=overload)
    if composite and names:
        raise OpBridgeError(f"{qualname}: names= renames through a proxy op, which a composite-only op gets with its "
                            "fake. Got names= without fake=. Pass fake= as well.")
    if fake is not None:
        if has_fake_kernel(target):
            raise OpBridgeError(f"{qualname} already has a fake (meta) kernel. Got fake= as well. Drop fake=: "
                                "the op's own one is used.")
        torch.library.register_fake(qualname, fake)
    elif not has_fake_kernel(target):
        raise OpBridgeError(f"{qualname} has no fake (meta) kernel, which export and shape inference need. Got "
                            f"none. Pass fake= to bridge.register, or call torch.library.register_fake({qualname!r}).")
    if names:
        # NOTE: readable names for an op with kernels of its own: a proxy whose fake is the op's own
        return define_op_proxy(overload, overload, names), Proxied(op=overload)
    return target, Existing()


def _register_function(cls: type, *, function, reference, sample_inputs, native, fake, dtypes, version, name,
                       use_symbolic: bool, registry: Registry, call: tuple[tuple, dict] | None = None) -> BridgeOp:
    """``register`` for a ``torch.autograd.Function`` subclass (``bridge.core.functions``). A Function whose
    node only a call tells (``NeedsCall``: no annotation, default or sample says an argument's kind, or
    symbolic computes with a value) is deferred: the first call in an export describes it (:func:`described`,
    ``call``: that call's arguments)."""
    if name is not None:
        validate_qualname(name)
    taken = registry.for_function(cls)
    if taken is not None or (call is None and cls in registry.deferred):
        raise OpBridgeError(f"{class_name(cls)} is already registered{f' (as {taken.qualname})' if taken else ''}. "
                            "Got a second bridge.register. Register it once.")
    first = call
    if sample_inputs is not None:
        samples = sample_inputs(tuple(dtypes)[0])
        first = (tuple(samples[0].args), dict(samples[0].kwargs)) if samples else None
    try:
        fb = dataclasses.replace(describe(cls, name=name, use_symbolic=use_symbolic, sample=first), fake=fake)
    except NeedsCall:
        if first is not None:
            raise
        registry.deferred[cls] = dict(function=function, reference=reference, sample_inputs=sample_inputs,
                                      native=native, fake=fake, dtypes=dtypes, version=version, name=name,
                                      use_symbolic=use_symbolic)
        return PendingFunction(cls, registry)
    registry.check_free(fb.qualname)
    refuse_reserved(fb.qualname, fb.domain)
    _check_version(fb.qualname, version)
    if fb.body is not None and function is not None:
        raise OpBridgeError(f"{class_name(cls)}: its symbolic writes standard ONNX ops, which are its body. Got "
                            "function= as well. Drop one (symbolic=False ignores the symbolic).")
    registry.add(_function_spec(fb, version=version, function=fb.body or function, reference=reference,
                                sample_inputs=sample_inputs, dtypes=dtypes, native=native))
    return BridgeOp(fb.qualname, registry)


# -- an op with a symbolic registered with torch.onnx.register_custom_op_symbolic (bridge.core.registered) ------

def _register_symbolic(origin: RegisteredSymbolic, *, function, reference, sample_inputs, native, fake, dtypes,
                       version, registry: Registry, refused: dict) -> BridgeOp:
    """``register`` for an op with a registered symbolic: the Function standing for its call
    (``registered.function_class``) registered as a Function is; described at the op's first call in an export
    where a non-tensor argument has no default (that call gives it one) and no sample says it."""
    given = sorted(k for k, v in refused.items() if v is not None)
    if given:
        raise OpBridgeError(f"{origin.qualname}: {', '.join(given)} do not apply to an op whose node its registered "
                            f"symbolic ({origin.symbolic_name}) writes. Got {given}. Drop them, or pass "
                            "symbolic=False to bridge the op without its symbolic.")
    cls = function_class(origin)
    warn_used(origin)
    samples = None if sample_inputs is None else keyword_samples(origin, sample_inputs)
    options: dict[str, Any] = dict(function=function, reference=reference, sample_inputs=samples, native=native,
                                   fake=fake or caller(origin.op, origin.op), dtypes=dtypes, version=version,
                                   name=None, use_symbolic=True)
    if needs_call(cls):
        if samples is None:
            if cls in registry.deferred or registry.for_function(cls) is not None:
                raise OpBridgeError(f"{origin.qualname} is already registered. Got a second bridge.register. "
                                    "Register it once.")
            call_defaults(cls, {})  # NOTE: the first call in an export gives them (exporters.export)
            registry.deferred[cls] = options
            return PendingFunction(cls, registry)
        first = samples(tuple(dtypes)[0])
        call_defaults(cls, first[0].kwargs if first else {})
    return _register_function(cls, **options, registry=registry)


class PendingFunction(BridgeOp):
    """A Function registered before any call tells its node: its record exists from its first call in an
    export on (:func:`described`)."""

    def __init__(self, cls: type, registry: Registry):
        super().__init__("", registry)
        self.cls = cls

    @property
    def spec(self) -> OpSpec:
        found = self._registry.for_function(self.cls)
        if found is None:
            raise OpBridgeError(f"{class_name(self.cls)}: its node is described at its first call in an export. Got "
                                "no export of a model calling it yet. Export one (bridge.export), or register it "
                                "with sample_inputs=.")
        self.qualname = found.qualname
        return found


def described(cls: type, registry: Registry, args: Sequence, kwargs: dict) -> OpSpec | None:
    """The record of a deferred Function (``registry.deferred``), described from the call ``args, kwargs``
    (``apply``'s arguments); None where ``cls`` is not deferred."""
    options = registry.deferred.get(cls)
    if options is None:
        return None
    op = _register_function(cls, **options, registry=registry, call=(tuple(args), dict(kwargs)))
    del registry.deferred[cls]
    return op.spec


def _function_spec(fb, *, version: int, function, reference, sample_inputs, dtypes, native) -> OpSpec:
    """The record of a Function's node ``fb``: its proxy op and the user's pieces, written against ``apply``'s
    arguments (reference, samples), called with the node's."""
    proxy = define_proxy(fb)
    symbolic = origin_of(fb.cls)
    origin = FunctionClass(fb) if symbolic is None else RegisteredSymbolicOp(fb, symbolic)
    return _spec(fb.qualname, proxy, parse_params(fb.qualname, torch_compat.schema_of(proxy)), domain=fb.domain,
                 version=version, function=function,
                 reference=None if reference is None else _via_apply(fb, reference),
                 sample_inputs=None if sample_inputs is None else _samples_via_apply(fb, sample_inputs),
                 dtypes=dtypes, translation=None, checks=None,
                 doc=origin.describe(fb.qualname), origin=origin, onnx_name=fb.op_type,
                 native_source=native)


class FunctionCalls:
    """What a Function's ``forward`` records during one export (``functions.export_forward``): each call's
    node typed for its own values (``FunctionBridge.for_call``). A call that needs other attribute types
    than the registered record (a tuple where it said int, None, a float) retypes the record (a proxy op
    for the new signature); one export takes one signature per Function, as its kernels read one."""

    def __init__(self, registry: Registry, qualname: str):
        self.registry, self.qualname = registry, qualname
        self.schema: str | None = None  # the signature this export recorded
        self.outputs: int | None = None  # the output count this export recorded

    def __call__(self, values) -> tuple:
        spec = self.registry.get(self.qualname)
        fb = spec.origin.function
        assert fb is not None  # NOTE: FunctionCalls is made for a Function's record only
        node = fb.for_call(values)
        if self.outputs is not None and node.num_outputs != self.outputs:
            raise OpBridgeError(
                f"{class_name(fb.cls)}: its symbolic gives the {fb.qualname} node {self.outputs} output(s) at one call "
                f"of the model and {node.num_outputs} at another (it counts them from the call's values), and one "
                "node type has one output count for the kernels that serve it. Got the call "
                f"{ {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)} }. Pass the value that sets "
                "the count alike at every call of one model (take the outputs you need from each), or export the "
                "calls in separate models.")
        if self.schema is not None and node.schema != self.schema:
            raise OpBridgeError(
                f"{class_name(fb.cls)}: the model calls it with values of other types at two places, so its "
                f"{fb.qualname} nodes would need two attribute signatures, which one kernel cannot read. Got "
                f"{self.schema} and {node.schema}. Pass the same types at every call (say a tuple everywhere).")
        spec = _retyped(self.registry, spec, node)
        self.registry.settle(spec)
        self.schema, self.outputs = node.schema, node.num_outputs
        check_written(node, values)
        record_body(node, values)
        return node, spec.custom_op, specialisation_check(spec.qualname, spec.overload)


def _retyped(registry: Registry, spec: OpSpec, node) -> OpSpec:
    """``spec`` (a Function's record) for its node typed as ``node`` (a ``FunctionBridge``): the record itself
    where it is, else a new record (a proxy op for the new signature) in its place."""
    fb = spec.origin.function
    if node is fb or fb is None:
        return spec
    return registry.replace(_function_spec(
        node, version=spec.version, function=node.body or (None if fb.body is not None else spec.function),
        reference=getattr(spec.reference, "__wrapped__", None),
        sample_inputs=getattr(spec.sample_inputs, "__wrapped__", None), dtypes=spec.dtypes,
        native=spec.native_source))


def typed_as_written(registry: Registry, nodes: Iterable[onnx.NodeProto]) -> bool:
    """Each Function's record retyped as a file's ``nodes`` of it were written (``FunctionBridge.for_node``),
    as the export that wrote them retyped it for its calls: mmcv's ``_pair`` tuples where forward annotates int
    are INTS in the file, which a process that only registered the Function reads as INT; its ONNX schema is
    registered then (``Registry.settle``). Whether a record changed. A file whose nodes of one Function need two
    signatures is refused, as export refuses the calls."""
    typed: dict[str, tuple[str, onnx.NodeProto]] = {}
    changed = False
    for n in nodes:
        spec = registry.find(n.domain, n.op_type)
        fb = None if spec is None else spec.origin.function
        if spec is None or fb is None:
            continue
        node = fb.for_node({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}, len(n.output))
        first = typed.setdefault(spec.qualname, (node.schema, n))
        if first[0] != node.schema:
            raise OpBridgeError(
                f"{class_name(fb.cls)}: nodes {first[1].name!r} and {n.name!r} of {fb.qualname} carry attributes of "
                f"other types, which one kernel cannot read. Got {first[0]} and {node.schema}. Export the model "
                "again (one export writes one signature per Function).")
        retyped = _retyped(registry, spec, node)
        registry.settle(retyped)
        changed = retyped is not spec or changed
    return changed


def _via_apply(fb, fn: Callable) -> Callable:
    """``fn`` (written against ``apply``'s arguments) called with the node's (``__wrapped__``: ``fn``)."""
    @functools.wraps(fn)
    def via(*node_args):
        return fn(*fb.to_apply(node_args))
    return via


def _samples_via_apply(fb, sample_inputs: Callable) -> Callable:
    """``sample_inputs`` (calls of ``apply``) as calls of the node (``__wrapped__``: ``sample_inputs``)."""
    @functools.wraps(sample_inputs)
    def samples(dtype):
        return [SampleInput(tuple(fb.to_node(fb.bind(s.args, s.kwargs))), {}, s.name) for s in sample_inputs(dtype)]
    return samples


def _register_method(target: str, *, function, reference, sample_inputs, fake, dtypes, domain, version, translation,
                     names, attributes, native, checks, registry: Registry) -> BridgeOp:
    """``register`` for a torchbind method (see there)."""
    registry.check_free(target)
    class_name, _, method = target.rpartition(".")
    n_tensors = len(method_schema(target).arguments) - 1
    if attributes is None and hasattr(function, "to_function_proto"):
        attributes = function_signature(function)[3]
    if attributes is None:
        # NOTE: the state's names come from the object at export (described_method); its types, and whether it
        # has any (__obj_flatten__), from the class now
        state_types(class_name)
        if target in registry.deferred:
            raise OpBridgeError(f"{target} is already registered. Got a second bridge.register. Register it once.")
        registry.deferred[target] = dict(function=function, reference=reference, sample_inputs=sample_inputs,
                                         fake=fake, dtypes=dtypes, domain=domain, version=version,
                                         translation=translation, names=names, native=native, checks=checks)
        return PendingMethod(target, registry)
    attributes = list(attributes)
    cls = user_fake_class(class_name)
    if fake is None and cls is not None:
        def fake(*values):  # noqa: F811  the user's fake class answers for the method
            obj = cls.__obj_unflatten__(tuple(zip(attributes, values[n_tensors:])))
            return getattr(obj, method)(*values[:n_tensors])
    if fake is None:
        raise OpBridgeError(f"{target} needs a fake (meta) kernel for export. Got neither fake= nor a fake class. "
                            f"Pass fake=(tensors..., {', '.join(attributes)}) -> empty outputs.")
    origin = TorchbindMethod(target)
    proxy = define_method_proxy(target, attributes, fake, names)
    ensure_fake_class(class_name, method, proxy, attributes)
    ns, _, cls_name = class_name.partition("::")
    registry.add(_spec(target, proxy, parse_params(target, torch_compat.schema_of(proxy)), domain=domain or ns,
                       version=version, function=function, reference=reference, sample_inputs=sample_inputs,
                       dtypes=dtypes, translation=translation, checks=checks,
                       doc=origin.describe(target), onnx_name=f"{cls_name}_{method}",
                       torchbind=(target,), origin=origin, native_source=native))
    return BridgeOp(target, registry)


class PendingMethod(BridgeOp):
    """A torchbind method registered without the names of its object's state: its record exists from the first
    export of a model holding such an object on (:func:`described_method`)."""

    @property
    def spec(self) -> OpSpec:
        if self.qualname in self._registry.deferred:
            raise OpBridgeError(f"{self.qualname}: the names of the object's state (its node's attributes) are read "
                                "from the object at export. Got no export of a model holding one yet. Export one "
                                "(bridge.export), or register it with attributes=[...].")
        return self._registry.get(self.qualname)


def described_method(target: str, obj: Any, registry: Registry) -> OpSpec | None:
    """The record of a torchbind method registered without ``attributes=`` (``registry.deferred``), its state's
    names read from ``obj`` (an object of its class: ``__obj_flatten__()``'s names, in order); None where
    ``target`` is not deferred."""
    options = registry.deferred.get(target)
    if options is None:
        return None
    try:
        flat = obj.__obj_flatten__()
    except Exception as e:  # noqa: BLE001  a C++ class without the method: torch's own error, named once
        raise OpBridgeError(f"{target}: the object has no __obj_flatten__, which names its state (the node's "
                            f"attributes). Got {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}. "
                            "Define __obj_flatten__ returning ((name, value), ...) in C++, or pass "
                            "attributes=[...] to bridge.register.") from None
    op = _register_method(target, **options, attributes=[name for name, _ in flat], registry=registry)
    del registry.deferred[target]
    return op.spec


def op(
    qualname: str,
    *,
    mutates_args: Iterable[str] | str = (),
    fake: Callable | None = None,
    backward: Callable | None = None,
    setup_context: Callable | None = None,
    function=None,
    reference: Callable | None = None,
    sample_inputs: Callable | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    domain: str | None = None,
    version: int = 1,
    translation: Callable | None = None,
    device_types: str | Sequence[str] | None = None,
    torchbind: Sequence[str] = (),
    native: str | os.PathLike | None = None,
    checks: Sequence[Check] | None = None,
    registry: Registry | None = None,
):
    """Declare a custom op once; the torch op, ONNX schema and translation follow from it.

    Wraps :func:`torch.library.custom_op` and returns a :class:`BridgeOp` (call it like the
    function). The keyword pieces are shortcuts for the op object's ``register_*`` methods:
    ``function`` is an onnxscript function in ``Opset(domain, version)`` with the op's name, used
    as the model-local ONNX-function kernel; ``native`` a C++ kernel file, relative to the
    declaring module's folder; ``checks`` the op's input checks (``bridge.core.checks`` vocabulary),
    stated once for every tier: the implementation runs them with ``op.check(...)``, the function
    body carries them as guards.

    Example:
        >>> import torch, bridge
        >>> reg = bridge.Registry()
        >>> @bridge.op("demo::twice", fake=lambda x: torch.empty_like(x), registry=reg)
        ... def twice(x: torch.Tensor) -> torch.Tensor:
        ...     return x * 2
        >>> twice(torch.ones(2)).tolist()
        [2.0, 2.0]
        >>> spec = reg.get("demo::twice"); (spec.domain, spec.version, [p.name for p in spec.tensors])
        ('demo', 1, ['x'])
    """
    ns, _ = validate_qualname(qualname)
    refuse_reserved(qualname, domain)
    reg = REGISTRY if registry is None else registry
    reg.check_free(qualname)  # before torch defines anything
    origin = torch_origin(qualname)
    if origin is not None:
        raise OpBridgeError(f"torch already has op {qualname} ({origin}). Got a second definition, which would "
                            f"replace or shadow it. Bridge the existing op instead: bridge.register({qualname!r}, "
                            "function=..., reference=..., sample_inputs=...).")
    _check_version(qualname, version)
    _check_dtypes(qualname, dtypes)
    if backward is None and setup_context is not None:
        raise OpBridgeError(f"{qualname}: setup_context given without backward. Got only one. Pass both.")
    base = _caller_folder()

    def decorate(fn: Callable) -> BridgeOp:
        mutates = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)
        try:
            schema_str = torch.library.infer_schema(fn, mutates_args=mutates)
        except ValueError as e:
            raise OpBridgeError(
                f"{qualname}: torch reads the op's schema from the function's type annotations, and could not. Got: "
                f"{str(e).removeprefix('infer_schema(func): ')[:300]} Annotate every parameter and the return as "
                "torch.library.custom_op reads them (x: torch.Tensor, k: float, ...) -> torch.Tensor.") from e
        signature = parse_params(qualname, torch_compat.parse_schema(qualname + schema_str))
        source = resolve_native(native, _folder_of(fn.__code__.co_filename) or base, qualname)
        custom = torch.library.custom_op(qualname, fn, mutates_args=mutates, device_types=device_types)
        if fake is not None:
            custom.register_fake(fake)
        if backward is not None:
            custom.register_autograd(backward, setup_context=setup_context)
        try:
            reg.add(_spec(qualname, custom, signature, domain=domain or ns, version=version, function=function,
                          reference=reference, sample_inputs=sample_inputs, dtypes=dtypes, translation=translation,
                          checks=checks, doc=(inspect.getdoc(fn) or "").split("\n\n")[0], torchbind=tuple(torchbind),
                          native_source=source))
        except BaseException:  # NOTE: any failure (onnx's too): leave torch as it was, the declaration failed whole
            torch_compat.destroy_custom_op(custom)
            raise
        return BridgeOp(qualname, reg, custom)

    return decorate
