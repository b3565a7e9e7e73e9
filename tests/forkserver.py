"""Fresh Python processes for tests, forked from a server that has imported the third-party stack
(numpy, torch, onnx, onnxruntime, onnxscript) once: ``run(args, cwd=..., env=...)`` is
``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)`` without the 4-6 s
those imports cost each process on this machine.

The child is a process of its own, as a subprocess is: opbridge and the project's modules are imported
fresh in it (nothing of the project is imported in the server), it has its own op registry, its
``sys.exit`` is its exit status, a crash is a negative return code. It runs ``-m MODULE``, ``-c CODE``
or a script path, with the interpreter's ``sys.path`` rules (the module's folder or the current one,
then ``PYTHONPATH``), the given environment and current folder.

What a fork of the server cannot give, ``run`` gives with a real ``subprocess.run`` (``fresh_only`` says
why): interpreter options (``-W``, ``-X``, ...), a variable read when the interpreter or the
preloaded stack starts (``AT_START``: warnings filters, hash seed, locale, thread counts) with another
value than the server's, and any output the preloaded imports printed in the server (a fresh process
would print it to its own stderr). Non-daemon threads are joined before exit, as the interpreter does.

NOTE: a test whose point is what a fresh interpreter imports (``--help`` loads no torch) keeps
``subprocess.run``.
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
# NOTE: read when the interpreter starts (warnings, hash seed, locale coercion, I/O encoding) or when the
# preloaded stack is imported (OpenMP and MKL thread pools, torch's thread count): a fork inherits the
# server's
AT_START = ("PYTHONWARNINGS", "PYTHONHASHSEED", "PYTHONDEVMODE", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONMALLOC",
            "PYTHONOPTIMIZE", "PYTHONSAFEPATH", "LC_ALL", "LC_CTYPE", "LANG", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OMP_WAIT_POLICY", "OMP_DYNAMIC", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")
_lock = threading.Lock()
_server: subprocess.Popen | None = None
_server_env: dict[str, str] = {}
_import_output = ""  # what the server's preloaded imports printed (stdout and stderr)


def _start() -> subprocess.Popen:
    global _server_env, _import_output
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # NOTE: a process group of its own, which its forked children share: _kill ends a running child too
    server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                              text=True, bufsize=1, start_new_session=True)
    atexit.register(_kill, server)
    _server_env, _import_output = env, _reply(server, 600)["import_output"]
    return server


def fresh_only(args: list[str], env: dict[str, str]) -> str | None:
    """Why a fork of the server cannot be what a fresh ``python ARGS`` with ``env`` is, or None."""
    if args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        return f"interpreter option {args[0]}"
    changed = [k for k in AT_START if env.get(k) != _server_env.get(k)]
    if changed:
        return f"{', '.join(changed)} read at start"
    if _import_output:
        return "the preloaded imports printed output"
    return None


def run(args: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 600, umask: int | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` in a process forked from the server, or a subprocess where a fork cannot be
    one (``fresh_only``): returncode, stdout and stderr as text. ``env`` is the whole environment (``{}``
    an empty one), as subprocess takes it; None passes this process's."""
    global _server
    args = list(map(str, args))
    env = dict(os.environ if env is None else env)
    with _lock, tempfile.TemporaryDirectory() as folder:
        if _server is None or _server.poll() is not None:
            _server = _start()
        if fresh_only(args, env):
            return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=timeout, umask=-1 if umask is None else umask)
        out, err = Path(folder, "out"), Path(folder, "err")
        request = {"args": args, "cwd": str(cwd or os.getcwd()), "env": env,
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
        threading._shutdown()  # type: ignore[attr-defined]  # NOTE: joins non-daemon threads, as the interpreter does at exit
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
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    # NOTE: what the imports print goes to a file (fds 1 and 2), reported to the parent: a fresh process
    # would print it to its own output
    with tempfile.TemporaryFile("w+") as printed:
        saved = os.dup(1), os.dup(2)
        os.dup2(printed.fileno(), 1)
        os.dup2(printed.fileno(), 2)
        try:
            for name in PRELOAD:
                importlib.import_module(name)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        printed.seek(0)
        replies.write(json.dumps({"import_output": printed.read()}) + "\n")
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
