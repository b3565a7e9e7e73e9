"""Docs are runnable: module docstring examples, the add-your-own-op walkthrough and the bridging
examples (with stand-ins for the packages they bridge); every block runs in tests/test_doc_blocks.py."""

import doctest
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import forkserver
import pytest
from test_doc_blocks import doc_block

ROOT = Path(__file__).resolve().parents[1]
# NOTE: every library and seed-op module whose docstrings hold an example (``>>>``) runs it
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for package in ("bridge", "exporters", "ort_kernels", "custom_ops")
                 for p in (ROOT / package).rglob("*.py") if ">>>" in p.read_text())


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has '>>>' but no example doctest runs"


def test_readme_user_op_walkthrough(tmp_path):
    code = doc_block("# my_ops.py").code
    (tmp_path / "my_ops.py").write_text(code)
    written = [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(written) == 8  # the count the README states
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    # NOTE: the parity checks of the walkthrough run as its own blocks: tests/test_doc_blocks.py
    r = forkserver.run(["-m", "bridge", "--ops", "my_ops", "ops"],
                       env=env, cwd=tmp_path, timeout=600)
    assert "mine::clamp_scale" in r.stdout and "6 ops registered" in r.stdout
    assert "note: mine::clamp_scale" not in r.stdout  # nothing missing


def _readme_block(first_line: str) -> str:
    return doc_block(first_line).code.split("\n", 1)[1]


def _user_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]


