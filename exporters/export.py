"""``bridge.export``: torch.export -> checks -> torch.onnx (dynamo) -> function bodies -> checker."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import operator
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import torch

from bridge.core.basics import files, torch_compat
from bridge.core.basics.domains import ONNX_DOMAINS
from bridge.core.basics.dtypes import torch_dtype
from bridge.core.basics.errors import BRIDGE_FOLDER, OpBridgeError, raised_at
from bridge.core.basics.graphs import (
    custom_nodes,
    fold_function_type_probes,
    ir_custom_nodes,
    model_tensor_constants,
    model_value_types,
    random_nodes,
)
from bridge.core.basics.progress import step
from bridge.core.functions import (
    Declined,
    FunctionBridge,
    class_name,
    classes_made,
    constant_body,
    dispatched,
    export_forward,
    function_classes,
    swap_forwards,
    symbolic_name,
    symbolic_of,
)
from bridge.core.opdef import FunctionCalls, described, described_method, register
from bridge.core.proxy import proxy_name, redirect, specialisation_check
from bridge.core.registered import (
    call_defaults,
    function_class,
    op_calls,
    origin_of,
    registered_origin,
    unused_aten_symbolic,
)
from bridge.core.registry import REGISTRY, Registry, fill_attributes
from exporters.bodies.opsets import convert_model
from exporters.bodies.translation import symbolic_attribute_error, translation_table
from exporters.derive.derivation import last_failure
from exporters.derive.sites import floored_sites
from exporters.derive.tracing import onnx_program, program_calls
from exporters.fakes import check_fake
from exporters.inline import inline_functions
from exporters.names import (
    call_args,
    check_dynamic_shapes,
    check_model_call,
    check_torch_onnx_options,
    dim_floors,
    dim_names,
    name_custom_outputs,
    name_graph_io,
    name_proxy_outputs,
    rename_dims,
    shapes_from_axes,
    snake_case,
    weights_as_inputs,
)
from exporters.portable import relativize_paths, stamp_ir_version
from exporters.resolve import attach_functions_ir
from exporters.rewrites import functionalize_mutations, is_auto_functionalized, torchbind_to_ops

# NOTE: torch.onnx warns about every absent torchvision op when it builds its registry.
logging.getLogger(torch_compat.ONNX_REGISTRY_LOGGER).setLevel(logging.ERROR)

DEFAULT_OPSET = 20
TORCH_MIN_OPSET = 18  # NOTE: below it, torch.onnx writes 18 and the bridge converts (exporters.bodies.opsets)
# NOTE: namespaces torch.onnx translates by itself; any other op must come from the registry.
# NOTE: onnx_symbolic: torch.onnx.ops.symbolic's nodes, which torch.onnx writes as the ONNX node they name
_TORCH_NAMESPACES = {"aten", "prim", "prims", "_operator", "math", "higher_order", "torchvision", "onnx_symbolic"}


def _walk(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk(v)
    else:
        yield value


def check_program(program: torch.export.ExportedProgram, registry: Registry) -> None:
    """Raise OpBridgeError for unregistered custom ops and symbolic list/scalar attributes, in the
    graph and in every subgraph (torch.cond / map branches)."""
    aten = set()
    for node in program_calls(program):
        target = node.target
        if isinstance(target, torch_compat.OpOverload) and target.namespace == "aten":
            aten.add(target)
        if is_auto_functionalized(target):
            mutated = node.args[0].name() if node.args else target.name()
            raise OpBridgeError(
                f"the model calls mutating op {mutated}, whose export is not supported yet. "
                f"Got node {node.name}. Use a functional op (return the new tensor) for export."
            )
        if not isinstance(target, torch_compat.OpOverload) or target.namespace in _TORCH_NAMESPACES:
            continue
        spec = registry.for_overload(target)
        if spec is None:
            raise OpBridgeError(
                f"the model calls custom op {target.name()}, which opbridge has no record of. "
                f"Got node {node.name}. Bridge it with bridge.register({target.name()!r}, function=...) (or "
                "import the module that does), or declare a new op with @bridge.op, before exporting."
            )
        if spec.mutated:
            raise OpBridgeError(
                f"the model calls mutating op {spec.qualname} (writes {list(spec.mutated)}) after the "
                f"functional rewrite. Got node {node.name}. Keep exporters.rewrites.functionalize_mutations "
                "in `rewrites`."
            )
        check_fake(spec)  # NOTE: the file declares what the fake says: it must be what the op gives
        _check_unwritten(spec, node)
        bound = spec.bind(*node.args, **node.kwargs)
        for p in spec.attributes:
            if any(isinstance(v, torch.fx.Node) for v in _walk(bound[p.name])):
                shown = [v.meta.get("val", v) if isinstance(v, torch.fx.Node) else v
                         for v in _walk(bound[p.name])]
                raise symbolic_attribute_error(spec, p.name, shown)
    _warn_unused_symbolics(aten)


_WARNED_ATEN: set[str] = set()  # ATen ops whose registered symbolic was said to go unused, once per process


def _warn_unused_symbolics(ops: set) -> None:
    """Warn (once per op) where the model calls an ATen op a user registered a symbolic for: torch.onnx(dynamo)
    writes its own translation, where the TorchScript exporter wrote the symbolic's node."""
    for op in sorted(ops, key=str):
        symbolic = unused_aten_symbolic(op)
        if symbolic is not None and op.name() not in _WARNED_ATEN:
            _WARNED_ATEN.add(op.name())
            warnings.warn(
                f"opbridge: {op.name()} is written as torch.onnx's own translation, not the node of the symbolic "
                f"registered for it ({symbolic.__module__}.{symbolic.__qualname__}), which "
                "torch.onnx.export(dynamo=False) wrote. Got torch.onnx.register_custom_op_symbolic for an ATen op, "
                "which opbridge bridges for custom ops only. Call that node's op through a torch.autograd.Function "
                "whose symbolic writes it, and bridge.register the class.", stacklevel=4)


