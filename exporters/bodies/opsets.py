"""Function bodies at the model's opset: convert a FunctionProto's standard-ONNX opset (and a model's,
functions included). Which body a node gets is exporters.resolve's business.

An op's body is written once (e.g. with ``onnxscript.opset20``); a model exported at opset 17 or
23, or converted by ``onnx.version_converter`` (which drops model-local functions), gets each body
converted node by node. Between two opsets an ONNX op either changed only its types (nothing to
do), gained optional attributes or inputs (free going up; going down only when the node leaves them
unset), or changed its signature; the last kind is adapted here (``Pad`` axes, ``Reduce*`` and
``Squeeze``/``Unsqueeze`` axes, ``Split``, ``GridSample`` modes) or refused with an error naming
the op (an op ONNX deprecated, like GroupNormalization-18, counts as absent). New attribute values
(``ScatterElements`` reduction max/min, ``Pad`` mode wrap, ...) are refused below the opset that
introduced them. ``onnx.checker`` (full) checks the result's types.

NOTE: hand-written because no library converts function bodies exactly (measured with onnx 1.23.2,
onnxscript 0.7.2): ``onnx.version_converter`` has no adapter down for Pad-18, Split-18 or
GridSample-20, fails on Reduce axes given by ``Constant(value_ints=...)``, and turns an attribute
reference (``ref_attr_name``, common in bodies) into an empty tensor, a silent wrong answer;
onnxscript's converter goes up only, from opset 18, and refuses any node with an attribute reference.

Example:
    >>> import bridge, custom_ops
    >>> body = bridge.REGISTRY.get("opbridge::crop").function.to_function_proto()
    >>> onnx_opset(body), onnx_opset(convert_function(body, 17))
    (20, 17)
    >>> sorted(n.op_type for n in convert_function(body, 17).node if n.op_type in ("Pad", "ScatterElements"))
    ['Pad', 'ScatterElements']
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import onnx
import onnx.version_converter
from onnx import defs, helper

from bridge.core.basics.domains import is_onnx, standard_opset
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import FreshNames, subgraphs, tensor_constants, value_names, walk

Nodes = list[onnx.NodeProto]


def onnx_opset(proto: onnx.ModelProto | onnx.FunctionProto) -> int | None:
    """The standard-ONNX opset a model or function imports (``""`` or ``"ai.onnx"``), or None."""
    return standard_opset((o.domain, o.version) for o in proto.opset_import)


def _schema(op_type: str, version: int) -> defs.OpSchema | None:
    try:
        schema = defs.get_schema(op_type, version, "")
    except defs.SchemaError:
        return None
    return None if schema.deprecated else schema


def _since_versions(op_type: str) -> list[int]:
    return sorted({s.since_version for s in defs.get_all_schemas_with_history()
                   if s.name == op_type and s.domain == ""})


class _Context:
    """Fresh value names and producers inside one body being converted."""

    def __init__(self, function: onnx.FunctionProto, target: int):
        self.where, self.target = f"function {function.domain}::{function.name}", target
        self.producers = {out: node for node in walk(function.node) for out in node.output}
        self.names = FreshNames(value_names(function))

    def add(self, made: Nodes, op_type: str, inputs: list[str], base: str, **attrs) -> str:
        """Append a new node to ``made``; return its (fresh) output name."""
        out = self.names(f"{base}_opset{self.target}")
        made.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def error(self, node: onnx.NodeProto, why: str, fix: str) -> OpBridgeError:
        return OpBridgeError(f"{self.where}: cannot convert node {node.name or node.op_type!r} ({node.op_type}) "
                             f"to ONNX opset {self.target}: {why}. {fix}")


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _drop_attr(node: onnx.NodeProto, name: str) -> None:
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)


def _ints_attr(attr: onnx.AttributeProto, name: str) -> onnx.AttributeProto:
    """A copy of ``attr`` (ints, or a reference to a function attribute) named ``name``."""
    copy = onnx.AttributeProto()
    copy.CopyFrom(attr)
    copy.name, copy.type = name, onnx.AttributeProto.INTS
    return copy


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _set_inputs(node: onnx.NodeProto, inputs: list[str]) -> None:
    """``inputs`` as the node's inputs, trailing empty (absent) ones dropped."""
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]
    del node.input[:]
    node.input.extend(inputs)


# --- adapters: (node, ctx) -> the nodes replacing it (helpers first) --------------------------


