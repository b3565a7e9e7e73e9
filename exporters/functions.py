"""Model-local function bodies: attach each custom node's registered body to a model."""

from __future__ import annotations

import onnx

from bridge.domains import all_nodes, is_custom, is_onnx
from bridge.errors import OpBridgeError
from bridge.registry import Registry


def attach_functions(model: onnx.ModelProto, registry: Registry) -> list[str]:
    """Add each custom node's function body to ``model.functions``; return the ops added.

    The function's standard-ONNX opset import is aligned to the model's own.
    """
    have = {(f.domain, f.name) for f in model.functions}
    model_opsets = {o.domain: o.version for o in model.opset_import}
    added = []
    for node in all_nodes(model):
        key = (node.domain, node.op_type)
        if not is_custom(node.domain) or key in have:
            continue
        spec = registry.find(*key)
        if spec is None or spec.function is None:
            continue
        proto = spec.function.to_function_proto()
        for imp in proto.opset_import:
            if is_onnx(imp.domain) and imp.version != model_opsets.get("", imp.version):
                raise OpBridgeError(
                    f"{spec.qualname}: function body uses ONNX opset {imp.version} but the model uses "
                    f"{model_opsets['']}. Got opset_version={model_opsets['']}. Export with "
                    f"opset_version={imp.version}, or write the body with onnxscript.opset{model_opsets['']}."
                )
        model.functions.append(proto)
        have.add(key)
        added.append(spec.qualname)
    return added


def ensure_opset_imports(model: onnx.ModelProto, registry: Registry) -> None:
    """Import every custom domain the model's nodes use, at the registered version."""
    present = {o.domain for o in model.opset_import}
    for domain in sorted({n.domain for n in all_nodes(model) if is_custom(n.domain)} - present):
        versions = {s.version for s in registry if s.domain == domain}
        model.opset_import.append(onnx.helper.make_opsetid(domain, max(versions or {1})))
