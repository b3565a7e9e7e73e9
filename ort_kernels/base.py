"""What a kernel tier is: the protocol every tier implements, and what tiers share.

A tier decides which ops (and dtypes) it serves, with the reason when it does not, and prepares
a model and ``SessionOptions`` so that onnxruntime finds a kernel for every custom node.
Adding a tier is one module with a :class:`Tier` subclass plus one entry in ``ort_kernels.tiers``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any, ClassVar

import onnx
import onnxruntime as ort
import torch

from bridge.core.basics.domains import is_custom
from bridge.core.basics.errors import OpBridgeError, own_sentence
from bridge.core.basics.graphs import (
    ProtoMemo,
    calling_functions,
    model_value_types,
    unproduced_outputs,
    value_types,
    walk,
)
from bridge.core.opdef import typed_as_written
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec, explicit_attributes, node_attributes

# One custom-op library path, or several (``bridge.session(native_library=...)``).
Paths = str | os.PathLike | Sequence[str | os.PathLike]

# An explainer: (the exception a run raised, the feed as arrays by input name (None where it is not
# known: an IOBinding's run), the model onnxruntime runs: its bytes or path) -> the OpBridgeError
# message for it, or None when it is not about what this explainer knows.
Explain = Callable[[BaseException, "dict | None", "bytes | str"], "str | None"]
# A refusal: (each input's shape by input name, where the feed says; the feed) -> the OpBridgeError
# message of a feed the tier must not hand onnxruntime (it would die on it), or None. Runs before every run.
Refuse = Callable[[dict, dict], "str | None"]


@dataclasses.dataclass
class Prepared:
    """A tier's answer: what to open the session with."""

    options: ort.SessionOptions | None
    changed: bool  # whether the model proto was changed (else the file goes to onnxruntime by path)
    explain: tuple[Explain, ...] = ()  # the explainers of its run errors
    # entered by every run (the python tier's: one run at a time, its kernels' errors raised)
    guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # whether a run must know which inputs are bound before onnxruntime runs (the python tier's kernels abort the
    # process on an input onnxruntime passes them unset)
    sees_feed: bool = False


# NOTE: what ``Planned.served`` (``session.kernels``) says of a custom op that runs its model-local function body.
FUNCTION_BODY = "function body"


@dataclasses.dataclass(eq=False)
class Planned:
    """One custom node of a session's model: its op (None: not registered), the function body holding it
    (None: the graph or one of its If/Loop bodies) and, once a tier prepared it, what serves it (a library's
    path, or FUNCTION_BODY; "" where the tier names none)."""

    node: onnx.NodeProto
    spec: OpSpec | None
    function: onnx.FunctionProto | None = None
    served: str = ""

    def __post_init__(self) -> None:
        # NOTE: kept as planned: a tier may move the node to a private domain, or drop the body holding it
        self.key: tuple[str, str] = (self.node.domain, self.node.op_type)

    @property
    def op(self) -> str:
        return f"{self.key[0]}::{self.key[1]}"

    def attributes(self) -> dict:
        """The node's attribute values as the op takes them (``bridge.core.spec.node_attributes``)."""
        assert self.spec is not None
        return node_attributes(self.spec, self.node)


# NOTE: digests of model-local functions whose names were found to be text: sessions opened again
# on the same file (workers, threads, reloads) skip re-reading every name of their bodies, the
# costliest part of this check (~1.5 us per node through protobuf's Python API).
_TEXT_FUNCTIONS = ProtoMemo()


