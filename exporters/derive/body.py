"""The translated trace as the op's FunctionProto: the op's domain, name, input and attribute names;
int attributes the trace kept symbolic read from the node (``Constant <value_int: int = @k>``)."""

from __future__ import annotations

import onnx
from onnx import helper

from bridge.core.basics.graphs import FreshNames, subgraphs
from bridge.core.spec import OpSpec, Param, bind_attribute_defaults


class _Names:
    """Value names inside the body: op inputs keep the op's names, nothing else may take them."""

    def __init__(self, reserved: set[str]):
        self.fresh = FreshNames(reserved)
        self.map: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name and name not in self.map:
            self.map[name] = self.fresh(name)
        return self.map.get(name, name)


# NOTE: how a derived body's doc_string starts: such a body was checked at sizes 0 and 1 (its crashes recorded)
DERIVED = "derived by opbridge from the PyTorch implementation of"

def _renamed(node: onnx.NodeProto, names: _Names) -> onnx.NodeProto:
    """``node`` with its values renamed and without torch.onnx's notes (stack traces, scopes: the
    exporting machine's paths; a body is the same bytes wherever it was derived)."""
    out = onnx.NodeProto()
    out.CopyFrom(node)
    out.input[:] = [names(n) for n in node.input]
    out.output[:] = [names(n) for n in node.output]
    out.doc_string = ""
    del out.metadata_props[:]
    for g in subgraphs(out):  # NOTE: subgraphs read outer values by name
        _rename_graph(g, names)
    return out


def _rename_graph(graph: onnx.GraphProto, names: _Names) -> None:
    graph.doc_string = ""
    del graph.metadata_props[:]
    for v in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]:
        v.name = names(v.name)
    renamed = [_renamed(n, names) for n in graph.node]
    del graph.node[:]
    graph.node.extend(renamed)


def _attribute_constant(name: str, field: str) -> onnx.NodeProto:
    """``name = Constant <field = @name>``: the node's attribute ``name`` as a value of the body."""
    kind = onnx.AttributeProto.INT if field == "value_int" else onnx.AttributeProto.INTS
    node = helper.make_node("Constant", [], [name])
    node.attribute.append(helper.make_attribute_ref(field, kind, ref_attr_name=name))
    return node


def _element(p: Param, j: int, whole: set[str], names: _Names) -> list[onnx.NodeProto]:
    """Nodes giving element ``j`` of int[] attribute ``p`` (its last output); the whole list's Constant
    once per attribute (``whole`` records those emitted)."""
    nodes = []
    if p.name not in whole:
        whole.add(p.name)
        nodes.append(_attribute_constant(p.name, "value_ints"))
    index = names.fresh(f"{p.name}_{j}_index")
    return nodes + [helper.make_node("Constant", [], [index], value_int=j),
                    helper.make_node("Gather", [p.name, index], [names.fresh(f"{p.name}_{j}")], axis=0)]


def _inputs(graph: onnx.GraphProto, roles: dict[str, tuple], names: _Names) -> list[onnx.NodeProto]:
    """Map the graph's inputs to the body's values: a tensor keeps its op input's name, an int attribute
    becomes a Constant reading it (an int[] element, a Gather from the whole list)."""
    nodes: list[onnx.NodeProto] = []
    whole: set[str] = set()  # int[] attributes whose Constant (all elements) is emitted
    for inp in graph.input:
        kind, a, b = roles[inp.name]
        if kind == "tensor":
            names.map[inp.name] = b.name
        elif b is None:  # an int attribute: the op's own name
            names.map[inp.name] = a.name
            nodes.append(_attribute_constant(a.name, "value_int"))
        else:  # one element of an int[] attribute
            nodes += _element(a, b, whole, names)
            names.map[inp.name] = nodes[-1].output[0]
    return nodes


def _outputs(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], names: _Names) -> list[str]:
    """The body's output names; an output that is an input or repeats another gets an Identity (appended)."""
    outputs: list[str] = []
    produced = {o for n in nodes for o in n.output}
    for o in graph.output:
        name = names(o.name)
        if name not in produced or name in outputs:  # an input or a repeated value: give it its own output
            copy = names.fresh(f"{name}__out")
            nodes.append(helper.make_node("Identity", [name], [copy]))
            name = copy
        outputs.append(name)
    return outputs


def function_body(spec: OpSpec, model: onnx.ModelProto, roles: dict[str, tuple],
                  parametric: set[str]) -> onnx.FunctionProto:
    """The FunctionProto of ``spec`` from ``model`` (the translated trace): ``roles`` maps each graph
    input to its role (tracing.flat_roles), ``parametric`` names the attributes the body reads."""
    graph = model.graph
    names = _Names({p.name for p in spec.params})
    nodes = _inputs(graph, roles, names)
    nodes += [helper.make_node("Constant", [], [names(t.name)], value=t) for t in graph.initializer]
    nodes += [_renamed(n, names) for n in graph.node]
    outputs = _outputs(graph, nodes, names)
    attrs = [p for p in spec.attributes if p.name in parametric]
    proto = helper.make_function(
        spec.domain, spec.name, [p.name for p in spec.tensors], outputs, nodes,
        opset_imports=list(model.opset_import),
        attributes=[p.name for p in attrs],
        doc_string=f"{DERIVED} {spec.qualname}")
    return bind_attribute_defaults(spec, proto)
