"""Each body kind (exporters.kinds): decided by body_kind, its key for a node, its status (`opbridge ops`),
its body at an opset (what the resolver puts into a model) and its `--show-body` text."""

import onnx
import onnx_ir as ir
import onnxscript
import pytest
import torch
from onnx import TensorProto, helper
from onnxscript import opset20 as op
from vision_ops import define

import bridge
from bridge.core.basics.errors import OpBridgeError
from exporters import kinds
from exporters.bodies.opsets import onnx_opset

# NOTE: vision_ops as the other tests import it (tests/ on the path): one module, so the ops are defined once
define("torchvision")  # the name and schema torch_lib keys its nms translation by

# kind -> (class, status, which nodes share a body, --show-body's first line without the op's name)
KINDS = {
    "written": (kinds.WrittenBody, ("written", None), "all", ": written body\n"),
    "built": (kinds.BuiltBody, ("written", "built per attribute values (k)"), "equal values",
              ": written body built for float32[2,3], k=2\n"),
    "derived": (kinds.DerivedBody, ("derived", None), "none",
                ": derived from its implementation at float32[2,3], k=2.0 (attributes read from the node: none; "
                "baked in: k=2.0)\n"),
    "translated": (kinds.TranslatedBody, ("translated", "torch.onnx's translation (torchvision_nms, onnxscript "
                                                        "torch_lib), exported at the model's opset per attribute "
                                                        "values"), "none",
                   ": derived from torch.onnx's translation torchvision_nms at float32[5,4], float32[5], "
                   "iou_threshold=0.5 (attributes read from the node: none; baked in: iou_threshold=0.5)\n"),
}
FLOAT = [(torch.float32, (2, 3))]


def _samples(*args):
    return lambda dtype: [bridge.SampleInput(args)]


@pytest.fixture
def ops(registry, fresh_name):
    """One op of each kind in a private registry: name -> spec."""
    written, built, derived = fresh_name("double"), fresh_name("shift"), fresh_name("scale")

    @onnxscript.script(onnxscript.values.Opset(written.split("::")[0], 1), default_opset=op)
    def double(x):
        return op.Add(x, x)

    @bridge.op(written, fake=lambda x: torch.empty_like(x), function=double, registry=registry,
               sample_inputs=_samples(torch.ones(2, 3)))
    def double_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def shift_body(k):
        step = helper.make_tensor("step", TensorProto.FLOAT, [], [k])

        @onnxscript.script(onnxscript.values.Opset(built.split("::")[0], 1), default_opset=op)
        def shift(x):
            return op.Add(x, op.CastLike(op.Constant(value=step), x))
        return shift

    @bridge.op(built, fake=lambda x, k: torch.empty_like(x), function=shift_body, registry=registry,
               sample_inputs=_samples(torch.ones(2, 3), 2))
    def shift_op(x: torch.Tensor, k: int) -> torch.Tensor:
        return x + k

    @bridge.op(derived, fake=lambda x, k: torch.empty_like(x), registry=registry,
               sample_inputs=_samples(torch.ones(2, 3), 2.0))
    def scale_op(x: torch.Tensor, k: float) -> torch.Tensor:
        return x * k + 1

    boxes = torch.tensor([[0, 0, 4, 4], [1, 1, 5, 5], [8, 8, 9, 9], [0, 0, 4, 5], [2, 0, 3, 9]], dtype=torch.float32)
    bridge.register("torchvision::nms", registry=registry, sample_inputs=_samples(boxes, torch.arange(5.0), 0.5))
    return {"written": registry.get(written), "built": registry.get(built), "derived": registry.get(derived),
            "translated": registry.get("torchvision::nms")}


def _nodes(spec, values: list[dict]) -> tuple[list[ir.Node], dict[str, onnx.TypeProto]]:
    """One node of ``spec``'s op per attribute values in ``values``, in one model, and the input types."""
    shapes = {"x": [2, 3], "dets": ["n", 4], "scores": ["n"]}
    inputs = [p.name for p in spec.tensors]
    graph = helper.make_graph(
        [helper.make_node(spec.name, inputs, [f"y{i}"], domain=spec.domain, name=f"n{i}", **v)
         for i, v in enumerate(values)], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in inputs],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(len(values))])
    model = ir.serde.deserialize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(spec.domain, spec.version)]))
    types = {n: helper.make_tensor_type_proto(TensorProto.FLOAT, shapes[n]) for n in inputs}
    return list(model.graph), types


