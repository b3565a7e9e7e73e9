"""Checks of a derived body before use: the implementation must not return (a view of) an input,
and the body must pass ``onnx.checker`` (full) and match eager in onnxruntime at the traced sizes
and, where the site has dynamic dims, at other sizes: each dim at 0 and at 1 too (where eager
accepts that size), run in a child process (``contained``), so that onnxruntime dying on the body at
such a size ends the child, not the export: a size it dies at is recorded (:class:`Crash`) and refused
by the function tier."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper

from bridge.core.basics import torch_compat
from bridge.core.basics.dtypes import TORCH_TO_ONNX, numpy_dtype
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import custom_nodes_with_branch, walk
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec
from exporters.derive.body import DERIVED
from exporters.derive.contained import RUNNER
from exporters.derive.sites import Site, Untraceable, one_line
from exporters.derive.tracing import call_args, example, example_inputs, example_sizes, flat_values

_ALT_STEP = 3  # verification also runs the dynamic dims at size + this
_EDGE_SIZES = (0, 1)  # ... and each dynamic dim at these sizes (torch's trace assumes 2 or more)
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


@dataclasses.dataclass(frozen=True)
class Crash:
    """onnxruntime dies running a body where input ``input`` has size ``size`` in dim ``axis``
    (eager gives a result there): ``how`` is the signal that ended the process."""

    input: str
    axis: int
    size: int
    how: str


def verify(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], proto: onnx.FunctionProto, sizes: dict,
           outputs: Sequence[tuple[torch.dtype, int]]) -> tuple[Crash, ...]:
    """Raise ``Untraceable`` where ``proto`` does not load or differs from ``fn`` at ``sizes`` (and,
    with dynamic dims, at other sizes, each at 0 and 1 too); ``outputs`` gives each output's dtype
    and rank. Returns the sizes onnxruntime dies at (run in a child process: the export lives on)."""
    model = _wrap(spec, site, proto, outputs)
    sess = _session(model)
    # NOTE: and below the int attributes, where the trace ran past them (a body must hold on both sides)
    below = example_sizes(site, past_ints=False)
    trials = [sizes] + ([{s: n + _ALT_STEP for s, n in sizes.items()}] if sizes else []) + \
        ([below] if below != sizes else [])
    for trial in trials:
        if not site.takes(trial):
            continue
        expected, feed = _trial(spec, fn, site, roles, trial)
        if expected is None:
            continue
        try:
            got = sess.run(None, feed)
        except Exception as exc:  # noqa: BLE001
            raise Untraceable(f"the derived body fails in onnxruntime at sizes {trial} ({one_line(exc)})") from None
        _compare(expected, got, "" if trial is sizes else f" at dynamic sizes {trial}")
    return _edges(spec, fn, site, roles, model, sizes)


_CRASH_LINE = re.compile(r"^opbridge: onnxruntime dies \((\w+)\) running this body where input '([^']+)' has "
                         r"size (\d+) in dim (\d+)", re.MULTILINE)


def crash_lines(crashes: Sequence[Crash]) -> str:
    """The lines a body's ``doc_string`` says ``crashes`` in (:func:`crashes_of` reads them back).

    Example:
        >>> text = crash_lines([Crash("rois", 0, 0, "SIGFPE")])
        >>> text.startswith("opbridge: onnxruntime dies (SIGFPE) running this body where input 'rois' has size 0")
        True
        >>> crashes_of("opbridge body for attributes k=1\\n" + text)
        (Crash(input='rois', axis=0, size=0, how='SIGFPE'),)
    """
    return "\n".join(f"opbridge: onnxruntime dies ({c.how}) running this body where input '{c.input}' has size "
                     f"{c.size} in dim {c.axis} (eager gives a result)" for c in crashes)


def crashes_of(doc_string: str) -> tuple[Crash, ...]:
    """The crashes a body's ``doc_string`` records (:func:`crash_lines`)."""
    return tuple(Crash(m[2], int(m[4]), int(m[3]), m[1]) for m in _CRASH_LINE.finditer(doc_string or ""))


