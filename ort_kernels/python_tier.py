"""Python kernel tier: run any registered op in ONNX Runtime through onnxruntime-extensions.

Each op's kernel is its own eager implementation (prototyping needs no extra code), at every dtype
the model gives its nodes. onnxruntime-extensions' PyOp has sharp edges, each guarded here
(measured on onnxruntime-extensions 0.15.2):

- PyOp declares one element type per input and output: one PyOp per (op, type signature), read off
  the node's value types in the model (inferred), else from the op's samples through its fake
  kernel with a shape environment (an output of value-dependent size, ``new_dynamic_size()``, too);
- its stock call hook returns outputs as Python lists (most of a call's cost on large outputs) and
  aborts on float16 outputs: the tier's own hook (``PyCustomOpDef.install_hooker``) hands each
  output over as one contiguous numpy array. Inputs arrive as fresh numpy arrays, used as torch
  tensors without a copy (``torch.from_numpy``);
- a float16 (or bfloat16) input aborts the process: the session's copy of the model casts such
  inputs to float32 before the node and the kernel casts them back (exact), so results equal eager
  float16 exactly. bfloat16 outputs (numpy has none) travel as float32, cast back after the node;
- an exception inside a kernel aborts the process: kernels catch everything, hand ORT an empty
  placeholder of the declared type, and every run of the session raises the recorded error as
  OpBridgeError (the run guard, ``_kernel_errors``); so does an output dtype the model does not declare;
- INTS/FLOATS attributes are unsupported and every declared attribute must be present: the node's
  attribute values (defaults written in, None for an omitted optional one; a given ``str?`` of ""
  stays "") and the indices of its omitted optional inputs travel as one JSON STRING attribute
  (``ATTRIBUTES``, parsed once per node's values);
- adding a PyOp to a domain already registered with session options crashes later sessions:
  declarations go in generations, each with private domains (``opbridge.python.<generation>.<domain>``);
  options that got an earlier generation than a model needs are refused, naming the fix;
- each registration into options keeps its domains and one factory per PyOp until the process ends:
  sessions opened without options share one options object (new ones only for a later generation);
- two registries may give one ONNX name two ops: a PyOp belongs to one registry and one op (its
  private name carries the registry's number), so a live session keeps running its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import json
import threading
import warnings
import weakref
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from bridge.core.basics.dtypes import ONNX_TO_TORCH, numpy_dtype
from bridge.core.basics.errors import OpBridgeError, UnsupportedInTier, own_sentence
from bridge.core.basics.graphs import FreshNames, model_graphs, value_names
from bridge.core.basics.installed import pip_line
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec, node_attributes
from ort_kernels.base import (
    FUNCTION_BODY,
    Paths,
    Plan,
    Prepared,
    Tier,
    import_hint,
    libraries,
    node_types,
    with_library,
)
from ort_kernels.build import io_types

_lock = threading.Lock()
# NOTE: private domains, not the op's: options reused across tiers may carry the native library,
# whose kernels take the op's own domain
PYTHON_DOMAIN = "opbridge.python."
# NOTE: PyOp inputs and attributes are all required: an omitted optional input gets an empty
# placeholder and is named in ATTRIBUTES with the attribute values, so the kernel passes None for it.
ATTRIBUTES = "opbridge_attributes"
_ABSENT_INPUT = "opbridge_absent_float"  # the empty placeholder an omitted optional input is fed
# the generations registered into a SessionOptions object (recorded in the options themselves)
_KNOWN_KEY = "opbridge.python_tier.generations"
_errors: list[str] = []  # kernel exceptions of the current run (ORT calls kernels synchronously)

T = onnx.TensorProto
# element type in the model -> element type carried across onnxruntime-extensions, for inputs and
# outputs; a type absent here is refused. NOTE: float16/bfloat16 inputs abort inside
# onnxruntime-extensions (and numpy has no bfloat16): they cross as float32, exactly.
_CARRIED_IN: dict[int, int] = {t: t for t in (T.FLOAT, T.DOUBLE, T.INT8, T.UINT8, T.INT16, T.INT32, T.INT64, T.BOOL)}
_CARRIED_IN |= {T.FLOAT16: T.FLOAT, T.BFLOAT16: T.FLOAT}
_CARRIED_OUT: dict[int, int] = {**_CARRIED_IN, T.FLOAT16: T.FLOAT16}


@dataclasses.dataclass(eq=False)
class _Declared:
    """One PyOp: an op at one type signature, in one generation's private domain."""

    spec: OpSpec  # NOTE: updated to the registry's current record at each prepare
    out_types: tuple[int, ...]
    generation: int
    domain: str  # private
    op_type: str  # private: the op's name and its signature
    restore: dict[int, torch.dtype]  # inputs that crossed as float32: their own dtype
    out_dtypes: tuple[torch.dtype, ...]  # what the op must return
    out_carry: tuple[torch.dtype | None, ...]  # bfloat16 outputs cross as float32
    placeholders: tuple[np.ndarray, ...]
    # ATTRIBUTES' text -> (attribute values, absent inputs): parsed once per node's values
    parsed: dict = dataclasses.field(default_factory=dict)

    def run(self, feed: list, raw: dict) -> tuple:
        """The kernel: the op's eager implementation on ``feed``; never raises (an exception escaping
        into onnxruntime-extensions aborts the process)."""
        spec = self.spec
        try:
            text = raw[ATTRIBUTES]
            if text not in self.parsed:
                self.parsed[text] = json.loads(text)
            attrs, absent = self.parsed[text]
            tensors: dict[str, torch.Tensor | None] = {}
            for i, (p, a) in enumerate(zip(spec.tensors, feed)):
                # NOTE: never read-only from onnxruntime-extensions (fresh arrays)
                t = torch.from_numpy(a if a.flags.writeable else a.copy())
                tensors[p.name] = None if i in absent else t.to(self.restore.get(i, t.dtype))
            args = [tensors[p.name] if p.is_tensor else attrs[p.name] for p in spec.params]
            if spec.checks is not None:  # NOTE: the op's checks, also for an eager kernel that has its own
                spec.checks.run(**{p.name: a for p, a in zip(spec.params, args)})
            positional, keywords = spec.call_args(args)
            with torch.no_grad():
                out = spec.overload(*positional, **keywords)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if len(outs) < len(self.out_types):
                raise OpBridgeError(f"{spec.qualname} returned fewer outputs than the model's node has. Got "
                                    f"{len(outs)}, the node has {len(self.out_types)}. Export the model again "
                                    "with opbridge.")
            result = []
            for i, (o, want, carry) in enumerate(zip(outs, self.out_dtypes, self.out_carry)):
                if o.dtype != want:
                    raise OpBridgeError(f"{spec.qualname} output {i} does not have the dtype the model declares "
                                        f"({want}). Got {o.dtype}. Export the model again with opbridge.")
                if carry is not None:
                    o = o.to(carry)
                result.append(o.detach().contiguous().numpy())
            return tuple(result)
        except BaseException as e:  # noqa: BLE001  an escaping exception aborts the process
            text = _describe(e).removeprefix(f"{type(e).__name__}: ")
            if isinstance(e, OpBridgeError) and text.startswith("opbridge: "):
                # NOTE: its own message (the op's checks) says what is wrong and what to do: passed on once
                _errors.append(text if spec.qualname in text else f"opbridge: {spec.qualname}: {text[10:]}")
            else:
                _errors.append(f"{spec.qualname}: the Python kernel raised {_describe(e)}")
            return self.placeholders


