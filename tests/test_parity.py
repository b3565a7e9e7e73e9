"""The parity table: op x tier x dtype x sample, ORT against eager torch and the op's reference."""

import pytest
import torch

import bridge
from bridge.testing import OpModule, cases

TIERS = ("function", "native", "python")


def xfail_reason(case, tier) -> str | None:
    """Why (op, tier, dtype) is expected to fail; every expected failure carries its reason."""
    if tier == "python" and case.dtype != torch.float32:
        return "the python tier runs float32 only (onnxruntime-extensions aborts on float16); guarded"
    return None


def _params():
    out = []
    for tier in TIERS:
        for case in cases(bridge.REGISTRY):
            reason = xfail_reason(case, tier)
            marks = [pytest.mark.xfail(reason=reason, raises=bridge.UnsupportedInTier, strict=True)] if reason else []
            out.append(pytest.param(case, tier, marks=marks, id=f"{tier}-{case.id}"))
    return out


@pytest.mark.parametrize("case,tier", _params())
def test_parity(case, tier, tmp_path):
    module, tensors = OpModule.from_sample(case.spec, case.sample)
    report = bridge.check_parity(module, tensors, tier=tier, path=tmp_path / "op.onnx")
    report.assert_ok()
    n_out = bridge.REGISTRY.functional(case.spec).num_outputs
    assert [o.dtype for o in report.outputs] == [str(case.dtype).replace("torch.", "")] * n_out
    # ORT also agrees with the independent reference, not only with eager
    sess = bridge.session(tmp_path / "op.onnx", tier=tier)
    got = bridge.parity.run_ort(sess, tensors)[0]
    expected = case.spec.reference(*case.sample.args)
    row = bridge.compare("vs reference", expected, got)
    assert row.passed, row