def _check_unwritten(spec, node: torch.fx.Node) -> None:
    """Refuse a model reading an output a Function's symbolic returns None for, as the TorchScript exporter did."""
    fb = spec.origin.function
    first = spec.num_outputs - (fb.unwritten if fb is not None else 0)
    read = sorted({i for u in node.users if u.target is operator.getitem and u.users
                   and isinstance(i := u.args[1], int) and i >= first})
    if read:
        assert fb is not None  # NOTE: only a Function's outputs go unwritten
        raise OpBridgeError(
            f"{symbolic_name(fb.cls)} returns None for output(s) {read} (conversion of that output is not "
            f"supported), but the model uses it. Got output {read[0]} read by the model. Leave that output unused, or "
            "return a value for it from the symbolic (torch.onnx.export(dynamo=False) refuses this too).")


def _ensure_opset_imports(model: ir.Model, registry: Registry) -> bool:
    missing = sorted({n.domain for n in ir_custom_nodes(model, functions=False)} - set(model.opset_imports))
    for domain in missing:
        model.opset_imports[domain] = max({s.version for s in registry if s.domain == domain} or {1})
    return bool(missing)


@dataclasses.dataclass
class ModelEdit(ir.passes.InPlacePass):
    """One of export's steps on torch.onnx's onnx-ir model as an onnx-ir pass: ``edit(model)`` edits the
    model in place and returns whether (truthy) it changed it."""

    edit: Callable[[ir.Model], Any]

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, bool(self.edit(model)))


def _check_opset(opset: Any) -> None:
    """Refuse, before any export runs, an opset_version no ONNX tool here can write.

    >>> _check_opset(99)
    Traceback (most recent call last):
    ...
    bridge.core.basics.errors.OpBridgeError: opbridge: opset_version must be an ONNX opset this onnx knows ...
    """
    highest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not 1 <= opset <= highest:
        raise OpBridgeError(f"opset_version must be an ONNX opset this onnx knows (1 to {highest}; opbridge "
                            f"tests 17 to 23). Got {opset!r}. Pass an int from 17 to 23 (the default is "
                            f"{DEFAULT_OPSET}).")


def _edited(onnx_program, opset: int, edits: Sequence[Callable[[ir.Model], object]]) -> onnx.ModelProto:
    """torch.onnx's onnx-ir model at ``opset`` after ``edits`` (each run as a :class:`ModelEdit`), as a proto."""
    converted = convert_model(onnx_program.model_proto, opset) if opset < TORCH_MIN_OPSET else None
    model = onnx_program.model if converted is None else ir.serde.deserialize_model(converted)
    if (got := model.opset_imports.get("")) != opset:
        way = "higher" if got is None or got > opset else "lower (17 to 23 are tested)"
        raise OpBridgeError(f"torch.onnx could not write the model at ONNX opset {opset}. Got opset {got}. "
                            f"Export at opset_version={got} or {way}.")
    for edit in edits:  # NOTE: not ir.passes.Sequential, which wraps every error (export's own) in a PassError
        ModelEdit(edit)(model)
    proto = ir.serde.serialize_model(model)
    if converted is not None:  # NOTE: onnx.version_converter writes no value_info for initializers; onnx-ir does
        untyped = {t.name for t in converted.graph.initializer} - {v.name for v in converted.graph.value_info}
        kept = [v for v in proto.graph.value_info if v.name not in untyped]
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(kept)
    return proto


def proxy_targets(registry: Registry) -> dict:
    """``{op: (what runs, argument check)}`` during torch.export: an op bridged through a proxy
    (bridge.core.proxy) goes to the proxy, one opaque node; every other registered op runs as it is. The
    check names the op and argument when an ``int`` gets a size marked dynamic."""
    return {op: (s.overload, specialisation_check(s.qualname, s.overload)) for s in registry
            if (op := s.origin.recorded(s.overload)) is not None}


def function_routes(registry: Registry) -> dict:
    """``{Function class: export forward}`` for each ``torch.autograd.Function`` the registry bridges
    (``bridge.core.functions``): during torch.export its call is recorded as the op's node. A Function
    registered before a call told its node (``registry.deferred``) is described at its first call."""
    routes = {fb.cls: _route(s, registry) for s in registry if (fb := s.origin.function) is not None}
    routes.update((cls, _first_call(cls, registry)) for cls in registry.deferred if isinstance(cls, type))
    return routes


def describe_methods(model, args: Sequence, kwargs: dict | None, registry: Registry) -> None:
    """Describe each torchbind method registered without its state's names (``registry.deferred``) from an
    object of its class that ``model`` holds (an attribute of one of its modules) or is called with."""
    waiting = [t for t in registry.deferred if isinstance(t, str)]
    if not waiting:
        return
    held = [v for m in (model.modules() if isinstance(model, torch.nn.Module) else ()) for v in vars(m).values()]
    for obj in held + torch_compat.pytree.tree_leaves((args, kwargs or {})):
        cls = torch_compat.script_object_class(obj)
        for target in waiting:
            if cls is not None and target.rpartition(".")[0] == cls:
                described_method(target, obj, registry)


def _first_call(cls: type, registry: Registry) -> Callable:
    route: list[Callable] = []

    def forward(*args, **kwargs):
        if not route:
            route.append(_route(described(cls, registry, args, kwargs), registry))
        return route[0](*args, **kwargs)
    return forward


def _route(spec, registry: Registry) -> Callable:
    return export_forward(FunctionCalls(registry, spec.qualname), _function(spec))


def _function(spec) -> FunctionBridge:
    fb = spec.origin.function
    assert fb is not None  # NOTE: asked of a Function's record only
    return fb


