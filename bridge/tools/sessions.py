"""Sessions: ``bridge.session`` opens an onnxruntime InferenceSession with every custom op of the model resolvable."""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import external_data_helper

from bridge.core.basics import files
from bridge.core.basics.dtypes import to_numpy
from bridge.core.basics.errors import OpBridgeError, own_sentence
from bridge.core.basics.graphs import model_nodes, model_tensors
from bridge.core.basics.progress import Native, step
from bridge.core.basics.torch_compat import pytree
from bridge.core.registry import REGISTRY, Registry
from exporters.names import call_args
from ort_kernels import tiers
from ort_kernels.base import Explain, Paths, Plan, Session, readable
from ort_kernels.function import crash_refusal, guard_explainer
from ort_kernels.libraries import user_libraries


def load_model(model: str | os.PathLike | onnx.ModelProto | bytes) -> onnx.ModelProto:
    """Load a model from a path, bytes or proto (copied: sessions edit their copy); errors are clear."""
    # NOTE: external tensors load only when the session must re-serialise (_serialised)
    proto = files.load_model(model, external_data=False)
    return readable(proto, _what(model), list(model_nodes(proto)))


def _what(model) -> str:
    return ("the model" if isinstance(model, onnx.ModelProto) else "the model bytes" if isinstance(model, bytes)
            else repr(os.fspath(model)))


def check_nodes(model: onnx.ModelProto, registry: Registry, *, bodies: bool = True) -> None:
    """Custom nodes against their registered ops: domain version, attributes, input count (``Plan.check``);
    ``bodies``: the model's functions computing their outputs too (``Plan.check_bodies``)."""
    plan = Plan(model, registry)
    plan.check()
    if bodies:
        plan.check_bodies()


# NOTE: a tensor stored outside the file says so in its data_location (field 14, a varint) =
# EXTERNAL: the bytes 0x70 0x01 wherever it sits in the serialised model. Bytes without them hold no
# such tensor, and the walk over every tensor (~0.7 ms for the demo) is left out.
_EXTERNAL_LOCATION = bytes([14 << 3, onnx.TensorProto.EXTERNAL])


def _serialised(proto: onnx.ModelProto, model) -> bytes:
    """``proto``'s bytes, its external tensors loaded in (models read from a path)."""
    content = proto.SerializeToString()
    if isinstance(model, (str, os.PathLike)) and _EXTERNAL_LOCATION in content and any(
            external_data_helper.uses_external_data(t) for t in model_tensors(proto)):
        files.load_external_data(proto, model)
        content = proto.SerializeToString()
    return content


def _wrong_feed(readers: dict, graph: onnx.GraphProto) -> Explain:
    """The explainer of a feed onnxruntime refuses (its message names no op, or no input): input names
    missing or unknown, a value that is no array (a torch tensor, a numpy scalar), an element type, a
    rank or a fixed dim (dim_value; dim_param dims are free) other than the model declares. The message
    names the input and the custom op that reads it (``readers``: graph input -> (qualname, the op's
    parameter it feeds))."""
    declared = {v.name: v.type.tensor_type for v in graph.input if v.type.HasField("tensor_type")}
    names = [v.name for v in graph.input]
    required = [n for n in names if n not in {t.name for t in graph.initializer}]

    def where(name: str) -> str:
        qualname, param = readers.get(name, (None, None))
        return (f"{qualname}: input '{param}'{'' if param == name else f' (model input {name!r})'}" if qualname
                else f"model input '{name}'")

    def explain(error: BaseException, feed: dict | None, _model: bytes | str) -> str | None:
        if feed is None:
            return None  # NOTE: an IOBinding's run: what was bound is not known here
        missing, unknown = [n for n in required if n not in feed], [n for n in feed if n not in names]
        if missing or unknown:
            return (f"opbridge: the feed does not match the model's inputs: missing {missing}, unknown {unknown}. "
                    f"Got inputs {list(feed)}. Feed each model input by its name: {names} (session.get_inputs()).")
        for name, value in feed.items():
            # NOTE: what onnxruntime cannot read (it reads arrays, lists, OrtValues of either class)
            if name in declared and isinstance(value, (torch.Tensor, np.generic, int, float, complex, str, bytes,
                                                       list, tuple)):
                kind = f"{type(value).__module__}.{type(value).__qualname__}"
                fix = (f"Pass {name}.numpy() (or build the feed with bridge.parity.ort_feed(session, args))"
                       if isinstance(value, torch.Tensor) else f"Pass np.asarray({name})")
                return f"opbridge: {where(name)} must be a numpy array. Got {kind}. {fix}."
        for name, tensor in declared.items():
            value = feed.get(name)
            message = _wrong_value(where(name), name, tensor, value) if isinstance(value, np.ndarray) else None
            if message is not None:
                return message
        return None

    return explain


