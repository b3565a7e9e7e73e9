"""A user's own custom-op library (a ``.so`` built elsewhere, e.g. mmdeploy's
``libmmdeploy_onnxruntime_ops.so``): checked before a session loads it, and asked which of a
model's custom nodes it serves.

A library tells no one which ops it registers: onnxruntime is asked instead. For each distinct
``(domain, op_type)`` of the model, a one-node model holding a copy of its first node (its
attributes, inputs typed as the model records them) is opened once without the library and once
with it. The library serves the op when the two answers differ: without it onnxruntime says the op
is not registered; with it the node loads, or fails on something the library's own schema checks
(a type, an attribute), which is the library's kernel speaking. Answers are kept per process, keyed
by the library file (path, size, modification time) and the probe node.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import onnx
import onnxruntime as ort

from bridge.core.basics.errors import OpBridgeError  # noqa: F401  (doctest)
from bridge.core.basics.files import check_library_file
from ort_kernels.base import Paths, Plan, Session, load_error, node_types

_ANSWERS: dict[tuple, str | None] = {}
_LOADS: set[tuple[str, int, int]] = set()
_LOCK = threading.Lock()


def user_libraries(library: Paths | None) -> list[str]:
    """``library`` (one path or several) as a list of checked paths: each exists, is a file and
    loads into onnxruntime; errors name the path and onnxruntime's own message."""
    if library is None:
        return []
    paths = [library] if isinstance(library, (str, os.PathLike)) else list(library)
    return [check_library(p) for p in paths]


def check_library(path: str | os.PathLike) -> str:
    """``path``, absolute, once it is a file onnxruntime loads as a custom-op library.

    NOTE: absolute, since the loader reads a name without a slash (``libx.so``) as a library to
    search for on the system's paths, not as the file in the current folder.

    >>> try:
    ...     check_library("no/such/lib.so")
    ... except OpBridgeError as e:
    ...     print(str(e).split(". ")[0])
    opbridge: no native kernel library at 'no/such/lib.so'
    """
    text = check_library_file(path)
    full = os.path.abspath(text)
    stat = os.stat(full)
    key = (full, stat.st_size, stat.st_mtime_ns)
    if key in _LOADS:  # NOTE: loaded once in this process: sessions opened again skip the load
        return full
    try:
        ort.SessionOptions().register_custom_ops_library(full)
    except Exception as e:  # noqa: BLE001  onnxruntime's own words say why (not ELF, a missing dependency, ...)
        raise load_error(text, e, f"Rebuild it for this onnxruntime ({ort.__version__}), or place the libraries "
                                  "it needs beside it.") from None
    _LOADS.add(key)
    return full


def _probe(node: onnx.NodeProto, types: dict[str, onnx.TypeProto], model: onnx.ModelProto) -> bytes:
    """A one-node model holding a copy of ``node`` (inputs ``i0``..., outputs ``o0``...), serialised."""
    probe = onnx.NodeProto()
    probe.CopyFrom(node)
    probe.name = "probe"
    del probe.input[:], probe.output[:]
    inputs = []
    for k, name in enumerate(node.input):
        if not name:  # NOTE: an omitted optional input stays omitted
            probe.input.append("")
            continue
        kind = types.get(name)
        if kind is None or not kind.HasField("tensor_type"):
            kind = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
        inputs.append(onnx.helper.make_value_info(f"i{k}", kind))
        probe.input.append(f"i{k}")
    probe.output.extend(f"o{k}" if name else "" for k, name in enumerate(node.output))
    outputs = [onnx.ValueInfoProto(name=o) for o in probe.output if o]
    graph = onnx.helper.make_graph([probe], "probe", inputs, outputs)
    imports = [i for i in model.opset_import if i.domain in ("", "ai.onnx", node.domain)]
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=model.ir_version).SerializeToString()


def _answer(content: bytes, library: str | None) -> str | None:
    """onnxruntime's error for opening ``content`` (with ``library`` registered), None when it opens."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # NOTE: the probe's failures are expected: no log lines
    if library is not None:
        options.register_custom_ops_library(library)
    try:
        Session(content, options)
    except Exception as e:  # noqa: BLE001  the answer is the message itself
        return str(e)
    return None


def _cached(key: tuple, content: bytes, library: str | None) -> str | None:
    with _LOCK:
        if key in _ANSWERS:
            return _ANSWERS[key]
    answer = _answer(content, library)
    with _LOCK:
        _ANSWERS[key] = answer
    return answer


def serves(library: str, node: onnx.NodeProto, types: dict[str, onnx.TypeProto], model: onnx.ModelProto) -> bool:
    """Whether onnxruntime resolves ``node`` through ``library``'s kernels (see the module's note)."""
    content = _probe(node, types, model)
    stat = os.stat(library)
    without = _cached((None, content), content, None)
    with_it = _cached((os.path.realpath(library), stat.st_size, stat.st_mtime_ns, content), content, library)
    return with_it is None or with_it != without


def served_by(libraries: Sequence[str], plan: Plan) -> dict[tuple[str, str], str]:
    """(domain, op_type) of the plan's custom nodes -> the first of ``libraries`` that serves it: nodes
    of the graph, its subgraphs (If/Loop bodies) and its local functions (other ops' bodies) alike.

    NOTE: a node inside a function has no value types in the model: its probe's inputs are untyped
    (float), which a library that serves the op still answers otherwise than "not registered"."""
    if not libraries:
        return {}
    types = node_types(plan.model, [p.node for p in plan.graph])
    found: dict[tuple[str, str], str] = {}
    first: dict[tuple[str, str], onnx.NodeProto] = {}
    for p in plan.nodes:  # NOTE: each op's first node, the graph's first: their inputs are typed
        first.setdefault(p.key, p.node)
    for key, node in first.items():
        owner = next((lib for lib in libraries if serves(lib, node, types, plan.model)), None)
        if owner is not None:
            found[key] = owner
    return found