_by_id: dict[int, _Declared] = {}  # onnxruntime-extensions' op id -> the declaration it calls
_by_name: dict[tuple[str, str], _Declared] = {}  # (private domain, private op_type) -> declaration
# (registry, domain, op_type, input types, output types) -> declaration. NOTE: keyed by registry: two
# registries may give one ONNX name different ops, and a live session of one must keep running its own
_declared: dict[tuple, _Declared] = {}
# registry -> a number of its own (never reused in this process)
_registries: weakref.WeakKeyDictionary[Registry, int] = weakref.WeakKeyDictionary()
_numbers = itertools.count()
_generation = 0  # the generation new declarations go into
_generation_used = False  # whether any declaration went into it yet
_hooked = False
# NOTE: the options of every session opened without any, shared: each registration of onnxruntime-extensions
# into options keeps its op domains and one factory per declared PyOp until the process ends (~1.7 KB a
# session when every session got fresh options); new shared options only when a later generation is needed
_shared_options: list[ort.SessionOptions | None] = [None]
_samples: dict[int, tuple[OpSpec, dict, str | None]] = {}  # id(spec) -> (spec, {in types: out types}, failure)


def _invoke(k_id: int, feed: list, attributes: dict) -> tuple:
    """onnxruntime-extensions' call hook: (id, shape, array, shape, array, ...) per call. Arrays go
    to C++ as they are (it memcpys them into ORT's outputs); its stock hook made Python lists."""
    declared = _by_id.get(k_id)
    if declared is not None:
        outs = declared.run(feed, attributes)
    else:  # NOTE: another user's onnx_op in this process: its stock call, minus the lists
        from onnxruntime_extensions import Opdef

        op = Opdef._odlist[k_id]
        rv = op.body(*feed, **op.cast_attributes(attributes))
        outs = tuple(np.ascontiguousarray(r) for r in (rv if isinstance(rv, tuple) else (rv,)))
        outs = tuple(o.flatten().tolist() if o.dtype.kind in "OUS" else o for o in outs)
    res: list[Any] = [k_id]
    for o in outs:
        res += [np.shape(o) if isinstance(o, np.ndarray) else (len(o),), o]
    return tuple(res)


