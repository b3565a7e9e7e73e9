"""Install hints that work for the way opbridge was installed (issue #45): opbridge is not on PyPI, so
``pip install 'opbridge[python-tier]'`` fails; a hint names the checkout (editable), the wheel, or the
extra's own packages."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.core.basics import installed
from bridge.tools import openvino_runtime
from ort_kernels import python_tier

ROOT = Path(__file__).resolve().parents[1]


def test_each_install_kind_gets_a_line_that_works(tmp_path):
    editable = {"url": (tmp_path / "my checkout").as_uri(), "dir_info": {"editable": True}}
    assert installed.install_line("python-tier", editable, python="py", packages=["x>=1"]) == \
        f'py -m pip install -e "{tmp_path}/my checkout[python-tier]"'
    wheel = tmp_path / "opbridge-0.1.0-py3-none-any.whl"
    record = {"url": wheel.as_uri(), "archive_info": {}}
    # a wheel file gone since: the extra's packages
    assert installed.install_line("plot", record, python="py", packages=["matplotlib>=3.8"]) == \
        'py -m pip install "matplotlib>=3.8"'
    wheel.write_bytes(b"")
    assert installed.install_line("plot", record, python="py", packages=["matplotlib>=3.8"]) == \
        f'py -m pip install "{wheel}[plot]"'
    assert installed.install_line("openvino", None, python="py", packages=["openvino<2027,>=2026.4.1"]) == \
        'py -m pip install "openvino<2027,>=2026.4.1"'


def test_this_install_is_the_editable_checkout():
    # the test set-up is `pip install -e ".[test]"` in this checkout
    assert installed.pip_line("python-tier") == f'{sys.executable} -m pip install -e "{ROOT}[python-tier]"'
    assert installed.extra_packages("python-tier") == ["onnxruntime-extensions<0.16,>=0.15.2"]


@pytest.mark.parametrize("message", [
    lambda: python_tier.PythonTier().missing(None),
    lambda: openvino_runtime.missing(),
])
def test_missing_package_messages_give_the_line(message, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("onnxruntime_extensions", "openvino") else real(name, *a))
    text = message()
    assert "'opbridge[" not in text and f'`{sys.executable} -m pip install -e "{ROOT}[' in text, text


def test_no_message_or_page_says_pip_install_opbridge_extra():
    r = subprocess.run(["git", "grep", "-n", "-E", r"pip install '?\"?opbridge\[", "--", "bridge", "exporters",
                        "ort_kernels", "README.md", "docs"], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout == "", r.stdout
