"""bridge.core.checks: one check list per op; its eager form and its ONNX guards accept and reject the same
calls (judged against predicates written out here), and every tier reports a failed check alike."""

import copy
import doctest
import importlib
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from models import crop_in_a_branch, rows_file
from onnx import TensorProto, helper
from op_db import F32, OPS

import bridge
import custom_ops  # noqa: F401
from bridge import checks as C
from bridge.core.checks.guards import ordered, unguarded
from exporters.kinds import body_kind

ATTR_TYPES = {"width": onnx.AttributeProto.INT, "box": onnx.AttributeProto.INTS}


def run_guarded(check_list, a: np.ndarray, b: np.ndarray, width: int, box: list[int]):
    """Run a one-node model whose function body (y = Identity(a)) carries the guards; plain
    onnxruntime. Returns None, or the error text."""
    body = helper.make_function("t", "f", ["a", "b"], ["y"], [helper.make_node("Identity", ["a"], ["y"])],
                                [helper.make_opsetid("", 20)], attributes=["width", "box"])
    guarded = C.guarded_body(body, C.Checks("t::f", check_list), ATTR_TYPES)
    node = helper.make_node("f", ["a", "b"], ["y"], domain="t", width=width)
    node.attribute.append(helper.make_attribute("box", box, attr_type=onnx.AttributeProto.INTS))
    types = {np.dtype(np.int32): TensorProto.INT32, np.dtype(np.float32): TensorProto.FLOAT}
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", types[a.dtype], None),
                                            helper.make_tensor_value_info("b", types[b.dtype], None)],
                              [helper.make_tensor_value_info("y", types[a.dtype], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("t", 1)],
                              functions=[guarded])
    options = ort.SessionOptions()
    options.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), options)
    try:
        out = sess.run(None, {"a": a, "b": b})[0]
    except Exception as e:  # noqa: BLE001  the error text is what is judged
        return str(e)
    np.testing.assert_array_equal(out, a)  # the guards leave the body's result alone
    return None


def ints(*values):
    return np.array(values, dtype=np.int32)