def _wrong_value(where: str, name: str, tensor: onnx.TypeProto.Tensor, value: np.ndarray) -> str | None:
    """Why ``value`` is not what the model declares of input ``name`` (element type, rank, fixed dims); None
    when it is."""
    expected = tensor.elem_type
    try:
        actual = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    except (KeyError, TypeError, ValueError):
        actual = None
    if expected != onnx.TensorProto.UNDEFINED and actual != expected:
        want = onnx.helper.tensor_dtype_to_np_dtype(expected)
        ort_type = f"tensor({onnx.TensorProto.DataType.Name(expected).lower()})"  # onnxruntime's spelling
        return (f"opbridge: {where} must be {want.name} ({ort_type}). Got {value.dtype.name}. "
                f"Pass {name} as {want.name} (e.g. array.astype(np.{want.name})).")
    if not tensor.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    wrong = [i for i, d in enumerate(dims) if isinstance(d, int) and i < value.ndim and value.shape[i] != d]
    if value.ndim == len(dims) and not wrong:
        return None
    shape = f"[{', '.join(map(str, dims))}]"
    what = (f"must have {len(dims)} dim{'s' if len(dims) != 1 else ''} (shape {shape})" if value.ndim != len(dims)
            else f"must have size {dims[wrong[0]]} in dim {wrong[0]} (shape {shape})")
    free = " (named dims are free)" if any(isinstance(d, str) for d in dims) else ""
    return f"opbridge: {where} {what}. Got shape {list(value.shape)}. Pass {name} with shape {shape}{free}."


