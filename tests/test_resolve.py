"""The body resolver on onnx-ir (exporters/resolve.py, issue #32): a model whose custom nodes all have
their bodies is neither converted nor touched, and a model needing written, built and derived bodies
gets, node by node, the body each producer makes from protos (grouped by bytes, overloads named by them)."""

import hashlib
import re

import numpy as np
import onnx
import onnxruntime as ort
import onnxscript
import pytest
import torch
from onnxscript import opset20 as op

import bridge
from bridge.core.basics.graphs import custom_nodes, model_value_types
from bridge.core.spec import BodyBuilder, Written, node_attributes
from exporters import resolve
from exporters.bodies.opsets import convert_function, onnx_opset, portable_constants
from exporters.derive.derivation import derive
from exporters.derive.sites import site_of
from exporters.kinds import body_kind, guarded_copy


class _Calls(torch.nn.Module):
    def __init__(self, double, shift, scale):
        super().__init__()
        self.double, self.shift, self.scale = double, shift, scale

    def forward(self, x):
        y = self.double(x)
        y = self.shift(y, 3, True) + self.shift(x, 3, True) + self.shift(y, -1, False)
        return self.scale(y, 2.0) + self.scale(x, -0.5)


@pytest.fixture
def three_kinds(registry, fresh_name):
    """A model (bare: no bodies) calling a written body (double), a built one (shift, at two sets of
    attribute values, one of them twice) and a derived one (scale, no body given, two sites)."""
    double_name, shift_name, scale_name = fresh_name("double"), fresh_name("shift"), fresh_name("scale")

    @onnxscript.script(onnxscript.values.Opset(double_name.split("::")[0], 1), default_opset=op)
    def double(x):
        return op.Add(x, x)

    @bridge.op(double_name, fake=lambda x: torch.empty_like(x), function=double, registry=registry)
    def double_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    ns = shift_name.split("::")[0]

    @torch.library.custom_op(shift_name, mutates_args=())
    def shift(x: torch.Tensor, k: int, twice: bool) -> torch.Tensor:
        return x + (2 * k if twice else k)

    shift.register_fake(lambda x, k, twice: torch.empty_like(x))

    def shift_body(k, twice):
        step = onnx.helper.make_tensor("step", onnx.TensorProto.FLOAT, [], [2 * k if twice else k])

        @onnxscript.script(onnxscript.values.Opset(ns, 1), default_opset=op)
        def shift(x):
            return op.Add(x, op.CastLike(op.Constant(value=step), x))
        return shift

    bridge.register(shift_name, function=shift_body, registry=registry)

    @bridge.op(scale_name, fake=lambda x, k: torch.empty_like(x), registry=registry)
    def scale(x: torch.Tensor, k: float) -> torch.Tensor:
        return x * k + 1

    model, x = _Calls(double_op, shift, scale), torch.randn(1, 3, 4, 4)
    return registry, model, x, bridge.export(model, (x,), functions=False, registry=registry)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def test_a_complete_model_is_neither_converted_nor_touched(three_kinds, monkeypatch):
    registry, model, x, _ = three_kinds
    full = bridge.export(model, (x,), registry=registry)
    before = full.SerializeToString()

    def refuse(proto):
        raise AssertionError("a complete model was converted to onnx-ir")

    monkeypatch.setattr(resolve.ir.serde, "deserialize_model", refuse)
    assert resolve.attach_functions(full, registry) == []
    assert full.SerializeToString() == before
    session = bridge.session(full, registry=registry)  # NOTE: the function tier resolves too
    assert session.run(None, {full.graph.input[0].name: x.numpy()})[0].shape == (1, 3, 4, 4)


def _expected_bodies(bare: onnx.ModelProto, registry) -> dict[str, tuple[str, onnx.FunctionProto]]:
    """Per custom node (by name): (kind, body) as the producers make it, protos only, at the model's opset."""
    opset, types = onnx_opset(bare), model_value_types(onnx.shape_inference.infer_shapes(bare))
    expected = {}
    for node in custom_nodes(bare):
        spec = registry.find(node.domain, node.op_type)
        if isinstance(spec.function, Written):
            expected[node.name] = ("written", body_kind(spec).at(opset))
            continue
        if isinstance(spec.function, BodyBuilder):
            kind, raw = "built", body_kind(spec).built(node_attributes(spec, node))
        else:
            kind, raw = "derived", derive(spec, site_of(spec, node, types), opset, registry).proto
        body = portable_constants(convert_function(guarded_copy(raw, spec), opset))
        body.doc_string = resolve.body_doc(node, body)  # NOTE: the attribute values it was made for
        expected[node.name] = (kind, body)
    return expected


def _text(function: onnx.FunctionProto) -> str:
    copy = onnx.FunctionProto()
    copy.CopyFrom(function)
    copy.ClearField("overload")
    return onnx.printer.to_text(copy)