def _describe(e: BaseException) -> str:
    """``Type: message``, even when the message itself cannot be made into text."""
    try:
        return f"{type(e).__name__}: {e}"
    except BaseException:  # noqa: BLE001
        return f"{type(e).__name__} (its message could not be converted to text)"


def _type_name(t: int) -> str:
    return onnx.helper.tensor_dtype_to_string(t) if t else "an unknown type"


def _sample_types(spec: OpSpec) -> tuple[dict, str | None]:
    """{input types: output types} per dtype from the op's samples through its fake kernel (with a
    shape environment), and the first failure's text; cached per op record."""
    cached = _samples.get(id(spec))
    if cached is not None and cached[0] is spec:
        return cached[1], cached[2]
    found: dict[tuple, tuple] = {}
    failure: str | None = None
    for dtype in spec.dtypes if spec.sample_inputs is not None else ():
        try:
            inputs, outputs = io_types(spec, dtype)
        except Exception as e:  # noqa: BLE001  one op's fake kernel: refused alone, with its reason
            failure = failure or f"its fake kernel on its {dtype} samples raised {_describe(e)[:300]}"
            continue
        found.setdefault(_padded(spec, inputs), outputs)
    _samples[id(spec)] = (spec, found, failure)
    return found, failure


def _padded(spec, inputs) -> tuple[int, ...]:
    """Input types with omitted trailing optional inputs typed float32 (their empty placeholder)."""
    return tuple(inputs) + (T.FLOAT,) * (len(spec.tensors) - len(inputs))


def _signature(types: tuple[int, ...]) -> str:
    """Element types as part of a private op_type: torch's dtype names (``float32_int64``)."""
    return "_".join(str(ONNX_TO_TORCH[t]).removeprefix("torch.") for t in types)


