"""The native tier: custom nodes run in the C++ custom-op library (``libopbridge_ort.so``), built from
each op's ``native=`` file or its seed kernel ``ort_kernels/cpu/<domain>_op_<op type>.cc``
(names from ``bridge.core.basics.opnames``, so a kernel belongs to one full ONNX name) on first use, or prebuilt."""

from __future__ import annotations

import os

import onnxruntime as ort
import torch

from bridge.core.basics.errors import OpBridgeError, UnsupportedInTier, own_sentence
from bridge.core.basics.opnames import spec_names
from bridge.core.checks import ordered
from bridge.core.cppbuild import compiler, find_compiler, verified
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec
from exporters.resolve import attach_functions
from ort_kernels.base import FUNCTION_BODY, Paths, Plan, Prepared, Tier, import_hint, load_error, with_library
from ort_kernels.build import library_path, native_library, native_source, served_ops
from ort_kernels.libraries import served_by, user_libraries

# NOTE: the one env var naming a prebuilt library for every native session.
LIBRARY_ENV = "OPBRIDGE_NATIVE_LIBRARY"


class NativeTier(Tier):
    name = "native"
    summary = "the C++ custom-op library libopbridge_ort.so (the deployment artifact)"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None, *, thorough: bool = True) -> str | None:
        if native_source(spec) is None:
            return (f"no C++ kernel (native= or op.register_native, or a seed kernel "
                    f"ort_kernels/{spec_names(spec).source_file})")
        if dtype is not None and dtype not in spec.dtypes:
            return f"{str(dtype).replace('torch.', '')} is not among the op's dtypes"
        return None

    def prepare(self, plan: Plan, options: ort.SessionOptions | None, library: Paths | None = None) -> Prepared:
        """``library`` (or ``$OPBRIDGE_NATIVE_LIBRARY``): custom-op libraries of the user's own (or
        opbridge's, prebuilt) that serve the nodes they know; opbridge's library serves the rest it
        has C++ kernels for, then function bodies."""
        model = plan.model
        users = user_libraries(library or os.environ.get(LIBRARY_ENV) or None)
        theirs = served_by(users, plan)
        served, unserved, attached = _served(plan, theirs, users)
        # NOTE: drop the model-local functions a library serves, so that the C++ kernels, not the
        # function bodies, are what this session runs.
        keep = [f for f in model.functions if (f.domain, f.name) not in served and (f.domain, f.name) not in theirs]
        changed = attached or len(keep) != len(model.functions)
        del model.functions[:]
        model.functions.extend(keep)
        own = _own_library(plan, theirs) if any(key in served for key in plan.ops()) else ""
        for p in plan.nodes:
            p.served = theirs.get(p.key) or (own if p.key in served else "") or (
                FUNCTION_BODY if p.key in unserved else "")
        # NOTE: a body this tier runs waits for its guard, as in the function tier (the session explains it)
        waits = [ordered(f) for f in model.functions]
        return Prepared(_with_libraries(options, [*dict.fromkeys(theirs.values()), *([own] if own else [])]),
                        changed=changed or any(waits), explain=(_kernel_refusal,))

    def missing(self, registry: Registry) -> str | None:
        # NOTE: the cheap answers first: the library's key needs every op's types (their fake kernels)
        if os.environ.get(LIBRARY_ENV) or find_compiler() or verified(library_path(registry, build=False)):
            return None
        try:
            compiler("the native kernel library", fix=", or point $OPBRIDGE_NATIVE_LIBRARY at a library built "
                                                   "elsewhere (`opbridge build -o DIR`)")
        except OpBridgeError as e:
            return str(e)
        return None

    def report(self, registry: Registry) -> list[str]:
        served = served_ops(registry)
        lines = [f"serves {len(served)} ops in domains {sorted({d for d, _ in served})}:"]
        for (domain, name), dtypes in sorted(served.items()):
            spec = registry.find(domain, name)
            assert spec is not None  # served ops come from the registry
            op = registry.declared(spec).qualname
            # NOTE: the node's ONNX name, and the op's own where it differs (as `opbridge ops` shows both)
            lines.append(f"  {domain}::{name} v{spec.version} "
                         f"{','.join(str(d).replace('torch.', '') for d in dtypes)}"
                         f"{'' if op == f'{domain}::{name}' else f' (op {op})'}")
        return lines


