"""Inlined export: standard ONNX only, runs in onnxruntime and OpenVINO, matches eager.

OpenVINO comes with the test extra (pyproject.toml), so its tests run in the default suite.
"""

import doctest
import importlib.util
import os
import sys
from pathlib import Path

import forkserver
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import bridge
import custom_ops.demo as demo
import exporters.inline
from bridge.core.basics.graphs import nonstandard_ops
from bridge.tools import openvino_runtime
from bridge.tools.cli import main
from bridge.tools.parity import TOLERANCES, run_ort
from bridge.tools.testing import OpModule, cases
from exporters.inline import inline_functions
from tests.models import HeldOut, crop_in_a_branch, held_out_ops

ROOT = Path(__file__).resolve().parents[1]
assert importlib.util.find_spec("openvino") is not None, "openvino is part of the test extra: pip install -e '.[test]'"


def openvino_test(fn):  # NOTE: a label for readers; a missing openvino fails above, it is never skipped
    return fn
# NOTE: OpenVINO's CPU plugin computes float64 in f32 precision (see bridge.openvino_runtime)
OPENVINO_F64 = {"rtol": {torch.float64: TOLERANCES[torch.float32][0]},
                "atol": {torch.float64: TOLERANCES[torch.float32][1]}}


@pytest.fixture(scope="module")
def demo_inline(tmp_path_factory):
    """`opbridge export --inline -o demo_inline.onnx`, as a user runs it."""
    path = tmp_path_factory.mktemp("inline") / "demo_inline.onnx"
    assert main(["-q", "export", "--inline", "-o", str(path)]) == 0
    return demo.build(), path


def _frames(case):
    return [tuple(case.args), *map(tuple, case.extra_args)]


def test_demo_inlined_file_is_standard_onnx_with_dynamic_points(demo_inline):
    _, path = demo_inline
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert not model.functions and nonstandard_ops(model) == []
    assert {n.domain for n in model.graph.node} == {""}
    assert [o.domain for o in model.opset_import] == [""]  # bev and opbridge imports removed
    assert len(model.graph.node) > 50  # 14 nodes before, 86 measured after with the pinned versions
    assert len(model.graph.value_info) > 50  # shapes inferred for the inlined intermediates
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    points = dims["ranks_depth"][0]
    assert isinstance(points, str) and points and dims["ranks_feat"] == dims["ranks_bev"] == [points]
    assert isinstance(dims["interval_starts"][0], str)
    assert dims["images"] == [1, 6, 3, 8, 22]


def test_demo_inlined_matches_eager_in_onnxruntime(demo_inline):
    case, path = demo_inline
    sess = bridge.session(path)
    counts = set()
    for args in _frames(case):
        counts.add(args[1].numel())
        with torch.no_grad():
            expected = case.model(*args)
        row = bridge.compare("out", expected, run_ort(sess, args)[0])
        assert row.passed, row
    assert len(counts) == 3  # one file, three point counts


@openvino_test
def test_demo_inlined_runs_in_openvino_compile_model(demo_inline):
    import openvino as ov

    case, path = demo_inline
    # NOTE: f32 pinned: OpenVINO's CPU plugin otherwise runs bf16 where the processor has it
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    names = [i.name for i in onnx.load(path).graph.input]
    for args in _frames(case):
        with torch.no_grad():
            expected = case.model(*args)
        got = compiled({n: a.numpy() for n, a in zip(names, args)})[compiled.output(0)]
        row = bridge.compare("out", expected, got)
        assert row.passed, row


