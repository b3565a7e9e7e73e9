"""The parity table (generated from tests/op_db.py): op x tier x dtype x sample, ORT against eager
torch and against the op's independent reference.

Each sample is exported once (bridge.export) and the file is run in every tier.
"""

import json
import math
import warnings

import numpy as np
import pytest
import torch
from cli_runner import run as in_process
from op_db import parity_params

import bridge
from bridge.tools.testing import OpModule


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """case -> path of its exported model, exported on first use and shared by the tiers."""
    root, paths = tmp_path_factory.mktemp("parity"), {}

    def get(case):
        if case.id not in paths:
            module, tensors = OpModule.from_sample(case.entry.spec, case.sample)
            path = root / f"{len(paths)}.onnx"
            bridge.export(module, tensors, path)
            paths[case.id] = path  # only once exported: a failed export is retried, not half-reused
        return paths[case.id]

    return get


def _outputs(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


@pytest.mark.parametrize("case,tier", parity_params())
def test_parity(case, tier, exported):
    spec = case.entry.spec
    module, tensors = OpModule.from_sample(spec, case.sample)
    sess = bridge.session(exported(case), tier=tier)
    got = bridge.parity.run_ort(sess, tensors)
    # eager runs on copies after ORT: a mutating op must not leave its result in the sample's tensors
    with torch.no_grad():
        eager = _outputs(module(*(t.clone() for t in tensors)))
    rtol, atol = case.entry.tolerance(case.dtype, tier, "parity")
    report = bridge.ParityReport(case.id, tier, [bridge.compare(f"output {i}", e, g, rtol=rtol, atol=atol)
                                                 for i, (e, g) in enumerate(zip(eager, got))])
    report.assert_ok()
    n_out = bridge.REGISTRY.functional(spec).num_outputs
    assert len(got) == len(eager) == n_out
    np_dtype = torch.empty((), dtype=case.dtype).numpy().dtype
    assert [g.dtype for g in got] == [np_dtype] * n_out
    # ORT also agrees with the independent reference, not only with eager
    expected = _outputs(spec.reference(*case.sample.args))
    assert len(expected) == n_out
    for i, (e, g) in enumerate(zip(expected, got)):
        row = bridge.compare(f"output {i} vs reference", e, g, rtol=rtol, atol=atol)
        assert row.passed, row


# -- NaN/inf: numpy's assert_allclose(equal_nan=True), as a table ---------------------------------
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dtype,eager,ort,passed,bad", [
    (torch.float32, [NAN, 2, NAN], [2, 2, 3], False, [[0], [2]]),      # ORT anything where eager is NaN
    (torch.float32, [INF], [-INF], False, [[0]]),                     # inf vs -inf
    (torch.float32, [-INF], [INF], False, [[0]]),
    (torch.float32, [NAN, 1], [NAN, 1], True, []),                    # NaN matches NaN
    (torch.float32, [INF, -INF], [INF, -INF], True, []),              # inf matches the same inf
    (torch.float32, [1.0, 2.0], [1.0, INF], False, [[1]]),            # eager finite, ORT inf
    (torch.float32, [1.0, INF], [1.0, 3.0e38], False, [[1]]),         # eager inf, ORT finite (even huge)
    (torch.float32, [1.0, -INF], [1.0, -3.0e38], False, [[1]]),
    (torch.float32, [NAN], [INF], False, [[0]]),                      # NaN vs inf
    (torch.float32, [INF], [NAN], False, [[0]]),
    (torch.float32, [1.0], [NAN], False, [[0]]),                      # eager finite, ORT NaN
    (torch.float16, [NAN, INF, 1.0], [NAN, INF, 1.0], True, []),
    (torch.float16, [NAN, INF, 1.0], [0.0, 65504.0, 1.0], False, [[0], [1]]),
    (torch.float16, [1.0, 2.0], [1.0005, 2.0], True, []),             # finite: within float16's tolerance
    (torch.float64, [NAN, -INF, 1.0], [NAN, -INF, 1.0 + 1e-9], True, []),
    (torch.float64, [NAN, 5.0], [-INF, 5.0], False, [[0]]),
    (torch.float64, [1.0, 2.0], [1.0, 2.001], False, [[1]]),          # finite: past float64's tolerance
    (torch.int64, [1, 2, 3], [1, 2, 3], True, []),
    (torch.int64, [1, 2, 3], [1, 2, 4], False, [[2]]),
    (torch.int32, [7], [8], False, [[0]]),
    (torch.bool, [True, False], [True, True], False, [[1]]),
])
def test_nan_inf_rules(dtype, eager, ort, passed, bad):
    e = torch.tensor(eager, dtype=dtype)
    a = np.array(ort, dtype=e.numpy().dtype)
    r = bridge.compare("y", e, a)
    assert r.passed is passed and r.mismatches == len(bad)
    # each mismatch reported with its position, ahead of any error within tolerance
    assert sorted(w["index"] for w in r.worst[:len(bad)]) == bad
    # the reference semantics: numpy's assert_allclose(equal_nan=True) at the same tolerance
    try:
        np.testing.assert_allclose(a, e.numpy(), rtol=r.rtol, atol=r.atol, equal_nan=True)
        numpy_passed = True
    except AssertionError:
        numpy_passed = False
    assert numpy_passed is passed
    # max abs/rel are over finite pairs only: finite numbers even when NaN/inf pairs mismatch
    assert math.isfinite(r.max_abs)
    if r.nonfinite:
        assert "NaN/inf mismatch" in r.note and "over finite pairs" in r.note


