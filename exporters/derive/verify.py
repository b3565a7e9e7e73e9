"""Checks of a derived body before use: the implementation must not return (a view of) an input,
and the body must pass ``onnx.checker`` (full) and match eager in onnxruntime at the traced sizes
and, where the site has dynamic dims, at other sizes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper

from bridge.core import torch_compat
from bridge.core.dtypes import TORCH_TO_ONNX, numpy_dtype
from bridge.core.errors import OpBridgeError
from bridge.core.spec import OpSpec
from exporters.derive.sites import Site, Untraceable, one_line
from exporters.derive.tracing import call_args, example, example_inputs, flat_values

_ALT_STEP = 3  # verification also runs the dynamic dims at size + this
# NOTE: (rtol, atol) for the self-check against eager: it catches wrong bodies, not ulps
_VERIFY_TOL = {torch.float16: (2e-2, 2e-2), torch.bfloat16: (5e-2, 5e-2), torch.float32: (1e-4, 1e-5),
               torch.float64: (1e-7, 1e-9)}


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _shares_storage(a, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.untyped_storage().nbytes() > 0 and \
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def refuse_aliases(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], sizes: dict) -> None:
    """Raise OpBridgeError where ``fn`` (at the example inputs) returns one of its tensor inputs or a
    view of one, which the op's schema does not declare (torch forbids it for custom ops: their
    outputs may not alias inputs)."""
    flat = example_inputs(roles, site, sizes)
    try:
        args, kwargs = call_args(spec, site, roles, flat)
        with torch.no_grad():
            outs = _as_tuple(fn(*args, **kwargs))
    except Exception:  # noqa: BLE001  what eager trips on, the trace reports
        return
    declared = [r.alias_info is not None for r in torch_compat.schema_of(spec.overload).returns]
    inputs = [(role[2].name, value) for role, value in zip(roles, flat) if role[0] == "tensor"]
    for i, out in enumerate(outs):
        name = next((n for n, t in inputs if _shares_storage(out, t)), None)
        if name is not None and not (i < len(declared) and declared[i]):
            raise OpBridgeError(
                f"{spec.qualname}: its implementation returns its input '{name}' (or a view of it) as output "
                f"{i}, and a custom op's outputs may not alias its inputs (torch refuses such a call: "
                f"\"may not alias any inputs to this custom operator\"). Got output {i} sharing the memory "
                f"of '{name}'. Return a copy instead (e.g. {name}.clone()).")


def _wrap(spec: OpSpec, site: Site, proto: onnx.FunctionProto, outputs: Sequence[tuple[torch.dtype, int]]
          ) -> onnx.ModelProto:
    """A one-node model calling ``proto`` at ``site``; ``outputs`` gives each output's dtype and rank."""
    inputs, names = [], []
    for p, sig in zip(spec.tensors, site.tensors):
        names.append("" if sig is None else p.name)
        if sig is not None:
            inputs.append(helper.make_tensor_value_info(p.name, TORCH_TO_ONNX[sig.dtype], list(sig.dims)))
    while names and not names[-1]:
        names.pop()
    out_names = [f"out{i}" for i in range(len(outputs))]
    node = helper.make_node(spec.name, names, out_names, domain=spec.domain)
    values = dict(site.attrs)
    node.attribute.extend(p.onnx_attribute(values[p.name]) for p in spec.attributes if values[p.name] is not None)
    graph = helper.make_graph([node], f"{spec.name}_body_check", inputs, [
        helper.make_tensor_value_info(n, TORCH_TO_ONNX[dtype], [None] * rank)
        for n, (dtype, rank) in zip(out_names, outputs)])
    opsets = {o.domain: o.version for o in proto.opset_import}
    opsets[spec.domain] = spec.version
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                             functions=[proto], ir_version=10)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    try:
        onnx.checker.check_model(model, full_check=True)
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        raise Untraceable(f"the derived body does not load ({one_line(e)})") from None


def _eager(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], tensors: list) -> tuple | None:
    """``fn``'s outputs on copies of ``tensors`` (None where eager refuses these sizes)."""
    present = [t for t in tensors if t is not None]
    try:
        args, kwargs = call_args(spec, site, roles, flat_values(roles, site, [t.clone() for t in present]))
        with torch.no_grad():
            return _as_tuple(fn(*args, **kwargs))
    except Exception:  # noqa: BLE001  eager refuses these sizes: nothing to compare
        return None


def loads(spec: OpSpec, site: Site, proto: onnx.FunctionProto, outputs: Sequence[tuple[torch.dtype, int]]) -> None:
    """Raise ``Untraceable`` where ``proto``, called by one node at ``site``, fails ``onnx.checker``
    (full) or onnxruntime's load."""
    _session(_wrap(spec, site, proto, outputs))


def verify(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], proto: onnx.FunctionProto, sizes: dict,
           outputs: Sequence[tuple[torch.dtype, int]]) -> None:
    """Raise ``Untraceable`` where ``proto`` does not load or differs from ``fn`` at ``sizes`` (and,
    with dynamic dims, at other sizes); ``outputs`` gives each output's dtype and rank."""
    sess = _session(_wrap(spec, site, proto, outputs))
    trials = [sizes] + ([{s: n + _ALT_STEP for s, n in sizes.items()}] if sizes else [])
    for trial in trials:
        g = torch.Generator().manual_seed(0)
        tensors = [None if t is None else example(t, trial, g) for t in site.tensors]
        expected = _eager(spec, fn, site, roles, tensors)
        if expected is None:
            continue
        feed = {p.name: t.numpy() if t.dtype != torch.bfloat16 else t.float().numpy()
                for p, t in zip(spec.tensors, tensors) if t is not None}
        try:
            got = sess.run(None, feed)
        except Exception as exc:  # noqa: BLE001
            raise Untraceable(f"the derived body fails in onnxruntime at sizes {trial} ({one_line(exc)})") from None
        for i, (e, a) in enumerate(zip(expected, got)):
            problem = _differs(e, a)
            if problem:
                where = f" at dynamic sizes {trial}" if trial is not sizes else ""
                raise Untraceable(f"the derived body differs from eager{where}: output {i} {problem} "
                                  "(the trace fixed a size- or value-dependent choice)")


def _differs(expected: torch.Tensor, actual: np.ndarray) -> str | None:
    if tuple(expected.shape) != tuple(actual.shape):
        return f"has shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
    if expected.dtype in TORCH_TO_ONNX and actual.dtype != numpy_dtype(expected.dtype) and \
            expected.dtype != torch.bfloat16:
        return f"has dtype {actual.dtype}, eager {expected.dtype}"
    rtol, atol = _VERIFY_TOL.get(expected.dtype, (0.0, 0.0))
    e = expected.detach().double().numpy()
    a = actual.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~((e == a) | (np.isnan(e) & np.isnan(a)) | (np.abs(a - e) <= atol + rtol * np.abs(e)))
    if bad.any():
        return f"differs by up to {float(np.nanmax(np.where(bad, np.abs(a - e), 0))):.3g}"
    return None
