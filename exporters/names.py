"""Readable names in exported files: custom ops' outputs, user-chosen input/output names, and
dynamic dimensions named as their ``torch.export.Dim``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch

from bridge.core.basics import torch_compat
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
    names: dict[str, str] = {}
    for symbol, d in _named_dims(program, model, args, kwargs, dynamic_shapes):
        names.setdefault(symbol, d.__name__)
    return names


def dim_floors(program: torch.export.ExportedProgram, model: torch.nn.Module, args: Sequence,
               kwargs: dict | None, dynamic_shapes) -> dict[str, int]:
    """The name of each ``Dim`` the user gave a least size above 0 (``Dim("H", min=2)``) -> that size."""
    return {d.__name__: int(d.min) for _, d in _named_dims(program, model, args, kwargs, dynamic_shapes)
            if isinstance(getattr(d, "min", None), int) and d.min > 0}


def _named_dims(program: torch.export.ExportedProgram, model: torch.nn.Module, args: Sequence,
                kwargs: dict | None, dynamic_shapes) -> Iterator[tuple[str, Any]]:
    """(torch's symbol, the user's ``Dim``) of each dynamic dim the user named."""
    if dynamic_shapes is None:
        return
    if isinstance(dynamic_shapes, dict):
        bound = inspect.signature(model.forward).bind(*args, **(kwargs or {}))
        per_arg = [dynamic_shapes.get(name) for name in bound.arguments]
    else:
        per_arg = list(dynamic_shapes)
    user_inputs = [s.arg.name for s in program.graph_signature.input_specs
                   if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for spec, input_name in zip(per_arg, user_inputs):
        if not isinstance(spec, dict):
            continue
        shape = getattr(placeholders[input_name].meta.get("val"), "shape", ())
        for dim, d in spec.items():
            if dim < len(shape) and isinstance(shape[dim], torch.SymInt) and hasattr(d, "__name__"):
                yield str(shape[dim].node.expr), d


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


def shapes_from_axes(model: torch.nn.Module, args: Sequence, kwargs: dict | None,
                     dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]], input_names: Sequence[str] | None,
                     output_names: Sequence[str] | None) -> dict[str, dict[int, object] | None]:
    """torch.onnx.export's ``dynamic_axes`` (``{input name: {axis: dim name}}`` or ``{input name: [axes]}``) as
    ``dynamic_shapes`` keyed by ``forward``'s parameter names. Input names are ``input_names`` (in the order of the
    tensor arguments), else the parameters'. One ``torch.export.Dim`` per dim name: inputs that share a name share
    the size, as one ``dim_param`` in an ONNX file says; an axis given without a name is named as the TorchScript
    exporter named it (``<input>_dynamic_axes_<n>``). Outputs are skipped: their dims follow the inputs'.

    Example:
        >>> class M(torch.nn.Module):
        ...     def forward(self, boxes, scores, k: int):
        ...         return boxes[:, :2] * scores[:, None] * k
        >>> shapes = shapes_from_axes(M(), (torch.ones(5, 4), torch.ones(5), 2), None,
        ...                           {"b": {0: "n"}, "s": {0: "n"}, "out": [0]}, ["b", "s"], ["out"])
        >>> {p: {a: d.__name__ for a, d in s.items()} if s else s for p, s in shapes.items()}
        {'boxes': {0: 'n'}, 'scores': {0: 'n'}, 'k': None}
    """
    bound = inspect.signature(model.forward).bind(*args, **(kwargs or {}))
    named = _input_parameters(bound.arguments, input_names)
    dims: dict[str, object] = {}
    shapes: dict[str, dict[int, object] | None] = {p: None for p in bound.arguments}
    for key, axes in dynamic_axes.items():
        if key in (output_names or ()):
            continue
        if key not in named:
            raise OpBridgeError(
                f"dynamic_axes names {key!r}, which is no tensor input of the model. Got inputs {list(named)}"
                f"{f' and outputs {list(output_names)}' if output_names else ''}. Key dynamic_axes by input name "
                "(input_names=, else forward's parameter names); an output's dims follow the inputs'.")
        param = named[key]
        rank = bound.arguments[param].dim()
        pairs = axes.items() if isinstance(axes, Mapping) else [(a, f"{key}_dynamic_axes_{n + 1}")
                                                                for n, a in enumerate(axes)]
        spec = shapes[param] = {}
        for axis, name in pairs:
            if not (isinstance(axis, int) and -rank <= axis < rank) or not str(name).isidentifier():
                raise OpBridgeError(
                    f"dynamic_axes[{key!r}] must map axes of that {rank}-d input to dim names that are Python "
                    f"identifiers (torch.export.Dim's names). Got {axis!r}: {name!r}. Pass e.g. {{0: 'batch'}}.")
            spec[axis % rank] = dims.setdefault(name, torch.export.Dim(name))
    return shapes


def _input_parameters(arguments: Mapping[str, object], input_names: Sequence[str] | None) -> dict[str, str]:
    """Graph input name -> the parameter it is: ``input_names`` by position over the tensor arguments, else the
    parameter's own name."""
    # NOTE: the graph's inputs are the tensors flattened from every argument: names given by position would name
    # another input past an argument that holds several
    nested = [p for p, v in arguments.items() if not isinstance(v, torch.Tensor)
              and any(isinstance(leaf, torch.Tensor) for leaf in torch_compat.pytree.tree_leaves(v))]
    if nested:
        raise OpBridgeError(
            f"dynamic_axes names inputs of arguments that are tensors, one each. Got {nested} holding several "
            "(a list, tuple or dict of tensors). Pass dynamic_shapes= instead, its structure that of the arguments.")
    tensors = [p for p, v in arguments.items() if isinstance(v, torch.Tensor)]
    return {(input_names[i] if input_names and i < len(input_names) else p): p for i, p in enumerate(tensors)}


