"""The opbridge CLI run in the test process, read as a subprocess's result: ``run(*argv, cwd=...)``
returns a ``subprocess.CompletedProcess`` (returncode, stdout, stderr) of ``cli.main(argv)``.

What a user's terminal would show is what the tests read: stdout and stderr are captured at the file
descriptors (onnxruntime's C++ log lines included), warnings are shown as a fresh interpreter shows
them (pytest's own filters set aside), an exception escaping ``main`` is a traceback on stderr and
exit status 1, and ``SystemExit`` (argparse) its exit status. The process is left as it was: the
current folder, ``sys.path``, the modules imported from the command's folder, progress lines off.

NOTE: this saves a subprocess's 5-10 s of imports per command. A test whose point is a fresh process
keeps a subprocess: what gets imported (``--help`` loads no torch), ``--ops``/``--model`` modules
that register ops in the process-wide registry, exit at import or read ``sys.argv``, the op count
of a bare ``opbridge ops``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

from bridge.core.basics import progress
from bridge.tools import cli

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _captured_fds():
    """A list that holds (stdout, stderr) text on exit: what file descriptors 1 and 2, and
    sys.stdout/sys.stderr, were written meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    texts: list[str] = []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved = [os.dup(1), os.dup(2)]
        streams = sys.stdout, sys.stderr
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            with open(1, "w", closefd=False, buffering=1) as so, open(2, "w", closefd=False, buffering=1) as se:
                sys.stdout, sys.stderr = so, se
                try:
                    yield texts
                finally:
                    so.flush()
                    se.flush()
                    sys.stdout, sys.stderr = streams
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode())


def _python_default_warnings() -> None:
    """The warning filters of a plain ``python`` (no -W, no dev mode)."""
    warnings.resetwarnings()
    warnings.simplefilter("default")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", category)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # NOTE: sys.exit('text') prints the text and exits 1, as the interpreter does
    return 1


def _main(argv: list[str]) -> int:
    try:
        return _exit_status(cli.main(argv))
    except SystemExit as e:
        return _exit_status(e.code)
    except Exception:  # noqa: BLE001  (a subprocess shows it as a traceback and exit status 1)
        traceback.print_exc()
        return 1
    finally:
        progress.enable(False)


def run(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``opbridge ARGS`` run in this process from ``cwd`` (default: the repository root)."""
    folder = Path(cwd or ROOT).resolve()
    path, modules = sys.path[:], set(sys.modules)
    with contextlib.chdir(folder), warnings.catch_warnings(record=True) as caught, _captured_fds() as texts:
        _python_default_warnings()
        code = _main(list(args))
        for w in caught:
            sys.stderr.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
    sys.path[:] = path
    for name in set(sys.modules) - modules:  # NOTE: a module of the command's folder is not this process's
        file = getattr(sys.modules[name], "__file__", None) or ""
        if file and Path(file).resolve().is_relative_to(folder) and folder != ROOT:
            del sys.modules[name]
    return subprocess.CompletedProcess(["opbridge", *args], code, *texts)
