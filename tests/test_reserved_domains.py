"""An op declared or registered in an ONNX or onnxruntime domain is refused at declaration, with the
reason and the fix, and leaves nothing behind (no torch op, no registry record, no ONNX schema)."""

import pytest
import torch
from onnx import defs
from torch._library import simple_registry

import bridge
from bridge.core.basics.domains import ONNX_DOMAINS, RUNTIME_DOMAINS

RESERVED = ["", "ai.onnx", "ai.onnx.ml", "com.microsoft"]


@pytest.mark.parametrize("domain", RESERVED)
def test_declaring_an_op_in_a_reserved_domain_is_refused_and_leaves_nothing(registry, fresh_name, domain):
    name = fresh_name("Relu")
    with pytest.raises(bridge.OpBridgeError) as err:
        @bridge.op(name, fake=lambda x: torch.empty_like(x), domain=domain, registry=registry)
        def relu(x: torch.Tensor) -> torch.Tensor:
            return x * 2
    message = str(err.value)
    assert f"domain {domain!r}" in message and "would run its own op" in message and "domain of your own" in message
    assert not torch._C._jit_get_schemas_for_operator(name)  # the torch op was never defined
    assert name not in {s.qualname for s in registry}
    assert not defs.has("Relu", 1, name.split("::")[0])  # no schema under the op's namespace either


@pytest.mark.parametrize("domain", RESERVED)
def test_registering_an_existing_op_in_a_reserved_domain_is_refused(registry, fresh_name, domain):
    name = fresh_name("Gelu")
    ns, short = name.split("::")
    lib = torch.library.Library(ns, "DEF")
    lib.define(f"{short}(Tensor x) -> Tensor")
    lib.impl(short, lambda x: x * 2, "CPU")
    with pytest.raises(bridge.OpBridgeError, match=f"domain {domain!r} is .* own"):
        bridge.register(name, fake=lambda x: torch.empty_like(x), domain=domain, registry=registry)
    assert name not in {s.qualname for s in registry}
    assert simple_registry.singleton.find(name).fake_impl.kernel is None
    lib._destroy()


def test_every_standard_and_runtime_domain_is_reserved_and_a_dotted_own_domain_is_not(registry, fresh_name):
    for domain in sorted(ONNX_DOMAINS | RUNTIME_DOMAINS):
        with pytest.raises(bridge.OpBridgeError):
            bridge.op(fresh_name("f"), fake=lambda x: torch.empty_like(x), domain=domain, registry=registry)
    @bridge.op(fresh_name("f"), fake=lambda x: torch.empty_like(x), domain="com.example", registry=registry)
    def own(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    assert registry.get(own.qualname).domain == "com.example"
