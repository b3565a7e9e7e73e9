"""Every registered seed op's file, exported with dynamic dims, uses only (op, type) pairs that
onnxruntime 1.17 implements on CPU: function bodies (guards included) and the main graph.

The table below is written from onnxruntime 1.17.3's CPU kernel registry (what its
docs/OperatorKernels.md is generated from; read with ``get_all_opkernel_def()`` of that wheel),
per op type constraint, for the kernels serving opsets 17 to 20, listing only the pairs the
bodies use. A pair a new body or guard needs goes in only after checking it there: onnxruntime
1.17 has, for example, no float64 ReduceProd, and fails to load a file that uses one
("Could not find an implementation for ReduceProd(18)"). The same pairs are also checked against
the installed onnxruntime's registry (the newest supported release).
"""

import onnx
import onnxruntime.capi._pybind_state as ort_state
import pytest
import torch

import bridge
import custom_ops  # noqa: F401
import custom_ops.demo as demo
from bridge.tools.testing import OpModule, cases, free_dims
from exporters.inline import inline_functions

# (op type, type constraint of the ONNX schema) -> element types onnxruntime 1.17.3 implements
# on CPU (of those the bodies use)
KERNELS_1_17 = {
    ("Add", "T"): {"DOUBLE", "INT32", "INT64"},
    ("And", "T"): {"BOOL"},
    ("Cast", "T1"): {"BOOL", "DOUBLE", "FLOAT", "INT32", "INT64", "UINT32"},
    ("Concat", "T"): {"BOOL", "DOUBLE", "FLOAT", "INT32", "INT64"},
    ("Conv", "T"): {"FLOAT"},
    ("CumSum", "T"): {"INT64"},
    ("CumSum", "T2"): {"INT64"},
    ("Div", "T"): {"INT64"},
    ("Equal", "T"): {"DOUBLE", "INT64"},
    ("Expand", "T"): {"DOUBLE", "FLOAT", "INT64"},
    ("Flatten", "T"): {"DOUBLE", "FLOAT"},
    ("Gather", "T"): {"BOOL", "DOUBLE", "FLOAT", "INT32", "INT64"},
    ("Gather", "Tind"): {"INT32", "INT64"},
    ("GatherElements", "T"): {"DOUBLE", "FLOAT", "INT32", "INT64"},
    ("GatherElements", "Tind"): {"INT32", "INT64"},
    ("Greater", "T"): {"INT64"},
    ("GreaterOrEqual", "T"): {"DOUBLE", "INT64"},
    ("Identity", "V"): {"FLOAT"},
    ("If", "B"): {"BOOL"},
    ("Less", "T"): {"DOUBLE", "INT64"},
    ("LessOrEqual", "T"): {"DOUBLE", "FLOAT", "INT64"},
    ("MatMul", "T"): {"DOUBLE", "FLOAT"},
    ("Max", "T"): {"INT64"},
    ("Min", "T"): {"INT64"},
    ("Mod", "T"): {"INT64"},
    ("Mul", "T"): {"INT64"},
    ("Neg", "T"): {"INT64"},
    ("NonZero", "T"): {"BOOL"},
    ("Not", "T"): {"BOOL"},
    ("Or", "T"): {"BOOL"},
    ("Pad", "T"): {"FLOAT", "INT32", "INT64"},
    ("Range", "T"): {"INT64"},
    ("ReduceMax", "T"): {"DOUBLE", "INT32", "INT64"},
    ("ReduceMin", "T"): {"DOUBLE", "INT32", "INT64"},
    ("ReduceProd", "T"): {"FLOAT", "INT64"},  # NOTE: no DOUBLE in 1.17 (float, int32, int64 only)
    ("ReduceSum", "T"): {"DOUBLE", "INT64"},
    ("Relu", "T"): {"FLOAT"},
    ("Reshape", "T"): {"DOUBLE", "FLOAT", "INT32", "INT64"},
    ("ScatterElements", "T"): {"DOUBLE", "INT64"},
    ("ScatterElements", "Tind"): {"INT64"},
    ("ScatterND", "T"): {"DOUBLE"},
    ("Shape", "T"): {"DOUBLE", "FLOAT", "INT32", "INT64"},
    ("Sin", "T"): {"FLOAT"},
    ("Size", "T"): {"FLOAT", "INT32", "INT64"},
    ("Slice", "T"): {"DOUBLE", "FLOAT", "INT32", "INT64"},
    ("Slice", "Tind"): {"INT64"},
    ("Softmax", "T"): {"FLOAT"},
    # NOTE: onnxruntime's CPU Split is typed for float, int32, int64, uint8 and string (split.cc; int32
    # and int64 even in reduced builds)
    ("Split", "T"): {"INT64"},
    ("Squeeze", "T"): {"DOUBLE", "FLOAT", "INT32", "INT64"},
    # NOTE: onnxruntime's CPU Tile (6-12, 13) is typed for every fixed-size numeric type and bool (tile.cc)
    ("Tile", "T"): {"INT64"},
    ("Tile", "T1"): {"INT64"},
    ("Sub", "T"): {"INT64"},
    ("TopK", "T"): {"INT32", "INT64"},
    ("Transpose", "T"): {"FLOAT"},
    ("Unsqueeze", "T"): {"BOOL", "DOUBLE", "FLOAT", "INT32", "INT64"},
    ("Where", "T"): {"DOUBLE", "FLOAT", "INT64"},
}
# NOTE: type constraints onnxruntime's kernels do not dispatch on: the schema allows one type
# (Where's condition), or the kernel reads the input as int64 whatever its declared constraint
# (Pad's axes); the bodies give these types (a 1.17.3 run of every seed op's dynamic file passes).
UNDISPATCHED = {("Where", "B"): {"BOOL"}, ("Pad", "Tind"): {"INT64"}}
# NOTE: ONNX function ops onnxruntime has no kernel for and expands (CastLike: a Cast of input 0)
EXPANDED = {"CastLike": ("Cast", "T1")}


