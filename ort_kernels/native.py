"""The native tier: custom nodes run in the C++ custom-op library (``libopbridge_ort.so``), built from
each op's ``native=`` file or its seed kernel ``ort_kernels/cpu/<domain>_op_<op type>.cc``
(names from ``bridge.core.opnames``, so a kernel belongs to one full ONNX name) on first use, or prebuilt."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

from bridge.core.cppbuild import compiler, find_compiler, verified
from bridge.core.errors import OpBridgeError, UnsupportedInTier
from bridge.core.graphs import custom_ops
from bridge.core.opnames import spec_names
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec
from exporters.bodies.opsets import attach_functions
from ort_kernels.base import Prepared, Tier, with_library
from ort_kernels.build import library_path, native_library, native_source, served_ops

# NOTE: the one env var naming a prebuilt library for every native session.
LIBRARY_ENV = "OPBRIDGE_NATIVE_LIBRARY"


def _built_here(model: onnx.ModelProto, registry: Registry) -> Path:
    """The library built on this machine for ``registry``; an op whose own C++ kernel does not build
    fails only the sessions whose model uses it (with that kernel's error)."""
    built = native_library(registry)
    used = [built.broken[key] for key in sorted(custom_ops(model)) if key in built.broken]
    if used:
        raise used[0]
    return built.path


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

    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: str | os.PathLike | None = None) -> Prepared:
        served = served_ops(registry)
        # NOTE: a node with neither a C++ kernel nor a model-local body runs its registered body,
        # attached at the file's opset (helper functions the model carries run as they are)
        unserved = [key for key in sorted(custom_ops(model)) if key not in served]
        attached = bool(unserved) and bool(attach_functions(model, registry))
        local = {(f.domain, f.name) for f in model.functions}
        missing = [f"{d}::{t}" for d, t in unserved if (d, t) not in local]
        if missing:
            raise UnsupportedInTier(
                f"tier 'native' has no C++ kernel for {', '.join(missing)}, nor a function body to run instead. "
                f"Got ops {missing}. "
                "Give each a C++ kernel (native= on @bridge.op, or op.register_native) or a function body."
            )
        # NOTE: drop the model-local functions the library serves, so that the C++ kernels, not the
        # function bodies, are what this session runs.
        keep = [f for f in model.functions if (f.domain, f.name) not in served]
        changed = attached or len(keep) != len(model.functions)
        del model.functions[:]
        model.functions.extend(keep)
        library = os.fspath(library or os.environ.get(LIBRARY_ENV) or _built_here(model, registry))
        if not os.path.isfile(library):
            raise OpBridgeError(f"no native kernel library at {library!r}. Got a missing file. Build one with "
                                "`opbridge build -o DIR`, or drop native_library= to build here.")
        try:
            options = with_library(options, library)
        except Exception as e:
            raise OpBridgeError(f"onnxruntime could not load the native library {library!r}. Got "
                                f"{type(e).__name__}: {str(e)[:300]}. Rebuild it for this onnxruntime.") from None
        return Prepared(options, changed=changed)

    def missing(self, registry: Registry) -> str | None:
        if os.environ.get(LIBRARY_ENV) or verified(library_path(registry, build=False)) or find_compiler():
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
            lines.append(f"  {domain}::{name} v{spec.version} "
                         f"{','.join(str(d).replace('torch.', '') for d in dtypes)}")
        return lines
