"""The function tier: each custom node runs its model-local ONNX function body (standard ONNX ops),
so plain onnxruntime, or any runtime that inlines functions, runs the file with nothing else.
The body is the op's written one, or one derived from its PyTorch implementation (exporters.derive)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import external_data_helper, numpy_helper

from bridge.core.checks import explain_failure, failed_guard, guard_node, ordered
from bridge.core.domains import is_custom
from bridge.core.errors import OpBridgeError, UnsupportedInTier
from bridge.core.graphs import custom_nodes, model_nodes, subgraphs, walk
from bridge.core.registry import Registry
from bridge.core.spec import BodyBuilder, OpSpec
from exporters.derive import body_status, last_failure
from exporters.export import DEFAULT_OPSET
from exporters.resolve import attach_functions
from ort_kernels.base import Paths, Prepared, Tier, libraries, private_domains

# NOTE: the prefix of the private domains the tier's nodes move to when the options carry a library
FUNCTION_DOMAIN = "opbridge.function."


class FunctionTier(Tier):
    name = "function"
    summary = "the op's ONNX function body, stored in the model: plain onnxruntime runs the file"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None, *, thorough: bool = True) -> str | None:
        kind, note = body_status(spec, dtype, DEFAULT_OPSET, try_it=thorough)
        return (f"no portable body: no function= body, no torch.onnx translation, and none derived ({note})"
                if kind == "none" else None)

    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: Paths | None = None) -> Prepared:
        added = attach_functions(model, registry)
        local = {(f.domain, f.name, f.overload) for f in model.functions}
        missing = sorted({(n.domain, n.op_type) for n in model_nodes(model)
                          if is_custom(n.domain) and (n.domain, n.op_type, n.overload) not in local})
        if missing:
            why = [f"{d}::{t}: {_why(registry, d, t)}" for d, t in missing]
            names = [f"{d}::{t}" for d, t in missing]
            raise UnsupportedInTier(
                f"tier 'function' cannot run {', '.join(names)}: no model-local function, no written "
                f"function body, no torch.onnx translation that applies, and none derived from the "
                f"implementation. Got {'; '.join(why)}. Give the op "
                "a function= body (op.register_function), make its implementation traceable, or use "
                "tier='native' or 'python'."
            )
        _check_optional_inputs(model, registry)
        calls = _checked_calls(model, registry)
        for spec, _, attrs, _ in calls:
            # NOTE: a bad attribute can fail onnxruntime's load (shape inference of the body) before
            # any guard runs: the attribute checks run here, with the same message.
            if len(attrs) < len(spec.attributes):
                continue  # NOTE: a missing attribute is check_nodes' error (sessions), not a check's
            message = spec.checks.attribute_failure(attrs)
            if message is not None:
                raise OpBridgeError(message)
        # NOTE: options that carry a custom-op library (reused from a native or python session) would
        # run its kernels instead of the bodies: the nodes and bodies move to private domains
        private = private_domains(model, FUNCTION_DOMAIN) if libraries(options) else False
        # NOTE: a file's guards wait for nothing (tools see through its Identity waits): the
        # session's copy makes every body wait for its guard, so a bad input fails there first
        waits = [ordered(f) for f in model.functions]
        return Prepared(options, changed=bool(added) or private or any(waits),
                        explain=(functools.partial(_explain, calls),))


def _check_optional_inputs(model: onnx.ModelProto, registry: Registry) -> None:
    """A body that never reads an optional input (or lacks an optional attribute) was written for
    the case where it is omitted: a node that gives it would silently lose it, so that is an error;
    a body needing an optional attribute without a default fails a node that omits it."""
    bodies = {(f.domain, f.name, f.overload): f for f in model.functions}  # NOTE: each node its own overload
    for node in model_nodes(model):
        body = bodies.get((node.domain, node.op_type, node.overload))
        spec = registry.find(node.domain, node.op_type)
        if body is None or spec is None or not any(p.optional for p in spec.params):
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
    if isinstance(spec.function, BodyBuilder):
        known |= set(spec.function.reads)  # NOTE: a built body has the values it read baked in, None too
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
    for n in walk(nodes):
        names.update(n.input)
        for g in subgraphs(n):
            names |= {o.name for o in g.output}
    return names


def _why(registry: Registry, domain: str, name: str) -> str:
    spec = registry.find(domain, name)
    if spec is None:
        return "not registered"
    return last_failure(spec.qualname) or "no body"


def _explain(calls: tuple, error: BaseException, feed: dict) -> str | None:
    """The function tier's explainer: a failed check guard (an op's input check, in its function
    body) as the op's own eager message, naming op and input; None for any other error."""
    guard = failed_guard(error)
    if guard is None:
        return None
    qualname, _, index = guard
    envs, checks = [], None
    for spec, inputs, attrs, known in calls:
        if spec.checks is None or spec.checks.qualname != qualname:
            continue
        checks = spec.checks
        env = dict(attrs)
        for param, name in inputs.items():
            value = feed.get(name, known.get(name)) if name else None
            if name and not isinstance(value, np.ndarray):
                break
            env[param] = None if value is None else torch.from_numpy(np.array(value))
        else:
            envs.append(env)
    node = guard_node(error)
    if checks is None:
        return (f"opbridge: {qualname}: an input check failed (onnxruntime stopped at guard node '{node}'). "
                "Got inputs that fail it. Run the op eagerly on them to see which.")
    return explain_failure(checks, index, envs, node)


def _checked_calls(model: onnx.ModelProto, registry: Registry) -> tuple:
    """``model``'s checked custom nodes: (spec, {param: input value name}, {attribute: value},
    {name: initializer}), what the explainer needs to re-run the eager checks on a failure."""
    # NOTE: only what the messages need is kept, not the model (its weights may be large).
    initializers = {t.name: t for t in model.graph.initializer}
    calls = []
    # NOTE: the nodes in If/Loop/Scan bodies too: their attributes are checked before a session opens
    # like the main graph's (a bad one in a branch was a vague run-time failure), and their inputs,
    # where they are the model's, explain a failed guard
    for node in custom_nodes(model):
        spec = registry.find(node.domain, node.op_type)
        if spec is None or spec.checks is None:
            continue
        inputs = {p.name: (node.input[i] if i < len(node.input) else "") for i, p in enumerate(spec.tensors)}
        given = {a.name: a for a in node.attribute}
        attrs = {p.name: p.from_onnx_value(onnx.helper.get_attribute_value(given[p.name])) if p.name in given
                 else p.absent for p in spec.attributes if p.name in given or p.has_default}
        # NOTE: tensors stored as external data are not loaded here (nor read from a path
        # relative to the working folder): their checks' messages go without values
        known = {n: numpy_helper.to_array(initializers[n]) for n in inputs.values()
                 if n in initializers and initializers[n].ByteSize() < 2**24
                 and not external_data_helper.uses_external_data(initializers[n])}
        calls.append((spec, inputs, attrs, known))
    return tuple(calls)
