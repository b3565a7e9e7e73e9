"""Registration: derived schema, validation errors, check_complete."""

from pathlib import Path

import pytest
import torch
from onnx import defs
from onnxscript import opset20 as op
from onnxscript import script, values

import bridge


def _fake(x, *args, **kwargs):
    return torch.empty_like(x)


def test_schema_is_derived_from_the_torch_signature(registry, fresh_name):
    name = fresh_name("full")

    @bridge.op(name, fake=_fake, registry=registry, version=3)
    def full(x: torch.Tensor, y: torch.Tensor | None, k: int, s: list[int], fs: list[float], a: float = 0.5,
             flag: bool = True, mode: str = "x") -> torch.Tensor:
        return x.clone()

    spec = registry.get(name)
    ns, short = name.split("::")
    assert (spec.domain, spec.name, spec.version) == (ns, short, 3)
    schema = defs.get_schema(short, 3, ns)
    assert [(i.name, i.option) for i in schema.inputs] == [
        ("x", defs.OpSchema.FormalParameterOption.Single), ("y", defs.OpSchema.FormalParameterOption.Optional)]
    attrs = {k: (v.type, v.required) for k, v in schema.attributes.items()}
    A = defs.OpSchema.AttrType
    assert attrs == {"k": (A.INT, True), "s": (A.INTS, True), "a": (A.FLOAT, False),
                     "flag": (A.INT, False), "mode": (A.STRING, False), "fs": (A.FLOATS, True)}
    assert schema.attributes["a"].default_value.f == 0.5
    assert schema.has_type_and_shape_inference_function