def _constant_ints(name: str, ctx: _Context) -> onnx.AttributeProto | None:
    """The ints a Constant node produces as ``name``, as an attribute to reuse (may be a reference
    to a function attribute), or None when ``name`` is not a constant of this body."""
    producer = ctx.producers.get(name)
    if (producer is None or producer.op_type != "Constant" or not is_onnx(producer.domain)
            or len(producer.attribute) != 1):
        return None
    attr = producer.attribute[0]
    if attr.ref_attr_name or attr.name == "value_ints":
        return attr
    if attr.name == "value_int":
        return helper.make_attribute("", [attr.i])
    if attr.name == "value" and attr.t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        return helper.make_attribute("", [int(v) for v in onnx.numpy_helper.to_array(attr.t).reshape(-1)])
    return None


def _axes_input_up(attr_name: str) -> Callable:
    """Attribute ``attr_name`` (ints) becomes the node's second input (ReduceX@18, Squeeze@13, Split@13)."""

    def up(node: onnx.NodeProto, ctx: _Context) -> Nodes:
        attr = _attr(node, attr_name)
        if attr is None:
            return [node]
        made: Nodes = []
        out = ctx.add(made, "Constant", [], attr_name)
        made[0].attribute.append(_ints_attr(attr, "value_ints"))
        _drop_attr(node, attr_name)
        _set_inputs(node, [node.input[0], out, *node.input[2:]])
        return [*made, node]

    return up


def _axes_input_down(attr_name: str, noop_attr: str | None = None) -> Callable:
    """The node's second input, a constant of the body, becomes attribute ``attr_name``."""

    def down(node: onnx.NodeProto, ctx: _Context) -> Nodes:
        name = _input(node, 1)
        noop = _attr(node, noop_attr) if noop_attr else None
        if noop is not None:
            assert noop_attr is not None  # noop was read through it
            if noop.ref_attr_name:
                raise ctx.error(node, f"'{noop_attr}' refers to a function attribute",
                                f"Set {noop_attr} to a constant in the body, or keep the model's opset >= 18.")
            _drop_attr(node, noop_attr)
        value = _constant_ints(name, ctx) if name else None
        if name and value is None:
            raise ctx.error(node, f"its {attr_name} input {name!r} is computed at run time, and the older "
                                  f"opset takes {attr_name} as a constant attribute",
                            f"Produce {attr_name} with a Constant node in the body, or keep the model's opset.")
        if noop is not None and noop.i and (value is None or not (value.ref_attr_name or value.ints)):
            return [helper.make_node("Identity", [node.input[0]], list(node.output), name=node.name)]
        if value is not None:
            node.attribute.append(_ints_attr(value, attr_name))
            _set_inputs(node, [node.input[0], *node.input[2:]])
        return [node]

    return down


def _pad_axes_down(node: onnx.NodeProto, ctx: _Context) -> Nodes:
    """Pad@18 ``axes`` input -> Pad@13 pads over every axis (zeros elsewhere), computed in the graph."""
    axes = _input(node, 3)
    if not axes:
        _set_inputs(node, list(node.input[:3]))
        return [node]
    data, pads = node.input[0], node.input[1]
    made: Nodes = []
    add = functools.partial(ctx.add, made)

    rank = add("Size", [add("Shape", [data], "pad_shape")], "pad_rank")
    axes64 = add("Cast", [axes], "pad_axes", to=onnx.TensorProto.INT64)
    zero = add("Constant", [], "pad_zero", value_int=0)
    wrapped = add("Where", [add("Less", [axes64, zero], "pad_neg"), add("Add", [axes64, rank], "pad_plus"), axes64],
                  "pad_axes_norm")
    where = add("Concat", [wrapped, add("Add", [wrapped, rank], "pad_ends")], "pad_index", axis=0)
    two = add("Constant", [], "pad_two", value_int=2)
    count = add("Unsqueeze", [add("Mul", [rank, two], "pad_count"), add("Constant", [], "pad_ax0", value_ints=[0])],
                "pad_count1")
    zeros = add("ConstantOfShape", [count], "pad_zeros",
                value=helper.make_tensor("", onnx.TensorProto.INT64, [1], [0]))
    full = add("ScatterElements", [zeros, where, pads], "pad_full", axis=0)
    _set_inputs(node, [data, full, _input(node, 2)])
    return [*made, node]


def _split_up(node: onnx.NodeProto, ctx: _Context) -> Nodes:
    """Split@18 needs ``num_outputs`` when no ``split`` input is given (Split@13 split evenly)."""
    if not _input(node, 1) and _attr(node, "num_outputs") is None:
        node.attribute.append(helper.make_attribute("num_outputs", len(node.output)))
    return [node]