def test_written_built_and_derived_bodies_are_the_protobuf_producers_bodies(three_kinds):
    registry, model, x, bare = three_kinds
    expected = _expected_bodies(bare, registry)
    attached = _copy(bare)
    ops = resolve.attach_functions(attached, registry)
    assert sorted(ops) == sorted({f"{n.domain}::{n.op_type}" for n in custom_nodes(bare)})
    functions = {(f.domain, f.name, f.overload): f for f in attached.functions}
    kinds = {}
    for node in custom_nodes(attached):
        kind, body = expected[node.name]
        kinds.setdefault((node.domain, node.op_type), {})[body.SerializeToString()] = kind
        function = functions[(node.domain, node.op_type, node.overload)]
        assert _text(function) == _text(body)
    # NOTE: one function per distinct body of an op: the plain name when it has one, else overloads
    # named by kind and the body's bytes
    for (domain, name), bodies in kinds.items():
        overloads = sorted(f.overload for f in attached.functions if (f.domain, f.name) == (domain, name))
        want = [""] if len(bodies) == 1 else sorted(
            f"{kind}_{hashlib.sha1(data).hexdigest()[:10]}" for data, kind in bodies.items())
        assert overloads == want
    assert {len(b) for b in kinds.values()} == {1, 2}  # NOTE: the model has one body and several per op
    assert {n.overload for n in custom_nodes(attached)} > {""}
    onnx.checker.check_model(attached, full_check=True)
    got = ort.InferenceSession(attached.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {attached.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_the_ir_entry_gives_an_onnx_ir_model_its_bodies(three_kinds):
    registry, _, _, bare = three_kinds
    through_proto = _copy(bare)
    resolve.attach_functions(through_proto, registry)
    model = resolve.ir.serde.deserialize_model(bare)
    assert sorted(resolve.attach_functions_ir(model, registry)) == sorted(resolve.attach_functions(_copy(bare),
                                                                                                   registry))
    assert list(model.functions) == [(f.domain, f.name, f.overload) for f in through_proto.functions]
    assert [(n.op_type, n.overload) for n in model.graph] == [(n.op_type, n.overload)
                                                              for n in through_proto.graph.node]


# NOTE: what each op computes, written here by hand from its definition in three_kinds (not from any
# producer of bodies): the expectation of each attached body, node by node
BY_HAND = {"double": lambda x, a: x * 2, "shift": lambda x, a: x + (2 * a["k"] if a["twice"] else a["k"]),
           "scale": lambda x, a: x * a["k"] + 1}
# the bodies each op gets, by hand: double one written body, shift one built body per set of attribute
# values (2), scale one derived body per site (2: its k differs)
OVERLOADS = {"double": (1, ""), "shift": (2, "built"), "scale": (2, "derived")}


def test_each_attached_body_computes_its_node_as_written_by_hand(three_kinds):
    """Expectations independent of the resolver: each node's attached body, run alone in onnxruntime on
    the node's attribute values, computes what the op's definition says; overloads as counted by hand."""
    registry, _, _, bare = three_kinds
    attached = _copy(bare)
    resolve.attach_functions(attached, registry)
    nodes = list(custom_nodes(attached))
    assert sorted(n.op_type for n in nodes) == ["double", "scale", "scale", "shift", "shift", "shift"]
    for short, (count, kind) in OVERLOADS.items():
        overloads = sorted({f.overload for f in attached.functions if f.name == short})
        assert len(overloads) == count, (short, overloads)
        assert all(re.fullmatch(rf"{kind}_[0-9a-f]{{10}}", o) for o in overloads) if kind else overloads == [""]
    value = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        alone = onnx.helper.make_node(node.op_type, ["x"], ["y"], domain=node.domain, overload=node.overload,
                                      **attrs)
        info = lambda n: onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 3, 4, 4])  # noqa: E731
        graph = onnx.helper.make_graph([alone], "one", [info("x")], [info("y")])
        model = onnx.helper.make_model(graph, opset_imports=list(attached.opset_import),
                                       functions=list(attached.functions), ir_version=attached.ir_version)
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": value})[0]
        np.testing.assert_allclose(got, BY_HAND[node.op_type](value, attrs), rtol=1e-6,
                                   atol=1e-6, err_msg=f"{node.op_type} {attrs}")


def _slimmed(three_kinds):
    """three_kinds' full file through onnxslim: node overloads dropped, one body kept per op."""
    import onnxslim

    registry, model, x, _ = three_kinds
    slim = onnxslim.slim(bridge.export(model, (x,), registry=registry))
    assert not any(n.overload for n in slim.graph.node)
    assert len({(f.domain, f.name) for f in slim.functions}) == len(slim.functions)  # NOTE: one body per op
    return slim


