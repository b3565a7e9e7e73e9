"""Files every ONNX consumer accepts: any opset 17..23 in every tier, the lowest IR version, bodies
that survive onnx.version_converter and onnxruntime's optimizer, no path of this machine inside."""

import dataclasses
import doctest
import getpass
import importlib
import os
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import bridge
import custom_ops.demo as demo
from bridge import cli
from exporters.bodies.opsets import convert_function, onnx_opset, portable_constants
from exporters.portable import portable_path, relativize_paths, required_ir_version
from tests.models import HeldOut, held_out_ops

ROOT = Path(__file__).resolve().parents[1]
# NOTE: onnxruntime before 1.23 refuses opset-23 files (IR 11): measured 1.22.1 refuses, 1.23.2 runs them
NEW_ORT = tuple(int(p) for p in ort.__version__.split(".")[:2]) >= (1, 23)
OPSET_23 = pytest.param(23, marks=pytest.mark.skipif(not NEW_ORT, reason="onnxruntime < 1.23 predates opset 23"))
OPSETS = (17, 20, 23)


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory):
    """The demo exported once per opset: (case, {opset: path})."""
    case = demo.build()
    folder = tmp_path_factory.mktemp("opsets")
    paths = {}
    for opset in OPSETS:
        paths[opset] = folder / f"demo{opset}.onnx"
        bridge.export(case.model, case.args, paths[opset], dynamic_shapes=case.dynamic_shapes, opset_version=opset)
    return case, paths


def _matches(case, sess):
    for args in (case.args, *case.extra_args):
        got = bridge.parity.run_ort(sess, args)[0]
        with torch.no_grad():
            row = bridge.compare("out", case.model(*args), got)
        assert row.passed, row


@pytest.mark.parametrize("tier", bridge.TIERS)
@pytest.mark.parametrize("opset", (17, 20, OPSET_23))
def test_demo_runs_at_every_opset_in_every_tier(demo_files, opset, tier):
    case, paths = demo_files
    proto = onnx.load(paths[opset])
    onnx.checker.check_model(proto, full_check=True)
    assert onnx_opset(proto) == opset and {onnx_opset(f) for f in proto.functions} == {opset}
    _matches(case, bridge.session(paths[opset], tier=tier))


@pytest.mark.parametrize("opset", OPSETS)
def test_ir_version_is_the_lowest_the_file_needs(demo_files, opset):
    proto = onnx.load(demo_files[1][opset])
    assert proto.ir_version == {17: 8, 20: 9, 23: 11}[opset]
    assert proto.ir_version == helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
    nodes = [n for n in proto.graph.node if n.doc_string or n.metadata_props]
    if proto.ir_version < 10:  # IR-10 metadata folded into doc strings, nothing lost
        assert not any(n.metadata_props for n in proto.graph.node) and not proto.graph.metadata_props
    if opset == 20:  # (below 18 torch.onnx writes 18 and onnx.version_converter drops the metadata)
        assert any("pkg.torch.onnx.stack_trace: File \"custom_ops/demo.py\"" in n.doc_string for n in nodes)
    if opset == 23:
        assert any(p.key == "pkg.torch.onnx.stack_trace" for n in proto.graph.node for p in n.metadata_props)


def test_no_path_of_this_machine_in_the_file(demo_files):
    data = demo_files[1][20].read_bytes()
    home = os.path.expanduser("~")
    for secret in {str(ROOT), home, sys.prefix, os.path.realpath(sys.prefix), "site-packages",
                   f"/{getpass.getuser()}/", str(demo_files[1][20].parent)}:
        assert secret.encode() not in data, secret
    assert b'File "custom_ops/demo.py", line' in data and b'File "torch/nn/modules/conv.py", line' in data


@pytest.mark.parametrize("opset", (17, 18, OPSET_23))
def test_version_converter_then_session_matches(demo_files, tmp_path, opset):
    case, paths = demo_files
    converted = onnx.version_converter.convert_version(onnx.load(paths[20]), opset)
    assert not converted.functions  # the converter drops model-local bodies
    path = tmp_path / "converted.onnx"
    onnx.save(converted, path)
    for tier in ("function", "native"):
        _matches(case, bridge.session(path, tier=tier))
    restored = onnx.load(path)
    assert sorted(bridge.attach_functions(restored)) == ["bev::bev_pool_v2", "opbridge::identity_conv"]
    assert {onnx_opset(f) for f in restored.functions} == {opset}
    onnx.checker.check_model(restored, full_check=True)


