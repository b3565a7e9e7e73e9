"""Hostile inputs: damaged files, helper functions, control flow, failing kernels, failed writes, bad
CLI invocations. Whatever can crash runs in a subprocess, so a crash is a failed test."""

import json
import os
import subprocess
import threading
from pathlib import Path

import forkserver
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper

import bridge
import custom_ops  # noqa: F401
import custom_ops.demo as demo
from bridge import checks as C
from ort_kernels.base import FUNCTION_BODY

ROOT = Path(__file__).resolve().parents[1]
FUZZ_EXAMPLES = int(os.environ.get("OPBRIDGE_FUZZ_EXAMPLES", "60"))  # --heavy: 1,000
SESSIONS = int(os.environ.get("OPBRIDGE_SESSIONS", "2000"))  # --heavy: 10,000


def _python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return forkserver.run(["-c", code], timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), **kwargs)


def test_fuzzed_files_never_crash_the_loader_or_the_kernels():
    r = forkserver.run([str(ROOT / "tests/scripts/fuzz_loader.py"), str(FUZZ_EXAMPLES)],
                       timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert f"fuzz_loader: {FUZZ_EXAMPLES} examples" in r.stdout and "0 crashes" in r.stdout


class _Ident(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 2)


@pytest.mark.parametrize("tier", bridge.TIERS)
def test_model_local_helper_functions_of_other_domains_run_in_every_tier(tier):
    proto = bridge.export(_Ident(), (torch.randn(1, 2, 3, 3),))
    proto.functions.append(helper.make_function(
        "pkg.helpers", "twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 20)]))
    proto.opset_import.append(helper.make_opsetid("pkg.helpers", 1))
    proto.graph.node.append(helper.make_node("twice", [proto.graph.output[0].name], ["doubled"],
                                             domain="pkg.helpers"))
    proto.graph.output[0].name = "doubled"
    x = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    sess = bridge.session(proto, tier=tier)
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: x})[0], 2 * x)


class _Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: torch.ops.opbridge.crop(x, [0, 0, 2, 2]),
                          lambda x: torch.ops.opbridge.crop(x * 2, [1, 1, 3, 3]), (x,))


@pytest.mark.parametrize("tier", ["function", "native"])
def test_custom_ops_inside_torch_cond_export_with_bodies_and_run(tier):
    proto = bridge.export(_Cond(), (torch.randn(3, 4, 4),))
    assert {(f.domain, f.name) for f in proto.functions} == {("opbridge", "crop")}
    sess = bridge.session(proto, tier=tier)
    for sign in (1.0, -1.0):
        x = sign * torch.rand(3, 4, 4)
        got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_array_equal(got, _Cond()(x).numpy())


def test_unregistered_op_inside_torch_cond_gets_the_bridges_message():
    @torch.library.custom_op("hostile_unreg::g", mutates_args=())
    def g(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    g.register_fake(lambda x: torch.empty_like(x))

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: torch.ops.hostile_unreg.g(x), lambda x: x * 2, (x,))

    with pytest.raises(bridge.OpBridgeError, match=r"calls custom op hostile_unreg::g.*bridge.register"):
        bridge.export(M(), (torch.randn(3),))


@pytest.mark.parametrize("failure", ["unprintable", "memory"])
def test_python_kernel_failures_become_errors_not_aborts(failure):
    body = {"unprintable": "raise Unprintable()", "memory": "raise MemoryError()"}[failure]
    code = f"""
import torch, bridge, numpy as np
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")
@bridge.op("hostile_py::boom", fake=lambda x: torch.empty_like(x),
           sample_inputs=lambda dtype: [bridge.SampleInput((torch.ones(2, dtype=dtype),))])
def boom(x: torch.Tensor) -> torch.Tensor:
    if x.numel() > 2:
{chr(10).join('        ' + line for line in body.splitlines())}
    return x.clone()
class M(torch.nn.Module):
    def forward(self, x):
        return boom(x)
sess = bridge.session(bridge.export(M(), (torch.ones(2),), dynamic_shapes=({{0: torch.export.Dim("n")}},)),
                      tier="python")
try:
    sess.run(None, {{sess.get_inputs()[0].name: np.ones(5, np.float32)}})
except bridge.OpBridgeError as e:
    print("ERROR", e)
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ERROR opbridge: hostile_py::boom: the Python kernel raised" in r.stdout, r.stdout
    assert ("could not be converted" if failure == "unprintable" else "MemoryError") in r.stdout


def test_a_failed_export_leaves_the_existing_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    bridge.export(_Ident(), (torch.randn(1, 2, 3, 3),), path)
    good = path.read_bytes()

    def full_disk(proto, f, *args, **kwargs):
        Path(f).write_bytes(b"\x08" * 100)  # a partial write, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", full_disk)
    with pytest.raises(OSError, match="No space left"):
        bridge.export(_Ident(), (torch.randn(1, 2, 3, 3),), path)
    assert path.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.long
def test_many_sessions_keep_memory_bounded():
    code = f"""
