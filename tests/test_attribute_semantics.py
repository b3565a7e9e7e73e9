"""Attributes keep their meaning through export, every tier and inlined files (issues #32, #34): an
optional attribute's None is not its default, an attribute a node omits takes the op's default (not
the ONNX op's its body calls), keyword-only attributes export, an empty int[] attribute works, and calls
whose float attributes differ only in the sign of a zero keep their own nodes; the function tier checks each
node against its own body overload.
Each is checked in the function, native and python tiers and in the inlined file, against eager torch."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper

import bridge
from bridge.core.basics import torch_compat
from bridge.core.spec import OpSpec, explicit_attributes, parse_params
from exporters.inline import inline_functions
from ort_kernels import build

_PATH = Path(__file__).resolve().parent / "user_ops" / "attribute_ops.py"
_module = importlib.util.spec_from_file_location("attribute_ops", _PATH)
ops = sys.modules["attribute_ops"] = importlib.util.module_from_spec(_module)  # NOTE: onnxscript reads it
_module.loader.exec_module(ops)
REG = ops.REGISTRY
WAYS = [*bridge.TIERS, "inlined"]


@pytest.fixture(scope="module")
def library():
    return str(build.library_path(REG))


class Calls(torch.nn.Module):
    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, x):
        return self.call(x)


def _run_all(proto: onnx.ModelProto, way: str, x: np.ndarray, library: str) -> list[np.ndarray]:
    if way == "inlined":
        flat = inline_functions(proto, REG)
        assert not flat.functions and {n.domain for n in flat.graph.node} == {""}
        sess = ort.InferenceSession(flat.SerializeToString(), providers=["CPUExecutionProvider"])
    else:
        sess = bridge.session(proto, tier=way, registry=REG, native_library=library if way == "native" else None)
    return sess.run(None, {proto.graph.input[0].name: x})


def _run(proto: onnx.ModelProto, way: str, x: np.ndarray, library: str) -> np.ndarray:
    return _run_all(proto, way, x, library)[0]


def _check(call, way: str, library: str) -> onnx.ModelProto:
    x = torch.randn(3, 5)
    proto = bridge.export(Calls(call), (x,), registry=REG)
    np.testing.assert_allclose(_run(proto, way, x.numpy(), library), call(x).numpy(), rtol=1e-6, atol=1e-6)
    return proto


def _custom_node(proto: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in proto.graph.node if n.domain == "attrdemo")


# -- 1. an optional attribute's None is not its default ----------------------------------------------------
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("k", [None, 3, 7])
def test_optional_attribute_none_is_not_its_default(way, k, library):
    assert ops.shift_op(torch.zeros(1), None).item() == 100 and ops.shift_op(torch.zeros(1)).item() == 3
    _check(lambda x: torch.ops.attrdemo.shift(x, k), way, library)


def test_optional_attribute_schema_states_none_as_absent():
    schema = REG.get("attrdemo::shift").onnx_schema
    k = schema.attributes["k"]
    assert not k.required and not k.default_value.name  # NOTE: an ONNX default would stand for None too
    assert "None" in k.description and "3" in k.description


def test_the_default_of_an_optional_attribute_is_written_explicitly(library):
    proto = _check(lambda x: torch.ops.attrdemo.shift(x), "function", library)
    assert helper.get_attribute_value(_custom_node(proto).attribute[0]) == 3


# -- 2. an attribute a node omits takes the op's default ----------------------------------------------------
def _hand_built(op_type: str, **attributes) -> onnx.ModelProto:
    """A file as another tool may write it: the custom node without its defaulted attributes."""
    node = helper.make_node(op_type, ["x"], ["y"], domain="attrdemo", **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("attrdemo", 1)],
                             ir_version=10)


@pytest.mark.parametrize("way", WAYS)
def test_an_omitted_attribute_takes_the_op_default(way, library):
    x = torch.randn(3, 5)
    expected = ops.leaky_op(x).numpy()  # slope 0.1, not LeakyRelu's 0.01
    np.testing.assert_allclose(_run(_hand_built("leaky"), way, x.numpy(), library), expected, rtol=1e-6)


@pytest.mark.parametrize("way", WAYS)
def test_a_defaulted_attribute_exports_and_runs(way, library):
    proto = _check(lambda x: torch.ops.attrdemo.leaky(x), way, library)
    assert helper.get_attribute_value(_custom_node(proto).attribute[0]) == pytest.approx(0.1)


def test_an_omitted_optional_attribute_stays_none_in_a_hand_built_file(library):
    x = torch.randn(3, 5)
    for way in WAYS:
        np.testing.assert_allclose(_run(_hand_built("shift"), way, x.numpy(), library), (x + 100).numpy())


def test_the_written_body_binds_the_op_default():
    proto = bridge.export(Calls(lambda x: torch.ops.attrdemo.leaky(x, 0.2)), (torch.randn(3, 5),), registry=REG)
    body = next(f for f in proto.functions if f.name == "leaky")
    defaults = {a.name: helper.get_attribute_value(a) for a in body.attribute_proto}
    assert defaults == {"slope": pytest.approx(0.1)} and "slope" not in body.attribute


# -- 3. keyword-only attributes ----------------------------------------------------------------------------
@pytest.mark.parametrize("way", WAYS)
def test_a_keyword_only_attribute_exports_and_runs(way, library):
    proto = _check(lambda x: torch.ops.attrdemo.scale(x, k=3), way, library)
    assert helper.get_attribute_value(_custom_node(proto).attribute[0]) == 3


@pytest.mark.parametrize("way", [w for w in WAYS if w != "native"])
def test_keyword_only_attributes_of_a_derived_body(way, library):
    proto = _check(lambda x: torch.ops.attrdemo.scale_add(x, k=4), way, library)
    assert {a.name: helper.get_attribute_value(a) for a in _custom_node(proto).attribute} == {"k": 4, "b": 0.5}


# -- 4. an empty list attribute ----------------------------------------------------------------------------
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("steps", [[], [2, 5]])
def test_a_list_attribute_may_be_empty(way, steps, library):
    proto = _check(lambda x: torch.ops.attrdemo.offsets(x, steps), way, library)
    attr = _custom_node(proto).attribute[0]
    assert attr.type == onnx.AttributeProto.INTS and list(attr.ints) == steps


@pytest.mark.parametrize("way", WAYS)
def test_an_empty_float_list_is_a_floats_attribute(way, library):
    # NOTE: an empty list has no element type: before, the node got INTS (onnx-ir's guess, logged), which the
    # native kernel reading FLOATS and the schema do not take
    proto = _check(lambda x: torch.ops.attrdemo.divide_all(x, []), way, library)
    attr = _custom_node(proto).attribute[0]
    assert attr.type == onnx.AttributeProto.FLOATS and list(attr.floats) == []


def test_an_empty_list_default_is_a_typed_onnx_default():
    params, _ = parse_params("d::f", torch_compat.parse_schema("d::f(Tensor x, int[] steps=[], float[] w=[]) -> Tensor"))
    steps, w = (p.onnx_default for p in params[1:])
    assert (steps.type, list(steps.ints)) == (onnx.AttributeProto.INTS, [])
    assert (w.type, list(w.floats)) == (onnx.AttributeProto.FLOATS, [])
    node = helper.make_node("f", ["x"], ["y"], domain="d")
    assert explicit_attributes(OpSpec("d::f", None, params, 1, "d"), node)
    assert [(a.name, a.type) for a in node.attribute] == [("steps", onnx.AttributeProto.INTS),
                                                          ("w", onnx.AttributeProto.FLOATS)]


# -- 5. calls that differ only in the sign of a zero keep their own nodes ---------------------------------
_SIGNED_ZEROS = {
    "float": lambda x: (torch.ops.attrdemo.divide(x, 0.0), torch.ops.attrdemo.divide(x, -0.0)),
    "float[]": lambda x: (torch.ops.attrdemo.divide_all(x, [2.0, 0.0]), torch.ops.attrdemo.divide_all(x, [2.0, -0.0])),
}


def _attribute_signs(proto: onnx.ModelProto) -> list[list[float]]:
    """Each custom node's float values as copysign(1, v): tells -0.0 from 0.0."""
    values = [np.atleast_1d(helper.get_attribute_value(n.attribute[0])) for n in proto.graph.node
              if n.domain == "attrdemo"]
    return sorted(np.copysign(1.0, v).tolist() for v in values)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("kind", list(_SIGNED_ZEROS))