def readable(model: onnx.ModelProto, what: str, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """``model`` when the names of ``nodes`` (its graph's, subgraphs included) and of its functions' nodes
    are text; protobuf hands invalid UTF-8 back as bytes (a damaged file)."""
    digests = [ProtoMemo.key(f) for f in model.functions]
    unseen = [(d, f) for d, f in zip(digests, model.functions) if _TEXT_FUNCTIONS.get(d) is None]
    everything = [*nodes, *(n for _, f in unseen for n in f.node)]
    try:
        # NOTE: str.join refuses bytes, in C: one pass over every name, not one isinstance per name
        "".join(chain.from_iterable((n.domain, n.op_type, *n.input, *n.output) for n in everything))
    except TypeError:
        node = next(n for n in everything if not all(isinstance(v, str) for v in (n.domain, n.op_type, *n.input,
                                                                                 *n.output)))
        raise OpBridgeError(f"{what} is damaged: node names are not valid text. Got {node.op_type!r} in domain "
                            f"{node.domain!r}. Export the model again.") from None
    for digest, _ in unseen:
        _TEXT_FUNCTIONS.put(digest, True)
    return model


class Plan:
    """A session's plan: one walk of ``model`` (``bridge.core.basics.graphs.walk``) gives each custom node
    (the graph's, its If/Loop bodies', its functions') with its op, looked up in ``registry`` once.
    The node checks, every tier's ``prepare`` (which records what serves each node) and the session's
    report (``kernels``, ``unserved``) read it. A tier whose resolver changed the model plans it again
    (:meth:`refresh`).

    Example:
        >>> from onnx import helper
        >>> body = helper.make_function("d", "f", ["a"], ["b"], [helper.make_node("g", ["a"], ["b"], domain="d")],
        ...                             [helper.make_opsetid("d", 1)])
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
        ...                        helper.make_node("f", ["y"], ["z"], domain="d")], "g", [], [])
        >>> plan = Plan(helper.make_model(g, functions=[body]), Registry())
        >>> [(p.op, p.spec, p.function is not None) for p in plan.nodes], plan.ops(functions=False)
        ([('d::f', None, False), ('d::g', None, True)], [('d', 'f')])
    """

    def __init__(self, model: onnx.ModelProto, registry: Registry, what: str = "the model"):
        self.model, self.registry = model, registry
        self.refresh(what)

    def refresh(self, what: str = "the model") -> None:
        """The walk (again after a tier's resolver gave the model bodies: new nodes, a new proto); the
        names of every node it meets are checked to be text first (:func:`readable`)."""
        graph = list(walk(self.model.graph.node))
        readable(self.model, what, graph)
        in_functions = [(n, f) for f in calling_functions(self.model) for n in walk(f.node)]
        found = [(n, f) for n, f in [(n, None) for n in graph] + in_functions if is_custom(n.domain)]
        # NOTE: before the lookup: a Function's record takes the attribute types its nodes were written with
        typed_as_written(self.registry, (n for n, _ in found))
        self.nodes = [Planned(n, self.registry.find(n.domain, n.op_type), f) for n, f in found]

    @property
    def graph(self) -> list[Planned]:
        """The custom nodes of the graph and its If/Loop bodies, in the order they run."""
        return [p for p in self.nodes if p.function is None]

    def ops(self, *, functions: bool = True) -> list[tuple[str, str]]:
        """Distinct (domain, op_type) of the custom nodes, in order of first appearance."""
        return list(dict.fromkeys(p.key for p in (self.nodes if functions else self.graph)))

    def helpers(self) -> set[tuple[str, str]]:
        """(domain, name) of model-local functions that are not registered ops: helpers an exporter or tool
        put there (any runtime runs them from their bodies), not custom nodes for a tier."""
        return {(f.domain, f.name) for f in self.model.functions if self.registry.find(f.domain, f.name) is None}

    def check(self) -> None:
        """The graph's custom nodes against their registered ops: domain version, attributes, input count."""
        imported = {o.domain: o.version for o in self.model.opset_import}
        for p in self.graph:
            if p.spec is None:
                continue  # the tier reports ops it cannot run
            where, version = f"node {p.node.name or p.node.op_type!r} ({p.op})", imported.get(p.node.domain)
            if version is None:
                raise OpBridgeError(
                    f"{where}: the model imports no opset for its domain {p.node.domain!r}. Got opset_import "
                    f"{imported}. Export the model again, or add the import {p.node.domain}={p.spec.version}.")
            if version != p.spec.version:
                raise OpBridgeError(
                    f"{where} is imported at domain version {version}, but the registered op is version "
                    f"{p.spec.version}. Got opset_import {p.node.domain}={version}. Export the model again "
                    f"with this registry, or register the op with version={version}.")
            _check_attributes(where, p.node, p.spec)
            required = sum(1 for t in p.spec.tensors if not t.optional)
            if not required <= len(p.node.input) <= len(p.spec.tensors):
                raise OpBridgeError(f"{where} has {len(p.node.input)} inputs; the op takes {required} to "
                                    f"{len(p.spec.tensors)}. Got inputs {list(p.node.input)}. Export the model again.")
            empty = [t.name for t, name in zip(p.spec.tensors, p.node.input) if not name and not t.optional]
            if empty:
                raise OpBridgeError(f"{where} leaves required input(s) {empty} empty. Got inputs "
                                    f"{list(p.node.input)}. Only optional inputs may be omitted: export the model "
                                    "again.")

    def check_bodies(self) -> None:
        """The model's functions compute each of their outputs (a body a tool emptied or cut is named, not handed to
        onnxruntime)."""
        for f in self.model.functions:
            missing = unproduced_outputs(f)
            if missing:
                raise OpBridgeError(
                    f"the file's body of {f.domain}::{f.name} computes no value for output(s) {missing} (a tool "
                    f"emptied or cut it). Got a body of {len(f.node)} node(s). Give it its op's body with `opbridge "
                    "attach FILE -o OUT`, or export the model again.")

    def fill(self) -> bool:
        """Give every node of a registered op each attribute it omits that the op gives a default
        (``bridge.core.spec.explicit_attributes``): files other tools wrote run with the op's defaults
        in every tier. Edits the model in place; returns whether a node changed."""
        return any([explicit_attributes(p.spec, p.node) for p in self.nodes if p.spec is not None])

    def readers(self) -> dict[str, tuple[str, str]]:
        """Graph input -> (qualname, parameter) of the first custom node that reads it directly.
        NOTE: nodes in If/Loop/Scan bodies read the model's inputs too."""
        graph_inputs = {i.name for i in self.model.graph.input}
        readers: dict[str, tuple[str, str]] = {}
        for p in self.graph:
            if p.spec is not None:
                for name, param in zip(p.node.input, p.spec.tensors):
                    if name in graph_inputs:
                        readers.setdefault(name, (p.spec.qualname, param.name))
        return readers

    def kernels(self) -> dict[str, str]:
        """By domain::op_type, what the tier said serves the op: a library (its path) or FUNCTION_BODY."""
        return {p.op: p.served for p in self.nodes if p.served}

    def unserved(self, libraries: Sequence[str]) -> dict[str, str]:
        """Each custom op that none of the user's ``libraries`` serves -> why, and what runs it instead
        ({} when no library was given)."""
        if not libraries:
            return {}
        names = ", ".join(os.path.basename(lib) for lib in libraries)
        return {op: f"is not served by {names} (onnxruntime finds no kernel for it there): "
                    f"{'its function body' if where == FUNCTION_BODY else os.path.basename(where)} runs it"
                for op, where in self.kernels().items() if where not in libraries}


def import_hint(registry: Registry, ops: Sequence[str]) -> str:
    """The fix to give first where some of ``ops`` (``"domain::name"``) are registered by no module imported here
    (most likely the one that registers them was not imported), with a space after it; "" where all are.

    Example:
        >>> import_hint(Registry(), ["mine::op"])
        'Import the module that registers mine::op before the session (on the command line: --ops MODULE). '
    """
    unknown = [op for op in ops if registry.find(*op.split("::", 1)) is None]
    return (f"Import the module that registers {', '.join(unknown)} before the session (on the command line: "
            "--ops MODULE). " if unknown else "")


def node_types(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> dict[str, onnx.TypeProto]:
    """The value types ``model`` records for ``nodes`` (of its graph or its If/Loop bodies): the graph's,
    and those of its subgraphs (a walk over them) only where a node reads or writes a value of theirs."""
    types = value_types(model.graph)
    if any(name not in types for n in nodes for name in (*n.input, *n.output) if name):
        types = model_value_types(model)
    return types


def _check_attributes(where: str, node: onnx.NodeProto, spec: OpSpec) -> None:
    """A required attribute the node lacks, one the op does not declare (eager refuses an unknown argument), or
    one of another type than the op declares, named."""
    attrs = {a.name: a for a in node.attribute}
    unknown = sorted(set(attrs) - {param.name for param in spec.attributes})
    if unknown:
        raise OpBridgeError(f"{where} has attribute(s) {unknown}, which {spec.qualname} does not declare (it declares "
                            f"{[param.name for param in spec.attributes]}). Got attributes {sorted(attrs)}. Remove "
                            "them from the node, or export the model again with opbridge.")
    for param in spec.attributes:
        # NOTE: ignore: onnx's stub lacks the AttrType enum's .name, and every attribute has an attr_type
        declared = param.attr_type.name  # type: ignore[union-attr]
        if param.name not in attrs:
            if not param.has_default:
                raise OpBridgeError(f"{where} lacks required attribute '{param.name}' ({declared}). "
                                    f"Got attributes {sorted(attrs)}. Export the model again with opbridge.")
        elif attrs[param.name].type != param.attr_type:
            got = onnx.AttributeProto.AttributeType.Name(attrs[param.name].type)
            raise OpBridgeError(f"{where} has attribute '{param.name}' of type {got}, the op declares "
                                f"{declared}. Got a type mismatch. Export the model again with opbridge.")


class Session(ort.InferenceSession):
    """The one session class of opbridge (every tier's, and the tiers' own probes): an
    ``onnxruntime.InferenceSession`` whose run methods enter the tier's guard and turn an error an
    explainer recognises into OpBridgeError.
    NOTE: explainers look only after a failure: a run that works pays nothing."""

    def __init__(self, content, options, *, providers=("CPUExecutionProvider",), explain: Sequence[Explain] = (),
                 guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 refuse: Sequence[Refuse] = (), sees_feed: bool = False):
        self._explainers = tuple(explain)
        self._refusals = tuple(refuse)
        self._sees_feed = sees_feed
        self.kernels: dict[str, str] = {}  # NOTE: Plan.kernels: what runs each custom op (sessions)
        self.unserved: dict[str, str] = {}  # NOTE: Plan.unserved: why the user's libraries do not serve an op
        self._guard = guard
        self._content = content  # NOTE: the bytes onnxruntime keeps too (no copy), for explainers
        super().__init__(content, options, providers=list(providers))

    def run(self, output_names, input_feed, run_options=None):
        # NOTE: before onnxruntime: a None it passes on to a Python kernel as an empty OrtValue aborts the process
        empty = [n for n, v in input_feed.items() if v is None] if isinstance(input_feed, Mapping) else []
        if empty:
            raise OpBridgeError(f"model input(s) {empty} must be numpy arrays. Got None. Pass an array for each "
                                "(an optional input the model may omit is left out of the feed).")
        try:
            return self._checked(lambda: super(Session, self).run(output_names, input_feed, quiet(run_options)),
                                 input_feed)
        except OpBridgeError:
            raise
        except Exception as e:
            misuse = self._misuse(output_names, input_feed)
            if misuse is None:
                raise
            raise OpBridgeError(misuse) from e

    def _misuse(self, output_names, feed) -> str | None:
        """What is wrong with a failed ``run``'s arguments themselves (the feed no dict, output names unknown or
        no list of names), as the fix; None where they are as onnxruntime takes them."""
        outputs = [o.name for o in self.get_outputs()]
        if not isinstance(feed, Mapping):
            names = ", ".join(f"{i.name!r}: ..." for i in self.get_inputs())
            return f"session.run takes the inputs as a dict. Got {type(feed).__name__}. Pass {{{names}}}."
        if output_names is not None and (isinstance(output_names, str) or not isinstance(output_names, Sequence)
                                         or not all(isinstance(n, str) for n in output_names)):
            return (f"session.run takes output_names as a list of names (None: every output). Got "
                    f"{output_names!r:.80}. Pass None or a list of {outputs}.")
        unknown = [n for n in output_names or () if n not in outputs]
        if unknown:
            return (f"session.run asks for outputs the model does not have. Got {unknown}. Pass None or names of "
                    f"{outputs}.")
        return None

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        others = {n: type(v).__name__ for n, v in input_dict_ort_values.items() if not isinstance(v, ort.OrtValue)} \
            if isinstance(input_dict_ort_values, Mapping) else {}
        if others:
            raise OpBridgeError(f"run_with_ort_values takes onnxruntime.OrtValue inputs. Got {others}. Wrap each "
                                "array with onnxruntime.OrtValue.ortvalue_from_numpy(array), or call run() with "
                                "arrays.")
        return self._checked(lambda: super(Session, self).run_with_ort_values(
            output_names, input_dict_ort_values, quiet(run_options)), input_dict_ort_values)

    def io_binding(self) -> Binding:
        return Binding(self)

    def run_with_iobinding(self, iobinding, run_options=None):
        bound = getattr(iobinding, "bound", None)  # NOTE: None: an IOBinding made without io_binding()
        missing = [i.name for i in self.get_inputs() if bound is not None and i.name not in bound]
        if missing:  # NOTE: before onnxruntime: a Python kernel reading an unbound input aborted the process
            raise OpBridgeError(f"model input(s) {missing} are not bound for run_with_iobinding. Got bound inputs "
                                f"{sorted(bound or ())}. Bind each with iobinding.bind_cpu_input(name, array) (or "
                                "bind_ortvalue_input) before the run.")
        feed = bound if bound is not None and all(v is not None for v in bound.values()) else None
        if bound is None and self._sees_feed:  # NOTE: onnxruntime cannot say which inputs such a binding holds
            raise OpBridgeError("this session checks that each run binds every input before onnxruntime runs it (its "
                                "kernels end the process on an unbound one). Got an IOBinding made with "
                                "onnxruntime.IOBinding(session). Make the binding with session.io_binding().")
        return self._checked(lambda: super(Session, self).run_with_iobinding(iobinding, quiet(run_options)), feed)

    def run_with_ortvaluevector(self, run_options, feed_names, feeds, fetch_names, fetches, fetch_devices):
        return self._checked(lambda: super(Session, self).run_with_ortvaluevector(
            quiet(run_options), feed_names, feeds, fetch_names, fetches, fetch_devices), dict(zip(feed_names, feeds)))

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None):
        """Like onnxruntime's: ``callback(results, user_data, error_text)`` is called from another
        thread; a failed run passes ``[]`` and the same OpBridgeError text ``run`` raises.
        NOTE: the run itself is ``run`` in a worker thread, so the tier's guard holds for it too."""
        # NOTE: bad input names raise here, as onnxruntime's does, explained as ``run`` explains them
        self._checked(lambda: self._validate_input(list(input_feed)), input_feed)

        def work():
            try:
                results = self.run(output_names, input_feed, run_options)
            except Exception as e:  # noqa: BLE001  handed to the callback, as onnxruntime does
                callback([], user_data, str(e))
                return
            callback(results, user_data, "")

        threading.Thread(target=work, name="opbridge-run-async", daemon=True).start()

    def _checked(self, call: Callable, feed: dict | None):
        if self._refusals and feed is not None:
            shapes = _shapes(feed)
            message = next((m for m in (refuse(shapes, feed) for refuse in self._refusals) if m), None)
            if message is not None:
                raise OpBridgeError(message)
        with self._guard():
            try:
                return call()
            except OpBridgeError:
                raise
            except Exception as e:
                arrays = None if feed is None else _arrays(feed)
                messages = (explain(e, arrays, self._content) for explain in self._explainers)
                message = next((m for m in messages if m), None)
                if message is None:
                    raise
                raise OpBridgeError(message) from e


class Binding(ort.IOBinding):
    """onnxruntime's IOBinding (what ``Session.io_binding()`` returns) recording each input's bound value (None
    for a device buffer), so a run names an unbound input and explains a refused one as ``run`` does."""

    def __init__(self, session: Session):
        super().__init__(session)
        self.bound: dict[str, Any] = {}

    def bind_cpu_input(self, name, arr_on_cpu):
        super().bind_cpu_input(name, arr_on_cpu)
        self.bound[name] = arr_on_cpu

    def bind_input(self, name, *args, **kwargs):
        super().bind_input(name, *args, **kwargs)
        self.bound[name] = None

    def bind_ortvalue_input(self, name, ortvalue):
        super().bind_ortvalue_input(name, ortvalue)
        self.bound[name] = ortvalue

    def clear_binding_inputs(self):
        super().clear_binding_inputs()
        self.bound.clear()


def quiet(run_options: ort.RunOptions | None) -> ort.RunOptions:
    """The run options of a session's run: the caller's when given (as they are), else options that keep
    onnxruntime from logging a failed run's error line to stderr before the exception carrying the same
    text (which the session explains, or raises as onnxruntime's).

    >>> quiet(None).log_severity_level, quiet(ort.RunOptions()).log_severity_level
    (4, -1)
    """
    if run_options is not None:
        return run_options
    options = ort.RunOptions()
    options.log_severity_level = 4  # NOTE: fatal only: a run's errors reach the caller as exceptions
    return options


def _shapes(feed: dict) -> dict[str, tuple]:
    """Each fed value's shape where it has one (arrays, OrtValues)."""
    out = {}
    for name, value in feed.items():
        shape = value.shape() if isinstance(value, ort.OrtValue) else getattr(value, "shape", None)
        if shape is not None:
            out[name] = tuple(shape)
    return out


def _arrays(feed: dict) -> dict:
    """The feed, as numpy arrays where it can be read (OrtValues on the CPU), for explainers."""
    out = {}
    for name, value in feed.items():
        if isinstance(value, ort.OrtValue):
            with contextlib.suppress(Exception):  # NOTE: one that cannot be read (on a device) is left as it is
                value = value.numpy()
        out[name] = value
    return out


class Tier(abc.ABC):
    """One way of giving onnxruntime a kernel for each custom node."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `opbridge doctor`, `ops` and the docs

    @abc.abstractmethod
    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None, *, thorough: bool = True) -> str | None:
        """None when the tier runs ``spec`` (at ``dtype``, or at all), else the reason it does not;
        ``thorough=False`` answers without costly work (deriving a body), as ``opbridge ops`` lists."""

    @abc.abstractmethod
    def prepare(self, plan: Plan, options: ort.SessionOptions | None, library: Paths | None = None) -> Prepared:
        """Edit ``plan.model`` (a private copy) and options so every custom node has a kernel, recording in
        the plan what serves each (``Planned.served``); raise UnsupportedInTier naming the ops it cannot
        run. ``library``: custom-op libraries to load (the native tier's; sessions refuse it for other tiers)."""

    def missing(self, registry: Registry) -> str | None:
        """What this machine lacks to run the tier at all (a package, a compiler), as an error
        message naming the fix; None when nothing is missing. Checked before an export starts."""
        return None

    def report(self, registry: Registry) -> list[str]:
        """Lines ``opbridge doctor`` prints about this tier (each op by its own name, as ``opbridge ops``
        lists it: a mutating op, not its functional twin)."""
        served = [s.qualname for s in registry if self.why_not(registry.functional(s)) is None]
        return [f"serves {len(served)} ops: {', '.join(served) or 'none'}"]


# NOTE: the custom-op libraries registered into a SessionOptions are recorded in the options
# themselves, one config entry each ("opbridge.custom_ops_library.<n>": path, never overwritten:
# onnxruntime warns on that), so nothing outside the options keeps them or their ids alive.
_LIBRARY_KEY = "opbridge.custom_ops_library."


def libraries(options: ort.SessionOptions | None) -> list[str]:
    """The custom-op libraries ``with_library`` registered into ``options``, in order.

    >>> libraries(ort.SessionOptions()), libraries(None)
    ([], [])
    """
    found: list[str] = []
    while options is not None:
        try:
            found.append(options.get_session_config_entry(f"{_LIBRARY_KEY}{len(found)}"))
        except RuntimeError:  # NOTE: onnxruntime's answer for a key the options lack
            break
    return found


def with_library(options: ort.SessionOptions | None, path: str) -> ort.SessionOptions:
    """``options`` (or new options) with the custom-op library at ``path`` registered once.

    A library already registered into the options (recorded in them) is not registered again, so
    options can be reused for many sessions; nothing is kept per call.
    """
    options = ort.SessionOptions() if options is None else options
    registered = libraries(options)
    if path not in registered:
        options.register_custom_ops_library(path)
        options.add_session_config_entry(f"{_LIBRARY_KEY}{len(registered)}", path)
    return options


def load_error(path: str, error: BaseException, fix: str) -> OpBridgeError:
    """The error for onnxruntime refusing to load the custom-op library at ``path``: where the library
    itself refused to register and said why (an ``opbridge: ...`` sentence, e.g. a bad $OPBRIDGE_ISA),
    that sentence as it is (the library is fine); else onnxruntime's words and ``fix`` (what to do).

    >>> str(load_error("lib.so", RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : opbridge: X is "
    ...                "wrong. Got 'y'. Set it right."), "Rebuild it."))
    "opbridge: X is wrong. Got 'y'. Set it right."
    >>> str(load_error("lib.so", RuntimeError("not an ELF file"), "Rebuild it."))
    "opbridge: onnxruntime could not load the native library 'lib.so'. Got RuntimeError: not an ELF file. Rebuild it."
    """
    own = own_sentence(error)
    if own is not None:  # NOTE: the library's own refusal names its cause and its fix
        return OpBridgeError(own)
    text = " ".join(str(error).split())
    return OpBridgeError(f"onnxruntime could not load the native library {path!r}. Got {type(error).__name__}: "
                         f"{text[:400].rstrip('.')}. {fix}")


def private_domains(plan: Plan, prefix: str) -> bool:
    """Move every custom domain of the plan's model (its custom nodes, model-local functions, opset
    imports) to ``prefix + domain``; whether there was any.

    NOTE: a kernel of a custom-op library registered into the session options wins over a
    model-local function of the same (domain, name): a private domain keeps the body the one that runs.

    >>> from onnx import helper
    >>> g = helper.make_graph([helper.make_node("f", ["x"], ["y"], domain="d")], "g", [], [])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("d", 1)])
    >>> private_domains(Plan(m, Registry()), "p."), m.graph.node[0].domain, m.opset_import[0].domain
    (True, 'p.d', 'p.d')
    """
    model = plan.model
    nodes = [p.node for p in plan.nodes]
    # functions, opset imports and nodes all name their domain in a field ``domain``
    imports = [*model.opset_import, *(entry for f in model.functions for entry in f.opset_import)]
    for item in [*nodes, *model.functions, *imports]:
        if is_custom(item.domain):
            item.domain = prefix + item.domain
    return bool(nodes)
