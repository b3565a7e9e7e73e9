"""Packaging: the wheel builds without a setuptools warning and holds every module, the C++ sources the
native tier and the identity_conv op compile at run time, the LICENSE and the SPDX license metadata; the sdist
is the whole tree, its tests importable."""

import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bridge", "custom_ops", "exporters", "ort_kernels")
DATA = ("ort_kernels/cpu/*.cc", "ort_kernels/include/*.h", "ort_kernels/include/host/*.h", "ort_kernels/register.cc",
        "custom_ops/csrc/*.cpp")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # NOTE: without PYTHONDONTWRITEBYTECODE, which only makes distutils say "byte-compiling is disabled"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(ROOT)],
                       capture_output=True, text=True, env=env, timeout=600)
    print(f"wheel built in {time.perf_counter() - start:.1f} s")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = out.glob("opbridge-*.whl")
    return path, r.stdout + r.stderr


def test_wheel_build_prints_no_setuptools_warning(wheel):
    _, log = wheel
    assert "Running command Building wheel" in log  # the backend's output is in the log (-v)
    # NOTE: pip's own "WARNING: ..." lines (index configuration) are not the build's
    warnings = [line for line in log.splitlines()
                if re.search(r"[Ww]arning|!!", line) and not line.startswith("WARNING:")]
    assert warnings == []


def test_wheel_holds_modules_sources_and_license(wheel):
    path, _ = wheel
    names = set(zipfile.ZipFile(path).namelist())
    modules = {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    data = {p.relative_to(ROOT).as_posix() for pattern in DATA for p in ROOT.glob(pattern)}
    assert len(data) >= 13 and "ort_kernels/include/host/ort_host_decl.h" in data
    assert modules <= names and data <= names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]
    (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    assert zipfile.ZipFile(path).read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    metadata = zipfile.ZipFile(path).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert {"Homepage", "Documentation", "Source", "Issues"} == set(re.findall(r"^Project-URL: (\w+), ", metadata,
                                                                               re.M))


def test_license_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "Copyright 2026 opbridge authors" in text
    assert len(re.findall(r"^\s+\d+\. [A-Z]", text, re.M)) == 9  # the nine numbered sections


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    out = tmp_path_factory.mktemp("sdist")
    r = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                        "print(build_meta.build_sdist(sys.argv[1]))", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = out.glob("opbridge-*.tar.gz")
    with tarfile.open(path) as tar:
        tar.extractall(out / "x", filter="data")
    (tree,) = (out / "x").iterdir()
    return tree


def test_sdist_is_the_whole_tree(sdist):
    """An sdist whose tests run: every tracked file is in it (tests/conftest.py, the helpers, tests/user_ops,
    and the pages, benchmarks and examples the tests read)."""
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    shipped = {p.relative_to(sdist).as_posix() for p in sdist.rglob("*") if p.is_file()}
    missing = sorted(set(tracked) - shipped - {".gitignore"})
    assert missing == [], missing
    assert not [n for n in shipped if "__pycache__" in n or n.endswith(".pyc")]


def test_sdist_tests_import(sdist):
    env = dict(os.environ, PYTHONPATH=str(sdist))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                       capture_output=True, text=True, cwd=sdist, env=env, timeout=600)
    assert r.returncode == 0 and " tests collected" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert "error" not in r.stdout.splitlines()[-1], r.stdout[-3000:]