def symbolic_calls(registry: Registry, routes: dict[type, Callable]):
    """While active (around torch.export), each call of an op whose node a symbolic registered with
    ``torch.onnx.register_custom_op_symbolic`` writes (``bridge.core.registered``) is recorded as that node: an op
    the registry bridges that way goes to its Function's export forward (in ``routes``); an op the registry does not
    know is registered on the spot (with the warning naming it and its symbolic)."""
    classes = {origin.op: cls for cls in routes if (origin := origin_of(cls)) is not None}

    def reach(op) -> type | None:
        origin = registered_origin(op)
        if origin is None or registry.for_overload(op) is not None:
            return None
        cls = function_class(origin)
        if cls not in routes:
            bridged = register(op, registry=registry)
            routes[cls] = _first_call(cls, registry) if cls in registry.deferred else _route(bridged.spec, registry)
        return cls

    def before(cls: type, values: dict) -> None:
        if cls in registry.deferred:  # NOTE: the first call gives the arguments no default says a default
            call_defaults(cls, values)

    return op_calls(classes, routes, reach, before)


_WARNED_FUNCTIONS: set[type] = set()  # unregistered Functions whose symbolic was not used, warned once
_WARNED_LOCAL: set[str] = set()  # the same, for classes made during an export (named, a new class each call)


class _Watch:
    """What export does when it reaches a Function with a ``symbolic`` that the registry does not bridge:
    warn (once per Function and process) that the symbolic is not used, or register it
    (``register_functions=True``) and record the call as its node."""

    def __init__(self, registry: Registry, register_functions: bool):
        self.registry, self.register_functions = registry, register_functions
        self.registered: dict[type, Callable | None] = {}

    def __call__(self, cls: type, args: tuple, kwargs: dict) -> Callable | None:
        if cls in self.registered:
            return self.registered[cls]
        if dispatched(cls):
            self.registered[cls] = route = self._dispatched(cls, args, kwargs)
            return route
        if not self.register_functions:
            if cls not in _WARNED_FUNCTIONS:
                _WARNED_FUNCTIONS.add(cls)
                warnings.warn(f"opbridge: {class_name(cls)} has a symbolic, which torch.export does not use: its "
                              "forward is traced as plain torch code. Got an unregistered torch.autograd.Function. "
                              f"Call bridge.register({cls.__name__}) (or export with register_functions=True) to "
                              "export it as the node its symbolic writes.", stacklevel=2)
            return None
        self.registered[cls] = route = _route(register(cls, registry=self.registry).spec, self.registry)
        return route

    @staticmethod
    def made_in_export(classes: Sequence[type]) -> None:
        """Warn (once per class statement) of Functions with a symbolic whose class was made while tracing: a class
        statement inside the function calling it, traced as plain torch code, for no registration names it."""
        for cls in classes:
            local = "<locals>" in cls.__qualname__ and origin_of(cls) is None  # NOTE: not one opbridge made
            if local and symbolic_of(cls) is not None and class_name(cls) not in _WARNED_LOCAL:
                _WARNED_LOCAL.add(class_name(cls))
                warnings.warn(
                    f"opbridge: {class_name(cls)} has a symbolic, which is not used: its forward is traced as plain "
                    "torch code. Got a torch.autograd.Function class made during export (a class statement inside "
                    "the function that calls it, as mmdeploy's rewrites write them: a new class on each call, which "
                    "no registration names). Define the class at module level and call bridge.register on it.",
                    stacklevel=3)

    def _dispatched(self, cls: type, args: tuple, kwargs: dict) -> Callable | None:
        """A Function the symbolic registered for ``prim::PythonOp`` exports (as the TorchScript exporter did):
        registered (described from this call where it needs one), with a warning once; None (traced as plain
        torch code) where that symbolic passes it by."""
        try:
            op = register(cls, registry=self.registry)
            spec = described(cls, self.registry, args, kwargs) if cls in self.registry.deferred else op.spec
        except Declined:
            self.registry.deferred.pop(cls, None)
            return None
        if cls not in _WARNED_FUNCTIONS:
            _WARNED_FUNCTIONS.add(cls)
            warnings.warn(f"opbridge: {class_name(cls)} is exported as the node the symbolic registered with "
                          "torch.onnx.register_custom_op_symbolic('prim::PythonOp', ...) writes for it, as the "
                          "TorchScript exporter did; torch.onnx.export(dynamo=True) alone ignores that symbolic.",
                          stacklevel=2)
        return _route(spec, self.registry)


DEFAULT_REWRITES: tuple[Callable, ...] = (torchbind_to_ops, functionalize_mutations)


@dataclasses.dataclass
class Exported:
    """An export's ONNX model and the program torch.onnx translated into it: the rewritten
    ExportedProgram after torch.onnx's own decompositions. Each ONNX value computed from an FX node
    is named after that node (``pkg.torch.onnx.fx_node`` in the ONNX node's metadata says which),
    so running ``program`` node by node gives the eager value of every such ONNX value."""

    proto: onnx.ModelProto
    program: torch.export.ExportedProgram
    # the torch.autograd.Function classes whose symbolic's standard ops the file holds in their nodes' place
    symbolics: tuple[str, ...] = ()


