"""Localizing a parity failure: the first ONNX node whose value leaves tolerance while its inputs are fine.

Two deliberately broken models:
- ``LeakyModel``: standard ops around a custom op whose ONNX function body flips the sign on the
  negative branch only (eager is right), so only the function tier diverges, and only for
  negative inputs;
- ``HalfMulModel``: standard ops around the seed ops ``identity_conv`` and the mutating
  ``numpy_sin`` (exported as its functional twin); ``half_mul_translation`` makes the export
  route the ``Mul``'s input through float16 and back, so every tier diverges at that ``Mul``.
"""

import importlib
import json
import os
import re
import sys
from pathlib import Path

import onnx
import pytest
import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
import bridge.tools.localize
import bridge.tools.parity
from bridge.tools.cli import main
from bridge.tools.testing import ModelCase
from exporters.bodies.translation import translation_table
from exporters.export import export_with_program

ROOT = Path(__file__).resolve().parents[1]
_export_module = importlib.import_module("exporters.export")  # the package re-exports `export` over it


def declare_leaky(registry, qualname: str):
    """A leaky ReLU op ``NS::leaky(x, slope)`` whose function body is wrong for negative x only."""
    domain, name = qualname.split("::")
    assert name == "leaky"

    @script(values.Opset(domain, 1), default_opset=op)
    def leaky(x, slope: float):
        zero = op.CastLike(op.Constant(value_float=0.0), x)
        s = op.CastLike(op.Constant(value_float=slope), x)
        return op.Where(op.Less(x, zero), op.Mul(op.Neg(x), s), x)  # the bug: -x * slope

    @bridge.op(qualname, fake=lambda x, slope: torch.empty_like(x), function=leaky, registry=registry)
    def leaky_op(x: torch.Tensor, slope: float) -> torch.Tensor:
        return torch.where(x < 0, x * slope, x)

    return leaky_op


class LeakyModel(torch.nn.Module):
    def __init__(self, leaky):
        super().__init__()
        self.leaky = leaky
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.lin = torch.nn.Linear(6, 5)

    def forward(self, x):
        y = torch.tanh(x) * 2.0
        return self.lin(self.conv(self.leaky(y, 0.1))).softmax(-1)


BATCH = ({0: torch.export.Dim("batch")},)


def half_mul(a, b):
    """aten.mul with its first operand rounded through float16: a wrong dtype on purpose."""
    return op.Mul(op.Cast(op.Cast(a, to=onnx.TensorProto.FLOAT16), to=onnx.TensorProto.FLOAT), b)


def half_mul_translation(registry):
    return {**translation_table(registry), torch.ops.aten.mul.Tensor: half_mul}


class HalfMulModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = torch.ops.opbridge.identity_conv(torch.relu(self.lin(x)), 4)
        s = torch.empty_like(y)
        torch.ops.opbridge.numpy_sin(y, s)  # mutating: exported as its functional twin
        return (s * 3.0).sum(-1)


def half_mul_case() -> ModelCase:
    """``--model`` factory for the CLI: installs the float16 translation in this process, then the case."""
    _export_module.translation_table = half_mul_translation
    g = torch.Generator().manual_seed(0)
    # NOTE: static shapes: ONNX shape inference gives numpy_sin's two inputs distinct batch symbols
    # under a dynamic batch and its fake kernel refuses them (bridge.schema, unrelated to localizing)
    return ModelCase(HalfMulModel(), (torch.randn(2, 4, 5, 6, generator=g),), None,
                     ((torch.randn(2, 4, 5, 6, generator=g),),), "HalfMulModel")


def onnx_node(path, op_type: str) -> onnx.NodeProto:
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type == op_type]
    assert len(nodes) == 1, nodes
    return nodes[0]


@pytest.fixture
def half_mul_export(monkeypatch):
    monkeypatch.setattr(_export_module, "translation_table", half_mul_translation)


def leaky_inputs():
    g = torch.Generator().manual_seed(0)
    positive = torch.rand(2, 3, 6, 6, generator=g) + 0.1  # the bug never shows
    mixed = torch.randn(3, 3, 6, 6, generator=g)  # another batch size: dynamic shapes
    return positive, mixed


def test_custom_op_function_body_bug_is_localized_to_its_node(registry, fresh_name, tmp_path):
    qualname = fresh_name("leaky")
    model = LeakyModel(declare_leaky(registry, qualname))
    positive, mixed = leaky_inputs()
    path = tmp_path / "leaky.onnx"
    report = bridge.check_parity(model, (positive,), extra_args=((mixed,),), dynamic_shapes=BATCH,
                                 registry=registry, path=path, localize=True)
    assert [o.passed for o in report.outputs] == [True, False]
    d = report.first_divergence
    assert d is not None and report.localization.run == 2
    leaky = onnx_node(path, "leaky")
    assert d.node == leaky.name
    assert d.onnx_op == qualname and d.torch_op == qualname.replace("::", ".") + ".default"
    assert d.inputs_ok and d.inputs == [leaky.input[0]]  # tanh(x) * 2.0 reached the op intact
    assert "Where" in d.body  # the function body the function tier ran
    assert d.worst and all(w["eager"] < 0 < w["ort"] for w in d.worst)  # negatives only, sign flipped
    # every node before it agrees, every node after it inherits the error
    order = [n.node for n in report.localization.nodes]
    at = order.index(d.node)
    assert all(n.passed for n in report.localization.nodes[:at])
    assert all(not n.passed and not n.inputs_ok for n in report.localization.nodes[at + 1:])
    assert {n.onnx_op for n in report.localization.nodes[:at]} >= {"::Tanh", "::Mul"}


