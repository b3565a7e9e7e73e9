"""A user's existing kernel library in the native tier (``native_library=``, ``--native-library``):
mmdeploy 1.3.1's ``libmmdeploy_onnxruntime_ops.so`` runs the ``mmdeploy::grid_sampler`` nodes that a
torch.autograd.Function's ``symbolic`` writes as mmdeploy writes them (``bridge.register(GridSampler)``),
checked against eager ``F.grid_sample``; which library serves which op; the errors for a path that is
no library.

The mmdeploy library comes from its PyPI wheel through tests/scripts/fetch_mmdeploy.py (.ci/run
runs it, and fails when it cannot). Every test that needs it is marked ``long`` (out of the README's
default command, in CI's ``-m long`` run); without the library those tests fail, naming the command,
unless ``OPBRIDGE_TEST_NO_MMDEPLOY=1`` says the run is offline on purpose: then they skip, each
saying what it left unchecked. mmdeploy's op is registered in subprocesses only
(tests/user_ops/mmdeploy_ops.py): the test process's registry stays the table's.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import forkserver
import mmdeploy_lib
import numpy as np
import onnx
import pytest
import torch
from mmdeploy_lib import FETCH, OFFLINE
from onnxruntime_extensions import get_library_path
from test_doc_blocks import BLOCKS, CODE, DocRun, doc_block

import bridge
import custom_ops.demo as demo
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.opnames import op_names
from ort_kernels import build
from ort_kernels.libraries import check_library

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "tests" / "user_ops" / "mmdeploy_ops.py"
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
# (interpolation_mode, padding_mode, align_corners): bilinear/nearest/bicubic x zeros/border/reflection
# x align_corners between these and the page's deploy_warp.py (bicubic, border, 0)
COMBOS = [(0, 0, 0), (1, 2, 1), (0, 2, 1), (2, 0, 1)]
TOLERANCE = 1e-5  # rtol and atol: float32's default (bridge.tools.parity.TOLERANCES); measured <= 2.2e-6


@pytest.fixture(scope="module")
def mmdeploy_library() -> str:
    return mmdeploy_lib.library()


# NOTE: one subprocess for every combination: it registers mmdeploy::grid_sampler, exports each
# model (dynamic batch), opens it through the library and through check_parity, and prints a line each.
PARITY = """
import io, json, sys, warnings
import onnx, torch, bridge, custom_ops
sys.path.insert(0, {ops_dir!r})
import mmdeploy_ops
library, tmp = {library!r}, {tmp!r}

def written(proto):
    node = next(n for n in proto.graph.node if n.domain == "mmdeploy")
    return [node.op_type, len(node.input), [(a.name, a.type, onnx.helper.get_attribute_value(a))
                                            for a in node.attribute]]

for modes in {combos!r}:
    case = mmdeploy_ops.case(*modes)
    path = f"{{tmp}}/warp_{{'_'.join(map(str, modes))}}.onnx"
    report = bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes, path=path,
                                 extra_args=case.extra_args, tier="native", native_library=library,
                                 rtol={tol}, atol={tol})
    sess = bridge.session(path, tier="native", native_library=library)
    legacy = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(case.model, case.args, legacy, dynamo=False, opset_version=18)
    print(json.dumps({{"modes": modes, "kernels": sess.kernels, "passed": report.passed,
                      "node": written(onnx.load(path)), "legacy": written(onnx.load_from_string(legacy.getvalue())),
                      "outputs": [(o.shape, o.max_abs, o.passed) for o in report.outputs],
                      "report_kernels": report.kernels, "table": str(report)}}))

class Both(torch.nn.Module):  # an opbridge op (its C++ kernel) and mmdeploy's, in one model
    def forward(self, x, grid):
        return mmdeploy_ops.grid_sampler(torch.ops.opbridge.identity_conv(x, 3), grid, 0, 0, 0)