@dataclasses.dataclass(frozen=True)
class CrashSite:
    """A node whose body onnxruntime dies in (:class:`Crash`): its op, and the value the node reads as
    the crash's input (a name in the model's graph or in one of its If/Loop bodies)."""

    qualname: str
    crash: Crash
    value: str
    # NOTE: the If of the main graph whose branch the node sits in: its condition value, and True for then_branch
    when: tuple[str, bool] | None = None
    # NOTE: the op whose body (one not derived, so never checked at these sizes) holds the node, if any
    within: str | None = None


# NOTE: the key of the model metadata entry that carries the crash sites of an inlined model, whose bodies
# (and their doc strings) are gone; tools keep a model's metadata_props, as they keep doc strings
CRASH_NOTE = "opbridge.crashes"
_SITE_LINE = re.compile(r"^opbridge: onnxruntime dies \((\w+)\) running the body of (\S+) where input '([^']+)' has "
                        r"size (\d+) in dim (\d+), read from value '(.+?)'(?:, when '(.+)' is (true|false))? "
                        r"\(eager gives a result\)$", re.MULTILINE)


def crash_note(sites: Sequence[CrashSite]) -> str:
    """The text of an inlined model's :data:`CRASH_NOTE` entry for ``sites``, a line each
    (:func:`noted_crashes` reads them back).

    Example:
        >>> site = CrashSite("mmcv::MMCVRoiAlign", Crash("rois", 0, 0, "SIGFPE"), "rois")
        >>> crash_note([site])
        "opbridge: onnxruntime dies (SIGFPE) running the body of mmcv::MMCVRoiAlign where input 'rois' has size 0 \
in dim 0, read from value 'rois' (eager gives a result)"
        >>> guarded = CrashSite("mmcv::MMCVRoiAlign", Crash("rois", 0, 0, "SIGFPE"), "rois", ("any", True))
        >>> noted_crashes(crash_note([site, guarded])) == (site, guarded)
        True
    """
    return "\n".join(f"opbridge: onnxruntime dies ({s.crash.how}) running the body of {s.qualname} where input "
                     f"'{s.crash.input}' has size {s.crash.size} in dim {s.crash.axis}, read from value '{s.value}'"
                     + (f", when '{s.when[0]}' is {str(s.when[1]).lower()}" if s.when else "")
                     + " (eager gives a result)" for s in sites)


def noted_crashes(note: str) -> tuple[CrashSite, ...]:
    """The crash sites an inlined model's :data:`CRASH_NOTE` entry records (:func:`crash_note`)."""
    return tuple(CrashSite(m[2], Crash(m[3], int(m[5]), int(m[4]), m[1]), m[6],
                           (m[7], m[8] == "true") if m[7] else None) for m in _SITE_LINE.finditer(note))


def crash_sites(model: onnx.ModelProto, registry: Registry) -> tuple[CrashSite, ...]:
    """Where onnxruntime dies in ``model``: each custom node (main graph and If/Loop bodies) whose body's
    ``doc_string`` records crashes (:func:`crash_lines`), once per crash, then the sites the model's
    :data:`CRASH_NOTE` entry records (an inlined model's), then the nodes inside the bodies of other ops that
    were not derived (a body written or built for an op that calls the other: ``within``); what those read
    exists only while that body runs. A derived body holds no such node: tracing went through its op."""
    noted = [s for p in model.metadata_props if p.key == CRASH_NOTE for s in noted_crashes(p.value)]
    bodies = {(f.domain, f.name, f.overload): f for f in model.functions if crashes_of(f.doc_string)}
    if not bodies:
        return tuple(noted)
    found = [s for node, when in custom_nodes_with_branch(model) for s in _sites(node, bodies, registry, when=when)]
    found += noted
    for outer in (f for f in model.functions if not f.doc_string.startswith(DERIVED)):
        found += [s for node in walk(outer.node)
                  for s in _sites(node, bodies, registry, within=f"{outer.domain}::{outer.name}")]
    return tuple(dict.fromkeys(found))