VALUES = {"written": [{}, {}, {}], "built": [{"k": 2}, {"k": 2}, {"k": 3}],
          "derived": [{"k": 2.0}, {"k": 2.0}, {"k": -0.5}],
          "translated": [{"iou_threshold": 0.5}, {"iou_threshold": 0.5}, {"iou_threshold": 0.2}]}


@pytest.mark.parametrize("name", KINDS)
def test_body_kind_decides_the_kind_and_its_status(ops, name):
    cls, status, _, _ = KINDS[name]
    kind = kinds.body_kind(ops[name])
    assert type(kind) is cls and kind.spec is ops[name]
    assert kind.status() == status
    assert kind.status(try_it=False)[0] == status[0]


@pytest.mark.parametrize("name", KINDS)
def test_each_kinds_key_says_which_nodes_share_a_body(ops, name):
    kind = kinds.body_kind(ops[name])
    (a, b, other), _ = _nodes(ops[name], VALUES[name])
    keys = [kind.key(n) for n in (a, b, other)]
    shared = KINDS[name][2]
    assert (keys[0] == keys[1]) == (shared in ("all", "equal values"))
    assert (keys[0] == keys[2]) == (shared == "all")
    assert kind.per_node == (shared != "all")


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("opset", [17, 21])
def test_each_kind_makes_the_body_at_an_opset(ops, registry, name, opset):
    spec = ops[name]
    kind = kinds.body_kind(spec)
    (node, *_), types = _nodes(spec, VALUES[name])
    body = kind.make(node, opset, lambda: types, registry)
    assert (body.domain, body.name, list(body.input)) == (spec.domain, spec.name, [p.name for p in spec.tensors])
    assert onnx_opset(body) == opset
    if name == "written":  # one body for every node: the same as the op's written body at that opset
        assert body.SerializeToString() == kind.at(opset).SerializeToString()


@pytest.mark.parametrize("name", KINDS)
def test_each_kinds_show_text(ops, registry, name):
    text = kinds.body_kind(ops[name]).show(registry=registry)
    head, _, body = text.partition("\n")
    assert head + "\n" == f"# {ops[name].qualname}" + KINDS[name][3]
    assert body.startswith("<") and ops[name].name in body


def test_a_derived_body_at_no_opset_is_none(ops, registry):
    (node, *_), types = _nodes(ops["derived"], VALUES["derived"])
    assert kinds.body_kind(ops["derived"]).make(node, None, lambda: types, registry) is None


def test_show_body_checks_a_built_body_as_the_resolver_does(registry, fresh_name):
    """--show-body printed what a builder returned unchecked; it now refuses a body that does not
    mirror the op, with the resolver's message."""
    name = fresh_name("misnamed")

    def builder(k):
        @onnxscript.script(onnxscript.values.Opset(name.split("::")[0], 1), default_opset=op)
        def other(x):
            return op.Identity(x)
        return other

    @bridge.op(name, fake=lambda x, k: torch.empty_like(x), function=builder, registry=registry,
               sample_inputs=_samples(torch.ones(2, 3), 2))
    def misnamed(x: torch.Tensor, k: int) -> torch.Tensor:
        return x.clone()

    kind = kinds.body_kind(registry.get(name))
    (node, *_), types = _nodes(registry.get(name), [{"k": 2}])
    with pytest.raises(OpBridgeError, match="function body does not match the op") as made:
        kind.make(node, 18, lambda: types, registry)
    with pytest.raises(OpBridgeError, match="function body does not match the op") as shown:
        kind.show(registry=registry)
    assert str(made.value) == str(shown.value)


def test_show_body_without_samples_says_how_the_body_is_made(registry, fresh_name):
    name = fresh_name("unsampled")

    @bridge.op(name, fake=lambda x, k: torch.empty_like(x), function=lambda k: None, registry=registry)
    def unsampled(x: torch.Tensor, k: int) -> torch.Tensor:
        return x.clone()

    with pytest.raises(OpBridgeError, match="its body is built per attribute values, and it has no sample inputs"):
        kinds.body_kind(registry.get(name)).show()