def export(
    model: torch.nn.Module,
    args: Sequence,
    f: str | os.PathLike | None = None,
    *,
    kwargs: dict | None = None,
    dynamic_shapes=None,
    registry: Registry | None = None,
    functions: bool = True,
    opset_version: int = DEFAULT_OPSET,
    check: bool = True,
    rewrites: Sequence[Callable] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    inline: bool = False,
    register_functions: bool = False,
    dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None = None,
    **torch_onnx_options: Any,
) -> onnx.ModelProto:
    """Export ``model`` with every registered custom op; return (and write to ``f``) the ModelProto.

    Runs ``torch.export``, the graph rewrites (torchbind method calls -> ops with the object's
    state as attributes; mutating ops -> functional twins), then ``torch.onnx.export(dynamo=True)``
    with the registry's translation table, attaches model-local function bodies
    (``functions=True``) so plain ONNX Runtime runs the file, and validates with ``onnx.checker`` (full check). Small
    models are written as one file. Any ``opset_version`` from 17 up works: function bodies are
    converted to it. The file carries the lowest IR version it needs (opset <= 20: IR <= 9) and
    no absolute path of this machine (source locations are relative to their package).
    ``inline=True`` replaces every custom node by its body (standard ONNX only, for runtimes other
    than onnxruntime; see ``exporters.inline``). ``input_names``/``output_names`` rename the graph's
    inputs/outputs; dynamic dims take the names of their ``torch.export.Dim``; outputs of
    multi-output custom nodes are ``<op>_out<i>``. A ``torch.autograd.Function`` registered with
    ``bridge.register(Cls)`` is recorded as the node its ``symbolic`` writes; one reached unregistered
    that has a ``symbolic`` is traced through as torch does, with a warning (once per Function), or
    registered on the spot with ``register_functions=True`` (``bridge.core.functions``). A call written for
    ``torch.onnx.export`` passes as it is: ``args`` one tensor, ``dynamic_axes`` (it stands for ``dynamic_shapes``:
    ``exporters.names.shapes_from_axes``, one ``torch.export.Dim`` per dim name), and torch.onnx.export's other
    keywords (``exporters.names.TORCH_ONNX_KEYWORDS``: ``export_params=True``, ``do_constant_folding``, ...; a
    value asking for what bridge.export does not do is refused).

    Example:
        >>> import torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.identity_conv(x, 3) + 1
        >>> proto = bridge.export(M(), (torch.randn(1, 3, 4, 4),))
        >>> [n.op_type for n in proto.graph.node]
        ['identity_conv', 'Add']
    """
    return _export(model, args, f, kwargs=kwargs, dynamic_shapes=dynamic_shapes, registry=registry,
                   functions=functions, opset_version=opset_version, check=check, rewrites=rewrites,
                   input_names=input_names, output_names=output_names, inline=inline,
                   register_functions=register_functions, dynamic_axes=dynamic_axes,
                   torch_onnx_options=torch_onnx_options).proto


def export_with_program(model: torch.nn.Module, args: Sequence, f: str | os.PathLike | None = None,
                        **options: Any) -> Exported:
    """``export`` that also returns the program torch.onnx translated (see :class:`Exported`);
    ``options`` are :func:`export`'s keywords.

    Example:
        >>> import torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.relu(torch.ops.opbridge.identity_conv(x, 3))
        >>> out = export_with_program(M(), (torch.randn(1, 3, 4, 4),))
        >>> [n.name for n in out.program.graph.nodes if n.op == "call_function"]
        ['identity_conv', 'relu']
        >>> [n.output[0] for n in out.proto.graph.node]
        ['identity_conv', 'relu']
    """
    # NOTE: export's signature is the one list of keywords; bind() refuses any other
    bound = inspect.signature(export).bind(model, args, f, **options)
    bound.apply_defaults()
    return _export(**bound.arguments)


def _trace(model, args: tuple, kwargs, dynamic_shapes, narrowed: bool = False,
           deferred: bool = False) -> torch.export.ExportedProgram:
    """torch.export's program of the model; what it raises that the user can fix, as the fix. A constraint
    violation whose suggested fixes keep every marked dim dynamic is traced again with them (once), as
    torch.onnx.export(dynamo=True) does, with a warning (:func:`narrowed_shapes`); one no fix can state is traced
    again with deferred runtime asserts (``deferred``), as torch.onnx traces: a guard like ``b != 1``
    (``x[:, 2:4].reshape(b, ...)`` under backed_size_oblivious) becomes an assert, which the file drops."""
    try:
        return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False,
                                   prefer_deferred_runtime_asserts_over_guards=deferred)
    except RuntimeError as e:
        violation = constraint_violation(e, model, args, kwargs, dynamic_shapes)
        if violation is not None:
            fixed = None if narrowed else narrowed_shapes(e, dynamic_shapes)
            if fixed is not None:
                return _trace(model, args, kwargs, fixed, narrowed=True)
            if deferred or _SPECIALISED.search(str(e)) is not None:
                raise violation from e
            try:
                return _trace(model, args, kwargs, dynamic_shapes, narrowed, deferred=True)
            except OpBridgeError:
                raise violation from e
        missing = _NO_FAKE.search(str(e))
        if missing is not None:
            op = missing.group(1) or missing.group(2).replace(".", "::", 1)
            raise OpBridgeError(
                f"{op} has no fake kernel, which torch.export needs for the op's output shapes and dtypes. Got torch's "
                "'no fake impl registered'. Pass fake= to @bridge.op / bridge.register (a function of the op's "
                "arguments returning empty outputs, e.g. lambda x: torch.empty_like(x)), or give it one with "
                "op.register_fake(fn).") from e
        if str(getattr(e, "error_type", "")).endswith("INVALID_INPUT") and "dynamic_shapes" in str(e):
            raise OpBridgeError(
                f"dynamic_shapes does not fit the call. Got torch.export's: {str(e).splitlines()[0].rstrip('.')}. "
                "Give each tensor argument a {dim index: torch.export.Dim} (or a list with one entry per dim), "
                "None for an argument with no dynamic dim.") from e
        if "fake tensor in the exported program constant" in str(e):
            raise OpBridgeError(
                "torch.export cannot trace a value the model takes from a tensor's .data (pytorch-quantization's "
                "TensorQuantizer reads its amax buffer as self._amax.data): the value is cut from the graph, "
                f"and torch.export refuses it. Got: {str(e).splitlines()[0].rstrip('.')}. Read it with "
                ".detach() instead (newer TensorQuantizers do so under export).") from e
        if "data is not allocated" not in str(e):
            raise
        raise OpBridgeError(
            "torch.export traced into an op's own (C++) kernel, which reads tensor data that tracing does not "
            f"have. Got: {str(e).splitlines()[0].rstrip('.')}. Bridge that op with bridge.register('ns::name', "
            "fake=...): an op whose only kernel is CompositeImplicitAutograd (torch-scatter's, "
            "torch::RegisterOperators) then stays one node.") from e
    except OpBridgeError:
        raise
    except Exception as e:  # noqa: BLE001  the user's code failed under tracing: say where, once
        raise _traced_code_error(e) from e