def test_ints_stay_exact_whatever_the_overrides():
    r = bridge.compare("i", torch.tensor([1, 2]), np.array([1, 3], np.int64), rtol=0.5, atol=5)
    assert not r.passed and (r.rtol, r.atol) == (0.0, 0.0)


def test_nan_inf_mismatches_in_the_report_and_json():
    r = bridge.compare("y", torch.tensor([NAN, 2.0, INF]), np.array([2.0, 2.0, -INF], np.float32))
    report = bridge.ParityReport("M", "function", [r])
    text = str(report)
    assert "FAIL (2 NaN/inf mismatches; max abs/rel over finite pairs)" in text
    assert "at (0,): eager nan  ort 2" in text and "at (2,): eager inf  ort -inf" in text
    data = json.loads(report.to_json())["outputs"][0]  # strict JSON: no bare NaN/Infinity
    assert data["nonfinite"] == 2 and data["max_abs"] == 0.0
    assert [(w["index"], w["eager"], w["ort"]) for w in data["worst"]] == [([0], "nan", 2.0), ([2], "inf", "-inf")]


def test_check_parity_fails_an_output_that_differs_only_at_a_nan(registry, fresh_name):
    """Eager log(x) is NaN at x < 0; the ONNX body log(|x|) is not: only the NaN position differs."""
    from onnxscript import opset20 as op
    from onnxscript import script, values

    name = fresh_name("log")
    ns, _ = name.split("::")

    @script(values.Opset(ns, 1), default_opset=op)
    def log(x):
        return op.Log(op.Abs(x))

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry, function=log)
    def log_op(x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)

    class M(torch.nn.Module):
        def forward(self, x):
            return log_op(x)

    x = torch.tensor([-1.0, 1.0, 2.0, 4.0])
    report = bridge.check_parity(M(), (x,), registry=registry)
    out = report.outputs[0]
    assert not report.passed and (out.mismatches, out.nonfinite) == (1, 1)
    assert out.worst[0]["index"] == [0] and math.isnan(out.worst[0]["eager"]) and out.worst[0]["ort"] == 0.0
    assert out.max_abs == 0.0  # the finite pairs agree exactly


def test_a_difference_over_an_expected_zero_is_inf_relative_error_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = bridge.compare("x", torch.tensor([0.0, 5.0]), np.array([100.0, 5.0], np.float32))
    assert not r.passed and r.max_rel == math.inf and r.max_abs == 100.0


def _lying_op(registry, fresh_name, *, samples: bool):
    """An op whose fake says [n, 4] where it returns [n] (red team 4: the file declared [3, 4], parity said PASS)."""
    name = fresh_name("liar")
    sample_inputs = (lambda dtype: [bridge.SampleInput((torch.randn(5, 4, dtype=dtype),), name="rows")]) \
        if samples else None

    @bridge.op(name, fake=lambda x: x.new_empty(x.shape[0], 4), registry=registry, sample_inputs=sample_inputs)
    def liar(x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1)

    class M(torch.nn.Module):
        def forward(self, x):
            return liar(x) * 2, x + 1

    return name, M()


def test_parity_fails_an_output_the_file_declares_otherwise_than_eager_gives(registry, fresh_name):
    # NOTE: the python tier runs the op itself; the function tier refuses the body (it fails shape inference)
    _, model = _lying_op(registry, fresh_name, samples=False)
    report = bridge.check_parity(model, (torch.randn(3, 4),), registry=registry, tier="python")
    lying, honest = report.outputs
    assert not report.passed and not lying.passed and honest.passed
    assert lying.mismatches == 0  # onnxruntime returned eager's values: only the declaration lies
    assert "the file declares float32[3,4], eager gives float32[3]" in lying.note
    assert "declared type differs from eager: mul" in str(report) and "make each fake return" in str(report)


def test_export_names_the_output_a_fake_kernel_lies_about_on_the_samples(registry, fresh_name, tmp_path):
    name, model = _lying_op(registry, fresh_name, samples=True)
    message = (rf"opbridge: {name}: its fake kernel says output 0 is float32\[5,4\], its forward gives float32\[5\] "
               r"on its float32 sample 'rows'; .* Make the fake return what the op returns")
    with pytest.raises(bridge.OpBridgeError, match=message):
        bridge.export(model, (torch.randn(3, 4),), tmp_path / "m.onnx", registry=registry)
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("override", [dict(rtol=-1), dict(atol=float("inf")), dict(rtol=float("nan")),
                                      dict(atol={torch.float32: -1e-3}), dict(rtol="1e-3"), dict(atol=True)])
def test_a_tolerance_that_is_no_finite_number_at_least_zero_is_refused(override):
    """A negative tolerance fails every output and an infinite one passes any: refused before the export."""
    name = next(iter(override))
    with pytest.raises(bridge.OpBridgeError, match=rf"^opbridge: {name} must be a finite number >= 0 .* Got {name}="):
        bridge.check_parity(torch.nn.Identity(), (torch.ones(2),), **override)


def test_cli_check_refuses_a_negative_tolerance():
    r = in_process("check", "--op", "opbridge::crop", "--rtol", "-1")
    assert r.returncode == 2 and "opbridge: rtol must be a finite number >= 0" in r.stderr, r.stderr