def test_bodies_at_another_opset_are_converted(demo_files):
    proto = onnx.load(demo_files[1][20])
    stale = onnx.version_converter.convert_version(proto, 18)
    stale.functions.extend(proto.functions)  # a tool that kept the opset-20 bodies
    assert sorted(bridge.attach_functions(stale)) == ["bev::bev_pool_v2", "opbridge::identity_conv"]
    assert {onnx_opset(f) for f in stale.functions} == {18} and len(stale.functions) == 2
    _matches(demo_files[0], bridge.session(stale))


def test_opbridge_attach_writes_atomically(demo_files, tmp_path, capsys):
    source = tmp_path / "in.onnx"
    onnx.save(onnx.version_converter.convert_version(onnx.load(demo_files[1][20]), 17), source)
    out = tmp_path / "out.onnx"
    assert cli.main(["-q", "attach", str(source), "-o", str(out)]) == 0
    assert "bev::bev_pool_v2" in capsys.readouterr().out
    model = onnx.load(out)
    assert {onnx_opset(f) for f in model.functions} == {17} and model.ir_version >= required_ir_version(model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "out.onnx"]  # no temp file left
    sess = ort.InferenceSession(str(out))  # plain onnxruntime, no opbridge session
    case = demo_files[0]
    with torch.no_grad():
        assert bridge.compare("out", case.model(*case.args), bridge.parity.run_ort(sess, case.args)[0]).passed
    before = out.read_bytes()
    assert cli.main(["-q", "attach", str(tmp_path / "missing.onnx"), "-o", str(out)]) == 2
    assert out.read_bytes() == before and "no ONNX file" in capsys.readouterr().err


@pytest.mark.parametrize("tier", ("native", "function"))
def test_file_optimized_by_onnxruntime_opens_again(demo_files, tmp_path, tier):
    case, paths = demo_files
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    bridge.session(paths[20], tier=tier, sess_options=options)
    saved = onnx.load(options.optimized_model_filepath)
    domains = {n.domain for n in saved.graph.node}
    assert "com.microsoft.nchwc" in domains  # onnxruntime's internal domains, not custom ops
    if tier == "native":
        assert {"bev", "opbridge"} <= domains
    _matches(case, bridge.session(options.optimized_model_filepath, tier=tier))


def _one_node_model(node_domain, node_type, opset_imports):
    x, y = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]), \
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node(node_type, ["x"], ["y"], domain=node_domain)], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opset_imports])
    model.ir_version = required_ir_version(model)
    return model


def test_onnxruntime_and_ml_domains_are_not_custom_ops_but_unknown_ones_are_errors():
    ml = _one_node_model("ai.onnx.ml", "Binarizer", [("", 20), ("ai.onnx.ml", 3)])
    got = bridge.session(ml, tier="native").run(None, {"x": np.array([[-1, 0, 2]] * 2, np.float32)})[0]
    np.testing.assert_array_equal(got, [[0, 0, 1]] * 2)
    ms = _one_node_model("com.microsoft", "Gelu", [("", 20), ("com.microsoft", 1)])
    assert bridge.session(ms, tier="function").run(None, {"x": np.zeros((2, 3), np.float32)})[0].shape == (2, 3)
    unknown = _one_node_model("acme.vision", "Warp", [("", 20), ("acme.vision", 1)])
    for tier in ("function", "native"):
        with pytest.raises(bridge.UnsupportedInTier, match="acme.vision::Warp"):
            bridge.session(unknown, tier=tier)


# --- per-op conversion of function bodies, checked in onnxruntime at both opsets ---------------


def _body(nodes, opset, inputs=("x",), attributes=()):
    return helper.make_function("t", "f", list(inputs), ["y"], nodes, [helper.make_opsetid("", opset)],
                                attributes=list(attributes))


def _run(function, opset, feeds, attrs=None):
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    graph = helper.make_graph([helper.make_node("f", list(feeds), ["y"], domain="t", **(attrs or {}))], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("t", 1)],
                              functions=[portable_constants(function)])  # (onnxruntime <= 1.22 needs it)
    model.ir_version = required_ir_version(model)
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, got.shape))
    onnx.checker.check_model(model, full_check=True)  # types and shapes inferred through the body
    return got


def _same_after(function, source, target, feeds, attrs=None):
    expected = _run(function, source, feeds, attrs)
    converted = convert_function(function, target)
    assert onnx_opset(converted) == target
    np.testing.assert_array_equal(_run(converted, target, feeds, attrs), expected)
    return converted


X = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5) - 7


def test_pad_axes_input_converts_down():
    nodes = [helper.make_node("Constant", [], ["p"], value_ints=[1, 0, 2, 3]),
             helper.make_node("Constant", [], ["a"], value_ints=[-1, 0]),
             helper.make_node("Pad", ["x", "p", "", "a"], ["y"])]
    converted = _same_after(_body(nodes, 20), 20, 17, {"x": X})
    assert all(len(n.input) <= 3 for n in converted.node if n.op_type == "Pad")


@pytest.mark.parametrize("source,target", [(20, 17), (17, 20), pytest.param(13, 23, marks=OPSET_23.marks)])
def test_reduce_axes_cross_between_attribute_and_input(source, target):
    if source >= 18:
        nodes = [helper.make_node("Constant", [], ["a"], value_ints=[0, -1]),
                 helper.make_node("ReduceMax", ["x", "a"], ["y"], keepdims=0)]
    else:
        nodes = [helper.make_node("ReduceMax", ["x"], ["y"], axes=[0, -1], keepdims=0)]
    _same_after(_body(nodes, source), source, target, {"x": X})


def test_axes_from_a_function_attribute_keep_the_reference():
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1),
             helper.make_node("Constant", [], ["a"]),
             helper.make_node("ReduceMax", ["s", "a"], ["y"], keepdims=0)]
    nodes[1].attribute.append(helper.make_attribute_ref("value_ints", onnx.AttributeProto.INTS, ref_attr_name="dims"))
    function = _body(nodes, 20, attributes=["dims"])
    down = _same_after(function, 20, 17, {"x": X}, {"dims": [1]})
    reduce = next(n for n in down.node if n.op_type == "ReduceMax")
    assert [(a.name, a.ref_attr_name) for a in reduce.attribute if a.name == "axes"] == [("axes", "dims")]
    _same_after(down, 17, 20, {"x": X}, {"dims": [1]})


@pytest.mark.parametrize("source,target", [(18, 17), (17, 18), (12, 20)])
def test_split_converts_both_ways(source, target):
    attrs = {"num_outputs": 3} if source >= 18 else {}
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=2 if source >= 18 else 1, **attrs),
             helper.make_node("Concat", ["c", "a"], ["y"], axis=2 if source >= 18 else 1)]
    x = X if source >= 18 else X.reshape(2, 15)  # 5 in 3 parts: 2, 2, 1 (Split@18 only)
    _same_after(_body(nodes, source), source, target, {"x": x})


def test_squeeze_and_unsqueeze_axes_convert_from_old_bodies():
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
             helper.make_node("Squeeze", ["u"], ["y"], axes=[0])]
    _same_after(_body(nodes, 12), 12, 20, {"x": X})


@pytest.mark.parametrize("source,target,mode,renamed", [(20, 17, "linear", "bilinear"), (17, 20, "bicubic", "cubic")])
def test_grid_sample_modes_are_renamed_across_opset_20(source, target, mode, renamed):
    image = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    grid = np.random.default_rng(0).uniform(-1, 1, (2, 6, 7, 2)).astype(np.float32)
    body = _body([helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode)], source, inputs=("x", "g"))
    converted = _same_after(body, source, target, {"x": image, "g": grid})
    assert [a.s.decode() for a in converted.node[0].attribute if a.name == "mode"] == [renamed]


@pytest.mark.parametrize("source,target", [(12, 20), (20, 12)])
def test_roi_align_keeps_its_coordinates_across_opset_16(source, target):
    """RoiAlign-16 added coordinate_transformation_mode defaulting to half_pixel; before it RoiAlign had only
    output_half_pixel: crossing up writes that mode (mmcv 2.x's RoIAlign symbolic is written for opset < 13)."""
    image = np.random.default_rng(1).normal(size=(2, 3, 8, 7)).astype(np.float32)
    boxes = np.array([[0.5, 1.0, 6.0, 5.5], [2.0, 0.0, 7.5, 7.0]], np.float32)
    mode = {"coordinate_transformation_mode": "output_half_pixel"} if source >= 16 else {}
    body = _body([helper.make_node("RoiAlign", ["x", "r", "i"], ["y"], output_height=2, output_width=3,
                                   sampling_ratio=2, spatial_scale=1.0, **mode)], source, inputs=("x", "r", "i"))
    converted = _same_after(body, source, target, {"x": image, "r": boxes, "i": np.array([1, 0], np.int64)})
    assert [a.s for a in converted.node[0].attribute if a.name == "coordinate_transformation_mode"] == \
        ([b"output_half_pixel"] if target >= 16 else [])
    half = _body([helper.make_node("RoiAlign", ["x", "r", "i"], ["y"])], 20, inputs=("x", "r", "i"))
    with pytest.raises(bridge.OpBridgeError, match="coordinate_transformation_mode=half_pixel"):
        convert_function(half, 12)


