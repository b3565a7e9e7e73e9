"""The torch releases opbridge admits: the range in pyproject.toml, the README's torch matrix, and
(slow) that installing opbridge keeps the torch a venv already holds."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: the test extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import doc_markers  # noqa: E402
import torch_matrix  # noqa: E402
import torch_matrix_table  # noqa: E402

# NOTE: the releases people run (the newest four with torch.library.custom_op and the dynamo exporter)
SUPPORTED = ("2.12.0", "2.12.1", "2.13.0", "2.13.0+cpu", "2.14.1", "2.15.0")


def torch_requirement() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    assert len(found) == 1, deps
    return found[0]


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_supported_torch_release_satisfies_the_requirement(version):
    assert torch_requirement().specifier.contains(Version(version)), (version, str(torch_requirement()))


def test_the_requirement_has_an_upper_bound_and_excludes_untested_majors():
    spec = torch_requirement().specifier
    assert not spec.contains(Version("3.0.0")) and not spec.contains(Version("2.0.0"))


def test_the_matrix_measures_exactly_the_supported_releases():
    assert set(torch_matrix.VERSIONS) <= set(SUPPORTED)
    assert {Version(v).release[:2] for v in torch_matrix.VERSIONS} == {Version(v).release[:2] for v in SUPPORTED}


def test_readme_table_is_the_committed_torch_matrix_result():
    result = json.loads(torch_matrix_table.DEFAULT_JSON.read_text())
    page = doc_markers.page_with(torch_matrix_table.BLOCK).read_text()
    assert doc_markers.section(page, torch_matrix_table.BLOCK) == torch_matrix_table.render(result)
    measured = {Version(r["requested"]).release[:2] for r in result["releases"]}
    assert measured >= {(2, 12), (2, 13), (2, 14), (2, 15)}, measured


def test_junit_counts_match_what_pytest_ran(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok(): assert 1\n"
        "def test_ok_too(): assert 2\n"
        "def test_bad(): assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.xfail\n"
        "def test_known(): assert 0\n"
        "@pytest.mark.skip\n"
        "def test_later(): pass\n")
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                    str(tmp_path / "test_sample.py")], cwd=tmp_path, capture_output=True, timeout=120)
    result = torch_matrix.read_junit(junit)
    assert {k: result[k] for k in ("passed", "failed", "xfailed", "skipped")} == \
        {"passed": 2, "failed": 1, "xfailed": 1, "skipped": 1}
    [(test_id, first_line)] = result["failures"].items()
    assert test_id.endswith("::test_bad") and "one is not two" in first_line


def test_table_row_names_failures_and_foreign_stderr_without_its_glog_prefix():
    release = {"requested": "2.14.1", "torch": "2.14.1+cu130", "torch_after_opbridge": "2.14.1+cu130",
               "date": "2026-11-25", "commit": "0123456789abcdef", "test_files": ["tests/test_cli.py"],
               "tests": {"passed": 7, "failed": 1, "xfailed": 0, "skipped": 0,
                         "failures": {"tests/test_cli.py::test_quiet": "assert 'W' == ''"}},
               "main": {"passed": True, "parity": "1 passed, 0 failed",
                        "foreign_stderr": ["W1125 20:55:21.483000 32751 torch/x.py:1] No CUDA runtime is found"]}}
    row = torch_matrix_table.row(release)
    assert row == ("| 2.14.1+cu130 | yes | 7 passed, 1 failed | `test_quiet` | pass (1 passed, 0 failed) "
                   "| `torch/x.py:1] No CUDA runtime is found` |")
    replaced = dict(release, torch_after_opbridge="2.13.0+cpu")
    assert "**no** (2.14.1+cu130 -> 2.13.0+cpu)" in torch_matrix_table.row(replaced)


def _probe_wheel(folder: Path, name: str, version: str) -> None:
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


def test_the_matrix_lifts_a_constraint_file_from_pips_configuration(tmp_path):
    """As this machine's /etc/xdg/pip caps torch: a pip.conf naming a constraint file that caps a package."""
    (tmp_path / "wheels").mkdir()
    _probe_wheel(tmp_path / "wheels", "opbridgecapprobe", "2.0")
    (tmp_path / "cap.txt").write_text("opbridgecapprobe<=1.0\n")
    (tmp_path / "pip.conf").write_text(f"[global]\nconstraint = {tmp_path / 'cap.txt'}\n")
    base = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}
    base["PIP_CONFIG_FILE"] = str(tmp_path / "pip.conf")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps",
           "--find-links", str(tmp_path / "wheels"), "opbridgecapprobe==2.0"]
    capped = subprocess.run(cmd, env=base, capture_output=True, text=True, timeout=300)
    assert capped.returncode != 0 and "opbridgecapprobe<=1.0" in capped.stdout + capped.stderr
    lifted = subprocess.run(cmd, env=torch_matrix.pip_env(base), capture_output=True, text=True, timeout=300)
    assert lifted.returncode == 0 and "Would install opbridgecapprobe-2.0" in lifted.stdout, lifted.stderr[-500:]
    assert base["PIP_CONFIG_FILE"] == str(tmp_path / "pip.conf") and "PIP_CONSTRAINT" not in base


@pytest.mark.slow
def test_installing_opbridge_keeps_the_installed_torch(tmp_path):
    """torch 2.14.1 (the CUDA build on this machine's disk, ~5.4 GB, minutes) first, then opbridge."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "torch==2.14.1"], check=True, timeout=3600)
    before = torch_matrix.torch_version(Path(python))
    assert Version(before).base_version == "2.14.1", before  # "2.14.1+cu130": the CUDA build
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", str(ROOT)], check=True, timeout=3600, cwd=tmp_path)
    assert torch_matrix.torch_version(Path(python)) == before
