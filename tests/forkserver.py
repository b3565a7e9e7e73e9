"""Fresh Python processes for tests, forked from a server that has imported the third-party stack
(numpy, torch, onnx, onnxruntime, onnxscript) once: ``run(args, cwd=..., env=...)`` is
``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)`` without the 4-6 s
those imports cost each process on this machine.

The child is a process of its own, as a subprocess is: opbridge and the project's modules are imported
fresh in it (nothing of the project is imported in the server), it has its own op registry, its
``sys.exit`` is its exit status, a crash is a negative return code. It runs ``-m MODULE``, ``-c CODE``
or a script path, with the interpreter's ``sys.path`` rules (the module's folder or the current one,
then ``PYTHONPATH``), the given environment and current folder.

NOTE: a test whose point is what a fresh interpreter imports (``--help`` loads no torch) or that sets
an environment variable torch, onnx or onnxruntime read at import keeps ``subprocess.run``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path

PRELOAD = ("numpy", "torch", "onnx", "onnxruntime", "onnxscript")
_lock = threading.Lock()
_server: subprocess.Popen | None = None


def _start() -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # NOTE: a process group of its own, which its forked children share: _kill ends a running child too
    server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                              text=True, bufsize=1, start_new_session=True)
    atexit.register(_kill, server)
    return server


def run(args: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 600, umask: int | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` in a process forked from the server: returncode, stdout and stderr as text."""
    global _server
    with _lock, tempfile.TemporaryDirectory() as folder:
        if _server is None or _server.poll() is not None:
            _server = _start()
        out, err = Path(folder, "out"), Path(folder, "err")
        request = {"args": list(map(str, args)), "cwd": str(cwd or os.getcwd()), "env": dict(env or os.environ),
                   "out": str(out), "err": str(err), "umask": umask}
        assert _server.stdin and _server.stdout
        _server.stdin.write(json.dumps(request) + "\n")
        _server.stdin.flush()
        reply = _reply(_server, timeout)
        return subprocess.CompletedProcess(args, reply["returncode"], out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _kill(server: subprocess.Popen) -> None:
    """End the server and the child it is running, if any."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def _reply(server: subprocess.Popen, timeout: float) -> dict:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(server.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        timed_out = not box  # NOTE: before the kill, after which the reader gets end of file
        _kill(server)
        raise subprocess.TimeoutExpired("forkserver", timeout) if timed_out else RuntimeError("the fork server died")
    return json.loads(box[0])


# --- the server (this file run as a script) ----------------------------------------------------------------

def _child(request: dict) -> None:
    """In the forked child: become ``python ARGS`` and exit with its status."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["umask"] is not None:
        os.umask(request["umask"])
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY | os.O_CREAT),
                            (2, request["err"], os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(name, flags, 0o600), fd)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    code = _execute(request["args"])
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _execute(args: list[str]) -> int:
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = sys.path[1:]  # NOTE: the server's own sys.path[0] is this file's folder
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[:] = [os.getcwd(), *extra, *base]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[:] = ["", *extra, *base]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(args)
            sys.path[:] = [str(Path(args[0]).resolve().parent), *extra, *base]
            runpy.run_path(args[0], run_name="__main__")
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001  (the interpreter prints it and exits 1)
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # NOTE: from the program's frame on
        return 1


def _serve() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            _child(request)
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    _serve()