@pytest.mark.parametrize("tier", ["function", "native"])
def test_wrong_dtype_into_a_standard_op_is_localized_to_that_node(tier, half_mul_export, tmp_path):
    case = half_mul_case()
    path = tmp_path / "half.onnx"
    report = bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes,
                                 extra_args=case.extra_args, tier=tier, path=path, localize=True)
    assert not report.passed
    d = report.first_divergence
    mul = onnx_node(path, "Mul")
    assert (d.node, d.onnx_op, d.torch_op) == (mul.name, "::Mul", "aten.mul.Tensor")
    assert d.inputs_ok and d.inputs == [onnx_node(path, "numpy_sin").output[0]]
    assert [v.split(" ")[1] for v in d.via] == ["(Cast)", "(Cast)", "(Mul)"]  # the float16 round trip
    by_op = {n.onnx_op: n for n in report.localization.nodes}
    # the custom nodes (the mutating op through its functional twin) ran in this tier and agree
    assert by_op["opbridge::identity_conv"].passed and by_op["opbridge::numpy_sin"].passed
    assert by_op["opbridge::numpy_sin"].torch_op == "opbridge.numpy_sin_functional.default"
    # float16 rounding: relative error near 2**-11, far past float32's 1e-5
    worst = d.worst_output
    assert 1e-5 < worst.max_rel < 2 ** -10 and worst.mismatches > 0


def test_an_edited_onnx_file_is_localized_through_localize(tmp_path):
    """An ONNX edit after export (the ReduceSum fed a float16 round trip) is found by localize()."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 5, 6, generator=g)
    exported = export_with_program(HalfMulModel(), (x,))
    proto = exported.proto
    reduce = next(n for n in proto.graph.node if n.op_type == "ReduceSum")
    source = reduce.input[0]
    casts = [onnx.helper.make_node("Cast", [source], ["edit_f16"], to=onnx.TensorProto.FLOAT16, name="edit_to_f16"),
             onnx.helper.make_node("Cast", ["edit_f16"], ["edit_f32"], to=onnx.TensorProto.FLOAT, name="edit_to_f32")]
    at = list(proto.graph.node).index(reduce)
    for i, node in enumerate(casts):
        proto.graph.node.insert(at + i, node)
    reduce.input[0] = "edit_f32"
    loc = bridge.localize.localize(exported.program, proto, (x,), compare=bridge.compare)
    d = loc.first_divergence
    assert (d.node, d.onnx_op, d.torch_op) == (reduce.name, "::ReduceSum", "aten.sum.dim_IntList")
    assert d.inputs == [source] and d.inputs_ok
    assert [v.split(" ")[0] for v in d.via] == ["edit_to_f16", "edit_to_f32", reduce.name]
    assert loc.uncompared == 3  # linear's MatMul and the two edits: covered by the nodes after them


def test_report_text_json_plot_and_assert_name_the_node(half_mul_export, tmp_path):
    case = half_mul_case()
    report = bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes, localize=True)
    node = report.first_divergence.node
    text = str(report)
    assert f"first divergence at ONNX node {node!r} ::Mul (aten.mul.Tensor)" in text
    assert "<- first divergence" in text and "computed by ONNX nodes:" in text
    data = json.loads(report.to_json())
    assert data["localization"]["first_divergence"]["node"] == node
    assert data["localization"]["first_divergence"]["inputs_ok"] is True
    assert [n["passed"] for n in data["localization"]["nodes"]][-2:] == [False, False]
    png = report.plot(tmp_path / "errors.png")
    assert Path(png).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(AssertionError, match=rf"parity failed: first divergence at ONNX node '{node}'"):
        bridge.assert_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes)


def test_a_passing_check_never_localizes(monkeypatch):
    """localize=True costs nothing when parity passes: no second session, no eager pass."""
    def refuse(*args, **kwargs):
        raise AssertionError("localization ran on a passing check")

    monkeypatch.setattr(bridge.parity, "localize_run", refuse)
    monkeypatch.setattr(bridge.localize, "session", refuse)
    monkeypatch.setattr(bridge.localize, "eager_values", refuse)
    model, x = HalfMulModel(), torch.randn(2, 4, 5, 6)  # without the float16 translation: it passes
    report = bridge.check_parity(model, (x,), extra_args=((torch.randn(2, 4, 5, 6),),), localize=True)
    assert report.passed and report.localization is None and report.first_divergence is None
    assert bridge.assert_parity(model, (x,)).localization is None


def test_localize_always_compares_a_passing_model(tmp_path):
    x = torch.randn(2, 4, 5, 6)
    report = bridge.check_parity(HalfMulModel(), (x,), localize="always")
    assert report.passed and report.first_divergence is None
    loc = report.localization
    assert loc.nodes and all(n.passed and n.inputs_ok for n in loc.nodes)
    assert "no intermediate leaves tolerance" in str(report)
    with pytest.raises(bridge.OpBridgeError, match=r"localize must be True, False or 'always'. Got 'yes'"):
        bridge.check_parity(HalfMulModel(), (x,), localize="yes")


def test_cli_check_localize(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_export_module, "translation_table", translation_table)  # restored after the factory's patch
    out = tmp_path / "report.json"
    code = main(["-q", "check", "--model", "tests.test_localize:half_mul_case", "--localize", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 1 and "first divergence at ONNX node 'node_mul' ::Mul (aten.mul.Tensor)" in text
    data = json.loads(out.read_text())
    assert data[0]["localization"]["first_divergence"]["node"] == "node_mul"


_PYTHON_TIER = """
import json, sys, torch, onnx
import custom_ops  # noqa: F401
import bridge
from tests import test_localize as t
case = t.half_mul_case()
path = sys.argv[1] + "/half.onnx"
half = bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes, tier="python",
                           extra_args=case.extra_args, path=path, localize=True)