def test_list_constants_become_tensors_old_onnxruntime_can_infer():
    body = bridge.REGISTRY.get("opbridge::crop").function.to_function_proto()
    fixed = portable_constants(body)
    kinds = {n.attribute[0].name for n in fixed.node if n.op_type == "Constant" and not n.attribute[0].ref_attr_name}
    assert "value_ints" in {n.attribute[0].name for n in body.node if n.op_type == "Constant"}
    assert kinds <= {"value", "value_int"}


def test_new_values_and_missing_ops_are_refused_with_the_op_named():
    scatter = [helper.make_node("Constant", [], ["i"], value_ints=[0, 0]),
               helper.make_node("ScatterElements", ["x", "i", "x"], ["y"], reduction="max")]
    with pytest.raises(bridge.OpBridgeError, match="ScatterElements.*reduction='max' exists from opset 18"):
        convert_function(_body(scatter, 20), 17)
    with pytest.raises(bridge.OpBridgeError, match="Gelu"):
        convert_function(_body([helper.make_node("Gelu", ["x"], ["y"])], 20), 17)
    dft = _body([helper.make_node("DFT", ["x"], ["y"])], 20)
    with pytest.raises(bridge.OpBridgeError, match="DFT's axis moved"):
        convert_function(dft, 17)
    norm = _body([helper.make_node("GroupNormalization", ["x", "x", "x"], ["y"], num_groups=1)], 21)
    with pytest.raises(bridge.OpBridgeError, match="GroupNormalization.*deprecated or absent at 20"):
        convert_function(norm, 20)


def test_paths_become_relative_to_their_package_and_scopes_stay():
    assert portable_path(torch.nn.modules.conv.__file__) == "torch/nn/modules/conv.py"
    assert portable_path(demo.__file__) == "custom_ops/demo.py"
    assert portable_path("/nowhere/at/all/model.py", roots=[]) == "model.py"
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [], []))
    scope = ": custom_ops.demo.BEVDemo/backbone: torch.nn.modules.conv.Conv2d/conv2d"
    helper.set_model_props(model, {"trace": f'File "{demo.__file__}", line 3', "scope": scope})
    model.graph.node[0].doc_string = f"at {os.path.abspath(__file__)}:12"
    assert relativize_paths(model) == 2
    assert {p.key: p.value for p in model.metadata_props} == {"trace": 'File "custom_ops/demo.py", line 3',
                                                             "scope": scope}
    # relative to the nearest import root: the project, or tests/ itself when pytest put it on sys.path
    assert model.graph.node[0].doc_string in ("at tests/test_opsets.py:12", "at test_opsets.py:12")


@pytest.mark.parametrize("name", ["exporters.bodies.opsets", "exporters.portable"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_cli_export_at_an_opset(tmp_path):
    out = tmp_path / "m.onnx"
    assert cli.main(["-q", "export", "--model", "custom_ops.demo:identity_model", "--opset", "18", "-o", str(out)]) == 0
    model = onnx.load(out)
    assert onnx_opset(model) == 18 and model.ir_version == 8 and {onnx_opset(f) for f in model.functions} == {18}


@pytest.mark.parametrize("opset", (17, 18, OPSET_23))
def test_derived_bodies_are_at_the_model_opset(registry, fresh_name, tmp_path, opset):
    # NOTE: torch.onnx writes opset 18 at the least: a body derived for an opset-17 model stayed at 18
    model = HeldOut(*held_out_ops(registry, fresh_name))
    x = torch.tensor([[1.0, -2.0, 3.0]])
    path = tmp_path / f"derived{opset}.onnx"
    proto = bridge.export(model, (x,), path, registry=registry, opset_version=opset)
    assert {onnx_opset(f) for f in proto.functions} == {opset} and onnx_opset(proto) == opset
    onnx.checker.check_model(onnx.load(path), full_check=True)
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})
    with torch.no_grad():
        for e, g in zip(model(x), got):
            np.testing.assert_array_equal(g, e.numpy())
    for tier in ("function", "python"):
        sess = bridge.session(path, tier=tier, registry=registry)
        for e, g in zip(model(x), sess.run(None, {"x": x.numpy()})):
            np.testing.assert_array_equal(g, e.numpy())


