"""The opbridge CLI, through a subprocess as a user runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=600)


def test_ops_lists_the_five_seed_ops():
    r = run("ops")
    assert r.returncode == 0, r.stderr
    for name in ("bev::bev_pool_v2", "opbridge::identity_conv", "opbridge::crop", "opbridge::paste",
                 "opbridge::numpy_sin"):
        assert name in r.stdout
    assert "5 ops registered" in r.stdout
    data = json.loads(run("ops", "--json").stdout)
    bev = next(d for d in data if d["op"] == "bev::bev_pool_v2")
    assert bev["tiers"]["function"] and bev["attributes"] == {"bev_feat_shape": "INTS"} and bev["autograd"]


def test_export_run_check_on_the_demo(tmp_path):
    onnx_path = tmp_path / "demo.onnx"
    r = run("export", "-o", str(onnx_path))
    assert r.returncode == 0, r.stderr
    assert onnx_path.exists() and (tmp_path / "demo.inputs.npz").exists()
    assert "torch.export done" in r.stderr  # progress lines
    r = run("run", str(onnx_path))
    assert r.returncode == 0, r.stderr
    assert "shape [1, 8, 32, 32] float32" in r.stdout
    r = run("-q", "check", "--json", str(tmp_path / "report.json"), "--plot", str(tmp_path / "errors.png"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "[run 3]" in r.stdout and "1 passed, 0 failed" in r.stdout
    assert r.stderr == ""
    report = json.loads((tmp_path / "report.json").read_text())
    assert report[0]["passed"] and len(report[0]["outputs"]) == 3
    assert (tmp_path / "errors.png").read_bytes()[:4] == b"\x89PNG"


def test_check_one_op(tmp_path):
    r = run("-q", "check", "--op", "opbridge::crop")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") >= 15 and "15 passed, 0 failed" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (("run", "missing.onnx", "--inputs", "x.npz"), "no inputs for missing.onnx"),
    (("check", "--model", "nomodule"), "--model must be MODULE:FACTORY"),
    (("check", "--op", "bev::bev_pool"), "Did you mean bev::bev_pool_v2"),
    (("--ops", "no_such_module", "ops"), "cannot import op module 'no_such_module'"),
])
def test_errors_are_messages_not_tracebacks(args, needle, tmp_path):
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_run_on_a_corrupt_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    (tmp_path / "x.npz").write_bytes(b"")
    r = run("run", str(bad), "--inputs", str(tmp_path / "x.npz"))
    assert r.returncode == 2 and "not a readable ONNX model" in r.stderr
