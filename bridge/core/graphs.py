"""ONNX graphs: every walk over a model, its subgraphs and its functions, written once.

A model's *custom* nodes are those whose domain :func:`bridge.core.domains.is_custom` calls custom
(neither an ONNX domain nor one of onnxruntime's own); every lister here uses that one definition.

Example:
    >>> from onnx import helper
    >>> inner = helper.make_graph([helper.make_node("f", ["a"], ["b"], domain="d")], "inner", [], [])
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
    ...                        helper.make_node("If", ["c"], ["z"], then_branch=inner, else_branch=inner),
    ...                        helper.make_node("FusedConv", ["y"], ["w"], domain="com.microsoft")], "g", [], [])
    >>> [n.op_type for n in model_nodes(helper.make_model(g))]
    ['Relu', 'If', 'f', 'f', 'FusedConv']
    >>> custom_ops(helper.make_model(g))
    [('d', 'f')]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import onnx
import onnx.numpy_helper

from bridge.core.domains import ONNX_DOMAINS, STANDARD_DOMAINS, is_custom

# NOTE: the standard ops that carry subgraphs; walks skip the attributes of other standard nodes
# (a walk over a function body is then ~2.5x cheaper; sessions walk every body)
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def may_hold_subgraphs(node: onnx.NodeProto) -> bool:
    """Whether ``node`` can carry graph attributes: a standard control-flow op, or any non-standard node."""
    return node.op_type in SUBGRAPH_OPS or node.domain not in STANDARD_DOMAINS


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held by ``node``'s attributes (If branches, Loop/Scan bodies), not nested deeper."""
    return _graph_attributes(node) if may_hold_subgraphs(node) else []


def _graph_attributes(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    found = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph inside it, depth first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from graphs(sub)


def model_graphs(model: onnx.ModelProto, *, functions: bool = False) -> Iterator[onnx.GraphProto]:
    """The model's graph and its subgraphs; with ``functions``, the subgraphs inside its local functions too."""
    yield from graphs(model.graph)
    if functions:
        for function in model.functions:
            for node in function.node:
                for sub in subgraphs(node):
                    yield from graphs(sub)


def walk(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Each of ``nodes`` followed by the nodes of its subgraphs, depth first."""
    for node in nodes:
        yield node
        # NOTE: one call per node (subgraphs() would test the node again): sessions walk many nodes
        if may_hold_subgraphs(node):
            for sub in _graph_attributes(node):
                yield from walk(sub.node)


def model_nodes(model: onnx.ModelProto, *, functions: bool = False) -> Iterator[onnx.NodeProto]:
    """Every node of the model's graph and its subgraphs; with ``functions``, of its local functions too."""
    yield from walk(model.graph.node)
    if functions:
        for function in model.functions:
            yield from walk(function.node)


def custom_nodes(model: onnx.ModelProto, *, functions: bool = False) -> Iterator[onnx.NodeProto]:
    """The custom nodes among :func:`model_nodes`.

    NOTE: a local function that imports no custom domain holds no custom node (ONNX requires a
    function to import every domain its nodes use; onnx.checker and onnxruntime refuse a file that
    does not) and is not walked: sessions ask for a model's custom nodes twice, and function bodies
    are most of its nodes (the demo's: 228 of 242; each walk of them cost ~0.08 ms per session).

    Example:
        >>> from onnx import helper
        >>> calls = helper.make_function("d", "f", ["a"], ["b"], [helper.make_node("g", ["a"], ["b"], domain="d")],
        ...                              [helper.make_opsetid("", 18), helper.make_opsetid("d", 1)])
        >>> plain = helper.make_function("d", "g", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
        ...                              [helper.make_opsetid("", 18)])
        >>> graph = helper.make_graph([helper.make_node("f", ["x"], ["y"], domain="d")], "g", [], [])
        >>> model = helper.make_model(graph, functions=[calls, plain])
        >>> [n.op_type for n in custom_nodes(model)], [n.op_type for n in custom_nodes(model, functions=True)]
        (['f'], ['f', 'g'])
    """
    nodes = walk(model.graph.node)
    if functions:
        bodies = [f for f in model.functions if any(is_custom(o.domain) for o in f.opset_import)]
        nodes = itertools.chain(nodes, *(walk(f.node) for f in bodies))
    return (n for n in nodes if is_custom(n.domain))


def custom_ops(model: onnx.ModelProto, *, functions: bool = False) -> list[tuple[str, str]]:
    """Distinct ``(domain, op_type)`` of the model's custom nodes, in order of first appearance."""
    return list(dict.fromkeys((n.domain, n.op_type) for n in custom_nodes(model, functions=functions)))


def nonstandard_ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """Sorted distinct ``(domain, op_type)`` of nodes outside the ONNX domains (custom ops and
    onnxruntime's own alike): what a runtime other than onnxruntime may not run."""
    return sorted({(n.domain, n.op_type) for n in model_nodes(model) if n.domain not in ONNX_DOMAINS})


# NOTE: the ONNX ops whose outputs are drawn at random on every run; Dropout only in training mode
RANDOM_OPS = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli",
                        "Multinomial"})