def test_duplicate_name_is_an_error(registry, fresh_name):
    name = fresh_name("dup")

    @bridge.op(name, fake=_fake, registry=registry)
    def first(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(bridge.OpBridgeError, match="already registered"):
        @bridge.op(name, fake=_fake, registry=registry)
        def second(x: torch.Tensor) -> torch.Tensor:
            return x.clone()


@pytest.mark.parametrize("bad", ["noscope", "a::b::c", "1ns::op", "ns::has-dash", ""])
def test_bad_names_are_errors(registry, bad):
    with pytest.raises(bridge.OpBridgeError, match="namespace::name"):
        bridge.op(bad, registry=registry)


def test_unsupported_argument_type_is_an_error_and_leaves_no_torch_op(registry, fresh_name):
    name = fresh_name("tensors")
    with pytest.raises(bridge.OpBridgeError, match=r"argument 'xs' has type List\[Tensor\]"):
        @bridge.op(name, registry=registry)
        def takes_list(xs: list[torch.Tensor]) -> torch.Tensor:
            return xs[0]
    ns, short = name.split("::")
    assert not hasattr(getattr(torch.ops, ns), short)


def test_translation_arity_must_match_schema(registry, fresh_name):
    name = fresh_name("arity")

    def translation(x):  # the op also has `k`
        return x

    with pytest.raises(bridge.OpBridgeError, match=r"translation parameters must mirror.*\['x', 'k'\]"):
        @bridge.op(name, fake=_fake, registry=registry, translation=translation)
        def arity(x: torch.Tensor, k: int) -> torch.Tensor:
            return x.clone()


def test_function_body_must_mirror_the_op(registry, fresh_name):
    name = fresh_name("body")
    ns, short = name.split("::")

    @script(values.Opset(ns, 1), default_opset=op)
    def wrong(x, y, k: int):
        return op.Add(x, y)

    with pytest.raises(bridge.OpBridgeError, match="function body does not match") as err:
        @bridge.op(name, fake=_fake, registry=registry, function=wrong)
        def body(x: torch.Tensor, k: int) -> torch.Tensor:
            return x.clone()
    assert "name it " + short in str(err.value) and "inputs ['x', 'y']" in str(err.value)


def test_same_onnx_name_twice_is_an_error(registry, fresh_name):
    a, b = fresh_name("same"), fresh_name("same")

    @bridge.op(a, fake=_fake, registry=registry, domain="shared")
    def one(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(bridge.OpBridgeError, match="ONNX name shared::same is already used"):
        @bridge.op(b, fake=_fake, registry=registry, domain="shared")
        def two(x: torch.Tensor) -> torch.Tensor:
            return x.clone()


def test_check_complete_lists_missing_pieces(registry, fresh_name):
    name = fresh_name("bare")

    @bridge.op(name, registry=registry)
    def bare(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    gaps = registry.check_complete()[name]
    assert [g.split(" (")[0] for g in gaps] == ["fake kernel", "reference implementation", "sample inputs"]
    bare.register_fake(_fake)  # pieces are read live from torch
    assert not any(g.startswith("fake kernel") for g in registry.check_complete(name)[name])


def test_seed_ops_are_complete():
    done = bridge.REGISTRY.check_complete()
    for name in ("bev::bev_pool_v2", "opbridge::identity_conv", "opbridge::crop", "opbridge::paste",
                 "opbridge::numpy_sin"):
        assert done[name] == [], (name, done[name])


def test_unknown_op_suggests_close_names():
    with pytest.raises(bridge.OpBridgeError, match="Did you mean bev::bev_pool_v2"):
        bridge.REGISTRY.get("bev::bev_pool_v3")


def test_translation_passes_attributes_by_name():
    # ONNX orders attributes by name; the translation must not pair them positionally
    spec = bridge.REGISTRY.get("opbridge::paste")
    assert [p.name for p in spec.attributes] == ["left", "top"]
    proto = bridge.export(_PasteModule(), (torch.zeros(1, 4, 4), torch.ones(1, 1, 1)))
    node = next(n for n in proto.graph.node if n.op_type == "paste")
    assert {a.name: a.i for a in node.attribute} == {"left": 3, "top": 1}


class _PasteModule(torch.nn.Module):
    def forward(self, image, patch):
        return torch.ops.opbridge.paste(image, patch, 3, 1)


def test_bool_and_float_attributes_round_trip(registry, fresh_name):
    name = fresh_name("scale")  # the body below is named `scale` too: the node resolves to it
    ns, _ = name.split("::")

    @script(values.Opset(ns, 1), default_opset=op)
    def scale(x, alpha: float, negate: int):
        y = op.Mul(x, op.CastLike(op.Constant(value_float=alpha), x))
        return op.Where(op.Equal(op.Constant(value_int=negate), op.Constant(value_int=1)), op.Neg(y), y)

    @bridge.op(name, fake=_fake, registry=registry, function=scale)
    def scale_op(x: torch.Tensor, alpha: float, negate: bool) -> torch.Tensor:
        return -x * alpha if negate else x * alpha

    class M(torch.nn.Module):
        def forward(self, x):
            return scale_op(x, 2.5, True)

    report = bridge.check_parity(M(), (torch.randn(3),), registry=registry)
    assert report.passed, report
    assert report.outputs[0].max_abs == 0.0


def test_mutating_op_gets_a_functional_twin_derived_from_its_schema():
    spec = bridge.REGISTRY.get("opbridge::numpy_sin")
    twin = bridge.REGISTRY.functional(spec)
    assert spec.mutated == ("output",) and twin.mutated == ()
    assert str(twin.overload._schema) == "opbridge::numpy_sin_functional(Tensor input, Tensor output) -> Tensor"
    assert (twin.domain, twin.name, twin.num_outputs) == ("opbridge", "numpy_sin", 1)
    x, out = torch.randn(4), torch.zeros(4)
    new = twin.overload(x, out)
    assert torch.equal(out, torch.zeros(4))  # the twin does not mutate
    torch.testing.assert_close(new, torch.sin(x))
    assert "opbridge::numpy_sin_functional" not in {s.qualname for s in bridge.REGISTRY}  # not listed as an op


def test_mutating_op_with_result_twin_returns_result_then_new_values(registry, fresh_name):
    name = fresh_name("acc")

    @bridge.op(name, mutates_args=("total",), fake=lambda x, total: torch.empty_like(x), registry=registry)
    def acc(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        total.add_(x)
        return x * 2

    twin = registry.functional(registry.get(name))
    assert str(twin.overload._schema).endswith("(Tensor x, Tensor total) -> (Tensor, Tensor)")
    doubled, total = twin.overload(torch.ones(2), torch.full((2,), 5.0))
    assert doubled.tolist() == [2.0, 2.0] and total.tolist() == [6.0, 6.0]


def test_pieces_attach_after_declaration_as_new_records(registry, fresh_name):
    name = fresh_name("times")  # the body below is named `times` too
    ns, _ = name.split("::")

    @bridge.op(name, fake=_fake, registry=registry)
    def times_op(x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k

    assert isinstance(times_op, bridge.BridgeOp)
    first = registry.get(name)
    assert [g.split(" ")[0] for g in registry.missing(first)] == ["reference", "sample"]  # a body is derived

    @times_op.register_reference  # decorator form
    def _(x, k):
        return x * float(k)

    @script(values.Opset(ns, 1), default_opset=op)
    def times(x, k: int):
        return op.Mul(x, op.CastLike(op.Constant(value_int=k), x))

    assert times_op.register_function(times) is times  # call form
    times_op.register_samples(lambda dtype: [bridge.SampleInput((torch.ones(2, dtype=dtype), 3))])
    assert first.function is None and first.reference is None  # records are replaced, never mutated
    assert registry.check_complete(name) == {name: []}
    assert times_op.spec.function.source is times and times_op.spec is registry.get(name)

    class M(torch.nn.Module):
        def forward(self, x):
            return times_op(x, 3)

    report = bridge.check_parity(M(), (torch.randn(4),), registry=registry)
    assert report.passed and report.outputs[0].max_abs == 0.0


def test_attached_body_is_validated_and_the_old_record_stays(registry, fresh_name):
    name = fresh_name("strict")

    @bridge.op(name, fake=_fake, registry=registry)
    def strict(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @script(values.Opset("elsewhere", 1), default_opset=op)
    def wrong(x):
        return op.Identity(x)

    with pytest.raises(bridge.OpBridgeError, match="function body does not match the op"):
        strict.register_function(wrong)
    assert registry.get(name).function is None


def test_register_native_resolves_against_the_calling_module(registry, fresh_name, tmp_path, monkeypatch):
    name = fresh_name("nat")

    @bridge.op(name, fake=_fake, registry=registry)
    def nat(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    monkeypatch.chdir(tmp_path)  # the current folder must not matter
    (tmp_path / "kernel.cc").write_text("// not this one\n")
    with pytest.raises(bridge.OpBridgeError, match=r"native kernel source not found.*tried '/.*/tests/kernel.cc'"):
        nat.register_native("kernel.cc")
    kernel = Path(__file__).resolve().parent / "scripts" / "_kernel_for_test.cc"
    kernel.write_text("// placeholder\n")
    try:
        nat.register_native("scripts/_kernel_for_test.cc")
        assert registry.get(name).native_source == str(kernel)
    finally:
        kernel.unlink()


def test_mutating_op_twin_follows_attached_pieces(registry, fresh_name):
    name = fresh_name("absinto")  # the body below is named `absinto` too
    ns, _ = name.split("::")

    @bridge.op(name, mutates_args=("out",), fake=lambda x, out: None, registry=registry)
    def absinto_op(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x.abs())

    twin_before = registry.functional(registry.get(name))

    @script(values.Opset(ns, 1), default_opset=op)
    def absinto(x, out):
        return op.Abs(x)

    absinto_op.register_function(absinto)
    twin = registry.functional(registry.get(name))
    assert twin.function.source is absinto and twin_before.function is None
    assert twin.custom_op is twin_before.custom_op  # the same torch twin op, a new record


def test_tier_table_is_the_one_place_tier_names_live():
    from ort_kernels.tiers import TIERS

    assert bridge.TIERS == tuple(TIERS)
    assert all(t.name == n and t.summary for n, t in TIERS.items())
    with pytest.raises(bridge.OpBridgeError, match="unknown kernel tier. Got 'gpu'"):
        bridge.session(b"", tier="gpu")
    spec = bridge.REGISTRY.get("opbridge::crop")
    assert TIERS["python"].why_not(spec, torch.float16) is None  # float16 crosses as float32, exactly
    assert TIERS["function"].why_not(spec) is None