def _declare(registry: Registry, spec: OpSpec, in_types: tuple[int, ...], out_types: tuple[int, ...]) -> _Declared:
    """The PyOp serving ``registry``'s ``spec`` at this signature, declared now if it is new."""
    global _generation_used, _hooked
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    number = _registries.setdefault(registry, next(_numbers))  # NOTE: the registry's own, part of its op names
    key = (number, spec.domain, spec.name, in_types, out_types)
    found = _declared.get(key)
    if found is not None:
        found.spec = spec
        return found
    if not _hooked:
        PyCustomOpDef.install_hooker(_invoke)
        _hooked = True
    carried_in = [_CARRIED_IN[t] for t in in_types]
    carried_out = [_CARRIED_OUT[t] for t in out_types]
    declared = _Declared(
        spec=spec, out_types=out_types, generation=_generation,
        domain=f"{PYTHON_DOMAIN}{_generation}.{spec.domain}",
        op_type=f"{spec.name}__r{number}__{_signature(in_types)}__{_signature(out_types)}",
        restore={i: ONNX_TO_TORCH[t] for i, (t, c) in enumerate(zip(in_types, carried_in)) if t != c},
        out_dtypes=tuple(ONNX_TO_TORCH[t] for t in out_types),
        out_carry=tuple(ONNX_TO_TORCH[c] if c != t else None for t, c in zip(out_types, carried_out)),
        placeholders=tuple(np.zeros((0,), numpy_dtype(ONNX_TO_TORCH[c])) for c in carried_out))
    opdef = onnx_op(op_type=f"{declared.domain}::{declared.op_type}", inputs=carried_in, outputs=carried_out,
                    attrs={ATTRIBUTES: PyCustomOpDef.dt_string})(declared.run)
    _by_id[opdef._id] = declared
    _by_name[(declared.domain, declared.op_type)] = declared
    _declared[key] = declared
    _generation_used = True
    return declared


def _predeclare(registry: Registry) -> None:
    """Declare every op at every signature its samples give, before a registration freezes the open
    generation: options reused by later models then know their ops."""
    for spec in registry.exportable():
        for inputs, outputs in _sample_types(spec)[0].items():
            if all(t in _CARRIED_IN for t in inputs) and all(t in _CARRIED_OUT for t in outputs):
                _declare(registry, spec, inputs, outputs)


