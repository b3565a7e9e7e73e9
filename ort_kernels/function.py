"""The function tier: each custom node runs its model-local ONNX function body (standard ONNX ops),
so plain onnxruntime, or any runtime that inlines functions, runs the file with nothing else."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import torch

from bridge.domains import all_nodes, custom_nodes
from bridge.errors import UnsupportedInTier
from bridge.registry import Registry
from bridge.spec import OpSpec
from exporters.opsets import attach_functions
from ort_kernels.base import Prepared, Tier


class FunctionTier(Tier):
    name = "function"
    summary = "the op's ONNX function body, stored in the model: plain onnxruntime runs the file"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None) -> str | None:
        return None if spec.function is not None else "no function body (register_function / function=)"

    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: str | os.PathLike | None = None) -> Prepared:
        added = attach_functions(model, registry)
        local = {(f.domain, f.name) for f in model.functions}
        missing = [f"{d}::{t}" for d, t in custom_nodes(model) if (d, t) not in local]
        if missing:
            raise UnsupportedInTier(
                f"tier 'function' cannot run {', '.join(missing)}: no model-local function and no "
                f"registered function body. Got ops {missing}. Give the op a function= body "
                "(op.register_function), or use tier='native'."
            )
        _check_optional_inputs(model, registry)
        return Prepared(options, changed=bool(added))


def _check_optional_inputs(model: onnx.ModelProto, registry: Registry) -> None:
    """A body that never reads an optional input was written for the case where it is omitted: a
    node that gives that input would silently lose it, so that is an error."""
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


def _names_read(nodes) -> set[str]:
    """Every value name the nodes read, subgraphs (If/Loop/Scan bodies) included."""
    names: set[str] = set()
    for n in nodes:
        names.update(n.input)
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _names_read(g.node) | {o.name for o in g.output}
    return names