# (check, a, b, width, box, holds?): each "holds" is the condition written out by hand
CASES = [
    (C.values_in("a", 0, C.numel("b")), ints(0, 1, 2), ints(5, 5, 5), 0, [], True),
    (C.values_in("a", 0, C.numel("b")), ints(0, 3, 2), ints(5, 5, 5), 0, [], False),  # 3 >= numel 3
    (C.values_in("a", 0, C.numel("b")), ints(-1), ints(5), 0, [], False),
    (C.values_in("a", 0, C.numel("b")), ints(), ints(), 0, [], True),  # empty: nothing to check
    (C.values_in("a", 1, C.attr("box").prod(2)), ints(1, 5), ints(), 0, [2, 3, 100], True),  # [1, 6)
    (C.values_in("a", 1, C.attr("box").prod(2)), ints(6), ints(), 0, [2, 3, 100], False),
    (C.values_ge("a", 0), ints(0, 4), ints(), 0, [], True),
    (C.values_ge("a", 0), ints(4, -5), ints(), 0, [], False),
    (C.values_ge("a", 0), np.array([0.5, -0.25], np.float32), ints(), 0, [], False),  # no truncation to 0
    (C.values_ge("a", 0), np.array([0.0, 2.5], np.float32), ints(), 0, [], True),
    (C.values_in("a", 0, 3), np.array([2.5], np.float32), ints(), 0, [], True),
    (C.values_in("a", 0, 3), np.array([3.0], np.float32), ints(), 0, [], False),
    (C.values_in("a", 0, 2**31 + 5), ints(2**31 - 1), ints(), 0, [], True),  # a bound past int32
    # NaN fails eager's min/max comparisons: onnxruntime's ReduceMin/ReduceMax skip a NaN after the
    # first element, so the guard reads NaN as past both bounds
    (C.values_ge("a", 0), np.array([4, np.nan], np.float32), ints(), 0, [], False),
    (C.values_ge("a", 0), np.array([np.nan, 4], np.float32), ints(), 0, [], False),
    (C.values_in("a", 0, 5), np.array([4, np.nan], np.float32), ints(), 0, [], False),
    (C.values_in("a", 0, 5), np.array([np.nan], np.float32), ints(), 0, [], False),
    (C.values_ge("a", 0), np.array([4, np.inf], np.float32), ints(), 0, [], True),
    (C.values_ge("a", 0), np.array([4, -np.inf], np.float32), ints(), 0, [], False),
    (C.values_in("a", 0, 5), np.array([1, np.inf], np.float32), ints(), 0, [], False),
    (C.same_len("a", "b"), ints(1, 2), ints(3, 4), 0, [], True),
    (C.same_len("a", "b"), ints(1, 2), ints(3), 0, [], False),
    (C.dim_eq("a", 1, C.attr("width")), np.zeros((2, 3), np.float32), ints(), 3, [], True),
    (C.dim_eq("a", 1, C.attr("width")), np.zeros((2, 4), np.float32), ints(), 3, [], False),
    (C.dim_eq("a", 1, C.attr("width")), np.zeros(3, np.float32), ints(), 3, [], False),  # no axis 1
    (C.dim_eq("a", -1, C.attr("box")[2]), np.zeros((2, 7), np.float32), ints(), 0, [0, 0, 7], True),
    (C.dim_eq("a", -1, C.attr("box")[2]), np.zeros((2, 7), np.float32), ints(), 0, [0, 0], False),  # no box[2]
    (C.dim_eq("a", 0, C.numel("b") // C.dim("b", -1)), np.zeros((3, 1), np.float32),
     np.zeros((3, 2), np.float32), 0, [], True),
    (C.rank("a", 2), np.zeros((1, 1), np.float32), ints(), 0, [], True),
    (C.rank("a", 2), np.zeros((1, 1, 1), np.float32), ints(), 0, [], False),
    (C.rank("a", 2, at_least=True), np.zeros((1, 1, 1), np.float32), ints(), 0, [], True),
    (C.rank("a", 2, at_least=True), np.zeros(1, np.float32), ints(), 0, [], False),
    (C.same_shape("a", "b"), np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), 0, [], True),
    (C.same_shape("a", "b"), np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), 0, [], False),
    (C.same_shape("a", "b"), np.zeros(6, np.float32), np.zeros((6, 1), np.float32), 0, [], False),
    (C.same_shape("a", "b"), np.zeros((), np.float32), np.zeros((), np.float32), 0, [], True),
    (C.same_shape("a", "b"), np.zeros((), np.float32), np.zeros(1, np.float32), 0, [], False),
    (C.same_shape("a", "b"), np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), 0, [], True),
    (C.same_shape("a", "b"), np.zeros((0, 3), np.float32), np.zeros((3, 0), np.float32), 0, [], False),
    (C.same_shape("a", "b"), np.zeros((2, 1), np.float32), np.zeros((2, 1, 1), np.float32), 0, [], False),
    (C.same_shape("a", "b", drop_last=2), np.zeros((4, 1, 2), np.float32), np.zeros((4, 5, 6), np.float32), 0, [],
     True),
    (C.same_shape("a", "b", drop_last=2), np.zeros((1, 2), np.float32), np.zeros((4, 5, 6), np.float32), 0, [],
     False),  # lower rank: no broadcasting
    (C.same_shape("a", "b", drop_last=2), np.zeros((3, 1, 2), np.float32), np.zeros((4, 5, 6), np.float32), 0, [],
     False),
    (C.same_shape("a", "b", drop_last=2), np.zeros(3, np.float32), np.zeros(4, np.float32), 0, [],
     False),  # both ranks below drop_last: nothing to compare is a failure in eager and guard alike
    (C.attr_len("box", 4), ints(), ints(), 0, [1, 2, 3, 4], True),
    (C.attr_len("box", 4), ints(), ints(), 0, [1, 2, 3], False),
    (C.attr_le("box", [(0, 2), (1, 3)], what="w", fix="f"), ints(), ints(), 0, [0, 0, 1, 1], True),
    (C.attr_le("box", [(0, 2), (1, 3)], what="w", fix="f"), ints(), ints(), 0, [0, 2, 1, 1], False),
    (C.attr_ge("box", 0), ints(), ints(), 0, [0, 3], True),
    (C.attr_ge("box", 0), ints(), ints(), 0, [1, -1], False),
    (C.attr_ge("box", 0), ints(), ints(), 0, [], True),
    (C.intervals_within("a", "b", 5), ints(0, 3), ints(3, 2), 0, [], True),  # [0, 3), [3, 5)
    (C.intervals_within("a", "b", 5), ints(0, 3), ints(3, 3), 0, [], False),  # ends at 6
    (C.intervals_within("a", "b", 5), ints(-1), ints(1), 0, [], False),
    (C.intervals_within("a", "b", 0), ints(), ints(), 0, [], True),
]


@pytest.mark.parametrize("check,a,b,width,box,holds", CASES, ids=[f"{c[0].kind}-{i}" for i, c in enumerate(CASES)])
def test_eager_and_guard_agree_with_the_written_condition(check, a, b, width, box, holds):
    env = {"a": torch.from_numpy(a), "b": torch.from_numpy(b), "width": width, "box": box}
    assert (check.violation(env) is None) == holds
    error = run_guarded([check], a, b, width, box)
    assert (error is None) == holds, error
    if not holds:
        assert "opbridge_check/t::f/" in error


