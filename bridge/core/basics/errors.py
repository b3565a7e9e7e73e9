"""The one exception type the bridge raises for user-facing problems."""

import re

# NOTE: a quoted message of another library's that ends in a period, followed by the bridge's ". Do Y."
_DOUBLE_STOP = re.compile(r"(?<![./])\.\.(?= )")


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
