"""Python kernel tier through onnxruntime-extensions: parity, and every known failure guarded."""

import json
import os
from pathlib import Path

import forkserver
import numpy as np
import pytest
import torch

import bridge
import custom_ops.demo as demo

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def guards():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = forkserver.run([str(ROOT / "tests/scripts/python_tier_guards.py")], env=env, timeout=600)
    assert r.returncode == 0, f"the guard run died (rc={r.returncode}):\n{r.stderr[-3000:]}"
    return {d.pop("case"): d for d in map(json.loads, r.stdout.splitlines())}


def test_kernel_exception_is_a_python_error_not_an_abort(guards):
    err = guards["kernel_exception"]
    assert not err["ok"] and err["type"] == "OpBridgeError"
    # NOTE: the op's own CheckError, passed on once (no second prefix, no second advice)
    assert err["error"].startswith("opbridge: bev::bev_pool_v2: input 'ranks_depth' values must lie in [0, 120)")
    assert err["error"].count("opbridge:") == 1 and "Python kernel raised" not in err["error"]
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
    assert "opbridge: bev::bev_pool_v2: input 'ranks_depth' values must lie in [0, 120)" in err["error"]
    assert err["error"].count("opbridge:") == 1
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
        else:  # the op's checks (the Python kernel's, the function body's guard): the eager message
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


# NOTE: process state matters (declarations, generations), so the scenario runs in a fresh process.
DYNAMIC_SIZES = """import json
import numpy as np, onnx, torch
from onnx import helper, TensorProto as TP
import bridge

@torch.library.custom_op("dyn::nms_like", mutates_args=())
def nms_like(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    order = scores.argsort(descending=True)
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    keep, suppressed = [], torch.zeros(len(boxes), dtype=torch.bool)
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        suppressed |= w * h / (area[i] + area - w * h) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)

@nms_like.register_fake
def _(boxes, scores, iou_threshold):
    return boxes.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.int64)

def boxes_scores(n, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 10
    return torch.cat([xy, xy + 1 + torch.rand(n, 2, generator=g) * 3], 1).to(dtype), torch.rand(n, generator=g).to(dtype)

bridge.register("dyn::nms_like", dtypes=(torch.float32, torch.float64),
                sample_inputs=lambda d: [bridge.SampleInput((*boxes_scores(6, 0, d), 0.3))])

class Detect(torch.nn.Module):
    def forward(self, boxes, scores):
        keep = torch.ops.dyn.nms_like(boxes, scores, 0.3)
        return boxes[keep] * 2.0, keep

def run(sess, module, inputs):
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs)})
    want = module(*inputs)
    want = [t.numpy() for t in (want if isinstance(want, tuple) else (want,))]
    return all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want))

out = {}
n = torch.export.Dim("boxes", min=2)
proto = bridge.export(Detect(), boxes_scores(12, 0), dynamic_shapes=({0: n}, {0: n}), functions=False)
sess = bridge.session(proto, tier="python")
out["nms"] = [run(sess, Detect(), boxes_scores(c, s)) for c, s in ((12, 0), (40, 1), (3, 2))]

@torch.library.custom_op("dyn::broken_fake", mutates_args=())
def broken_fake(x: torch.Tensor) -> torch.Tensor:
    return x + 1

@broken_fake.register_fake
def _(x):
    raise RuntimeError("this fake kernel cannot type anything")

bridge.register("dyn::broken_fake", sample_inputs=lambda d: [bridge.SampleInput((torch.ones(2, dtype=d),))])
# hand-made: the node's output has no type in the model
node = helper.make_node("broken_fake", ["x"], ["t"], domain="dyn", name="the_broken_node")
g = helper.make_graph([node, helper.make_node("Relu", ["t"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TP.FLOAT, [2])], [helper.make_tensor_value_info("y", TP.FLOAT, None)])
bad = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dyn", 1)])
try:
    bridge.session(bad, tier="python")
    out["refused"] = None
except Exception as e:
    out["refused"] = [type(e).__name__, str(e)]

@torch.library.custom_op("dyn::shift", mutates_args=())
def shift(x: torch.Tensor, by: int) -> torch.Tensor:
    return x + by

@shift.register_fake
def _(x, by):
    return torch.empty_like(x)

bridge.register("dyn::shift")  # no samples: typed from the model

class Shift(torch.nn.Module):
    def forward(self, x):
        return torch.ops.dyn.shift(x, 3)

x64 = torch.arange(5, dtype=torch.float64)
sess2 = bridge.session(bridge.export(Shift(), (x64,), functions=False), tier="python")
out["second_model"] = run(sess2, Shift(), (x64,))
out["first_still"] = run(sess, Detect(), boxes_scores(20, 5))
b64 = boxes_scores(15, 3, torch.float64)
sess3 = bridge.session(bridge.export(Detect(), b64, dynamic_shapes=({0: n}, {0: n}), functions=False), tier="python")
out["nms_float64"] = run(sess3, Detect(), b64)
print(json.dumps(out))
"""


