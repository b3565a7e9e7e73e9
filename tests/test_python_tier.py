"""Python kernel tier through onnxruntime-extensions: parity, and every known failure guarded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bridge
import custom_ops.demo as demo

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def guards():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(ROOT / "tests/scripts/python_tier_guards.py")], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, f"the guard run died (rc={r.returncode}):\n{r.stderr[-3000:]}"
    return {d.pop("case"): d for d in map(json.loads, r.stdout.splitlines())}


def test_kernel_exception_is_a_python_error_not_an_abort(guards):
    err = guards["kernel_exception"]
    assert not err["ok"] and err["type"] == "OpBridgeError"
    assert "bev::bev_pool_v2: the Python kernel raised CheckError" in err["error"]
    assert "input 'ranks_depth' values must lie in [0, 120)" in err["error"]
    assert guards["after_exception"] == guards["valid"] and guards["valid"]["ok"]


@pytest.mark.parametrize("case,dtype", [("float16", "float16"), ("float64", "float64")])
def test_other_dtypes_run_and_equal_eager_exactly(guards, case, dtype):
    """float16 crosses onnxruntime-extensions as float32 (its float16 inputs abort the process) and the
    op runs in float16: the result equals eager float16 bit for bit; float64 runs as it is."""
    got = guards[case]
    assert got["ok"], got
    assert got["value"]["dtype"] == dtype and got["value"]["equal"], got


def test_op_declared_after_the_library_is_registered_runs(guards):
    """An op registered after the first python-tier session runs in a fresh session (its PyOp goes in
    a new generation of private domains); options that got the kernels before it are refused,
    naming the fix; the process keeps serving the first model."""
    assert guards["declared_after_register"] == {"ok": True, "value": [0.0, 2.0, 4.0]}
    err = guards["declared_after_register_reused_options"]
    assert err["type"] == "UnsupportedInTier" and "late::twice" in err["error"], err
    assert "Pass new SessionOptions" in err["error"] and "restart" not in err["error"]
    assert guards["process_still_serves"] == guards["valid"]


def test_demo_runs_in_the_python_tier():
    case = demo.build()
    report = bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes, tier="python")
    assert report.passed, report


def test_list_attributes_travel_as_strings_and_defaults_are_written():
    crop = bridge.REGISTRY.get("opbridge::crop")
    from bridge.tools.testing import OpModule

    module, tensors = OpModule.from_sample(crop, bridge.SampleInput((torch.randn(1, 5, 5), [-1, 1, 3, 4])))
    report = bridge.check_parity(module, tensors, tier="python", rtol=0, atol=0)
    assert report.passed and report.outputs[0].shape == (1, 3, 4)


RUN_METHODS = ("run_with_ort_values", "run_with_iobinding", "run_with_ortvaluevector", "run_async")


@pytest.mark.parametrize("method", RUN_METHODS)
def test_every_run_method_raises_the_kernel_error(guards, method):
    """Not only run(): each run method of a python-tier session raises the kernel's error (once they
    returned empty (0,) outputs without a word); run_async hands the same text to its callback."""
    assert guards[f"{method}_valid"] == guards["valid"] and guards["valid"]["ok"]
    err = guards[f"{method}_kernel_exception"]
    assert not err["ok"], err
    assert err["type"] == ("RuntimeError" if method == "run_async" else "OpBridgeError")
    assert "bev::bev_pool_v2: the Python kernel raised CheckError" in err["error"]
    assert "input 'ranks_depth' values must lie in [0, 120)" in err["error"]
    if method == "run_async":
        assert err["error"].startswith("callback error: opbridge: ")


def test_one_session_options_serves_every_tier_in_turn(guards):
    """One SessionOptions object, passed to native, python, function, python, native, function
    sessions in one process: each session opens, computes the right values, and runs its own
    tier's kernels (each tier words a bad input differently)."""
    runs = guards["options_reuse"]["runs"]
    assert [r["tier"] for r in runs] == ["native", "python", "function", "python", "native", "function"]
    for r in runs:
        assert r["valid"] == guards["valid"], r
        assert not r["bad"]["ok"], r
        error = r["bad"]["error"]
        if r["tier"] == "native":  # the C++ kernel's message
            assert "input 'ranks_depth' has value 1000000 at position 0, outside [0, 120)" in error
        elif r["tier"] == "python":
            assert r["bad"]["type"] == "OpBridgeError" and "the Python kernel raised CheckError" in error
        else:  # the function body's guard, explained with the eager message: not the native kernel
            assert r["bad"]["type"] == "OpBridgeError" and "Python kernel" not in error
            assert error.startswith("opbridge: bev::bev_pool_v2: input 'ranks_depth' values must lie in [0, 120)")


@pytest.mark.parametrize("value_info", ["kept", "dropped"])
def test_symbolic_channel_dim_runs_in_the_python_tier_as_in_native(value_info):
    """identity_conv's fake kernel checks channels == x.shape[1]: on a dim_param it used to fail ONNX
    shape inference, and the python tier refused a model the native tier runs."""
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.identity_conv(x, 3)

    proto = bridge.export(M(), (torch.ones(1, 3, 4, 4),))
    for v in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        if len(v.type.tensor_type.shape.dim) == 4:
            v.type.tensor_type.shape.dim[1].dim_param = "C"
    if value_info == "dropped":
        del proto.graph.value_info[:]
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    for tier in ("native", "python"):
        sess = bridge.session(proto, tier=tier)
        assert np.array_equal(sess.run(None, {"x": x})[0], x), tier
    # the op's own check still holds at run time, with its eager message
    with pytest.raises(bridge.OpBridgeError, match=r"input 'x' must be \(N, channels=3, \.\.\.\)"):
        sess.run(None, {"x": np.ones((1, 4, 4, 4), np.float32)})
