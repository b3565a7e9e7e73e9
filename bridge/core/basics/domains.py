"""ONNX domains: which are standard, which belong to a runtime, which are custom (defined once).

Example:
    >>> is_custom("bev"), is_custom(""), is_custom("com.microsoft.nchwc")
    (True, False, False)
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.core.basics.errors import OpBridgeError

# NOTE: the ONNX standard's own domains; a node here is run by every conforming runtime.
ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
# NOTE: onnxruntime's internal domains: they appear in files onnxruntime optimised and saved
# (`optimized_model_filepath`); onnxruntime runs them itself, they are not custom ops. A file saved
# at ORT_ENABLE_ALL (onnxruntime 1.32) imports com.microsoft(.nchwc/.experimental), org.pytorch.aten,
# ai.onnx.training and ai.onnx.preview besides the ONNX domains.
RUNTIME_DOMAINS = frozenset({
    "com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental", "com.microsoft.dml",
    "com.ms.internal.nhwc", "com.microsoft.mlfeaturizers", "org.pytorch.aten", "ai.onnx.training",
    "ai.onnx.preview",
})


def is_custom(domain: str) -> bool:
    """Whether nodes of ``domain`` need a kernel from opbridge (neither ONNX nor onnxruntime's own)."""
    return domain not in ONNX_DOMAINS and domain not in RUNTIME_DOMAINS


def refuse_reserved(qualname: str, domain: str | None) -> None:
    """Raise OpBridgeError when an op would be declared in an ONNX or onnxruntime domain.

    ONNX Runtime runs its own op for a node in such a domain (``Relu``, ``Gelu``, ...), so the
    exported file would compute something else than the op. ``None`` (the op's namespace) is free.

    >>> refuse_reserved("mine::gelu", None); refuse_reserved("mine::gelu", "com.example")
    >>> try:
    ...     refuse_reserved("mine::Gelu", "com.microsoft")
    ... except OpBridgeError as e:
    ...     print(str(e)[:61])
    opbridge: mine::Gelu: domain 'com.microsoft' is onnxruntime's
    """
    if domain is None or is_custom(domain):
        return
    owner = "the ONNX standard's" if domain in ONNX_DOMAINS else "onnxruntime's"
    raise OpBridgeError(
        f"{qualname}: domain {domain!r} is {owner} own (reserved): ONNX Runtime would run its own op of that name "
        f"there (e.g. Relu, Gelu) instead of this one, with other numbers. Got domain={domain!r}. Use a domain of "
        f"your own: leave domain= out (the op's namespace) or pass e.g. domain='com.yourcompany'.")


STANDARD_DOMAINS = ("", "ai.onnx")  # the standard ONNX operator set's two names


def is_onnx(domain: str) -> bool:
    """Whether ``domain`` is the standard ONNX operator set (``""`` or ``"ai.onnx"``)."""
    return domain in STANDARD_DOMAINS


def standard_opset(imports: Iterable[tuple[str, int]]) -> int | None:
    """The standard-ONNX opset among ``(domain, version)`` imports (a model's, a function's), or None.

    >>> standard_opset([("", 17), ("ai.onnx.ml", 3), ("bev", 1)]), standard_opset([("ai.onnx.ml", 3)])
    (17, None)
    """
    versions = [v for d, v in imports if is_onnx(d)]
    return max(versions) if versions else None