@pytest.mark.long
def test_readme_bridges_a_packages_custom_op(tmp_path):
    code = _readme_block("# bridge_swish.py")
    assert len(_user_lines(code)) <= 15
    (tmp_path / "bridge_swish.py").write_text(code)
    (tmp_path / "vendor_pkg.py").write_text((ROOT / "tests/vendor/py_ops.py").read_text())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    r = forkserver.run(["bridge_swish.py"], env=env, cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| PASS" in r.stdout


@pytest.mark.long
def test_readme_bridges_a_cpp_torch_library_op(tmp_path):
    from vendor import cpp_ops

    code = _readme_block("# bridge_scale_shift.py")
    assert len(_user_lines(code)) <= 15
    (tmp_path / "build").mkdir()
    shutil.copy(cpp_ops.build(), tmp_path / "build" / "libvendorcpp.so")
    (tmp_path / "bridge_scale_shift.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = forkserver.run(["bridge_scale_shift.py"], env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| PASS" in r.stdout and "max abs" in r.stdout


def _scatter_readme(tmp_path, stand_in: bool) -> subprocess.CompletedProcess:
    code = _readme_block("# bridge_scatter.py")
    assert len(_user_lines(code)) <= 15
    paths = [str(ROOT)]
    if stand_in:
        # NOTE: the stand-in library registers the same way under another namespace
        code = code.replace("torch_scatter::", "legacy_scatter::").replace("torch.ops.torch_scatter",
                                                                           "torch.ops.legacy_scatter")
        (tmp_path / "torch_scatter.py").write_text("from vendor import legacy_ops\nlegacy_ops.load()\n")
        paths += [str(tmp_path), str(ROOT / "tests")]
    else:
        paths += [str(REAL_TORCH_SCATTER)]
    (tmp_path / "bridge_scatter.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    return forkserver.run(["bridge_scatter.py"], env=env,
                          cwd=tmp_path, timeout=600)


@pytest.mark.long
def test_readme_bridges_a_torch_scatter_style_op(tmp_path):
    r = _scatter_readme(tmp_path, stand_in=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| PASS" in r.stdout


REAL_TORCH_SCATTER = Path(os.environ.get("OPBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "opbridge") / \
    "torch_scatter-2.1.2"


@pytest.mark.slow
def test_readme_bridges_the_real_torch_scatter(tmp_path):
    # NOTE: builds torch-scatter 2.1.2 from source once (minutes), against this torch: no other torch
    # is pulled (--no-build-isolation, --no-deps); cached in the project's cache folder
    if not (REAL_TORCH_SCATTER / "torch_scatter").is_dir():
        sdist = tmp_path / "sdist"
        pip = [sys.executable, "-m", "pip"]
        got = subprocess.run(pip + ["download", "torch-scatter==2.1.2", "--no-binary", ":all:", "--no-deps",
                                    "--no-build-isolation", "-d", str(sdist)],
                             capture_output=True, text=True, timeout=600)
        assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
        built = subprocess.run(pip + ["install", "--no-build-isolation", "--no-deps", "--no-index", "--target",
                                      str(REAL_TORCH_SCATTER), *map(str, sdist.glob("torch_scatter-*.tar.gz"))],
                               capture_output=True, text=True, env=dict(os.environ, FORCE_ONLY_CPU="1"), timeout=3600)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    r = _scatter_readme(tmp_path, stand_in=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| PASS" in r.stdout
    # torch-scatter's own Python API: scatter_max calls the C++ op (values, int64 argmax)
    code = f"""
import json, sys, torch
sys.path[:0] = [{str(ROOT)!r}, {str(REAL_TORCH_SCATTER)!r}]
import bridge, torch_scatter
def fake(src, index, dim, out, dim_size):
    shape = list(src.shape); shape[dim] = dim_size
    return src.new_empty(shape), index.new_empty(shape)
bridge.register("torch_scatter::scatter_max", fake=fake,
                names={{"_0": "src", "_1": "index", "_2": "dim", "_3": "out", "_4": "dim_size"}})
class Model(torch.nn.Module):
    def forward(self, src, index):
        return torch_scatter.scatter_max(src, index, dim=0, dim_size=6)
points = {{0: torch.export.Dim("points")}}
args = (torch.randint(-3, 4, (17, 3)).float(), torch.randint(0, 5, (17,)))
proto = bridge.export(Model(), args, dynamic_shapes=(points, points))
report = bridge.check_parity(Model(), args, dynamic_shapes=(points, points), tier="python")
print(json.dumps({{"nodes": [(n.domain, n.op_type) for n in proto.graph.node if n.domain], "passed": report.passed,
                  "argmax_exact": report.outputs[1].max_abs == 0.0, "text": str(report)}}))
"""
    r = forkserver.run(["-c", code], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["nodes"] == [["torch_scatter", "scatter_max"]]
    assert out["passed"] and out["argmax_exact"], out["text"]
    # plain onnxruntime through the function bodies of tests/test_proxy_ops.py, in torch_scatter's domain
    code = f"""
import sys, torch
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}, {str(REAL_TORCH_SCATTER)!r}]
import bridge, torch_scatter
import test_proxy_ops as t
t.bridge_scatter(ns="torch_scatter")
class Pool(torch.nn.Module):
    def forward(self, src, index):
        total = torch.ops.torch_scatter.scatter_sum(src, index, 0, None, t.TARGETS)
        best, arg = torch_scatter.scatter_max(src, index, dim=0, dim_size=t.TARGETS)
        return total * 2 + best, arg
report = bridge.check_parity(Pool(), t.inputs(23, 1), dynamic_shapes=t.DYNAMIC, extra_args=(t.inputs(4, 2),),
                             tier="function")
assert report.passed and report.outputs[1].max_abs == 0.0, report
print("function tier", report.passed)
"""
    r = forkserver.run(["-c", code], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "function tier True" in r.stdout


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    (install_and_test,) = [line for line in readme.splitlines() if line.startswith("python3 -m venv")
                           and "pytest" in line]
    readme_pytest = install_and_test.split("&& ")[-1]
    ci_pytest = next(line for line in (ROOT / ".ci/run").read_text().splitlines() if "-m pytest" in line)
    # CI adds only -p no:cacheprovider (nothing written into the clean clone)
    assert ci_pytest.replace(" -p no:cacheprovider", "") == readme_pytest, (ci_pytest, readme_pytest)


# -- every module path the docs name imports -----------------------------------------------------------------
_PROJECT = ("bridge", "exporters", "ort_kernels", "custom_ops")
_DOTTED = re.compile(r"(?<![\w./-])bridge(?:\.[A-Za-z_]\w*)+")
_FROM_IMPORT = re.compile(rf"\bfrom\s+((?:{'|'.join(_PROJECT)})(?:\.\w+)*)\s+import\s+(\w+)")


def _named_paths() -> list[str]:
    """Every ``bridge.x[.y...]`` and project ``from X import Y`` named in README.md and docs/*.md."""
    found: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        found |= {m.rstrip(".") for m in _DOTTED.findall(text)}
        found |= {f"from {m} import {n}" for m, n in _FROM_IMPORT.findall(text)}
    return sorted(found)


@pytest.mark.parametrize("path", _named_paths())
def test_every_module_path_the_docs_name_imports(path):
    """As a user writes it: ``from X import Y``, and for a dotted name, ``import`` of each module on the
    way (the README's ``bridge.testing.ModelCase`` must also be ``from bridge.testing import ModelCase``)."""
    if path.startswith("from "):
        exec(path, {})
        return
    parts = path.split(".")
    value = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=2):
        try:
            value = getattr(value, part)
        except AttributeError:  # NOTE: a submodule not imported yet: the dotted path names a module
            value = importlib.import_module(".".join(parts[:i]))
        if isinstance(value, types.ModuleType):
            module = ".".join(parts[:i])
            exec(f"import {module}", {})
            exec(f"from {'.'.join(parts[:i - 1])} import {part}", {})
            assert importlib.import_module(module) is value, module
