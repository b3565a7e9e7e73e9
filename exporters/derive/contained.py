"""onnxruntime runs where a crash is contained: a child process that holds one model's session and
runs feeds on it, so that a body onnxruntime dies on (a SIGFPE, a segfault) at some input size ends
the child, not the export. The parent reads the child's death as an outcome, ``("crash", "SIGFPE")``,
and starts a new child for the next run.

The child imports onnxruntime (and numpy) only (not torch, nothing of opbridge): it is started once per
process and kept while it lives, so a run costs a pipe round trip.

NOTE: this module imports nothing of the project: the child runs this very file as a script.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

import onnxruntime as ort

_HEADER = struct.Struct("<Q")
# NOTE: the child drops its first sys.path entry (the current folder under -c), so no user file shadows
# numpy or onnxruntime, and runs this file as __main__ (runpy adds nothing to sys.path for a file)
_CHILD = "import runpy, sys; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"


def _write(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream (the other side is gone)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    return None if len(data) < size else pickle.loads(data)  # noqa: S301  our own child's messages


def _error(e: BaseException) -> str:
    text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {text[:237] + '...' if len(text) > 240 else text}"


def _serve(inp: IO[bytes], out: IO[bytes]) -> None:  # pragma: no cover  (runs in the child)
    """The child's loop: ("load", model bytes) -> ("ok", None); ("run", feed) -> ("ok", outputs);
    a failure -> ("error", one line)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = None
    while (message := _read(inp)) is not None:
        kind, payload = message
        try:
            if kind == "load":
                session = ort.InferenceSession(payload, options, providers=["CPUExecutionProvider"])
                _write(out, ("ok", None))
            else:
                _write(out, ("ok", session.run(None, payload)))  # type: ignore[union-attr]
        except Exception as e:  # noqa: BLE001  reported to the parent
            _write(out, ("error", _error(e)))


class Runner:
    """A child process running onnxruntime sessions; one per process (:data:`RUNNER`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._loaded: bytes | None = None  # NOTE: the model the live child holds a session of
        self._pid = os.getpid()  # NOTE: a forked process starts a child of its own

    def run(self, model: bytes, feeds: Sequence[dict]) -> list[tuple[str, Any]]:
        """Each feed's outcome on ``model``: ("ok", outputs), ("error", onnxruntime's one line),
        ("crash", how the child ended: a signal name; the next feed gets a new child), or ("unrun", why)
        where no child process can be started."""
        with self._lock:
            if self._pid != os.getpid():
                self._child, self._loaded, self._pid = None, None, os.getpid()
            try:
                return [self._run_one(model, feed) for feed in feeds]
            except OSError as e:  # NOTE: from starting the child (no interpreter to run, no processes left)
                return [("unrun", f"{type(e).__name__}: {e}")] * len(feeds)

    def _run_one(self, model: bytes, feed: dict) -> tuple[str, Any]:
        if self._loaded is not model:
            outcome = self._ask(("load", model))
            if outcome[0] != "ok":
                return outcome
            self._loaded = model
        return self._ask(("run", feed))

    def _ask(self, message: tuple) -> tuple[str, Any]:
        child = self._child if self._child is not None and self._child.poll() is None else self._start()
        assert child.stdin is not None and child.stdout is not None
        try:
            _write(child.stdin, message)
            reply = _read(child.stdout)
        except (BrokenPipeError, OSError):
            reply = None
        if reply is not None:
            return reply
        self._child, self._loaded = None, None
        code = child.wait()
        return "crash", (signal.Signals(-code).name if code < 0 and -code in signal.valid_signals()
                         else f"exit status {code}")

    def _start(self) -> subprocess.Popen:
        self._loaded = None
        self._child = subprocess.Popen([sys.executable, "-c", _CHILD, __file__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        atexit.register(_close, self._child)
        return self._child


def _close(child: subprocess.Popen) -> None:
    if child.poll() is None and child.stdin is not None:
        child.stdin.close()  # NOTE: the child's loop ends at the end of its input
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()


RUNNER = Runner()

if __name__ == "__main__":  # pragma: no cover  (the child)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