def test_calls_that_differ_in_a_zero_sign_keep_their_nodes(way, kind, library):
    call = _SIGNED_ZEROS[kind]
    x = torch.randn(3, 5)
    proto = bridge.export(Calls(call), (x,), registry=REG)
    assert _attribute_signs(proto) == ([[-1.0], [1.0]] if kind == "float" else [[1.0, -1.0], [1.0, 1.0]])
    got = _run_all(proto, way, x.numpy(), library)
    for g, e in zip(got, call(x), strict=True):
        assert np.isinf(e.numpy()).all()
        np.testing.assert_array_equal(g, e.numpy())  # NOTE: +inf and -inf, where a merged node gives one sign


def test_identical_calls_share_one_node(library):
    call = lambda x: (torch.ops.attrdemo.divide(x, -0.0), torch.ops.attrdemo.divide(x, -0.0))  # noqa: E731
    x = torch.randn(3, 5)
    proto = bridge.export(Calls(call), (x,), registry=REG)
    assert _attribute_signs(proto) == [[-1.0]]  # NOTE: torch.onnx's optimizer still merges equal calls
    for g, e in zip(_run_all(proto, "function", x.numpy(), library), call(x), strict=True):
        np.testing.assert_array_equal(g, e.numpy())



# -- 6. the function tier checks each node against its own body (overloads) --------------------------------
class TwoScaledBiases(torch.nn.Module):
    def __init__(self, second_has_bias: bool):
        super().__init__()
        self.second_has_bias = second_has_bias

    def forward(self, x, bias):
        return (torch.ops.attrdemo.scaled_bias(x, bias, 2),
                torch.ops.attrdemo.scaled_bias(x, bias if self.second_has_bias else None, 0))


