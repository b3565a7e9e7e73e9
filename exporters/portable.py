"""Files every ONNX consumer accepts: the lowest IR version the file needs, and no path of the
exporting machine inside it.

``stamp_ir_version`` writes the lowest IR version that the opsets, element types and proto
features of a model need (opset <= 20 -> IR <= 9, which onnxruntime 1.17 loads); below IR 10,
the IR-10 ``metadata_props`` of nodes, values, tensors, graphs and functions are folded into
their ``doc_string`` (an IR-1 field), so nothing is lost. ``relativize_paths`` rewrites every
absolute path in doc strings and metadata (torch.onnx stores stack traces there) relative to its
package root or a ``sys.path`` entry (``custom_ops/demo.py``, ``torch/nn/modules/conv.py``), or
to its file name.

Example:
    >>> from onnx import helper
    >>> model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 20)])
    >>> model.ir_version > 9, stamp_ir_version(model), model.ir_version
    (True, 9, 9)
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Iterator

import onnx
from onnx import helper

from bridge.core.basics.graphs import graphs, model_graphs, model_nodes

# NOTE: element types by the IR version that introduced them (onnx.proto's IR history).
_TYPE_IR = {getattr(onnx.TensorProto, name): ir for name, ir in (
    ("FLOAT8E4M3FN", 9), ("FLOAT8E4M3FNUZ", 9), ("FLOAT8E5M2", 9), ("FLOAT8E5M2FNUZ", 9),
    ("UINT4", 10), ("INT4", 10), ("FLOAT4E2M1", 11), ("FLOAT8E8M0", 12), ("UINT2", 13), ("INT2", 13),
    ("FLOAT6E2M3", 14), ("FLOAT6E3M2", 14)) if hasattr(onnx.TensorProto, name)}
METADATA_IR = 10  # NOTE: metadata_props on nodes/values/tensors/graphs/functions, function overloads


def _annotated(model: onnx.ModelProto) -> Iterator:
    """Every proto of ``model`` that has ``doc_string`` and (from IR 10) ``metadata_props``."""
    for graph in model_graphs(model, functions=True):
        yield graph
        yield from itertools.chain(graph.input, graph.output, graph.value_info, graph.initializer)
    yield from model_nodes(model, functions=True)
    for function in model.functions:
        yield function
        yield from function.value_info


def _tensor_types(type_proto: onnx.TypeProto) -> Iterator[int]:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        yield getattr(type_proto, kind).elem_type
    elif kind in ("sequence_type", "optional_type"):
        yield from _tensor_types(getattr(type_proto, kind).elem_type)
    elif kind == "map_type":
        yield type_proto.map_type.key_type
        yield from _tensor_types(type_proto.map_type.value_type)


def _element_types(model: onnx.ModelProto) -> Iterator[int]:
    for graph in graphs(model.graph):
        for value in itertools.chain(graph.input, graph.output, graph.value_info):
            yield from _tensor_types(value.type)
        yield from (t.data_type for t in graph.initializer)
        yield from (t.values.data_type for t in graph.sparse_initializer)
    for function in model.functions:
        for value in function.value_info:
            yield from _tensor_types(value.type)
    for node in model_nodes(model, functions=True):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t.data_type
            elif attr.type == onnx.AttributeProto.TYPE_PROTO:
                yield from _tensor_types(attr.tp)
            elif attr.name == "to" and attr.type == onnx.AttributeProto.INT:  # Cast and friends
                yield attr.i


def required_ir_version(model: onnx.ModelProto, *, metadata: bool = False) -> int:
    """The lowest IR version ``model`` needs: its opsets (functions' too), element types, function
    features; ``metadata=True`` also counts IR-10 ``metadata_props`` (``stamp_ir_version`` folds them).

    Example:
        >>> from onnx import helper
        >>> def model(opset): return helper.make_model(helper.make_graph([], "g", [], []),
        ...                                            opset_imports=[helper.make_opsetid("", opset)])
        >>> [required_ir_version(model(v)) for v in (17, 20, 21, 23)]
        [8, 9, 10, 11]
    """
    imports = list(model.opset_import) + [o for f in model.functions for o in f.opset_import]
    need = helper.find_min_ir_version_for(imports, ignore_unknown=True) if imports else 3
    if model.functions:
        need = max(need, 8)
    if any(f.attribute_proto for f in model.functions):
        need = max(need, 9)
    if any(f.overload for f in model.functions) or any(n.overload for n in model_nodes(model, functions=True)):
        need = max(need, METADATA_IR)
    need = max([need, *(_TYPE_IR.get(t, 0) for t in _element_types(model))])
    if metadata and any(p.metadata_props for p in _annotated(model)):
        need = max(need, METADATA_IR)
    return need


def stamp_ir_version(model: onnx.ModelProto) -> int:
    """Set ``model.ir_version`` to the lowest version it needs and return it; below IR 10, fold
    ``metadata_props`` of nodes, values, tensors, graphs and functions into their ``doc_string``
    and drop functions' ``value_info`` (optional type hints, an IR-10 field)."""
    need = required_ir_version(model)
    if need < METADATA_IR:
        for proto in list(_annotated(model)):
            if proto.metadata_props:
                lines = [f"{p.key}: {p.value}" for p in proto.metadata_props]
                proto.doc_string = "\n".join(filter(None, [proto.doc_string, *lines]))
                del proto.metadata_props[:]
        for function in model.functions:
            del function.value_info[:]
    model.ir_version = need
    return need


# NOTE: an absolute POSIX or Windows path with at least two parts, not glued to a word before it
# (so "Module/child" scopes and "a//b" are left alone).
_ABS_PATH = re.compile(r"(?<![\w.~$%-])(?:[A-Za-z]:[\\/]|/)(?:[^\s\"'<>|*?,;()\[\]{}:\\/]+[\\/])+"
                       r"[^\s\"'<>|*?,;()\[\]{}:\\/]+")


def _roots() -> list[str]:
    entries = [os.getcwd(), *(p for p in sys.path if p)]
    return sorted({os.path.abspath(p) for p in entries if os.path.isabs(p) or p == os.getcwd()},
                  key=len, reverse=True)


def portable_path(path: str, roots: list[str] | None = None) -> str:
    """``path`` relative to its package root (the folder above its outermost package), else to the
    longest ``sys.path`` entry or current folder holding it, else its file name.

    Example:
        >>> import torch.nn.modules.conv as conv
        >>> portable_path(conv.__file__)
        'torch/nn/modules/conv.py'
    """
    native = os.path.normpath(path)
    folder = os.path.dirname(native)
    root = folder
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.dirname(root) != root:
        root = os.path.dirname(root)
    if root != folder:
        return os.path.relpath(native, root).replace(os.sep, "/")
    for base in _roots() if roots is None else roots:
        if native == base or native.startswith(base.rstrip(os.sep) + os.sep):
            return os.path.relpath(native, base).replace(os.sep, "/")
    return re.split(r"[\\/]", native)[-1]


def _relativize(text: str, roots: list[str]) -> str:
    def one(match: re.Match) -> str:
        path = match.group(0)
        top = re.match(r"(?:[A-Za-z]:[\\/]|/)[^\\/]+", path)
        # NOTE: a path of this machine starts with a folder that exists here; other text is left alone
        if top is None or not os.path.isdir(top.group(0)):
            return path
        return portable_path(path, roots)

    return _ABS_PATH.sub(one, text)


def relativize_paths(model: onnx.ModelProto) -> int:
    """Rewrite absolute paths in doc strings and metadata values of ``model`` (stack traces of the
    exporting machine) with :func:`portable_path`; return how many strings changed. Attribute
    values are data and stay as they are."""
    roots = _roots()
    changed = 0

    def fix(text: str) -> str:
        nonlocal changed
        new = _relativize(text, roots) if ("/" in text or "\\" in text) else text
        changed += new != text
        return new

    for proto in itertools.chain([model], _annotated(model)):
        proto.doc_string = fix(proto.doc_string)
        for prop in proto.metadata_props:
            prop.value = fix(prop.value)
    return changed
