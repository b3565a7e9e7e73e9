"""tests/forkserver.py gives what a subprocess gives (exit status, output, a crash, the folder, the
environment, sys.path, the umask), and a process the project's modules have not touched;
tests/cli_runner.py reads the CLI in this process as a subprocess would show it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import pytest
from cli_runner import run as in_process

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("code,status,out,err", [
    ("print('out'); import sys; print('err', file=sys.stderr)", 0, "out\n", "err\n"),
    ("import sys; sys.exit(3)", 3, "", ""),
    ("import sys; sys.exit('no thanks')", 1, "", "no thanks\n"),
    ("raise ValueError('boom')", 1, "", "ValueError: boom"),
    (f"import os; os.kill(os.getpid(), {int(signal.SIGSEGV)})", -signal.SIGSEGV, "", ""),
])
def test_forked_process_status_and_output_are_a_subprocess(code, status, out, err):
    for r in (forkserver.run(["-c", code]), subprocess.run([sys.executable, "-c", code], capture_output=True,
                                                           text=True)):
        assert r.returncode == status and r.stdout == out and err in r.stderr, r
    assert "forkserver" not in forkserver.run(["-c", code]).stderr  # the traceback starts at the program


def test_forked_process_gets_folder_environment_path_argv_and_umask(tmp_path):
    (tmp_path / "prog.py").write_text(
        "import json, os, sys\n"
        "mask = os.umask(0)\n"
        "print(json.dumps([os.getcwd(), os.environ.get('FS_MARK'), sys.path[:2], sys.argv, mask, __name__,\n"
        "                  sorted(m for m in sys.modules if m.split('.')[0] in ('bridge', 'custom_ops'))]))\n")
    env = dict(os.environ, FS_MARK="here", PYTHONPATH=str(ROOT))
    r = forkserver.run([str(tmp_path / "prog.py"), "a", "b"], cwd=ROOT, env=env, umask=0o027)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f'["{ROOT}", "here", ["{tmp_path}", "{ROOT}"], ["{tmp_path / "prog.py"}", "a", "b"], '
                                f'{0o027}, "__main__", []]')
    r = forkserver.run(["-m", "bridge", "--help"], cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout.startswith("usage: opbridge"), r.stderr


def test_in_process_cli_shows_what_a_subprocess_shows(tmp_path):
    before, path = os.getcwd(), sys.path[:]
    args = ("run", "missing.onnx")
    ours = in_process(*args, cwd=tmp_path)
    theirs = forkserver.run(["-m", "bridge", *args], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr)
    assert ours.returncode == 2 and "no ONNX file at 'missing.onnx'" in ours.stderr
    r = in_process("check", "--no-such-flag")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr and r.stdout == ""
    assert os.getcwd() == before and sys.path == path


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_run_past_its_timeout_ends_its_child_too(tmp_path):
    marker = tmp_path / "pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(["-c", code], timeout=5)
    pid = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid)
    assert forkserver.run(["-c", "print('next')"]).stdout == "next\n"  # NOTE: a new server serves the next run


def _both(args, env=None, **kw):
    """forkserver.run and subprocess.run of ``python ARGS``: (returncode, stdout, stderr) each."""
    fork = forkserver.run(args, env=env, cwd=ROOT, **kw)
    fresh = subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return (fork.returncode, fork.stdout, fork.stderr), (fresh.returncode, fresh.stdout, fresh.stderr)


WARN = "import warnings; warnings.warn('careful'); print('after')"


@pytest.mark.parametrize("case", ["empty", "one variable"])
def test_the_environment_is_the_one_passed(case):
    """``env={}`` is an empty environment, as subprocess gives it (it gave this process's; issue #46)."""
    env = {} if case == "empty" else {"FS_ONLY": "1", "PATH": os.environ["PATH"]}
    fork, fresh = _both(["-c", "import os; print(sorted(os.environ))"], env=env)
    assert fork == fresh and "HOME" not in fork[1]


@pytest.mark.parametrize("how", ["PYTHONWARNINGS", "-W"])
def test_warnings_filters_are_the_fresh_processs(how):
    """PYTHONWARNINGS=error or -W error turns a warning into an exception, as in a fresh interpreter."""
    env = dict(os.environ, PYTHONWARNINGS="error") if how == "PYTHONWARNINGS" else dict(os.environ)
    args = ["-c", WARN] if how == "PYTHONWARNINGS" else ["-W", "error", "-c", WARN]
    fork, fresh = _both(args, env=env)
    assert fork[0] == fresh[0] == 1 and fork[1] == fresh[1] == "" and "UserWarning: careful" in fork[2]
    assert fork[2] == fresh[2]


def test_hash_seed_and_thread_counts_are_read_as_at_start():
    """PYTHONHASHSEED and OMP_NUM_THREADS act as in a fresh process (torch sizes its pool at import)."""
    code = "import torch; print(hash('opbridge'), torch.get_num_threads())"
    fork, fresh = _both(["-c", code], env=dict(os.environ, PYTHONHASHSEED="7", OMP_NUM_THREADS="1"))
    assert fork == fresh and fork[1].split()[1] == "1"


def test_non_daemon_threads_are_joined_before_exit():
    code = ("import threading, time\n"
            "def late():\n    time.sleep(0.3); print('joined', flush=True)\n"
            "threading.Thread(target=late).start()\n")
    fork, fresh = _both(["-c", code])
    assert fork == fresh == (0, "joined\n", "")


def test_what_imports_print_reaches_the_child_as_in_a_fresh_process():
    """The preloaded stack printed nothing at import, so a fork's stderr is a fresh process's; were it
    to print, forkserver.run would run a subprocess (fresh_only)."""
    code = "import numpy, torch, onnx, onnxruntime, onnxscript; print('ok')"
    fork, fresh = _both(["-c", code])
    assert fork == fresh
    assert forkserver.fresh_only(["-c", code], dict(os.environ)) is None or forkserver._import_output
    assert forkserver.fresh_only(["-W", "error", "-c", code], dict(os.environ)) == "interpreter option -W"
