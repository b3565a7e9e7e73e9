"""opbridge: declare a torch custom op once; export it to ONNX, run it in ONNX Runtime, prove parity.

The public names below load lazily (PEP 562), so ``import bridge`` stays cheap and the layers
underneath never import this facade (see ARCHITECTURE.md).

Example:
    >>> import torch, bridge, custom_ops
    >>> sorted(s.qualname for s in bridge.REGISTRY)[:2]
    ['bev::bev_pool_v2', 'opbridge::crop']
    >>> bridge.TIERS
    ('function', 'native', 'python')
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

# NOTE: public name -> (module, attribute); a name is defined in exactly one module.
_PUBLIC: dict[str, tuple[str, str]] = {
    "OpBridgeError": ("bridge.core.basics.errors", "OpBridgeError"),
    "UnsupportedInTier": ("bridge.core.basics.errors", "UnsupportedInTier"),
    "REGISTRY": ("bridge.core.registry", "REGISTRY"),
    "Registry": ("bridge.core.registry", "Registry"),
    "OpSpec": ("bridge.core.spec", "OpSpec"),
    "SampleInput": ("bridge.core.spec", "SampleInput"),
    "op": ("bridge.core.opdef", "op"),
    "BridgeOp": ("bridge.core.opdef", "BridgeOp"),
    "register": ("bridge.core.opdef", "register"),
    "build_torch_extension": ("bridge.core.cppbuild", "build_torch_extension"),
    "export": ("exporters.export", "export"),
    "attach_functions": ("exporters.resolve", "attach_functions"),
    "TIERS": ("ort_kernels.tiers", "NAMES"),
    "session": ("bridge.tools.sessions", "session"),
    "check_parity": ("bridge.tools.parity", "check_parity"),
    "assert_parity": ("bridge.tools.parity", "assert_parity"),
    "compare": ("bridge.tools.parity", "compare"),
    "ParityReport": ("bridge.tools.parity", "ParityReport"),
    "ModelCase": ("bridge.tools.testing", "ModelCase"),
}
# NOTE: submodules reachable as ``bridge.<name>``: the ground floor lives in bridge/core/, the
# user-facing floor in bridge/tools/ (ARCHITECTURE.md).
_SUBMODULES: dict[str, str] = {
    **{name: f"bridge.core.{name}" for name in (
        "checks", "cppbuild", "functional", "functions", "opdef", "proxy", "registry", "schema", "spec")},
    **{name: f"bridge.core.basics.{name}" for name in (
        "domains", "dtypes", "errors", "files", "graphs", "opnames", "progress", "torch_compat")},
    **{name: f"bridge.tools.{name}" for name in (
        "cli", "commands", "localize", "openvino_runtime", "parity", "sessions", "testing", "triton")},
}

__all__ = sorted(_PUBLIC)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import bridge.<name>`` / ``from bridge.<name> import X`` for each submodule above: the import
    statement gets the module itself (``bridge.testing is bridge.tools.testing``), loaded when asked."""

    def find_spec(self, fullname, path=None, target=None):
        short = fullname.removeprefix(f"{__name__}.")
        if short == fullname or short not in _SUBMODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=_SUBMODULES[short])

    def create_module(self, spec):
        module = importlib.import_module(spec.origin)
        spec.loader_state = module.__spec__  # NOTE: the import system sets the alias's spec on it next
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # its own spec back: the module was loaded already


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.append(_Alias())


def __getattr__(name: str):
    if name in _PUBLIC:
        module, attr = _PUBLIC[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC) | set(_SUBMODULES))