def test_bodies_say_the_attribute_values_they_were_made_for(three_kinds):
    registry, model, x, _ = three_kinds
    full = bridge.export(model, (x,), registry=registry)
    functions = {(f.domain, f.name, f.overload): f for f in full.functions}
    for node in custom_nodes(full):
        spec = registry.find(node.domain, node.op_type)
        made_for = resolve.body_for(functions[(node.domain, node.op_type, node.overload)].doc_string)
        function = functions[(node.domain, node.op_type, node.overload)]
        assert made_for == (None if isinstance(spec.function, Written) else resolve.attributes_key(node, function.attribute))


@pytest.mark.parametrize("tier", ["function", "native", "python"])
def test_a_file_whose_bodies_a_tool_merged_runs_each_nodes_own_body(three_kinds, tier):
    """onnxslim keeps one body per op: plain onnxruntime then runs one node's body for another's
    attribute values; every tier rebuilds each node's own from the registry and gives eager's values."""
    registry, model, x, _ = three_kinds
    slim, feed = _slimmed(three_kinds), {"x": x.numpy()}
    expected = model(x).detach().numpy()
    plain = ort.InferenceSession(slim.SerializeToString(), providers=["CPUExecutionProvider"])
    assert not np.allclose(plain.run(None, feed)[0], expected)  # NOTE: the tool's damage, as measured
    got = bridge.session(slim, registry=registry, tier=tier).run(None, feed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_attach_repairs_a_merged_file_without_replace(three_kinds):
    registry, model, x, _ = three_kinds
    slim = _slimmed(three_kinds)
    ops = resolve.attach_functions(slim, registry)  # NOTE: what `opbridge attach` calls (no --replace)
    assert ops and resolve.attach_functions(slim, registry) == []
    onnx.checker.check_model(slim, full_check=True)
    plain = ort.InferenceSession(slim.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(plain.run(None, {"x": x.numpy()})[0], model(x).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_a_merged_body_of_an_op_the_registry_lacks_is_refused(three_kinds):
    slim = _slimmed(three_kinds)
    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: node .* calls a function body made for other "
                                                   r"attribute values .*Got attributes k=.*Import the module"):
        bridge.session(slim, registry=bridge.Registry())


def test_inlining_a_merged_file_inlines_each_nodes_own_body(three_kinds):
    from exporters.inline import inline_functions

    registry, model, x, _ = three_kinds
    flat = inline_functions(_slimmed(three_kinds), registry)
    plain = ort.InferenceSession(flat.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(plain.run(None, {"x": x.numpy()})[0], model(x).detach().numpy(), rtol=1e-6, atol=1e-6)


class _Pool(torch.autograd.Function):
    """A Function as mmcv writes them (a string attribute picks the kernel): torch.onnx translates the
    average pool of its forward and not the max pool (aten.adaptive_max_pool2d has no translation)."""

    @staticmethod
    def symbolic(g, x, rois, output_size, mode):
        return g.op("mmcv::Pool6", x, rois, h_i=output_size[0], w_i=output_size[1], mode_s=mode)

    @staticmethod
    def forward(ctx, x, rois, output_size, mode="avg"):
        pool = torch.nn.functional.adaptive_max_pool2d if mode == "max" else torch.nn.functional.adaptive_avg_pool2d
        return pool(x, output_size)


class _TwoModes(torch.nn.Module):
    def forward(self, x, rois):
        return _Pool.apply(x, rois, (3, 3), "avg") + _Pool.apply(x, rois, (3, 3), "max")


def test_a_node_whose_body_fails_does_not_call_another_nodes_body(registry):
    # NOTE: before, the "max" node kept the plain function name the "avg" node's body took, and export
    # stopped with "calls a function body made for other attribute values" (a tool's merge, it said)
    bridge.register(_Pool, fake=lambda x, rois, output_size, mode: x.new_empty(*x.shape[:2], *output_size),
                    registry=registry)
    args = (torch.randn(2, 4, 8, 8), torch.rand(2, 5))
    proto = bridge.export(_TwoModes(), args, registry=registry)
    local = {f.overload for f in proto.functions if f.name == "Pool6"}
    calls = {onnx.helper.get_attribute_value(a).decode(): n.overload
             for n in custom_nodes(proto) for a in n.attribute if a.name == "mode"}
    assert calls["avg"] in local and calls["max"] not in local, (calls, local)
    with pytest.raises(bridge.UnsupportedInTier, match=r"mmcv::Pool6: torch.onnx could not translate its trace.*"
                                                       r"adaptive_max_pool2d.*use tier='native' or 'python'"):
        bridge.session(proto, tier="function", registry=registry)
    bridge.assert_parity(_TwoModes(), args, tier="python", registry=registry)