# attr_prod_le: zeros count as 1; the product bounds every partial product
CASES_PROD = [
    (C.attr_prod_le("box", 2**60), ints(), ints(), 0, [2**20, 2**20, 0, 2**20], True),
    (C.attr_prod_le("box", 2**60), ints(), ints(), 0, [2**31, 2**31, 2**31, 6], False),
    (C.attr_prod_le("box", 2**60), ints(), ints(), 0, [], True),
    (C.attr_prod_le("box", 2**60), ints(), ints(), 0, [2**30, 2**30], True),  # exactly the limit
    (C.attr_prod_le("box", 2**60), ints(), ints(), 0, [2**30, 2**30, 3], False),
    (C.attr_prod_le("box", 2**60), ints(), ints(), 0, [2**32, 2**32], False),  # 2**64 wraps to 0 in int64
    (C.attr_prod_le("box", 2**60), ints(), ints(), 0, [2**62, 2**62, 2**62, 2**62, 2**62], False),
]


@pytest.mark.parametrize("check,a,b,width,box,holds", CASES_PROD, ids=[f"prod-{i}" for i in range(len(CASES_PROD))])
def test_attr_prod_le_eager_and_guard_agree(check, a, b, width, box, holds):
    test_eager_and_guard_agree_with_the_written_condition(check, a, b, width, box, holds)


def test_a_guard_failure_without_values_states_the_checks_of_its_node():
    """Where the session cannot read back the values a guard node read, its message states what
    the node's checks require (a torchbind method's qualname has a dot: ns::Class.method)."""
    checks = C.Checks("ns::Cls.forward", [C.rank("x", 2), C.dtype_is("x", [torch.float32]), C.values_ge("y", 0)])
    node = "opbridge_check/ns::Cls.forward/x/0.rank+y/2.values_ge"
    assert C.guard_failure(checks, node) == (
        "opbridge: ns::Cls.forward: its inputs must pass each check its guard states: input 'x' must have 2 dims; "
        "input 'y' values must be >= 0. Got a value that fails one of them inside the model (onnxruntime stopped at "
        f"guard node '{node}'). Run the op eagerly on the same inputs to see which check fails.")


def test_written_body_copies():
    written = bridge.REGISTRY.get("opbridge::identity_conv").function
    assert copy.copy(written).to_function_proto().name == written.to_function_proto().name


def test_guards_fail_in_list_order():
    """Two failing checks: onnxruntime stops at the first, as the eager check does."""
    checks = [C.same_len("a", "b"), C.values_ge("a", 0)]
    error = run_guarded(checks, ints(-1, -2), ints(1), 0, [])
    # NOTE: plain onnxruntime names the first index out of bounds: check 0's (docs/tiers.md)
    assert "opbridge_check/t::f/a/0.same_len+a/1.values_ge" in error and "idx=1 " in error, error
    env = {"a": torch.tensor([-1, -2]), "b": torch.tensor([1])}
    assert "must have equal length" in C.Checks("t::f", checks).first_failure(env)


@pytest.mark.parametrize("a,b", [(ints(-1), ints(-1)), (ints(1), ints(-1)), (ints(-1), ints(1)),
                                 (ints(1, 1), ints(-1)), (ints(1), ints(1, -1))])
def test_guards_of_two_inputs_fail_at_the_first_failing_check(a, b):
    """Checks of two inputs, interleaved in the list: plain onnxruntime stops at the guard node of the
    input whose check fails first in list order (eager's), with that check as ``idx=``; only that node."""
    checks = [C.same_len("a", "b"), C.values_ge("b", 0), C.values_ge("a", 0), C.rank("b", 1)]
    env = {"a": torch.from_numpy(a), "b": torch.from_numpy(b)}
    index = next(i for i, c in enumerate(checks) if c.violation(env) is not None)
    error = run_guarded(checks, a, b, 0, [])
    (node,) = re.findall(r"Name:'[^']*?(opbridge_check/[^']*)'", error)
    names = {i: f"{c.input}/{i}.{c.kind}" for i, c in enumerate(checks)}
    assert node == "opbridge_check/t::f/" + "+".join(v for i, v in names.items() if checks[i].input ==
                                                     checks[index].input), error
    assert f"idx={index + 1} " in error, error


def test_eager_message_names_op_and_input_and_is_a_value_error():
    with pytest.raises(ValueError, match=r"^opbridge: opbridge::crop: attribute 'box' must be \[left, top, right, "
                                         r"bottom\] with right >= left and bottom >= top\. Got \[3, 0, 1, 1\]\."):
        torch.ops.opbridge.crop(torch.ones(4, 4), [3, 0, 1, 1])
    with pytest.raises(bridge.OpBridgeError):
        torch.ops.opbridge.crop(torch.ones(4), [0, 0, 1, 1])


