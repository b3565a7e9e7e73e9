"""An op's ONNX version: version 2 of an ONNX op declared after version 1 (another registry) coexists
with it; a declaration onnx refuses is a clear OpBridgeError that leaves nothing half-defined."""

import numpy as np
import pytest
import torch
from onnx import defs

import bridge
from bridge.core.opdef import torch_origin


@pytest.fixture
def two_registries():
    regs = (bridge.Registry(), bridge.Registry())
    yield regs
    for reg in regs:
        for spec in list(reg):
            reg.remove(spec.qualname)


def _model(fn):
    class M(torch.nn.Module):
        def forward(self, x):
            return fn(x)
    return M()


def test_version_2_after_version_1_coexist(two_registries, fresh_name):
    """Same ONNX op (domain::name), version 1 in one registry and version 2 in another: both declare,
    both export and run at their own version (this ended in onnx's SchemaError)."""
    v1_reg, v2_reg = two_registries
    first, second = fresh_name("f"), fresh_name("f")
    domain = first.split("::")[0]

    @bridge.op(first, fake=lambda x: torch.empty_like(x), registry=v1_reg)
    def v1(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @bridge.op(second, domain=domain, version=2, fake=lambda x: torch.empty_like(x), registry=v2_reg)
    def v2(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert defs.get_schema("f", 1, domain).since_version == 1
    assert defs.get_schema("f", 2, domain).since_version == 2
    x = torch.tensor([1.0, 2.0, 3.0])
    for fn, reg, version, expected in ((v1, v1_reg, 1, [2, 3, 4]), (v2, v2_reg, 2, [2, 4, 6])):
        proto = bridge.export(_model(fn), (x,), registry=reg)
        assert {o.domain: o.version for o in proto.opset_import}[domain] == version
        got = bridge.session(proto, registry=reg).run(None, {"x": x.numpy()})[0]
        np.testing.assert_array_equal(got, np.array(expected, np.float32))
    # forgetting version 2 leaves version 1 as it was
    v2_reg.remove(second)
    assert defs.get_schema("f", 2, domain).since_version == 1


def test_refused_schema_leaves_nothing_defined(registry, fresh_name, monkeypatch):
    """onnx refusing the schema is an OpBridgeError naming the op, and the torch op is undefined
    again: the same name can be declared once the cause is gone."""
    name = fresh_name("g")

    def refuse(schema):
        raise defs.SchemaError("refused for the test")

    monkeypatch.setattr(defs, "register_schema", refuse)
    with pytest.raises(bridge.OpBridgeError, match=rf"{name}: onnx refused the schema .*refused for the test"):
        @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry)
        def g(x: torch.Tensor) -> torch.Tensor:
            return x
    assert torch_origin(name) is None and name not in registry
    monkeypatch.undo()

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry)
    def g(x: torch.Tensor) -> torch.Tensor:  # noqa: F811
        return x + 1
    assert g(torch.zeros(1)).tolist() == [1.0]
