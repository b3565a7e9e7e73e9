"""The one exception type the bridge raises for user-facing problems."""

import os
import re
import traceback

# NOTE: a quoted message of another library's that ends in a period, followed by the bridge's ". Do Y."
_DOUBLE_STOP = re.compile(r"(?<![./])\.\.(?= )")
# NOTE: the bridge package's folder (two up from here), with its separator: frames there are opbridge's, never
# the user's code (raised_at's skip)
BRIDGE_FOLDER = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


class OpBridgeError(Exception):
    """A problem the user can fix; the message says what is wrong, what was got, and what to do.

    Example:
        >>> raise OpBridgeError("op 'x' is not registered. Got 'x'. Declare it with @bridge.op.")
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: op 'x' is not registered. Got 'x'. Declare it with ...
        >>> str(OpBridgeError("m.npz is not readable. Got ValueError: use `pickle.load()`.. Save it with savez."))
        'opbridge: m.npz is not readable. Got ValueError: use `pickle.load()`. Save it with savez.'
    """

    def __init__(self, message: str):
        if not message.startswith("opbridge: "):
            message = "opbridge: " + message
        super().__init__(_DOUBLE_STOP.sub(".", message))


class UnsupportedInTier(OpBridgeError):
    """An op or dtype that a kernel tier does not run (e.g. float16 in the Python tier)."""


class BuildError(OpBridgeError):
    """A C++ build that failed; ``cause`` says why, each with its own fix: ``"disk"`` (no space left),
    ``"permission"`` (a folder it cannot write), ``"compiler"`` (missing or broken), ``"removed"`` (its
    folder removed under it by another process) or ``"source"``;
    ``detail`` holds the compiler's own output, when there is one."""

    def __init__(self, message: str, cause: str, detail: str = ""):
        super().__init__(message)
        self.cause = cause
        self.detail = detail


def own_sentence(error: BaseException) -> str | None:
    """The ``opbridge: ...`` sentence ``error``'s text quotes (a kernel's or an op check's refusal passed on by
    onnxruntime or onnx), whitespace folded, from its prefix to the end; None where it quotes none.

    Example:
        >>> own_sentence(RuntimeError("[ONNXRuntimeError] : 6 : Exception during initialization: opbridge: d::f: "
        ...                           "attribute 'k' must be >= 0,  got -1"))
        "opbridge: d::f: attribute 'k' must be >= 0, got -1"
        >>> own_sentence(RuntimeError("no such file")) is None
        True
    """
    text = " ".join(str(error).split())
    own = text.find("opbridge: ")
    return text[own:] if own >= 0 else None


def raised_at(e: BaseException, skip: tuple[str, ...]) -> str:
    """`` (FILE:LINE in FUNCTION)`` of the innermost frame of ``e``'s traceback whose file name starts with none
    of ``skip`` (the folders of opbridge and of the library that called the user's code); "" when none is left.

    Example:
        >>> def users_code():
        ...     return ()[1]
        >>> try:
        ...     users_code()
        ... except IndexError as e:
        ...     raised_at(e, skip=()).endswith("in users_code)")
        True
    """
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(skip)]
    return f" ({frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
