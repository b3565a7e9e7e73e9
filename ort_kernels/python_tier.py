"""Python kernel tier: run any registered op in ONNX Runtime through onnxruntime-extensions.

Each op's kernel is the op's own eager implementation (for a mutating op, its functional twin),
so prototyping needs no extra code. onnxruntime-extensions' PyOp has sharp edges, each guarded
here (measured on onnxruntime-extensions 0.15.2):

- an exception inside a kernel aborts the process: kernels catch everything, hand ORT a
  placeholder, and every run method of the session raises the recorded error as OpBridgeError
  (the tier's run guard, ``_kernel_errors``);
- INTS/FLOATS attributes are unsupported: the session's copy of the model carries them as
  comma-separated STRING attributes, parsed back in the kernel; every declared attribute must be
  present, so defaults are written into the nodes, optional scalars (``int?``) travel as STRING,
  and an omitted optional one gets a placeholder and is named in ``opbridge_absent_attributes``
  (the kernel passes None; a given ``str?`` of "" stays "");
- float16 aborts the process: only float32 floating tensors are accepted, anything else is an
  UnsupportedInTier error before ORT sees the model;
- declaring an op after the library was registered with a session crashes later sessions: all
  registered ops are declared before the first registration, and an op registered later gets
  UnsupportedInTier (restart the process).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from bridge.core.errors import OpBridgeError, UnsupportedInTier
from bridge.core.graphs import custom_nodes
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec
from bridge.core.torch_compat import FakeTensorMode
from ort_kernels.base import Prepared, Tier, helper_functions, with_library
from ort_kernels.build import io_types

_lock = threading.Lock()
# NOTE: the Python kernels are declared in private domains ("opbridge.python.<domain>"), not the op's:
# options reused across tiers may carry the native library, whose kernels take the op's own domain
PYTHON_DOMAIN = "opbridge.python."
_declared: dict[tuple[str, str], tuple] = {}  # (domain, op_type) -> (OpSpec served, its input ONNX types)
# NOTE: PyOp inputs are all required: an omitted optional input is fed an empty placeholder and
# named in this attribute, so the kernel passes None for it.
ABSENT_ATTR = "opbridge_absent"
# NOTE: likewise every declared attribute must be present: an omitted optional one gets a placeholder
# value and is named in this attribute, so the kernel passes None for it (a given "" stays "").
ABSENT_ATTRS = "opbridge_absent_attributes"
_library_used = False
_errors: list[str] = []  # kernel exceptions of the current run (ORT calls kernels synchronously)
_ACCEPTED = {onnx.TensorProto.FLOAT, onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.BOOL,
             onnx.TensorProto.UINT8, onnx.TensorProto.INT8}


def _list_attr(p) -> bool:
    return p.attr_type in (onnx.defs.OpSchema.AttrType.INTS, onnx.defs.OpSchema.AttrType.FLOATS)


def _as_text(p) -> bool:
    """Whether the attribute travels as a STRING in the session's copy (lists, optional scalars)."""
    return _list_attr(p) or (p.optional and p.attr_type != onnx.defs.OpSchema.AttrType.STRING)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse_attr(p, value):
    if _as_text(p) and not _list_attr(p):  # an optional scalar
        text = _text(value)
        number = float(text) if p.attr_type == onnx.defs.OpSchema.AttrType.FLOAT else int(text)
        return p.from_onnx_value(number)
    if _list_attr(p):
        text = _text(value)
        items = [x for x in text.split(",") if x]
        return p.from_onnx_value([int(x) if p.attr_type == onnx.defs.OpSchema.AttrType.INTS else float(x)
                                  for x in items])
    return p.from_onnx_value(value)