def _split_down(node: onnx.NodeProto, ctx: _Context) -> Nodes:
    """Split@18 ``num_outputs`` (last chunk may be smaller) -> Split@13 with sizes computed in the graph."""
    num = _attr(node, "num_outputs")
    if num is None:
        return [node]
    if num.ref_attr_name:
        raise ctx.error(node, "'num_outputs' refers to a function attribute",
                        "Give Split a constant num_outputs, or keep the model's opset >= 18.")
    _drop_attr(node, "num_outputs")
    if _input(node, 1):
        return [node]
    axis = _attr(node, "axis")
    n = num.i
    made: Nodes = []
    add = functools.partial(ctx.add, made)

    dim = add("Gather", [add("Shape", [node.input[0]], "split_shape"),
                         add("Constant", [], "split_axis", value_ints=[axis.i if axis else 0])], "split_dim")
    chunk = add("Div", [add("Add", [dim, add("Constant", [], "split_nm1", value_ints=[n - 1])], "split_num"),
                        add("Constant", [], "split_n", value_ints=[n])], "split_chunk")
    last = add("Sub", [dim, add("Mul", [chunk, add("Constant", [], "split_k", value_ints=[n - 1])], "split_used")],
               "split_last")
    sizes = add("Concat", [add("Expand", [chunk, add("Constant", [], "split_rep", value_ints=[n - 1])], "split_first"),
                           last], "split_sizes", axis=0)
    _set_inputs(node, [node.input[0], sizes])
    return [*made, node]


def _grid_sample(names: dict[str, str]) -> Callable:
    def rename(node: onnx.NodeProto, ctx: _Context) -> Nodes:
        mode = _attr(node, "mode")
        if mode is not None and mode.ref_attr_name:
            raise ctx.error(node, "'mode' refers to a function attribute (its names changed at opset 20)",
                            "Set the mode in the body, or keep the model's opset.")
        if mode is not None and mode.s.decode() in names:
            mode.s = names[mode.s.decode()].encode()
        return [node]

    return rename


def _roi_align_up(node: onnx.NodeProto, ctx: _Context) -> Nodes:
    """RoiAlign-16 added coordinate_transformation_mode with the default half_pixel (a half-pixel shift);
    before it RoiAlign computed output_half_pixel: a node crossing up says so."""
    if _attr(node, "coordinate_transformation_mode") is None:
        node.attribute.append(helper.make_attribute("coordinate_transformation_mode", "output_half_pixel"))
    return [node]


def _roi_align_down(node: onnx.NodeProto, ctx: _Context) -> Nodes:
    mode = _attr(node, "coordinate_transformation_mode")
    value = "half_pixel" if mode is None else mode.s.decode() if not mode.ref_attr_name else None
    if value != "output_half_pixel":
        raise ctx.error(node, f"RoiAlign computes coordinate_transformation_mode={value or 'a function attribute'} "
                              "(half_pixel, the default from opset 16) where RoiAlign before opset 16 has only "
                              "output_half_pixel", "Keep the model's opset >= 16.")
    _drop_attr(node, "coordinate_transformation_mode")
    return [node]


def _refuse(why: str) -> Callable:
    def refuse(node: onnx.NodeProto, ctx: _Context) -> Nodes:
        raise ctx.error(node, why, "Write the body with the target opset, or export at the body's opset.")

    return refuse


_REDUCE_18 = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
              "ReduceProd", "ReduceSumSquare")

# NOTE: (op, since_version) -> (up, down): how a node crosses the opset where the op's signature
# changed in a way the generic rule (optional attributes/inputs added) does not cover.
ADAPTERS: dict[tuple[str, int], tuple[Callable, Callable]] = {
    **{(op, 18): (_axes_input_up("axes"), _axes_input_down("axes", "noop_with_empty_axes")) for op in _REDUCE_18},
    ("ReduceSum", 13): (_axes_input_up("axes"), _axes_input_down("axes", "noop_with_empty_axes")),
    ("Squeeze", 13): (_axes_input_up("axes"), _axes_input_down("axes")),
    ("Unsqueeze", 13): (_axes_input_up("axes"), _axes_input_down("axes")),
    ("Split", 13): (_axes_input_up("split"), _axes_input_down("split")),
    ("Split", 18): (_split_up, _split_down),
    ("Pad", 18): (lambda node, ctx: [node], _pad_axes_down),
    ("GridSample", 20): (_grid_sample({"bilinear": "linear", "bicubic": "cubic"}),
                         _grid_sample({"linear": "bilinear", "cubic": "bicubic"})),
    ("RoiAlign", 16): (_roi_align_up, _roi_align_down),
    ("DFT", 20): (_refuse("DFT's axis moved from an attribute (default 1) to an input (default -2) at opset 20"),) * 2,
}

