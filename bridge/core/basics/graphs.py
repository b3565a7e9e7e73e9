"""ONNX graphs: every walk over a model, its subgraphs and its functions, written once.

A model's *custom* nodes are those whose domain :func:`bridge.core.basics.domains.is_custom` calls custom
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

import hashlib
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
from onnx.helper import get_node_attr_value

from bridge.core.basics.domains import ONNX_DOMAINS, STANDARD_DOMAINS, is_custom, standard_opset

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


def cone(nodes: Sequence[onnx.NodeProto], names: Iterable[str]) -> list[onnx.NodeProto]:
    """The ``nodes`` (of one graph or function, in topological order) the values ``names`` depend on, in their
    order (a node's subgraphs' outer-scope reads count).

    >>> from onnx import helper
    >>> nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Abs", ["x"], ["b"]),
    ...          helper.make_node("Relu", ["a"], ["c"])]
    >>> [n.op_type for n in cone(nodes, ["c"])]
    ['Neg', 'Relu']
    """
    wanted = set(names)
    kept = []
    for node in reversed(nodes):
        if wanted.intersection(node.output):
            kept.append(node)
            wanted.update(name for inner in walk([node]) for name in inner.input)
    return kept[::-1]


def topological(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto] | None:
    """``nodes`` (of one graph or function) reordered so that each comes after the nodes writing the values it
    reads (its subgraphs' outer-scope reads too), moving no more than it must: each node in its given order,
    preceded by those it waits for that are not placed yet. None when the order holds already (nothing to
    rebuild). A cycle is left to whoever runs the nodes: an edge that closes one is not followed.

    >>> from onnx import helper
    >>> nodes = [helper.make_node("Relu", ["a"], ["c"]), helper.make_node("Abs", ["x"], ["b"]),
    ...          helper.make_node("Neg", ["x"], ["a"])]
    >>> [n.op_type for n in topological(nodes)], topological(nodes[1:])
    (['Neg', 'Relu', 'Abs'], None)
    >>> cycle = [helper.make_node("Neg", ["b"], ["a"]), helper.make_node("Abs", ["a"], ["b"])]
    >>> [n.op_type for n in topological(cycle[::-1])]
    ['Neg', 'Abs']
    """
    writer = {o: k for k, node in enumerate(nodes) for o in node.output if o}
    # NOTE: a node's own inputs, its subgraphs' only where it may hold some (sessions order every body: the
    # walk per node would cost them more than the check)
    reads = [[i for inner in walk([node]) for i in inner.input] if may_hold_subgraphs(node) else node.input
             for node in nodes]
    needs = [[writer[i] for i in names if i in writer] for names in reads]
    if all(w < k for k, waits in enumerate(needs) for w in waits):
        return None
    return [nodes[k] for k in _placed(needs)]


def _placed(needs: list[list[int]]) -> list[int]:
    """:func:`topological`'s order: each index in turn, after the indices it ``needs`` not placed yet (depth
    first), an edge back to one being placed (a cycle) not followed."""
    placed = [False] * len(needs)
    order: list[int] = []
    for start in range(len(needs)):
        if placed[start]:
            continue
        # NOTE: depth first without recursion: a chain of thousands of nodes would pass Python's recursion limit
        stack, open_ = [(start, 0)], {start}
        while stack:
            k, at = stack[-1]
            if at < len(needs[k]):
                stack[-1] = (k, at + 1)
                w = needs[k][at]
                if not placed[w] and w not in open_:
                    stack.append((w, 0))
                    open_.add(w)
                continue
            stack.pop()
            if not placed[k]:
                placed[k] = True
                order.append(k)
    return order


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
        nodes = itertools.chain(nodes, *(walk(f.node) for f in calling_functions(model)))
    return (n for n in nodes if is_custom(n.domain))


def calling_functions(model: onnx.ModelProto) -> list[onnx.FunctionProto]:
    """The local functions of ``model`` that may hold custom nodes: those importing a custom domain."""
    return [f for f in model.functions if any(is_custom(o.domain) for o in f.opset_import)]


def custom_nodes_with_branch(model: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, tuple[str, bool] | None]]:
    """The custom nodes of ``model``'s graph and subgraphs, each with the branch it runs in: for a node
    directly in a branch of an If of the main graph, that If's condition value and whether the branch
    is ``then_branch``; None for any other (it runs whenever the graph it sits in runs, as far as the main
    graph can tell).

    Example:
        >>> from onnx import helper
        >>> branch = lambda name: helper.make_graph([helper.make_node("f", ["x"], [name], domain="d")], name, [], [])
        >>> node = helper.make_node("If", ["c"], ["y"], then_branch=branch("a"), else_branch=branch("b"))
        >>> model = helper.make_model(helper.make_graph([node, helper.make_node("f", ["x"], ["z"], domain="d")],
        ...                                             "g", [], []))
        >>> [(n.output[0], when) for n, when in custom_nodes_with_branch(model)]
        [('b', ('c', False)), ('a', ('c', True)), ('z', None)]
    """
    for node in model.graph.node:
        branches = [(a.name, a.g) for a in node.attribute if a.name in ("then_branch", "else_branch")] \
            if node.op_type == "If" and not is_custom(node.domain) else []
        for name, branch in branches:
            for inner in branch.node:
                when = (node.input[0], name == "then_branch")
                yield from ((n, when if n is inner else None) for n in walk([inner]) if is_custom(n.domain))
        if not branches:
            yield from ((n, None) for n in walk([node]) if is_custom(n.domain))


def ir_custom_nodes(model: ir.Model, *, functions: bool = True) -> list[ir.Node]:
    """:func:`custom_nodes` of an onnx-ir model, its local functions included with ``functions`` (those that
    import a custom domain), walked by onnx-ir's ``RecursiveGraphIterator``; a list, so the caller may edit
    the model's functions while it goes through them.

    Example:
        >>> from onnx import helper
        >>> calls = helper.make_function("d", "f", ["a"], ["b"], [helper.make_node("g", ["a"], ["b"], domain="d")],
        ...                              [helper.make_opsetid("", 18), helper.make_opsetid("d", 1)])
        >>> graph = helper.make_graph([helper.make_node("f", ["x"], ["y"], domain="d")], "g", [], [])
        >>> model = ir.serde.deserialize_model(helper.make_model(graph, functions=[calls]))
        >>> [n.op_type for n in ir_custom_nodes(model)]
        ['f', 'g']
    """
    bodies = [f for f in model.functions.values() if functions and any(is_custom(d) for d in f.opset_imports)]
    nodes = itertools.chain(ir.traversal.RecursiveGraphIterator(model.graph),
                            *(ir.traversal.RecursiveGraphIterator(f) for f in bodies))
    return [n for n in nodes if is_custom(n.domain)]


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


def unproduced_outputs(function: onnx.FunctionProto) -> list[str]:
    """The outputs of ``function`` that no node of its body writes and no input is: a body a tool emptied or cut.

    >>> from onnx import helper
    >>> unproduced_outputs(helper.make_function("d", "f", ["x"], ["y", "x"], [], []))
    ['y']
    """
    made = {*function.input, *(name for node in function.node for name in node.output)}
    return [name for name in function.output if name and name not in made]


class FreshNames:
    """Hands out value names unused so far: ``hint`` itself when free, else ``hint__1``, ``hint__2`` ...;
    or, numbered, ``prefix1``, ``prefix2`` ... (one count per prefix, taken names skipped).

    >>> names = FreshNames({"x", "x__1", "v2"})
    >>> names("x"), names("x"), names("y"), names.numbered("v"), names.numbered("v")
    ('x__2', 'x__3', 'y', 'v1', 'v3')
    """

    def __init__(self, taken: Iterable[str] = ()):
        self.taken = set(taken)
        self._counts: dict[str, int] = {}

    def __call__(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.taken:
            i += 1
            name = f"{hint}__{i}"
        self.taken.add(name)
        return name

    def numbered(self, prefix: str) -> str:
        """The next ``prefix<k>`` not taken, counting up from 1 per prefix."""
        while True:
            k = self._counts[prefix] = self._counts.get(prefix, 0) + 1
            if f"{prefix}{k}" not in self.taken:
                self.taken.add(f"{prefix}{k}")
                return f"{prefix}{k}"


def model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in ``model``: the initializers and tensor attributes of its graph, its
    subgraphs and its local functions (the tensors onnx's external-data helpers visit; their walk costs
    ~5x this one, and sessions make it on every file they are given by path)."""
    for graph in model_graphs(model, functions=True):
        yield from graph.initializer
    for node in model_nodes(model, functions=True):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors


class ProtoMemo:
    """What was computed from a proto, kept by its content (the digest of its bytes): sessions opened
    again on the same file (workers, threads, reloads) redo no work on its function bodies. Bounded
    (the oldest entry goes first) and safe across threads.

    >>> memo = ProtoMemo(size=1)
    >>> f = onnx.helper.make_function("d", "f", ["x"], ["y"], [], [])
    >>> key = ProtoMemo.key(f)
    >>> memo.put(key, "seen"); memo.get(key), memo.get(ProtoMemo.key(onnx.FunctionProto()))
    ('seen', None)
    """

    def __init__(self, size: int = 256):
        self._items: dict[bytes, object] = {}
        self._size = size
        self._lock = threading.Lock()

    @staticmethod
    def key(proto) -> bytes:
        return hashlib.blake2b(proto.SerializeToString(), digest_size=16).digest()

    def get(self, key: bytes):
        with self._lock:
            return self._items.get(key)

    def put(self, key: bytes, value) -> None:
        with self._lock:
            if key not in self._items and len(self._items) >= self._size:
                self._items.pop(next(iter(self._items)))
            self._items[key] = value


# NOTE: Constant's literal attributes -> (element type, 1-D or scalar). Tools that fold constants
# (onnx-graphsurgeon, polygraphy, onnxslim) read value_float as float64, and onnxruntime's
# symbolic_shape_infer reads only ``value=``: every Constant opbridge writes is a tensor.
_LITERALS = {
    "value_float": (onnx.TensorProto.FLOAT, False), "value_int": (onnx.TensorProto.INT64, False),
    "value_floats": (onnx.TensorProto.FLOAT, True), "value_ints": (onnx.TensorProto.INT64, True),
    "value_string": (onnx.TensorProto.STRING, False), "value_strings": (onnx.TensorProto.STRING, True),
}


