"""Ops as detection models bring them (issue #26 items 1, 2, 5): ops written like torchvision's C++ ops
(tests/vision_ops.py: own CPU and fake kernels, no ONNX code) reuse the translation torch.onnx already
has; written bodies depend on attribute values (body builders); an export whose dynamic dimension the
model's code fixes is one CLI line."""

from __future__ import annotations

import os
import sys
import textwrap
import warnings
from pathlib import Path

import forkserver
import numpy as np
import onnx
import onnxruntime as ort
import onnxscript
import pytest
import torch
from onnxscript import INT64
from onnxscript import opset20 as op

import bridge
from bridge.core.basics.errors import OpBridgeError
from bridge.core.spec import AttrType, BodyBuilder, Param
from exporters.kinds import body_kind
from exporters.resolve import attach_functions

sys.path.insert(0, str(Path(__file__).parent))
import vision_ops  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
OPS = ("nms", "roi_align", "deform_conv2d")
vision_ops.define("torchvision")  # the names and schemas torch_lib keys its translations by
vision_ops.define("visionlike")  # the same ops where torch.onnx has no translation: bodies written here
tv, vl = torch.ops.torchvision, torch.ops.visionlike


@pytest.fixture(scope="module")
def vision():
    """A registry with the three torchvision-named ops, registered with no body (bridge.register)."""
    reg = bridge.Registry()
    for name in OPS:
        bridge.register(f"torchvision::{name}", registry=reg)
    yield reg
    for spec in list(reg):
        reg.remove(spec.qualname)


def _boxes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 20
    return torch.cat([xy, xy + torch.rand(n, 2, generator=g) * 10 + 1], 1), torch.rand(n, generator=g)


def _rois(k: int, seed: int, batch: int = 2, extent: float = 20.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 2, generator=g) * (extent - 4)
    index = torch.randint(0, batch, (k, 1), generator=g).float()
    return torch.cat([index, xy, xy + torch.rand(k, 2, generator=g) * 8 + 0.5], 1)


class Detect(torch.nn.Module):
    """nms, then a gather with its data-dependent count."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, boxes, scores):
        keep = self.ops.nms(boxes, scores, 0.5)
        return boxes[keep] * 2, keep


class Pool(torch.nn.Module):
    """roi_align at two attribute sets: adaptive sampling (-1) aligned, and 2 samples not aligned."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, feat, rois):
        a = self.ops.roi_align(feat, rois, 0.5, 3, 3, -1, True)
        b = self.ops.roi_align(feat, rois, 0.5, 2, 4, 2, False)
        return a, b


class Deform(torch.nn.Module):
    """deform_conv2d with a mask (stride 1) and without one (stride 2, dilation 2), offsets from convs."""

    def __init__(self, ops):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.ops = ops
        self.w = torch.nn.Parameter(torch.randn(6, 2, 3, 3, generator=g) * 0.3)
        self.b = torch.nn.Parameter(torch.randn(6, generator=g))
        self.offset = torch.nn.Conv2d(4, 2 * 2 * 9, 3, padding=1)
        self.mask = torch.nn.Conv2d(4, 2 * 9, 3, padding=1)
        self.offset2 = torch.nn.Conv2d(4, 2 * 9, 3, padding=2, stride=2, dilation=2)

    def forward(self, x):
        off, mask = self.offset(x) * 2, torch.sigmoid(self.mask(x))
        a = self.ops.deform_conv2d(x, self.w, off, mask, self.b, 1, 1, 1, 1, 1, 1, 2, 2, True)
        off2 = self.offset2(x)
        b = self.ops.deform_conv2d(x, self.w[:, :, :, :], off2, torch.zeros(0), self.b, 2, 2, 2, 2, 2, 2, 2, 1, False)
        return a, b


def _deform_input(batch: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, 4, 9, 11, generator=torch.Generator().manual_seed(seed))