# NOTE: attribute values an opset introduced without changing the signature; a node that uses one
# cannot go below that opset.
NEW_VALUES: dict[tuple[str, int], dict[str, set[str]]] = {
    ("ScatterElements", 18): {"reduction": {"max", "min"}},
    ("ScatterND", 18): {"reduction": {"max", "min"}},
    ("Pad", 19): {"mode": {"wrap"}},
    ("Resize", 19): {"coordinate_transformation_mode": {"half_pixel_symmetric"}},
}


def _signature(schema: defs.OpSchema):
    inputs = [(i.name, i.option) for i in schema.inputs]
    outputs = [(o.name, o.option) for o in schema.outputs]
    attrs = {a.name: (a.type, a.required, a.default_value.SerializeToString()) for a in schema.attributes.values()}
    return inputs, outputs, attrs


def _generic(op_type: str, since: int) -> tuple[Callable, Callable]:
    """Up/down across ``since`` for ops whose change the schemas show: types only, or optional
    attributes/trailing inputs added (free going up; going down only if the node leaves them unset)."""
    old, new = _schema(op_type, since - 1), _schema(op_type, since)
    assert old is not None and new is not None  # NOTE: callers cross only versions between two where the op exists
    (i0, o0, a0), (i1, o1, a1) = _signature(old), _signature(new)
    same_prefix = [n for n, _ in i1[:len(i0)]] == [n for n, _ in i0] and o0 == o1
    added_inputs = i1[len(i0):]
    kept_attrs = all(a1.get(name) == a0[name] for name in a0)
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    if not (same_prefix and kept_attrs and all(opt == optional for _, opt in added_inputs)
            and all(not a1[n][1] for n in set(a1) - set(a0))):
        return (_refuse(f"{op_type} changed its signature at opset {since} and opbridge has no adaptation"),) * 2
    new_attrs = set(a1) - set(a0)
    first_new_input = len(i0)
    values = NEW_VALUES.get((op_type, since), {})

    def down(node: onnx.NodeProto, ctx: _Context) -> Nodes:
        for attr in node.attribute:
            if attr.name in new_attrs:
                raise ctx.error(node, f"attribute '{attr.name}' exists from opset {since} on",
                                f"Leave '{attr.name}' unset in the body, or keep the model's opset >= {since}.")
            if attr.name in values and attr.s.decode() in values[attr.name]:
                raise ctx.error(node, f"{attr.name}={attr.s.decode()!r} exists from opset {since} on",
                                f"Use another {attr.name}, or keep the model's opset >= {since}.")
        if any(node.input[first_new_input:]):
            raise ctx.error(node, f"inputs past the first {first_new_input} exist from opset {since} on",
                            f"Leave them out, or keep the model's opset >= {since}.")
        _set_inputs(node, list(node.input[:first_new_input]))
        return [node]

    return (lambda node, ctx: [node]), down


def _convert_nodes(nodes: Nodes, source: int, ctx: _Context) -> Nodes:
    out: Nodes = []
    for node in nodes:
        converted = onnx.NodeProto()
        converted.CopyFrom(node)
        for graph in subgraphs(converted):  # subgraphs (If, Loop, Scan) convert with their node
            new_nodes = _convert_nodes(list(graph.node), source, ctx)
            del graph.node[:]
            graph.node.extend(new_nodes)
        if not is_onnx(converted.domain):
            out.append(converted)
            continue
        if _schema(converted.op_type, source) is None:
            raise ctx.error(converted, f"{converted.op_type} is deprecated or absent at the body's opset {source}",
                            "Fix the body.")
        if _schema(converted.op_type, ctx.target) is None:
            known = _since_versions(converted.op_type)
            raise ctx.error(converted, f"ONNX defines {converted.op_type} at opsets {known[0] if known else '?'}.. "
                                       f"(deprecated or absent at {ctx.target})",
                            f"Export at an opset where {converted.op_type} exists, or write the body without it.")
        lo, hi = sorted((source, ctx.target))
        crossings = [v for v in _since_versions(converted.op_type) if lo < v <= hi]
        replaced = [converted]
        for since in (crossings if ctx.target > source else reversed(crossings)):
            up, down = ADAPTERS.get((converted.op_type, since)) or _generic(converted.op_type, since)
            step = up if ctx.target > source else down
            replaced[-1:] = step(replaced[-1], ctx)
        out.extend(replaced)
    return out