def test_each_node_is_checked_against_its_own_overload():
    x, bias = torch.randn(3, 5), torch.randn(3, 5)
    valid = bridge.export(TwoScaledBiases(False), (x, bias), registry=REG)
    assert len({f.overload for f in valid.functions if f.name == "scaled_bias"}) == 2
    sess = bridge.session(valid, tier="function", registry=REG)
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(valid.graph.input, (x, bias))})
    for g, e in zip(got, TwoScaledBiases(False)(x, bias), strict=True):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-6, atol=1e-6)
    # NOTE: k=0's body never reads bias: a node giving it would silently drop it
    ignored = bridge.export(TwoScaledBiases(True), (x, bias), registry=REG)
    with pytest.raises(bridge.UnsupportedInTier, match=r"attrdemo::scaled_bias ignores its input 'bias'.*Got node "
                                                       r"'node_scaled_bias_1'"):
        bridge.session(ignored, tier="function", registry=REG)


@torch.library.custom_op("attrsem::addk", mutates_args=())
def _addk(x: torch.Tensor, k: int | None = None, s: float | None = None, nm: str | None = None) -> torch.Tensor:
    y = (x + (k if k is not None else 0)) * (s if s is not None else 1.0)
    return y.clone() if nm != "neg" else -y


_addk.register_fake(lambda x, k=None, s=None, nm=None: torch.empty_like(x))


@pytest.mark.parametrize("given", [{}, {"k": 3}, {"s": 2.0}, {"nm": "neg"}, {"k": -1, "s": 0.5, "nm": "neg"}],
                         ids=["none", "int", "float", "str", "all"])
def test_optional_attributes_given_to_an_op_without_onnx_code(given, registry):
    # NOTE: the derived body holds each given value (baked in per node); before, the function tier took a
    # body without attribute 's' for one that handles only 's' omitted, and refused the node
    bridge.register("attrsem::addk", registry=registry)
    model = Calls(lambda x: torch.ops.attrsem.addk(x, **given))
    x = torch.randn(3, 4)
    proto = bridge.export(model, (x,), registry=registry)
    expected = model(x).numpy()
    for tier in ("function", "python"):
        got = bridge.session(proto, tier=tier, registry=registry).run(None, {proto.graph.input[0].name: x.numpy()})
        np.testing.assert_array_equal(got[0], expected, err_msg=tier)
    flat = inline_functions(proto, registry)
    got = ort.InferenceSession(flat.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {
        flat.graph.input[0].name: x.numpy()})
    np.testing.assert_array_equal(got[0], expected, err_msg="inlined")
