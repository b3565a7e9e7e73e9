"""The original deployment path of the C++ op: AOTInductor compiles IdentityModel (C++ op and torchbind
object included) into a .pt2 that runs and matches eager bit for bit."""

import pytest
import torch

import custom_ops.demo as demo


@pytest.mark.long
def test_identity_model_runs_from_an_aoti_package(tmp_path):
    case = demo.identity_model()
    program = torch.export.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes, strict=False)
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "identity.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    for args in (case.args, *case.extra_args):  # two batch sizes through one package
        with torch.no_grad():
            expected = case.model(*args)
        got = runner(*args)
        assert got.shape == expected.shape and torch.equal(got, expected)