N, K, B = torch.export.Dim("N", min=2), torch.export.Dim("K", min=2), torch.export.Dim("B", min=1)
FEAT = torch.randn(2, 3, 10, 12, generator=torch.Generator().manual_seed(1))
CASES = {  # name -> (model factory, args, dynamic_shapes, extra_args): dynamic box counts
    "nms": (Detect, _boxes(30, 0), ({0: N}, {0: N}), [_boxes(50, 1), _boxes(2, 2)]),
    "roi_align": (Pool, (FEAT, _rois(7, 0)), (None, {0: K}), [(FEAT, _rois(11, 1)), (FEAT, _rois(2, 2))]),
    "deform_conv2d": (Deform, (_deform_input(2, 0),), ({0: B},), [(_deform_input(3, 1),)]),
}


def _function_types(proto: onnx.ModelProto) -> set[str]:
    return {n.op_type for f in proto.functions for n in f.node}


# -- 1. torch.onnx's translation reused -------------------------------------------------------------
@pytest.mark.parametrize("name", OPS)
def test_register_without_body_reuses_torch_onnx_translation(vision, name):
    spec = vision.get(f"torchvision::{name}")
    kind, note = body_kind(spec).status()
    assert spec.function is None and spec.custom_translation is None
    assert kind == "translated" and f"torchvision_{name}" in note and "torch.onnx" in note


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("tier", ["function", "native"])
def test_translated_ops_match_eager_with_dynamic_box_counts(vision, name, tier):
    """Each op stays one node in its own domain; its body is torch_lib's translation (RoiAlign,
    NonMaxSuppression, DeformConv); ORT matches the op's own CPU kernel at several box counts. The
    native tier has no C++ kernel for these ops: it runs the same body."""
    factory, args, dynamic, extra = CASES[name]
    report = bridge.check_parity(factory(tv).eval(), args, dynamic_shapes=dynamic, registry=vision, tier=tier,
                                 extra_args=extra)
    assert report.passed, str(report)
    proto = bridge.export(factory(tv).eval(), args, dynamic_shapes=dynamic, registry=vision)
    custom = [n for n in proto.graph.node if n.domain == "torchvision"]
    assert custom and all(n.op_type == name for n in custom)
    wanted = {"nms": "NonMaxSuppression", "roi_align": "RoiAlign", "deform_conv2d": "DeformConv"}[name]
    assert wanted in _function_types(proto)
    assert all(n.domain in ("", "ai.onnx") for f in proto.functions for n in f.node)


def test_translation_is_specialised_per_attribute_values(vision):
    """Two roi_align sites with other attribute values get one body each (function overloads);
    sampling_ratio=-1 (adaptive in torchvision) becomes RoiAlign's 0, aligned picks the coordinate mode."""
    _, args, dynamic, _ = CASES["roi_align"]
    proto = bridge.export(Pool(tv), args, dynamic_shapes=dynamic, registry=vision)
    nodes = [n for n in proto.graph.node if n.op_type == "roi_align"]
    bodies = {f.overload: f for f in proto.functions if f.name == "roi_align"}
    assert len(bodies) == 2 and {n.overload for n in nodes} == set(bodies)
    got = {}
    for node in nodes:
        roi = next(n for n in bodies[node.overload].node if n.op_type == "RoiAlign")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in roi.attribute}
        got[next(a.i for a in node.attribute if a.name == "sampling_ratio")] = (
            attrs["sampling_ratio"], attrs["coordinate_transformation_mode"], attrs["output_width"])
    assert got == {-1: (0, b"half_pixel", 3), 2: (2, b"output_half_pixel", 4)}


def test_deform_conv_translation_builds_list_attributes(vision):
    _, args, dynamic, _ = CASES["deform_conv2d"]
    proto = bridge.export(Deform(tv).eval(), args, dynamic_shapes=dynamic, registry=vision)
    convs = [n for f in proto.functions for n in f.node if n.op_type == "DeformConv"]
    seen = sorted((tuple(onnx.helper.get_attribute_value(a) for a in c.attribute if a.name == "strides")[0],
                   len(c.input)) for c in convs)
    assert seen == [([1, 1], 5), ([2, 2], 4)]  # use_mask=False: no mask input