class _Paste(torch.nn.Module):
    """paste fed values computed inside the model, not fed ones."""

    def forward(self, image, patch):
        return torch.ops.opbridge.paste(image * 2, patch + 1, 1, 1)


def _eager_error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.fixture(scope="module")
def paste_file(tmp_path_factory):
    lead = torch.export.Dim("lead")  # NOTE: one symbol; onnxruntime does not hold two inputs to it
    path = tmp_path_factory.mktemp("paste") / "m.onnx"
    bridge.export(_Paste(), (torch.zeros(2, 5, 5), torch.ones(2, 2, 2)), path, dynamic_shapes=({0: lead}, {0: lead}))
    return path


def test_function_tier_gives_eagers_message_for_inputs_computed_in_the_model(paste_file):
    """The op's inputs are computed inside the model (not fed): the session computes them and
    runs the op's checks on them, for eager's exact message."""
    sess = bridge.session(paste_file, tier="function")
    image, patch = torch.zeros(2, 5, 5), torch.ones(3, 2, 2)
    with pytest.raises(bridge.OpBridgeError) as info:
        bridge.parity.run_ort(sess, [image, patch])
    assert str(info.value) == _eager_error(lambda: _Paste()(image, patch))
    # plain onnxruntime on the same file refuses the input too: the file's guard runs, but nothing in
    # the file orders it before the body (tools see through its Identity waits), so a body node may
    # fail first, with onnxruntime's own message (docs/tiers.md)
    plain = ort.InferenceSession(str(paste_file))
    with pytest.raises(Exception, match=r"Non-zero status code returned while running"):
        plain.run(None, {"image": np.zeros((2, 5, 5), np.float32), "patch": np.ones((3, 2, 2), np.float32)})


def test_a_guard_whose_values_cannot_be_read_back_is_worded_from_its_node(paste_file):
    """A run through an IO binding made without ``session.io_binding()`` gives the session no feed to compute the
    op's inputs from: the message names the guard node that stopped (one per input: patch's, whose one check
    failed) and what that check requires. One from ``io_binding()`` records its inputs: eager's message."""
    sess = bridge.session(paste_file, tier="function")
    messages = []
    for binding in (ort.IOBinding(sess), sess.io_binding()):
        binding.bind_cpu_input("image", np.zeros((2, 5, 5), np.float32))
        binding.bind_cpu_input("patch", np.ones((3, 2, 2), np.float32))
        binding.bind_output(sess.get_outputs()[0].name)
        with pytest.raises(bridge.OpBridgeError) as info:
            sess.run_with_iobinding(binding)
        messages.append(str(info.value))
    assert messages[0].startswith("opbridge: opbridge::paste: inputs 'image' (..., H, W) and 'patch' (..., h, w) must "
                                  "have equal leading dims. Got a value that fails it inside the model"), messages[0]
    assert "onnxruntime stopped at guard node 'opbridge_check/opbridge::paste/patch/1.same_shape'" in messages[0]
    assert messages[1] == ("opbridge: opbridge::paste: inputs 'image' (..., H, W) and 'patch' (..., h, w) must have "
                           "equal leading dims. Got (2, 5, 5) and (3, 2, 2). Match the leading dims."), messages[1]


def test_a_custom_op_fed_by_another_gets_eagers_message(registry, fresh_name):
    """A checked op reading another custom op's output (NaN among its values too): eager's exact
    message, from the value the first op computed in the session."""
    first, second = fresh_name("shifted"), fresh_name("nonneg")

    @bridge.op(first, fake=lambda x: torch.empty_like(x), registry=registry)
    def shifted(x: torch.Tensor) -> torch.Tensor:
        return x - 1

    @bridge.op(second, fake=lambda x: torch.empty_like(x), registry=registry, checks=[C.values_ge("x", 0)])
    def nonneg(x: torch.Tensor) -> torch.Tensor:
        nonneg.check(x)
        return x.sqrt()

    class M(torch.nn.Module):
        def forward(self, x):
            return nonneg(shifted(x))

    sess = bridge.session(bridge.export(M(), (torch.ones(3) * 2,), registry=registry), registry=registry)
    assert bridge.parity.run_ort(sess, [torch.tensor([1.0, 5.0, 10.0])])[0].tolist() == [0.0, 2.0, 3.0]
    for bad in (torch.tensor([1.0, 0.5, 3.0]), torch.tensor([2.0, float("nan"), 1.0])):
        with pytest.raises(bridge.OpBridgeError) as info:
            bridge.parity.run_ort(sess, [bad])
        assert str(info.value) == _eager_error(lambda bad=bad: M()(bad)), bad