import gc, psutil, torch, bridge, custom_ops
class M(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 2)
data = bridge.export(M(), (torch.randn(1, 2, 3, 3),)).SerializeToString()
proc = psutil.Process()
for i in range({SESSIONS}):
    bridge.session(data, tier="native")
    if i == 499:
        gc.collect(); start = proc.memory_info().rss
gc.collect()
print("GROWTH_MB", (proc.memory_info().rss - start) / 2**20)
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    growth = float(r.stdout.split("GROWTH_MB")[1])
    assert growth < 64, f"RSS grew {growth:.1f} MiB over {SESSIONS - 500} sessions"


def _cli(*args, cwd):
    return forkserver.run(["-m", "bridge", "-q", *args], cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    path = folder / "m.onnx"
    bridge.export(_Ident(), (torch.randn(1, 2, 3, 3),), path)
    return path


@pytest.mark.parametrize("case,needle", [
    ("not_a_zip", "is not a readable .npz"),
    ("object_array", "is not a readable .npz"),
    ("empty", "holds arrays []"),
    ("wrong_names", "holds arrays ['a', 'b']; the model takes inputs ['x']. Got missing ['x'], extra ['a', 'b']"),
    ("empty_model_module", "cannot load model factory"),
    ("missing_output_folder", "its folder does not exist"),
])
def test_bad_cli_invocations_are_one_line_errors(case, needle, exported, tmp_path):
    inputs = tmp_path / "x.npz"
    if case == "not_a_zip":
        inputs.write_bytes(b"PK but not really")
    elif case == "object_array":
        np.savez(inputs, x=np.array([{"a": 1}], dtype=object))
    elif case == "empty":
        np.savez(inputs)
    elif case == "wrong_names":
        np.savez(inputs, a=np.zeros(1), b=np.zeros(1))
    if case == "empty_model_module":
        (tmp_path / "empty_mod.py").write_text("")
        r = _cli("export", "--model", "empty_mod:build", "-o", str(tmp_path / "o.onnx"), cwd=tmp_path)
    elif case == "missing_output_folder":
        r = _cli("export", "-o", str(tmp_path / "no" / "such" / "m.onnx"), cwd=tmp_path)
    else:
        r = _cli("run", str(exported), "--inputs", str(inputs), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: opbridge: ") and needle in lines[0], r.stderr


@pytest.mark.parametrize("tier", ["eager", *bridge.TIERS])
def test_huge_overflowing_and_empty_grids(tier):
    r = forkserver.run([str(ROOT / "tests/scripts/huge_grids.py"), tier], timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, f"huge_grids.py died (rc={r.returncode}):\n{r.stderr[-3000:]}"
    result = {d["case"]: d for d in map(json.loads, r.stdout.splitlines())}
    # 1e12 cells: an allocation error from torch's or onnxruntime's allocator, named, no crash
    huge = result["huge"]
    assert huge["error"] and "allocate" in huge["error"], huge
    if tier != "eager":
        assert huge["type"] == "OpBridgeError" and "bev_pool_v2" in huge["error"], huge
    # a grid whose element count overflows int64: refused, naming the attribute (the function
    # tier's plain ONNX body fails in onnxruntime's shape inference, which names no attribute)
    overflow = result["overflow"]
    assert overflow["error"], overflow
    if tier != "function":
        assert "bev_feat_shape" in overflow["error"] and "2147483648" in overflow["error"], overflow
    # C = 0 over 4e8 cells: a valid, empty output that needs (next to) no memory
    empty = result["empty_channels"]
    assert empty["error"] is None, empty
    assert empty["peak_growth_mib"] < 64, empty
    if tier == "eager":
        assert empty["shape"] == [1, 0, 1, 20_000, 20_000], empty


def test_a_damaged_body_is_refused_after_a_good_one_was_seen():
    # sessions remember function bodies whose names were found to be text (bridge.sessions): a body
    # damaged after that is a different body and is still read name by name
    good = bridge.export(_Ident(), (torch.randn(1, 2, 3, 3),)).SerializeToString()
    bridge.session(good)
    name = b"opbridge_check_v2"
    assert good.count(name) > 1
    damaged = good.replace(name, b"opbridge_check_\xff2")
    with pytest.raises(bridge.OpBridgeError, match="node names are not valid text"):
        bridge.session(damaged)


class _Weighted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1, 3, 2, 2))

    def forward(self, x):
        return torch.ops.opbridge.identity_conv(self.w, 3) + x


@pytest.mark.parametrize("tier", bridge.TIERS)
def test_checked_op_reading_an_external_data_initializer(tier, tmp_path):
    # the function tier keeps small initializers for its messages; one stored as external data is
    # not read from a path relative to the working folder, and the session opens and runs
    path = tmp_path / "m.onnx"
    onnx.save_model(bridge.export(_Weighted(), (torch.ones(1, 3, 2, 2),)), path, save_as_external_data=True,
                    location="m.data", size_threshold=0)
    sess = bridge.session(path, tier=tier)
    assert float(sess.run(None, {"x": np.ones((1, 3, 2, 2), np.float32)})[0].sum()) == 24.0


# --- a bad feed is an OpBridgeError in every tier: the op's message, or the feed's -----------------------------

@pytest.fixture(scope="module")
def demo_sessions():
    case = demo.build()
    proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    with torch.no_grad():
        expected = case.model(*case.args).numpy()
    return case, expected, {tier: bridge.session(proto, tier=tier) for tier in bridge.TIERS}


def _out_of_range(feed):
    ranks = feed["ranks_depth"].copy()
    ranks[5] = 99999
    return {**feed, "ranks_depth": ranks}


# NOTE: each bad feed of the demo (the good feed -> the bad one) and what every tier's message names
BAD_FEEDS = {
    "out_of_range": (_out_of_range, "bev::bev_pool_v2: input 'ranks_depth'"),
    "wrong_rank": (lambda f: {**f, "images": f["images"][0]}, "model input 'images' must have 5 dims"),
    "wrong_static_dim": (lambda f: {**f, "images": np.concatenate([f["images"]] * 2, 2)},
                         "model input 'images' must have size 3 in dim 2"),
    "wrong_dtype": (lambda f: {**f, "images": f["images"].astype(np.float64)}, "model input 'images' must be float32"),
    "missing": (lambda f: {k: v for k, v in f.items() if k != "ranks_feat"}, "missing ['ranks_feat'], unknown []"),
    "unknown": (lambda f: {**f, "rank_bev": f["ranks_bev"]}, "missing [], unknown ['rank_bev']"),
    "torch_tensor": (lambda f: {**f, "images": torch.from_numpy(f["images"])},
                     "model input 'images' must be a numpy array. Got torch.Tensor. Pass images.numpy()"),
    "numpy_scalar": (lambda f: {**f, "ranks_bev": np.int32(3)}, "bev::bev_pool_v2: input 'ranks_bev' must be a numpy array. Got numpy.int32"),
    # NOTE: before: the python tier aborted the process (an empty OrtValue reached its kernel)
    "none": (lambda f: {**f, "ranks_bev": None}, "model input(s) ['ranks_bev'] must be numpy arrays. Got None."),
    "text": (lambda f: {**f, "images": "images.png"}, "model input 'images' must be a numpy array. Got builtins.str"),
    "ragged_list": (lambda f: {**f, "images": [[1.0], [1.0, 2.0]]},
                    "model input 'images' must be a numpy array. Got builtins.list. Pass np.asarray(images)"),
}
# the message of the out-of-range index in each tier: the op's eager checks, the C++ kernel's own words
OUT_OF_RANGE = {
    "function": "input 'ranks_depth' values must lie in [0, 16896). Got min 0, max 99999. Check ranks_depth",
    "native": "input 'ranks_depth' has value 99999 at position 5, outside [0, 16896) (depth elements). Got this "
              "from the op's C++ kernel. Fix the inputs",
    "python": "input 'ranks_depth' values must lie in [0, 16896). Got min 0, max 99999. Check ranks_depth",
}


@pytest.mark.parametrize("bad", BAD_FEEDS)
@pytest.mark.parametrize("tier", bridge.TIERS)
def test_bad_feeds_are_opbridge_errors_in_every_tier(demo_sessions, tier, bad, capfd):
    case, expected, sessions = demo_sessions
    sess = sessions[tier]
    feed = bridge.parity.ort_feed(sess, case.args)
    np.testing.assert_allclose(sess.run(None, feed)[0], expected, rtol=1e-4, atol=1e-4)  # the good feed runs
    make, needle = BAD_FEEDS[bad]
    with pytest.raises(bridge.OpBridgeError) as info:
        sess.run(None, make(feed))
    message = str(info.value)
    assert message.startswith("opbridge: ") and message.count("opbridge:") == 1 and needle in message, message
    assert ".." not in message and "ONNXRuntimeError" not in message, message
    # NOTE: onnxruntime logs nothing of its own before the exception (its error line said the same, in red)
    assert "onnxruntime" not in capfd.readouterr().err
    if bad == "out_of_range":
        assert OUT_OF_RANGE[tier] in message and "the Python kernel raised" not in message, message


@pytest.mark.parametrize("tier", bridge.TIERS)
def test_run_with_ort_values_given_arrays_is_named(demo_sessions, tier):
    case, _, sessions = demo_sessions
    sess = sessions[tier]
    with pytest.raises(bridge.OpBridgeError, match=r"run_with_ort_values takes onnxruntime\.OrtValue inputs\. Got "
                                                   r"\{'images': 'ndarray'.*ortvalue_from_numpy"):
        sess.run_with_ort_values(None, bridge.parity.ort_feed(sess, case.args))


@pytest.mark.parametrize("tier", bridge.TIERS)
def test_kernel_refusals_through_ort_values_and_threads(demo_sessions, tier):
    case, _, sessions = demo_sessions
    sess = sessions[tier]
    bad = _out_of_range(bridge.parity.ort_feed(sess, case.args))
    values = {k: bridge.tools.sessions._ort_value(v) for k, v in bad.items()}
    with pytest.raises(bridge.OpBridgeError, match="input 'ranks_depth'"):
        sess.run_with_ort_values(None, values)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(bridge.OpBridgeError, sess.run, None, bad)))
    thread.start()
    thread.join()
    assert OUT_OF_RANGE[tier] in str(errors[0].value)


