"""The function tier: each custom node runs its model-local ONNX function body (standard ONNX ops),
so plain onnxruntime, or any runtime that inlines functions, runs the file with nothing else.
The body is the op's written one, or one derived from its PyTorch implementation (exporters.derive)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import onnxruntime as ort
import torch

from bridge.core.basics.errors import OpBridgeError, UnsupportedInTier
from bridge.core.basics.files import load_model
from bridge.core.basics.graphs import cone, model_value_types, subgraphs, value_types, walk
from bridge.core.checks import Checks, guard_failure, is_guard, ordered, unregistered_guard_failure
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec
from exporters.derive import Crash, crash_sites, last_failure
from exporters.export import DEFAULT_OPSET
from exporters.kinds import body_checks, body_kind
from exporters.resolve import attach_functions
from ort_kernels.base import (
    Explain,
    Paths,
    Plan,
    Planned,
    Prepared,
    Refuse,
    Session,
    Tier,
    import_hint,
    libraries,
    private_domains,
)

# NOTE: the prefix of the private domains the tier's nodes move to when the options carry a library
FUNCTION_DOMAIN = "opbridge.function."


class FunctionTier(Tier):
    name = "function"
    summary = "the op's ONNX function body, stored in the model: plain onnxruntime runs the file"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None, *, thorough: bool = True) -> str | None:
        kind, note = body_kind(spec).status(dtype, DEFAULT_OPSET, try_it=thorough)
        return (f"no portable body: no function= body, no torch.onnx translation, and none derived ({note})"
                if kind == "none" else None)

    def prepare(self, plan: Plan, options: ort.SessionOptions | None, library: Paths | None = None) -> Prepared:
        model = plan.model
        added = attach_functions(model, plan.registry, nodes=[p.node for p in plan.nodes])
        if added:
            plan.refresh()  # NOTE: the resolver gave the model bodies: a new proto, new nodes
        local = {(f.domain, f.name, f.overload) for f in model.functions}
        missing = sorted({p.key for p in plan.graph if (*p.key, p.node.overload) not in local})
        if missing:
            why = [f"{d}::{t}: {_why(plan, d, t)}" for d, t in missing]
            names = [f"{d}::{t}" for d, t in missing]
            raise UnsupportedInTier(
                f"tier 'function' cannot run {', '.join(names)}: no model-local function, no written "
                f"function body, no torch.onnx translation that applies, and none derived from the "
                f"implementation. Got {'; '.join(why)}. {import_hint(plan.registry, names)}Give the op "
                "a function= body (op.register_function), make its implementation traceable, or use "
                "tier='native' or 'python'."
            )
        _check_optional_inputs(plan)
        for call in _calls(plan, _guard_nodes(plan)):
            # NOTE: a bad attribute can fail onnxruntime's load (shape inference of the body) before
            # any guard runs: the attribute checks run here, with the same message.
            message = call.checks.attribute_failure(call.attrs)
            if message is not None:
                raise OpBridgeError(message)
        # NOTE: options that carry a custom-op library (reused from a native or python session) would
        # run its kernels instead of the bodies: the nodes and bodies move to private domains
        private = private_domains(plan, FUNCTION_DOMAIN) if libraries(options) else False
        # NOTE: a file's guards wait for nothing (tools see through its Identity waits): the
        # session's copy makes every body wait for its guard, so a bad input fails there first
        waits = [ordered(f) for f in model.functions]
        return Prepared(options, changed=bool(added) or private or any(waits))


@dataclasses.dataclass(frozen=True)
class _CrashSize:
    """A size a node's body makes onnxruntime die at (:class:`exporters.derive.Crash`): the node's input
    ``value``, and the model input dim that carries its size (``feed``, ``axis``: the same dim name),
    None where no model input does (a size computed inside the model)."""

    qualname: str
    crash: Crash
    value: str
    feed: str | None
    axis: int
    dim: str
    when: tuple[str, bool] | None  # NOTE: the main-graph If condition (and branch) the node runs under


def _dies(qualname: str, crash: Crash) -> str:
    """The first clause of every crash refusal: the op, how onnxruntime dies, and at which size."""
    return (f"{qualname}: its function body makes onnxruntime die ({crash.how}, which would end this process) "
            f"where input '{crash.input}' has size {crash.size} in dim {crash.axis}")


def _crash_sizes(model: onnx.ModelProto, registry: Registry) -> tuple[_CrashSize, ...]:
    """The sizes the custom nodes' bodies make onnxruntime die at (their doc strings say, or an inlined
    model's note: ``exporters.derive.crash_sites``), each with the model input dim the node's input dim
    is named after. A node in an If/Loop body reading a value of that body whose size no model input dim
    names cannot be told before the run (its value is not computed before it): refused here."""
    sites = crash_sites(model, registry)
    if not sites:
        return ()
    types = model_value_types(model)
    inputs: dict[str, tuple[str, int]] = {}
    for value in model.graph.input:
        for axis, d in enumerate(value.type.tensor_type.shape.dim):
            if d.dim_param:
                inputs.setdefault(d.dim_param, (value.name, axis))
    graph = model.graph
    computable = {v.name for v in graph.input} | {t.name for t in graph.initializer} | \
        {o for n in graph.node for o in n.output}
    found = []
    for site in sites:
        if site.within is not None:
            raise UnsupportedInTier(
                f"{_dies(site.qualname, site.crash)}, and the body of {site.within} (not derived, so never run at "
                f"that size) calls it, reading value '{site.value}', which exists only while that body runs: the size "
                f"cannot be refused before it. Got a {site.qualname} node inside {site.within}'s body. Run this model "
                f"with tier='python' or 'native', or inline it (bridge.inline: its values then carry the size), or "
                f"give {site.qualname} a function= body that handles size {site.crash.size}.")
        value = types.get(site.value)
        dims = value.tensor_type.shape.dim if value is not None else []
        name = dims[site.crash.axis].dim_param if site.crash.axis < len(dims) else ""
        feed, axis = inputs.get(name, (None, site.crash.axis))
        if feed is None and site.value not in computable:
            raise UnsupportedInTier(
                f"{_dies(site.qualname, site.crash)}, and its node inside an If/Loop body reads value "
                f"'{site.value}' there, whose size no model input names and which exists only while that body runs, "
                f"so the size cannot be refused before it. Got value '{site.value}' with dim {site.crash.axis} "
                f"{repr(name) if name else 'unnamed'}. Run this model with tier='python' or 'native', or give the op "
                f"a function= body that handles size {site.crash.size}.")
        found.append(_CrashSize(site.qualname, site.crash, site.value, feed, axis, name, site.when))
    return tuple(found)


def crash_refusal(model: onnx.ModelProto, registry: Registry) -> tuple[Refuse, ...]:
    """The refusal (``Session(refuse=...)``) of the feeds that make onnxruntime die in a body ``model``
    (as a tier prepared it) runs: the sizes its bodies' doc strings name, at the nodes that run them
    (a tier that serves an op with a kernel has dropped its body); () when there are none."""
    crashes = _crash_sizes(model, registry)
    return (_Refusal(crashes, model),) if crashes else ()


class _Refusal:
    """The refusal of a feed whose sizes make onnxruntime die in a body (the process
    would end), with what eager does there: a size a model input carries is read from the feed; one
    computed inside the model, by running the part of the model that computes it (``_computed``)."""

    def __init__(self, crashes: tuple[_CrashSize, ...], model: onnx.ModelProto):
        self.crashes, self._model = crashes, model
        self._content: bytes | None = None

    def __call__(self, shapes: dict, feed: dict) -> str | None:
        at_size = []
        for c in self.crashes:
            shape = shapes.get(c.feed) if c.feed is not None else None
            if shape is not None and c.axis < len(shape) and shape[c.axis] == c.crash.size:
                at_size.append((c, f"model input '{c.feed}' of size {c.crash.size} in dim {c.axis} ('{c.dim}')"))
        inside = [c for c in self.crashes if c.feed is None]
        if not at_size and not inside:
            return None
        # NOTE: the values read inside the model: sizes computed there, the conditions of the If branches nodes run in
        wanted = [c.value for c in inside] + [c.when[0] for c in self.crashes if c.when is not None]
        values = self._values(list(dict.fromkeys(wanted)), feed)
        for c in inside:
            shape = getattr(values.get(c.value), "shape", None)
            if shape is not None and c.crash.axis < len(shape) and shape[c.crash.axis] == c.crash.size:
                at_size.append((c, f"'{c.value}' (its input '{c.crash.input}', computed in the model) of size "
                                   f"{c.crash.size} in dim {c.crash.axis}"))
        for c, got in at_size:
            if _runs(c, values):
                return self._message(c, got)
        return None

    def _values(self, names: list[str], feed: dict) -> dict:
        """The values ``names`` of the main graph on ``feed`` ({} for none; a value that could not be computed
        is left out)."""
        if not names:
            return {}
        if self._content is None:
            self._content = self._model.SerializeToString()
        return _computed(self._content, names, {k: v.numpy() if isinstance(v, ort.OrtValue) else v
                                                for k, v in feed.items()})

    @staticmethod
    def _message(c: _CrashSize, got: str) -> str:
        return (f"{_dies(c.qualname, c.crash)}; eager gives a result there. Got {got}. Run such inputs with "
                f"tier='python' or 'native' (or eagerly), or give the op a function= body that handles size "
                f"{c.crash.size}.")


def _check_optional_inputs(plan: Plan) -> None:
    """A body that never reads an optional input (or lacks an optional attribute) was written for
    the case where it is omitted: a node that gives it would silently lose it, so that is an error;
    a body needing an optional attribute without a default fails a node that omits it."""
    bodies = {(f.domain, f.name, f.overload): f for f in plan.model.functions}  # NOTE: each node its own overload
    for p in plan.graph:
        node, spec = p.node, p.spec
        body = bodies.get((node.domain, node.op_type, node.overload))
        if body is None or spec is None or not any(param.optional for param in spec.params):
            continue
        optional = {param.name for param in spec.tensors if param.optional}
        used = _names_read(body.node) | set(body.output)
        for formal, actual in zip(body.input, node.input):
            if actual and formal in optional and formal not in used:
                raise UnsupportedInTier(
                    f"the function body of {p.op} ignores its input '{formal}' (it handles "
                    f"only the case where '{formal}' is omitted). Got node {node.name!r} giving it as {actual!r}. "
                    "Use tier='native' or 'python', or write a body that reads it."
                )
        _check_optional_attributes(node, body, spec)


def _check_optional_attributes(node: onnx.NodeProto, body: onnx.FunctionProto, spec: OpSpec) -> None:
    given = {a.name for a in node.attribute}
    needed = set(body.attribute)  # NOTE: attributes without a default; attribute_proto ones have one
    known = needed | {a.name for a in body.attribute_proto}
    known |= set(body_kind(spec).reads)  # NOTE: a built body has the values it read baked in, None too
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


def _why(plan: Plan, domain: str, name: str) -> str:
    spec = plan.registry.find(domain, name)
    if spec is None:
        return "not registered"
    return last_failure(spec.qualname) or "no body"


@dataclasses.dataclass(frozen=True)
class _Call:
    """A custom node of an op with checks: the checks its body states (the op's own, a derived body's
    index checks), the value each tensor parameter reads ("" when omitted) and its attribute values."""

    checks: Checks
    inputs: dict[str, str]
    attrs: dict

    @staticmethod
    def of(checks: Checks, spec: OpSpec, p: Planned) -> _Call:
        names = [*p.node.input, *[""] * len(spec.tensors)]
        return _Call(checks, {t.name: name for t, name in zip(spec.tensors, names)}, p.attributes())

    def failure(self, values: dict) -> str | None:
        """The eager message of the first check of the op that fails on the node's inputs in
        ``values`` (arrays by value name); None when all hold, or when an input is not known."""
        env = dict(self.attrs)
        for param, name in self.inputs.items():
            if name and not isinstance(values.get(name), np.ndarray):
                return None
            env[param] = torch.from_numpy(np.array(values[name])) if name else None
        try:
            return self.checks.first_failure(env)
        except Exception:  # noqa: BLE001  values a check cannot read (a sequence, an odd dtype) explain nothing
            return None


def _calls(plan: Plan, guards: dict[str, Checks]) -> tuple[_Call, ...]:
    """The graph's calls of ops with checks, each with the checks its body guards (``guards``: a derived
    body's index checks too)."""
    stated = {c.qualname: c for c in guards.values()}
    return tuple(_Call.of(checks, p.spec, p) for p in plan.graph if p.spec is not None
                 for checks in [stated.get(p.spec.qualname, p.spec.checks)] if checks is not None)