def tensor_constants(nodes: Iterable[onnx.NodeProto]) -> int:
    """Rewrite each literal ``Constant(value_float|value_int|value_floats|value_ints|value_string(s)=...)``
    among ``nodes`` and their subgraphs as ``Constant(value=<tensor>)`` (float32 / int64 / string; a
    scalar for the singular forms, 1-D for the lists), in place; return how many. A constant taken
    from a function attribute (``ref_attr_name``) stays: its value is known only per call.

    Example:
        >>> from onnx import helper
        >>> nodes = [helper.make_node("Constant", [], ["k"], value_float=0.5),
        ...          helper.make_node("Constant", [], ["a"], value_ints=[1, 2])]
        >>> tensor_constants(nodes), [(a.name, a.t.data_type, list(a.t.dims)) for n in nodes for a in n.attribute]
        (2, [('value', 1, []), ('value', 7, [2])])
    """
    count = 0
    for node in walk(nodes):
        if node.op_type != "Constant" or node.domain not in ONNX_DOMAINS or len(node.attribute) != 1:
            continue
        attr = node.attribute[0]
        if attr.ref_attr_name or attr.name not in _LITERALS:
            continue
        dtype, listed = _LITERALS[attr.name]
        values = list(onnx.helper.get_attribute_value(attr)) if listed else [onnx.helper.get_attribute_value(attr)]
        tensor = onnx.helper.make_tensor("value", dtype, [len(values)] if listed else [], values)
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("value", tensor))
        count += 1
    return count


def model_tensor_constants(model: onnx.ModelProto) -> int:
    """:func:`tensor_constants` over the model's graph, its subgraphs and its local functions."""
    return tensor_constants(model.graph.node) + sum(tensor_constants(f.node) for f in model.functions)


# NOTE: the ops a type probe's condition is made of: each evaluated with numpy from constants and
# from the element type (never the values) of a value that is CastLike's second input
_PROBE_OPS = {
    "Cast": lambda node, a: a[0].astype(onnx.helper.tensor_dtype_to_np_dtype(get_node_attr_value(node, "to"))),
    "CastLike": lambda node, a: a[0].astype(a[1].dtype),
    "Not": lambda node, a: np.logical_not(a[0]),
    "Identity": lambda node, a: a[0],
}