def test_native_explains_the_guards_of_the_bodies_it_runs(registry, fresh_name):
    """An op with checks and no C++ kernel runs its function body in the native tier: a failed guard
    there is the function tier's message, the op's eager one."""
    name = fresh_name("gather_perm")

    @bridge.op(name, fake=lambda x, idx: x.new_empty(idx.shape), registry=registry,
               checks=[C.rank("x", 1), C.rank("idx", 1), C.values_in("idx", 0, C.numel("x"))])
    def gather_perm(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x[idx]

    class M(torch.nn.Module):
        def forward(self, x, idx):
            return gather_perm(x, idx)

    x, idx = torch.arange(10.0), torch.tensor([3, 1, 2])
    proto = bridge.export(M(), (x, idx), registry=registry)
    messages = {}
    for tier in ("function", "native"):
        sess = bridge.session(proto, tier=tier, registry=registry)
        np.testing.assert_array_equal(sess.run(None, {"x": x.numpy(), "idx": idx.numpy()})[0], x[idx].numpy())
        with pytest.raises(bridge.OpBridgeError) as info:
            sess.run(None, {"x": x.numpy(), "idx": np.array([3, -1, 2])})
        messages[tier] = str(info.value)
    assert sess.kernels == {name: FUNCTION_BODY}
    assert messages["native"] == messages["function"], messages
    assert messages["native"].startswith(f"opbridge: {name}: input 'idx' values must lie in [0, 10). Got min -1")


def test_cli_run_passes_a_kernel_refusal_on_once(demo_sessions, tmp_path):
    case, _, sessions = demo_sessions
    path = tmp_path / "demo.onnx"
    bridge.export(case.model, case.args, path, dynamic_shapes=case.dynamic_shapes)
    np.savez(tmp_path / "bad.npz", **_out_of_range(bridge.parity.ort_feed(sessions["native"], case.args)))
    for tier in bridge.TIERS:
        r = _cli("run", str(path), "--tier", tier, "--inputs", str(tmp_path / "bad.npz"), cwd=tmp_path)
        lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]  # NOTE: onnxruntime logs too
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert lines[0].count("opbridge:") == 1 and ".." not in lines[0] and OUT_OF_RANGE[tier] in lines[0], lines