def test_an_error_that_is_no_checks_stays_onnxruntimes(registry, fresh_name):
    """A standard node failing before a checked op: the session raises onnxruntime's own error,
    unchanged (the text plain onnxruntime gives for that node alone)."""
    name = fresh_name("positive")
    domain, op_type = name.split("::")

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry, checks=[C.values_ge("x", 0)])
    def positive(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def model(nodes, output):
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                                               helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(domain, 1)])

    reshape = helper.make_node("Reshape", ["x", "shape"], ["r"])
    sess = bridge.session(model([reshape, helper.make_node(op_type, ["r"], ["y"], domain=domain)], "y"),
                          registry=registry)
    feed = {"x": -np.ones(6, np.float32), "shape": np.array([4])}  # NOTE: values the op's check refuses, too
    with pytest.raises(Exception) as info:
        sess.run(None, feed)
    plain = ort.InferenceSession(model([reshape], "r").SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(type(info.value)) as expected:
        plain.run(None, feed)
    assert str(info.value) == str(expected.value) and "Reshape" in str(expected.value)


@pytest.mark.parametrize("tier", ["function", "native", "python"])
def test_a_custom_node_inside_a_branch_is_checked_like_one_in_the_main_graph(tier):
    """opbridge::crop inside an If branch: a bad attribute is refused with the op's own message when
    the session opens, in every tier (the function tier checked only the main graph's nodes, and
    failed at run time naming no check), and a good one runs."""
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    sess = bridge.session(crop_in_a_branch([1, 0, 3, 2]), tier=tier)
    np.testing.assert_array_equal(sess.run(None, {"cond": np.array(True), "x": x})[0], x[0:2, 1:3])
    for box, says in (([3, 0, 1, 2], "with right >= left and bottom >= top"), ([1, 2], "Got [1, 2]")):
        with pytest.raises(bridge.OpBridgeError, match=r"opbridge::crop: attribute 'box' must be \[left, top, right, "
                                                       r"bottom\]") as info:
            bridge.session(crop_in_a_branch(box), tier=tier).run(None, {"cond": np.array(True), "x": x})
        if tier != "native":  # NOTE: the native kernel's own message states the order check for any bad box
            assert says in str(info.value), str(info.value)


def test_a_failed_guard_inside_a_branch_gets_the_ops_message():
    """A value check failing inside an If branch (onnxruntime reports the If node, naming the guard
    after it) is explained with the op's eager message, from the model's input."""
    sess = bridge.session(crop_in_a_branch([0, 0, 1, 1], x_shape=None), tier="function")
    with pytest.raises(bridge.OpBridgeError) as info:
        sess.run(None, {"cond": np.array(True), "x": np.ones(4, np.float32)})
    assert str(info.value).startswith("opbridge: opbridge::crop: input 'img' must be an image (..., H, W)"), \
        str(info.value)
    # a wrong dtype fed to the model input the branch's node reads is named after the op's input
    with pytest.raises(bridge.OpBridgeError, match=r"opbridge::crop: input 'img' \(model input 'x'\) must be "
                                                   r"float32"):
        sess.run(None, {"cond": np.array(True), "x": np.ones((4, 4))})


def test_a_failed_guard_inside_a_branch_on_a_computed_value_gets_eagers_message():
    """The node in the If branch reads a value the main graph computes (Neg(x)): the session
    computes it and gives eager's exact message."""
    model = crop_in_a_branch([0, 0, 1, 1], x_shape=None)
    model.graph.node.insert(0, helper.make_node("Neg", ["x"], ["negated"]))
    (then,) = [a.g for a in model.graph.node[1].attribute if a.name == "then_branch"]
    then.node[0].input[0] = "negated"
    sess = bridge.session(model, tier="function")
    x = np.ones(4, np.float32)
    with pytest.raises(bridge.OpBridgeError) as info:
        sess.run(None, {"cond": np.array(True), "x": x})
    assert str(info.value) == _eager_error(lambda: torch.ops.opbridge.crop(-torch.from_numpy(x), [0, 0, 1, 1]))


@pytest.mark.parametrize("entry", OPS, ids=[e.qualname for e in OPS])
def test_table_bad_inputs_follow_the_spec(entry):
    """Every bad input of the table fails the op's own check list with a message that names the
    op and the input and holds each fragment every tier is held to (tests/op_db.py)."""
    checks = entry.spec.checks
    assert checks is not None and len(checks), f"{entry.qualname} states no checks"
    for bad in entry.bad_inputs:
        _, call = entry.bad_call(bad)
        message = checks.first_failure(entry.named(call))
        assert message is not None, f"{bad.name}: the spec accepts it"
        assert message.startswith(f"opbridge: {entry.qualname}: ") and f"'{bad.input}'" in message or \
            bad.input in message, (bad.name, message)
        assert all(fragment in message for fragment in bad.error), (bad.name, bad.error, message)
        for sample in entry.samples(F32):  # and the valid samples pass it
            assert checks.first_failure(entry.named(sample.args)) is None, (sample.name,)


def test_guards_leave_the_body_alone_when_checks_hold():
    """One guard node per input names that input's guarded checks (together: every guarded check,
    each once); the body's own nodes follow, in order (its constants, shared with the guards, go
    first), then its output's tie to the guard's result."""
    spec = bridge.REGISTRY.get("bev::bev_pool_v2")
    guarded, raw = body_kind(spec).at(), spec.function.to_function_proto()
    names = [n.name for n in guarded.node if n.name.startswith(C.GUARD_PREFIX)]
    groups = [name.removeprefix("opbridge_check/bev::bev_pool_v2/").split("+") for name in names]
    assert groups[0] == ["depth/0.rank"] and len(groups) == len({c.input for c in spec.checks if c.guarded})
    assert all(len({entry.split("/")[0] for entry in group}) == 1 for group in groups), names
    assert sorted((entry for group in groups for entry in group), key=lambda e: int(e.split("/")[1].split(".")[0])) \
        == [f"{c.input}/{i}.{c.kind}" for i, c in enumerate(spec.checks) if c.guarded]
    ops = [n.op_type for n in raw.node if n.op_type != "Constant"]
    body = [n.op_type for n in guarded.node if n.op_type != "Constant"]
    assert body[-3:] == ["ReduceMax", "Cast", "Where"] and body[-3 - len(ops):-3] == ops
    assert guarded.node[-1].name == "opbridge_tie/" + guarded.output[0]


def test_the_tie_gives_the_guard_a_reader_and_comes_out_again():
    """In the file each output reads the guard's result (optimizers then keep the guard); the
    deployment body (unguarded) and the session's ordered body have no tie."""
    spec = bridge.REGISTRY.get("bev::bev_pool_v2")
    guarded = body_kind(spec).at()
    tie = guarded.node[-1]
    assert tie.op_type == "Where" and tie.output[0] == guarded.output[0] and tie.input[1] == tie.input[2]
    flag = next(n for n in guarded.node if tie.input[0] in n.output)
    reduced = next(n for n in guarded.node if flag.input[0] in n.output)
    assert any(reduced.input[0] in n.output for n in guarded.node if n.name.startswith(C.GUARD_PREFIX + "/"))
    plain = unguarded(guarded)
    assert not [n for n in plain.node if n.op_type == "Where" and n.name.startswith("opbridge_tie/")]
    assert [n.op_type for n in plain.node if n.op_type != "Constant"] == \
        [n.op_type for n in spec.function.to_function_proto().node if n.op_type != "Constant"]
    order = onnx.FunctionProto()
    order.CopyFrom(guarded)
    assert ordered(order) and not [n for n in order.node if n.name.startswith("opbridge_tie/")]


def test_derived_body_carries_the_guards(registry, fresh_name):
    """An op without a written body: the body derived from its implementation gets its guards too."""
    name = fresh_name("head")

    @bridge.op(name, fake=lambda x, k: torch.empty_like(x), registry=registry,
               checks=[C.rank("x", 1), C.dim_eq("x", 0, C.attr("k"), what="input 'x' must have k = {value} entries"),
                       C.values_ge("x", 0)])
    def head(x: torch.Tensor, k: int) -> torch.Tensor:
        head.check(x, k)  # value checks are skipped while tracing: the guards hold them
        return x * 2

    class M(torch.nn.Module):
        def forward(self, x):
            return head(x, 3)

    proto = bridge.export(M(), (torch.ones(3),), registry=registry)
    (body,) = proto.functions
    assert [n.name for n in body.node if n.name.startswith(C.GUARD_PREFIX)] == [
        f"opbridge_check/{name}/x/0.rank+x/1.dim_eq+x/2.values_ge"]
    sess = bridge.session(proto, registry=registry)
    assert bridge.parity.run_ort(sess, [torch.ones(3)])[0].tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(bridge.OpBridgeError, match=rf"^opbridge: {name}: input 'x' values must be >= 0\. Got min -1\."):
        bridge.parity.run_ort(sess, [torch.tensor([1.0, -1.0, 2.0])])
    with pytest.raises(ValueError, match="values must be >= 0"):
        head(torch.tensor([-1.0]), 1)


@pytest.mark.parametrize("default", [False, True])
def test_derived_body_keeps_the_guards_of_attributes_with_defaults(registry, fresh_name, default):
    """A derived body keeps an attribute with a default as a function attribute with a default
    (attribute_proto): the checks reading it still get guards, as do all the others."""
    name = fresh_name("scaled")
    checks = [C.dim_eq("x", 0, C.attr("k"), what="input 'x' must have k = {value} entries"), C.values_ge("x", 0)]
    if default:
        @bridge.op(name, fake=lambda x, k=3: torch.empty_like(x), registry=registry, checks=checks)
        def scaled(x: torch.Tensor, k: int = 3) -> torch.Tensor:
            return x * 2
    else:
        @bridge.op(name, fake=lambda x, k: torch.empty_like(x), registry=registry, checks=checks)
        def scaled(x: torch.Tensor, k: int) -> torch.Tensor:
            return x * 2

    class M(torch.nn.Module):
        def forward(self, x):
            return scaled(x, 3)

    proto = bridge.export(M(), (torch.ones(3),), registry=registry)
    (body,) = proto.functions
    assert [n.name for n in body.node if n.name.startswith(C.GUARD_PREFIX)] == [
        f"opbridge_check/{name}/x/0.dim_eq+x/1.values_ge"], body
    sess = bridge.session(proto, registry=registry)
    with pytest.raises(bridge.OpBridgeError, match=rf"^opbridge: {name}: input 'x' values must be >= 0"):
        bridge.parity.run_ort(sess, [torch.tensor([1.0, -1.0, 2.0])])


@pytest.mark.parametrize("bad,needle", [
    ([C.rank("xx", 2)], "input 'xx'"),
    ([C.dim_eq("x", 0, C.attr("kk"))], "attribute 'kk'"),
    ([C.dtype_is("zz", [torch.float32])], "input 'zz'"),
    ([C.same_len("x", "y")], "input 'y'"),
])
def test_a_check_naming_what_the_op_lacks_is_refused_at_declaration(registry, fresh_name, bad, needle):
    name = fresh_name("misnamed")
    with pytest.raises(bridge.OpBridgeError, match=rf"^opbridge: {name}: check 0 \(\w+\) reads a name the op does "
                                                   rf"not have: .*{needle}"):
        @bridge.op(name, fake=lambda x, k: torch.empty_like(x), registry=registry, checks=bad)
        def misnamed(x: torch.Tensor, k: int) -> torch.Tensor:
            return x * 2
    ns, short = name.split("::")
    assert not hasattr(getattr(torch.ops, ns), short)  # nothing half-defined in torch


def test_checks_over_an_omitted_optional_input_do_not_apply(registry, fresh_name):
    name = fresh_name("weighted")

    @bridge.op(name, fake=lambda x, w=None: torch.empty_like(x), registry=registry,
               checks=[C.rank("x", 1), C.same_len("w", "x")])
    def weighted(x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        weighted.check(x, w)
        return x * 2 if w is None else x * w

    assert weighted(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="must have equal length. Got lengths 3 and 2"):
        weighted(torch.ones(3), torch.ones(2))


@pytest.mark.parametrize("module", ["bridge.core.checks.vocabulary", "bridge.core.checks.guards"])
def test_check_modules_examples_run(module):
    """The examples of the two check modules (vocabulary, guards) run."""
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_attr_prod_le_refuses_a_limit_an_int64_product_cannot_be_checked_against():
    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: attr_prod_le\('box'\) bounds a product by"):
        C.attr_prod_le("box", 2**62)


def test_a_session_opened_again_on_a_file_checks_as_the_first(tmp_path):
    """Sessions opened again on a file take its ordered bodies from the first (checks.guards.ordered
    keeps them by content): the same bad input fails with the same message, good input runs."""
    class M(torch.nn.Module):
        def forward(self, image, patch):
            return torch.ops.opbridge.paste(image, patch, 1, 1)

    lead = torch.export.Dim("lead")
    path = tmp_path / "m.onnx"
    bridge.export(M(), (torch.zeros(2, 5, 5), torch.ones(2, 2, 2)), path, dynamic_shapes=({0: lead}, {0: lead}))
    messages = []
    for _ in range(2):
        sess = bridge.session(path, tier="function")
        with pytest.raises(bridge.OpBridgeError) as info:
            bridge.parity.run_ort(sess, [torch.zeros(2, 5, 5), torch.ones(3, 2, 2)])
        messages.append(str(info.value))
        got = bridge.parity.run_ort(sess, [torch.zeros(2, 5, 5), torch.ones(2, 2, 2)])[0]
        assert bridge.compare("out", M()(torch.zeros(2, 5, 5), torch.ones(2, 2, 2)), got).passed
    assert messages[0] == messages[1] and messages[0].startswith("opbridge: opbridge::paste: "), messages


def test_ordered_bodies_are_kept_by_content():
    """Two copies of one guarded body are ordered alike (the second from the first's result); a
    different body gets its own ordering; a body without a guard stays as it is."""
    body = helper.make_function("d", "f", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])],
                                [helper.make_opsetid("", 20)])
    other = helper.make_function("d", "f", ["x"], ["y"], [helper.make_node("Abs", ["x"], ["y"])],
                                 [helper.make_opsetid("", 20)])
    checks = C.Checks("d::f", [C.rank("x", 2)])
    first, second, third = (C.guarded_body(b, checks, {}) for b in (body, body, other))
    assert C.ordered(first) and C.ordered(second) and C.ordered(third)
    assert first.SerializeToString() == second.SerializeToString()
    assert [n.op_type for n in first.node][-3:] == ["Unsqueeze", "Squeeze", "Neg"]
    assert [n.op_type for n in third.node][-3:] == ["Unsqueeze", "Squeeze", "Abs"]
    plain = onnx.FunctionProto()
    plain.CopyFrom(body)
    assert not C.ordered(plain) and not C.ordered(plain) and plain.SerializeToString() == body.SerializeToString()