def guard_explainer(plan: Plan) -> Explain:
    """The explainer of the guards of the function bodies a session runs (:func:`_explain`), read from the
    plan a tier prepared: the function tier's bodies, and those the native tier runs for ops without a C++
    kernel (``bridge.session`` adds it for every tier)."""
    guards = _guard_nodes(plan)
    # NOTE: no guard, no calls to read (a native session whose ops all have C++ kernels)
    explain = functools.partial(_explain, _calls(plan, guards) if guards else (), guards)
    unknown = _unregistered_guard_nodes(plan)
    return explain if not unknown else functools.partial(_explain_unregistered, explain, unknown)


def _guard_nodes(plan: Plan) -> dict[str, Checks]:
    """The name of each guard node in the model's function bodies -> the checks of its op."""
    guards = {}
    for function in plan.model.functions:
        # NOTE: a tier may have moved the bodies to private domains (the function tier's)
        spec = plan.registry.find(function.domain.removeprefix(FUNCTION_DOMAIN), function.name)
        checks = None if spec is None else body_checks(function, spec)
        if checks is not None:
            guards.update({n.name: checks for n in function.node if is_guard(n)})
    return guards


def _unregistered_guard_nodes(plan: Plan) -> tuple[str, ...]:
    """The names of the guard nodes in the bodies of ops the plan's registry lacks (a file run without
    importing the module that registers them): their checks are known only by those names."""
    return tuple(n.name for function in plan.model.functions
                 if plan.registry.find(function.domain.removeprefix(FUNCTION_DOMAIN), function.name) is None
                 for n in function.node if is_guard(n))