# -- a new user's mistakes at declaration and call: each an opbridge error naming the fix -----------------------

def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class _Calls(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        return self.op(x)


def test_declaration_mistakes_are_named_where_they_are_made():
    reg = bridge.Registry()
    with pytest.raises(bridge.OpBridgeError, match=r"t::strs: dtypes must be a sequence of torch dtypes\. Got "
                                                   r"\('float32',\)\. Pass e\.g\. dtypes=\(torch\.float32"):
        bridge.op("t::strs", fake=lambda x: torch.empty_like(x), dtypes=("float32",), registry=reg)(_twice)
    # NOTE: one tensor as a sample's args is its one argument (OpInfo's SampleInput takes it so); a number is refused
    assert [tuple(a.shape) for a in bridge.SampleInput(torch.ones(3)).args] == [(3,)]
    with pytest.raises(bridge.OpBridgeError, match=r"SampleInput takes the op's arguments as a tuple\. Got int 3"):
        bridge.SampleInput(3)
    with pytest.raises(bridge.OpBridgeError, match=r"t::bare: torch reads the op's schema from the function's type "
                                                   r"annotations, and could not\. Got: Parameter x must have a type "
                                                   r"annotation.* Annotate every parameter and the return"):
        bridge.op("t::bare", registry=reg)(lambda x, k: x * k)
    assert reg.find("t", "bare") is None
    nofake = bridge.op("t::nofake", registry=reg)(_twice)
    with pytest.raises(bridge.OpBridgeError, match=r"t::nofake has no fake kernel, which torch\.export needs .* "
                                                   r"Pass fake= to @bridge\.op"):
        bridge.export(_Calls(nofake), (torch.randn(3),), registry=reg)


@pytest.mark.parametrize("model, args, match", [
    (lambda x: x + 1, (torch.ones(2),), r"the model must be a torch\.nn\.Module\. Got function"),
    (torch.nn.Linear(3, 2), (torch.randn(2, 3).double(),),
     r"eager torch refuses the call, so there is nothing to compare\. Got RuntimeError: mat1 and mat2 must have the "
     r"same dtype"),
    (torch.nn.Linear(3, 2), (np.ones((2, 3), np.float32),), r"eager torch refuses the call.*numpy"),
], ids=["function", "float64-into-float32-weights", "numpy"])
def test_a_call_eager_cannot_make_is_named_not_the_exporters_symptom(model, args, match):
    with pytest.raises(bridge.OpBridgeError, match=match):
        bridge.check_parity(model, args)


def test_numpy_arguments_to_export_are_named():
    with pytest.raises(bridge.OpBridgeError, match=r"must be torch tensors .* Got 1 numpy value\(s\)\. Convert each "
                                                   r"with torch\.from_numpy"):
        bridge.export(torch.nn.ReLU(), (np.ones(3, np.float32),))


class _Doubled(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 2) * 2


@pytest.mark.parametrize("tier", ["function", "python", "native"])
def test_session_run_misuse_is_named_in_every_tier(tier):
    """The feed as a list, an output name the model lacks, one name as a string: onnxruntime's AttributeError,
    INVALID_ARGUMENT and pybind TypeError become the fix, naming the model's inputs and outputs."""
    x = torch.randn(1, 2, 3, 3)
    sess = bridge.session(bridge.export(_Doubled(), (x,), output_names=["y"]).SerializeToString(), tier=tier)
    feed = {"x": x.numpy()}
    for output_names, given, match in [
            (None, [x.numpy()], r"session\.run takes the inputs as a dict\. Got list\. Pass \{'x': \.\.\.\}"),
            (["nope"], feed, r"outputs the model does not have\. Got \['nope'\]\. Pass None or names of \['y'\]"),
            ("y", feed, r"output_names as a list of names \(None: every output\)\. Got 'y'")]:
        with pytest.raises(bridge.OpBridgeError, match=match):
            sess.run(output_names, given)
    np.testing.assert_array_equal(sess.run(["y"], feed)[0], _Doubled()(x).numpy())


@pytest.mark.parametrize("tier", ["function", "python", "native"])
def test_run_with_iobinding_names_an_unbound_or_wrong_input_in_every_tier(tier):
    """Before: an unbound input aborted the process in the python tier (std::runtime_error: "the ort_value must
    contain a constructed tensor"), and the other tiers gave onnxruntime's own text for it and for a float64 or
    wrongly shaped input; now the same refusals as run()."""
    x = torch.randn(1, 2, 3, 3)
    sess = bridge.session(bridge.export(_Doubled(), (x,), output_names=["y"]).SerializeToString(), tier=tier)

    def run(value=None, clear=False):
        binding = sess.io_binding()
        if value is not None:
            binding.bind_cpu_input("x", value)
        if clear:
            binding.clear_binding_inputs()
        binding.bind_output("y")
        sess.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]

    for value, clear, match in [
            (None, False, r"model input\(s\) \['x'\] are not bound for run_with_iobinding\. Got bound inputs \[\]\."),
            (x.numpy(), True, r"model input\(s\) \['x'\] are not bound for run_with_iobinding"),
            (x.double().numpy(), False, r"input 'x' must be float32 \(tensor\(float\)\)\. Got float64\."),
            (np.ones((1, 3, 3, 3), np.float32), False, r"input 'x' must have size 2 in dim 1")]:
        with pytest.raises(bridge.OpBridgeError, match=match):
            run(value, clear)
    np.testing.assert_array_equal(run(x.numpy()), _Doubled()(x).numpy())