def _placeholder(spec, tensors, attrs):
    """Empty outputs of the right dtype for ORT to copy while the error travels back (run() raises
    it). Empty, so a failed huge output cannot fail again while making its stand-in."""
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in tensors]
            out = spec.overload(*fakes, **attrs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(np.zeros((0,), dtype=np.float32 if o.dtype.is_floating_point else np.int64) for o in outs)
    except BaseException:  # noqa: BLE001  nothing may escape into onnxruntime-extensions
        return tuple(np.zeros((0,), np.float32) for _ in range(spec.num_outputs))


def _describe(e: BaseException) -> str:
    """``Type: message``, even when the message itself cannot be made into text."""
    try:
        return f"{type(e).__name__}: {e}"
    except BaseException:  # noqa: BLE001
        return f"{type(e).__name__} (its message could not be converted to text)"


def _kernel(spec):
    tensor_params = [p for p in spec.params if p.is_tensor]
    attr_params = {p.name: p for p in spec.attributes}

    def kernel(*arrays, **raw_attrs):
        tensors, attrs = [], {}
        try:
            absent = {int(i) for i in str(raw_attrs.pop(ABSENT_ATTR, "") or "").split(",") if i}
            omitted = set(_text(raw_attrs.pop(ABSENT_ATTRS, "")).split(",")) - {""}
            tensors = [None if i in absent else torch.from_numpy(np.array(a)) for i, a in enumerate(arrays)]
            attrs = {k: None if k in omitted else _parse_attr(attr_params[k], v) for k, v in raw_attrs.items()}
            named = dict(zip((p.name for p in tensor_params), tensors))
            args = [named.get(p.name) if p.is_tensor else attrs.get(p.name, p.default) for p in spec.params]
            if spec.checks is not None:  # NOTE: the op's checks, also for an eager kernel that has its own
                spec.checks.run(**{p.name: a for p, a in zip(spec.params, args)})
            with torch.no_grad():
                out = spec.overload(*args)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            result = tuple(o.detach().contiguous().numpy() for o in outs)
        except BaseException as e:  # noqa: BLE001  an escaping exception aborts the process
            _errors.append(f"{spec.qualname}: the Python kernel raised {_describe(e)}")
            result = _placeholder(spec, tensors, attrs)
        return result[0] if len(result) == 1 else result

    return kernel


def _io_dtypes(spec, model_types: dict):
    """ONNX element types of the op's inputs and outputs: from its float32 samples through its fake
    kernel, else from the model's own (inferred) types; None when neither says."""
    from onnxruntime_extensions import PyCustomOpDef

    by_onnx: dict[int, Any] = {
        onnx.TensorProto.FLOAT: PyCustomOpDef.dt_float, onnx.TensorProto.INT32: PyCustomOpDef.dt_int32,
        onnx.TensorProto.INT64: PyCustomOpDef.dt_int64, onnx.TensorProto.BOOL: PyCustomOpDef.dt_bool,
        onnx.TensorProto.UINT8: PyCustomOpDef.dt_uint8, onnx.TensorProto.INT8: PyCustomOpDef.dt_int8}
    if spec.sample_inputs is not None:
        inputs, outputs = io_types(spec, torch.float32)
    elif (spec.domain, spec.name) in model_types:
        inputs, outputs = model_types[(spec.domain, spec.name)]
        inputs = _padded(spec, inputs)
    else:
        return None
    return [by_onnx[t] for t in inputs], [by_onnx[t] for t in outputs]


def _padded(spec, inputs: tuple) -> tuple:
    """Input types with omitted trailing optional inputs typed float32 (their empty placeholder)."""
    return tuple(inputs) + (onnx.TensorProto.FLOAT,) * (len(spec.tensors) - len(inputs))


def _model_types(inferred: onnx.ModelProto) -> dict:
    """(domain, op_type) -> (input types, output types) read off the first fully typed node of each op."""
    types = _value_types(inferred)
    out: dict = {}
    for node in custom_nodes(inferred):
        # NOTE: an omitted optional input ("") gets the float32 placeholder; the kernel passes None
        ins = [types.get(n, 0) if n else onnx.TensorProto.FLOAT for n in node.input]
        outs = [types.get(n, 0) for n in node.output]
        if all(t in _ACCEPTED for t in ins + outs):
            out.setdefault((node.domain, node.op_type), (tuple(ins), tuple(outs)))
    return out


def _value_types(inferred: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in
            list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}


def _declare_all(registry, tier, model_types: dict) -> None:
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    attr_types = {onnx.defs.OpSchema.AttrType.INT: PyCustomOpDef.dt_int64,
                  onnx.defs.OpSchema.AttrType.FLOAT: PyCustomOpDef.dt_float,
                  onnx.defs.OpSchema.AttrType.STRING: PyCustomOpDef.dt_string}
    for spec in registry.exportable():
        key = (spec.domain, spec.name)
        if key in _declared or tier.why_not(spec) is not None:
            continue
        typed = _io_dtypes(spec, model_types)
        if typed is None:
            continue  # NOTE: neither samples nor this model type it: a later session says so
        inputs, outputs = typed
        attrs = {p.name: PyCustomOpDef.dt_string if _as_text(p) else attr_types[p.attr_type]
                 for p in spec.attributes}
        if any(p.optional for p in spec.tensors):
            attrs[ABSENT_ATTR] = PyCustomOpDef.dt_string
        if any(p.optional for p in spec.attributes):
            attrs[ABSENT_ATTRS] = PyCustomOpDef.dt_string
        onnx_op(op_type=f"{PYTHON_DOMAIN}{spec.domain}::{spec.name}", inputs=inputs, outputs=outputs,
                attrs=attrs)(_kernel(spec))
        _declared[key] = (spec, _onnx_input_types(spec, model_types))


def _served_nodes(model):
    """Custom nodes this tier runs (helper functions the model carries bodies for run as they are)."""
    return [n for n in custom_nodes(model) if (n.domain, n.op_type) in _declared]


def _infer_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with inferred value types: the tier needs element types only. A fake kernel that
    refuses symbolic dims (a channel check on a dim_param) gets another pass over a copy without
    shapes, where element types come from the model's own value types (what the native tier needs).

    NOTE: a model whose dims are all concrete keeps the first pass's error: its node really is wrong.
    """
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as e:  # noqa: BLE001  a fake kernel refusing the node's shapes or attributes
        error = e
    if _has_symbolic_dims(model):
        shapeless = onnx.ModelProto()
        shapeless.CopyFrom(model)
        for v in [*shapeless.graph.input, *shapeless.graph.output, *shapeless.graph.value_info]:
            if v.type.HasField("tensor_type"):
                v.type.tensor_type.ClearField("shape")
        try:
            return onnx.shape_inference.infer_shapes(shapeless, strict_mode=False)
        except Exception as e:  # noqa: BLE001
            error = e
    raise OpBridgeError(f"tier 'python' cannot type the model's custom nodes. Got {type(error).__name__}: "
                        f"{str(error)[:400]}. Fix the node's inputs or attributes (export the model again "
                        "with opbridge).") from None


def _has_symbolic_dims(model: onnx.ModelProto) -> bool:
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    return any(not d.HasField("dim_value") for v in values for d in v.type.tensor_type.shape.dim)


def _check_types(model: onnx.ModelProto, inferred: onnx.ModelProto) -> None:
    types = _value_types(inferred)
    for node in _served_nodes(model):
        for name in list(node.input) + list(node.output):
            t = types.get(name)
            if t and t not in _ACCEPTED:  # 0: type not known yet
                raise UnsupportedInTier(
                    f"tier 'python' runs float32 only (onnxruntime-extensions aborts the process on float16 and "
                    f"declares one type per op). Got {onnx.helper.tensor_dtype_to_string(t)} at "
                    f"{node.domain}::{node.op_type} '{name}'. Use tier='function' or 'native'."
                )


def _onnx_input_types(spec, model_types: dict) -> tuple[int, ...]:
    if spec.sample_inputs is not None:
        return io_types(spec, torch.float32)[0]
    return _padded(spec, model_types[(spec.domain, spec.name)][0])


def _rewrite_attributes(model: onnx.ModelProto) -> None:
    """Lists -> comma-separated strings; defaults written in (PyOp needs every declared attribute);
    omitted optional inputs fed an empty placeholder and listed in ``opbridge_absent``; omitted optional
    attributes given a placeholder and listed in ``opbridge_absent_attributes``."""
    placeholders: dict[int, str] = {}
    for node in _served_nodes(model):
        spec, input_types = _declared[(node.domain, node.op_type)]
        present = {a.name: a for a in node.attribute}
        new = []
        if any(p.optional for p in spec.tensors):
            names = list(node.input) + [""] * (len(spec.tensors) - len(node.input))
            absent = [i for i, n in enumerate(names) if not n]
            for i in absent:
                t = input_types[i]
                if t not in placeholders:
                    placeholders[t] = f"opbridge_absent_{t}"
                    model.graph.initializer.append(onnx.helper.make_tensor(placeholders[t], t, [0], []))
                names[i] = placeholders[t]
            del node.input[:]
            node.input.extend(names)
            new.append(onnx.helper.make_attribute(ABSENT_ATTR, ",".join(map(str, absent))))
        omitted = []
        for p in spec.attributes:
            if p.name in present:
                value = onnx.helper.get_attribute_value(present[p.name])
            elif p.has_default and p.default is not None:
                value = p.to_onnx_value(p.default)
            elif p.optional:
                new.append(onnx.helper.make_attribute(p.name, ""))  # a placeholder; the kernel passes None
                omitted.append(p.name)
                continue
            else:
                raise OpBridgeError(f"{spec.qualname}: node {node.name!r} lacks required attribute '{p.name}'. "
                                    "Got none. Export the model again with opbridge.")
            if _list_attr(p):
                value = ",".join(str(v) for v in value)
            elif _as_text(p):
                value = str(value)
            new.append(onnx.helper.make_attribute(p.name, value))
        if any(p.optional for p in spec.attributes):
            new.append(onnx.helper.make_attribute(ABSENT_ATTRS, ",".join(omitted)))
        del node.attribute[:]
        node.attribute.extend(new)


def _kernel_error() -> str:
    return _errors[0].rstrip(".") + ". Fix the inputs (the op's own eager checks apply in this tier)."


@contextlib.contextmanager
def _kernel_errors():
    """The guard of every run of a python-tier session: one run at a time (the error list is shared
    by every kernel), and a kernel's recorded exception raised as OpBridgeError after it."""
    with _lock:
        _errors.clear()
        try:
            yield
        except Exception as e:
            if _errors:
                raise OpBridgeError(_kernel_error()) from e
            raise
        if _errors:
            raise OpBridgeError(_kernel_error())


def _to_private_domains(model: onnx.ModelProto) -> None:
    """The served nodes call their Python kernels in the tier's private domains (``PYTHON_DOMAIN``),
    so the same options can also carry the native library, whose kernels use the op's own domain."""
    versions = {o.domain: o.version for o in model.opset_import}
    moved = {}
    for node in _served_nodes(model):
        moved[PYTHON_DOMAIN + node.domain] = versions.get(node.domain, 1)
        node.domain = PYTHON_DOMAIN + node.domain
    model.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in moved.items() if d not in versions)