def _explain_unregistered(explain: Explain, unknown: tuple[str, ...], error: BaseException, feed: dict | None,
                          model: bytes | str) -> str | None:
    """``explain`` (the registered ops' guards, :func:`_explain`), else a failed guard of an unregistered op
    worded from its node's name and onnxruntime's message (:func:`unregistered_guard_failure`)."""
    message = explain(error, feed, model)
    if message is not None:
        return message
    text = str(error)
    stopped = [name for name in unknown if name in text]
    # NOTE: one guard node's name may begin another's
    return unregistered_guard_failure(max(stopped, key=len), text) if stopped else None


def _explain(calls: tuple[_Call, ...], guards: dict[str, Checks], error: BaseException, feed: dict,
             model: bytes | str) -> str | None:
    """The function tier's explainer: a failed guard (an op's input checks, in its function body)
    as the op's eager message, from its own checks run on the values its nodes were given, in the
    order the nodes run; None for an error that is no guard's.

    NOTE: which guard stopped is read from the error by the guard nodes' own names, nothing of
    onnxruntime's wording; which check failed, only from the values."""
    text = str(error)
    stopped = [name for name in guards if name in text]
    if not stopped:
        return None
    node = max(stopped, key=len)  # NOTE: one guard node's name may begin another's
    qualnames = {guards[name].qualname for name in stopped}
    values = dict(feed or {})  # NOTE: None: the feed is not known (an IOBinding's run)
    for call in calls:
        if call.checks.qualname not in qualnames:
            continue
        missing = [name for name in call.inputs.values() if name and name not in values]
        if missing:
            computed = _computed(model, missing, feed or {})
            values.update({name: computed.get(name) for name in missing})  # NOTE: None: unknown, not asked again
        message = call.failure(values)
        if message is not None:
            return message
    return guard_failure(guards[node], node)


