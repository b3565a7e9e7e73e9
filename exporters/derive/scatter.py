"""ScatterND with a reduction (what ``index_put(accumulate=True)`` and ``index_add`` become), which
onnxruntime's threaded CPU kernel runs nondeterministically over duplicate indices, rewritten to
ScatterElements over the flattened data, which accumulates in a fixed order."""

from __future__ import annotations

import onnx
from onnx import helper

from bridge.core.basics.domains import is_onnx
from bridge.core.basics.graphs import value_types, walk
from exporters.derive.sites import Untraceable

_REDUCING_SCATTER = {"add", "mul", "max", "min"}


def _last_dim(type_proto: onnx.TypeProto | None) -> int | None:
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = type_proto.tensor_type.shape.dim
    return dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None


def _deterministic_scatter(node: onnx.NodeProto, k: int) -> list[onnx.NodeProto]:
    """ScatterND(data, indices[..., k], updates, reduction=r) as ScatterElements on data seen as
    [prod(dims[:k]), prod(dims[k:])]: the same result, accumulated in index order."""
    data, indices, updates = node.input
    p = (node.name or node.output[0]) + "__det_"
    reduction = next(a.s.decode() for a in node.attribute if a.name == "reduction")

    def const(name, values):
        return helper.make_node("Constant", [], [p + name], value=helper.make_tensor(
            p + name, onnx.TensorProto.INT64, [len(values)], values))

    out = [const("zero", [0]), const("k", [k]), const("big", [2**62]), const("last", [-1]), const("one", [1]),
           helper.make_node("Shape", [data], [p + "shape"]),
           helper.make_node("Slice", [p + "shape", p + "zero", p + "k"], [p + "lead"]),
           helper.make_node("Slice", [p + "shape", p + "k", p + "big"], [p + "rest"]),
           helper.make_node("ReduceProd", [p + "lead"], [p + "n"], keepdims=1),
           helper.make_node("ReduceProd", [p + "rest"], [p + "r"], keepdims=1),
           helper.make_node("Concat", [p + "n", p + "r"], [p + "flat_shape"], axis=0),
           helper.make_node("Reshape", [data, p + "flat_shape"], [p + "flat"]),
           # negative indices count from the end, as ScatterND reads them
           helper.make_node("Less", [indices, p + "zero"], [p + "neg"]),
           helper.make_node("Add", [indices, p + "lead"], [p + "wrapped"]),
           helper.make_node("Where", [p + "neg", p + "wrapped", indices], [p + "idx"])]
    strides = []
    for i in range(k):  # stride of index column i: prod(dims[i+1:k])
        out += [const(f"s{i}", [i + 1]),
                helper.make_node("Slice", [p + "lead", p + f"s{i}", p + "k"], [p + f"tail{i}"]),
                helper.make_node("ReduceProd", [p + f"tail{i}"], [p + f"stride{i}"], keepdims=1)]
        strides.append(p + f"stride{i}")
    out += [helper.make_node("Concat", strides, [p + "strides"], axis=0),
            helper.make_node("Mul", [p + "idx", p + "strides"], [p + "scaled"]),
            helper.make_node("ReduceSum", [p + "scaled", p + "last"], [p + "lin"], keepdims=0),
            helper.make_node("Reshape", [p + "lin", p + "last"], [p + "rows"]),
            helper.make_node("Shape", [p + "rows"], [p + "m"]),
            helper.make_node("Concat", [p + "m", p + "r"], [p + "upd_shape"], axis=0),
            helper.make_node("Reshape", [updates, p + "upd_shape"], [p + "upd"]),
            helper.make_node("Unsqueeze", [p + "rows", p + "one"], [p + "col"]),
            helper.make_node("Expand", [p + "col", p + "upd_shape"], [p + "where"]),
            helper.make_node("ScatterElements", [p + "flat", p + "where", p + "upd"], [p + "scattered"],
                             axis=0, reduction=reduction),
            helper.make_node("Reshape", [p + "scattered", p + "shape"], [node.output[0]])]
    return out


def avoid_racy_scatter(model: onnx.ModelProto) -> None:
    """Rewrite each main-graph ScatterND with a reduction (racy in onnxruntime's threaded CPU kernel
    over duplicate indices) to ScatterElements; raise where one cannot be rewritten."""
    types = value_types(model.graph)
    nodes = []
    for node in model.graph.node:
        reduction = next((a.s.decode() for a in node.attribute if a.name == "reduction"), "none")
        if node.op_type == "ScatterND" and is_onnx(node.domain) and reduction in _REDUCING_SCATTER:
            k = _last_dim(types.get(node.input[1]))
            if not k:
                raise Untraceable(
                    f"torch.onnx translated it to ScatterND(reduction={reduction}), which onnxruntime runs "
                    "nondeterministically over duplicate indices, and the index depth is not static, so "
                    "opbridge cannot rewrite it to ScatterElements")
            nodes.extend(_deterministic_scatter(node, k))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def racy_nodes(nodes) -> list[str]:
    """The racy ScatterND nodes left among ``nodes`` (subgraphs included), as ``ScatterND(reduction=r)``."""
    reductions = (next((a.s.decode() for a in n.attribute if a.name == "reduction"), "none")
                  for n in walk(nodes) if n.op_type == "ScatterND")
    return [f"ScatterND(reduction={r})" for r in reductions if r in _REDUCING_SCATTER]