def convert_function(function: onnx.FunctionProto, opset: int) -> onnx.FunctionProto:
    """A copy of ``function`` whose standard-ONNX nodes are written for ONNX opset ``opset``.

    Bodies that use no standard ONNX op, or already import ``opset``, come back unchanged (copied).
    An op that cannot cross between the two opsets raises ``OpBridgeError`` naming it.

    Example:
        >>> import bridge, custom_ops
        >>> body = bridge.REGISTRY.get("bev::bev_pool_v2").function.to_function_proto()
        >>> [(o.domain, o.version) for o in convert_function(body, 23).opset_import]
        [('', 23)]
    """
    result = onnx.FunctionProto()
    result.CopyFrom(function)
    source = onnx_opset(function)
    if source is None or source == opset:
        return result
    nodes = _convert_nodes(list(function.node), source, _Context(function, opset))
    del result.node[:]
    result.node.extend(nodes)
    for imp in result.opset_import:
        if is_onnx(imp.domain):
            imp.version = opset
    return result


def portable_constants(function: onnx.FunctionProto) -> onnx.FunctionProto:
    """A copy of ``function`` with each literal ``Constant`` (``value_int(s)``, ``value_float(s)``, ...)
    written as a tensor (``value=``; ``bridge.core.basics.graphs.tensor_constants``), the form every consumer reads.

    NOTE: the shape inference of onnxruntime <= 1.22 reads a list constant inside a function body
    as a tensor without dims (measured: ``Pad``'s pads then fail to load, "'pads' input must be a
    1D tensor"). Constants taken from the function's attributes (``ref_attr_name``) stay as they are.

    Example:
        >>> from onnx import helper
        >>> f = helper.make_function("d", "f", [], ["y"], [helper.make_node("Constant", [], ["y"], value_ints=[1, 2])],
        ...                          [helper.make_opsetid("", 20)])
        >>> t = portable_constants(f).node[0].attribute[0]
        >>> t.name, list(t.t.dims), list(t.t.int64_data) or list(onnx.numpy_helper.to_array(t.t))
        ('value', [2], [1, 2])
    """
    result = onnx.FunctionProto()
    result.CopyFrom(function)
    tensor_constants(result.node)
    return result


def convert_model(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` at ONNX opset ``opset``: the main graph through ``onnx.version_converter``, then
    every function body converted (:func:`convert_function`).

    Graph inputs stay those of ``model`` (the converter can list initializers as inputs).

    Example:
        >>> import torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.crop(x, [1, 0, 3, 2]) * 2
        >>> old = convert_model(bridge.export(M(), (torch.randn(1, 4, 4),)), 17)
        >>> onnx_opset(old), [onnx_opset(f) for f in old.functions]
        (17, [17])
    """
    source = onnx_opset(model)
    if source is None or source == opset:
        converted = onnx.ModelProto()
        converted.CopyFrom(model)
        if source is None:
            converted.opset_import.append(helper.make_opsetid("", opset))
    else:
        try:
            converted = onnx.version_converter.convert_version(model, opset)
        except Exception as e:  # noqa: BLE001  the C++ converter raises bare RuntimeErrors
            raise OpBridgeError(f"onnx.version_converter cannot take the model from opset {source} to {opset}. "
                                f"Got {type(e).__name__}: {str(e)[:300]}. Use an opset the graph's ops exist "
                                "at.") from None
        _noop_down(converted)
        inputs = {i.name for i in model.graph.input}
        keep = [i for i in converted.graph.input if i.name in inputs]
        del converted.graph.input[:]
        converted.graph.input.extend(keep)
    del converted.functions[:]
    converted.functions.extend(convert_function(f, opset) for f in model.functions)
    return converted


def _noop_down(model: onnx.ModelProto) -> None:
    """Drop ``noop_with_empty_axes`` from the ReduceX nodes (not ReduceSum) of a graph below opset 18.

    NOTE: ``onnx.version_converter`` (1.23.2) takes ReduceX-18's axes input down to the attribute and keeps the
    attribute, which only ReduceSum had before 18: onnx.checker refuses the file ("Unrecognized attribute:
    noop_with_empty_axes for operator ReduceMean"), so any model with a mean failed at opset 17. Its value 0 is
    what the older op does; 1 with no axes (the identity) becomes an Identity, as the bodies' adapter does."""
    if (onnx_opset(model) or 18) >= 18:
        return
    for node in walk(model.graph.node):
        noop = _attr(node, "noop_with_empty_axes") if is_onnx(node.domain) and node.op_type in _REDUCE_18 else None
        if noop is None:
            continue
        _drop_attr(node, "noop_with_empty_axes")
        axes = _attr(node, "axes")
        if noop.i and (axes is None or not axes.ints):
            node.op_type = "Identity"
            del node.attribute[:]
            del node.input[1:]
