"""An op's names across tiers come from its full ONNX name (bridge.core.basics.opnames): a user op named like a
seed op never gets the seed's kernel, and two ops that differ only by domain each run their own kernel
in one library."""

import numpy as np
import pytest
import torch

import bridge
from bridge.core.basics.opnames import op_names
from ort_kernels import build
from ort_kernels.native import NativeTier

_SCALE_KERNEL = """#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Scale {
  static Status Read(const Attributes&, Scale*) { return Status::OK(); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32, got ", dtype_name(x.dtype));
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    Span<const float> in = x.span<float>();
    for (int64_t i = 0; i < in.size; ++i) out[i] = in[i] * FACTOR;
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef SYMBOL = make_kernel<Scale>();
}  // namespace opbridge
"""


def _samples(dtype):
    return [bridge.SampleInput((torch.randn(2, 3, 4).to(dtype),))]


def _numpy_scale(factor):
    # NOTE: a NumPy implementation: no body can be derived, so only the C++ kernel can run the node
    def scale(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() * np.float32(factor))
    return scale


def test_names_are_one_to_one_and_keep_domains_apart():
    names = [op_names(q) for q in ("a::scale", "b::scale", "a.b::scale", "a_b::scale", "a-b::scale", "a::b_scale",
                                   "a_b::scale_x", "a::b_scale_x", "com.example::scale", "x\u00e9::scale")]
    assert len({n.symbol for n in names}) == len({n.source_file for n in names}) == len(names)
    assert all(n.symbol.isidentifier() and "__" not in n.symbol and n.symbol.isascii() for n in names)
    with pytest.raises(bridge.OpBridgeError, match="domain::op_type"):
        op_names("identity_conv")  # a short name alone names no kernel


def test_a_user_op_named_like_a_seed_op_does_not_get_the_seeds_kernel(registry, fresh_name, tmp_path):
    name = fresh_name("identity_conv")  # a seed op's short name in the user's own domain

    @bridge.op(name, fake=lambda x, channels: torch.empty_like(x), registry=registry, sample_inputs=
               lambda dtype: [bridge.SampleInput((torch.randn(2, 3, 4).to(dtype), 3))])
    def identity_conv(x: torch.Tensor, channels: int) -> torch.Tensor:
        return x * 3  # not what the seed's kernel computes (a copy)

    spec = registry.get(name)
    assert build.native_source(spec) is None
    assert "no C++ kernel" in NativeTier().why_not(spec)
    assert build.served_ops(registry) == {}

    class M(torch.nn.Module):
        def forward(self, x):
            return identity_conv(x, 3)

    x = torch.randn(2, 3, 4)
    path = tmp_path / "m.onnx"
    bridge.export(M(), (x,), path, registry=registry)
    sess = bridge.session(path, tier="native", registry=registry)  # its function body runs, not C++
    (out,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(out, (x * 3).numpy(), rtol=1e-6)


def test_a_registry_never_gets_another_registrys_served_ops(fresh_name, tmp_path, monkeypatch):
    # a registry made where a dead one lived has its id(); every id() is one here, so a cache keyed
    # by id() and generation would hand the second registry the first one's ops
    monkeypatch.setattr(build, "id", lambda _: 1, raising=False)
    registries = [bridge.Registry(), bridge.Registry()]
    for registry, factor in zip(registries, (2.0, 5.0)):
        name = fresh_name(f"scale{int(factor)}")
        source = tmp_path / f"scale_{int(factor)}.cc"
        source.write_text(_SCALE_KERNEL.replace("FACTOR", f"{factor}f").replace("SYMBOL", op_names(name).symbol))
        bridge.op(name, fake=lambda x: torch.empty_like(x), native=str(source), registry=registry,
                  sample_inputs=_samples)(_numpy_scale(factor))
    assert registries[0].generation == registries[1].generation
    served = [set(build.served_ops(r)) for r in registries]
    assert served == [{(s.domain, s.name) for s in r} for r in registries] and served[0] != served[1]
    for registry in registries:
        for spec in list(registry):
            registry.remove(spec.qualname)


def test_two_ops_differing_only_by_domain_each_run_their_own_kernel(registry, fresh_name, tmp_path):
    ops = []
    for factor in (2.0, 5.0):
        name = fresh_name("scale")
        source = tmp_path / f"scale_{int(factor)}.cc"
        source.write_text(_SCALE_KERNEL.replace("FACTOR", f"{factor}f").replace("SYMBOL", op_names(name).symbol))

        ops.append(bridge.op(name, fake=lambda x: torch.empty_like(x), native=str(source), registry=registry,
                             sample_inputs=_samples)(_numpy_scale(factor)))
    assert len({registry.get(o.qualname).name for o in ops}) == 1  # the same op type, two domains
    assert len(build.served_ops(registry)) == 2

    class M(torch.nn.Module):
        def forward(self, x):
            return ops[0](x), ops[1](x)

    x = torch.randn(2, 3, 4)
    path = tmp_path / "m.onnx"
    bridge.export(M(), (x,), path, registry=registry)
    sess = bridge.session(path, tier="native", registry=registry)
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    for out, want in zip(got, M()(x), strict=True):
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-6)
    assert not np.allclose(got[0], got[1])
