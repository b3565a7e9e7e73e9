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

# NOTE: public name -> (module, attribute); a name is defined in exactly one module.
_PUBLIC: dict[str, tuple[str, str]] = {
    "OpBridgeError": ("bridge.errors", "OpBridgeError"),
    "UnsupportedInTier": ("bridge.errors", "UnsupportedInTier"),
    "REGISTRY": ("bridge.registry", "REGISTRY"),
    "Registry": ("bridge.registry", "Registry"),
    "OpSpec": ("bridge.spec", "OpSpec"),
    "SampleInput": ("bridge.spec", "SampleInput"),
    "op": ("bridge.opdef", "op"),
    "BridgeOp": ("bridge.opdef", "BridgeOp"),
    "register": ("bridge.opdef", "register"),
    "export": ("exporters.export", "export"),
    "attach_functions": ("exporters.opsets", "attach_functions"),
    "TIERS": ("ort_kernels.tiers", "NAMES"),
    "session": ("bridge.sessions", "session"),
    "check_parity": ("bridge.parity", "check_parity"),
    "assert_parity": ("bridge.parity", "assert_parity"),
    "compare": ("bridge.parity", "compare"),
    "ParityReport": ("bridge.parity", "ParityReport"),
    "ModelCase": ("bridge.testing", "ModelCase"),
}
_SUBMODULES = ("checks", "cli", "domains", "dtypes", "errors", "functional", "localize", "opdef", "parity", "progress",
               "proxy", "registry", "schema", "sessions", "spec", "testing")

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        module, attr = _PUBLIC[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"bridge.{name}")
    else:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC) | set(_SUBMODULES))