def _node_types(node, spec, types: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The node's (input types, output types): the model's own, else (outputs) from the op's samples.
    Raises UnsupportedInTier naming the op and the true reason when neither types it."""
    ins = _padded(spec, [types.get(n, 0) if n else T.FLOAT for n in node.input])
    outs = tuple(types.get(n, 0) for n in node.output)
    qual = f"{node.domain}::{node.op_type}"
    if 0 in outs or 0 in ins:
        by_samples, failure = _sample_types(spec)
        if 0 not in ins and ins in by_samples:
            outs = tuple(o if o else s for o, s in zip(outs, by_samples[ins]))
        else:
            kind, names, typed = ("input", node.input, ins) if 0 in ins else ("output", node.output, outs)
            why = f"the model gives no element type for {kind} '{names[typed.index(0)]}'"
            why += (f", and {failure}" if failure else
                    ", and its samples do not cover these input types" if spec.sample_inputs is not None else
                    ", and the op has no sample inputs")
            raise UnsupportedInTier(f"tier 'python' cannot type node {node.name!r} ({qual}): {why}. Got input types "
                                    f"{[_type_name(t) for t in ins]}. Export the model with opbridge (it writes "
                                    "value types), or give the op sample_inputs= covering these types.")
    for name, t in [*zip(node.input, ins), *zip(node.output, outs)]:
        if t not in _CARRIED_OUT:
            raise UnsupportedInTier(
                f"tier 'python' runs tensors of torch's dtypes only (onnxruntime-extensions' PyOp has no way to "
                f"hand others to torch). Got {_type_name(t)} at {qual} '{name}'. Use tier='function' or 'native'.")
    return ins, outs


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
    shapeless = onnx.ModelProto()
    shapeless.CopyFrom(model)
    values = [*shapeless.graph.input, *shapeless.graph.output, *shapeless.graph.value_info]
    if any(not d.HasField("dim_value") for v in values for d in v.type.tensor_type.shape.dim):
        for v in values:
            if v.type.HasField("tensor_type"):
                v.type.tensor_type.ClearField("shape")
        try:
            return onnx.shape_inference.infer_shapes(shapeless, strict_mode=False)
        except Exception as e:  # noqa: BLE001
            error = e
    own = own_sentence(error)
    if own is not None:  # NOTE: an op's check or its fake refusing the node, named by the op itself
        raise OpBridgeError(f"{own.rstrip('. ')}. Fix the node's inputs or attributes (export the model again "
                            "with opbridge).") from None
    raise OpBridgeError(f"tier 'python' cannot type the model's custom nodes. Got {type(error).__name__}: "
                        f"{str(error)[:400].rstrip('.')}. Fix the node's inputs or attributes (export the model again "
                        "with opbridge).") from None


def _rewrite_attributes(node: onnx.NodeProto, declared: _Declared) -> None:
    """The node's attribute values as the op takes them (``node_attributes``: defaults filled in, None
    for an omitted optional one) and the indices of its omitted optional inputs (fed an empty
    placeholder) as one JSON attribute, ``ATTRIBUTES``."""
    spec = declared.spec
    names = list(node.input) + [""] * (len(spec.tensors) - len(node.input))
    attributes = json.dumps([node_attributes(spec, node), [i for i, n in enumerate(names) if not n]])
    node.input[:] = [n or _ABSENT_INPUT for n in names]
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute(ATTRIBUTES, attributes))


def _bridge(model: onnx.ModelProto, fresh: FreshNames) -> None:
    """Casts around each served node for the types that cross as float32 (float16/bfloat16 inputs,
    bfloat16 outputs): exact both ways; the kernel casts inputs back before running the op."""
    for graph in model_graphs(model):
        if not any(n.domain.startswith(PYTHON_DOMAIN) for n in graph.node):
            continue
        nodes = []
        for node in graph.node:
            declared = _by_name.get((node.domain, node.op_type))
            if declared is None or not (declared.restore or any(c is not None for c in declared.out_carry)):
                nodes.append(node)
                continue
            for i in declared.restore:
                if i < len(node.input) and node.input[i]:
                    name = fresh(f"{node.input[i]}_as_float")
                    nodes.append(onnx.helper.make_node("Cast", [node.input[i]], [name], to=T.FLOAT,
                                                       name=fresh("opbridge_cast_in")))
                    node.input[i] = name
            after = []
            for i, carry in enumerate(declared.out_carry):
                if carry is not None and i < len(node.output) and node.output[i]:
                    name = fresh(f"{node.output[i]}_as_float")
                    after.append(onnx.helper.make_node("Cast", [name], [node.output[i]], to=declared.out_types[i],
                                                       name=fresh("opbridge_cast_out")))
                    node.output[i] = name
            nodes += [node, *after]
        del graph.node[:]
        graph.node.extend(nodes)


def _kernel_error() -> str:
    first = _errors[0]
    if first.startswith("opbridge: "):  # NOTE: the kernel's own OpBridgeError, as it is
        return first
    return first.rstrip(".") + ". Fix the inputs (the op's own eager checks apply in this tier)."


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


def _known_generations(options: ort.SessionOptions | None, path: str) -> int | None:
    """How many generations ``options`` got when the library was registered into them (None: not yet)."""
    if options is None or path not in libraries(options):
        return None
    try:
        return int(options.get_session_config_entry(_KNOWN_KEY))
    except RuntimeError:  # NOTE: registered by someone else: its generations are unknown
        return 0


def _route(model: onnx.ModelProto, routes: list, helpers: set) -> None:
    """Point each routed node at its private PyOp; the Python kernels, not function bodies, run the
    custom nodes (helper functions stay)."""
    versions = {o.domain: o.version for o in model.opset_import}
    for node, declared in routes:
        _rewrite_attributes(node, declared)
        version = versions.get(node.domain, 1)
        node.domain, node.op_type = declared.domain, declared.op_type
        if node.domain not in versions:
            versions[node.domain] = version
            model.opset_import.append(onnx.helper.make_opsetid(node.domain, version))
    if any(_ABSENT_INPUT in node.input for node, _ in routes):
        model.graph.initializer.append(onnx.helper.make_tensor(_ABSENT_INPUT, T.FLOAT, [0], []))
    if any(d.restore or any(c is not None for c in d.out_carry) for _, d in routes):
        _bridge(model, FreshNames(value_names(model.graph)))
    keep = [f for f in model.functions if (f.domain, f.name) in helpers]
    del model.functions[:]
    model.functions.extend(keep)


def _register(options: ort.SessionOptions | None, path: str) -> ort.SessionOptions:
    """``options`` (or new ones) with onnxruntime-extensions registered: every PyOp declared so far."""
    global _generation, _generation_used
    options = with_library(options, path)
    if _generation_used:  # NOTE: registered now: later declarations open the next generation
        _generation, _generation_used = _generation + 1, False
    options.add_session_config_entry(_KNOWN_KEY, str(_generation))
    return options


def _no_extensions() -> str:
    """The message for a machine without onnxruntime-extensions, with the line that installs it here."""
    return ("tier 'python' needs onnxruntime-extensions. Got no such package. "
            f"Install it with `{pip_line('python-tier')}`.")


def _served(plan: Plan, helpers: set) -> list:
    """The planned nodes the tier serves (all but calls of helper functions); an unregistered op is refused. A
    helper outside the exporters' own ``pkg.*`` domains is most likely an op whose module was not imported: it
    runs from the file's body (``kernels`` says so) with a warning, for no eager implementation runs it."""
    bodies = [p for p in plan.graph if p.key in helpers and not p.key[0].startswith("pkg.")]
    for p in bodies:
        p.served = FUNCTION_BODY
    if bodies:
        ops = sorted({p.op for p in bodies})
        warnings.warn(f"opbridge: tier 'python' runs {', '.join(ops)} from the file's function body, not an eager "
                      f"implementation: no registered op has that name. Got ops {ops}. "
                      f"{import_hint(plan.registry, ops)}Then its own implementation runs.", stacklevel=2)
    served = [p for p in plan.graph if p.key not in helpers]
    missing = sorted({p.op for p in served if p.spec is None})
    if missing:
        raise UnsupportedInTier(f"tier 'python' cannot run {', '.join(missing)}: it is not a registered op. "
                                f"Got ops {missing}. Register it (bridge.register / @bridge.op) before the "
                                "session, or use tier='function'.")
    return served


