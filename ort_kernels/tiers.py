"""The table of kernel tiers: the one place tier names are written down.

Adding a tier is one module (a :class:`ort_kernels.base.Tier` subclass) plus one entry here.

Example:
    >>> list(TIERS)
    ['function', 'native', 'python']
    >>> get("gpu")
    Traceback (most recent call last):
    ...
    bridge.core.basics.errors.OpBridgeError: opbridge: unknown kernel tier. Got 'gpu'. Use one of ('function', ...
"""

from __future__ import annotations

from bridge.core.basics.errors import OpBridgeError
from ort_kernels.base import Tier
from ort_kernels.function import FunctionTier
from ort_kernels.native import NativeTier
from ort_kernels.python_tier import PythonTier

TIERS: dict[str, Tier] = {t.name: t for t in (FunctionTier(), NativeTier(), PythonTier())}
NAMES: tuple[str, ...] = tuple(TIERS)


def get(name: str) -> Tier:
    """The tier called ``name``; unknown names raise naming the ones there are."""
    try:
        return TIERS[name]
    except (KeyError, TypeError):
        raise OpBridgeError(f"unknown kernel tier. Got {name!r}. Use one of {NAMES}.") from None