# NOTE: torch's message for an op without a fake kernel (a custom_op's, or any overload's)
_NO_FAKE = re.compile(r"no fake impl registered for <(?:CustomOpDef\(([^)]+)\)|OpOverload\(op='([^']+)')")

# NOTE: frames of these folders are the tracer's and ours; the innermost other one is the user's code that raised
_TRACER_FOLDERS = (os.path.dirname(torch.__file__) + os.sep, BRIDGE_FOLDER,
                   os.path.dirname(os.path.abspath(__file__)) + os.sep, "<")


def _traced_code_error(e: Exception) -> OpBridgeError:
    """An error of the user's code (a fake kernel, the model's forward) as torch.export traced it: what raised
    it and where, not torch's 60 frames (the exception is the cause)."""
    line = (str(e).strip().splitlines() or [""])[0][:200]
    return OpBridgeError(
        f"torch.export could not trace the model: code it ran on fake tensors raised an error (each custom op runs "
        f"its fake kernel there, not its kernel). Got {type(e).__name__}: {line}{raised_at(e, _TRACER_FOLDERS)}. "
        "Fix that code: a fake computes its outputs' shapes and dtypes from its inputs' alone (try it on tensors "
        "made with device='meta').")


def _export(model, args, f, *, kwargs, dynamic_shapes, registry, functions, opset_version, check, rewrites,
            input_names, output_names, inline, register_functions, dynamic_axes, torch_onnx_options) -> Exported:
    reg = REGISTRY if registry is None else registry
    check_torch_onnx_options(torch_onnx_options)
    args = call_args(args)
    check_model_call(model, args, kwargs)
    if dynamic_axes is not None:
        if dynamic_shapes is not None:
            raise OpBridgeError("dynamic_axes and dynamic_shapes both given. Got both. Pass one (dynamic_shapes: "
                                "torch.export's form; dynamic_axes: torch.onnx.export's, turned into it).")
        dynamic_shapes = shapes_from_axes(model, args, kwargs, dynamic_axes, input_names, output_names)
    check_dynamic_shapes(model, args, kwargs, dynamic_shapes)
    _check_opset(opset_version)
    if f is not None:
        files.check_writable(f, what="model")  # NOTE: a path that cannot be written fails before the export
    describe_methods(model, args, kwargs, reg)
    watch = _Watch(reg, register_functions)
    routes = function_routes(reg)
    with step("torch.export"), redirect(proxy_targets(reg)), \
            swap_forwards(routes, watch, function_classes()), symbolic_calls(reg, routes), \
            torch_compat.traced_as_torch_onnx(), classes_made() as made:
        program = _trace(model, args, kwargs, dynamic_shapes)
    watch.made_in_export(made)
    for rewrite in DEFAULT_REWRITES if rewrites is None else rewrites:
        program = rewrite(program, reg)
    check_program(program, reg)
    with step("torch.onnx.export (dynamo)"):
        # NOTE: torch.onnx prints its own progress lines; they are noise next to ours.
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnx_program = to_onnx(program, reg, max(opset_version, TORCH_MIN_OPSET))
    assert onnx_program is not None and onnx_program.exported_program is not None  # dynamo=True sets both
    dims, ops = dim_names(program, model, args, kwargs, dynamic_shapes), None if functions else _inlined(reg)
    edits: list[Callable[[ir.Model], object]] = [
        lambda m: _ensure_opset_imports(m, reg),
        lambda m: fill_attributes(m, reg),  # NOTE: attributes explicit, whatever translation wrote the nodes
        name_custom_outputs,
        lambda m: name_proxy_outputs(m, _function_names(reg), proxy_name("fn", "")),
        lambda m: name_graph_io(m, input_names, output_names),
        lambda m: rename_dims(m, dims)]
    if torch_onnx_options.get("keep_initializers_as_inputs"):
        edits.append(weights_as_inputs)
    baked: set[str] = set()  # NOTE: symbolics that read a module's constants: written with their values first
    edits.append(lambda m: write_constant_reads(m, reg, baked))
    if functions or ops:  # NOTE: without functions, the bodies of the symbolics the file holds inlined
        edits.append(lambda m: attach_functions_ir(m, reg, ops=ops))  # written, built, translated or derived
    # NOTE: a derived body is checked at the sizes the model takes: not below the min of the user's Dims
    floors = dim_floors(program, model, args, kwargs, dynamic_shapes)
    with floored_sites(floors):
        proto = _edited(onnx_program, opset_version, edits)
    proto, symbolics = inline_symbolic_ops(proto, reg)
    symbolics = tuple(sorted(set(symbolics) | baked))
    relativize_paths(proto)  # NOTE: after the bodies: nothing in the file keeps this machine's paths
    model_tensor_constants(proto)  # NOTE: graph, subgraphs and bodies: every Constant a tensor (tools read that)
    if functions:  # NOTE: a body called at one set of input types takes the branches those types decide
        fold_function_type_probes(proto, model_value_types(onnx.shape_inference.infer_shapes(proto)))
    stamp_ir_version(proto)
    if inline:
        with floored_sites(floors):
            proto = inline_functions(proto, reg)  # runs the full check itself
    if check and not inline:
        with step("onnx.checker (full)"):
            onnx.checker.check_model(proto, full_check=True)
    warn_training_mode(model, proto)
    if functions and not inline:
        warn_missing_bodies(proto, reg)
    if f is not None:
        files.save_model(proto, f)  # NOTE: one file; only models past protobuf's 2 GiB get a .data file
    return Exported(proto, onnx_program.exported_program, symbolics)