@pytest.fixture
def crop_derived():
    """opbridge::crop with no written body for one test: its body is derived."""
    spec = bridge.REGISTRY.get("opbridge::crop")
    bridge.REGISTRY.replace(dataclasses.replace(spec, function=None))
    yield bridge.REGISTRY.get("opbridge::crop")
    bridge.REGISTRY.replace(spec)


class _Crop(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.crop(x, [1, 0, 3, 2]) * 2


def test_opbridge_attach_attaches_derived_bodies(crop_derived, tmp_path, capsys):
    x = torch.arange(12.0).reshape(1, 3, 4)
    source, out = tmp_path / "bare.onnx", tmp_path / "attached.onnx"
    bridge.export(_Crop(), (x,), source, functions=False)
    assert not onnx.load(source).functions
    assert cli.main(["-q", "attach", str(source), "-o", str(out)]) == 0
    assert "opbridge::crop" in capsys.readouterr().out
    model = onnx.load(out)
    assert ["derived by opbridge" in f.doc_string for f in model.functions] == [True]
    got = ort.InferenceSession(str(out)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_array_equal(got, _Crop()(x).numpy())


@pytest.mark.parametrize("derived", (False, True), ids=("written", "derived"))
def test_opbridge_attach_replace_restores_a_broken_body(request, tmp_path, capsys, derived):
    if derived:
        request.getfixturevalue("crop_derived")
    x = torch.arange(12.0).reshape(1, 3, 4)
    good, broken = tmp_path / "good.onnx", tmp_path / "broken.onnx"
    proto = bridge.export(_Crop(), (x,), good)
    body = next(f for f in proto.functions if f.name == "crop")
    del body.node[:]  # what a tool did to it: the body now passes its input through
    body.node.append(helper.make_node("Identity", [body.input[0]], [body.output[0]]))
    onnx.save(proto, broken)
    assert cli.main(["-q", "attach", str(broken)]) == 0
    assert "nothing to attach" in capsys.readouterr().out  # without --replace, the file's body stays
    assert cli.main(["-q", "attach", "--replace", str(broken)]) == 0
    assert "opbridge::crop" in capsys.readouterr().out
    restored = onnx.load(broken)
    assert [f.SerializeToString() for f in restored.functions] == [f.SerializeToString()
                                                                    for f in onnx.load(good).functions]
    got = ort.InferenceSession(str(broken)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_array_equal(got, _Crop()(x).numpy())


class _Plus(torch.nn.Module):
    def forward(self, x):
        return x + 1


@pytest.mark.parametrize("opset", [99, 0, -3, True, "20", 20.0])
def test_an_opset_no_tool_can_write_is_refused_before_the_export(opset, tmp_path):
    """What onnx does not know (99, 0) or is no int is refused up front, naming the range, with no export run
    (torch.onnx printed onnxscript's traceback for 99, then a message asking for a higher opset)."""
    path = tmp_path / "m.onnx"
    with pytest.raises(bridge.OpBridgeError, match=rf"^opbridge: opset_version must be an ONNX opset this onnx "
                                                   rf"knows \(1 to {onnx.defs.onnx_opset_version()}; opbridge "
                                                   rf"tests 17 to 23\)\. Got {re.escape(repr(opset))}\."):
        bridge.export(_Plus(), (torch.ones(2),), path, opset_version=opset)
    assert not path.exists()


class _Means(torch.nn.Module):
    def forward(self, x):
        return x.mean(dim=(2, 3)) + x.sum(dim=(2, 3)).amax(dim=1, keepdim=True) - x.amin(dim=(1, 2, 3)).unsqueeze(1)


@pytest.mark.parametrize("opset", [17, 18])
def test_a_model_with_means_exports_at_every_opset(opset):
    """onnx.version_converter kept ReduceMean-18's noop_with_empty_axes going down to 17, where only ReduceSum has
    it: the checker refused every model with a mean at opset 17."""
    x = torch.randn(2, 3, 4, 5)
    proto = bridge.export(_Means(), (x,), opset_version=opset)
    assert onnx_opset(proto) == opset
    reduces = {n.op_type: sorted(a.name for a in n.attribute) for n in proto.graph.node if n.op_type.startswith("Red")}
    assert ("noop_with_empty_axes" in reduces["ReduceMean"]) == (opset >= 18)
    got = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, _Means()(x).numpy(), rtol=1e-5, atol=1e-5)
