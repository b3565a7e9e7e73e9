"""The parity check itself, held to its word: it never passes a wrong output.

- integers and bool compare as integers, exactly (not through float64, where 2**60 + 2 == 2**60);
- every run of the file is fed the inputs as they were before eager ran (a mutating model changes them);
- bfloat16 goes into onnxruntime as bfloat16 and comes back as bfloat16;
- a file that draws random numbers (a model exported in training mode) is refused, not compared.

References are independent: numpy/Python integers, ml_dtypes' bfloat16, eager torch on untouched copies.
"""

import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge
import custom_ops  # noqa: F401  the seed ops (numpy_sin mutates its output)

# -- integers: exact, as integers -------------------------------------------------------------------


@pytest.mark.parametrize("dtype,eager,ort,bad,max_abs", [
    (torch.int64, [2**60 + 2, 5], [2**60, 5], 1, 2),                      # float64 rounds both to 2**60
    (torch.int64, [2**53 + 1], [2**53], 1, 1),
    (torch.int64, [-2**63, 7], [2**63 - 1, 7], 1, 2**64 - 1),              # past int64: exact all the same
    (torch.int64, [2**62, -2**62], [2**62, -2**62], 0, 0),
    (torch.int32, [2**31 - 1], [-2**31], 1, 2**32 - 1),
    (torch.uint8, [250, 3], [4, 3], 1, 246),
    (torch.int8, [-128], [127], 1, 255),
    (torch.bool, [True, False], [False, False], 1, 1),
])
def test_integers_compare_exactly_as_integers(dtype, eager, ort, bad, max_abs):
    e = torch.tensor(eager, dtype=dtype)
    a = np.array(ort, dtype=e.numpy().dtype)
    r = bridge.compare("i", e, a)
    # the reference: Python's own integers
    want = [abs(int(x) - int(y)) for x, y in zip(ort, eager)]
    assert r.mismatches == sum(w != 0 for w in want) == bad
    assert r.passed is (bad == 0)
    assert r.max_abs == max(want) == max_abs and isinstance(r.max_abs, int)
    if bad:
        worst = r.worst[0]
        i = worst["index"][0]
        assert (worst["eager"], worst["ort"], worst["abs_err"]) == (int(eager[i]), int(ort[i]), want[i])
        assert all(isinstance(worst[k], int) for k in ("eager", "ort", "abs_err"))


def test_integer_overrides_are_ignored_even_when_keyed_by_an_integer_dtype():
    r = bridge.compare("i", torch.tensor([2**60 + 2]), np.array([2**60]), rtol={torch.int64: 1.0},
                       atol={torch.int64: 10})
    assert not r.passed and (r.rtol, r.atol) == (0.0, 0.0)


def test_the_report_prints_integer_errors_and_values_exactly():
    r = bridge.compare("i", torch.tensor([2**60 + 2]), np.array([2**60]))
    text = str(bridge.ParityReport("M", "function", [r]))
    assert f"eager {2**60 + 2}  ort {2**60}  abs err 2" in text, text
    data = bridge.ParityReport("M", "function", [r]).to_dict()["outputs"][0]
    assert data["worst"][0]["eager"] == 2**60 + 2 and data["max_abs"] == 2


def test_check_parity_fails_an_int64_output_off_by_two_at_2_pow_60(registry, fresh_name):
    """The body adds 2 through float64, where 2**60 + 2 rounds to 2**60; eager adds in int64."""
    name = fresh_name("plus2")
    ns, _ = name.split("::")

    @script(values.Opset(ns, 1), default_opset=op)
    def plus2(x):
        d = op.Cast(x, to=onnx.TensorProto.DOUBLE)
        return op.Cast(op.Add(d, op.CastLike(op.Constant(value_float=2.0), d)), to=onnx.TensorProto.INT64)

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry, function=plus2)
    def plus2_op(x: torch.Tensor) -> torch.Tensor:
        return x + 2

    class M(torch.nn.Module):
        def forward(self, x):
            return plus2_op(x)

    x = torch.tensor([2**60, 5, -7])
    report = bridge.check_parity(M(), (x,), registry=registry)
    out = report.outputs[0]
    assert not report.passed and out.mismatches == 1 and out.max_abs == 2
    assert out.worst[0]["index"] == [0] and out.worst[0]["eager"] == 2**60 + 2 and out.worst[0]["ort"] == 2**60


# -- inputs: every run is fed what the model was given, before eager changed it ---------------------


