"""Each form of op gets its own typed origin (bridge.core.origins), and the export hooks read the form from it:
which torch op's calls export records as the node (proxy_targets), which Function's calls are nodes
(function_routes), the op's description and whether the form defines the gradient itself."""

import pytest
import torch
from torch.onnx import register_custom_op_symbolic

import bridge
import custom_ops  # noqa: F401  (the seed ops: a declared op and an existing C++ op)
from bridge.core import origins
from custom_ops.identity_conv import IdentityConvClass
from exporters.export import function_routes, proxy_targets


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, k: float = 2.0):
        return x * k

    @staticmethod
    def backward(ctx, grad):
        return grad * 2.0, None

    @staticmethod
    def symbolic(g, x, k: float = 2.0):
        return g.op("origins::Scale", x, k_f=k)


def _composite(fresh_name):
    name = fresh_name("twice")
    ns, short = name.split("::")
    lib = torch.library.Library(ns, "DEF")
    lib.define(f"{short}(Tensor x) -> Tensor")
    lib.impl(short, lambda x: x * 2, "CompositeImplicitAutograd")
    return name, lib


def _with_symbolic(fresh_name):
    name = fresh_name("shift")
    ns, short = name.split("::")
    lib = torch.library.Library(ns, "DEF")
    lib.define(f"{short}(Tensor x) -> Tensor")
    lib.impl(short, lambda x: x + 1, "CPU")
    torch.library.register_fake(name, lambda x: torch.empty_like(x), lib=lib)
    register_custom_op_symbolic(name, lambda g, x: g.op("origins::Shift", x), 9)
    return name, lib


def test_a_declared_op_and_an_existing_op_are_recorded_as_themselves():
    crop, conv = bridge.REGISTRY.get("opbridge::crop"), bridge.REGISTRY.get("opbridge::identity_conv")
    assert type(crop.origin) is origins.Declared and type(conv.origin) is origins.Existing
    targets = proxy_targets(bridge.REGISTRY)
    for spec in (crop, conv):
        assert not spec.origin.proxied and spec.origin.function is None
        assert targets[spec.overload][0] is spec.overload
    assert conv.doc == "opbridge::identity_conv (existing op, bridged)"


def test_a_composite_op_is_recorded_through_its_proxy(registry, fresh_name):
    name, _lib = _composite(fresh_name)
    spec = bridge.register(name, fake=lambda x: torch.empty_like(x), registry=registry).spec
    original = getattr(torch.ops, name.split("::")[0]).twice.default
    assert type(spec.origin) is origins.Proxied and spec.origin.proxied and spec.origin.op is original
    assert spec.overload is not original  # NOTE: the proxy op
    targets = proxy_targets(registry)
    assert list(targets) == [original] and targets[original][0] is spec.overload
    assert registry.for_overload(original) is spec and registry.for_overload(spec.overload) is spec


def test_a_torchbind_method_reaches_its_node_through_its_class(registry):
    IdentityConvClass(4)  # NOTE: loads the class's library, as the seed's users do before registering
    spec = bridge.register("opbridge::IdentityConvClass.forward", attributes=["channels"], registry=registry).spec
    assert type(spec.origin) is origins.TorchbindMethod and spec.origin.proxied
    assert spec.origin.target == "opbridge::IdentityConvClass.forward"
    assert proxy_targets(registry) == {} and function_routes(registry) == {}
    assert spec.doc == "opbridge::IdentityConvClass.forward (torchbind method, bridged)"


def test_a_function_is_routed_by_its_class_and_keeps_its_own_backward(registry):
    spec = bridge.register(Scale, registry=registry).spec
    assert type(spec.origin) is origins.FunctionClass and spec.origin.function.cls is Scale
    assert spec.has_autograd is True and registry.for_function(Scale) is spec
    assert proxy_targets(registry) == {} and set(function_routes(registry)) == {Scale}
    assert spec.doc == f"{__name__}.Scale (torch.autograd.Function, bridged)"


def test_an_op_with_a_registered_symbolic_is_bridged_as_a_function(registry, fresh_name):
    name, _lib = _with_symbolic(fresh_name)
    with pytest.warns(UserWarning, match="register_custom_op_symbolic"):
        spec = bridge.register(name, registry=registry).spec
    assert type(spec.origin) is origins.RegisteredSymbolicOp and spec.origin.symbolic.qualname == name
    assert spec.origin.function is not None and set(function_routes(registry)) == {spec.origin.function.cls}
    assert spec.doc.startswith(f"{name} (its symbolic ") and spec.doc.endswith("registered with torch.onnx, bridged)")