x, grid = torch.randn(2, 3, 5, 6), torch.rand(2, 4, 7, 2) * 2 - 1
report = bridge.check_parity(Both(), (x, grid), tier="native", native_library=library)
print(json.dumps({{"modes": "both", "passed": report.passed, "report_kernels": report.kernels, "table": str(report)}}))
"""


@pytest.fixture(scope="module")
def parity_runs(mmdeploy_library, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("mmdeploy")
    code = PARITY.format(ops_dir=str(OPS.parent), library=mmdeploy_library, tmp=str(tmp), combos=COMBOS,
                         tol=TOLERANCE)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp, env=ENV, timeout=900)
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    runs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {tuple(run["modes"]) if isinstance(run["modes"], list) else run["modes"]: run for run in runs}


@pytest.mark.long
@pytest.mark.parametrize("modes", COMBOS, ids=lambda m: "mode{}_pad{}_align{}".format(*m))
def test_mmdeploy_library_runs_grid_sampler_nodes_like_eager(parity_runs, mmdeploy_library, modes):
    run = parity_runs[modes]
    # the node mmdeploy's symbolic writes, as torch.onnx.export(dynamo=False) writes it (attributes by keyword)
    mode, padding, align = modes
    ints = [["align_corners", align], ["interpolation_mode", mode], ["padding_mode", padding]]
    assert run["node"] == ["grid_sampler", 2, [[n, onnx.AttributeProto.INT, v] for n, v in ints]]
    assert run["node"] == run["legacy"]
    # every grid_sampler node ran mmdeploy's kernel, not the op's function body (the file carries one)
    assert run["kernels"] == {"mmdeploy::grid_sampler": mmdeploy_library}
    assert run["report_kernels"] == run["kernels"]
    assert f"kernel of mmdeploy::grid_sampler: {mmdeploy_library}" in run["table"]
    # batch 2, then batch 3 through the same file: eager F.grid_sample within rtol=atol=1e-5
    assert run["passed"], run["table"]
    assert [(shape, ok) for shape, _, ok in run["outputs"]] == [([2, 4, 5, 6], True), ([3, 4, 5, 6], True)]
    assert all(err <= TOLERANCE for _, err, _ in run["outputs"]), run["table"]


@pytest.mark.long
def test_opbridge_library_serves_its_ops_beside_a_user_library(parity_runs, mmdeploy_library):
    run = parity_runs["both"]
    assert run["passed"], run["table"]
    assert run["report_kernels"]["mmdeploy::grid_sampler"] == mmdeploy_library
    assert Path(run["report_kernels"]["opbridge::identity_conv"]).name == build.LIBRARY_NAME


PAGE = ROOT / "docs" / "kernel_libraries.md"


def test_the_pages_op_module_is_the_tests():
    assert doc_block("# mmdeploy_ops.py").code == OPS.read_text()


@pytest.mark.long
def test_the_pages_blocks_run_on_the_fetched_library(mmdeploy_library, tmp_path):
    """docs/kernel_libraries.md as written, from the extraction on, with the wheel already fetched."""
    wheels = mmdeploy_lib.LIBRARY.parent / "wheels"
    if not list(wheels.glob("mmdeploy-1.3.1-*.whl")):
        mmdeploy_lib.missing(f"wheel (in {wheels})")
    (tmp_path / "wheels").symlink_to(wheels)
    run = DocRun(tmp_path)
    blocks = [b for b in CODE if b.page == PAGE and "pip download" not in b.code]
    outputs = {}
    for block in blocks:
        result = run.run(block)
        assert result.ok, f"{block.id} failed:\n{block.code}\n--- output ---\n{result.output[-4000:]}"
        outputs[block.id] = result.output
    cli = next(out for b, out in zip(blocks, outputs.values()) if "opbridge --ops" in b.code)
    extracted = str(tmp_path / "mmdeploy_lib" / "libmmdeploy_onnxruntime_ops.so")
    # deploy_warp.py (bicubic, border), then check --model, check --op, run: each through the library
    assert cli.count(f"kernel of mmdeploy::grid_sampler: {extracted}") == 3, cli
    assert cli.count("ORT tier native vs eager torch | PASS") == 3 and "0 failed" in cli, cli
    assert "relu: shape [3, 4, 5, 6] float32" in cli and "(native tier)" in cli, cli
    assert "(4, 4, 5, 6)" in outputs[blocks[-1].id]
    # the page's sample of `check`'s output is the command's own (the library's folder shown as /...; the
    # errors' digits are this machine's)
    (sample,) = [b.code for b in BLOCKS if b.page == PAGE and b.lang == "text" and b.code.startswith("parity: ")]
    digits = re.compile(r"\d\.\d\de-\d\d")
    assert digits.sub("N", sample) in digits.sub("N", cli.replace(str(tmp_path), "/...")), (sample, cli)


@pytest.mark.long
def test_the_library_without_its_dependency_is_onnxruntimes_message(mmdeploy_library, tmp_path):
    alone = tmp_path / "libmmdeploy_onnxruntime_ops.so"
    shutil.copy(mmdeploy_library, alone)  # NOTE: without libonnxruntime.so.1.15.1 beside it (its RPATH)
    with pytest.raises(OpBridgeError, match=r"onnxruntime could not load the native library .*"
                                            r"libonnxruntime\.so\.1\.15\.1"):
        bridge.session(_identity_file(tmp_path), tier="native", native_library=alone)


def _identity_file(folder: Path) -> str:
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.identity_conv(x, 2)

    path = folder / "identity.onnx"
    if not path.exists():
        bridge.export(M(), (torch.randn(1, 2, 3, 3),), path)
    return str(path)


def test_native_library_paths_are_checked(tmp_path):
    model = _identity_file(tmp_path)
    with pytest.raises(OpBridgeError, match="no native kernel library at .*nope.so'. Got a missing file"):
        bridge.session(model, tier="native", native_library=tmp_path / "nope.so")
    with pytest.raises(OpBridgeError, match="is not a file. Got a folder"):
        bridge.session(model, tier="native", native_library=tmp_path)
    text = tmp_path / "libtext.so"
    text.write_text("not a library")
    with pytest.raises(OpBridgeError, match=r"onnxruntime could not load the native library .*libtext.so'. Got "
                                            r"Fail: .*(invalid ELF header|file too short)"):
        bridge.session(model, tier="native", native_library=text)
    with pytest.raises(OpBridgeError, match="native_library= loads custom-op libraries for tier 'native' only"):
        bridge.session(model, native_library=text)
    # NOTE: an interrupted copy of a real library: before, loading it killed the process (SIGBUS)
    cut = tmp_path / "libcut.so"
    cut.write_bytes(pathlib.Path(build.library_path()).read_bytes()[:20000])
    with pytest.raises(OpBridgeError, match=r"libcut.so' is cut short: its ELF headers describe \d+ bytes\. Got a file "
                                            r"of 20000 bytes"):
        bridge.session(model, tier="native", native_library=cut)


def test_cli_names_a_bad_library_in_one_line(tmp_path):
    np.savez(tmp_path / "identity.inputs.npz", x=np.ones((1, 2, 3, 3), np.float32))
    r = subprocess.run([sys.executable, "-m", "bridge", "run", _identity_file(tmp_path), "--native-library",
                        str(tmp_path / "nope.so")], capture_output=True, text=True, cwd=tmp_path, env=ENV,
                       timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: opbridge: no native kernel library at"), r.stderr


def test_a_prebuilt_opbridge_library_serves_every_node_it_knows(tmp_path):
    """opbridge's own library passed as native_library: onnxruntime, asked, says it serves the demo's ops."""
    case = demo.build()
    path = tmp_path / "demo.onnx"
    bridge.export(case.model, case.args, path, dynamic_shapes=case.dynamic_shapes)
    library = str(build.library_path())
    sess = bridge.session(path, tier="native", native_library=library)
    # every custom node of the file (main graph; the demo has no branches) has its kernel in the library
    nodes = {f"{n.domain}::{n.op_type}" for n in onnx.load(path).graph.node if n.domain not in ("", "ai.onnx")}
    assert nodes == {"opbridge::identity_conv", "bev::bev_pool_v2"}
    assert set(sess.kernels) == nodes
    assert set(sess.kernels.values()) == {library}


def test_a_library_serving_none_of_the_nodes_is_not_loaded(tmp_path, capsys):
    """onnxruntime-extensions' library serves ai.onnx.contrib ops only: opbridge's library runs the node, and
    the session, its progress line and a parity report say the library does not serve it, and why."""
    bridge.progress.enable()
    try:
        sess = bridge.session(_identity_file(tmp_path), tier="native", native_library=get_library_path())
    finally:
        bridge.progress.enable(False)
    assert sess.kernels == {"opbridge::identity_conv": str(build.library_path())}
    why = (f"is not served by {os.path.basename(get_library_path())} (onnxruntime finds no kernel for it there): "
           f"{os.path.basename(build.library_path())} runs it")
    assert sess.unserved == {"opbridge::identity_conv": why}
    assert f"; opbridge::identity_conv {why}) ..." in capsys.readouterr().err
    x = torch.randn(1, 2, 3, 3)
    assert torch.equal(torch.from_numpy(sess.run(None, {"x": x.numpy()})[0]), x)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.identity_conv(x, 2)

    report = bridge.check_parity(M(), (x,), tier="native", native_library=get_library_path())
    assert report.passed and report.unserved == {"opbridge::identity_conv": why}
    assert f"opbridge::identity_conv {why}" in str(report).splitlines()
    assert report.to_dict()["unserved"] == {"opbridge::identity_conv": why}


@pytest.mark.long
def test_a_domain_served_by_both_libraries_is_refused_before_onnxruntime(mmdeploy_library, registry):
    """onnxruntime takes a custom domain from one library ("Domain already set in registry"): an op of
    the same domain with an opbridge C++ kernel, in one model with mmdeploy's node, is an error first."""
    @bridge.op("mmdeploy::p33b_twice", fake=lambda x: torch.empty_like(x), registry=registry,
               native="user_ops/mmdeploy_twice.cc", dtypes=(torch.float32,),
               sample_inputs=lambda dtype: [bridge.SampleInput((torch.ones(2, dtype=dtype),))])
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    nodes = [onnx.helper.make_node("grid_sampler", ["x", "grid"], ["s"], domain="mmdeploy", interpolation_mode=0,
                                   padding_mode=0, align_corners=0),
             onnx.helper.make_node("p33b_twice", ["s"], ["y"], domain="mmdeploy")]
    value = lambda name: onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)  # noqa: E731
    model = onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", [value("x"), value("grid")], [value("y")]),
                                   opset_imports=[onnx.helper.make_opsetid("", 18),
                                                  onnx.helper.make_opsetid("mmdeploy", 1)])
    with pytest.raises(OpBridgeError, match=r"serves domain 'mmdeploy' \(libmmdeploy_onnxruntime_ops.so\), which "
                                            r"opbridge's library registers too.*Got ops \['mmdeploy::grid_sampler'\]"):
        bridge.session(model, tier="native", native_library=mmdeploy_library, registry=registry)