def warn_missing_bodies(proto: onnx.ModelProto, registry: Registry) -> None:
    """Warn when the file holds a registered op's node without a function body: only a kernel library (the
    native or python tier) runs it; plain onnxruntime and other runtimes refuse the file."""
    local = {(f.domain, f.name, f.overload) for f in proto.functions}
    missing: dict[str, str] = {}
    for node in custom_nodes(proto, functions=True):
        spec = registry.find(node.domain, node.op_type)
        if spec is not None and (node.domain, node.op_type, node.overload) not in local:
            missing.setdefault(spec.qualname, last_failure(spec.qualname) or "no body")
    if missing:
        warnings.warn(f"opbridge: the file holds {', '.join(missing)} without a function body: only a kernel "
                      "library runs it (tier 'native' with its C++ kernel, or 'python'); plain onnxruntime and "
                      f"other runtimes refuse the file. Got {'; '.join(f'{q}: {w}' for q, w in missing.items())}. "
                      "Give the op a function= body (op.register_function) or make its implementation "
                      "traceable for a portable file.", stacklevel=4)


def _function_names(registry: Registry) -> dict[tuple[str, str], str]:
    """The name each Function's node gives its outputs: its op type (a standard-op symbolic's: its class's
    name), in snake case."""
    return {(s.domain, s.name): snake_case(fb.cls.__name__ if fb.inline else s.name)
            for s in registry if (fb := s.origin.function) is not None}


def _inlined(registry: Registry) -> set[tuple[str, str]]:
    """(domain, name) of the ops whose nodes the file holds as their bodies: standard-op symbolics registered
    without name= (``FunctionBridge.inline``)."""
    return {(s.domain, s.name) for s in registry if (fb := s.origin.function) is not None and fb.inline}