@pytest.mark.parametrize("name", ["nms", "roi_align"])
def test_translated_ops_inline(vision, name):
    factory, args, dynamic, extra = CASES[name]
    report = bridge.check_parity(factory(tv).eval(), args, dynamic_shapes=dynamic, registry=vision, inline=True,
                                 extra_args=extra)
    assert report.passed, str(report)


def test_show_body_names_the_translation(registry):
    def samples(dtype):
        return [bridge.SampleInput((FEAT.to(dtype), _rois(3, 0), 0.5, 2, 2, -1, True))]
    spec = bridge.register("torchvision::roi_align", sample_inputs=samples, registry=registry).spec
    text = body_kind(spec).show()
    assert text.startswith("# torchvision::roi_align: derived from torch.onnx's translation torchvision_roi_align")
    assert "RoiAlign" in text and "sampling_ratio: int = 0" in text


def test_function_body_over_a_translation_warns_once():
    def wrong(dets, scores, iou_threshold):  # a body builder; never called here
        raise AssertionError
    regs = [bridge.Registry(), bridge.Registry()]
    try:
        with pytest.warns(UserWarning, match=r"torchvision::nms: function= replaces torch.onnx's own translation "
                                             r"of the op \(torchvision_nms"):
            bridge.register("torchvision::nms", function=lambda iou_threshold: None, registry=regs[0])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            bridge.register("torchvision::nms", function=lambda iou_threshold: None, registry=regs[1])
        assert body_kind(regs[1].get("torchvision::nms")).status()[0] == "written"
    finally:
        for reg in regs:
            for spec in list(reg):
                reg.remove(spec.qualname)


# -- 2. written bodies that depend on attribute values (body builders) -------------------------------
VL = onnxscript.values.Opset("visionlike", 1)


def deform_body(stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask):
    """torchvision's deform_conv2d as ONNX DeformConv: list attributes built from scalar ones."""
    strides, dilations, pads = [stride_h, stride_w], [dilation_h, dilation_w], [pad_h, pad_w, pad_h, pad_w]
    if use_mask:
        @onnxscript.script(VL, default_opset=op)
        def deform_conv2d(input, weight, offset, mask, bias):
            return op.DeformConv(input, weight, offset, bias, mask, dilations=dilations, group=groups,
                                 offset_group=offset_groups, pads=pads, strides=strides)
    else:
        @onnxscript.script(VL, default_opset=op)
        def deform_conv2d(input, weight, offset, mask, bias):
            return op.DeformConv(input, weight, offset, bias, dilations=dilations, group=groups,
                                 offset_group=offset_groups, pads=pads, strides=strides)
    return deform_conv2d


def roi_body(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """torchvision's roi_align as ONNX RoiAlign: -1 (adaptive) maps to 0, ``aligned`` picks the mode."""
    ratio = 0 if sampling_ratio < 0 else sampling_ratio
    mode = "half_pixel" if aligned else "output_half_pixel"

    @onnxscript.script(VL, default_opset=op)
    def roi_align(input, rois):
        index = op.Cast(op.Squeeze(op.Slice(rois, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]),
                                            op.Constant(value_ints=[1])), op.Constant(value_ints=[1])), to=INT64.dtype)
        coords = op.Slice(rois, op.Constant(value_ints=[1]), op.Constant(value_ints=[5]), op.Constant(value_ints=[1]))
        return op.RoiAlign(input, coords, index, coordinate_transformation_mode=mode, output_height=pooled_height,
                           output_width=pooled_width, sampling_ratio=ratio, spatial_scale=spatial_scale)
    return roi_align


@pytest.fixture(scope="module")
def written():
    """The same ops in a namespace torch.onnx does not translate, with body builders."""
    reg = bridge.Registry()
    bridge.register("visionlike::deform_conv2d", function=deform_body, registry=reg)
    roi = bridge.register("visionlike::roi_align", registry=reg)
    roi.register_function(roi_body)
    yield reg
    for spec in list(reg):
        reg.remove(spec.qualname)