def test_every_test_needing_mmdeploy_is_long_and_ci_fetches_it_or_fails():
    """The README's default command (``-m 'not slow and not long'``) never needs mmdeploy's library; CI's
    ``-m long`` run does, and .ci/run fetches it with no fallback: a failed fetch fails CI, and only the
    explicit $OPBRIDGE_TEST_NO_MMDEPLOY=1 skips it, printing what is left unchecked (issue #46)."""
    import ast

    needing = {}  # test file -> its tests that take the library (the fixture, or mmdeploy_lib)
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        fixtures = {"mmdeploy_library", "parity_runs"} if path.name == Path(__file__).name else set()
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
            uses = ({a.arg for a in fn.args.args} & fixtures) or any(
                isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "mmdeploy_lib"
                for n in ast.walk(fn))
            if uses:
                marks = {ast.unparse(d) for d in fn.decorator_list}
                assert "pytest.mark.long" in marks, f"{path.name}::{fn.name} needs mmdeploy's library: mark it long"
                needing.setdefault(path.name, []).append(fn.name)
    assert len(needing.get(Path(__file__).name, [])) == 5 and "test_upstream_functions.py" in needing, needing
    ci = (ROOT / ".ci" / "run").read_text()
    fetch = [line.strip() for line in ci.splitlines() if "fetch_mmdeploy.py" in line and not line.strip().startswith("#")]
    assert fetch and not any("||" in line for line in fetch), fetch
    assert f'"${{{OFFLINE}:-}}" = 1' in ci and "left unchecked" in ci


