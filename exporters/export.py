"""``bridge.export``: torch.export -> checks -> torch.onnx (dynamo) -> function bodies -> checker."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import warnings
from collections.abc import Callable, Sequence

import onnx
import torch

from bridge.domains import is_custom, is_onnx
from bridge.errors import OpBridgeError
from bridge.progress import step
from bridge.registry import REGISTRY, Registry
from exporters.rewrites import functionalize_mutations, torchbind_to_ops
from exporters.translation import symbolic_attribute_error, translation_table

# NOTE: torch.onnx warns about every absent torchvision op when it builds its registry.
logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)

DEFAULT_OPSET = 20
# NOTE: namespaces torch.onnx translates by itself; any other op must come from the registry.
_TORCH_NAMESPACES = {"aten", "prim", "prims", "_operator", "math", "higher_order", "torchvision"}
_SINGLE_FILE_LIMIT = 1 << 31  # protobuf's 2 GiB: past it the weights go to external data


def _walk(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk(v)
    else:
        yield value


def check_program(program: torch.export.ExportedProgram, registry: Registry) -> None:
    """Raise OpBridgeError for unregistered custom ops and symbolic list/scalar attributes."""
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator) and target.name().startswith("auto_functionalized"):
            mutated = node.args[0].name() if node.args else target.name()
            raise OpBridgeError(
                f"the model calls mutating op {mutated}, whose export is not supported yet. "
                f"Got node {node.name}. Use a functional op (return the new tensor) for export."
            )
        if not isinstance(target, torch._ops.OpOverload) or target.namespace in _TORCH_NAMESPACES:
            continue
        spec = registry.for_overload(target)
        if spec is None:
            raise OpBridgeError(
                f"the model calls custom op {target.name()}, which opbridge has no record of. "
                f"Got node {node.name}. Declare it with @bridge.op (or import the module that does) "
                "before exporting."
            )
        if spec.mutated:
            raise OpBridgeError(
                f"the model calls mutating op {spec.qualname} (writes {list(spec.mutated)}) after the "
                f"functional rewrite. Got node {node.name}. Keep exporters.rewrites.functionalize_mutations "
                "in `rewrites`."
            )
        bound = spec.bind(*node.args, **node.kwargs)
        for p in spec.attributes:
            if any(isinstance(v, torch.fx.Node) for v in _walk(bound[p.name])):
                shown = [v.meta.get("val", v) if isinstance(v, torch.fx.Node) else v
                         for v in _walk(bound[p.name])]
                raise symbolic_attribute_error(spec, p.name, shown)


def attach_functions(model: onnx.ModelProto, registry: Registry) -> list[str]:
    """Add each custom node's function body to ``model.functions``; return the ops added.

    The function's standard-ONNX opset import is aligned to the model's own.
    """
    have = {(f.domain, f.name) for f in model.functions}
    model_opsets = {o.domain: o.version for o in model.opset_import}
    added = []
    for node in model.graph.node:
        key = (node.domain, node.op_type)
        if not is_custom(node.domain) or key in have:
            continue
        spec = registry.find(*key)
        if spec is None or spec.function is None:
            continue
        proto = spec.function.to_function_proto()
        for imp in proto.opset_import:
            if is_onnx(imp.domain) and imp.version != model_opsets.get("", imp.version):
                raise OpBridgeError(
                    f"{spec.qualname}: function body uses ONNX opset {imp.version} but the model uses "
                    f"{model_opsets['']}. Got opset_version={model_opsets['']}. Export with "
                    f"opset_version={imp.version}, or write the body with onnxscript.opset{model_opsets['']}."
                )
        model.functions.append(proto)
        have.add(key)
        added.append(spec.qualname)
    return added


def _ensure_opset_imports(model: onnx.ModelProto, registry: Registry) -> None:
    present = {o.domain for o in model.opset_import}
    for domain in sorted({n.domain for n in model.graph.node if is_custom(n.domain)} - present):
        versions = {s.version for s in registry if s.domain == domain}
        model.opset_import.append(onnx.helper.make_opsetid(domain, max(versions or {1})))


DEFAULT_REWRITES: tuple[Callable, ...] = (torchbind_to_ops, functionalize_mutations)


@dataclasses.dataclass
class Exported:
    """An export's ONNX model and the program torch.onnx translated into it: the rewritten
    ExportedProgram after torch.onnx's own decompositions. Each ONNX value computed from an FX node
    is named after that node (``pkg.torch.onnx.fx_node`` in the ONNX node's metadata says which),
    so running ``program`` node by node gives the eager value of every such ONNX value."""

    proto: onnx.ModelProto
    program: torch.export.ExportedProgram


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
) -> onnx.ModelProto:
    """Export ``model`` with every registered custom op; return (and write to ``f``) the ModelProto.

    Runs ``torch.export``, the graph rewrites (torchbind method calls -> ops with the object's
    state as attributes; mutating ops -> functional twins), then ``torch.onnx.export(dynamo=True)``
    with the registry's translation table, attaches model-local function bodies
    (``functions=True``) so plain ONNX Runtime runs the file, and validates with ``onnx.checker`` (full check). Small
    models are written as one file.

    Example:
        >>> import torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.identity_conv(x, 3) + 1
        >>> proto = bridge.export(M(), (torch.randn(1, 3, 4, 4),))
        >>> [n.op_type for n in proto.graph.node]
        ['identity_conv', 'Add']
    """
    return export_with_program(model, args, f, kwargs=kwargs, dynamic_shapes=dynamic_shapes, registry=registry,
                               functions=functions, opset_version=opset_version, check=check,
                               rewrites=rewrites).proto


def export_with_program(
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
) -> Exported:
    """``export`` that also returns the program torch.onnx translated (see :class:`Exported`).

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
    reg = REGISTRY if registry is None else registry
    args = tuple(args)
    with step("torch.export"):
        program = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes,
                                      strict=False)
    for rewrite in DEFAULT_REWRITES if rewrites is None else rewrites:
        program = rewrite(program, reg)
    check_program(program, reg)
    with step("torch.onnx.export (dynamo)"):
        # NOTE: torch.onnx prints its own progress lines; they are noise next to ours.
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnx_program = torch.onnx.export(
                program, dynamo=True, custom_translation_table=translation_table(reg),
                opset_version=opset_version, optimize=True, verify=False, external_data=False,
            )
    proto = onnx_program.model_proto
    _ensure_opset_imports(proto, reg)
    if functions:
        attach_functions(proto, reg)
    if check:
        with step("onnx.checker (full)"):
            onnx.checker.check_model(proto, full_check=True)
    if f is not None:
        save(proto, f)
    return Exported(proto, onnx_program.exported_program)


def save(proto: onnx.ModelProto, f: str | os.PathLike) -> None:
    """Write one file; only models past protobuf's 2 GiB limit get an external data file."""
    external = proto.ByteSize() >= _SINGLE_FILE_LIMIT
    onnx.save_model(proto, os.fspath(f), save_as_external_data=external,
                    location=os.path.basename(os.fspath(f)) + ".data" if external else None)
