"""Readable names in exported files: custom ops' outputs, user-chosen input/output names, and
dynamic dimensions named as their ``torch.export.Dim``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence

import onnx_ir as ir
import torch

from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import FreshNames, ir_custom_nodes


def _rename(model: ir.Model, hints: Mapping[ir.Value, str]) -> bool:
    """Name each value of ``hints`` its hint, or the hint made unique (:class:`FreshNames`)."""
    fresh = FreshNames(ir.convenience.create_value_mapping(model.graph))
    for value, name in [(v, fresh(hint)) for v, hint in hints.items()]:
        value.name = name
    return bool(hints)


def name_custom_outputs(model: ir.Model) -> bool:
    """Outputs of multi-output custom nodes take the op's own names (``<op>_out<i>``), never the
    exporter's ``getitem``/``getitem_1``."""
    return _rename(model, {out: f"{node.op_type}_out{i}" for node in ir_custom_nodes(model, functions=False)
                           if len(node.outputs) > 1 for i, out in enumerate(node.outputs)
                           if str(out.name).startswith("getitem")})


def snake_case(name: str) -> str:
    """``name`` (a class or ONNX op type) as a value name.

    >>> snake_case("MMCVModulatedDeformConv2d"), snake_case("RoIAlignFunction"), snake_case("bev_pool_v2")
    ('mmcv_modulated_deform_conv2d', 'ro_i_align_function', 'bev_pool_v2')
    """
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def name_proxy_outputs(model: ir.Model, hints: Mapping[tuple[str, str], str], prefix: str) -> bool:
    """Outputs of the custom nodes of ops in ``hints`` (``(domain, op type) -> name``) still named as torch
    named their proxy's call (they start with ``prefix``) take the op's name: ``<name>`` or ``<name>_out<i>``."""
    return _rename(model, {
        out: hints[(node.domain, node.op_type)] + (f"_out{i}" if len(node.outputs) > 1 else "")
        for node in ir_custom_nodes(model, functions=False) if (node.domain, node.op_type) in hints
        for i, out in enumerate(node.outputs) if str(out.name).startswith(prefix)})


def name_graph_io(model: ir.Model, input_names: Sequence[str] | None, output_names: Sequence[str] | None) -> bool:
    """Rename the graph's inputs and outputs to the names given (same count, unique)."""
    graph, mapping = model.graph, dict[ir.Value, str]()
    for kind, given, values in (("input_names", input_names, [v for v in graph.inputs if v.name not in
                                                             graph.initializers]),
                                ("output_names", output_names, list(graph.outputs))):
        if given is None:
            continue
        given, names = list(given), [v.name for v in values]
        if len(given) != len(values) or len(set(given)) != len(given) or not all(
                isinstance(n, str) and n for n in given):
            raise OpBridgeError(f"{kind} must name each of the model's {len(values)} graph {kind[:-6]}s once. Got "
                                f"{given} for {names}. Pass {len(values)} distinct non-empty names.")
        mapping.update({v: new for v, new in zip(values, given) if v.name != new})
    clash = (set(mapping.values()) & set(ir.convenience.create_value_mapping(graph))) - {v.name for v in mapping}
    if clash:
        raise OpBridgeError(f"names {sorted(clash)} are already used inside the graph. Got a clash. Pick other names.")
    for value, name in mapping.items():
        value.name = name
    return bool(mapping)


def dim_names(program: torch.export.ExportedProgram, model: torch.nn.Module, args: Sequence,
              kwargs: dict | None, dynamic_shapes) -> dict[str, str]:
    """torch's symbol for each dynamic dim (``s10``) -> the name of the ``Dim`` the user gave it."""
    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, dict):
        bound = inspect.signature(model.forward).bind(*args, **(kwargs or {}))
        per_arg = [dynamic_shapes.get(name) for name in bound.arguments]
    else:
        per_arg = list(dynamic_shapes)
    user_inputs = [s.arg.name for s in program.graph_signature.input_specs
                   if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    names: dict[str, str] = {}
    for spec, input_name in zip(per_arg, user_inputs):
        if not isinstance(spec, dict):
            continue
        shape = getattr(placeholders[input_name].meta.get("val"), "shape", ())
        for dim, d in spec.items():
            if dim < len(shape) and isinstance(shape[dim], torch.SymInt) and hasattr(d, "__name__"):
                names.setdefault(str(shape[dim].node.expr), d.__name__)
    return names


def rename_dims(model: ir.Model, mapping: dict[str, str]) -> bool:
    """Replace symbols inside every symbolic dim of the graph's values (also inside expressions such as
    ``s10 + 1``).

    >>> x = ir.Value(name="x", shape=ir.Shape(["s10", "s10 + 1", 3]))
    >>> rename_dims(ir.Model(ir.Graph([x], [x], nodes=[]), ir_version=10), {"s10": "batch"}), str(x.shape)
    (True, '[batch,batch + 1,3]')
    """
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
    dims = [(v, i, str(d.value)) for v in ir.convenience.create_value_mapping(model.graph).values() if mapping
            for i, d in enumerate(v.shape or ()) if isinstance(d, ir.SymbolicDim) and d.value is not None]
    for value, i, dim in dims:
        shape = value.shape
        assert shape is not None  # NOTE: only values with a shape are listed
        value.shape = shape.copy()  # NOTE: values may share a shape: each gets its own
        value.shape[i] = ir.SymbolicDim(pattern.sub(lambda m: mapping[m.group(1)], dim))
    return bool(dims)