def call_args(args: Sequence | torch.Tensor) -> tuple:
    """The model's positional arguments as a tuple, as torch.onnx.export reads ``args``: one tensor is one
    argument (a tuple of it), never iterated into its rows.

    Example:
        >>> [tuple(a.shape) for a in call_args(torch.ones(1, 3, 8, 8))], len(call_args([torch.ones(2), 3]))
        ([(1, 3, 8, 8)], 2)
    """
    return (args,) if isinstance(args, torch.Tensor) else tuple(args)


def check_model_call(model: object, args: tuple, kwargs: Mapping | None) -> None:
    """Refuse what torch.export cannot trace as a call of ``model``: no ``torch.nn.Module``, or numpy arrays among
    the arguments (torch would trace them as constants, or fail deep inside).

    Example:
        >>> check_model_call(torch.nn.ReLU(), (torch.ones(2),), None)
        >>> check_model_call(torch.relu, (torch.ones(2),), None)
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: the model must be a torch.nn.Module. Got builtin_function...
    """
    if not isinstance(model, torch.nn.Module):
        raise OpBridgeError(f"the model must be a torch.nn.Module. Got {type(model).__name__} {model!r:.60}. Wrap "
                            "it in a Module whose forward calls it.")
    arrays = [type(v).__module__ for v in torch_compat.pytree.tree_leaves((args, kwargs or {}))
              if type(v).__module__ == "numpy"]
    if arrays:
        raise OpBridgeError(f"the model's arguments must be torch tensors (or Python values). Got {len(arrays)} numpy "
                            "value(s). Convert each with torch.from_numpy(a) (torch.tensor(v) for a numpy scalar).")


