"""Data-dependent output sizes in every tier (issue #26 item 3): an nms-like op written the way detection
libraries write theirs (``torch.library.custom_op`` with a CPU kernel; its fake kernel sizes the output
with ``torch.library.get_ctx().new_dynamic_size()``), registered with ``bridge.register`` plus a written
onnxscript body and a native C++ kernel from this folder (tests/user_ops/nms_like.cc), in a model that
gathers boxes and scores with the kept indices, with a dynamic number of boxes; parity against eager at
box counts whose values keep none, one, some and every box. Then C++ kernels written here for the
torchvision-named ops of tests/test_translations.py (nms, roi_align, deform_conv2d), run by the native tier
in place of the translation torch.onnx gives them."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import forkserver
import numpy as np
import onnx
import onnxscript
import pytest
import test_translations as tt
import torch
import vision_ops
from onnxscript import FLOAT
from onnxscript import opset20 as op

import bridge
from bridge.core.basics.errors import OpBridgeError, UnsupportedInTier
from bridge.core.basics.opnames import spec_names
from ort_kernels.base import Plan
from ort_kernels.build import io_types, library_path, served_ops
from ort_kernels.tiers import get as get_tier

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
IOU, SCORE = 0.5, 0.2  # the model's thresholds: a box is a candidate when its score is > SCORE
_MAX_BOXES = 1 << 30


@torch.library.custom_op("detectlike::nms", mutates_args=())
def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, score_threshold: float) -> torch.Tensor:
    """Greedy NMS as detection libraries' CPU kernels: boxes [N, 4] (x1, y1, x2, y2) scoring above
    ``score_threshold``, by descending score, drop those whose IoU with a kept box is > iou_threshold;
    the kept indices (int64), as many as the values keep."""
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: f"boxes must be [N, 4], got {list(boxes.shape)}")
    torch._check(scores.shape == boxes.shape[:1], lambda: f"scores must hold one score per box, got {list(scores.shape)}")
    # NOTE: torchvision's greedy nms (tests/vision_ops.py) over the candidates, mapped back to their indices
    candidates = (scores > score_threshold).nonzero().flatten()
    return candidates[vision_ops.nms(boxes[candidates], scores[candidates], iou_threshold)]


@nms.register_fake
def _nms_fake(boxes, scores, iou_threshold, score_threshold):
    return boxes.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


def _written_body():
    """The op's written body, named as its node (``nms``: the eager op above holds that name here)."""
    @onnxscript.script(onnxscript.values.Opset("detectlike", 1), default_opset=op)
    def nms(boxes, scores, iou_threshold: float, score_threshold: float):
        """ONNX NonMaxSuppression over one batch and one class; the kept indices (its third column)."""
        # NOTE: ONNX NonMaxSuppression takes float32 only: a float64 model's boxes are compared in float32
        selected = op.NonMaxSuppression(op.Cast(op.Unsqueeze(boxes, [0]), to=FLOAT.dtype),
                                        op.Cast(op.Unsqueeze(scores, [0, 1]), to=FLOAT.dtype),
                                        op.Constant(value_ints=[_MAX_BOXES]), op.Constant(value_float=iou_threshold),
                                        op.Constant(value_float=score_threshold))
        return op.Reshape(op.Slice(selected, [2], [3], [1]), [-1])
    return nms


NMS_BODY = _written_body()


def _samples(dtype):
    boxes = torch.tensor([[0, 0, 4, 4], [1, 1, 5, 5], [10, 10, 12, 12]], dtype=dtype)
    return [bridge.SampleInput((boxes, torch.tensor([0.9, 0.8, 0.7], dtype=dtype), IOU, SCORE))]


def register(registry: bridge.Registry, native: str = "user_ops/nms_like.cc") -> bridge.BridgeOp:
    """``detectlike::nms`` in ``registry``: the written body, the C++ kernel ``native`` (relative to tests/)."""
    return bridge.register("detectlike::nms", function=NMS_BODY, native=native, sample_inputs=_samples,
                           dtypes=(torch.float32, torch.float64), registry=registry)


class Detect(torch.nn.Module):
    """nms, then gathers with its data-dependent count."""

    def forward(self, boxes, scores):
        keep = torch.ops.detectlike.nms(boxes, scores, IOU, SCORE)
        return boxes[keep] * 2, scores.index_select(0, keep), keep