def session(model: str | os.PathLike | onnx.ModelProto | bytes, *, tier: str = "function",
            registry: Registry | None = None, providers: Sequence[str] = ("CPUExecutionProvider",),
            sess_options: ort.SessionOptions | None = None, native_library: Paths | None = None) -> Session:
    """An ``onnxruntime.InferenceSession`` (``ort_kernels.base.Session``) for ``model`` whose custom
    ops all have kernels; every run method reports a tier's known failures as OpBridgeError.

    ``tier`` names a kernel tier of ``ort_kernels.tiers``. ``"function"`` runs each custom node
    through its model-local ONNX function (attached from the registry when the file lacks it, and
    converted to the file's opset, e.g. after ``onnx.version_converter``), so plain ONNX Runtime
    needs nothing else.
    ``tier="native"`` loads the C++ kernel library (built on first use). ``native_library=`` (one
    path or several; else ``$OPBRIDGE_NATIVE_LIBRARY``) names custom-op libraries to load first: a
    user's own (mmdeploy's ``libmmdeploy_onnxruntime_ops.so``) or opbridge's, prebuilt. Each custom
    node runs the kernel of the first of them that serves it (onnxruntime is asked), else opbridge's
    C++ kernel, else its function body; ``session.kernels`` says which, by op. ``tier="python"`` runs
    the ops' own eager implementations through onnxruntime-extensions (every dtype; prototyping).

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
    if native_library is not None and tier != "native":
        raise OpBridgeError(f"native_library= loads custom-op libraries for tier 'native' only. Got tier={tier!r}. "
                            "Pass tier='native', or drop native_library=.")
    proto = files.load_model(model, external_data=False)
    # NOTE: the one walk of the model: the checks, the tier and the report read the plan
    plan = Plan(proto, REGISTRY if registry is None else registry, _what(model))
    plan.check()
    plan.check_bodies()
    filled = plan.fill()  # NOTE: an omitted attribute is the op's default in every tier
    # NOTE: read before the tier edits the model
    wrong_feed = _wrong_feed(plan.readers(), proto.graph)
    prepared = kernels.prepare(plan, sess_options, native_library)
    # NOTE: the guards of the bodies the session runs (any tier's) explained one way: the function tier's
    guards = guard_explainer(plan)
    refuse = crash_refusal(proto, plan.registry)  # NOTE: a size it cannot refuse is refused here, not as a load failure
    # NOTE: a file that needs no change goes to ORT by path: no second serialisation and parse
    path = model if isinstance(model, (str, os.PathLike)) and not (prepared.changed or filled) else None
    # NOTE: native code runs from here on: the line names each library and the ops it serves, so a crash
    # (a segfault ends the process; the CLI's faulthandler then prints the stack) follows a line naming them
    served, unserved = plan.kernels(), plan.unserved(user_libraries(native_library))
    native = native_libraries(served)
    with step(f"onnxruntime session ({tier} tier{native_code(native)}"
              f"{''.join(f'; {op} {why}' for op, why in unserved.items())})", native=native):
        try:
            content = os.fspath(path) if path is not None else _serialised(proto, model)
            sess = Session(content, prepared.options, providers=providers, guard=prepared.guard, refuse=refuse,
                           sees_feed=prepared.sees_feed, explain=(*prepared.explain, guards, wrong_feed))
            sess.kernels, sess.unserved = served, unserved
            return sess
        except OpBridgeError:
            raise
        except Exception as e:
            if path is not None:  # NOTE: onnxruntime read the data file itself
                files.check_external_data(model_tensors(proto), path)
            own = own_sentence(e)
            if own is not None:  # NOTE: a C++ kernel refusing its node's attributes as onnxruntime makes it
                raise OpBridgeError(f"{own.rstrip('. ')}. Got this from the op's C++ kernel as the session was made. "
                                    "Fix the node's attributes (export the model again with opbridge).") from e
            raise OpBridgeError(f"onnxruntime could not load the model. Got {type(e).__name__}: "
                                f"{str(e)[:500]}. Check the op kernels for tier {tier!r}.") from e


def native_libraries(kernels: dict[str, str]) -> dict[str, list[str]]:
    """Each library (its path) in a session's ``kernels`` (op -> library path or "function body") -> the
    ops it serves.

    >>> native_libraries({"a::f": "/x/libu.so", "a::g": "function body", "a::h": "/x/libu.so"})
    {'/x/libu.so': ['a::f', 'a::h']}
    """
    by_library: dict[str, list[str]] = {}
    for op, where in kernels.items():
        if os.path.isabs(where):
            by_library.setdefault(where, []).append(op)
    return by_library


def native_code(native: Native) -> str:
    """``; native code: LIB serves OPS; ...`` for progress lines (:func:`native_libraries`); "" for none.

    >>> native_code({"/x/libu.so": ["a::f", "a::h"]})
    '; native code: libu.so serves a::f, a::h'
    """
    return "".join(f"; native code: {os.path.basename(lib)} serves {', '.join(ops)}" for lib, ops in native.items())


def ort_feed(sess, args: Sequence, kwargs: dict | None = None) -> dict[str, np.ndarray]:
    """The session feed for the model's (args, kwargs): tensor leaves in order, by input name, each as
    its own dtype (bfloat16 as ``ml_dtypes.bfloat16``; ``bridge.core.basics.dtypes.to_numpy``)."""
    return input_arrays([i.name for i in sess.get_inputs()], args, kwargs)


def input_arrays(names: Sequence[str], args: Sequence, kwargs: dict | None = None) -> dict[str, np.ndarray]:
    """The arrays of the model's ONNX inputs ``names`` from its (args, kwargs): the tensor leaves in
    order (a non-tensor argument is a constant of the exported file, not an input), each as its dtype."""
    tensors = [x for x in pytree.tree_leaves((call_args(args), kwargs or {})) if isinstance(x, torch.Tensor)]
    if len(names) != len(tensors):
        raise OpBridgeError(f"the model has {len(names)} ONNX inputs {names} but the call has "
                            f"{len(tensors)} tensors. Got mismatched inputs. Pass the inputs used at export.")
    return {n: to_numpy(t) for n, t in zip(names, tensors)}


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def run_feed(sess, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``sess.run(names, feed)``, also where an input or output is bfloat16: onnxruntime's ``run``
    takes and gives no bfloat16 array, so such a run goes through OrtValues, the bytes unchanged.

    Example:
        >>> from onnx import helper, TensorProto
        >>> g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
        ...     [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
        >>> sess = session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9))
        >>> run_feed(sess, None, {"x": np.array([1.5, -2], ml_dtypes.bfloat16)})[0].tolist()
        [1.5, -2.0]
    """
    outputs = sess.get_outputs()
    wanted = [o.name for o in outputs] if names is None else list(names)
    types = {o.name: o.type for o in outputs}
    bf16 = any(a.dtype == _BFLOAT16 for a in feed.values()) or any(types.get(n) == "tensor(bfloat16)" for n in wanted)
    if not bf16 or not isinstance(sess, ort.InferenceSession):
        return sess.run(names, feed)
    if not hasattr(ort.OrtValue, "ortvalue_from_numpy_with_onnx_type"):
        raise OpBridgeError(f"this onnxruntime cannot be fed bfloat16 from Python. Got onnxruntime {ort.__version__}. "
                            "Install onnxruntime>=1.20 (OrtValue.ortvalue_from_numpy_with_onnx_type).")
    values = sess.run_with_ort_values(wanted, {n: _ort_value(a) for n, a in feed.items()})
    return [_from_ort_value(v) for v in values]


def _ort_value(array: np.ndarray) -> ort.OrtValue:
    array = np.ascontiguousarray(array)
    if array.dtype == _BFLOAT16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), onnx.TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _from_ort_value(value: ort.OrtValue) -> np.ndarray:
    """An output OrtValue as numpy; bfloat16 (numpy() refuses it) copied out of its CPU buffer."""
    if not value.is_tensor() or value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    shape = tuple(value.shape())
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, _BFLOAT16)
    raw = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(raw, np.uint16, count).copy().view(_BFLOAT16).reshape(shape)