def test_data_dependent_output_size_and_isolation():
    """An nms-like op (its fake makes the kept count with new_dynamic_size(), int64 output) followed
    by a gather of its output, with a dynamic box count: typed with a shape environment (a bare fake
    call raised DynamicOutputShapeException and broke the tier for the process), equal to eager at
    float32 and float64. An op that cannot be typed is refused alone with its true reason; a second
    model with an op registered later, without samples, still runs, and so does the first."""
    r = forkserver.run(["-c", DYNAMIC_SIZES], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["nms"] == [True, True, True] and out["nms_float64"], out
    kind, message = out["refused"]
    assert kind in ("OpBridgeError", "UnsupportedInTier"), out
    assert "dyn::broken_fake" in message and "this fake kernel cannot type anything" in message, message
    assert out["second_model"] and out["first_still"], out


# NOTE: a fresh process, so the op this registers stays out of the test session's registry
EVERY_DTYPE = """import json
import numpy as np, torch
import bridge

@torch.library.custom_op("pyt_dtypes::summary", mutates_args=())
def summary(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.flip(-1) * 3, x != 0, (x != 0).sum(-1, dtype=torch.int32)

@summary.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool), x.new_empty(x.shape[:-1], dtype=torch.int32)

bridge.register("pyt_dtypes::summary")
for dtype in (torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
    class M(torch.nn.Module):
        def forward(self, x):
            a, b, c = summary(x.to(dtype))
            return a.to(torch.float32) if dtype == torch.bfloat16 else a, b, c
    x = torch.randn(3, 5) * 3
    x = x.abs() if dtype == torch.uint8 else x
    proto = bridge.export(M(), (x,), functions=False)
    sess = bridge.session(proto, tier="python")
    got = sess.run(None, {"x": x.numpy()})
    want = [t.numpy() for t in M()(x)]
    print(json.dumps([str(dtype), [bool(g.dtype == w.dtype and np.array_equal(g, w)) for g, w in zip(got, want)]]))

# an implementation that returns float32 where its fake (and so the model) says float16: handing that
# to onnxruntime-extensions would abort the process
@torch.library.custom_op("pyt_dtypes::liar", mutates_args=())
def liar(x: torch.Tensor) -> torch.Tensor:
    return x.float()

@liar.register_fake
def _(x):
    return torch.empty_like(x)

bridge.register("pyt_dtypes::liar")
class Liar(torch.nn.Module):
    def forward(self, x):
        return liar(x.half()).float()

sess = bridge.session(bridge.export(Liar(), (torch.ones(3),), functions=False), tier="python")
try:
    sess.run(None, {"x": np.ones(3, np.float32)})
    print(json.dumps(["liar", None]))
except bridge.OpBridgeError as e:
    print(json.dumps(["liar", str(e)]))
"""


def test_every_torch_dtype_runs_with_integer_and_bool_outputs():
    """One op with a same-dtype, a bool and an int32 output, at bfloat16 (crosses as float32 both
    ways, Casts in the session's copy), float16 (inputs cross as float32), float64 and the integer
    dtypes: every output equals eager torch exactly, dtype included. An implementation returning
    another dtype than its fake says is an OpBridgeError, not an abort."""
    r = forkserver.run(["-c", EVERY_DTYPE], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = dict(json.loads(line) for line in r.stdout.splitlines() if line.startswith("["))
    assert "pyt_dtypes::liar output 0 does not have the dtype the model declares (torch.float16). Got " \
        "torch.float32" in rows.pop("liar"), r.stdout
    assert set(rows) == {"torch.bfloat16", "torch.float16", "torch.float64", "torch.int8", "torch.uint8",
                         "torch.int16", "torch.int32", "torch.int64"}
    assert all(ok == [True, True, True] for ok in rows.values()), rows


# NOTE: a fresh process: the tier's call hook is process-wide
FOREIGN_PYOP = """import json
import numpy as np, onnxruntime as ort, torch
from onnx import helper, TensorProto as TP
from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op
import bridge
import custom_ops  # noqa: F401
from bridge.tools.testing import OpModule

# a user's own PyOp, declared the stock way in the stock domain, next to the tier's hook
@onnx_op(op_type="UserTwice", inputs=[PyCustomOpDef.dt_float], outputs=[PyCustomOpDef.dt_float])
def user_twice(x):
    return x * 2

crop = bridge.REGISTRY.get("opbridge::crop")
module, tensors = OpModule.from_sample(crop, bridge.SampleInput((torch.randn(2, 4, 4), [0, 0, 2, 2])))
sess = bridge.session(bridge.export(module, tensors), tier="python")  # installs the tier's hook
node = helper.make_node("UserTwice", ["x"], ["y"], domain="ai.onnx.contrib")
g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [3])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, [3])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.contrib", 1)])
options = ort.SessionOptions()
options.register_custom_ops_library(get_library_path())
user = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
print(json.dumps({"user": user.run(None, {"x": np.arange(3, dtype=np.float32)})[0].tolist(),
                  "tier": bool(np.array_equal(sess.run(None, bridge.parity.ort_feed(sess, tensors))[0],
                                              module(*tensors).numpy()))}))
"""


def test_a_users_own_pyop_still_runs_beside_the_tiers_call_hook():
    """The tier replaces onnxruntime-extensions' call hook (which copied outputs through lists): a
    PyOp the user declares the stock way, in the stock domain, still runs, as the tier's ops do."""
    r = forkserver.run(["-c", FOREIGN_PYOP], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"user": [0.0, 2.0, 4.0], "tier": True}


# NOTE: a fresh process: declarations are process-wide
TWO_REGISTRIES = """import json
import numpy as np, torch
import bridge

regs = {"a": bridge.Registry(), "b": bridge.Registry()}
def declare(tag, k):
    @bridge.op(f"tworeg_{tag}::bump", domain="tworeg", fake=lambda x: torch.empty_like(x), registry=regs[tag])
    def bump(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() + k)  # NOTE: no body can be derived: only a kernel runs it

declare("a", 1.0)
declare("b", 100.0)

class M(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        return self.op(x)

x = torch.arange(3, dtype=torch.float32)
a = bridge.session(bridge.export(M(torch.ops.tworeg_a.bump), (x,), functions=False, registry=regs["a"]),
                   tier="python", registry=regs["a"])
before = a.run(None, {"x": x.numpy()})[0].tolist()
b = bridge.session(bridge.export(M(torch.ops.tworeg_b.bump), (x,), functions=False, registry=regs["b"]),
                   tier="python", registry=regs["b"])
print(json.dumps({"a": before, "b": b.run(None, {"x": x.numpy()})[0].tolist(),
                  "a_after": a.run(None, {"x": x.numpy()})[0].tolist()}))
"""


def test_a_live_session_keeps_its_own_registrys_kernel():
    """Two registries give one ONNX name (tworeg::bump) two implementations: a session of registry A
    keeps running A's kernel after registry B opens a session for its op (the tier's declarations were
    keyed by ONNX name alone, and B's record replaced A's under A's live session)."""
    r = forkserver.run(["-c", TWO_REGISTRIES], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"a": [1.0, 2.0, 3.0], "b": [100.0, 101.0, 102.0],
                                                     "a_after": [1.0, 2.0, 3.0]}


def test_an_op_whose_module_was_not_imported_runs_from_its_body_with_a_warning():
    """A file holding identity_conv's body opened where no registry knows the op (its module not imported): the
    python tier cannot run eager code for it; it says it runs the body, in a warning and in ``kernels``."""
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.identity_conv(x, 2) * 2
    x = torch.randn(1, 2, 3, 3)
    proto = bridge.export(M(), (x,))
    with pytest.warns(UserWarning, match=r"tier 'python' runs opbridge::identity_conv from the file's function "
                                         r"body, not an eager implementation: no registered op has that name\. .* "
                                         r"--ops MODULE"):
        sess = bridge.session(proto.SerializeToString(), tier="python", registry=bridge.Registry())
    assert sess.kernels == {"opbridge::identity_conv": "function body"}
    np.testing.assert_array_equal(bridge.parity.run_ort(sess, (x,))[0], M()(x).numpy())