class AddInPlace(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


class SinInto(torch.nn.Module):
    """The seed op numpy_sin writes into ``out``; the result also reads ``out``'s value from before."""

    def forward(self, x, out):
        before = out * 1
        torch.ops.opbridge.numpy_sin(x, out)
        return out + before


@pytest.mark.parametrize("tier", ["function", "python", "native"])
def test_a_mutating_model_is_checked_on_the_inputs_as_given(tier):
    x, out = torch.randn(6), torch.full((6,), 3.0)
    x2, out2 = torch.randn(2), torch.full((2,), -1.0)
    given = [t.clone() for t in (x, out, x2, out2)]
    report = bridge.check_parity(SinInto(), (x, out), extra_args=[(x2, out2)], tier=tier,
                                 dynamic_shapes=({0: torch.export.Dim("n")}, {0: torch.export.Dim("n")}))
    assert report.passed, report
    assert [row.numel for row in report.outputs] == [6, 2]
    # the independent reference: sin(x) + out as given, in float64
    got = bridge.parity.run_ort(bridge.session(bridge.export(SinInto(), (given[0], given[1])), tier=tier),
                                (given[0], given[1]))[0]
    np.testing.assert_allclose(got, np.sin(given[0].double().numpy()) + 3.0, rtol=1e-6, atol=1e-6)
    # the caller's tensors are left as they were: eager ran on copies
    assert all(torch.equal(t, g) for t, g in zip((x, out, x2, out2), given))


def test_an_in_place_model_passes_and_localizes_clean():
    x = torch.ones(3)
    report = bridge.check_parity(AddInPlace(), (x,), localize="always")
    assert report.passed, report
    assert report.first_divergence is None and all(n.passed for n in report.localization.nodes)
    assert report.outputs[0].max_abs == 0.0
    assert torch.equal(x, torch.ones(3))


# -- bfloat16: fed and read back as itself -----------------------------------------------------------


def _bf16_op(registry, fresh_name, scale: float):
    """An op whose eager result is x * 2 in bfloat16 and whose ONNX body computes x * scale through float."""
    name = fresh_name("twice")
    ns, _ = name.split("::")

    @script(values.Opset(ns, 1), default_opset=op)
    def twice(x):
        f = op.Cast(x, to=onnx.TensorProto.FLOAT)
        return op.CastLike(op.Mul(f, op.Constant(value_float=scale)), x)

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry, function=twice,
               dtypes=(torch.bfloat16, torch.float32))
    def twice_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    class M(torch.nn.Module):
        def forward(self, x, n):
            return twice_op(x), n + 1

    return M()


@pytest.mark.parametrize("tier", ["function", "python"])
def test_bfloat16_inputs_and_outputs_cross_as_bfloat16(registry, fresh_name, tier):
    model = _bf16_op(registry, fresh_name, 2.0)
    x, n = (torch.randn(4, 5) * 100).bfloat16(), torch.tensor([2**60])
    report = bridge.check_parity(model, (x, n), registry=registry, tier=tier)
    assert report.passed, report
    y, m = report.outputs
    assert (y.dtype, y.max_abs, (y.rtol, y.atol)) == ("bfloat16", 0.0, bridge.parity.TOLERANCES[torch.bfloat16])
    assert (m.dtype, m.max_abs) == ("int64", 0)
    # independent reference: the feed and the result are ml_dtypes bfloat16 arrays, x * 2 exactly
    sess = bridge.session(bridge.export(model, (x, n), registry=registry), tier=tier, registry=registry)
    got, got_n = bridge.parity.run_ort(sess, (x, n))
    assert got.dtype == np.dtype(ml_dtypes.bfloat16) and got_n.dtype == np.int64
    want = (x.float().numpy() * 2).astype(ml_dtypes.bfloat16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)) and int(got_n[0]) == 2**60 + 1


def test_a_wrong_bfloat16_output_fails_at_bfloat16_tolerance(registry, fresh_name):
    model = _bf16_op(registry, fresh_name, 2.1)  # 5% off: far past bfloat16's 8e-3
    x = torch.tensor([1.0, 2.0, 100.0, 0.0]).bfloat16()
    report = bridge.check_parity(model, (x, torch.tensor([1])), registry=registry)
    y = report.outputs[0]
    assert not report.passed and y.dtype == "bfloat16" and y.mismatches == 3
    assert y.worst[0]["eager"] == 200.0 and y.worst[0]["ort"] == float(np.float32(210.0).astype(ml_dtypes.bfloat16))


# -- training mode: what the file computes, said truly; a random file is not compared ---------------


def _dropout_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))


def test_a_training_mode_export_warns_what_the_file_does():
    model, x = _dropout_model().train(), torch.randn(16, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proto = bridge.export(model, (x,))
    text = " ".join(str(w.message) for w in caught if "opbridge" in str(w.message))
    # what the file really does: two runs on the same input differ, about half the values are zero
    sess = bridge.session(proto)
    feed = bridge.parity.ort_feed(sess, (x,))
    a, b = sess.run(None, feed)[0], sess.run(None, feed)[0]
    assert not np.array_equal(a, b) and 0.3 < float((a == 0).mean()) < 0.7
    assert "eval behaviour" not in text
    assert "at random" in text and "Dropout" in text and "model.eval()" in text, text


def test_check_parity_refuses_a_file_that_draws_random_numbers():
    model = _dropout_model().train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(bridge.OpBridgeError, match=r"random.*Dropout.*model\.eval\(\)"):
            bridge.check_parity(model, (torch.randn(16, 8),))
    # a nearly never-dropping Dropout is random all the same: today it could pass by chance
    tiny = torch.nn.Sequential(torch.nn.Dropout(1e-9)).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(bridge.OpBridgeError, match="random"):
            bridge.check_parity(tiny, (torch.randn(4),))


def test_the_same_model_in_eval_mode_exports_and_checks_without_a_warning():
    model = _dropout_model().eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = bridge.check_parity(model, (torch.randn(16, 8),))
    assert report.passed, report
    assert not [w for w in caught if "opbridge" in str(w.message)]