@pytest.mark.parametrize("offline", [False, True], ids=["online", "offline"])
def test_a_missing_mmdeploy_library_fails_unless_the_run_says_offline(tmp_path, offline):
    """Without the library a test that needs it fails (naming the fetch command and the opt-out); with
    $OPBRIDGE_TEST_NO_MMDEPLOY=1 it skips, saying what it left unchecked."""
    env = dict(ENV, OPBRIDGE_TEST_MMDEPLOY_LIB=str(tmp_path / "none.so"))
    env.pop(OFFLINE, None)
    if offline:
        env[OFFLINE] = "1"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "long", "-k",
                        "without_its_dependency", str(Path(__file__))], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    if offline:
        assert r.returncode == 0 and "1 skipped" in r.stdout and "left unchecked" in r.stdout, r.stdout[-2000:]
    else:
        assert r.returncode == 1 and "1 error" in r.stdout, r.stdout[-2000:]
        assert FETCH in r.stdout and f"{OFFLINE}=1" in r.stdout, r.stdout[-2000:]


def test_the_pages_error_samples_are_the_messages(tmp_path, monkeypatch):
    """docs/kernel_libraries.md's 'What fails' lines, but the load failure (mmdeploy's library, a long test's),
    are what opbridge says."""
    (shown,) = [b.code for b in BLOCKS if b.page == PAGE and b.lang == "text" and b.code.startswith("opbridge: no ")]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mmdeploy_lib").mkdir()
    model = _identity_file(tmp_path)
    said = []
    for call in (lambda: check_library("nope.so"), lambda: check_library("mmdeploy_lib"),
                 lambda: bridge.session(model, tier="function", native_library="mmdeploy_lib")):
        with pytest.raises(OpBridgeError) as e:
            call()
        said.append(str(e.value))
    lines = shown.splitlines()
    assert [lines[0], lines[1], lines[3]] == said