def _sites(node: onnx.NodeProto, bodies: dict, registry: Registry, **where) -> list[CrashSite]:
    """The crash sites of ``node`` (none unless ``bodies`` holds its body), each with the value it reads as the
    crash's input."""
    body = bodies.get((node.domain, node.op_type, node.overload))
    if body is None:
        return []
    spec = registry.find(node.domain, node.op_type)
    # NOTE: without the op (a file inlined by a process that does not register it) the body's own names say
    formals = [p.name for p in spec.tensors] if spec is not None else list(body.input)
    qualname = spec.qualname if spec is not None else f"{node.domain}::{node.op_type}"
    found = []
    for crash in crashes_of(body.doc_string):
        index = formals.index(crash.input) if crash.input in formals else len(node.input)
        if index < len(node.input) and node.input[index]:
            found.append(CrashSite(qualname, crash, node.input[index], **where))
    return found


def note_crashes(model: onnx.ModelProto, sites: Sequence[CrashSite]) -> None:
    """Record ``sites`` in ``model``'s :data:`CRASH_NOTE` metadata entry (replacing it); a model
    without sites is left as it is."""
    if not sites:
        return
    kept = [p for p in model.metadata_props if p.key != CRASH_NOTE]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=CRASH_NOTE, value=crash_note(sites))


def _trial(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], trial: dict) -> tuple[tuple | None, dict]:
    """Eager's outputs at the sizes ``trial`` (None where eager refuses them) and the body's feed."""
    g = torch.Generator().manual_seed(0)
    tensors = [None if t is None else example(t, trial, g) for t in site.tensors]
    feed = {p.name: t.numpy() if t.dtype != torch.bfloat16 else t.float().numpy()
            for p, t in zip(spec.tensors, tensors) if t is not None}
    return _eager(spec, fn, site, roles, tensors), feed


def _compare(expected: tuple, got: Sequence[np.ndarray], where: str) -> None:
    for i, (e, a) in enumerate(zip(expected, got)):
        problem = _differs(e, a)
        if problem:
            raise Untraceable(f"the derived body differs from eager{where}: output {i} {problem} "
                              "(the trace fixed a size- or value-dependent choice)")


def _edges(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], model: onnx.ModelProto,
           sizes: dict) -> tuple[Crash, ...]:
    """Each dynamic dim at 0 and at 1 (the others as traced), where eager and the model take that size (not below
    the user's Dim min: :meth:`Site.takes`): torch traces
    as if every dynamic size were 2 or more (its 0/1 specialisation), so a branch on an empty or single
    row (``if x.shape[0] == 0``) is dropped unseen. A body that differs there is refused; one that
    onnxruntime fails on is kept (an error at run time, not a wrong answer); the sizes onnxruntime dies
    at are returned."""
    runs = []
    for symbol in sizes:
        for n in _EDGE_SIZES:
            trial = {**sizes, symbol: n}
            if not site.takes(trial):
                continue
            expected, feed = _trial(spec, fn, site, roles, trial)
            if expected is not None:
                runs.append((symbol, trial, expected, feed))
    if not runs:
        return ()
    outcomes = RUNNER.run(model.SerializeToString(), [feed for *_, feed in runs])
    crashes = []
    for (symbol, trial, expected, _), (kind, value) in zip(runs, outcomes):
        if kind == "ok":
            _compare(expected, value, f" at dynamic sizes {trial}")
        elif kind == "unrun":
            raise Untraceable(f"the derived body could not be checked at dynamic sizes {trial}: no child process "
                              f"to run it in ({value})")
        elif kind == "crash":
            crashes += [Crash(p.name, axis, trial[symbol], value) for p, t in zip(spec.tensors, site.tensors)
                        if t is not None for axis, dim in enumerate(t.dims) if dim == symbol]
    return tuple(crashes)


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