def _exported():
    """(name, ModelCase) of the demo and of each seed op's first float32 sample, every dim dynamic
    but those a dim_eq check ties to an attribute."""
    yield "demo", demo.build()
    seen = set()
    for case in cases(bridge.REGISTRY, dtypes=(torch.float32,)):
        spec = case.spec
        if spec.qualname in seen or spec.function is None:
            continue
        seen.add(spec.qualname)
        module, tensors = OpModule.from_sample(spec, case.sample)
        yield spec.qualname, bridge.ModelCase(module, tensors, (free_dims(spec, tensors),))


CASES = list(_exported())


def _typed_nodes(graph: onnx.GraphProto, outer: dict):
    """(node, {value: element type}) of every node of ``graph`` and its subgraphs."""
    types = dict(outer)
    types.update({v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)
                  if v.type.HasField("tensor_type")})
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        yield node, types
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _typed_nodes(g, types)


def used_pairs(model: onnx.ModelProto) -> tuple[set, list]:
    """{(op, constraint, element type)} of the standard nodes of ``model`` with its functions
    inlined (shapes inferred), and the inputs whose type inference left unknown."""
    flat = inline_functions(model, guards=True)
    opset = next(o.version for o in flat.opset_import if o.domain in ("", "ai.onnx"))
    pairs, unknown = set(), []
    for node, types in _typed_nodes(flat.graph, {}):
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        for i, value in enumerate(node.input):
            formal = schema.inputs[min(i, len(schema.inputs) - 1)].type_str
            if not value or formal.startswith("tensor("):
                continue  # NOTE: omitted, or a type the schema fixes (shapes, axes: int64)
            if not types.get(value):
                unknown.append((node.op_type, value))
                continue
            if node.op_type in EXPANDED:
                if i == 0:
                    pairs.add((*EXPANDED[node.op_type], onnx.TensorProto.DataType.Name(types[value])))
                continue
            pairs.add((node.op_type, formal, onnx.TensorProto.DataType.Name(types[value])))
    return pairs, unknown


def _allowed(op: str, constraint: str, dtype: str) -> bool:
    return dtype in KERNELS_1_17.get((op, constraint), UNDISPATCHED.get((op, constraint), ()))


@pytest.fixture(scope="module")
def pairs_by_case():
    out = {}
    for name, case in CASES:
        proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
        dims = [d.dim_param for i in proto.graph.input for d in i.type.tensor_type.shape.dim]
        assert any(dims), f"{name}: no dynamic dim in the exported file"
        out[name] = used_pairs(proto)
    return out


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_bodies_use_only_pairs_onnxruntime_1_17_implements(pairs_by_case, name):
    pairs, unknown = pairs_by_case[name]
    assert not unknown, f"{name}: inputs of unknown element type: {unknown[:10]}"
    missing = sorted(p for p in pairs if not _allowed(*p))
    assert not missing, f"{name} uses (op, constraint, type) pairs onnxruntime 1.17 has no CPU kernel for: {missing}"


def test_the_table_holds_for_the_installed_onnxruntime(pairs_by_case):
    """The newest end of the range: the installed onnxruntime's own CPU kernels serve every pair."""
    kernels = {}
    for d in ort_state.get_all_opkernel_def():
        if d.provider == "CPUExecutionProvider" and d.domain in ("", "ai.onnx") and d.version_range[1] >= 20:
            for constraint, types in d.type_constraints.items():
                kernels.setdefault((d.op_name, constraint), set()).update(t[7:-1].upper() for t in types)
    used = set().union(*(pairs for pairs, _ in pairs_by_case.values()))
    missing = sorted((op, c, t) for op, c, t in used
                     if t not in kernels.get((op, c), UNDISPATCHED.get((op, c), ())))
    assert not missing, missing


def test_the_table_refuses_a_float64_product():
    """The pair onnxruntime 1.17 lacks (the guard of attr_prod_le used it) is refused."""
    node = onnx.helper.make_node("ReduceProd", ["x"], ["y"], keepdims=1)
    graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [3])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 20)])
    pairs, _ = used_pairs(model)
    assert pairs == {("ReduceProd", "T", "DOUBLE")} and not _allowed(*pairs.pop())