INNER_KERNEL = """
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Inner {
  static Status Read(const Attributes&, Inner*) { return Status::OK(); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = in[i] * 1000.f + 8.f;
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef SYMBOL = make_kernel<Inner>();
}  // namespace opbridge
"""


def test_a_user_library_serves_its_op_inside_another_ops_body(registry, fresh_name, tmp_path):
    # NOTE: red team 4: the library's op, called only inside another op's body, ran that body's function
    # (10 where the library gives 2008) and session.kernels named only the outer op
    from onnxscript import opset20 as op
    from onnxscript import script, values

    inner_name = fresh_name("inner")

    @script(values.Opset(inner_name.split("::")[0], 1), default_opset=op)
    def inner(x):
        return op.Mul(x, op.Constant(value_float=5.0))

    inner_body = inner

    source = tmp_path / "inner.cc"
    source.write_text(INNER_KERNEL.replace("SYMBOL", op_names(inner_name).symbol))
    theirs = bridge.Registry()  # NOTE: the user's library: built elsewhere, from its own registry

    @bridge.op(inner_name, fake=lambda x: torch.empty_like(x), function=inner_body, native=str(source),
               registry=theirs, sample_inputs=lambda dtype: [bridge.SampleInput((torch.ones(3, dtype=dtype),))])
    def inner_op(x: torch.Tensor) -> torch.Tensor:
        return x * 5

    library = tmp_path / "libtheirs.so"
    shutil.copy(build.library_path(theirs), library)
    bridge.register(theirs.get(inner_name).overload, function=inner_body, registry=registry)
    outer_name = fresh_name("outer")
    inner_domain = values.Opset(inner_name.split("::")[0], 1)

    @script(values.Opset(outer_name.split("::")[0], 1), default_opset=op)
    def outer(x):
        return op.Add(inner_domain.inner(x), op.Constant(value_float=1.0))  # NOTE: the inner op's node

    @bridge.op(outer_name, fake=lambda x: torch.empty_like(x), function=outer, registry=registry)
    def outer_op(x: torch.Tensor) -> torch.Tensor:
        return inner_op(x) + 1

    class M(torch.nn.Module):
        def forward(self, x):
            return outer_op(x)

    path = tmp_path / "nested.onnx"
    proto = bridge.export(M(), (torch.full((3,), 2.0),), path, registry=registry)
    assert [n.op_type for n in proto.graph.node] == ["outer"], [f.name for f in proto.functions]
    sess = bridge.session(path, tier="native", registry=registry, native_library=library)
    assert sess.kernels == {inner_name: str(library), outer_name: "function body"}
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: np.full(3, 2.0, np.float32)})[0],
                                  np.full(3, 2009.0, np.float32))