def check_dynamic_shapes(model: torch.nn.Module, args: tuple, kwargs: Mapping | None, dynamic_shapes) -> None:
    """Refuse a ``dynamic_shapes`` whose structure is not the call's (one entry per argument, in order, or keyed
    by forward's parameter names) or that marks a dim a tensor does not have, before torch.export meets it (there
    an out-of-range dim is an IndexError deep inside, a structure torch's own message).

    Example:
        >>> n = torch.export.Dim("n")
        >>> check_dynamic_shapes(torch.nn.ReLU(), (torch.ones(3, 2),), None, ({0: n},))
        >>> check_dynamic_shapes(torch.nn.ReLU(), (torch.ones(3, 2),), None, ({2: n},))
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: dynamic_shapes marks dim(s) [2] of input 'input', a ...
    """
    try:
        signature = inspect.signature(model.forward)
        bound = signature.bind(*args, **(kwargs or {})).arguments
    except (TypeError, ValueError):
        return  # NOTE: a call forward does not take fails in torch.export with its own message
    if dynamic_shapes is None or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                     for p in signature.parameters.values()):
        return  # NOTE: torch.export matches *args and **kwargs entries itself
    fix = ("Give one entry per argument (None for one with no dynamic dim): a tuple in forward's order, or a dict "
           f"keyed by its parameter names {list(bound)}, each a {{dim index: torch.export.Dim}} for a tensor.")
    if isinstance(dynamic_shapes, Mapping):
        if set(dynamic_shapes) != set(bound):
            raise OpBridgeError(f"dynamic_shapes, a dict, must name each argument of the call {list(bound)} (torch."
                                f"export's rule). Got keys {list(dynamic_shapes)}. {fix}")
        pairs = [(name, bound[name], spec) for name, spec in dynamic_shapes.items()]
    elif isinstance(dynamic_shapes, (tuple, list)) and len(dynamic_shapes) == len(bound):
        pairs = list(zip(bound, bound.values(), dynamic_shapes))
    else:
        raise OpBridgeError(f"dynamic_shapes must match the call's {len(bound)} argument(s) {list(bound)}. Got "
                            f"{type(dynamic_shapes).__name__} {dynamic_shapes!r:.120}. {fix}")
    for name, value, spec in pairs:
        if isinstance(value, torch.Tensor) and isinstance(spec, Mapping):
            bad = [k for k in spec if not (isinstance(k, int) and 0 <= k < value.dim())]
            if bad:
                raise OpBridgeError(
                    f"dynamic_shapes marks dim(s) {bad} of input '{name}', a {value.dim()}-d tensor of shape "
                    f"{tuple(value.shape)}. Got {spec!r:.120}. Key each by a dim index from 0 to "
                    f"{value.dim() - 1}.")


# NOTE: torch.onnx.export's other keywords, as a deploy script passes them to the call bridge.export replaces:
# (the values that mean what bridge.export does, None for any: torch.onnx.export(dynamo=True) ignores those too;
# what bridge.export does instead)
TORCH_ONNX_KEYWORDS: dict[str, tuple[tuple | None, str]] = {
    "export_params": ((True,), "writes the model's weights into the file"),
    "dynamo": ((True,), "exports with torch.export, as torch.onnx.export(dynamo=True)"),
    "optimize": ((True,), "runs torch.onnx's optimizer on every file"),
    "export_modules_as_functions": ((False,), "writes modules' nodes into the graph"),
    "verify": ((False,), "checks the file against eager with bridge.check_parity(model, args)"),
    "report": ((False,), "writes no report files (it raises errors that name the fix)"),
    "profile": ((False,), "writes no report files (it raises errors that name the fix)"),
    "dump_exported_program": ((False,), "writes no report files (bridge.export_with_program returns the program)"),
    "keep_initializers_as_inputs": (None, "lists the weights as graph inputs too (weights_as_inputs)"),
    **{key: (None, "ignores it, as torch.onnx.export(dynamo=True) does") for key in (
        "verbose", "do_constant_folding", "training", "operator_export_type", "custom_opsets", "autograd_inlining",
        "external_data", "artifacts_dir")},
}


def check_torch_onnx_options(options: Mapping[str, object]) -> None:
    """Refuse a keyword of ``options`` (torch.onnx.export's, passed to bridge.export) that is none of
    :data:`TORCH_ONNX_KEYWORDS`, or has a value asking for what bridge.export does not do.

    Example:
        >>> check_torch_onnx_options({"export_params": True, "do_constant_folding": False, "verbose": True})
        >>> check_torch_onnx_options({"export_params": False})
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: export_params=False asks what bridge.export does not ...
    """
    for key, value in options.items():
        if key not in TORCH_ONNX_KEYWORDS:
            raise OpBridgeError(f"bridge.export() got an unexpected keyword argument {key!r}. Got {key}={value!r}. "
                                "Pass export's own keywords (help(bridge.export)) or torch.onnx.export's "
                                f"({', '.join(TORCH_ONNX_KEYWORDS)}).")
        allowed, does = TORCH_ONNX_KEYWORDS[key]
        if allowed is not None and not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise OpBridgeError(f"{key}={value!r} asks what bridge.export does not do: it {does}. Got {value!r}. "
                                f"Drop {key}= (or pass {key}={allowed[0]!r}).")


def weights_as_inputs(model: ir.Model) -> bool:
    """List each initializer (weight) of ``model`` as a graph input too, after the model's own inputs (what
    ``keep_initializers_as_inputs=True`` asks): its value stays the default, a caller may feed another."""
    weights = [v for v in model.graph.initializers.values() if v not in model.graph.inputs]
    model.graph.inputs.extend(weights)
    return bool(weights)
