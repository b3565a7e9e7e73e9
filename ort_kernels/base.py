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
from collections.abc import Callable, Sequence
from typing import ClassVar

import onnx
import onnxruntime as ort
import torch

from bridge.core.basics.domains import is_custom
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import model_nodes
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec

# One custom-op library path, or several (``bridge.session(native_library=...)``).
Paths = str | os.PathLike | Sequence[str | os.PathLike]

# An explainer: (the exception a run raised, the feed as arrays by input name, the model onnxruntime
# runs: its bytes or path) -> the OpBridgeError message for it, or None when it is not about what
# this explainer knows.
Explain = Callable[[BaseException, dict, "bytes | str"], "str | None"]
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
    # by domain::op_type, where the tier says: the library (its path) or FUNCTION_BODY that runs the op
    kernels: dict[str, str] = dataclasses.field(default_factory=dict)


# NOTE: what ``Prepared.kernels`` says of a custom op that runs its model-local function body.
FUNCTION_BODY = "function body"


class Session(ort.InferenceSession):
    """The one session class of every tier: an ``onnxruntime.InferenceSession`` whose run methods
    enter the tier's guard and turn an error an explainer recognises into OpBridgeError.
    NOTE: explainers look only after a failure: a run that works pays nothing."""

    def __init__(self, content, options, *, providers, explain: Sequence[Explain] = (),
                 guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 kernels: dict[str, str] | None = None, refuse: Sequence[Refuse] = ()):
        self._explainers = tuple(explain)
        self._refusals = tuple(refuse)
        self.kernels = dict(kernels or {})  # NOTE: Prepared.kernels: what runs each custom op
        self.unserved: dict[str, str] = {}  # NOTE: op -> why the user's libraries do not serve it (sessions)
        self._guard = guard
        self._content = content  # NOTE: the bytes onnxruntime keeps too (no copy), for explainers
        super().__init__(content, options, providers=list(providers))

    def run(self, output_names, input_feed, run_options=None):
        return self._checked(lambda: super(Session, self).run(output_names, input_feed, run_options), input_feed)

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        return self._checked(lambda: super(Session, self).run_with_ort_values(
            output_names, input_dict_ort_values, run_options), input_dict_ort_values)

    def run_with_iobinding(self, iobinding, run_options=None):
        return self._checked(lambda: super(Session, self).run_with_iobinding(iobinding, run_options), {})

    def run_with_ortvaluevector(self, run_options, feed_names, feeds, fetch_names, fetches, fetch_devices):
        return self._checked(lambda: super(Session, self).run_with_ortvaluevector(
            run_options, feed_names, feeds, fetch_names, fetches, fetch_devices), dict(zip(feed_names, feeds)))

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None):
        """Like onnxruntime's: ``callback(results, user_data, error_text)`` is called from another
        thread; a failed run passes ``[]`` and the same OpBridgeError text ``run`` raises.
        NOTE: the run itself is ``run`` in a worker thread, so the tier's guard holds for it too."""
        self._validate_input(list(input_feed))  # NOTE: bad input names raise here, as onnxruntime's does

        def work():
            try:
                results = self.run(output_names, input_feed, run_options)
            except Exception as e:  # noqa: BLE001  handed to the callback, as onnxruntime does
                callback([], user_data, str(e))
                return
            callback(results, user_data, "")

        threading.Thread(target=work, name="opbridge-run-async", daemon=True).start()

    def _checked(self, call: Callable, feed: dict):
        if self._refusals:
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
                arrays = _arrays(feed)
                messages = (explain(e, arrays, self._content) for explain in self._explainers)
                message = next((m for m in messages if m), None)
                if message is None:
                    raise
                raise OpBridgeError(message) from e


def _shapes(feed: dict) -> dict[str, tuple]:
    """Each fed value's shape where it has one (arrays, OrtValues)."""
    out = {}
    for name, value in feed.items():
        shape = value.shape() if isinstance(value, ort.OrtValue) else getattr(value, "shape", None)
        if shape is not None:
            out[name] = tuple(shape)
    return out


def _arrays(feed: dict) -> dict:
    """The feed as numpy arrays where it can be read (OrtValues on the CPU), for explainers."""
    out = {}
    for name, value in feed.items():
        if isinstance(value, ort.OrtValue):
            try:
                value = value.numpy()
            except Exception:  # noqa: BLE001  a value that cannot be read is left out of the message
                continue
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
    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: Paths | None = None) -> Prepared:
        """Edit ``model`` (a private copy) and options so every custom node has a kernel; raise
        UnsupportedInTier naming the ops it cannot run. ``library``: custom-op libraries to load
        (the native tier's; sessions refuse it for other tiers)."""

    def missing(self, registry: Registry) -> str | None:
        """What this machine lacks to run the tier at all (a package, a compiler), as an error
        message naming the fix; None when nothing is missing. Checked before an export starts."""
        return None

    def report(self, registry: Registry) -> list[str]:
        """Lines ``opbridge doctor`` prints about this tier (each op by its own name, as ``opbridge ops``
        lists it: a mutating op, not its functional twin)."""
        served = [s.qualname for s in registry if self.why_not(registry.functional(s)) is None]
        return [f"serves {len(served)} ops: {', '.join(served) or 'none'}"]


def helper_functions(model: onnx.ModelProto, registry: Registry) -> set[tuple[str, str]]:
    """(domain, name) of model-local functions that are not registered ops: helpers an exporter
    or tool put there (any runtime runs them from their bodies), not custom nodes for a tier."""
    return {(f.domain, f.name) for f in model.functions if registry.find(f.domain, f.name) is None}


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
    text = " ".join(str(error).split())
    own = text.find("opbridge: ")
    if own >= 0:  # NOTE: the library's own refusal names its cause and its fix
        return OpBridgeError(text[own:])
    return OpBridgeError(f"onnxruntime could not load the native library {path!r}. Got {type(error).__name__}: "
                         f"{text[:400].rstrip('.')}. {fix}")


def private_domains(model: onnx.ModelProto, prefix: str) -> bool:
    """Move every custom domain of ``model`` (nodes, subgraphs, model-local functions and the calls
    in them, opset imports) to ``prefix + domain``; whether there was any.

    NOTE: a kernel of a custom-op library registered into the session options wins over a
    model-local function of the same (domain, name): a private domain keeps the body the one that runs.

    >>> from onnx import helper
    >>> g = helper.make_graph([helper.make_node("f", ["x"], ["y"], domain="d")], "g", [], [])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("d", 1)])
    >>> private_domains(m, "p."), m.graph.node[0].domain, m.opset_import[0].domain
    (True, 'p.d', 'p.d')
    """
    nodes = [n for n in model_nodes(model, functions=True) if is_custom(n.domain)]
    # functions, opset imports and nodes all name their domain in a field ``domain``
    imports = [*model.opset_import, *(entry for f in model.functions for entry in f.opset_import)]
    for item in [*nodes, *model.functions, *imports]:
        if is_custom(item.domain):
            item.domain = prefix + item.domain
    return bool(nodes)