class PythonTier(Tier):
    name = "python"
    summary = "the op's own eager implementation via onnxruntime-extensions (prototyping; every torch dtype)"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None, *, thorough: bool = True) -> str | None:
        if dtype is not None and dtype not in ONNX_TO_TORCH.values():
            return f"{dtype} has no ONNX element type here"
        return None

    def missing(self, registry: Registry) -> str | None:
        return _no_extensions() if importlib.util.find_spec("onnxruntime_extensions") is None else None

    def prepare(self, plan: Plan, options: ort.SessionOptions | None, library: Paths | None = None) -> Prepared:
        """Route the plan's custom nodes to their eager implementations."""
        try:
            from onnxruntime_extensions import get_library_path
        except ImportError:
            raise UnsupportedInTier(_no_extensions()) from None
        helpers = plan.helpers()
        served = _served(plan, helpers)
        # element type by value name, over the graph and, where a node needs them, its subgraphs (0: not known)
        types = {name: t.tensor_type.elem_type
                 for name, t in node_types(_infer_types(plan.model), [p.node for p in served]).items()}
        path = get_library_path()
        with _lock:
            shared = options is None
            options = _shared_options[0] if shared else options
            known = _known_generations(options, path)
            if known is None:  # NOTE: these options are about to freeze the open generation: fill it first
                _predeclare(plan.registry)
            routes = [(p.node, _declare(plan.registry, p.spec, *_node_types(p.node, p.spec, types))) for p in served
                      if p.spec is not None]
            late = sorted({f"{n.domain}::{n.op_type}" for n, d in routes
                           if known is not None and d.generation >= known})
            if late and shared:  # NOTE: the shared options predate these signatures: new ones take over
                options, known, late = None, None, []
                _predeclare(plan.registry)
            if late:
                raise UnsupportedInTier(
                    f"tier 'python' cannot run {', '.join(late)} with these SessionOptions: they got the python "
                    "tier's kernels before these op signatures were declared (onnxruntime-extensions registers "
                    f"its Python ops into options once). Got ops {late}. Pass new SessionOptions (or none).")
            _route(plan.model, routes, helpers)
            if known is None:
                options = _register(options, path)
                if shared:
                    _shared_options[0] = options
        return Prepared(options, changed=True, guard=_kernel_errors, sees_feed=True)