d = half.first_divergence
mul = [n.name for n in onnx.load(path).graph.node if n.op_type == "Mul"]
print(json.dumps({"node": d.node, "mul": mul, "op": d.op, "inputs_ok": d.inputs_ok, "run": half.localization.run,
                  "custom": {n.onnx_op: n.passed for n in half.localization.nodes if n.onnx_op.startswith("opbridge")},
                  "text": str(half)}))
"""

_PYTHON_TIER_LEAKY = """
import json, torch
import bridge
from tests import test_localize as t
reg = bridge.Registry()
model = t.LeakyModel(t.declare_leaky(reg, "pyloc::leaky"))
positive, mixed = t.leaky_inputs()
r = bridge.check_parity(model, (positive,), extra_args=((mixed,),), dynamic_shapes=t.BATCH, registry=reg,
                        tier="python", localize=True)
print(json.dumps({"passed": r.passed, "localized": r.localization is not None, "text": str(r)}))
"""


def _python_tier(script_: str, tmp_path) -> dict:
    # NOTE: a process of its own: the python tier declares every op at a process's first session.
    # forkserver is imported here, not at the top: the scripts import this module (`from tests import
    # test_localize`) where tests/ is not on sys.path
    import forkserver

    r = forkserver.run(["-c", script_, str(tmp_path)], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_python_tier_localizes_the_wrong_dtype_node(tmp_path):
    out = _python_tier(_PYTHON_TIER, tmp_path)
    assert [out["node"]] == out["mul"] and out["op"] == "::Mul (aten.mul.Tensor)", out["text"]
    assert out["inputs_ok"] and out["run"] == 1
    assert out["custom"] == {"opbridge::identity_conv": True, "opbridge::numpy_sin": True}  # python kernels


def test_python_tier_runs_the_leaky_ops_eager_code_so_its_body_bug_cannot_show(tmp_path):
    # NOTE: the python tier's kernel is the op's own eager implementation, not its function body
    out = _python_tier(_PYTHON_TIER_LEAKY, tmp_path)
    assert out["passed"] and not out["localized"], out["text"]


def _skeleton(text: str) -> list[str]:
    """The text without its numbers and column padding: what a fresh run must reproduce exactly."""
    number = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")
    return [" ".join(number.sub("#", line).split()) for line in text.strip().splitlines()]


def test_readme_parity_failure_example_prints_what_the_readme_shows(tmp_path):
    # NOTE: imported here, not at the top: other tests import this module in a subprocess
    # (`from tests import test_localize`), where tests/ is not on sys.path
    import forkserver
    from test_doc_blocks import doc_block

    code = doc_block("# parity_failure.py").code
    page = doc_block("# parity_failure.py").page.read_text()
    shown = re.search(r"checks this block against a fresh run\):\n\n```text\n(.*?)```", page, re.S).group(1)
    (tmp_path / "parity_failure.py").write_text(code)
    r = forkserver.run(["parity_failure.py"], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _skeleton(r.stdout) == _skeleton(shown)
    assert "first divergence at ONNX node 'node_leaky' mine::leaky" in r.stdout


@pytest.mark.slow
def test_localize_cost_benchmark_runs(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import localize_cost

    result = localize_cost.main(["--repeats", "1", "--json", str(tmp_path / "cost.json")])
    passing, failing = result["passing"]["calls"], result["failing"]["calls"]
    assert passing["True"] == passing["False"] == {"sessions": 1, "eager interpretations": 0, "passed": True,
                                                     "localization_s": 0.0}
    assert (failing["False"]["sessions"], failing["True"]["sessions"]) == (1, 2)
    assert failing["True"]["eager interpretations"] == 1 and not failing["True"]["passed"]
    assert (tmp_path / "cost.json").exists()
