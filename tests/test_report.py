"""Parity comparison and report formatting."""

import json
import math

import numpy as np
import pytest
import torch

import bridge
from bridge.tools.localize import Localization, NodeParity
from bridge.tools.parity import ParityReport, compare, tolerance


def test_tolerances_per_dtype_and_overrides():
    assert tolerance(torch.float16) == (1e-3, 1e-3)
    assert tolerance(torch.float32, rtol=0.5) == (0.5, 1e-5)
    assert tolerance(torch.float64, atol={torch.float64: 2.0}) == (1e-7, 2.0)
    assert tolerance(torch.int32) == (0.0, 0.0)


def test_compare_counts_mismatches_and_handles_nan_inf():
    e = torch.tensor([1.0, float("nan"), float("inf"), 0.0, 4.0])
    a = np.array([1.0, np.nan, np.inf, 1e-6, 4.5], np.float32)
    r = compare("y", e, a)
    assert (r.mismatches, r.passed) == (1, False)
    assert r.max_abs == pytest.approx(0.5)
    # eager NaN vs ORT 0 is a mismatch of its own: counted, error inf, max abs over the finite pairs
    nan_vs_zero = compare("y", e, np.array([1.0, 0.0, np.inf, 0.0, 4.0], np.float32))
    assert (nan_vs_zero.passed, nan_vs_zero.mismatches, nan_vs_zero.nonfinite) == (False, 1, 1)
    assert nan_vs_zero.errors[1] == math.inf and nan_vs_zero.max_abs == 0.0


def test_compare_reports_shape_and_dtype_mismatch():
    assert "shape (3,) != eager (2,)" in compare("y", torch.zeros(2), np.zeros(3, np.float32)).note
    assert "dtype float64" in compare("y", torch.zeros(2), np.zeros(2, np.float64)).note


def test_compare_ints_are_exact():
    assert not compare("i", torch.tensor([1, 2]), np.array([1, 3], np.int64)).passed
    assert compare("i", torch.tensor([1, 2]), np.array([1, 2], np.int64)).passed


def test_report_table_json_and_assert():
    rows = [compare("a", torch.ones(2, 3), np.ones((2, 3), np.float32)),
            compare("b", torch.ones(2), np.zeros(3, np.float32))]
    report = ParityReport("M", "function", rows)
    text = str(report)
    assert "FAIL" in text.splitlines()[0] and "2x3" in text and "shape (3,) != eager (2,)" in text
    data = json.loads(report.to_json())
    assert data["passed"] is False and data["outputs"][1]["max_abs"] is None
    with pytest.raises(AssertionError, match="parity failed"):
        report.assert_ok()
    assert ParityReport("M", "function", rows[:1]).passed


def test_empty_report_does_not_pass():
    assert not ParityReport("M", "function", []).passed


def test_check_parity_detects_a_wrong_function_body(registry, fresh_name):
    from onnxscript import opset20 as op
    from onnxscript import script, values

    name = fresh_name("double")
    ns, _ = name.split("::")

    @script(values.Opset(ns, 1), default_opset=op)
    def double(x):
        return op.Add(x, x)

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry, function=double)
    def double_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1e-3  # eager differs from the body: parity must catch it

    class M(torch.nn.Module):
        def forward(self, x):
            return double_op(x)

    report = bridge.check_parity(M(), (torch.ones(4),), registry=registry)
    assert not report.passed and report.outputs[0].mismatches == 4
    with pytest.raises(AssertionError):
        bridge.assert_parity(M(), (torch.ones(4),), registry=registry)


def test_worst_elements_are_listed_with_indices():
    e = torch.zeros(3, 4)
    a = np.zeros((3, 4), np.float32)
    a[2, 1], a[0, 3], a[1, 0] = 0.5, -0.25, 1e-7
    r = compare("y", e, a)
    assert [w["index"] for w in r.worst] == [[2, 1], [0, 3], [1, 0]]
    assert r.worst[0] == {"index": [2, 1], "eager": 0.0, "ort": 0.5, "abs_err": 0.5}
    text = str(ParityReport("M", "function", [r]))
    assert "worst elements of y:" in text and "at (2, 1): eager 0  ort 0.5  abs err 0.5" in text
    assert json.loads(ParityReport("M", "function", [r]).to_json())["outputs"][0]["worst"][1]["index"] == [0, 3]


def test_a_localized_nan_mismatch_is_strict_json():
    # a node whose output is NaN where eager is finite: its worst elements hold NaN and inf
    r = compare("y", torch.tensor([1.0, 2.0]), np.array([np.nan, 2.0], np.float32))
    node = NodeParity(0, "n", "Relu", "aten.relu", "relu", [r], [], True)
    local = Localization("function", 1, [node], node, 0, 0.1)
    data = json.loads(ParityReport("M", "function", [r], localization=local).to_json())
    for worst in (data["outputs"][0]["worst"], data["localization"]["first_divergence"]["outputs"][0]["worst"]):
        assert worst[0] == {"index": [0], "eager": 1.0, "ort": "nan", "abs_err": None}


def test_a_pass_with_max_rel_past_rtol_says_atol_held():
    small = compare("y", torch.tensor([1e-7, 1.0]), np.array([2e-7, 1.0], np.float32))  # rel 1 at 1e-7, by atol
    tight = compare("z", torch.tensor([1.0, 2.0]), np.array([1.0, 2.0], np.float32))
    text = str(ParityReport("M", "function", [small, tight]))
    assert small.passed and small.max_rel > small.rtol
    assert text.splitlines()[-1] == ("max rel past rtol, yet PASS: y: only elements with a small |eager| are past "
                                     "rtol, and they pass by atol (each element: |ort - eager| <= atol + rtol * |eager|)")
    assert "z" not in text.splitlines()[-1]  # within rtol: nothing to say
    failing = compare("w", torch.tensor([1.0]), np.array([2.0], np.float32))
    assert "yet PASS" not in str(ParityReport("M", "function", [failing]))  # a FAIL says nothing of atol


def test_exact_outputs_list_no_worst_elements():
    assert compare("y", torch.ones(4), np.ones(4, np.float32)).worst == []


def test_plot_writes_a_png(tmp_path):
    rng = np.random.default_rng(0)
    e = torch.from_numpy(rng.standard_normal((50, 50)).astype(np.float32))
    a = e.numpy() + rng.standard_normal((50, 50)).astype(np.float32) * 1e-6
    report = ParityReport("M", "native", [compare("y", e, a), compare("z", e, e.numpy())])
    path = report.plot(tmp_path / "errors.png")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_runs_say_which_input_shapes_differ():
    # NOTE: a new user could not tell from the demo's table that its three runs had other point counts
    class M(torch.nn.Module):
        def forward(self, x, points):
            return torch.ops.opbridge.identity_conv(x, 2) + points.sum()

    n = torch.export.Dim("n")
    report = bridge.check_parity(M(), (torch.randn(1, 2, 4, 4), torch.ones(5)), dynamic_shapes=(None, {0: n}),
                                 extra_args=[(torch.randn(1, 2, 4, 4), torch.ones(7))])
    assert report.passed and report.sizes == {"points": ["5", "7"]}
    assert "runs differ in input shapes: points 5 | 7" in str(report)
    assert json.loads(report.to_json())["sizes"] == {"points": ["5", "7"]}
