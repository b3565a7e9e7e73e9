"""The parity table (generated from tests/op_db.py): op x tier x dtype x sample, ORT against eager
torch and against the op's independent reference.

Each sample is exported once (bridge.export) and the file is run in every tier.
"""

import pytest
import torch

import bridge
from bridge.tools.testing import OpModule
from op_db import parity_params


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
