"""The function tier: each custom node runs its model-local ONNX function body (standard ONNX ops),
so plain onnxruntime, or any runtime that inlines functions, runs the file with nothing else.
The body is the op's written one, or one derived from its PyTorch implementation (exporters.derive)."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import torch

from bridge.domains import all_nodes, is_custom
from bridge.errors import UnsupportedInTier
from bridge.registry import Registry
from bridge.spec import OpSpec
from exporters.derive import attach_derived, body_status, last_failure
from exporters.export import DEFAULT_OPSET
from exporters.opsets import attach_functions
from ort_kernels.base import Prepared, Tier


class FunctionTier(Tier):
    name = "function"
    summary = "the op's ONNX function body, stored in the model: plain onnxruntime runs the file"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None) -> str | None:
        kind, note = body_status(spec, dtype, DEFAULT_OPSET)
        return f"no portable body: no function= body, and none derived ({note})" if kind == "none" else None

    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: str | os.PathLike | None = None) -> Prepared:
        added = attach_functions(model, registry) + attach_derived(model, registry)
        local = {(f.domain, f.name, f.overload) for f in model.functions}
        missing = sorted({(n.domain, n.op_type) for n in all_nodes(model)
                          if is_custom(n.domain) and (n.domain, n.op_type, n.overload) not in local})
        if missing:
            why = [f"{d}::{t}: {_why(registry, d, t)}" for d, t in missing]
            missing = [f"{d}::{t}" for d, t in missing]
            raise UnsupportedInTier(
                f"tier 'function' cannot run {', '.join(missing)}: no model-local function, no written "
                f"function body and none derived from the implementation. Got {'; '.join(why)}. Give the op "
                "a function= body (op.register_function), make its implementation traceable, or use "
                "tier='native' or 'python'."
            )
        _check_optional_inputs(model, registry)
        return Prepared(options, changed=bool(added))


def _check_optional_inputs(model: onnx.ModelProto, registry: Registry) -> None:
    """A body that never reads an optional input (or lacks an optional attribute) was written for
    the case where it is omitted: a node that gives it would silently lose it, so that is an error;
    a body needing an optional attribute without a default fails a node that omits it."""
    bodies = {(f.domain, f.name): f for f in model.functions}
    for node in all_nodes(model):
        body = bodies.get((node.domain, node.op_type))
        spec = registry.find(node.domain, node.op_type)
        if body is None or spec is None:
            continue
        optional = {p.name for p in spec.tensors if p.optional}
        used = _names_read(body.node) | set(body.output)
        for formal, actual in zip(body.input, node.input):
            if actual and formal in optional and formal not in used:
                raise UnsupportedInTier(
                    f"the function body of {node.domain}::{node.op_type} ignores its input '{formal}' (it handles "
                    f"only the case where '{formal}' is omitted). Got node {node.name!r} giving it as {actual!r}. "
                    "Use tier='native' or 'python', or write a body that reads it."
                )
        _check_optional_attributes(node, body, spec)


def _check_optional_attributes(node: onnx.NodeProto, body: onnx.FunctionProto, spec: OpSpec) -> None:
    given = {a.name for a in node.attribute}
    needed = set(body.attribute)  # NOTE: attributes without a default; attribute_proto ones have one
    known = needed | {a.name for a in body.attribute_proto}
    for p in spec.attributes:
        if not p.optional:
            continue
        if p.name in given and p.name not in known:
            raise UnsupportedInTier(
                f"the function body of {node.domain}::{node.op_type} has no attribute '{p.name}' (it handles only "
                f"the case where '{p.name}' is omitted). Got node {node.name!r} giving {p.name}. Use tier='native' "
                f"or 'python', or write a body that takes '{p.name}'.")
        if p.name not in given and p.name in needed:
            raise UnsupportedInTier(
                f"the function body of {node.domain}::{node.op_type} needs attribute '{p.name}' (it handles only "
                f"the case where '{p.name}' is given). Got node {node.name!r} without it. Pass {p.name} in the "
                f"model's call, or use tier='python'.")


def _names_read(nodes) -> set[str]:
    """Every value name the nodes read, subgraphs (If/Loop/Scan bodies) included."""
    names: set[str] = set()
    for n in nodes:
        names.update(n.input)
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _names_read(g.node) | {o.name for o in g.output}
    return names


def _why(registry: Registry, domain: str, name: str) -> str:
    spec = registry.find(domain, name)
    if spec is None:
        return "not registered"
    return last_failure(spec.qualname) or "no body"