def random_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of ``model`` (subgraphs and local functions included) that draw random numbers: the
    ``RANDOM_OPS``, and each Dropout whose ``training_mode`` input is not a constant false.

    Example:
        >>> from onnx import helper, TensorProto
        >>> on = helper.make_tensor("t", TensorProto.BOOL, [], [True])
        >>> g = helper.make_graph([helper.make_node("Dropout", ["x", "", "t"], ["y"], name="drop"),
        ...                        helper.make_node("Dropout", ["y"], ["z"], name="eval")], "g", [], [], [on])
        >>> [n.name for n in random_nodes(helper.make_model(g))]
        ['drop']
    """
    constants = {t.name: t for t in model.graph.initializer}
    constants.update((n.output[0], n.attribute[0].t) for n in model_nodes(model, functions=True)
                     if n.op_type == "Constant" and n.domain in ONNX_DOMAINS and n.output
                     and len(n.attribute) == 1 and n.attribute[0].name == "value")

    def training(node: onnx.NodeProto) -> bool:
        mode = node.input[2] if len(node.input) > 2 else ""
        if not mode:
            return False
        return mode not in constants or bool(onnx.numpy_helper.to_array(constants[mode]).any())

    return [n for n in model_nodes(model, functions=True) if n.domain in ONNX_DOMAINS and (
        n.op_type in RANDOM_OPS or (n.op_type == "Dropout" and training(n)))]


def value_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    """The type of each value of ``graph`` that it records (inputs, value_info, outputs, initializers)."""
    out = {v.name: v.type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    for t in graph.initializer:
        out[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return out


def model_value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """:func:`value_types` of the model's graph and its subgraphs (If/Loop/Scan bodies) together."""
    types: dict[str, onnx.TypeProto] = {}
    for graph in model_graphs(model):
        types.update(value_types(graph))
    return types


def value_names(graph: onnx.GraphProto | onnx.FunctionProto) -> set[str]:
    """Every value name used in ``graph`` (inputs, outputs, initializers, node inputs and outputs),
    its subgraphs included: the names a new value must avoid."""
    names = set(graph.input) if isinstance(graph, onnx.FunctionProto) else set()
    if isinstance(graph, onnx.GraphProto):
        for g in graphs(graph):
            names |= {v.name for v in (*g.input, *g.output, *g.value_info)} | {t.name for t in g.initializer}
    for node in walk(graph.node):
        names.update(node.input)
        names.update(node.output)
    names.discard("")
    return names


class FreshNames:
    """Hands out value names unused so far: ``hint`` itself when free, else ``hint__1``, ``hint__2`` ...

    >>> names = FreshNames({"x", "x__1"})
    >>> names("x"), names("x"), names("y")
    ('x__2', 'x__3', 'y')
    """

    def __init__(self, taken: Iterable[str] = ()):
        self.taken = set(taken)

    def __call__(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.taken:
            i += 1
            name = f"{hint}__{i}"
        self.taken.add(name)
        return name