def inline_symbolic_ops(proto: onnx.ModelProto, registry: Registry) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``proto`` with each node of a standard-op symbolic registered without name= replaced by the standard
    ops its symbolic writes (its attached body), as the TorchScript exporter wrote them into the graph; and the
    Function classes whose symbolics were written so."""
    ops = _inlined(registry) & {(n.domain, n.op_type) for n in custom_nodes(proto)}
    if not ops:
        return proto, ()
    written = tuple(sorted(class_name(_function(s).cls) for s in registry if (s.domain, s.name) in ops))
    flat = onnx.inliner.inline_selected_functions(proto, [*ops], exclude=False)
    used = {(f.domain, f.name) for f in flat.functions}
    keep = [f for f in flat.functions if (f.domain, f.name) not in ops]
    del flat.functions[:]
    flat.functions.extend(keep)
    domains = {d for d, _ in ops} - {d for d, _ in used - ops} - {n.domain for n in custom_nodes(flat)}
    imports = [o for o in flat.opset_import if o.domain not in domains]
    del flat.opset_import[:]
    flat.opset_import.extend(imports)
    if any(_function(s).unwritten for s in registry if (s.domain, s.name) in ops):
        # NOTE: the placeholders of outputs a symbolic returned None for (nothing reads them: check_program)
        model = ir.from_proto(flat)
        ir.passes.common.RemoveUnusedNodesPass()(model)
        flat = ir.to_proto(model)
    return flat, written


def write_constant_reads(model: ir.Model, registry: Registry, written: set[str]) -> bool:
    """Each node of a standard-op symbolic that reads tensor arguments as constants (``FunctionBridge.constants``:
    pytorch-quantization's amax) replaced by the standard ops its symbolic writes for the values the model holds
    there (an initializer: a buffer, parameter or constant of the module; or a Constant node), as
    ``torch.onnx.export(dynamo=False)`` wrote them; refused where the model computes the value at run time. Adds
    the classes written so to ``written``; returns whether it changed the model."""
    readers = {(s.domain, s.name): fb for s in registry
               if (fb := s.origin.function) is not None and fb.inline and fb.constants}
    nodes = [n for n in ir_custom_nodes(model, functions=False) if (n.domain, n.op_type) in readers]
    if not nodes:
        return False
    for node in nodes:
        fb = readers[node.domain, node.op_type]
        body = constant_body(fb, _node_values(fb, node), model.opset_imports[""])
        for n in body.node:  # NOTE: custom nodes it writes besides (TensorRT's TRT_FP8QuantizeLinear) stay as written
            if n.domain not in ONNX_DOMAINS:
                model.opset_imports.setdefault(n.domain, 1)
        _write_in_place(node, body)
        written.add(class_name(fb.cls))
    left = {n.domain for n in ir_custom_nodes(model)}
    for domain in {n.domain for n in nodes} - left:
        model.opset_imports.pop(domain, None)
    return True


def _node_values(fb: FunctionBridge, node: ir.Node) -> dict[str, Any]:
    """What :func:`constant_body` reads for ``node``: its attributes' values, its constants' tensors and a
    typed graph input per other tensor input, by ``forward``'s argument name."""
    values: dict[str, Any] = {a.name: (node.attributes[a.name].value if a.name in node.attributes else None)
                              for a in fb.attrs}
    for (name, _), value in zip(fb.inputs, node.inputs):
        if value is None:
            values[name] = None
        elif name in fb.constants:
            values[name] = _known_tensor(fb, node, name, value)
        else:
            dims = None if value.shape is None else tuple(d if isinstance(d, int) else None for d in value.shape)
            values[name] = torch_compat.GraphInput(name, None if value.dtype is None else torch_dtype(value.dtype),
                                                   dims)
    return values


def _known_tensor(fb: FunctionBridge, node: ir.Node, name: str, value: ir.Value) -> torch.Tensor:
    """The value the model holds for ``node``'s input ``name`` (an initializer or a Constant's), or the refusal."""
    producer = value.producer()
    held = value.const_value
    if held is None and producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
        held = producer.attributes["value"].value
    if held is not None:
        return torch.from_numpy(held.numpy().copy())
    source = "a graph input" if producer is None else f"node {producer.name!r} ({producer.op_type})"
    raise OpBridgeError(
        f"{symbolic_name(fb.cls)} reads tensor argument '{name}' as a constant, and this call's '{name}' is not "
        "known at export: the model computes it at run time, where the TorchScript exporter had a constant. Got "
        f"'{name}' from {source} (value {value.name!r}). Keep it in a buffer, parameter or constant of the module "
        "(a calibrated TensorQuantizer's _amax, loaded with load_calib_amax()), or register the Function with "
        "name= and function= (a body reading it as an input).")


def _write_in_place(node: ir.Node, body: onnx.GraphProto) -> None:
    """``node`` replaced in its graph by ``body``'s nodes (its inputs named as the node's tensor arguments), each
    name prefixed with the node's first output's so none meets a name of the model."""
    graph = node.graph
    assert graph is not None  # NOTE: a node of the model's graphs
    inner = ir.serde.deserialize_graph(body)
    sources = dict(zip((v.name for v in inner.inputs), node.inputs))
    for v in list(inner.inputs):
        source = sources.get(v.name)
        assert source is not None  # NOTE: constant_body's graph inputs are the node's tensor inputs it was given
        ir.convenience.replace_all_uses_with(v, source)
    written, outputs = list(inner), list(inner.outputs)
    inner.outputs.clear()
    inner.remove(written)
    prefix = node.outputs[0].name or node.name or node.op_type
    for i, n in enumerate(written):
        n.name = f"{prefix}/{n.op_type}_{i}"
        for out in n.outputs:
            out.name = f"{prefix}/{out.name}"
    graph.insert_before(node, written)
    held = [v for v in node.inputs if v is not None and v.is_initializer()]
    for old, new in zip(node.outputs, outputs):
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        name, old.name = old.name, None
        new.name, new.type, new.shape = name, new.type or old.type, new.shape or old.shape
    graph.remove(node, safe=True)
    _drop_unused(graph, held)


def _drop_unused(graph: ir.Graph, initializers: Sequence[ir.Value]) -> None:
    """Each of ``initializers`` nothing reads any more removed (a value written into ops as a constant leaves
    the file with its last use)."""
    for v in initializers:
        if not v.uses() and v not in graph.outputs and v.name is not None and v.name in graph.initializers:
            graph.initializers.pop(v.name)


def to_onnx(program: torch.export.ExportedProgram, registry: Registry, opset: int):
    """``torch.onnx.export(program, dynamo=True, custom_translation_table=translation_table(registry))``
    at ``opset`` (an ONNXProgram), through the table of ATen translations built once per opset
    (``exporters.derive.tracing.onnx_program``)."""
    return onnx_program(program, opset, translation_table(registry))


def _dim_sites(model, args: Sequence, kwargs: dict | None, dynamic_shapes) -> dict[str, tuple[str, int]]:
    """``{Dim name: (input name, dim index)}`` of the dims ``dynamic_shapes`` marks (first use of each)."""
    try:
        names = list(inspect.signature(model.forward if isinstance(model, torch.nn.Module) else model).parameters)
    except (TypeError, ValueError):
        names = []
    if isinstance(dynamic_shapes, dict):
        entries = list(dynamic_shapes.items())
    elif isinstance(dynamic_shapes, (list, tuple)):
        entries = [(names[i] if i < len(names) else f"args[{i}]", spec) for i, spec in enumerate(dynamic_shapes)]
    else:
        entries = []
    sites: dict[str, tuple[str, int]] = {}
    for name, spec in entries:
        dims = spec.items() if isinstance(spec, dict) else enumerate(spec) if isinstance(spec, (list, tuple)) else ()
        for index, dim in dims:
            dim_name = getattr(dim, "__name__", None)
            if isinstance(index, int) and dim_name:
                sites.setdefault(dim_name, (name, index))
    return sites


_SPECIALISED = re.compile(r"You marked (\S+) as dynamic but your code specialized it to be a constant \((-?\d+)\)")
_SOURCE = re.compile(r"L\['(?:args'\]\[\d+\]\[)?'?(\w+)'?\]\.size\(\)\[(\d+)\]")
# NOTE: torch.export's own fixes, one per line under this heading (``n_feat = n_depth``: one Dim for both)
_SUGGESTED = re.compile(r"^Suggested fixes:\n((?:[ \t]+\S.*\n?)+)", re.M)


def _suggested_fixes(text: str) -> str:
    """torch.export's suggested fixes in ``text`` as one line (``ns = nb; n = 2*_n``); "" where there are none."""
    found = _SUGGESTED.search(text)
    return "; ".join(ln.strip() for ln in found.group(1).splitlines() if ln.strip())[:300] if found else ""


def narrowed_shapes(error: BaseException, dynamic_shapes):
    """``dynamic_shapes`` with torch.export's suggested fixes applied (sizes that must be equal share one Dim, a
    size the code needs even is ``2*Dim``, a least size is a Dim's min), as torch.onnx.export(dynamo=True) applies
    them, with a warning naming them; None where there are none, they cannot be applied, or they would make a dim
    marked dynamic static (the model fixes its size: refused, for the file would not take other sizes).

    Example:
        >>> class Scale(torch.nn.Module):
        ...     def forward(self, boxes, scores):
        ...         return boxes * scores[:, None]
        >>> nb, ns = torch.export.Dim("nb"), torch.export.Dim("ns")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     proto = export(Scale(), (torch.ones(5, 4), torch.ones(5)), dynamic_shapes=({0: nb}, {0: ns}))
        >>> [i.type.tensor_type.shape.dim[0].dim_param for i in proto.graph.input], str(caught[0].message)[:77]
        (['nb', 'nb'], 'opbridge: dynamic_shapes narrowed to what the model needs (ns = nb), as torch')
    """
    fixes = _suggested_fixes(str(error))
    if not fixes:
        return None
    try:
        fixed = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(
            getattr(error, "msg", str(error)), dynamic_shapes)
    except Exception:  # noqa: BLE001  fixes torch cannot apply itself: the violation stands
        return None
    before, after = torch_compat.pytree.tree_leaves(dynamic_shapes), torch_compat.pytree.tree_leaves(fixed)
    if len(before) != len(after) or any(isinstance(b, int) and not isinstance(a, int) for a, b in zip(before, after)):
        return None
    warnings.warn(f"opbridge: dynamic_shapes narrowed to what the model needs ({fixes}), as "
                  "torch.onnx.export(dynamo=True) narrows them: the file is exported for those sizes only (outside "
                  "them the model's code may compute otherwise). Got torch.export's constraint violation. Pass "
                  "dynamic_shapes with these fixes to export without this warning.", stacklevel=2)
    return fixed


def constraint_violation(error: BaseException, model, args: Sequence, kwargs: dict | None,
                         dynamic_shapes) -> OpBridgeError | None:
    """torch.export's constraint violation (a dim marked dynamic that the model's code fixes or
    restricts) as one line naming the input and dimension and the usual fix; None for other errors.

    Example:
        >>> class M(torch.nn.Module):
        ...     def forward(self, x, boxes):
        ...         return x[: len(boxes)] * 2    # len() makes the box count a Python int
        >>> n = torch.export.Dim("n")
        >>> try:
        ...     export(M(), (torch.ones(9), torch.ones(4, 5)), dynamic_shapes=(None, {0: n}))
        ... except OpBridgeError as e:
        ...     print(str(e)[:115])
        opbridge: torch.export could not keep dimension 0 of input 'boxes' (Dim n) dynamic: ...fixes it to 4...
    """
    text = str(error)
    if "Constraints violated" not in text and "CONSTRAINT_VIOLATION" not in str(getattr(error, "error_type", "")):
        return None
    found = _SPECIALISED.search(text)
    source = _SOURCE.search(text)
    sites = _dim_sites(model, args, kwargs, dynamic_shapes)
    dim = found.group(1) if found else next((d for d in sites if re.search(rf"\b{re.escape(d)}\b", text)), None)
    if dim in sites:
        where = f"dimension {sites[dim][1]} of input '{sites[dim][0]}' (Dim {dim})"
    elif source is not None:
        where = f"dimension {source.group(2)} of input '{source.group(1)}'"
    else:
        where = f"a dimension marked dynamic ({dim or 'see --verbose'})"
    line = next((ln.strip(" -") for ln in text.splitlines()[1:] if ln.strip(" -")), "")
    what = (f"the model's code fixes it to {found.group(2)}" if found
            else f"the model's code restricts it ({line[:200]})")
    fixes = _suggested_fixes(text)
    # NOTE: where torch.export suggests fixes (sizes that must be equal: one Dim object for both), they come first
    fix = (f"Apply torch.export's suggested fixes to dynamic_shapes ({fixes}: one Dim object where sizes "
           "must be equal), or look" if fixes else "Look")
    return OpBridgeError(
        f"torch.export could not keep {where} dynamic: {what}. Got a constraint violation from torch.export. "
        f"{fix} in the model for a len() of that input or an .item() turned into a size, and compute with "
        "tensor sizes (x.shape[0]) instead; state what holds with torch._check(...); or mark the dimension "
        "static (rerun with --verbose, or read the exception's __cause__, for torch's full trace).")


# NOTE: layers whose forward differs between train() and eval(). Exported in training mode, the file
# holds what torch.export traced: a Dropout becomes ONNX Dropout(training_mode=True), random on every
# run; a BatchNorm (torch 2.13) its running statistics, never updated; an InstanceNorm with running
# statistics the batch's own (tests/test_parity_exact.py measures the Dropout case).
_MODE_DEPENDENT = torch_compat.MODE_DEPENDENT_MODULES


def warn_training_mode(model: torch.nn.Module, proto: onnx.ModelProto) -> None:
    """Warn, truthfully, when the exported file draws random numbers (``proto``'s random nodes: a
    Dropout exported in training mode) or when layers that behave differently in training are in
    training mode."""
    layers = [f"{name or type(model).__name__} ({type(m).__name__})" for name, m in model.named_modules()
              if m.training and isinstance(m, _MODE_DEPENDENT)] if isinstance(model, torch.nn.Module) else []
    which = f"{', '.join(layers[:5])}{' ...' if len(layers) > 5 else ''}"
    drawn = random_nodes(proto)
    if drawn:
        nodes = ", ".join(f"{n.name or n.output[0]} ({n.op_type})" for n in drawn[:5])
        why = f", because {which} {'is' if len(layers) == 1 else 'are'} in training mode" if layers else ""
        warnings.warn(f"opbridge: the exported file draws random numbers on every run{why}: {nodes} "
                      "(a Dropout in training mode drops values at random). Got random ONNX nodes. Call "
                      "model.eval() before exporting for a deterministic file; bridge.check_parity refuses "
                      "this one.", stacklevel=3)
    elif layers:
        warnings.warn(f"opbridge: {which} {'is' if len(layers) == 1 else 'are'} in training mode: the file "
                      "computes what torch.export traced in that mode (not necessarily eval behaviour; it never "
                      "updates running statistics). Got "
                      "model.training layers. Call model.eval() before exporting.", stacklevel=3)
