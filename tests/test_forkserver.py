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