# -- box sets: each case's values keep a known number of boxes ------------------------------------------
def _random(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 20
    return torch.cat([xy, xy + torch.rand(n, 2, generator=g) * 10 + 1], 1), torch.rand(n, generator=g)


def _disjoint(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n boxes on a row, none touching, every score above SCORE: all kept."""
    x = torch.arange(n, dtype=torch.float32)[:, None] * 3
    return torch.cat([x, x * 0, x + 2, x * 0 + 2], 1), torch.linspace(0.9, 0.3, n)


def _stacked(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n nearly equal boxes: the best one suppresses the rest."""
    shift = torch.arange(n, dtype=torch.float32)[:, None] * 0.05
    return torch.tensor([[1.0, 1.0, 9.0, 9.0]]) + shift, torch.linspace(0.4, 0.9, n)


def _low(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """disjoint boxes whose scores are all below SCORE: none kept."""
    boxes, _ = _disjoint(n)
    # NOTE: not up to SCORE itself: ONNX float attributes are float32, and float32(0.2) read as float64 is
    # above the float64 threshold 0.2 eager compares with
    return boxes, torch.linspace(0.0, SCORE / 2, n)


ARGS = _random(30, 0)  # the export's sample
DYNAMIC = ({0: torch.export.Dim("N", min=0)}, {0: torch.export.Dim("N", min=0)})
RUNS = {  # name -> (inputs, boxes kept)
    "random_50": (_random(50, 1), None), "all_6": (_disjoint(6), 6), "one_of_7": (_stacked(7), 1),
    "none_of_5": (_low(5), 0), "single_box": (_disjoint(1), 1), "no_boxes": (_disjoint(0), 0),
}
EXTRA = [inputs for inputs, _ in RUNS.values()]


def _cast(inputs, dtype):
    return tuple(t.to(dtype) for t in inputs)


@pytest.fixture(scope="module")
def detect():
    """A registry with ``detectlike::nms`` and its right kernel."""
    reg = bridge.Registry()
    register(reg)
    yield reg
    for spec in list(reg):
        reg.remove(spec.qualname)


def test_box_sets_keep_what_they_say():
    """The run cases really reach the edges: eager keeps 0, 1 and all boxes where the names say so."""
    for name, ((boxes, scores), kept) in RUNS.items():
        keep = nms(boxes, scores, IOU, SCORE)
        assert keep.dtype == torch.int64
        if kept is not None:
            assert len(keep) == kept, name
    some = len(nms(*RUNS["random_50"][0], IOU, SCORE))
    assert 1 < some < 50


def test_export_keeps_the_count_symbolic(detect):
    """The exported file: one detectlike::nms node; its output's one dim is a symbol of its own (not the
    box count N, not a number), and the gathers downstream have symbolic counts too."""
    proto = bridge.export(Detect(), ARGS, dynamic_shapes=DYNAMIC, registry=detect)
    nodes = [n for n in proto.graph.node if n.domain == "detectlike"]
    assert [n.op_type for n in nodes] == ["nms"]
    boxes_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert boxes_dim.dim_param == "N"
    outs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in proto.graph.output}
    count = outs[nodes[0].output[0]][0]
    assert isinstance(count, str) and count and count != "N"
    # NOTE: torch.export gives boxes[keep] an unbacked symbol of its own (u3 beside u0): only "not a number"
    # is the bridge's to keep
    assert sorted(outs.values(), key=len) == [[count], [count], [outs[proto.graph.output[0].name][0], 4]]
    assert isinstance(outs[proto.graph.output[0].name][0], str)


def test_native_typing_takes_a_data_dependent_size(detect):
    """The native table's element types come from the fake kernel, which asks for a dynamic size."""
    spec = detect.get("detectlike::nms")
    assert io_types(spec, torch.float32) == ((onnx.TensorProto.FLOAT,) * 2, (onnx.TensorProto.INT64,))
    assert io_types(spec, torch.float64) == ((onnx.TensorProto.DOUBLE,) * 2, (onnx.TensorProto.INT64,))


# -- parity in every tier ---------------------------------------------------------------------------------
def _parity(registry, tier, dtype=torch.float32):
    return bridge.check_parity(Detect(), _cast(ARGS, dtype), dynamic_shapes=DYNAMIC, registry=registry, tier=tier,
                               extra_args=[_cast(a, dtype) for a in EXTRA])


_PYTHON_TIER = """
import sys
sys.path.insert(0, {tests!r})
import bridge, test_data_dependent as t
reg = bridge.Registry()
t.register(reg)
report = t._parity(reg, "python")
print(report)
sys.exit(0 if report.passed else 1)
"""


@pytest.mark.parametrize("tier", ["function", "native", "python"])
def test_nms_then_gather_matches_eager(detect, tier):
    """Every tier matches eager at every box count. The python tier runs in a fresh process: its ops
    register with onnxruntime-extensions once per process."""
    if tier == "python":
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = forkserver.run(["-c", _PYTHON_TIER.format(tests=str(TESTS))], cwd=ROOT, env=env, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "ORT tier python vs eager torch | PASS" in r.stdout
        return
    report = _parity(detect, tier)
    assert report.passed, str(report)
    assert len(report.outputs) == 3 * (1 + len(EXTRA))
    shapes = [o.shape for o in report.outputs if o.dtype == "int64"]
    assert {s[0] for s in shapes} >= {0, 1, 6}  # none, one and all boxes kept came out of ORT


@pytest.mark.parametrize("tier", ["function", "native"])
def test_float64(detect, tier):
    report = _parity(detect, tier, torch.float64)
    assert report.passed, str(report)


# -- the native tier runs this folder's C++ kernel --------------------------------------------------------
def test_native_kernel_is_found_by_the_ops_full_name(detect):
    spec = detect.get("detectlike::nms")
    assert spec_names(spec).symbol == "kernel_detectlike_op_nms"
    assert Path(spec.native_source) == TESTS / "user_ops" / "nms_like.cc"
    assert served_ops(detect)[("detectlike", "nms")] == (torch.float32, torch.float64)
    lib = ctypes.CDLL(str(library_path(detect)))
    lib.OpbridgeServedOps.restype = ctypes.c_char_p
    served = lib.OpbridgeServedOps().decode().splitlines()
    assert {"detectlike::nms:1:float32", "detectlike::nms:1:float64"} <= set(served)
    # the session's model keeps the node but drops its function body: only the C++ kernel can run it
    proto = bridge.export(Detect(), ARGS, dynamic_shapes=DYNAMIC, registry=detect)
    assert any(f.name == "nms" for f in proto.functions)
    get_tier("native").prepare(Plan(proto, detect), None)
    assert not any(f.name == "nms" for f in proto.functions)
    assert [n.op_type for n in proto.graph.node if n.domain == "detectlike"] == ["nms"]


def test_a_wrong_native_kernel_is_caught():
    """The same op with a kernel that forgets to sort by score: the function tier (its body) still
    passes, the native tier's parity fails on the kept indices."""
    reg = bridge.Registry()
    try:
        register(reg, native="user_ops/nms_like_unsorted.cc")
        assert _parity(reg, "function").passed
        report = _parity(reg, "native")
        assert not report.passed
        failed = {o.name.split(" [")[0] for o in report.outputs if not o.passed}
        assert "nms" in failed, str(report)
    finally:
        for spec in list(reg):
            reg.remove(spec.qualname)


def test_native_kernel_names_a_bad_input(detect, tmp_path):
    """A score count that does not match the boxes: the C++ kernel's error names the input, as eager does."""
    path = tmp_path / "detect.onnx"
    bridge.export(Detect(), ARGS, path, dynamic_shapes=DYNAMIC, registry=detect)
    boxes, scores = _random(6, 3)
    with pytest.raises(RuntimeError, match="scores must hold one score per box"):
        nms(boxes, scores[:4], IOU, SCORE)
    sess = bridge.session(path, tier="native", registry=detect)
    with pytest.raises(OpBridgeError, match=r"detectlike::nms: input 'scores' must hold one score per box \(6\), "
                                             r"got \[4\]"):
        bridge.parity.run_ort(sess, (boxes, scores[:4]))
    got = bridge.parity.run_ort(sess, (boxes, scores))
    np.testing.assert_array_equal(got[2], nms(boxes, scores, IOU, SCORE).numpy())


# -- native kernels for the torchvision-named ops of tests/test_translations.py (nms: no score threshold) -----------------------------
def _nms_samples(dtype):
    return [bridge.SampleInput(s.args[:3]) for s in _samples(dtype)]


def _roi_samples(dtype):
    return [bridge.SampleInput((tt.FEAT.to(dtype), tt._rois(3, 0).to(dtype), 0.5, 2, 2, -1, True))]


def _deform_samples(dtype):
    g = torch.Generator().manual_seed(0)
    x, w, off, mask, bias = (torch.randn(*s, generator=g).to(dtype) for s in
                             [(1, 4, 5, 5), (6, 2, 3, 3), (1, 2 * 9, 5, 5), (1, 9, 5, 5), (6,)])
    return [bridge.SampleInput((x, w, off, mask, bias, 1, 1, 1, 1, 1, 1, 2, 1, True))]


@pytest.fixture(scope="module")
def vision_native():
    """torchvision::nms, roi_align and deform_conv2d with no body given (torch.onnx's translation is their
    body) and a C++ kernel each from tests/user_ops/."""
    reg = bridge.Registry()
    for name, samples in (("nms", _nms_samples), ("roi_align", _roi_samples), ("deform_conv2d", _deform_samples)):
        # NOTE: user_ops/nms_like.cc holds kernel_torchvision_op_nms beside detectlike::nms's (one algorithm)
        bridge.register(f"torchvision::{name}", native=f"user_ops/{'nms_like' if name == 'nms' else name}.cc",
                        sample_inputs=samples, dtypes=(torch.float32, torch.float64), registry=reg)
    yield reg
    for spec in list(reg):
        reg.remove(spec.qualname)


class GivenOffsets(torch.nn.Module):
    """deform_conv2d at tests/test_translations.py's two attribute sets, offsets and mask given as inputs:
    ONNX Runtime has no float64 Conv, which Deform computes its offsets with."""

    def __init__(self, ops):
        super().__init__()
        self.deform = tt.Deform(ops)

    def forward(self, x, off, mask, off2):
        d = self.deform
        a = d.ops.deform_conv2d(x, d.w, off, mask, d.b, 1, 1, 1, 1, 1, 1, 2, 2, True)
        b = d.ops.deform_conv2d(x, d.w, off2, x.new_zeros(0), d.b, 2, 2, 2, 2, 2, 2, 2, 1, False)
        return a, b


def _given_offsets(batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (tt._deform_input(batch, seed), torch.randn(batch, 36, 9, 11, generator=g) * 2,
            torch.rand(batch, 18, 9, 11, generator=g), torch.randn(batch, 18, 5, 6, generator=g))


_BATCH = torch.export.Dim("B", min=1)
VISION_CASES = {  # (op, dtype) -> (model factory, args, dynamic_shapes, extra_args)
    ("nms", torch.float32): tt.CASES["nms"],
    ("nms", torch.float64): tt.CASES["nms"],
    ("roi_align", torch.float32): tt.CASES["roi_align"],
    ("roi_align", torch.float64): tt.CASES["roi_align"],
    ("deform_conv2d", torch.float32): tt.CASES["deform_conv2d"],
    ("deform_conv2d", torch.float64): (GivenOffsets, _given_offsets(2, 0), ({0: _BATCH},) * 4,
                                       [_given_offsets(3, 1), _given_offsets(1, 2)]),
}


@pytest.mark.parametrize(("name", "dtype"), list(VISION_CASES))
def test_vision_ops_native_kernels_match_eager(vision_native, name, dtype):
    """The models of tests/test_translations.py (two attribute sets per op, dynamic box or batch counts)
    in the native tier, which runs these C++ kernels: the session drops the translation's body."""
    factory, args, dynamic, extra = VISION_CASES[name, dtype]
    model = factory(tt.tv).eval().to(dtype)
    report = bridge.check_parity(model, _cast(args, dtype), dynamic_shapes=dynamic, registry=vision_native,
                                 tier="native", extra_args=[_cast(a, dtype) for a in extra])
    assert report.passed, str(report)
    assert served_ops(vision_native)[("torchvision", name)] == (torch.float32, torch.float64)
    proto = bridge.export(model, _cast(args, dtype), dynamic_shapes=dynamic, registry=vision_native)
    # the translation, for the function tier; torch_lib's nms is NonMaxSuppression, float32 only
    assert any(f.name == name for f in proto.functions) == ((name, dtype) != ("nms", torch.float64))
    get_tier("native").prepare(Plan(proto, vision_native), None)
    assert not any(f.name == name for f in proto.functions)


def test_function_tier_names_why_a_float64_nms_has_no_body():
    """torch_lib's nms translation is ONNX NonMaxSuppression (float32 only): a float64 model's function tier
    names that, also when the failure comes from the derivation cache after a float32 body was derived."""
    factory, args, dynamic, extra = tt.CASES["nms"]
    reg = bridge.Registry()  # NOTE: derivations are cached per registry: a fresh one, so the order below holds
    try:
        bridge.register("torchvision::nms", registry=reg)
        for _ in range(2):  # the first float64 failure is derived, the second comes from the cache
            with pytest.raises(UnsupportedInTier, match=r"torchvision::nms: the derived body does not load .*"
                                                        r"unsupported type: tensor\(double\)"):
                bridge.check_parity(factory(tt.tv), _cast(args, torch.float64), dynamic_shapes=dynamic,
                                    registry=reg, tier="function")
            proto = bridge.export(factory(tt.tv), args, dynamic_shapes=dynamic, registry=reg)  # float32: a body
            assert [f.name for f in proto.functions] == ["nms"]
    finally:
        for spec in list(reg):
            reg.remove(spec.qualname)
