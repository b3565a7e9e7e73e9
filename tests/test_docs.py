"""Docs are runnable: module docstring examples and the README's add-your-own-op walkthrough."""

import doctest
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["bridge", "bridge.checks", "bridge.errors", "bridge.dtypes", "bridge.domains", "bridge.progress", "bridge.registry",
           "bridge.opdef", "bridge.sessions", "ort_kernels.tiers", "exporters.translation",
           "bridge.parity", "bridge.localize", "bridge.testing", "custom_ops.demo", "exporters.export",
           "exporters.derive"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL)
    assert result.failed == 0
    if name not in ("bridge.errors",):
        assert result.attempted > 0 or name in ("bridge",), f"{name} has no runnable example"


def test_readme_user_op_walkthrough(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n# my_ops.py\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "my_ops.py").write_text(code)
    written = [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(written) == 8  # the count the README states
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    r = subprocess.run([sys.executable, "-m", "bridge", "-q", "--ops", "my_ops", "check", "--op", "mine::clamp_scale"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed, 0 failed" in r.stdout
    r = subprocess.run([sys.executable, "-m", "bridge", "-q", "--ops", "my_ops", "check", "--op", "mine::clamp_scale",
                        "--tier", "python"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0 and "1 passed, 0 failed" in r.stdout, r.stdout + r.stderr  # float32 only
    r = subprocess.run([sys.executable, "-m", "bridge", "--ops", "my_ops", "ops"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert "mine::clamp_scale" in r.stdout and "6 ops registered" in r.stdout
    assert "note: mine::clamp_scale" not in r.stdout  # nothing missing


def test_readme_use_example_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Use\n\n```python\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "use.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "use.py"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| PASS" in r.stdout and (tmp_path / "bev.onnx").exists()


def _readme_block(first_line: str) -> str:
    readme = (ROOT / "README.md").read_text()
    return re.search(r"```python\n" + re.escape(first_line) + r"\n(.*?)```", readme, re.S).group(1)


def _user_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_readme_bridges_a_packages_custom_op(tmp_path):
    code = _readme_block("# bridge_swish.py")
    assert len(_user_lines(code)) <= 15
    (tmp_path / "bridge_swish.py").write_text(code)
    (tmp_path / "vendor_pkg.py").write_text((ROOT / "tests/vendor/py_ops.py").read_text())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    r = subprocess.run([sys.executable, "bridge_swish.py"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| PASS" in r.stdout


def test_readme_bridges_a_cpp_torch_library_op(tmp_path):
    from vendor import cpp_ops

    code = _readme_block("# bridge_scale_shift.py")
    assert len(_user_lines(code)) <= 15
    (tmp_path / "build").mkdir()
    shutil.copy(cpp_ops.build(), tmp_path / "build" / "libvendorcpp.so")
    (tmp_path / "bridge_scale_shift.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "bridge_scale_shift.py"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| PASS" in r.stdout and "max abs" in r.stdout