def _inner_library(theirs: bridge.Registry, name: str, tmp_path: Path, kernel: str = INNER_KERNEL) -> Path:
    """A user's library serving ``name`` (x * 1000 + 8), built from its own registry and copied out."""
    source = tmp_path / "inner.cc"
    source.write_text(kernel.replace("SYMBOL", op_names(name).symbol))

    @bridge.op(name, fake=lambda x: torch.empty_like(x), native=str(source), registry=theirs,
               sample_inputs=lambda dtype: [bridge.SampleInput((torch.ones(3, dtype=dtype),))])
    def inner_op(x: torch.Tensor) -> torch.Tensor:
        return x * 5

    library = tmp_path / "libtheirs.so"
    shutil.copy(build.library_path(theirs), library)
    return library


def test_a_user_library_serves_its_op_inside_if_and_loop_bodies(registry, fresh_name, tmp_path, capsys):
    # NOTE: the library's op only inside an If branch and a Loop body: the library runs it there (x * 1000 + 8,
    # where the op's own body gives x * 5), session.kernels says so, and the progress line names it first
    name = fresh_name("inner")
    theirs = bridge.Registry()  # NOTE: the user's library: built elsewhere, from its own registry
    library = _inner_library(theirs, name, tmp_path)
    bridge.register(theirs.get(name).overload, registry=registry)  # NOTE: its body is derived (x * 5)
    domain, op_type = name.split("::")
    vec = onnx.helper.make_tensor_value_info
    then_branch = onnx.helper.make_graph([onnx.helper.make_node(op_type, ["x"], ["t"], domain=domain)], "then", [],
                                         [vec("t", onnx.TensorProto.FLOAT, [3])])
    else_branch = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["e"])], "else", [],
                                         [vec("e", onnx.TensorProto.FLOAT, [3])])
    body = onnx.helper.make_graph(
        [onnx.helper.make_node(op_type, ["v"], ["v_out"], domain=domain),
         onnx.helper.make_node("Identity", ["c"], ["c_out"])], "body",
        [vec("i", onnx.TensorProto.INT64, []), vec("c", onnx.TensorProto.BOOL, []), vec("v", onnx.TensorProto.FLOAT, [3])],
        [vec("c_out", onnx.TensorProto.BOOL, []), vec("v_out", onnx.TensorProto.FLOAT, [3])])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["cond"], ["y_if"], then_branch=then_branch, else_branch=else_branch),
         onnx.helper.make_node("Constant", [], ["trips"], value=onnx.helper.make_tensor("n", onnx.TensorProto.INT64,
                                                                                           [], [1])),
         onnx.helper.make_node("Loop", ["trips", "cond", "x"], ["y_loop"], body=body)], "g",
        [vec("x", onnx.TensorProto.FLOAT, [3]), vec("cond", onnx.TensorProto.BOOL, [])],
        [vec("y_if", onnx.TensorProto.FLOAT, [3]), vec("y_loop", onnx.TensorProto.FLOAT, [3])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                         onnx.helper.make_opsetid(domain, 1)], ir_version=9)
    bridge.progress.enable()
    try:
        sess = bridge.session(model.SerializeToString(), tier="native", registry=registry, native_library=library)
    finally:
        bridge.progress.enable(False)
    assert sess.kernels == {name: str(library)}
    assert f"onnxruntime session (native tier; native code: libtheirs.so serves {name}) ..." in capsys.readouterr().err
    x = np.array([1.0, 2.0, -3.0], np.float32)
    y_if, y_loop = sess.run(None, {"x": x, "cond": np.array(True)})
    np.testing.assert_array_equal(y_if, x * 1000 + 8)
    np.testing.assert_array_equal(y_loop, x * 1000 + 8)
    # NOTE: without the library the op's own body runs: the figures above are the library's
    plain = bridge.session(model.SerializeToString(), tier="function", registry=registry)
    np.testing.assert_array_equal(plain.run(None, {"x": x, "cond": np.array(True)})[0], x * 5)