def test_builder_is_told_apart_from_an_onnxscript_function(written):
    spec = written.get("visionlike::roi_align")
    assert isinstance(spec.function, BodyBuilder)
    assert body_kind(spec).status() == ("written", "built per attribute values (spatial_scale, pooled_height, "
                                                   "pooled_width, sampling_ratio, aligned)")


def test_builder_parameters_must_be_attributes(registry):
    with pytest.raises(OpBridgeError, match=r"takes the op's attributes by name. Got parameter 'stride'"):
        bridge.register("visionlike::nms", function=lambda stride: None, registry=registry)
    with pytest.raises(OpBridgeError, match=r"function= takes an onnxscript function or a Python function"):
        bridge.register("visionlike::nms", function=42, registry=registry)
    assert "visionlike::nms" not in registry


def test_builder_returning_a_wrong_body_is_named(registry):
    bridge.register("visionlike::nms", function=lambda iou_threshold: roi_body(1.0, 1, 1, 0, True), registry=registry)
    with pytest.raises(OpBridgeError, match=r"visionlike::nms: function body does not match the op"):
        bridge.export(Detect(vl), _boxes(5, 0), registry=registry)


@pytest.mark.parametrize("name", ["roi_align", "deform_conv2d"])
def test_built_bodies_match_eager(written, name):
    factory, args, dynamic, extra = CASES[name]
    report = bridge.check_parity(factory(vl).eval(), args, dynamic_shapes=dynamic, registry=written, extra_args=extra)
    assert report.passed, str(report)
    proto = bridge.export(factory(vl).eval(), args, dynamic_shapes=dynamic, registry=written)
    bodies = [f for f in proto.functions if f.name == name]
    assert len(bodies) == 2 and all(f.overload.startswith("built_") for f in bodies)
    assert proto.ir_version >= 10


@pytest.mark.parametrize("name", ["roi_align", "deform_conv2d"])
def test_built_bodies_after_attach_and_inline(written, name, tmp_path):
    factory, args, dynamic, extra = CASES[name]
    model = factory(vl).eval()
    bare = bridge.export(model, args, dynamic_shapes=dynamic, registry=written, functions=False)
    assert not bare.functions
    assert attach_functions(bare, written) == [f"visionlike::{name}"]
    onnx.checker.check_model(bare, full_check=True)
    sess = ort.InferenceSession(bare.SerializeToString(), providers=["CPUExecutionProvider"])
    for inputs in [args, *extra]:
        with torch.no_grad():
            expected = model(*inputs)
        got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs)})
        for e, a in zip(expected, got):
            np.testing.assert_allclose(a, e.numpy(), rtol=1e-4, atol=1e-5)
    report = bridge.check_parity(model, args, dynamic_shapes=dynamic, registry=written, inline=True, extra_args=extra)
    assert report.passed, str(report)


# -- python tier: a fresh process (its ops register with onnxruntime-extensions once per process) -------
_PYTHON_TIER = """
import sys, torch, bridge
sys.path.insert(0, {tests!r})
import test_translations as t
reg = bridge.Registry()
for name in t.OPS:
    bridge.register("torchvision::" + name, registry=reg)
factory, args, dynamic, extra = t.CASES[{name!r}]
report = bridge.check_parity(factory(t.tv).eval(), args, dynamic_shapes=dynamic, registry=reg, tier="python",
                             extra_args=extra)
print(report)
sys.exit(0 if report.passed else 1)
"""


