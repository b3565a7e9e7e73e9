"""Export: checker, types and shapes of custom nodes, single file, dynamic points, errors."""

import contextlib
import io
import subprocess
import sys
import textwrap
import warnings

import mmdeploy_lib
import numpy as np
import onnx
import pytest
import torch
from models import PoolBatchFromInput, pool_case
from op_db import TIERS

import bridge
import custom_ops.demo as demo
from bridge.core.basics import torch_compat
from custom_ops.bev_pool_v2 import random_case
from exporters.bodies.translation import translation_table
from exporters.derive.cache import CACHE
from exporters.export import DEFAULT_OPSET, to_onnx


@pytest.fixture(scope="module")
def demo_export(tmp_path_factory):
    case = demo.build()
    path = tmp_path_factory.mktemp("demo") / "demo.onnx"
    proto = bridge.export(case.model, case.args, path, dynamic_shapes=case.dynamic_shapes)
    return case, path, proto


def test_demo_passes_full_check_and_is_one_file(demo_export):
    case, path, proto = demo_export
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["demo.onnx"]  # no .onnx.data beside it
    assert {(f.domain, f.name) for f in proto.functions} == {("bev", "bev_pool_v2"),
                                                              ("opbridge", "identity_conv")}
    assert {(o.domain, o.version) for o in proto.opset_import} >= {("bev", 1), ("opbridge", 1), ("", 20)}


def test_custom_nodes_have_exact_types_and_shapes(demo_export):
    case, _, proto = demo_export
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True, check_type=True)
    types = {v.name: v.type.tensor_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.output)}
    nodes = {n.op_type: n for n in inferred.graph.node if n.domain in ("bev", "opbridge")}
    bev = types[nodes["bev_pool_v2"].output[0]]
    assert bev.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in bev.shape.dim] == [1, 16, 1, 32, 32]
    ident = types[nodes["identity_conv"].output[0]]
    assert [d.dim_value for d in ident.shape.dim] == [6, 32, 8, 22]
    assert nodes["bev_pool_v2"].attribute[0].ints == [1, 1, 32, 32, 16]


def test_same_file_runs_three_point_counts(demo_export):
    case, path, _ = demo_export
    sess = bridge.session(path)
    counts = set()
    for args in (case.args, *case.extra_args):
        counts.add(args[1].numel())
        got = bridge.parity.run_ort(sess, args)[0]
        with torch.no_grad():
            expected = case.model(*args)
        row = bridge.compare("out", expected, got)
        assert row.passed, (args[1].numel(), row)
    assert len(counts) == 3


def test_function_tier_is_deterministic_across_runs(demo_export):
    # ScatterND-add over duplicate cells races in ORT's threaded kernel; the body must not use it
    case, path, _ = demo_export
    sess = bridge.session(path)
    for args in (case.args, *case.extra_args):
        feed = bridge.parity.ort_feed(sess, args)
        first = sess.run(None, feed)[0]
        for _ in range(15):
            np.testing.assert_array_equal(sess.run(None, feed)[0], first)


def test_graph_inputs_keep_dynamic_point_dims(demo_export):
    _, _, proto = demo_export
    dims = {i.name: i.type.tensor_type.shape.dim[0] for i in proto.graph.input}
    assert dims["ranks_depth"].dim_param and dims["ranks_depth"].dim_param == dims["ranks_bev"].dim_param
    assert dims["interval_starts"].dim_param != dims["ranks_depth"].dim_param


def test_float16_model_exports_and_matches(tmp_path):
    pool, args = pool_case(dtype=torch.float16)
    report = bridge.check_parity(pool, args, path=tmp_path / "p.onnx")
    assert report.passed, report
    assert onnx.load(tmp_path / "p.onnx").graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_symbolic_list_attribute_is_a_clear_error():
    pool, args = pool_case(PoolBatchFromInput, b=2)
    batch = torch.export.Dim("batch")
    dyn = ({0: batch}, {0: batch}, None, None, None, None, None)
    with pytest.raises(bridge.OpBridgeError, match="attribute 'bev_feat_shape' must be a constant") as err:
        bridge.export(pool, args, dynamic_shapes=dyn)
    assert "dynamic_shapes" in str(err.value)