def _probe_value(name: str, producers: dict, types: dict, cone: list) -> np.ndarray | None:
    """The value of ``name`` when constants and known element types decide it, else None; the
    nodes it was computed from are appended to ``cone``."""
    node = producers.get(name)
    if node is None or node.domain not in ONNX_DOMAINS:
        return None
    if node.op_type == "Constant":
        attr = node.attribute[0] if len(node.attribute) == 1 else None
        if attr is None or attr.ref_attr_name or attr.name != "value":
            return None
        cone.append(node)
        return onnx.numpy_helper.to_array(attr.t)
    if node.op_type not in _PROBE_OPS:
        return None
    args = [_probe_value(node.input[0], producers, types, cone)]
    if node.op_type == "CastLike":
        like = types.get(node.input[1])
        elem = like.tensor_type.elem_type if like is not None and like.HasField("tensor_type") else 0
        args.append(np.zeros(0, onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else None)
    if any(a is None for a in args):
        return None
    cone.append(node)
    return _PROBE_OPS[node.op_type](node, args)


def fold_type_probes(model: onnx.ModelProto) -> int:
    """Replace each ``If`` of the model's graph whose condition constants and the inferred element
    types decide (a dtype probe such as ``Cast(CastLike(1e-300, x), to=BOOL)``: true for float64
    ``x`` only) by the nodes of the branch it takes; the probe's nodes go when nothing else reads
    them; then every Cast the known types make a no-op is an Identity (:func:`identity_casts`). Needs
    the value types (``onnx.shape_inference``). Returns how many were folded.

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> probe = helper.make_tensor("p", T.DOUBLE, [], [1e-300])
        >>> branch = lambda op: helper.make_graph([helper.make_node(op, ["x"], ["b"])], op, [],
        ...                                        [helper.make_tensor_value_info("b", T.FLOAT, [2])])
        >>> g = helper.make_graph([helper.make_node("Constant", [], ["p"], value=probe),
        ...     helper.make_node("CastLike", ["p", "x"], ["q"]), helper.make_node("Cast", ["q"], ["c"], to=T.BOOL),
        ...     helper.make_node("If", ["c"], ["y"], then_branch=branch("Neg"), else_branch=branch("Abs"))],
        ...     "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
        ...     [helper.make_tensor_value_info("y", T.FLOAT, [2])])
        >>> m = helper.make_model(g)
        >>> fold_type_probes(m), [(n.op_type, list(n.output)) for n in m.graph.node]
        (1, [('Abs', ['y'])])
    """
    types = model_value_types(model)
    folded = _fold_probes(model.graph, types)
    opset = standard_opset((o.domain, o.version) for o in model.opset_import)
    if opset is not None:
        identity_casts(model.graph.node, element_types(walk(model.graph.node), types, opset))
    return folded


def fold_function_type_probes(model: onnx.ModelProto, types: dict[str, onnx.TypeProto]) -> int:
    """:func:`fold_type_probes` inside each local function whose every call (in the graph and its
    subgraphs) passes inputs of the same element types, read from ``types`` (value name -> type, as
    ``onnx.shape_inference`` gives them): its body then serves those types only, as its calls do.
    Returns how many ``If`` nodes were folded.

    NOTE: a Cast these types make a no-op stays in the body (unlike :func:`fold_type_probes`'s
    graph): onnxconverter-common's float16 converters retype the calls and leave bodies as they are,
    and the Cast (float16 to the float32 accumulator) is what lets the body serve the new type."""
    calls: dict[tuple[str, str, str], set[tuple]] = {}
    for node in model_nodes(model):
        elems = tuple(types[i].tensor_type.elem_type if i in types else 0 for i in node.input)
        calls.setdefault((node.domain, node.op_type, node.overload), set()).add(elems)
    folded = 0
    for function in model.functions:
        signatures = calls.get((function.domain, function.name, function.overload), set())
        if len(signatures) != 1 or 0 in min(signatures):
            continue  # NOTE: unused, called with several type lists, or with a type unknown
        (elems,) = signatures
        inputs = {x: onnx.helper.make_tensor_type_proto(t, None) for x, t in zip(function.input, elems)}
        folded += _fold_probes(function, inputs)
    return folded


def element_types(nodes: Iterable[onnx.NodeProto], types: dict[str, onnx.TypeProto], opset: int
                  ) -> dict[str, onnx.TypeProto]:
    """``types`` (value name -> type) with the types ONNX's own per-node inference gives the outputs
    of ``nodes`` (standard ONNX ops at ``opset``, in order), where it can: a node with an input of
    unknown type, a function attribute reference or a subgraph is skipped (its outputs stay unknown)."""
    known = dict(types)
    imports = [onnx.helper.make_opsetid("", opset)]
    for node in nodes:
        if all(o in known for o in node.output) or node.domain not in ONNX_DOMAINS or may_hold_subgraphs(node) \
                or any(a.ref_attr_name for a in node.attribute) or any(i and i not in known for i in node.input):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
            known.update(onnx.shape_inference.infer_node_outputs(
                schema, node, {i: known[i] for i in node.input if i}, opset_imports=imports))
        except Exception:  # noqa: BLE001  what ONNX cannot infer here stays unknown
            continue
    return known


def _elem(types: dict[str, onnx.TypeProto], name: str) -> int:
    t = types.get(name)
    return t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else 0


def identity_casts(nodes: Iterable[onnx.NodeProto], types: dict[str, onnx.TypeProto]) -> int:
    """Make each ``Cast`` among ``nodes`` (and their subgraphs) whose input already has the type it
    casts to an ``Identity`` (a ``CastLike`` too, when its two inputs have one type), in place; return
    how many. ``types`` gives the value types (unknown: the Cast stays). A body that takes the branch
    its input types decide holds such Casts (float32 input cast to its float32 accumulator);
    onnxconverter-common's float16 converters retype their outputs but not the Casts, and onnxruntime
    then refuses the file.

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> nodes = [helper.make_node("Cast", ["x"], ["a"], to=T.FLOAT),
        ...          helper.make_node("Cast", ["x"], ["b"], to=T.DOUBLE)]
        >>> identity_casts(nodes, {"x": helper.make_tensor_type_proto(T.FLOAT, None)}), [n.op_type for n in nodes]
        (1, ['Identity', 'Cast'])
    """
    count = 0
    for node in walk(nodes):
        if node.domain not in ONNX_DOMAINS or node.op_type not in ("Cast", "CastLike") or not node.input:
            continue
        if node.op_type == "Cast":
            to = next((a for a in node.attribute if a.name == "to"), None)
            target = 0 if to is None or to.ref_attr_name else to.i
        else:
            target = _elem(types, node.input[1]) if len(node.input) > 1 else 0
        if not target or _elem(types, node.input[0]) != target:
            continue
        node.op_type = "Identity"
        del node.input[1:]
        del node.attribute[:]
        count += 1
    return count


def _fold_probes(graph: onnx.GraphProto | onnx.FunctionProto, types: dict[str, onnx.TypeProto]) -> int:
    producers = {o: n for n in graph.node for o in n.output}
    folded, probes = 0, []
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        cone: list[onnx.NodeProto] = []
        value = _probe_value(node.input[0], producers, types, cone) if node.op_type == "If" else None
        branch = None if value is None or value.size != 1 else next(
            a.g for a in node.attribute if a.name == ("then_branch" if bool(value.reshape(-1)[0]) else "else_branch"))
        if branch is None or (branch.initializer and isinstance(graph, onnx.FunctionProto)):
            nodes.append(node)
            continue
        hoisted = _hoisted(branch, list(node.output))
        for inner in hoisted:  # NOTE: node names stay unique (a branch numbers its nodes as its graph does)
            inner.name = f"{node.name or node.output[0]}/{inner.name}" if inner.name else ""
        nodes += hoisted
        if isinstance(graph, onnx.GraphProto):
            graph.initializer.extend(branch.initializer)
        probes += cone
        folded += 1
    del graph.node[:]
    graph.node.extend(nodes)
    drop_unread(graph, probes)
    return folded


def _hoisted(branch: onnx.GraphProto, outputs: list[str]) -> list[onnx.NodeProto]:
    """``branch``'s nodes writing the If's ``outputs`` (renamed, or an Identity for an outer value)."""
    renames = {b.name: o for b, o in zip(branch.output, outputs)}
    made = {n for node in branch.node for n in node.output}
    nodes = list(branch.node)
    for node in nodes:
        node.output[:] = [renames.get(o, o) for o in node.output]
    for node in walk(nodes):
        node.input[:] = [renames.get(i, i) if i in made else i for i in node.input]
    return nodes + [onnx.helper.make_node("Identity", [b], [o]) for b, o in renames.items() if b not in made]


def drop_unread(graph: onnx.GraphProto | onnx.FunctionProto, candidates: list[onnx.NodeProto]) -> None:
    """Remove the nodes writing ``candidates``' outputs that nothing reads any more (repeated: a
    chain goes whole)."""
    doomed = {o for n in candidates for o in n.output}
    outputs = set(graph.output) if isinstance(graph, onnx.FunctionProto) else {o.name for o in graph.output}
    while True:
        read = outputs | {i for node in walk(graph.node) for i in node.input}
        kept = [n for n in graph.node if not n.output or not all(o in doomed and o not in read for o in n.output)]
        if len(kept) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(kept)