_NO_EXTENSIONS = ("tier 'python' needs onnxruntime-extensions. Got no such package. "
                  "pip install 'opbridge[python-tier]' (onnxruntime-extensions==0.15.*).")


class PythonTier(Tier):
    name = "python"
    summary = "the op's own eager implementation via onnxruntime-extensions (prototyping; float32)"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None, *, thorough: bool = True) -> str | None:
        if torch.float32 not in spec.dtypes:
            return "float32 is not among the op's dtypes"
        if dtype is not None and dtype != torch.float32:
            return "runs float32 only (onnxruntime-extensions aborts on float16 and declares one type per op)"
        return None

    def missing(self, registry: Registry) -> str | None:
        return _NO_EXTENSIONS if importlib.util.find_spec("onnxruntime_extensions") is None else None

    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: str | os.PathLike | None = None) -> Prepared:
        """Route ``model``'s custom nodes to their eager implementations."""
        global _library_used
        try:
            from onnxruntime_extensions import get_library_path
        except ImportError:
            raise UnsupportedInTier(_NO_EXTENSIONS) from None
        inferred = _infer_types(model)
        with _lock:
            if not _library_used:
                _declare_all(registry, self, _model_types(inferred))
            helpers = helper_functions(model, registry)
            missing = [f"{n.domain}::{n.op_type}" for n in custom_nodes(model)
                       if (n.domain, n.op_type) not in _declared and (n.domain, n.op_type) not in helpers]
            if missing:
                why = ("it was registered after this process's first python-tier session (declaring ops later "
                       "crashes onnxruntime-extensions); restart the process" if _library_used and
                       all(registry.find(*m.split("::")) for m in missing) else
                       "it is not registered, or neither its float32 samples nor this model give its types")
                raise UnsupportedInTier(f"tier 'python' cannot run {', '.join(sorted(set(missing)))}: {why}. "
                                        f"Got ops {sorted(set(missing))}. Use tier='function' or 'native'.")
            _check_types(model, inferred)
            _rewrite_attributes(model)
            _to_private_domains(model)
            # the Python kernels, not function bodies, run the custom nodes; helper functions stay
            keep = [f for f in model.functions if (f.domain, f.name) in helpers]
            del model.functions[:]
            model.functions.extend(keep)
            options = with_library(options, get_library_path())
            _library_used = True
        return Prepared(options, changed=True, guard=_kernel_errors)
