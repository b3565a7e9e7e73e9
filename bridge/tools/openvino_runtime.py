"""Run an ONNX file in OpenVINO (CPU), behind the part of onnxruntime's session API parity uses.

OpenVINO reads standard ONNX only: inline the custom ops first (``bridge.export(..., inline=True)``
or ``opbridge inline``). ``openvino`` is imported on first use (``pip install openvino``).

What this runner fixes or refuses, measured with OpenVINO 2026.4.1 on CPU:

- inference precision is pinned to f32: the CPU plugin defaults to bf16 where the processor has
  it, which moved the demo's output by up to 4.3e-3 (f32: 2.7e-7);
- float64 models run, but the CPU plugin computes in at most f32 precision (OpenVINO's CPU device
  docs list f32/bf16/f16 as inference precisions): float64 outputs meet float32 tolerances, not
  float64's;
- a statically zero-size tensor anywhere in the model is refused before compiling: compiling a
  crop to an empty box killed the process with SIGFPE. Zero-size inputs of a dynamic dimension
  (the demo with no points) ran correctly.

Example:
    >>> import numpy as np, torch, bridge, custom_ops
    >>> from bridge.tools.openvino_runtime import session
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.ops.opbridge.identity_conv(x, 2) + 1
    >>> sess = session(bridge.export(M(), (torch.ones(1, 2, 3, 3),), inline=True))  # doctest: +SKIP
    >>> sess.run(None, {"x": np.zeros((1, 2, 3, 3), np.float32)})[0].max()  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import numpy as np
import onnx

from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.files import load_model
from bridge.core.basics.graphs import nonstandard_ops
from bridge.core.basics.installed import pip_line


def _no_openvino(got: object) -> str:
    return (f"running a model in OpenVINO needs the openvino package. Got {got}. "
            f"Install it with `{pip_line('openvino')}`.")


def missing() -> str | None:
    """What running a file in OpenVINO lacks here (the package), as an error message; None when nothing."""
    return _no_openvino("no such package") if importlib.util.find_spec("openvino") is None else None


def import_openvino():
    """The ``openvino`` module, or OpBridgeError naming the install command."""
    try:
        import openvino
    except ImportError as e:
        raise OpBridgeError(_no_openvino(e)) from None
    return openvino


@dataclasses.dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime's ``NodeArg`` shows it: name, shape, type."""

    name: str
    shape: list
    type: str


def _node_args(values) -> list[NodeArg]:
    out = []
    for v in values:
        t = v.type.tensor_type
        shape = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in t.shape.dim]
        out.append(NodeArg(v.name, shape, onnx.TensorProto.DataType.Name(t.elem_type).lower()))
    return out


def _zero_size(ov_model) -> list[str]:
    """'node: shape' of every tensor whose shape has a static zero dimension."""
    found = []
    for node in ov_model.get_ordered_ops():
        for port in node.outputs():
            shape = port.get_partial_shape()
            if shape.rank.is_static and any(d.is_static and d.get_length() == 0 for d in shape):
                found.append(f"{node.get_friendly_name()}: {shape}")
    return found


def _onnx_zero_size(model: onnx.ModelProto) -> list[str]:
    """'value: dims' of every value of ``model`` whose recorded shape has a static zero dimension."""
    found = []
    for v in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        dims = v.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value == 0 for d in dims):
            found.append(f"{v.name}: {[d.dim_value if d.HasField('dim_value') else d.dim_param for d in dims]}")
    return found


def _zero_size_error(empty: list[str]) -> OpBridgeError:
    return OpBridgeError(f"the model has zero-size tensors, which OpenVINO 2026.4 mishandles (compiling one killed "
                         f"the process with SIGFPE). Got {empty[:5]}. Run models with empty tensors in onnxruntime "
                         "(runtime='onnxruntime').")


class OpenVINOSession:
    """A compiled OpenVINO model with ``get_inputs()``, ``get_outputs()`` and ``run(None, feed)``.

    Inputs and outputs are listed in the ONNX graph's order and by its names. Inputs OpenVINO
    dropped because nothing reads them (the ``output`` argument of a functional twin) are
    accepted and ignored.
    """

    def __init__(self, model: str | os.PathLike | onnx.ModelProto, device: str = "CPU",
                 config: dict | None = None):
        source: tuple[bytes, bytes] | tuple[str]  # read_model's arguments: (model bytes, weights) or (path,)
        if isinstance(model, onnx.ModelProto):
            proto, source = model, (model.SerializeToString(), b"")
        else:
            path = os.fspath(model)
            proto, source = load_model(path, external_data=False), (path,)
        custom = [f"{domain}::{op}" for domain, op in nonstandard_ops(proto)]  # subgraphs' nodes too
        if custom:
            raise OpBridgeError(f"OpenVINO has no conversion rule for custom nodes, and does not expand model-local "
                                f"functions. Got custom ops {custom}. Inline the file first: `opbridge inline IN.onnx "
                                "-o OUT.onnx`, bridge.export(..., inline=True) or check_parity(..., inline=True).")
        ov = import_openvino()
        core = ov.Core()
        try:
            ov_model = core.read_model(*source)
        except Exception as e:
            # NOTE: static zero-size shapes can fail OpenVINO's own shape validation while reading
            if empty := _onnx_zero_size(proto):
                raise _zero_size_error(empty) from None
            raise OpBridgeError(f"OpenVINO could not read the model. Got {type(e).__name__}: "
                                f"{str(e)[:600]}. Check that the file is standard ONNX.") from None
        empty = _zero_size(ov_model)
        if empty:
            raise _zero_size_error(empty)
        # NOTE: f32 unless the caller says otherwise; the CPU plugin defaults to bf16 where it can.
        settings = {"INFERENCE_PRECISION_HINT": "f32", **(config or {})}
        try:
            self.compiled = core.compile_model(ov_model, device, settings)
        except Exception as e:
            raise OpBridgeError(f"OpenVINO could not compile the model for {device}. Got "
                                f"{type(e).__name__}: {str(e)[:600]}. Check the device and the model.") from None
        initializers = {t.name for t in proto.graph.initializer}
        self._inputs = _node_args(i for i in proto.graph.input if i.name not in initializers)
        self._outputs = _node_args(proto.graph.output)
        self._taken = {name for port in self.compiled.inputs for name in port.get_names()}
        self._request = self.compiled.create_infer_request()

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def run(self, output_names, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs ``output_names`` (None: all, in ONNX order) as numpy arrays (copies)."""
        names = [o.name for o in self._outputs] if output_names is None else list(output_names)
        inputs = {k: np.require(v, requirements="C") for k, v in feed.items() if k in self._taken}
        try:
            results = self._request.infer(inputs)
            return [np.array(results[self.compiled.output(n)], copy=True) for n in names]
        except Exception as e:
            raise OpBridgeError(f"OpenVINO failed to run the model. Got {type(e).__name__}: "
                                f"{str(e)[:600]}. Check the inputs against the model's.") from None


def session(model: str | os.PathLike | onnx.ModelProto, *, device: str = "CPU",
            config: dict | None = None) -> OpenVINOSession:
    """An ``OpenVINOSession`` for an inlined ONNX file or proto (see the module doc)."""
    return OpenVINOSession(model, device, config)
