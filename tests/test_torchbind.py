"""torchbind custom class with state: build, pickling, export to a self-contained node, bitwise parity."""

import copy
import io
import pickle

import onnx
import pytest
import torch

import bridge
import custom_ops.demo as demo
from custom_ops.identity_conv import IdentityConvClass


@pytest.fixture(scope="module")
def case():
    return demo.identity_model()


def test_class_runs_eager_and_checks_its_state():
    obj = IdentityConvClass(4)
    x = torch.randn(2, 4, 3, 3)
    out = obj.forward(x)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    assert obj.__obj_flatten__() == (("channels", 4),)
    with pytest.raises(RuntimeError, match=r"IdentityConvClass\(channels=4\).forward expects \(N, 4, ...\)"):
        obj.forward(torch.ones(1, 3, 2, 2))


def test_class_pickles():
    obj = IdentityConvClass(5)
    assert pickle.loads(pickle.dumps(obj)).__obj_flatten__() == (("channels", 5),)
    assert copy.deepcopy(obj).__obj_flatten__() == (("channels", 5),)
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=False).__obj_flatten__() == (("channels", 5),)


def test_export_turns_method_call_into_node_with_state_attributes(case):
    proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    nodes = [(n.domain, n.op_type, {a.name: a.i for a in n.attribute}) for n in proto.graph.node]
    assert [t for _, t, _ in nodes] == ["Conv", "identity_conv", "identity_conv", "Conv"]
    assert nodes[1] == ("opbridge", "identity_conv", {"channels": 3})  # from the object's __obj_flatten__
    assert [i.name for i in proto.graph.input] == ["x"]  # the object is not an input: the graph is self-contained
    onnx.checker.check_model(proto, full_check=True)


def test_state_comes_from_the_object_not_the_class(registry):
    class Five(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.obj = IdentityConvClass(5)

        def forward(self, x):
            return self.obj.forward(x) * 2

    proto = bridge.export(Five(), (torch.randn(1, 5, 2, 2),))
    node = next(n for n in proto.graph.node if n.op_type == "identity_conv")
    assert node.attribute[0].i == 5


@pytest.mark.parametrize("tier", ["function", "native"])
def test_identity_model_is_bitwise_equal_to_eager(case, tier):
    report = bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes,
                                 extra_args=case.extra_args, tier=tier, rtol=0, atol=0)
    assert report.passed, report
    assert all(o.max_abs == 0.0 for o in report.outputs) and len(report.outputs) == 2


def test_method_without_an_op_is_a_clear_error(case, registry):
    with pytest.raises(bridge.OpBridgeError, match=r"opbridge::IdentityConvClass.forward.*torchbind=\["):
        bridge.export(case.model, case.args, registry=registry)


def test_state_that_does_not_match_the_op_attributes_is_a_clear_error(case, monkeypatch):
    crop = bridge.REGISTRY.get("opbridge::crop")
    monkeypatch.setattr(bridge.REGISTRY, "for_torchbind", lambda cls, method: crop)
    with pytest.raises(bridge.OpBridgeError, match=r"gives state \['channels'\] but opbridge::crop has attributes"):
        bridge.export(case.model, case.args)


# -- seed 002 as written: the method registered with nothing else -------------------------------------------------
class Held(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.obj = IdentityConvClass(channels)

    def forward(self, x):
        return self.obj.forward(x) * 2


def test_method_registered_alone_learns_its_state_names_from_the_object_at_export(registry):
    model = Held(5)  # NOTE: loads the class's library, as the seed's users do before registering
    op = bridge.register("opbridge::IdentityConvClass.forward", registry=registry)
    with pytest.raises(bridge.OpBridgeError, match=r"read from the object at export. Got no export"):
        op.spec  # noqa: B018
    x = torch.randn(2, 5, 3, 3)
    proto = bridge.export(model, (x,), registry=registry)
    node = next(n for n in proto.graph.node if n.domain == "opbridge")
    assert (node.op_type, [(a.name, a.i) for a in node.attribute]) == ("IdentityConvClass_forward", [("channels", 5)])
    assert [p.name for p in op.spec.attributes] == ["channels"]  # __obj_flatten__'s names
    bridge.assert_parity(model, (x,), registry=registry, tier="python", rtol=0, atol=0)
    bridge.assert_parity(Held(3), (torch.randn(1, 3, 2, 2),), registry=registry, tier="python", rtol=0, atol=0)


def test_method_of_a_class_without_obj_flatten_is_a_clear_error(registry, monkeypatch):
    Held(2)
    schemas = bridge.core.proxy.class_schemas
    monkeypatch.setattr(bridge.core.proxy, "class_schemas",
                        lambda name: {k: v for k, v in schemas(name).items() if k != "__obj_flatten__"})
    with pytest.raises(bridge.OpBridgeError, match=r"IdentityConvClass has no __obj_flatten__ method.*Define "
                                                   r"__obj_flatten__"):
        bridge.register("opbridge::IdentityConvClass.forward", registry=registry)
    monkeypatch.undo()
    bridge.register("opbridge::IdentityConvClass.forward", registry=registry)
    with pytest.raises(bridge.OpBridgeError, match=r"the object has no __obj_flatten__, which names its state.*"
                                                   r"pass attributes="):
        bridge.core.opdef.described_method("opbridge::IdentityConvClass.forward", object(), registry)
