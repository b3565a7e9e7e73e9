"""The op registry and the ``@bridge.op`` declaration."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence

import onnx
import torch
from onnx import defs

from bridge.errors import OpBridgeError
from bridge.spec import OpSpec, function_signature, parse_params, validate_qualname

# NOTE: what each tier needs from an op; `check_complete` reports from this table.
PIECES = ("fake", "reference", "sample_inputs", "function")


class Registry:
    """All ops the bridge knows, by qualified name. Records are frozen and validated on entry.

    Example:
        >>> reg = Registry()
        >>> len(reg)
        0
        >>> reg.get("nope::op")
        Traceback (most recent call last):
        ...
        bridge.errors.OpBridgeError: opbridge: op 'nope::op' is not registered. Got 'nope::op'. ...
    """

    def __init__(self) -> None:
        self._ops: dict[str, OpSpec] = {}
        self._twins: dict[str, OpSpec] = {}  # functional twins of mutating ops, by the op's qualname

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
                "Declare it with @bridge.op or import the module that does."
            ) from None

    def exportable(self) -> list[OpSpec]:
        """Specs that become ONNX nodes: functional ops, and the functional twins of mutating ones."""
        return sorted([s for s in self._ops.values() if not s.mutated] + list(self._twins.values()),
                      key=lambda s: s.qualname)

    def functional(self, spec: OpSpec) -> OpSpec:
        """The spec that stands for ``spec`` in ONNX: itself, or its functional twin if it mutates."""
        return self._twins[spec.qualname] if spec.mutated else spec

    def find(self, domain: str, op_type: str) -> OpSpec | None:
        """The spec an ONNX node (domain, op_type) came from, if any."""
        for spec in self.exportable():
            if spec.domain == domain and spec.name == op_type:
                return spec
        return None

    def for_torchbind(self, class_name: str, method: str) -> OpSpec | None:
        """The op standing for ``class_name.method`` (class as ``ns::Class``), if declared."""
        wanted = f"{class_name}.{method}"
        return next((s for s in self._ops.values() if wanted in s.torchbind), None)

    def for_overload(self, overload) -> OpSpec | None:
        """The spec of a torch OpOverload (a declared op or a functional twin), if registered."""
        name = overload.name().split(".")[0] if hasattr(overload, "name") else None
        return self._ops.get(name) or next((t for t in self._twins.values() if t.qualname == name), None)

    def check_free(self, qualname: str) -> None:
        """Raise if ``qualname`` is taken: a second declaration is an error, not an override."""
        if qualname in self._ops:
            raise OpBridgeError(
                f"op {qualname!r} is already registered. Got a second declaration. "
                "Give the new op another name, or remove the first declaration."
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
        _validate_translation(spec)
        onnx_spec = spec
        if spec.mutated:
            from bridge.functional import make_functional_twin

            onnx_spec = make_functional_twin(spec)
        try:
            _validate_function(onnx_spec)
        except OpBridgeError:
            if onnx_spec is not spec:
                onnx_spec.custom_op._lib._destroy()  # the twin goes with the failed declaration
            raise
        _register_onnx_schema(onnx_spec)
        self._ops[spec.qualname] = spec
        if spec.mutated:
            self._twins[spec.qualname] = onnx_spec
        return spec

    def remove(self, qualname: str) -> None:
        """Forget an op (tests use this); its ONNX schema is deregistered too."""
        spec = self._twins.pop(qualname, None) or self._ops[qualname]
        self._ops.pop(qualname)
        if defs.has(spec.name, spec.version, spec.domain):
            defs.deregister_schema(spec.name, spec.version, spec.domain)

    def missing(self, spec: OpSpec) -> list[str]:
        """What ``spec`` still lacks, as short phrases (empty when complete)."""
        gaps = []
        if not spec.has_fake:
            gaps.append("fake kernel (register_fake / fake=): export and shape inference need it")
        if spec.reference is None:
            gaps.append("reference implementation (reference=): parity tests need an independent result")
        if spec.sample_inputs is None:
            gaps.append("sample inputs (sample_inputs=): opcheck and parity tables need them")
        if spec.function is None:
            gaps.append("function body (function=): the portable ONNX-function tier needs it")
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

    def translation_table(self) -> dict:
        """``{OpOverload: translation}`` for ``torch.onnx.export(custom_translation_table=...)``."""
        return {s.overload: s.translation for s in self.exportable()}


def _validate_translation(spec: OpSpec) -> None:
    if spec.custom_translation is None:
        return
    got = list(inspect.signature(spec.custom_translation).parameters)
    want = [p.name for p in spec.params]
    if got != want:
        raise OpBridgeError(
            f"{spec.qualname}: translation parameters must mirror the op schema. "
            f"Got {got}. Use {want}."
        )


def _validate_function(spec: OpSpec) -> None:
    if spec.function is None:
        return
    domain, name, inputs, attrs, n_out = function_signature(spec.function)
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


def _register_onnx_schema(spec: OpSpec) -> None:
    # NOTE: registered so onnx.checker(full_check=True) and shape inference know the node;
    # the inference function keeps `optimize=True` from erasing the output type.
    if defs.has(spec.name, spec.version, spec.domain):
        defs.deregister_schema(spec.name, spec.version, spec.domain)
    defs.register_schema(spec.onnx_schema)


REGISTRY = Registry()


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
    native: str | None = None,
    registry: Registry | None = None,
):
    """Declare a custom op once; the torch op, ONNX schema and translation follow from it.

    Wraps :func:`torch.library.custom_op` and returns its ``CustomOpDef`` (call it like the
    function). ``function`` is an onnxscript function in ``Opset(domain, version)`` with the
    op's name, used as the model-local ONNX-function kernel.

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
    reg = REGISTRY if registry is None else registry
    reg.check_free(qualname)  # before torch defines anything
    if not isinstance(version, int) or version < 1:
        raise OpBridgeError(f"{qualname}: version must be an int >= 1. Got {version!r}. Use version=1.")
    if (backward is None) != (setup_context is None) and backward is None:
        raise OpBridgeError(f"{qualname}: setup_context given without backward. Got only one. Pass both.")

    def decorate(fn: Callable):
        mutates = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)
        schema_str = torch.library.infer_schema(fn, mutates_args=mutates)
        params, n_out = parse_params(qualname, torch._C.parse_schema(qualname + schema_str))
        custom = torch.library.custom_op(qualname, fn, mutates_args=mutates, device_types=device_types)
        if fake is not None:
            custom.register_fake(fake)
        if backward is not None:
            custom.register_autograd(backward, setup_context=setup_context)
        spec = OpSpec(
            qualname=qualname, custom_op=custom, params=params, num_outputs=n_out,
            domain=domain or ns, version=version, function=function, reference=reference,
            sample_inputs=sample_inputs, dtypes=tuple(dtypes),
            doc=(inspect.getdoc(fn) or "").split("\n\n")[0], custom_translation=translation,
            torchbind=tuple(torchbind), native_source=None if native is None else str(native),
        )
        try:
            reg.add(spec)
        except OpBridgeError:
            custom._lib._destroy()  # leave torch as it was: the declaration failed as a whole
            raise
        custom.spec = spec
        return custom

    return decorate


def onnx_custom_domains(model: onnx.ModelProto) -> set[str]:
    """Domains of a model's nodes that are not standard ONNX."""
    standard = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"}
    return {n.domain for n in model.graph.node if n.domain not in standard}