def test_static_shape_taken_into_attribute_exports():
    pool, args = pool_case(PoolBatchFromInput)
    proto = bridge.export(pool, args)
    assert [n.op_type for n in proto.graph.node] == ["bev_pool_v2"]


def test_unregistered_custom_op_is_a_clear_error(fresh_name):
    name = fresh_name("secret")

    @torch.library.custom_op(name, mutates_args=())
    def secret(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    secret.register_fake(lambda x: torch.empty_like(x))

    class M(torch.nn.Module):
        def forward(self, x):
            return secret(x)

    with pytest.raises(bridge.OpBridgeError, match=f"custom op {name}.*bridge.register.*@bridge.op"):
        bridge.export(M(), (torch.ones(2),))


class _GridSampler(torch.nn.Module):
    """mmdeploy's grid_sampler node written with torch.onnx.ops.symbolic under is_in_onnx_export(); eager: torch."""

    def forward(self, x, grid):
        if torch.onnx.is_in_onnx_export():
            return torch.onnx.ops.symbolic("mmdeploy::grid_sampler", (x, grid),
                                           {"interpolation_mode": 0, "padding_mode": 0, "align_corners": 0},
                                           dtype=x.dtype, shape=(x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]),
                                           version=1)
        return torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


@pytest.mark.long
def test_a_torch_onnx_symbolic_node_runs_in_the_kernel_library_that_serves_it():
    """The node torch.onnx.ops.symbolic names, unknown to every registry, runs in the native tier through the
    library that serves it (mmdeploy 1.3.1's), with eager's values."""
    x, grid = torch.randn(1, 3, 8, 8), torch.rand(1, 5, 6, 2) * 2 - 1
    proto = bridge.export(_GridSampler(), (x, grid))
    assert [(n.domain, n.op_type) for n in proto.graph.node] == [("mmdeploy", "grid_sampler")]
    sess = bridge.session(proto.SerializeToString(), tier="native", native_library=mmdeploy_lib.library())
    np.testing.assert_allclose(bridge.parity.run_ort(sess, (x, grid))[0], _GridSampler()(x, grid).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_a_fake_kernel_that_raises_is_named_with_its_line(registry, fresh_name):
    """A user's fake raising IndexError under export: one OpBridgeError naming the error and the fake's own line,
    not torch's trace (which stays the cause)."""
    def fake(x):
        return x.new_empty(x.shape[5])  # the bug: x has 2 dims

    @bridge.op(fresh_name("badfake"), dtypes=(torch.float32,), fake=fake, registry=registry)
    def badfake(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    class M(torch.nn.Module):
        def forward(self, x):
            return badfake(x) + 1

    with pytest.raises(bridge.OpBridgeError) as info:
        bridge.export(M(), (torch.randn(2, 3),), registry=registry)
    message = str(info.value)
    assert "Got IndexError: tuple index out of range" in message, message
    assert f"({__file__}:{fake.__code__.co_firstlineno + 1} in fake)" in message, message
    assert isinstance(info.value.__cause__, IndexError)


class _ExportBranch(torch.nn.Module):
    """torch's documented pattern for a node of an ONNX op of one's own (torch.onnx.ops.symbolic's docstring): the
    node under ``torch.onnx.is_in_onnx_export()``, plain torch otherwise."""

    def forward(self, x):
        x = x + 1
        if torch.onnx.is_in_onnx_export():
            y = torch.onnx.ops.symbolic("custom_domain::CustomOp", (x,), {"alpha": 0.5, "mode": "a", "k": [1, 2]},
                                        dtype=x.dtype, shape=x.shape, version=1)
        else:
            y = x * 0.5
        return torch.relu(y)


def _nodes(graph: onnx.GraphProto) -> list:
    return [(n.domain, n.op_type, [(a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute])
            for n in graph.node]


def test_the_model_is_traced_as_torch_onnx_traces_it():
    """While bridge.export traces, torch.onnx.is_in_onnx_export() is True, as in torch.onnx.export(dynamo=True):
    the branch written for export is the one exported (the node torch.onnx.ops.symbolic names, as torch.onnx writes
    it); eager, before and after, takes the other."""
    x = torch.randn(2, 3)
    ours = bridge.export(_ExportBranch(), (x,), opset_version=20)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.onnx.export(_ExportBranch(), (x,), dynamo=True, opset_version=20).model_proto
    assert _nodes(ours.graph) == _nodes(theirs.graph)
    assert _nodes(ours.graph)[1] == ("custom_domain", "CustomOp", [("alpha", 0.5), ("mode", b"a"), ("k", [1, 2])])
    assert {(o.domain, o.version) for o in ours.opset_import} >= {("custom_domain", 1)}
    assert not torch.onnx.is_in_onnx_export()
    torch.testing.assert_close(_ExportBranch()(x), torch.relu((x + 1) * 0.5))
    # NOTE: no tier has a kernel for an op no registry knows: each says so and names the way out
    with pytest.raises(bridge.OpBridgeError, match=r"no C\+\+ kernel for custom_domain::CustomOp.*native_library="):
        bridge.session(ours.SerializeToString(), tier="native")


class _Flatten(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 3).reshape(x.shape[0], -1) * 2


def test_a_dynamic_batch_exported_from_a_batch_of_one_stays_dynamic():
    """A deployment export: example batch 1, the batch marked dynamic. torch.onnx.export(dynamo=True) keeps it
    dynamic (size 0/1 examples traced size-obliviously); so does bridge.export, and the file runs other batches."""
    batch = torch.export.Dim("batch")
    x = torch.randn(1, 3, 4, 4)
    proto = bridge.export(_Flatten(), (x,), dynamic_shapes=({0: batch},))
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    bridge.assert_parity(_Flatten(), (x,), dynamic_shapes=({0: batch},), extra_args=[(torch.randn(3, 3, 4, 4),)])


class _BevPool(torch.nn.Module):
    def forward(self, depth, feat, ranks_depth, ranks_feat, ranks_bev, starts, lengths):
        return torch.ops.bev.bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, [1, 2, 4, 5, 6], starts,
                                         lengths)


def test_sizes_the_op_needs_equal_marked_with_two_dims_are_narrowed_as_torch_onnx_narrows_them():
    """Each rank array marked with a Dim of its own: bev_pool_v2 needs one length per point. torch.export refuses
    and suggests one Dim; torch.onnx.export(dynamo=True) exports with its fixes applied, and so does bridge.export,
    with a warning naming them. The points stay dynamic (one dim name) and the file runs another point count."""
    depth, feat, rd, rf, rb, _, starts, lengths = random_case()
    args = (depth, feat, rd, rf, rb, starts, lengths)
    n_depth, n_feat, n_bev, n_int = (torch.export.Dim(n) for n in ("n_depth", "n_feat", "n_bev", "n_int"))
    shapes = (None, None, {0: n_depth}, {0: n_feat}, {0: n_bev}, {0: n_int}, {0: n_int})
    with pytest.warns(UserWarning, match=r"opbridge: dynamic_shapes narrowed to what the model needs "
                                         r"\(n_bev = n_depth; n_feat = n_depth\), as torch\.onnx\.export"):
        proto = bridge.export(_BevPool(), args, dynamic_shapes=shapes)
    assert [i.type.tensor_type.shape.dim[0].dim_param for i in proto.graph.input[2:]] == ["n_depth"] * 3 + ["n_int"] * 2
    other = random_case(seed=4)
    assert other[2].numel() != rd.numel()
    torch.testing.assert_close(torch.from_numpy(bridge.parity.run_ort(bridge.session(proto.SerializeToString()),
                                                                      other[:5] + other[6:])[0]),
                               _BevPool()(*other[:5], *other[6:]))


class _Halves(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 3).reshape(x.shape[0] // 2, 2, -1).sum(1)


class _ScoreBoxes(torch.nn.Module):
    def forward(self, boxes, scores):
        return torch.ops.opbridge.identity_conv(boxes, 3) * scores[:, None, None, None]


class _Small(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[0] >= 8 else x


def _dims(proto: onnx.ModelProto) -> list[list]:
    return [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input]


@pytest.mark.parametrize("model, args, axes", [
    # names that must be one size (boxes and their scores), a size the code needs even, a least size (a branch)
    (_ScoreBoxes(), (torch.randn(5, 3, 2, 2), torch.randn(5)),
     {"boxes": {0: "num_boxes"}, "scores": {0: "num_scores"}}),
    (_Halves(), (torch.randn(6, 3, 2, 2),), {"x": {0: "batch"}}),
    (_Small(), (torch.randn(9),), {"x": {0: "n"}}),
], ids=["equal", "even", "least"])
def test_a_deploy_scripts_dynamic_axes_the_model_narrows_export_as_torch_onnx_exports_them(model, args, axes):
    """torch.onnx.export(dynamo=True) exports these deploy-script calls, narrowing the dims to what the model's
    code needs; bridge.export exports the same dims (names and all), warns which, and eager agrees on another size
    inside them."""
    names = list(axes)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.onnx.export(model, args, input_names=names, dynamic_axes=axes, dynamo=True,
                                   custom_translation_table=translation_table(bridge.REGISTRY)).model_proto
    with pytest.warns(UserWarning, match="dynamic_shapes narrowed to what the model needs"):
        ours = bridge.export(model, args, input_names=names, dynamic_axes=axes)
    assert _dims(ours) == _dims(theirs)
    bigger = tuple(torch.cat([a, a]) for a in args)
    sess = bridge.session(ours.SerializeToString())
    torch.testing.assert_close(torch.from_numpy(bridge.parity.run_ort(sess, bigger)[0]), model(*bigger))


def test_a_dim_the_model_fixes_stays_refused_not_narrowed_to_static():
    """torch.export's fix for a size the model fixes (len() of a dynamic input) is that size: applied, the file would
    not take another; refused with the violation, no warning."""
    class Lead(torch.nn.Module):
        def forward(self, x, boxes):
            return x[: len(boxes)] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: no narrowing warning on the way to the refusal
        with pytest.raises(bridge.OpBridgeError, match=r"dimension 0 of input 'boxes' \(Dim n\) dynamic: the "
                                                       r"model's code fixes it to 4"):
            bridge.export(Lead(), (torch.ones(9), torch.ones(4, 5)), dynamic_shapes=(None, {0: torch.export.Dim("n")}))


POOL_INPUTS = ["depth", "feat", "ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths"]


def test_dynamic_axes_as_torch_onnx_export_takes_them():
    """A deploy script's call, swapped from torch.onnx.export: input_names and dynamic_axes with a name per axis.
    Inputs that share a name share one Dim; the file names each dim as given and runs other point counts."""
    depth, feat, rd, rf, rb, _, starts, lengths = random_case()
    axes = {"ranks_depth": {0: "n_points"}, "ranks_feat": {0: "n_points"}, "ranks_bev": {0: "n_points"},
            "interval_starts": {0: "n_intervals"}, "interval_lengths": {0: "n_intervals"}, "bev": {0: "batch"}}
    proto = bridge.export(_BevPool(), (depth, feat, rd, rf, rb, starts, lengths), input_names=POOL_INPUTS,
                          output_names=["bev"], dynamic_axes=axes)
    assert [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in proto.graph.input][2:] \
        == [(n, [a[0]]) for n, a in ((k, list(axes[k].values())) for k in POOL_INPUTS[2:])]
    other = random_case(seed=4)
    args = other[:5] + other[6:]
    sess = bridge.session(proto.SerializeToString())
    torch.testing.assert_close(torch.from_numpy(bridge.parity.run_ort(sess, args)[0]), _BevPool()(*args))


class _Scale(torch.nn.Module):
    def forward(self, x, y, k: int = 2):
        return x * y.mean() * k


class _Pair(torch.nn.Module):
    def forward(self, x, y):
        return x[0] * x[1] * y.mean()


def test_dynamic_axes_in_list_form_and_their_errors():
    """{input: [axes]} names each axis as the TorchScript exporter did; parameter names serve without input_names;
    a name that is no input, an axis out of range, a name no Dim takes, an argument holding several tensors (the
    names by position would shift past it), both forms at once: each refused by name."""
    x, y = torch.randn(2, 3), torch.randn(4)
    proto = bridge.export(_Scale(), (x, y), dynamic_axes={"x": [0, 1], "y": {0: "m"}})
    assert [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in proto.graph.input] == \
        [["x_dynamic_axes_1", "x_dynamic_axes_2"], ["m"]]
    with pytest.raises(bridge.OpBridgeError, match=r"dynamic_axes names 'z', which is no tensor input of the model\. "
                                                   r"Got inputs \['x', 'y'\]"):
        bridge.export(_Scale(), (x, y), dynamic_axes={"z": [0]})
    with pytest.raises(bridge.OpBridgeError, match=r"dynamic_axes\['x'\] must map axes of that 2-d input .* Got 2: "):
        bridge.export(_Scale(), (x, y), dynamic_axes={"x": [2]})
    with pytest.raises(bridge.OpBridgeError, match=r"Got 0: 'batch size'"):
        bridge.export(_Scale(), (x, y), dynamic_axes={"x": {0: "batch size"}})
    with pytest.raises(bridge.OpBridgeError, match=r"Got \['x'\] holding several .* Pass dynamic_shapes= instead"):
        bridge.export(_Pair(), ([x, x], y), input_names=["x0", "x1", "y"], dynamic_axes={"y": [0]})
    with pytest.raises(bridge.OpBridgeError, match="dynamic_axes and dynamic_shapes both given"):
        bridge.export(_Scale(), (x, y), dynamic_axes={"x": [0]}, dynamic_shapes=({0: torch.export.Dim("b")}, None))


@pytest.mark.parametrize("shapes, match", [
    (({0: "n"},), r"dynamic_shapes must match the call's 2 argument\(s\) \['x', 'y'\]\. Got tuple"),
    (({0: "n"}, None, None), r"must match the call's 2 argument\(s\)"),
    ({"x": {0: "n"}}, r"dynamic_shapes, a dict, must name each argument of the call \['x', 'y'\] .* Got keys \['x'\]"),
    ({"x": {0: "n"}, "z": None}, r"Got keys \['x', 'z'\]"),
    (({2: "n"}, None), r"marks dim\(s\) \[2\] of input 'x', a 2-d tensor of shape \(2, 3\)\. .* from 0 to 1"),
    (({-1: "n"}, None), r"marks dim\(s\) \[-1\] of input 'x'"),
    (({"rows": "n"}, None), r"marks dim\(s\) \['rows'\] of input 'x'"),
    (([torch.export.Dim("n")], None), r"dynamic_shapes does not fit the call\. Got torch\.export's: Expected dynamic "
                                      r"shape spec"),
], ids=["too-few", "too-many", "dict-missing", "dict-unknown", "dim-out-of-range", "negative-dim", "text-dim",
        "list-too-short"])
def test_dynamic_shapes_that_do_not_fit_the_call_are_named(shapes, match):
    """torch.export raised an IndexError ('list assignment index out of range') or TypeError deep inside for a dim
    the tensor lacks, reported as the model's own code failing; and its own structure messages raw."""
    shapes = _with_dims(shapes)
    with pytest.raises(bridge.OpBridgeError, match=match):
        bridge.export(_Scale(), (torch.randn(2, 3), torch.randn(4)), dynamic_shapes=shapes)


def _with_dims(shapes):
    """Strings in a test's table stand for one Dim of that name (torch.export takes Dim objects)."""
    dim = torch.export.Dim("n")
    swap = lambda spec: {k: dim if v == "n" else v for k, v in spec.items()} if isinstance(spec, dict) else spec  # noqa: E731
    return {k: swap(v) for k, v in shapes.items()} if isinstance(shapes, dict) else tuple(swap(s) for s in shapes)


def test_bad_attribute_value_fails_at_export_with_the_op_message():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.identity_conv(x, 5)

    with pytest.raises(ValueError, match="channels=5"):
        bridge.export(M(), (torch.ones(1, 3, 2, 2),))


class _SinLocal(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        torch.ops.opbridge.numpy_sin(x, out)
        return out * 2 + x  # reads the mutated tensor afterwards


class _SinBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(2, 3))

    def forward(self, x):
        torch.ops.opbridge.numpy_sin(x, self.state)
        return self.state + 1, torch.relu(self.state)


class _SinInput(torch.nn.Module):
    def forward(self, x, y):
        torch.ops.opbridge.numpy_sin(x, y)
        return y * 3


@pytest.mark.parametrize("tier", ["function", "native"])
@pytest.mark.parametrize("model,args", [
    (_SinLocal(), (torch.randn(2, 3),)),
    (_SinBuffer(), (torch.randn(2, 3),)),
    (_SinInput(), (torch.randn(2, 3), torch.zeros(2, 3))),
], ids=["local", "buffer", "user_input"])
def test_mutating_op_exports_through_its_functional_twin(model, args, tier):
    report = bridge.check_parity(model, args, tier=tier)
    assert report.passed, report
    proto = bridge.export(model, args)
    sin_nodes = [n for n in proto.graph.node if n.op_type == "numpy_sin"]
    assert len(sin_nodes) == 1 and sin_nodes[0].domain == "opbridge" and len(sin_nodes[0].input) == 2


def test_mutating_a_view_is_a_clear_error():
    class M(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros(4, 3)
            torch.ops.opbridge.numpy_sin(x, out[1:3])
            return out

    with pytest.raises(bridge.OpBridgeError, match="'output' is a view of another tensor"):
        bridge.export(M(), (torch.randn(2, 3),))


def test_export_without_functions_then_session_attaches_them(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.crop(x, [0, 0, 2, 2])

    path = tmp_path / "m.onnx"
    proto = bridge.export(M(), (torch.ones(1, 3, 3),), path, functions=False)
    assert len(proto.functions) == 0
    sess = bridge.session(path)
    assert sess.run(None, {"x": np.ones((1, 3, 3), np.float32)})[0].shape == (1, 2, 2)


def test_session_without_function_body_names_the_op(bare_op_model, registry):
    name, path = bare_op_model
    with pytest.raises(bridge.UnsupportedInTier, match=f"{name}.*function= body"):
        bridge.session(path, registry=registry)


@pytest.mark.parametrize("content,match", [(None, "no ONNX file"), (b"\x08\x07garbage" * 3, "not a readable ONNX")])
def test_session_missing_or_corrupt_file(tmp_path, content, match):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(bridge.OpBridgeError, match=match):
        bridge.session(path)


def test_unknown_tier_is_an_error(demo_export):
    with pytest.raises(bridge.OpBridgeError, match="unknown kernel tier"):
        bridge.session(demo_export[1], tier="gpu")


def test_ort_error_on_bad_indices_is_an_exception_not_a_crash(demo_export):
    case, path, _ = demo_export
    sess = bridge.session(path)
    args = list(case.args)
    args[1] = args[1].clone().fill_(10**8)  # ranks_depth far outside depth
    # the function body's guard stops onnxruntime; the session words it as the op's eager check does
    with pytest.raises(bridge.OpBridgeError, match=r"bev::bev_pool_v2: input 'ranks_depth' values must lie in \[0, "):
        bridge.parity.run_ort(sess, args)


@pytest.mark.parametrize("tier", TIERS)
def test_session_does_not_modify_the_callers_model(tier):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.crop(x, [0, 0, 2, 2])

    proto = bridge.export(M(), (torch.ones(1, 3, 3),))
    before = proto.SerializeToString()
    bridge.session(proto, tier=tier)
    assert proto.SerializeToString() == before


@pytest.mark.parametrize("tier", TIERS)
def test_session_on_a_model_with_external_data(tmp_path, tier):
    case = demo.build()
    proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    path = tmp_path / "ext.onnx"
    onnx.save_model(proto, path, save_as_external_data=True, location="ext.onnx.data", size_threshold=1024)
    assert (tmp_path / "ext.onnx.data").stat().st_size > 1000
    sess = bridge.session(path, tier=tier)
    got = bridge.parity.run_ort(sess, case.args)[0]
    with torch.no_grad():
        assert bridge.compare("out", case.model(*case.args), got).passed


def test_onnx_translation_with_a_table_built_once_equals_torch_onnx_export():
    """to_onnx reuses torch.onnx's table of ATen translations across exports; the file is the one
    torch.onnx.export writes with the same translations (which builds the table anew)."""
    case = demo.build()
    program = torch.export.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes, strict=False)
    table = CACHE.onnx_registry(DEFAULT_OPSET)
    ours = to_onnx(program, bridge.REGISTRY, DEFAULT_OPSET).model_proto
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.onnx.export(program, dynamo=True, custom_translation_table=translation_table(bridge.REGISTRY),
                                   opset_version=DEFAULT_OPSET, optimize=True, verify=False,
                                   external_data=False).model_proto
    assert ours.SerializeToString() == theirs.SerializeToString()
    assert CACHE.onnx_registry(DEFAULT_OPSET) is table  # not built again


def test_with_translations_leaves_the_shared_table_as_it_was():
    table = CACHE.onnx_registry(DEFAULT_OPSET)
    relu = torch.ops.aten.relu.default
    before = list(table.functions[relu.name()])
    extended = torch_compat.with_translations(table, {relu: torch_compat.torchlib_translation("aten::relu")})
    assert table.functions[relu.name()] == before
    assert len(extended.functions[relu.name()]) == len(before) + 1


def test_an_op_defined_after_the_table_was_built_gets_its_translation():
    """torch.onnx fills its table with the ops that exist when it is built: an op torch_lib translates
    that is defined later (quantized_decomposed's, on import) makes the next export build it again.
    A fresh process: the ops must not exist yet."""
    script = textwrap.dedent("""
        import torch, bridge, custom_ops
        from exporters.export import to_onnx
        assert not hasattr(torch.ops.quantized_decomposed, "quantize_per_tensor")
        class Add(torch.nn.Module):
            def forward(self, x):
                return x + 1
        x = torch.rand(2, 3)
        to_onnx(torch.export.export(Add(), (x,)), bridge.REGISTRY, 20)
        import torch.ao.quantization.fx._decomposed  # defines the quantized_decomposed ops
        class Quant(torch.nn.Module):
            def forward(self, x):
                return torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, 0, 255, torch.uint8)
        proto = to_onnx(torch.export.export(Quant(), (x,)), bridge.REGISTRY, 20).model_proto
        print([n.op_type for n in proto.graph.node])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "['QuantizeLinear']"


class _Detector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, img):
        return torch.ops.opbridge.identity_conv(self.conv(img), 4).flatten(2).softmax(-1)


def _saved_inputs(path) -> list[tuple[str, list]]:
    return [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
            for i in onnx.load(path).graph.input]


@pytest.mark.parametrize("options", [
    # mmdet 2.x tools/deployment/pytorch2onnx.py: weights listed as inputs too
    {"export_params": True, "keep_initializers_as_inputs": True, "do_constant_folding": True, "verbose": False},
    # mmdeploy apis/onnx/export.py
    {"export_params": True, "keep_initializers_as_inputs": False, "verbose": False},
], ids=["mmdet2", "mmdeploy"])
def test_a_deploy_scripts_torch_onnx_export_call_passes_as_written(tmp_path, options):
    """The call as deploy scripts write it: one tensor as args, torch.onnx.export's own keywords. bridge.export
    writes a file with the inputs torch.onnx.export's file has (weights included where asked), batch 1 stays
    batch 1 (args never iterated into rows), and the file agrees with eager on another batch."""
    model, img = _Detector().eval(), torch.randn(1, 3, 8, 8)
    call = dict(input_names=["input"], output_names=["probs"], opset_version=17,
                dynamic_axes={"input": {0: "batch", 2: "height", 3: "width"}, "probs": {0: "batch"}}, **options)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, img, tmp_path / "theirs.onnx", dynamo=True,
                          custom_translation_table=translation_table(bridge.REGISTRY), **call)
        bridge.export(model, img, tmp_path / "ours.onnx", **call)
    ours, theirs = _saved_inputs(tmp_path / "ours.onnx"), _saved_inputs(tmp_path / "theirs.onnx")
    # NOTE: constants torch.onnx lifts (val_<n>, numbered per export) compared by count, the rest by name and shape
    assert [i for i in ours if not i[0].startswith("val_")] == [i for i in theirs if not i[0].startswith("val_")]
    assert len(ours) == len(theirs) == (1 + len(onnx.load(tmp_path / "ours.onnx").graph.initializer)
                                        if options["keep_initializers_as_inputs"] else 1)
    assert _saved_inputs(tmp_path / "ours.onnx")[0] == ("input", ["batch", 3, "height", "width"])
    other = torch.randn(2, 3, 6, 10)
    sess = bridge.session(str(tmp_path / "ours.onnx"))
    torch.testing.assert_close(torch.from_numpy(bridge.parity.run_ort(sess, other)[0]), model(other))


def test_one_tensor_as_args_is_one_argument_everywhere():
    """torch.onnx.export takes ``args`` as one tensor; so do export, check_parity and the sessions' feed. Before,
    tuple(x) made a batch of one an unbatched input (a [3, 8, 8] file for a [1, 3, 8, 8] call), and parity passed on
    the wrong shapes."""
    conv, x = torch.nn.Conv2d(3, 4, 3).eval(), torch.randn(1, 3, 8, 8)
    assert [d.dim_value for d in bridge.export(conv, x).graph.input[0].type.tensor_type.shape.dim] == [1, 3, 8, 8]
    report = bridge.check_parity(conv, x)
    assert report.passed and report.outputs[0].shape == (1, 4, 6, 6)


@pytest.mark.parametrize("options, match", [
    ({"export_params": False}, r"export_params=False asks what bridge.export does not do: it writes the model's "
                               r"weights into the file\. Got False\. Drop export_params="),
    ({"dynamo": False}, r"dynamo=False asks .* it exports with torch.export"),
    ({"verify": True}, r"verify=True asks .* bridge\.check_parity"),
    ({"opset": 17}, r"unexpected keyword argument 'opset'\. Got opset=17\. .*opset_version|torch\.onnx\.export's"),
])
def test_torch_onnx_keywords_asking_for_what_export_does_not_do_are_refused(options, match):
    with pytest.raises(bridge.OpBridgeError, match=match):
        bridge.export(torch.nn.ReLU(), (torch.randn(2),), **options)


class _ChannelSliceReshaped(torch.nn.Module):
    """mmcv's BorderAlign layer shape: a channel slice reshaped by the batch size (b, 2, 30)."""

    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x[:, 2:4].reshape(x.shape[0], 2, 30, 1), 2) * 2


def test_a_guard_on_a_dynamic_batch_is_a_runtime_assert_as_torch_onnx_has_it():
    """Before: 'could not keep dimension 0 ... dynamic: the model's code restricts it (... L['x'].size()[0] != 1)':
    torch.export under backed_size_oblivious guards the batch against 1 where torch.onnx.export(dynamo=True) (its
    prefer_deferred_runtime_asserts_over_guards) keeps it dynamic."""
    b = torch.export.Dim("b")
    proto = bridge.export(_ChannelSliceReshaped(), (torch.randn(2, 8, 5, 6),), dynamic_shapes=({0: b},))
    assert [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == ["b", 8, 5, 6]
    sess = bridge.session(proto)
    for n in (1, 3):
        x = torch.randn(n, 8, 5, 6)
        np.testing.assert_array_equal(sess.run(None, {"x": x.numpy()})[0], _ChannelSliceReshaped()(x).numpy())
    bridge.assert_parity(_ChannelSliceReshaped(), (torch.randn(3, 8, 5, 6),), dynamic_shapes=({0: b},))
