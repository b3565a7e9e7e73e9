"""Parity comparison and report formatting."""

import json
import math

import numpy as np
import pytest
import torch

import bridge
from bridge.parity import ParityReport, compare, tolerance


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
    assert compare("y", e, np.array([1.0, 0.0, np.inf, 0.0, 4.0], np.float32)).max_abs == math.inf


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
