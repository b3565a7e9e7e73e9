"""Readable names in exported files: custom ops' outputs, user-chosen input/output names, and
dynamic dimensions named as their ``torch.export.Dim``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence

import onnx
import torch

from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import FreshNames, custom_nodes, graphs, value_names


def rename_values(model: onnx.ModelProto, mapping: dict[str, str]) -> None:
    """Rename values everywhere they appear (nodes, graph inputs/outputs, value_info, subgraphs).

    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> m = helper.make_model(g); rename_values(m, {"y": "relu_out"})
    >>> [o.name for o in m.graph.output], list(m.graph.node[0].output)
    (['relu_out'], ['relu_out'])
    """
    if not mapping:
        return
    for graph in graphs(model.graph):
        for node in graph.node:
            node.input[:] = [mapping.get(n, n) for n in node.input]
            node.output[:] = [mapping.get(n, n) for n in node.output]
        for v in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]:
            v.name = mapping.get(v.name, v.name)


def name_custom_outputs(model: onnx.ModelProto, registry) -> None:
    """Outputs of multi-output custom nodes take the op's own names (``<op>_out<i>``), never the
    exporter's ``getitem``/``getitem_1``."""
    fresh = FreshNames(value_names(model.graph))
    rename_values(model, {out: fresh(f"{node.op_type}_out{i}") for node in custom_nodes(model) if len(node.output) > 1
                          for i, out in enumerate(node.output) if out.startswith("getitem")})


def snake_case(name: str) -> str:
    """``name`` (a class or ONNX op type) as a value name.

    >>> snake_case("MMCVModulatedDeformConv2d"), snake_case("RoIAlignFunction"), snake_case("bev_pool_v2")
    ('mmcv_modulated_deform_conv2d', 'ro_i_align_function', 'bev_pool_v2')
    """
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def name_proxy_outputs(model: onnx.ModelProto, hints: Mapping[tuple[str, str], str], prefix: str) -> None:
    """Outputs of the custom nodes of ops in ``hints`` (``(domain, op type) -> name``) still named as torch
    named their proxy's call (they start with ``prefix``) take the op's name: ``<name>`` or ``<name>_out<i>``."""
    fresh = FreshNames(value_names(model.graph))
    rename_values(model, {
        out: fresh(hints[(node.domain, node.op_type)] + (f"_out{i}" if len(node.output) > 1 else ""))
        for node in custom_nodes(model) if (node.domain, node.op_type) in hints
        for i, out in enumerate(node.output) if out.startswith(prefix)})


def name_graph_io(model: onnx.ModelProto, input_names: Sequence[str] | None,
                  output_names: Sequence[str] | None) -> None:
    """Rename the graph's inputs and outputs to the names given (same count, unique)."""
    initializers = {t.name for t in model.graph.initializer}
    mapping = {}
    for kind, given, values in (("input_names", input_names,
                                 [v.name for v in model.graph.input if v.name not in initializers]),
                                ("output_names", output_names, [v.name for v in model.graph.output])):
        if given is None:
            continue
        given = list(given)
        if len(given) != len(values) or len(set(given)) != len(given) or not all(
                isinstance(n, str) and n for n in given):
            raise OpBridgeError(f"{kind} must name each of the model's {len(values)} graph {kind[:-6]}s once. Got "
                                f"{given} for {values}. Pass {len(values)} distinct non-empty names.")
        mapping.update({old: new for old, new in zip(values, given) if old != new})
    clash = (set(mapping.values()) & value_names(model.graph)) - set(mapping)
    if clash:
        raise OpBridgeError(f"names {sorted(clash)} are already used inside the graph. Got a clash. Pick other names.")
    rename_values(model, mapping)


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


def rename_dims(model: onnx.ModelProto, mapping: dict[str, str]) -> None:
    """Replace symbols inside every ``dim_param`` (also inside expressions such as ``s10 + 1``)."""
    if not mapping:
        return
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
    for graph in graphs(model.graph):
        for v in [*graph.input, *graph.output, *graph.value_info]:
            for d in v.type.tensor_type.shape.dim:
                if d.HasField("dim_param"):
                    d.dim_param = pattern.sub(lambda m: mapping[m.group(1)], d.dim_param)