@openvino_test
def test_check_inline_runtime_openvino_cli(tmp_path, capsys):
    code = main(["-q", "check", "--inline", "--runtime", "openvino", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "OpenVINO tier inlined" in out and "[run 3]" in out and "1 passed, 0 failed" in out


class AllCases(torch.nn.Module):
    """One module calling each case's op on its own inputs: one export for many op x sample cases."""

    def __init__(self, chosen):
        super().__init__()
        built = [OpModule.from_sample(c.spec, c.sample) for c in chosen]
        self.ops = torch.nn.ModuleList(m for m, _ in built)
        self.arity = [len(a) for _, a in built]
        self.example = tuple(t.clone() for _, a in built for t in a)  # no aliased graph inputs

    def forward(self, *tensors):
        outs, i = [], 0
        for m, n in zip(self.ops, self.arity):
            out = m(*tensors[i:i + n])
            i += n
            outs.extend(out if isinstance(out, tuple) else (out,))
        return tuple(outs)


def _empty(case) -> bool:
    module, tensors = OpModule.from_sample(case.spec, case.sample)
    with torch.no_grad():
        out = module(*[t.clone() for t in tensors])
    return any(t.numel() == 0 for t in (*tensors, *(out if isinstance(out, tuple) else (out,))))


@pytest.fixture(scope="module")
def seed_cases():
    """(non-empty cases, their module, its inlined proto), (empty cases, module, proto)."""
    with_body = [s for s in bridge.REGISTRY if s.function is not None]
    assert {s.qualname for s in with_body} >= {"bev::bev_pool_v2", "opbridge::identity_conv", "opbridge::crop",
                                               "opbridge::paste", "opbridge::numpy_sin"}
    every = cases(with_body)
    groups = []
    for chosen in ([c for c in every if not _empty(c)], [c for c in every if _empty(c)]):
        module = AllCases(chosen).eval()
        proto = bridge.export(module, [t.clone() for t in module.example], inline=True)
        groups.append((chosen, module, proto))
    return groups


def _check_all(chosen, module, sess, **tol):
    with torch.no_grad():
        expected = module(*[t.clone() for t in module.example])  # the mutating op writes its input
    actual = run_ort(sess, module.example)
    assert len(expected) == len(actual) == len(chosen)
    failed = [str(row) for row in (bridge.compare(c.id, e, a, **tol) for c, e, a in zip(chosen, expected, actual))
              if not row.passed]
    assert not failed, "\n".join(failed)


def test_every_seed_op_inlined_matches_eager_in_onnxruntime(seed_cases):
    for chosen, module, proto in seed_cases:
        assert nonstandard_ops(proto) == [] and not proto.functions
        assert {(o.domain) for o in proto.opset_import} == {""}
        _check_all(chosen, module, bridge.session(proto))
    assert len(seed_cases[0][0]) + len(seed_cases[1][0]) == len(cases(bridge.REGISTRY))


@openvino_test
def test_every_seed_op_inlined_matches_eager_in_openvino(seed_cases):
    from bridge.tools.openvino_runtime import session

    chosen, module, proto = seed_cases[0]
    assert {c.spec.qualname for c in chosen} >= {"bev::bev_pool_v2", "opbridge::crop", "opbridge::paste",
                                                 "opbridge::identity_conv", "opbridge::numpy_sin"}
    _check_all(chosen, module, session(proto), **OPENVINO_F64)


@openvino_test
def test_openvino_refuses_zero_size_tensors_instead_of_crashing(seed_cases, tmp_path):
    # compiling the crop to an empty box killed the process with SIGFPE: a subprocess holds it
    path = tmp_path / "empty.onnx"
    onnx.save(seed_cases[1][2], path)
    code = f"from bridge.tools.openvino_runtime import session\nsession({str(path)!r})"
    r = forkserver.run(["-c", code], timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 1 and "zero-size tensors" in r.stderr, r.stderr[-2000:]


class CropConv(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(torch.ops.opbridge.crop(x, [0, 1, 3, 4]), 2) * 2


def test_check_parity_inline_keywords():
    model, args, extra = CropConv(), (torch.randn(2, 2, 5, 5),), ((torch.randn(3, 2, 5, 5),),)
    dynamic = ({0: torch.export.Dim("batch")},)
    report = bridge.check_parity(model, args, dynamic_shapes=dynamic, extra_args=extra, inline=True)
    assert report.passed and report.tier == "inlined" and report.runtime == "onnxruntime"
    assert "ORT tier inlined" in str(report) and '"runtime": "onnxruntime"' in report.to_json()
    with pytest.raises(bridge.OpBridgeError, match=r"no custom nodes for tier 'native'.*Drop tier="):
        bridge.check_parity(model, args, inline=True, tier="native")
    with pytest.raises(bridge.OpBridgeError, match=r"unknown runtime\. Got 'tvm'"):
        bridge.check_parity(model, args, runtime="tvm")
    # OpenVINO cannot read custom nodes: the message says to inline (checked before openvino loads)
    with pytest.raises(bridge.OpBridgeError, match=r"custom nodes.*Got custom ops \['opbridge::crop', "
                                                   r"'opbridge::identity_conv'\].*opbridge inline"):
        bridge.check_parity(model, args, runtime="openvino")


def test_openvino_refuses_custom_nodes_inside_branches_too():
    """A custom node inside an If branch is named like one in the main graph (the check read only
    the main graph's nodes, so OpenVINO's own conversion error came instead)."""
    with pytest.raises(bridge.OpBridgeError, match=r"Got custom ops \['opbridge::crop'\].*opbridge inline"):
        openvino_runtime.session(crop_in_a_branch([1, 0, 3, 2]))


@openvino_test
def test_check_parity_runtime_openvino():
    model, args, extra = CropConv(), (torch.randn(2, 2, 5, 5),), ((torch.randn(3, 2, 5, 5),),)
    report = bridge.check_parity(model, args, dynamic_shapes=({0: torch.export.Dim("batch")},), extra_args=extra,
                                 inline=True, runtime="openvino")
    assert report.passed and report.runtime == "openvino" and "OpenVINO tier inlined" in str(report)
    assert [o.shape for o in report.outputs] == [(2, 2, 3, 3), (3, 2, 3, 3)]


def test_missing_openvino_names_the_install(monkeypatch):
    from bridge.tools.openvino_runtime import session

    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    proto = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])]))
    # NOTE: the install line is the one for the way opbridge was installed (bridge/core/basics/installed.py)
    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: running a model in OpenVINO needs the openvino "
                                                   r"package\. Got .*\. Install it with `.*pip install .*openvino"):
        session(proto)


