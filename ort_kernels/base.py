"""What a kernel tier is: the protocol every tier implements, and what tiers share.

A tier decides which ops (and dtypes) it serves, with the reason when it does not, and prepares
a model and ``SessionOptions`` so that onnxruntime finds a kernel for every custom node.
Adding a tier is one module with a :class:`Tier` subclass plus one entry in ``ort_kernels.tiers``.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from typing import ClassVar

import onnx
import onnxruntime as ort
import torch

from bridge.core.registry import Registry
from bridge.core.spec import OpSpec


@dataclasses.dataclass
class Prepared:
    """A tier's answer: the options to open the session with, whether the model proto was changed
    (else the file goes to onnxruntime by path), and the session class to use."""

    options: ort.SessionOptions | None
    changed: bool
    session_class: type = ort.InferenceSession


class Tier(abc.ABC):
    """One way of giving onnxruntime a kernel for each custom node."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `opbridge doctor`, `ops` and the docs

    @abc.abstractmethod
    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None) -> str | None:
        """None when the tier runs ``spec`` (at ``dtype``, or at all), else the reason it does not."""

    @abc.abstractmethod
    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: str | os.PathLike | None = None) -> Prepared:
        """Edit ``model`` (a private copy) and options so every custom node has a kernel; raise
        UnsupportedInTier naming the ops it cannot run."""

    def report(self, registry: Registry) -> list[str]:
        """Lines ``opbridge doctor`` prints about this tier."""
        served = [s.qualname for s in registry.exportable() if self.why_not(s) is None]
        return [f"serves {len(served)} ops: {', '.join(served) or 'none'}"]


def helper_functions(model: onnx.ModelProto, registry: Registry) -> set[tuple[str, str]]:
    """(domain, name) of model-local functions that are not registered ops: helpers an exporter
    or tool put there (any runtime runs them from their bodies), not custom nodes for a tier."""
    return {(f.domain, f.name) for f in model.functions if registry.find(f.domain, f.name) is None}


# NOTE: registering a library twice into one SessionOptions adds its domains twice, and every
# later session on those options fails ("Domain already set in registry"). Options a library
# went into are kept alive here, so their ids cannot be reused by other objects.
_registered: dict[tuple[int, str], ort.SessionOptions] = {}


def with_library(options: ort.SessionOptions | None, path: str) -> ort.SessionOptions:
    """``options`` (or new options) with the custom-op library at ``path`` registered once.

    Options the caller passes are remembered (they may be reused for more sessions); options
    made here belong to one session and are released with it.
    """
    if options is None:
        options = ort.SessionOptions()
        options.register_custom_ops_library(path)
        return options
    key = (id(options), path)
    if key not in _registered:
        options.register_custom_ops_library(path)
        _registered[key] = options
    return options
