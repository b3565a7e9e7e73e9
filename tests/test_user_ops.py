"""A user's own op, from its own folder: --ops by name or path, native= relative to the module,
optional inputs in every tier, readable names, the deployable library, clear errors."""

import json
import os
import shutil
import warnings
from pathlib import Path

import forkserver
import numpy as np
import onnx
import pytest
import torch
from test_doc_blocks import doc_block

import bridge
import custom_ops.demo as demo

ROOT = Path(__file__).resolve().parents[1]


def opbridge(*args, cwd):
    """``opbridge -q ARGS`` in a fresh process (the user's module registers its ops in that process)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return forkserver.run(["-m", "bridge", "-q", *args], cwd=cwd, env=env, timeout=600)


def _readme_block(start: str, fence: str) -> str:
    return doc_block(start, fence).code


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory):
    """A folder holding only the README's my_ops.py (plus its register_native line), clamp_scale.cc
    and a model module."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "my_ops.py").write_text(_readme_block("# my_ops.py", "python")
                                      + 'clamp_scale_op.register_native("clamp_scale.cc")\n')
    (folder / "clamp_scale.cc").write_text(_readme_block("// clamp_scale.cc: the native kernel of mine::clamp_scale",
                                                         "cpp"))
    (folder / "my_model.py").write_text(
        "import torch, bridge, my_ops\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.ops.mine.clamp_scale(x, -0.25, 0.5) * 2\n"
        "def case():\n"
        "    return bridge.ModelCase(M(), (torch.randn(3, 7),))\n")
    return folder


def test_user_op_passes_in_the_native_tier_from_its_own_folder(user_folder):
    r = opbridge("--ops", "my_ops", "check", "--op", "mine::clamp_scale", "--tier", "native", cwd=user_folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed, 0 failed" in r.stdout  # float32 and float64


def test_user_op_by_path_from_another_folder(user_folder, tmp_path):
    path = str(user_folder / "my_ops.py")
    r = opbridge("--ops", path, "check", "--op", "mine::clamp_scale", "--tier", "native", cwd=tmp_path)
    assert r.returncode == 0 and "2 passed, 0 failed" in r.stdout, r.stdout + r.stderr
    r = opbridge("--ops", path, "check", "--model", "my_model:case", "--tier", "native", cwd=user_folder)
    assert r.returncode == 0 and "1 passed, 0 failed" in r.stdout, r.stdout + r.stderr


@pytest.mark.long
def test_user_library_is_deployable_with_a_manifest(user_folder, tmp_path):
    r = opbridge("--ops", "my_ops", "build", "-o", str(tmp_path / "dist"), cwd=user_folder)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "dist" / "manifest.json").read_text())
    ops = {o["op"]: o for o in manifest["ops"]}
    assert ops["mine::clamp_scale"]["dtypes"] == ["float32", "float64"] and "bev::bev_pool_v2" in ops
    assert manifest["onnxruntime_c_api"] == 17 and (tmp_path / "dist" / manifest["library"]).is_file()
    r = opbridge("--ops", "my_ops", "doctor", cwd=user_folder)
    assert "mine::clamp_scale v1 float32,float64" in r.stdout, r.stdout