@pytest.mark.parametrize("name", OPS)
def test_translated_ops_in_the_python_tier(name):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = forkserver.run(["-c", _PYTHON_TIER.format(tests=str(TESTS), name=name)], cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ORT tier python vs eager torch | PASS" in r.stdout


# -- 5. an export whose dynamic dimension the model fixes, in the CLI ----------------------------------
_CASE_MODULE = """
import sys, torch, bridge
sys.path.insert(0, {tests!r})
import vision_ops
from bridge.tools.testing import ModelCase
vision_ops.define("torchvision")
for name in ("nms", "roi_align"):
    if "torchvision::" + name not in bridge.REGISTRY:
        bridge.register("torchvision::" + name)

class Specialised(torch.nn.Module):
    def forward(self, feat, rois):
        out = torch.ops.torchvision.roi_align(feat, rois, 1.0, 2, 2, -1, False)
        return out.reshape(len(rois), -1)   # len() fixes the box count

def case():
    g = torch.Generator().manual_seed(0)
    rois = torch.cat([torch.zeros(6, 1), torch.rand(6, 2, generator=g) * 4, 5 + torch.rand(6, 2, generator=g) * 4], 1)
    return ModelCase(Specialised(), (torch.randn(1, 3, 12, 12, generator=g), rois),
                     dynamic_shapes=(None, {{0: torch.export.Dim("boxes", min=2)}}))
"""


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return forkserver.run(["-m", "bridge", *args], cwd=cwd, env=env,
                          timeout=600)


def test_cli_names_the_specialised_dimension(tmp_path):
    (tmp_path / "vision_case.py").write_text(textwrap.dedent(_CASE_MODULE.format(tests=str(TESTS))))
    r = _cli("-q", "--ops", "vision_case", "check", "--model", "vision_case:case", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: opbridge: torch.export could not keep dimension 0 of input 'rois' (Dim boxes) "
                               "dynamic: the model's code fixes it to 6.")
    assert "len()" in lines[0] and "torch._check" in lines[0] and "Traceback" not in r.stderr
    verbose = _cli("-q", "--verbose", "--ops", "vision_case", "check", "--model", "vision_case:case", cwd=tmp_path)
    assert verbose.returncode == 2
    assert "Traceback" in verbose.stderr and "Constraints violated" in verbose.stderr
    assert verbose.stderr.strip().splitlines()[-1] == lines[0]


def test_cli_ops_says_the_body_is_torch_onnx_translation(tmp_path):
    (tmp_path / "vision_case.py").write_text(textwrap.dedent(_CASE_MODULE.format(tests=str(TESTS))))
    r = _cli("--ops", "vision_case", "ops", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("torchvision::nms"))
    assert "translated" in row
    assert ("note: torchvision::nms body: torch.onnx's translation (torchvision_nms, onnxscript torch_lib)"
            in r.stdout)


# -- translation=: the nodes go into the model directly, no custom node ----------------------------------
_MAX_BOXES = 1 << 30


def nms_translation(dets, scores, iou_threshold: float):
    """visionlike::nms as standard ONNX nodes, emitted in place of the op's node."""
    selected = op.NonMaxSuppression(op.Unsqueeze(dets, [0]), op.Unsqueeze(scores, [0, 1]),
                                    op.Constant(value_int=_MAX_BOXES), op.Constant(value_float=iou_threshold))
    return op.Reshape(op.Slice(selected, [2], [3], [1]), [-1])


def test_translation_emits_the_nodes_with_no_custom_node(registry):
    bridge.register("visionlike::nms", translation=nms_translation, registry=registry)
    args, dynamic, extra = _boxes(30, 0), ({0: N}, {0: N}), [_boxes(50, 1)]
    proto = bridge.export(Detect(vl), args, dynamic_shapes=dynamic, registry=registry)
    assert not proto.functions and {n.domain for n in proto.graph.node} <= {"", "ai.onnx"}
    assert "NonMaxSuppression" in {n.op_type for n in proto.graph.node}
    report = bridge.check_parity(Detect(vl), args, dynamic_shapes=dynamic, registry=registry, extra_args=extra)
    assert report.passed, str(report)


def test_builder_tells_negative_zero_from_zero_and_one_nan_from_another():
    # NOTE: its bodies were kept by the values' ==: the body for 0.0 served -0.0
    s = Param("s", False, attr_type=AttrType.FLOAT, annotation=float)
    builder = BodyBuilder("d::f", lambda s: f"body for {s!r}", (s,))
    assert [builder.function({"s": v}) for v in (0.0, -0.0, float("nan"))] == [
        "body for 0.0", "body for -0.0", "body for nan"]
    assert builder.function({"s": float("nan")}) is builder.function({"s": float("-nan")})