def _runs(c: _CrashSize, values: dict) -> bool:
    """Whether the node of ``c`` runs on the feed ``values`` were computed from: False only for a node in an If
    branch the feed's condition does not take (a model's guard against that very size); True when unknown."""
    if c.when is None or c.when[0] not in values:
        return True
    condition = np.asarray(values[c.when[0]])
    return condition.size != 1 or bool(condition.reshape(-1)[0]) == c.when[1]


def _computed(model: bytes | str, names: list[str], feed: dict) -> dict:
    """The values ``names`` of the main graph of ``model`` (its bytes or path) on ``feed``: a copy
    cut to the nodes they depend on, with them as its outputs, run once; {} where that fails (a
    value of a subgraph, a feed that could not be read, a run that fails)."""
    try:
        proto = load_model(model)
        graph = proto.graph
        # NOTE: onnxruntime runs every node of a graph, read or not: the copy keeps only these
        nodes = cone(graph.node, names)
        types = value_types(graph)
        del graph.node[:], graph.output[:]
        graph.node.extend(nodes)
        graph.output.extend(onnx.helper.make_value_info(name, types[name]) if name in types
                            else onnx.helper.make_empty_tensor_value_info(name) for name in names)
        options = ort.SessionOptions()
        options.log_severity_level = 4  # NOTE: the failure it looks into was reported already
        return dict(zip(names, Session(proto.SerializeToString(), options).run(names, feed)))
    except Exception:  # noqa: BLE001  what cannot be computed stays unknown
        return {}