def test_bev_pool_v2_guards_stay_lean():
    """The same 19 guarded checks in at most 125 nodes (220 with a node pair per check, 292 with
    1.17-safe reductions before the guards were first made leaner; 10 more than with one guard node
    since each of the 8 inputs checked has its own, for a message naming it); the whole guarded
    body in at most 215, about half of the 421 it had (benchmarks/body_size.py counts it inlined)."""
    spec = bridge.REGISTRY.get("bev::bev_pool_v2")
    guarded, raw = body_kind(spec).at(), spec.function.to_function_proto()
    assert len([c for c in spec.checks if c.guarded]) == 19
    assert len(guarded.node) - len(raw.node) <= 125 and len(guarded.node) <= 215


def test_a_failed_guard_of_an_unregistered_op_names_the_op_input_and_check(registry, fresh_name, tmp_path):
    """A file opened where its op is not registered (its module not imported): the session still runs its
    body, and a failed guard names the op, the input and the check from the node's name, with onnxruntime's
    message and the way to the op's own; where the op is registered, eager's message as before."""
    path = tmp_path / "rows.onnx"
    name = rows_file(registry, fresh_name, path)
    x = np.ones((4, 3), np.float32)
    good, bad = {"x": x, "idx": np.array([1, 3])}, {"x": x, "idx": np.array([1, 4])}
    sess = bridge.session(path, registry=bridge.Registry())
    assert sess.run(None, good)[0].tolist() == [[2.0] * 3] * 2
    with pytest.raises(bridge.OpBridgeError) as info:
        sess.run(None, bad)
    node = f"opbridge_check/{name}/idx/0.values_in"
    message = str(info.value)
    assert message.startswith(f"opbridge: {name}: input 'idx' failed its check 0 (values_in) inside the model, "
                              f"at guard node '{node}'. Got onnxruntime's message: "), message
    assert "idx=1 must be within" in message and "(its idx=1 is the check's number plus one" in message, message
    assert message.endswith(f"import the module that registers {name} before opening the session (on the "
                            "command line: --ops MODULE)."), message
    with pytest.raises(bridge.OpBridgeError) as registered:
        bridge.session(path, registry=registry).run(None, bad)
    assert str(registered.value) == f"opbridge: {name}: input 'idx' values must lie in [0, 4). Got min 1, max 4. " \
                                    "Check idx against the sizes it indexes.", str(registered.value)