def _kernel_refusal(error: BaseException, _feed: dict | None, _model: bytes | str) -> str | None:
    """A C++ kernel's refusal (its status message: an ``opbridge: ...`` sentence naming the op, the input
    and its value) as it is, with what to do.

    >>> _kernel_refusal(RuntimeError("[ONNXRuntimeError] : 2 : ... Status Message: opbridge: d::f: input 'i' "
    ...                 "has value 9 at position 1, outside [0, 4)"), {}, b"")  # doctest: +NORMALIZE_WHITESPACE
    "opbridge: d::f: input 'i' has value 9 at position 1, outside [0, 4). Got this from the op's C++ kernel.
    Fix the inputs (the op's own eager checks apply in this tier)."
    """
    own = own_sentence(error)
    if own is None:
        return None
    return (f"{own.rstrip('. ')}. Got this from the op's C++ kernel. Fix the inputs (the op's own eager "
            "checks apply in this tier).")


def _served(plan: Plan, theirs: dict[tuple[str, str], str], users: list[str]
            ) -> tuple[dict, list[tuple[str, str]], bool]:
    """What serves the plan's custom nodes besides the user's libraries (``theirs``): the ops opbridge's
    library serves (with their types), the nodes nothing serves, and whether their bodies were attached (a node
    with neither a C++ kernel nor a body is refused)."""
    # NOTE: nodes inside model-local functions count: a body may call an op the library serves
    rest = [key for key in plan.ops() if key not in theirs]
    # NOTE: the library's op table (each op's types, through its fake kernel) only when a node needs it
    needed = any(p.spec is not None and native_source(p.spec) is not None for p in plan.nodes if p.key not in theirs)
    served = {k: v for k, v in served_ops(plan.registry).items() if k in rest} if needed else {}
    # NOTE: a node with neither a C++ kernel nor a model-local body runs its registered body,
    # attached at the file's opset (helper functions the model carries run as they are)
    unserved = [key for key in sorted(plan.ops(functions=False)) if key not in served and key not in theirs]
    attached = bool(unserved) and bool(attach_functions(plan.model, plan.registry, ops=unserved))
    if attached:
        plan.refresh()  # NOTE: the resolver gave the model bodies: a new proto, new nodes
    local = {(f.domain, f.name) for f in plan.model.functions}
    missing = [f"{d}::{t}" for d, t in unserved if (d, t) not in local]
    if missing:
        raise UnsupportedInTier(
            f"tier 'native' has no C++ kernel for {', '.join(missing)}, nor a function body to run instead"
            f"{'; no library given serves it' if users else ''}. Got ops {missing}. "
            f"{import_hint(plan.registry, missing)}Give each a C++ kernel (native= on @bridge.op, or "
            "op.register_native) or a function body"
            f"{'' if users else ', or pass native_library= a custom-op library that serves it'}."
        )
    return served, unserved, attached


def _own_library(plan: Plan, theirs: dict[tuple[str, str], str]) -> str:
    """The path of opbridge's library, built for the registry (beside the user's, one library per domain)."""
    _one_library_per_domain(theirs, {d for d, _ in served_ops(plan.registry)})
    # NOTE: an op whose own C++ kernel does not build fails only the sessions whose model uses it
    built = native_library(plan.registry)
    broken = [built.broken[key] for key in sorted(plan.ops(functions=False)) if key in built.broken]
    if broken:
        raise broken[0]
    return os.fspath(built.path)


def _with_libraries(options: ort.SessionOptions | None, libraries: list[str]) -> ort.SessionOptions | None:
    """``options`` with each library registered in onnxruntime; a library it refuses fails in its words."""
    try:
        for path in libraries:
            options = with_library(options, path)
    except Exception as e:  # noqa: BLE001  onnxruntime's words, or the library's own refusal
        raise load_error(path, e, f"Rebuild it for this onnxruntime ({ort.__version__}).") from None
    return options


def _one_library_per_domain(theirs: dict[tuple[str, str], str], domains: set[str]) -> None:
    """onnxruntime takes each custom domain from one library ("Domain already set in registry"):
    a user's library that serves a domain opbridge's library registers too cannot sit beside it."""
    shared = sorted({(d, path) for (d, _), path in theirs.items() if d in domains})
    if shared:
        names = ", ".join(f"'{d}' ({os.path.basename(p)})" for d, p in shared)
        raise OpBridgeError(
            f"the model needs opbridge's native library beside a library of yours that serves domain "
            f"{names}, which opbridge's library registers too; onnxruntime takes each domain from one library. "
            f"Got ops {sorted(f'{d}::{t}' for d, t in theirs)} served by yours. Serve each domain from one library: "
            "build the ops with opbridge C++ kernels in that domain into your library, or register them without "
            "native= (their function bodies run)."
        )
