"""Every private torch (and onnxscript) API opbridge uses, in one module; the rest of the code calls
public torch or this. (Minimal copy on this branch: main's module holds the other wrappers.)

Example:
    >>> torchlib_translation("no_such::op") is None
    True
"""

from __future__ import annotations

from typing import Any

# NOTE: importing the ops package fills onnxscript's torch_lib registry (onnxscript 0.5-0.7)
import onnxscript.function_libs.torch_lib.ops  # noqa: F401
from onnxscript.function_libs.torch_lib import registration as _torchlib


def torchlib_translation(qualname: str) -> Any | None:
    """The onnxscript function torch.onnx translates op ``qualname`` (``ns::name``) with, from
    onnxscript's torch_lib registry (``default_registry``, keyed by qualified name), or None.

    Example:
        >>> torchlib_translation("torchvision::nms").name
        'torchvision_nms'
    """
    entry = _torchlib.default_registry._registry.get(qualname)
    if entry is None or not entry.overloads:
        return None
    return entry.overloads[0]
