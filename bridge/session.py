"""``bridge.session``: an onnxruntime InferenceSession with every custom op of the model resolvable."""

from __future__ import annotations

import os
from collections.abc import Sequence

import onnx
import onnxruntime as ort

from bridge.errors import OpBridgeError, UnsupportedInTier
from bridge.progress import step
from bridge.registry import REGISTRY, Registry

TIERS = ("function", "native", "python")
_STANDARD = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}


def load_model(model: str | os.PathLike | onnx.ModelProto | bytes) -> onnx.ModelProto:
    """Load a model from a path, bytes or proto (copied: sessions edit their copy); errors are clear."""
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, bytes):
        try:
            return onnx.load_from_string(model)
        except Exception as e:
            raise OpBridgeError(f"the model bytes are not an ONNX model. Got {type(e).__name__}: {e}. "
                                "Pass the bytes of a saved .onnx file.") from None
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise OpBridgeError(f"no ONNX file at {path!r}. Got a path that does not exist. "
                            "Export one first with `opbridge export` or bridge.export(...).")
    try:
        return onnx.load(path)
    except Exception as e:
        raise OpBridgeError(f"{path!r} is not a readable ONNX model (truncated or corrupt?). "
                            f"Got {type(e).__name__}: {str(e)[:200]}. Export it again.") from None


def custom_nodes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """Sorted distinct (domain, op_type) of the main graph's non-standard nodes."""
    return sorted({(n.domain, n.op_type) for n in model.graph.node if n.domain not in _STANDARD})


def resolve_functions(model: onnx.ModelProto, registry: Registry) -> list[str]:
    """Attach missing function bodies from the registry; raise for ops still unresolvable."""
    from exporters.export import attach_functions

    attach_functions(model, registry)
    local = {(f.domain, f.name) for f in model.functions}
    missing = [f"{d}::{t}" for d, t in custom_nodes(model) if (d, t) not in local]
    if missing:
        raise UnsupportedInTier(
            f"tier 'function' cannot run {', '.join(missing)}: no model-local function and no "
            f"registered function body. Got ops {missing}. Give the op a function= body, "
            "or use tier='native'."
        )
    return [f"{d}::{t}" for d, t in custom_nodes(model)]


def use_native(model: onnx.ModelProto, registry: Registry,
               sess_options: ort.SessionOptions | None) -> ort.SessionOptions:
    """Point the model's custom nodes at the native library; raise for ops it does not serve."""
    from ort_kernels.build import library_path, served_ops

    served = served_ops(registry)
    missing = [f"{d}::{t}" for d, t in custom_nodes(model) if (d, t) not in served]
    if missing:
        raise UnsupportedInTier(
            f"tier 'native' has no C++ kernel for {', '.join(missing)}. Got ops {missing}. Add "
            "ort_kernels/cpu/<op>.cc (or native= on @bridge.op), or use tier='function'."
        )
    # NOTE: drop the model-local functions the library serves, so that the C++ kernels, not the
    # function bodies, are what this session runs.
    keep = [f for f in model.functions if (f.domain, f.name) not in served]
    del model.functions[:]
    model.functions.extend(keep)
    options = sess_options or ort.SessionOptions()
    options.register_custom_ops_library(str(library_path(registry)))
    return options


def session(
    model: str | os.PathLike | onnx.ModelProto | bytes,
    *,
    tier: str = "function",
    registry: Registry | None = None,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    sess_options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An ``onnxruntime.InferenceSession`` for ``model`` whose custom ops all have kernels.

    ``tier="function"`` runs each custom node through its model-local ONNX function (attached
    from the registry when the file lacks it), so plain ONNX Runtime needs nothing else.
    ``tier="native"`` loads the C++ kernel library (built on first use); ``tier="python"`` runs
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
    if tier not in TIERS:
        raise OpBridgeError(f"unknown kernel tier. Got {tier!r}. Use one of {TIERS}.")
    reg = REGISTRY if registry is None else registry
    proto = load_model(model)
    if tier == "function":
        resolve_functions(proto, reg)
    elif tier == "native":
        sess_options = use_native(proto, reg, sess_options)
    else:
        from ort_kernels.python_tier import python_session

        with step("onnxruntime session (python tier)"):
            return python_session(proto, reg, sess_options, providers)
    with step(f"onnxruntime session ({tier} tier)"):
        try:
            return ort.InferenceSession(proto.SerializeToString(), sess_options,
                                        providers=list(providers))
        except Exception as e:
            raise OpBridgeError(f"onnxruntime could not load the model. Got {type(e).__name__}: "
                                f"{str(e)[:500]}. Check the op kernels for tier {tier!r}.") from e
