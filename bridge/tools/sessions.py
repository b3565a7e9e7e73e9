"""Sessions: ``bridge.session`` opens an onnxruntime InferenceSession with every custom op of the model resolvable."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from itertools import chain

import numpy as np
import onnx
import onnxruntime as ort
from onnx import external_data_helper

from bridge.core import files
from bridge.core.domains import all_nodes, is_custom
from bridge.core.errors import OpBridgeError
from bridge.core.progress import step
from bridge.core.registry import REGISTRY, Registry
from ort_kernels import tiers


def load_model(model: str | os.PathLike | onnx.ModelProto | bytes) -> onnx.ModelProto:
    """Load a model from a path, bytes or proto (copied: sessions edit their copy); errors are clear."""
    # NOTE: external tensors load only when the session must re-serialise (_with_external_data)
    proto = files.load_model(model, external_data=False)
    what = ("the model" if isinstance(model, onnx.ModelProto) else "the model bytes" if isinstance(model, bytes)
            else repr(os.fspath(model)))
    return _readable(proto, what)


# NOTE: digests of model-local functions whose names were found to be text: sessions opened again
# on the same file (workers, threads, reloads) skip re-reading every name of their bodies, the
# costliest part of this check (~1.5 us per node through protobuf's Python API).
_TEXT_FUNCTIONS: dict[bytes, None] = {}
_TEXT_FUNCTIONS_MAX = 256
_TEXT_FUNCTIONS_LOCK = threading.Lock()


def _readable(model: onnx.ModelProto, what: str) -> onnx.ModelProto:
    """``model`` when its names are text; protobuf hands invalid UTF-8 back as bytes (a damaged file)."""
    digests = [hashlib.blake2b(f.SerializeToString(), digest_size=16).digest() for f in model.functions]
    with _TEXT_FUNCTIONS_LOCK:
        unseen = [(d, f) for d, f in zip(digests, model.functions) if d not in _TEXT_FUNCTIONS]
    nodes = [*all_nodes(model), *(n for _, f in unseen for n in f.node)]
    try:
        # NOTE: str.join refuses bytes, in C: one pass over every name, not one isinstance per name
        "".join(chain.from_iterable((n.domain, n.op_type, *n.input, *n.output) for n in nodes))
    except TypeError:
        node = next(n for n in nodes if not all(isinstance(v, str) for v in (n.domain, n.op_type, *n.input,
                                                                            *n.output)))
        raise OpBridgeError(f"{what} is damaged: node names are not valid text. Got {node.op_type!r} in domain "
                            f"{node.domain!r}. Export the model again.") from None
    with _TEXT_FUNCTIONS_LOCK:
        for digest, _ in unseen:
            if len(_TEXT_FUNCTIONS) >= _TEXT_FUNCTIONS_MAX:
                _TEXT_FUNCTIONS.pop(next(iter(_TEXT_FUNCTIONS)))
            _TEXT_FUNCTIONS[digest] = None
    return model


def check_nodes(model: onnx.ModelProto, registry: Registry) -> None:
    """Custom nodes against their registered ops: domain version, attributes, input count."""
    imported = {o.domain: o.version for o in model.opset_import}
    for node in all_nodes(model):
        if not is_custom(node.domain):
            continue
        spec = registry.find(node.domain, node.op_type)
        if spec is None:
            continue  # the tier reports ops it cannot run
        where = f"node {node.name or node.op_type!r} ({node.domain}::{node.op_type})"
        version = imported.get(node.domain)
        if version != spec.version:
            raise OpBridgeError(
                f"{where} is imported at domain version {version}, but the registered op is version "
                f"{spec.version}. Got opset_import {node.domain}={version}. Export the model again with this "
                f"registry, or register the op with version={version}."
            )
        attrs = {a.name: a for a in node.attribute}
        for p in spec.attributes:
            if p.name not in attrs:
                if not p.has_default:
                    raise OpBridgeError(f"{where} lacks required attribute '{p.name}' ({p.attr_type.name}). "
                                        f"Got attributes {sorted(attrs)}. Export the model again with opbridge.")
            elif attrs[p.name].type != p.attr_type:
                raise OpBridgeError(
                    f"{where} has attribute '{p.name}' of type {onnx.AttributeProto.AttributeType.Name(attrs[p.name].type)}"
                    f", the op declares {p.attr_type.name}. Got a type mismatch. Export the model again with opbridge."
                )
        required = sum(1 for p in spec.tensors if not p.optional)
        if not required <= len(node.input) <= len(spec.tensors):
            raise OpBridgeError(f"{where} has {len(node.input)} inputs; the op takes {required} to "
                                f"{len(spec.tensors)}. Got inputs {list(node.input)}. Export the model again.")


def _with_external_data(proto: onnx.ModelProto, model) -> onnx.ModelProto:
    """``proto`` with its external tensors loaded (models read from a path), ready to serialise."""
    if isinstance(model, (str, os.PathLike)) and any(
            external_data_helper.uses_external_data(t) for t in external_data_helper._get_all_tensors(proto)):
        external_data_helper.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(model)))
    return proto


# ONNX element types by onnxruntime's spelling ('tensor(float)'), for messages about fed values
_ORT_TYPES = {f"tensor({onnx.TensorProto.DataType.Name(t).lower()})": t for t in onnx.TensorProto.DataType.values()
              if t != onnx.TensorProto.UNDEFINED}


class _NamedInputTypes:
    """Mixed in front of a tier's session class: when onnxruntime refuses a fed value's element
    type (its message names no input), ``run`` raises OpBridgeError naming the input and the
    custom op that reads it. NOTE: looked at only after a failure: a run that works pays nothing."""

    _readers: dict = {}  # graph input -> (qualname, the op's parameter it feeds)

    def run(self, output_names, input_feed, run_options=None):
        try:
            return super().run(output_names, input_feed, run_options)
        except OpBridgeError:
            raise
        except Exception as e:
            message = self._wrong_type(input_feed)
            if message is None:
                raise
            raise OpBridgeError(message) from e

    def _wrong_type(self, feed: dict) -> str | None:
        for arg in self.get_inputs():
            value = feed.get(arg.name)
            expected = _ORT_TYPES.get(arg.type)
            if not isinstance(value, np.ndarray) or expected is None:
                continue
            try:
                actual = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
            except (KeyError, TypeError, ValueError):
                actual = None
            if actual == expected:
                continue
            want = onnx.helper.tensor_dtype_to_np_dtype(expected)
            qualname, param = self._readers.get(arg.name, (None, None))
            where = f"{qualname}: input '{param}'" if qualname else f"model input '{arg.name}'"
            fed = "" if param in (None, arg.name) else f" (model input '{arg.name}')"
            return (f"opbridge: {where}{fed} must be {want.name} ({arg.type}). Got {value.dtype.name}. "
                    f"Pass {arg.name} as {want.name} (e.g. array.astype(np.{want.name})).")
        return None


def _input_readers(model: onnx.ModelProto, registry: Registry) -> dict:
    """Graph input -> (qualname, parameter) of the first custom node that reads it directly."""
    graph_inputs = {i.name for i in model.graph.input}
    readers = {}
    for node in model.graph.node:
        spec = registry.find(node.domain, node.op_type) if is_custom(node.domain) else None
        if spec is None:
            continue
        for name, param in zip(node.input, spec.tensors):
            if name in graph_inputs:
                readers.setdefault(name, (spec.qualname, param.name))
    return readers


def session(
    model: str | os.PathLike | onnx.ModelProto | bytes,
    *,
    tier: str = "function",
    registry: Registry | None = None,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    sess_options: ort.SessionOptions | None = None,
    native_library: str | os.PathLike | None = None,
) -> ort.InferenceSession:
    """An ``onnxruntime.InferenceSession`` for ``model`` whose custom ops all have kernels.

    ``tier`` names a kernel tier of ``ort_kernels.tiers``. ``"function"`` runs each custom node
    through its model-local ONNX function (attached from the registry when the file lacks it, and
    converted to the file's opset, e.g. after ``onnx.version_converter``), so plain ONNX Runtime
    needs nothing else.
    ``tier="native"`` loads the C++ kernel library (built on first use, or ``native_library=``
    / ``$OPBRIDGE_NATIVE_LIBRARY`` for a prebuilt one); ``tier="python"`` runs
    the ops' own eager implementations through onnxruntime-extensions (float32, prototyping).

    Example:
        >>> import numpy as np, torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.identity_conv(x, 2)
        >>> sess = bridge.session(bridge.export(M(), (torch.ones(1, 2, 3, 3),)))
        >>> float(sess.run(None, {"x": np.full((1, 2, 3, 3), 5, np.float32)})[0].max())
        5.0
    """
    kernels = tiers.get(tier)
    reg = REGISTRY if registry is None else registry
    proto = load_model(model)
    check_nodes(proto, reg)
    prepared = kernels.prepare(proto, reg, sess_options, native_library)
    # NOTE: a file that needs no change goes to ORT by path: no second serialisation and parse
    path = model if isinstance(model, (str, os.PathLike)) and not prepared.changed else None
    with step(f"onnxruntime session ({tier} tier)"):
        try:
            content = os.fspath(path) if path is not None else \
                _with_external_data(proto, model).SerializeToString()
            named = type(prepared.session_class.__name__, (_NamedInputTypes, prepared.session_class),
                         {"_readers": _input_readers(proto, reg)})
            return named(content, prepared.options, providers=list(providers))
        except Exception as e:
            raise OpBridgeError(f"onnxruntime could not load the model. Got {type(e).__name__}: "
                                f"{str(e)[:500]}. Check the op kernels for tier {tier!r}.") from e