CRASH_OPS = """
import torch, bridge
from bridge.tools.testing import ModelCase


@bridge.op(NAME, fake=lambda x: torch.empty_like(x))
def boom(x: torch.Tensor) -> torch.Tensor:
    return x * 5


class M(torch.nn.Module):
    def forward(self, x):
        return boom(x) + 1


def case():
    return ModelCase(M(), (torch.ones(3),))
"""


def test_a_kernel_that_crashes_under_check_leaves_a_line_naming_its_library_and_op(fresh_name, tmp_path):
    # NOTE: red team 4: a segfaulting kernel ended `opbridge check --native-library` (-11) with nothing
    # naming the library or the op
    name = fresh_name("boom")
    library = _inner_library(bridge.Registry(), name, tmp_path, INNER_KERNEL.replace(
        "out[i] = in[i] * 1000.f + 8.f;", "out[i] = *static_cast<volatile float*>(nullptr);"))
    (tmp_path / "crash_ops.py").write_text(CRASH_OPS.replace("NAME", repr(name)))
    env = dict(ENV, PYTHONPATH=str(tmp_path) + os.pathsep + ENV["PYTHONPATH"])
    r = forkserver.run(["-m", "bridge", "--ops", "crash_ops", "check", "--model", "crash_ops:case",
                        "--native-library", str(library)], cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == -11, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    crash = next(i for i, line in enumerate(lines) if "Segmentation fault" in line)
    named = [line for line in lines[:crash] if f"native code: {library.name} serves {name}" in line]
    assert named and named[-1].endswith("..."), r.stderr  # the step that was running when it crashed


def test_under_quiet_a_crashing_kernel_leaves_one_line_naming_its_library_and_op(fresh_name, tmp_path):
    # NOTE: #43 item 3: -q silences the progress line that names the library; a crash still leaves one line
    # naming it (its path) and the op, before faulthandler's stack, and a run that ends well prints nothing
    runs = {}
    for kind, body in (("bad", "*static_cast<volatile float*>(nullptr)"), ("good", "in[i] * 5.f")):
        name, folder = fresh_name(kind), tmp_path / kind
        folder.mkdir()
        library = _inner_library(bridge.Registry(), name, folder, INNER_KERNEL.replace(
            "out[i] = in[i] * 1000.f + 8.f;", f"out[i] = {body};"))
        (folder / "crash_ops.py").write_text(CRASH_OPS.replace("NAME", repr(name)))
        env = dict(ENV, PYTHONPATH=str(folder) + os.pathsep + ENV["PYTHONPATH"])
        runs[kind] = name, library, forkserver.run(
            ["-m", "bridge", "-q", "--ops", "crash_ops", "check", "--model", "crash_ops:case", "--native-library",
             str(library)], cwd=folder, env=env, timeout=600)
    name, library, r = runs["bad"]
    assert r.returncode == -11, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    crash = lines.index("Fatal Python error: Segmentation fault")
    named = [line for line in lines if str(library) in line and name in line]
    assert len(named) == 1 and lines.index(named[0]) < crash, r.stderr
    assert named[0].startswith("opbridge: native code ended this process (Segmentation fault) while running "), r.stderr
    assert f"Got {library} serving {name}. Fix the kernels of that library" in named[0], r.stderr
    assert not any(line.startswith("[opbridge]") for line in lines), r.stderr  # -q: no progress line
    name, library, r = runs["good"]
    assert r.returncode == 0 and "PASS" in r.stdout and r.stderr == "", r.stdout + r.stderr