def test_an_iobinding_made_directly_is_refused_where_the_tier_must_see_the_inputs():
    """Before: onnxruntime.IOBinding(session) made directly (its inputs unknown) with an input left unbound
    aborted the process in the python tier; now that tier refuses such a binding, naming session.io_binding().
    The function tier runs it as onnxruntime does (its error for a missing input is onnxruntime's own)."""
    x = torch.randn(1, 2, 3, 3)
    proto = bridge.export(_Doubled(), (x,), output_names=["y"]).SerializeToString()
    for tier, refused in (("python", True), ("function", False)):
        sess = bridge.session(proto, tier=tier)
        binding = ort.IOBinding(sess)
        binding.bind_cpu_input("x", x.numpy())
        binding.bind_output("y")
        if refused:
            with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: this session checks that each run binds every "
                               r"input .* Got an IOBinding made with onnxruntime\.IOBinding\(session\)\. Make the "
                               r"binding with session\.io_binding\(\)\.$"):
                sess.run_with_iobinding(binding)
        else:
            sess.run_with_iobinding(binding)
            np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], _Doubled()(x).numpy())


@pytest.mark.parametrize("tier", ["function", "native"])
def test_an_op_no_imported_module_registers_names_the_import_first(tier):
    """A file without bodies opened where the op's module was not imported: the fix is that import (before: give
    the op a body, or another tier)."""
    x = torch.randn(1, 2, 3, 3)
    proto = bridge.export(_Doubled(), (x,), functions=False)
    with pytest.raises(bridge.OpBridgeError, match=r"Import the module that registers opbridge::identity_conv before "
                                                   r"the session \(on the command line: --ops MODULE\)\. Give"):
        bridge.session(proto.SerializeToString(), tier=tier, registry=bridge.Registry())


