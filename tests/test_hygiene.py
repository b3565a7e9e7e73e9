"""The library type-checks under mypy and the tree passes ruff, with the settings of pyproject.toml."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mypy_finds_no_errors_in_the_library():
    result = _run("mypy", "bridge", "exporters", "ort_kernels")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_finds_nothing_in_the_tree():
    result = _run("ruff", "check", "--no-fix", "--output-format", "concise",
                  "bridge", "exporters", "ort_kernels", "custom_ops", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr
