"""Which torch releases opbridge works with: one venv per release, a named test subset and the main command.

    python benchmarks/torch_matrix.py [--versions 2.12.1 2.13.0 2.14.1 2.15.0] [--tests tests/test_x.py ...]
                                      [--json benchmarks/results/torch_matrix.json] [--venvs DIR] [--keep]

1. A snapshot of the committed tree (``git archive HEAD``) in a temp folder: edits made while the
   matrix runs do not leak into it, and the JSON names the commit it measured.
2. For each torch release: a fresh venv (under $OPBRIDGE_CACHE_DIR or ~/.cache/opbridge,
   torch-matrix/), ``pip install torch==V`` first, then ``pip install -e ".[test]"`` of the snapshot;
   the torch version must be the same after the second install (opbridge must not replace it).
   The machine's pip constraint file (which caps torch) is lifted for these commands only (``pip_env``).
3. In that venv: the test subset below (``-m 'not slow'``, one process, JUnit XML read back) and the
   README's main command ``opbridge check``; the JSON is rewritten after each release, and the venv
   (several GB for a CUDA build) is deleted unless ``--keep``.
4. ``torch_matrix_table.py --readme README.md`` puts the table into the README.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ort_matrix_table import cache_folder  # noqa: E402
from torch_matrix_table import DEFAULT_JSON, render  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MMDEPLOY_LIB = ROOT / "build" / "mmdeploy-1.3.1" / "libmmdeploy_onnxruntime_ops.so"  # tests/mmdeploy_lib.py's
VERSIONS = ("2.12.1", "2.13.0", "2.14.1", "2.15.0")
# NOTE: export, derive, the function/native/python tiers, torchbind and the CLI; the seed ops run in
# them and in `opbridge check`. Adding test_ops.py and test_opsets.py took 37 min (2.13.0) on the
# shared 2-core machine, too long per release; pass them with --tests for a wider run.
TESTS = ("tests/test_export.py", "tests/test_derive.py", "tests/test_cli.py", "tests/test_python_tier.py",
         "tests/test_native.py", "tests/test_torchbind.py")
OWN_LINE = re.compile(r"^(error: |\[)?opbridge\b")  # its errors and its "[opbridge] step ..." progress
PARITY_LINE = re.compile(r"^\d+ passed, \d+ failed")


def pip_env(base: dict | None = None) -> dict:
    """The environment for the matrix's pip calls: a constraint file in pip's configuration (this
    machine's caps torch) replaced by an empty one, the rest of the configuration (indexes) kept."""
    # NOTE: pip ignores an empty PIP_CONSTRAINT; os.devnull is a constraint file that says nothing
    env = dict(os.environ if base is None else base, PIP_CONSTRAINT=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    # NOTE: the snapshot has no build/: the tests that run mmdeploy's kernel library use this checkout's copy
    if MMDEPLOY_LIB.is_file():
        env.setdefault("OPBRIDGE_TEST_MMDEPLOY_LIB", str(MMDEPLOY_LIB))
    return env


def _run(cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=pip_env(), capture_output=True, text=True, timeout=timeout)


def snapshot(target: Path) -> str:
    """Unpack the committed tree (HEAD) into ``target``; return the commit."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    archive = target.parent / "head.tar"
    subprocess.run(["git", "archive", "-o", str(archive), "HEAD"], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    archive.unlink()
    return commit


def torch_version(python: Path) -> str | None:
    r = _run([str(python), "-c", "import torch; print(torch.__version__)"], timeout=300)
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None


def install(version: str, folder: Path, source: Path) -> tuple[Path, dict]:
    """A venv with torch ``version``, then opbridge with its test extras; what pip did, in words."""
    python = folder / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    info: dict = {}
    start = time.perf_counter()
    r = _run([str(python), "-m", "pip", "install", "-q", f"torch=={version}"], timeout=3600)
    if r.returncode:
        raise RuntimeError(f"pip install torch=={version}: {_tail(r.stderr)}")
    info["torch"] = torch_version(python)
    r = _run([str(python), "-m", "pip", "install", "-q", "-e", ".[test]"], timeout=3600, cwd=source)
    if r.returncode:
        raise RuntimeError(f"pip install -e .[test]: {_tail(r.stderr)}")
    info["torch_after_opbridge"] = torch_version(python)
    info["install_s"] = round(time.perf_counter() - start)
    return python, info


def _tail(text: str, n: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return " | ".join(lines[-n:])[:600]


def read_junit(path: Path) -> dict:
    """Counts and failing ids (with the first line of each failure) from pytest's JUnit XML."""
    counts = {"passed": 0, "failed": 0, "xfailed": 0, "skipped": 0}
    failures, seconds = {}, {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('file') or case.get('classname', '').replace('.', '/') + '.py'}::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped")
        test_file = test_id.split("::", 1)[0]
        seconds[test_file] = seconds.get(test_file, 0.0) + float(case.get("time") or 0)
        if bad is not None:
            counts["failed"] += 1
            text = (bad.get("message") or bad.text or "").strip()
            failures[test_id] = text.splitlines()[0][:300] if text else ""
        elif skipped is not None:
            counts["xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures, "file_seconds": {k: round(v) for k, v in seconds.items()}}


def run_tests(python: Path, source: Path, tests: list[str], work: Path) -> dict:
    junit = work / "junit.xml"
    start = time.perf_counter()
    r = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
              f"--junitxml={junit}", *tests], timeout=7200, cwd=source)
    result = read_junit(junit) if junit.exists() else {"error": _tail(r.stdout + r.stderr)}
    result["seconds"] = round(time.perf_counter() - start)
    return result


def main_command(python: Path, source: Path) -> dict:
    """The README's main command; the parity summary line and every stderr line opbridge did not write."""
    r = _run([str(python.parent / "opbridge"), "check"], timeout=1800, cwd=source)
    parity = [line for line in r.stdout.splitlines() if PARITY_LINE.match(line)]
    foreign = [line for line in r.stderr.splitlines() if line.strip() and not OWN_LINE.match(line)]
    return {"command": "opbridge check", "passed": r.returncode == 0, "returncode": r.returncode,
            "parity": parity[-1] if parity else None, "foreign_stderr": foreign[:20]}


def run_release(version: str, root: Path, source: Path, commit: str, tests: list[str], keep: bool) -> dict:
    folder = root / f"torch-{version}"
    if folder.exists():
        shutil.rmtree(folder)
    row: dict = {"requested": version, "date": datetime.date.today().isoformat(), "commit": commit,
                 "test_files": tests}
    try:
        python, info = install(version, folder, source)
        row.update(info)
        with tempfile.TemporaryDirectory(prefix="torch-matrix-") as work:
            row["tests"] = run_tests(python, source, tests, Path(work))
        row["main"] = main_command(python, source)
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        row["error"] = str(e)[:600]
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS), help="torch releases, oldest first")
    parser.add_argument("--tests", nargs="+", default=list(TESTS), help="test files run in each venv")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the result")
    parser.add_argument("--venvs", default=None, help="folder for the per-release venvs (default: cache)")
    parser.add_argument("--keep", action="store_true", help="keep each venv (several GB) after its run")
    args = parser.parse_args(argv)
    root = Path(args.venvs) if args.venvs else cache_folder("torch-matrix")
    root.mkdir(parents=True, exist_ok=True)
    out = Path(args.json)
    # NOTE: a release measured earlier stays in the JSON unless measured again (one release per run is fine)
    previous = {r["requested"]: r for r in json.loads(out.read_text())["releases"]} if out.exists() else {}
    with tempfile.TemporaryDirectory(prefix="torch-matrix-src-") as tmp:
        source = Path(tmp) / "opbridge"
        commit = snapshot(source)
        result = {"tests": args.tests, "python": sys.version.split()[0], "releases": []}
        for version in args.versions:
            previous[version] = run_release(version, root, source, commit, args.tests, args.keep)
            result["releases"] = sorted(previous.values(), key=lambda r: _key(r["requested"]))
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
            print(f"torch {version}: done ({out})", flush=True)
    print(render(result))
    return result


def _key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", version))


if __name__ == "__main__":
    main(sys.argv[1:])