class _Paste(torch.nn.Module):
    def forward(self, a, b):
        return torch.ops.opbridge.paste(a, b, 1, 2)


def _no_patch(proto):
    next(n for n in proto.graph.node if n.domain == "opbridge").input[1] = ""


def _no_import(proto):
    keep = [o for o in proto.opset_import if o.domain != "opbridge"]
    del proto.opset_import[:]
    proto.opset_import.extend(keep)


@pytest.mark.parametrize("edit, needle", [
    (_no_patch, r"leaves required input\(s\) \['patch'\] empty\. Got inputs \['a', ''\]\. Only optional inputs"),
    (_no_import, r"the model imports no opset for its domain 'opbridge'\. Got opset_import \{'': \d+\}\. Export the "
                 r"model again, or add the import opbridge=1"),
], ids=["empty-required-input", "no-domain-import"])
@pytest.mark.parametrize("tier", bridge.TIERS)
def test_hand_edited_custom_nodes_are_named_before_onnxruntime_sees_them(tier, edit, needle):
    """Before: the python tier ran paste's kernel with None; the function and native tiers gave onnxruntime's raw
    text; a missing import read 'register the op with version=None'."""
    proto = bridge.export(_Paste(), (torch.randn(3, 6, 7), torch.randn(3, 2, 2)), functions=tier != "native")
    edit(proto)
    with pytest.raises(bridge.OpBridgeError, match=needle):
        bridge.session(proto.SerializeToString(), tier=tier)


