"""Every cache of body derivation, held by one object (:data:`CACHE`).

Bodies and failures are kept per registry and per ``Registry.generation``: a registry that changed
(an op added, replaced or removed) gets an empty set, so a body traced against its old contents
(its nested ops, its records of custom nodes) is never served again. Specs are keyed by identity
and held while their entries live, so the id of a dead spec cannot stand for a new one.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from bridge.core.basics import torch_compat
from bridge.core.registry import Registry
from bridge.core.spec import OpSpec
from exporters.derive.sites import Derived, Site


@dataclasses.dataclass
class Generation:
    """What was derived against one generation of one registry."""

    generation: int
    specs: dict[int, OpSpec] = dataclasses.field(default_factory=dict)  # id -> spec, held: ids stay unique
    bodies: dict[tuple, Derived] = dataclasses.field(default_factory=dict)  # key -> the site's body
    failed: dict[tuple, str] = dataclasses.field(default_factory=dict)  # key -> why the site has no body
    values_only: set[tuple] = dataclasses.field(default_factory=set)  # site shapes, int signs: symbolic trace failed

    def key(self, spec: OpSpec, site: Site, opset: int) -> tuple:
        """The key of ``spec``'s body for exactly ``site`` at ``opset``."""
        self.specs[id(spec)] = spec  # NOTE: held here, so no other spec can take this id meanwhile
        return (spec.qualname, id(spec), site.key, opset)


class DeriveCache:
    """The caches of body derivation: bodies per registry generation (:meth:`of`), the latest failure
    per op (:meth:`fail`, :meth:`failure`), and torch.onnx's ATen translation table per opset
    (``torchlib``; it does not depend on opbridge's registry).

    Example:
        >>> reg = Registry()
        >>> cache = DeriveCache()
        >>> first = cache.of(reg)
        >>> cache.of(reg) is first
        True
        >>> reg.generation += 1   # what every change of the registry does
        >>> cache.of(reg) is first
        False
    """

    def __init__(self) -> None:
        self._registries: weakref.WeakKeyDictionary[Registry, Generation] = weakref.WeakKeyDictionary()
        self._last_failure: dict[str, str] = {}
        self.torchlib: dict[int, Any] = {}

    def of(self, registry: Registry) -> Generation:
        """The entries derived against ``registry`` as it is now (new and empty after a change)."""
        entry = self._registries.get(registry)
        if entry is None or entry.generation != registry.generation:
            entry = self._registries[registry] = Generation(registry.generation)
        return entry

    def fail(self, qualname: str, reason: str | None) -> None:
        """Record the latest derivation of ``qualname``: its reason, or None after a success."""
        if reason is None:
            self._last_failure.pop(qualname, None)
        else:
            self._last_failure[qualname] = reason

    def failure(self, qualname: str) -> str | None:
        """The reason the latest derivation for ``qualname`` failed (None after a success or none tried)."""
        return self._last_failure.get(qualname)

    def onnx_registry(self, opset: int, *, fresh: bool = False) -> Any | None:
        """torch.onnx's table of ATen translations at ``opset`` (``torch_compat.onnx_registry``), built
        once per opset (``fresh``: built again) and shared by every export and derivation; None where
        this torch has no such exporter.

        NOTE: torch.onnx.export builds this table anew on every call: about half a second, half of
        a small model's export."""
        if fresh or opset not in self.torchlib:
            self.torchlib[opset] = torch_compat.onnx_registry(opset)
        return self.torchlib[opset]

    def clear(self) -> None:
        """Forget everything (torch.onnx's tables too)."""
        self._registries.clear()
        self._last_failure.clear()
        self.torchlib.clear()


CACHE = DeriveCache()