def test_import_errors_show_the_modules_own_error(tmp_path):
    (tmp_path / "broken_ops.py").write_text("import torch\nraise RuntimeError('my own failure')\n")
    for spec in ("broken_ops", str(tmp_path / "broken_ops.py")):
        r = opbridge("--ops", spec, "ops", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert "RuntimeError: my own failure" in r.stderr and "broken_ops.py:2" in r.stderr, r.stderr
    r = opbridge("--ops", "missing/ops.py", "ops", cwd=tmp_path)
    assert r.returncode == 2 and "no op module file at 'missing/ops.py'" in r.stderr


def test_missing_native_file_is_named_at_declaration(tmp_path):
    (tmp_path / "bad_native.py").write_text(
        "import torch, bridge\n"
        "@bridge.op('badnat::f', fake=lambda x: torch.empty_like(x), native='nowhere.cc')\n"
        "def f(x: torch.Tensor) -> torch.Tensor:\n    return x.clone()\n")
    r = opbridge("--ops", "bad_native", "ops", cwd=tmp_path)
    assert r.returncode == 2 and "native kernel source not found" in r.stderr
    assert str(tmp_path / "nowhere.cc") in r.stderr


@pytest.mark.parametrize("tier", bridge.TIERS)
def test_optional_input_omitted_and_given_in_every_tier(tier, tmp_path):
    folder = tmp_path / "opt"
    shutil.copytree(ROOT / "tests" / "user_ops", folder)
    r = opbridge("--ops", str(folder / "optional_ops.py"), "check", "--op", "optdemo::clip_min", "--tier", tier,
                 cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lo_omitted" in r.stdout and "lo_given" in r.stdout and "2 passed, 0 failed" in r.stdout


def test_dims_take_their_dim_names_and_io_names_are_given():
    case = demo.build()
    names = ["images", "rd", "rf", "rb", "starts", "lengths"]
    proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes, input_names=names,
                          output_names=["bev"])
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    assert dims["rd"] == ["points"] and dims["starts"] == ["intervals"] and dims["images"] == [1, 6, 3, 8, 22]
    assert [o.name for o in proto.graph.output] == ["bev"]
    onnx.checker.check_model(proto, full_check=True)
    with pytest.raises(bridge.OpBridgeError, match="output_names must name each of the model's 1 graph outputs"):
        bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes, output_names=["a", "b"])


def test_training_mode_layers_warn_at_export():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5))
    with pytest.warns(UserWarning, match=r"draws random numbers.*1 \(Dropout\) is in training mode.*"
                                         r"Call model.eval\(\)"):
        bridge.export(model, (torch.randn(2, 3),))
    # a BatchNorm draws nothing: the warning names the layer and claims no eval behaviour
    norm = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    with pytest.warns(UserWarning, match=r"1 \(BatchNorm1d\) is in training mode: the file computes what "
                                         r"torch.export traced in that mode \(not necessarily eval behaviour"):
        bridge.export(norm, (torch.randn(2, 3),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bridge.export(model.eval(), (torch.randn(2, 3),))


def test_integer_mismatch_reports_absolute_differences_and_counts():
    row = bridge.compare("idx", torch.tensor([0, 5, 2]), np.array([0, 4, 2], np.int64))
    assert not row.passed and row.mismatches == 1 and row.max_abs == 1.0
    table = str(bridge.ParityReport("m", "function", [row]))
    assert "1/3" in table and "e+30" not in table
    assert json.loads(bridge.ParityReport("m", "function", [row]).to_json())["outputs"][0]["max_rel"] is None


def _op_file(path: Path, qualname: str, extra: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"import torch, bridge\n{extra}"
                    f"@bridge.op({qualname!r}, fake=lambda x: torch.empty_like(x))\n"
                    "def f(x: torch.Tensor) -> torch.Tensor:\n    return x + 1\n")


def test_ops_path_loads_exactly_that_file(tmp_path):
    """--ops PATH.py runs that file, also when its name is taken: json.py (the standard library's json is
    imported already) and two files both named ops.py; each registers its own op."""
    _op_file(tmp_path / "a" / "ops.py", "shadowa::f")
    _op_file(tmp_path / "b" / "ops.py", "shadowb::f")
    _op_file(tmp_path / "c" / "json.py", "shadowc::f")
    r = opbridge("--ops", "a/ops.py", "--ops", "b/ops.py", "--ops", "c/json.py", "ops", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = {o["op"] for o in json.loads(r.stdout)}
    assert {"shadowa::f", "shadowb::f", "shadowc::f"} <= names, names


def test_ops_module_that_exits_at_import_is_an_error(tmp_path):
    """A module-level argparse that exits (a required option), in a file whose name another module holds:
    one error line naming the exit, exit status 2, no op table."""
    for path in (tmp_path / "b" / "ops.py", tmp_path / "c" / "json.py"):
        _op_file(path, f"exits{path.parent.name}::f", extra="import argparse\nparser = argparse.ArgumentParser()\n"
                 "parser.add_argument('--size', required=True)\nparser.parse_args()\n")
        r = opbridge("--ops", str(path.relative_to(tmp_path)), "ops", cwd=tmp_path)
        assert r.returncode == 2 and "ops registered" not in r.stdout, r.stdout + r.stderr
        assert "exited while being imported (sys.exit(2)" in r.stderr and "--size" in r.stderr, r.stderr