def test_a_body_a_tool_put_before_its_guard_waits_for_it():
    """A tool may order a body's nodes any valid way (onnxslim puts body nodes before the guard): the
    session's ordered body is still in topological order, the body after the wait for the guard, and a bad
    input fails at the guard in onnxruntime (before, the moved node read a value written after it)."""
    body = helper.make_function("d", "f", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])],
                                [helper.make_opsetid("", 20)])
    guarded = C.guarded_body(body, C.Checks("d::f", [C.rank("x", 2)]), {})
    neg = next(n for n in guarded.node if n.op_type == "Neg")
    moved = [neg, *[n for n in guarded.node if n.op_type != "Neg"]]
    del guarded.node[:]
    guarded.node.extend(moved)
    assert ordered(guarded)
    written: set[str] = set(guarded.input)
    for node in guarded.node:
        assert all(i in written for i in node.input if i), (node.op_type, list(node.input))
        written.update(node.output)
    at = {n.name or n.op_type: k for k, n in enumerate(guarded.node)}  # NOTE: the last Squeeze: the wait
    assert at["opbridge_check/d::f/x/0.rank"] < at["Squeeze"] < at["Neg"], list(at)
    graph = helper.make_graph([helper.make_node("f", ["x"], ["y"], domain="d")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("d", 1)],
                              functions=[guarded])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.ones((2, 2), np.float32)})[0].tolist() == [[-1.0, -1.0]] * 2
    with pytest.raises(Exception, match=r"opbridge_check/d::f/x/0\.rank"):
        sess.run(None, {"x": np.ones(2, np.float32)})