class _Crop(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.crop(x, [1, 1, 3, 3])


def _set_box(box):
    def edit(proto):
        node = next(n for n in proto.graph.node if n.domain == "opbridge")
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("box", box))
    return edit


def _extra_attribute(proto):
    next(n for n in proto.graph.node if n.domain == "opbridge").attribute.append(onnx.helper.make_attribute("bogus", 5))


@pytest.mark.parametrize("edit, needle", [
    (_extra_attribute, r"^opbridge: node '.*' \(opbridge::crop\) has attribute\(s\) \['bogus'\], which opbridge::crop "
                       r"does not declare \(it declares \['box'\]\)\. Got attributes \['bogus', 'box'\]\. Remove them"),
    (_set_box([3, 3, 1, 1]), r"^opbridge: opbridge::crop: attribute 'box' must be \[left, top, right, bottom\] with "
                             r"right >= left and bottom >= top[.,] [Gg]ot \[3, 3, 1, 1\]"),
    (_set_box([1, 1]), r"^opbridge: opbridge::crop: attribute 'box' must be \[left, top, right, bottom\]"),
], ids=["unknown-attribute", "inverted-box", "short-box"])
@pytest.mark.parametrize("tier", bridge.TIERS)
def test_hand_edited_attributes_are_the_ops_own_refusal_once(tier, edit, needle):
    """Eager refuses an argument crop does not take, and a box its checks refuse. Before: an unknown attribute ran
    in every tier; a bad box came wrapped two or three times ("opbridge: onnxruntime could not load the model. Got
    ... opbridge: opbridge::crop: ..." in the native tier, "cannot type ... the fake kernel failed ... Got
    CheckError: opbridge: ..." in the python tier)."""
    proto = bridge.export(_Crop(), (torch.randn(1, 3, 6, 7),), functions=tier != "native")
    edit(proto)
    with pytest.raises(bridge.OpBridgeError, match=needle) as caught:
        bridge.session(proto.SerializeToString(), tier=tier).run(None, {"x": np.ones((1, 3, 6, 7), np.float32)})
    assert str(caught.value).count("opbridge: ") == 1, str(caught.value)
    node = next(n for n in proto.graph.node if n.domain == "opbridge")
    kwargs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    with pytest.raises((RuntimeError, ValueError)):  # NOTE: eager refuses the same call
        torch.ops.opbridge.crop(torch.ones(1, 3, 6, 7), **kwargs)


def test_an_emptied_body_is_named_by_sessions_and_repaired_by_attach(tmp_path):
    """Before: every tier gave onnxruntime's "failed validating the check: !(it.GetName().empty())" as a kernel
    problem; `opbridge attach` said "nothing to attach" and `--replace` failed in onnx-ir (SerdeError)."""
    x = torch.randn(1, 2, 4, 4)
    proto = bridge.export(_Ident(), (x,))
    del proto.functions[0].node[:]
    onnx.save(proto, tmp_path / "emptied.onnx")
    for tier in bridge.TIERS:
        with pytest.raises(bridge.OpBridgeError, match=r"the file's body of opbridge::identity_conv computes no value "
                                                       r"for output\(s\) \['return_val'\] \(a tool emptied or cut it\)"
                                                       r"\. Got a body of 0 node\(s\)\. Give it its op's body with "
                                                       r"`opbridge attach FILE -o OUT`"):
            bridge.session(tmp_path / "emptied.onnx", tier=tier)
    for extra in ([], ["--replace"]):
        out = tmp_path / f"repaired{len(extra)}.onnx"
        r = _cli("attach", str(tmp_path / "emptied.onnx"), *extra, "-o", str(out), cwd=tmp_path)
        assert r.returncode == 0 and "attached or converted opbridge::identity_conv" in r.stdout, r.stderr
        for tier in bridge.TIERS:
            got = bridge.session(out, tier=tier).run(None, {"x": x.numpy()})[0]
            np.testing.assert_array_equal(got, _Ident()(x).numpy())