def test_op_without_body_is_a_clear_error(bare_op_model, registry):
    name, path = bare_op_model
    domain, op_type = name.split("::")
    with pytest.raises(bridge.OpBridgeError, match=rf"^opbridge: cannot inline {domain}::{op_type}: no ONNX "
                                                   r"function body.*native-only.*Got ops without a body: "
                                                   r".*Give each op"):
        inline_functions(onnx.load(path), registry)

    class M(torch.nn.Module):
        def forward(self, x):
            return getattr(getattr(torch.ops, domain), op_type)(x) * 2

    with pytest.raises(bridge.OpBridgeError, match=rf"cannot inline {domain}::{op_type}"):
        bridge.export(M(), (torch.ones(1, 1, 2),), registry=registry, inline=True)


@pytest.fixture
def small_file(tmp_path):
    """CropConv exported without function bodies (bodies must come from the registry)."""
    x = torch.randn(1, 2, 5, 5)
    path = tmp_path / "small.onnx"
    proto = bridge.export(CropConv(), (x,), path, functions=False)
    assert not proto.functions
    return CropConv(), x, path


def test_inline_command_takes_bodies_from_the_registry(small_file, tmp_path, capsys):
    model, x, path = small_file
    before = path.read_bytes()
    out = tmp_path / "out" / "small_inline.onnx"
    out.parent.mkdir()
    assert main(["inline", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "inlined opbridge::crop, opbridge::identity_conv: 3 -> " in printed and f"wrote {out}" in printed
    assert path.read_bytes() == before  # the input file is left alone
    assert sorted(p.name for p in out.parent.iterdir()) == ["small_inline.onnx"]  # no temp file left
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode
    inlined = onnx.load(out)
    assert nonstandard_ops(inlined) == [] and [o.domain for o in inlined.opset_import] == [""]
    got = bridge.session(out).run(None, {inlined.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_array_equal(got, model(x).numpy())
    # default output name beside the input
    assert main(["-q", "inline", str(path)]) == 0 and (tmp_path / "small_inline.onnx").is_file()


def test_inline_command_failure_leaves_the_target_alone(bare_op_model, tmp_path, capsys):
    _, path = bare_op_model  # its op lives in a private registry: the CLI has no body for it
    target = tmp_path / "target.onnx"
    target.write_bytes(b"old")
    listing = sorted(p.name for p in tmp_path.iterdir())
    assert main(["inline", str(path), "-o", str(target)]) == 2
    assert "error: opbridge: cannot inline" in capsys.readouterr().err
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == listing
    assert main(["inline", str(tmp_path / "nope.onnx"), "-o", str(target)]) == 2
    assert "no ONNX file at" in capsys.readouterr().err


def test_save_atomic_removes_its_temp_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "m.onnx"
    target.write_bytes(b"old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        exporters.inline.save_atomic(onnx.ModelProto(ir_version=8), target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_inline_docstring_example_runs():
    result = doctest.testmod(exporters.inline, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("opset", (17, 20))
def test_inlined_derived_bodies_keep_each_attribute_value(registry, fresh_name, tmp_path, opset):
    # NOTE: held-out probes: k=-5 took k=4's body, s=-0.0 took s=0.0's, and an opset-17 file kept an
    # opset-18 body; inlining a file whose bodies are missing derives them (as a session does)
    model = HeldOut(*held_out_ops(registry, fresh_name))
    x = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])
    flat = bridge.export(model, (x,), registry=registry, inline=True, opset_version=opset)
    bare = inline_functions(bridge.export(model, (x,), registry=registry, functions=False, opset_version=opset),
                            registry)
    with torch.no_grad():
        expected = model(x)
    for proto in (flat, bare):
        assert not nonstandard_ops(proto) and {o.version for o in proto.opset_import if o.domain == ""} == {opset}
        got = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x.numpy()})
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(np.signbit(g), np.signbit(e.numpy()))
            np.testing.assert_array_equal(g, e.numpy())
