"""Bodies derived from an op's PyTorch implementation (exporters/derive/): ops with no ONNX code."""

import contextlib
import dataclasses
import os
from pathlib import Path

import forkserver
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

import bridge
from bridge.tools.testing import OpModule, cases
from exporters import derive, kinds
from exporters.derive import contained
from exporters.derive import verify as derive_verify
from exporters.kinds import body_kind
from ort_kernels.tiers import TIERS
from tests.models import HeldOut, crop_in_a_branch, held_out_ops
from tests.vendor import plain_ops

ROOT = Path(__file__).resolve().parents[1]


def _run_plain_ort(path, feeds):
    """Plain onnxruntime, no opbridge: the file must carry everything."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return [sess.run(None, dict(zip(names, (t.numpy() for t in feed)))) for feed in feeds]


def _run_plain_ort_proto(proto, feed):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), feed)})[0]


def _assert_matches(model, feeds, results, **tol):
    with torch.no_grad():
        for feed, got in zip(feeds, results):
            expected = model(*feed)
            expected = expected if isinstance(expected, tuple) else (expected,)
            for e, g in zip(expected, got):
                np.testing.assert_allclose(g, e.numpy(), **tol)


def _no_racy_scatter(proto):
    return not any(n.op_type == "ScatterND" and any(a.name == "reduction" and a.s != b"none" for a in n.attribute)
                   for f in proto.functions for n in f.node)


@pytest.fixture
def without_written_body():
    """Strip a registered op's written body for one test (the registry swaps records back after)."""
    kept = []

    def strip(qualname):
        spec = bridge.REGISTRY.get(qualname)
        kept.append(spec)
        bridge.REGISTRY.replace(dataclasses.replace(spec, function=None))
        return bridge.REGISTRY.get(qualname)

    yield strip
    for spec in kept:
        bridge.REGISTRY.replace(spec)


def test_plain_torch_op_without_function_exports_and_runs_in_plain_ort_at_two_sizes(registry, fresh_name, tmp_path):
    name = fresh_name("window_mix")

    @bridge.op(name, fake=lambda x, index, k, gain, window: torch.empty_like(x), registry=registry)
    def window_mix(x: torch.Tensor, index: torch.Tensor, k: int, gain: float, window: list[int]) -> torch.Tensor:
        lo, hi = window
        scores = (x[:, lo:x.shape[1] - hi] * gain).exp().sum(-1, keepdim=True)   # elementwise + reduction
        picked = torch.zeros_like(x).index_add_(0, index, x.index_select(0, index) * k)  # indexing
        return picked / scores

    class M(torch.nn.Module):
        def forward(self, x, index):
            return window_mix(x, index, 3, 0.5, [1, 2])

    g = torch.Generator().manual_seed(0)
    feeds = [(torch.randn(6, 9, generator=g), torch.tensor([0, 2, 2, 5, 2, 0, 1, 1, 3, 2])),
             (torch.randn(11, 13, generator=g), torch.tensor([10, 4, 4, 4]))]
    path = tmp_path / "m.onnx"
    proto = bridge.export(M(), feeds[0], path, registry=registry,
                          dynamic_shapes=({0: Dim("n"), 1: Dim("c")}, {0: Dim("m")}))
    body = next(f for f in proto.functions if f.name == "window_mix")
    assert "derived by opbridge" in body.doc_string
    assert list(body.input) == ["x", "index"] and set(body.attribute) == {"k", "window"}  # ints stay attributes
    assert _no_racy_scatter(proto)  # index_add became ScatterElements
    results = _run_plain_ort(path, feeds)
    _assert_matches(M(), feeds, results, rtol=1e-5, atol=1e-6)
    # duplicate indices accumulate in one order: the same bits on every run
    again = [_run_plain_ort(path, feeds[:1])[0][0] for _ in range(5)]
    assert all(np.array_equal(a, results[0][0]) for a in again)


def test_derived_scatter_of_two_index_columns_with_negative_indices(registry, fresh_name, tmp_path):
    name = fresh_name("grid_add")

    @bridge.op(name, fake=lambda grid, rows, cols, values: torch.empty_like(grid), registry=registry)
    def grid_add(grid: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return grid.index_put((rows, cols), values, accumulate=True)

    class M(torch.nn.Module):
        def forward(self, grid, rows, cols, values):
            return grid_add(grid, rows, cols, values)

    feeds = [(torch.randn(4, 5, 3), torch.tensor([0, -1, 3, 0]), torch.tensor([1, 1, -5, 1]), torch.randn(4, 3)),
             (torch.randn(7, 6, 3), torch.tensor([6, 6, -7]), torch.tensor([0, 0, 5]), torch.randn(3, 3))]
    path = tmp_path / "g.onnx"
    proto = bridge.export(M(), feeds[0], path, registry=registry, dynamic_shapes=(
        {0: Dim("h"), 1: Dim("w")}, {0: Dim("p")}, {0: Dim("p")}, {0: Dim("p")}))
    assert _no_racy_scatter(proto)
    _assert_matches(M(), feeds, _run_plain_ort(path, feeds), rtol=1e-5, atol=1e-6)


def test_op_registered_from_a_plain_torch_package_with_nothing_else(registry, tmp_path):
    bridge.register(plain_ops.gated_pool, registry=registry)  # no function=, reference nor samples

    class M(torch.nn.Module):
        def forward(self, x, index):
            return torch.ops.vendor_plain.gated_pool(x, index, 2, 1.5, [2, 1])

    g = torch.Generator().manual_seed(1)
    feeds = [(torch.randn(5, 8, generator=g), torch.tensor([4, 0, 0, 3])),
             (torch.randn(12, 6, generator=g), torch.tensor([1, 11, 11, 11, 0, 7, 3]))]
    path = tmp_path / "vendor.onnx"
    proto = bridge.export(M(), feeds[0], path, registry=registry,
                          dynamic_shapes=({0: Dim("n"), 1: Dim("c")}, {0: Dim("m")}))
    assert [(f.domain, f.name) for f in proto.functions] == [("vendor_plain", "gated_pool")]
    _assert_matches(M(), feeds, _run_plain_ort(path, feeds), rtol=1e-5, atol=1e-6)


def test_composite_kernel_of_an_op_defined_elsewhere_is_its_body(registry):
    # NOTE: torch.export decomposes such an op inside models by itself; its own body comes from the
    # same decomposition (what `opbridge ops` and --show-body use)
    op = bridge.register("vendor_plain::soft_clip", registry=registry,
                         sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(3, 4).to(dtype), 0.5))])
    assert body_kind(op.spec).status(registry=registry) == ("derived", None)
    assert "Tanh" in body_kind(op.spec).show(registry=registry)


def test_a_derived_body_serves_a_node_inside_a_branch(without_written_body, tmp_path):
    """opbridge::crop without its written body, called inside an If branch: the function tier
    derives its body there as in the main graph (it refused, saying none could be derived), and
    plain onnxruntime runs the file it attaches."""
    without_written_body("opbridge::crop")
    model = crop_in_a_branch([1, 0, 3, 2])
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert bridge.attach_functions(model) == ["opbridge::crop"]
    path = tmp_path / "branch.onnx"
    onnx.save(model, path)
    for cond, expected in ((True, x[0:2, 1:3]), (False, x)):
        feed = {"cond": np.array(cond), "x": x}
        np.testing.assert_array_equal(ort.InferenceSession(str(path)).run(None, feed)[0], expected)
        got = bridge.session(crop_in_a_branch([1, 0, 3, 2]), tier="function").run(None, feed)[0]
        np.testing.assert_array_equal(got, expected)


def test_numpy_op_has_no_portable_body_and_still_runs_native(without_written_body, tmp_path):
    spec = without_written_body("opbridge::numpy_sin")
    twin = bridge.REGISTRY.functional(spec)
    kind, reason = body_kind(twin).status()
    assert kind == "none" and ".numpy()" in reason and "\n" not in reason
    assert "no portable body" in TIERS["function"].why_not(twin)

    class M(torch.nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            torch.ops.opbridge.numpy_sin(x, out)
            return out

    x = torch.randn(3, 4)
    path = tmp_path / "np.onnx"
    proto = bridge.export(M(), (x,), path)  # export still works: no body attached
    assert not proto.functions
    with pytest.raises(bridge.UnsupportedInTier, match=r"opbridge::numpy_sin: tracing its implementation failed "
                                                       r"\(RuntimeError: \.numpy\(\)"):
        bridge.session(path)
    assert bridge.check_parity(M(), (x,), tier="native").passed


def _derived_cases():
    out = []
    for name in ("opbridge::crop", "opbridge::paste"):
        spec = bridge.REGISTRY.get(name)
        out += cases([spec], dtypes=(torch.float32,))
        out += [c for d in (torch.float16, torch.float64) for c in cases([spec], dtypes=(d,))[:1]]
    return out


DERIVED = _derived_cases()
ALL_SEED = cases([bridge.REGISTRY.get("opbridge::crop"), bridge.REGISTRY.get("opbridge::paste")])


def _derived_vs_written(case, strip):
    module, tensors = OpModule.from_sample(case.spec, case.sample)
    written = bridge.check_parity(module, tensors)
    assert written.passed, written
    strip(case.spec.qualname)
    module, tensors = OpModule.from_sample(bridge.REGISTRY.get(case.spec.qualname), case.sample)
    proto = bridge.export(module, tensors)
    assert all("derived by opbridge" in f.doc_string for f in proto.functions)
    derived = bridge.check_parity(module, tensors)
    assert derived.passed, derived
    assert all(o.max_abs == 0 for o in derived.outputs)  # crop and paste move values: exact


@pytest.mark.parametrize("case", DERIVED, ids=[c.id for c in DERIVED])
def test_crop_and_paste_with_derived_and_written_bodies_match_eager(case, without_written_body):
    _derived_vs_written(case, without_written_body)


@pytest.mark.slow
@pytest.mark.parametrize("case", ALL_SEED, ids=[c.id for c in ALL_SEED])
def test_crop_and_paste_derived_over_every_sample_and_dtype(case, without_written_body):
    _derived_vs_written(case, without_written_body)


def test_crop_derived_at_a_dynamic_size_serves_other_sizes(without_written_body, tmp_path):
    without_written_body("opbridge::crop")
    proto = _two_crops_at_dynamic_sizes(tmp_path, seed=2, boxes=([2, 2, 5, 4], [3, 2, 6, 5]))
    assert [list(f.attribute) for f in proto.functions] == [["box"]]  # one body, box read from each node
    # NOTE: a 0 or 1 in a box: crop's max(top, 0) stays a Max through torch.onnx's second trace (builtins as
    # torch.export has them), so the one body serves these sites too, checked against eager at two sizes above
    proto = _two_crops_at_dynamic_sizes(tmp_path, seed=2, boxes=([1, 2, 5, 4], [2, 0, 4, 3]))
    assert [list(f.attribute) for f in proto.functions] == [["box"]]


class _TwoCrops(torch.nn.Module):
    def __init__(self, boxes):
        super().__init__()
        self.boxes = boxes

    def forward(self, img):
        return torch.ops.opbridge.crop(img, self.boxes[0]), torch.ops.opbridge.crop(img, self.boxes[1])


def _two_crops_at_dynamic_sizes(tmp_path, seed: int, boxes) -> onnx.ModelProto:
    """Two crop sites exported with every dim dynamic, run in plain onnxruntime at two sizes against eager."""
    g = torch.Generator().manual_seed(seed)
    feeds = [(torch.randn(3, 7, 8, generator=g),), (torch.randn(2, 9, 11, generator=g),)]
    path = tmp_path / "crop.onnx"
    proto = bridge.export(_TwoCrops(boxes), feeds[0], path,
                          dynamic_shapes=({0: Dim("n"), 1: Dim("h"), 2: Dim("w")},))
    _assert_matches(_TwoCrops(boxes), feeds, _run_plain_ort(path, feeds), rtol=0, atol=0)
    return proto


def test_equal_bodies_derived_twice_are_attached_once(without_written_body, monkeypatch, tmp_path):
    # NOTE: what torch 2.14 did: each site's body derived anew (no earlier body deemed to fit) gave
    # two equal bodies, attached as two functions with one overload id, which onnx.checker refuses
    without_written_body("opbridge::crop")
    derive_once = kinds.derive
    monkeypatch.setattr(kinds, "derive", lambda *a, **k: dataclasses.replace(derive_once(*a, **k)))  # a new object each
    proto = _two_crops_at_dynamic_sizes(tmp_path, seed=3, boxes=([2, 2, 5, 4], [3, 2, 6, 5]))
    assert [(f.name, f.overload, list(f.attribute)) for f in proto.functions] == [("crop", "", ["box"])]
    assert all(n.overload == "" for n in proto.graph.node if n.domain == "opbridge")


def test_a_changed_registry_never_serves_an_earlier_body(registry, fresh_name):
    name = fresh_name("halve")

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry)
    def halve(x: torch.Tensor) -> torch.Tensor:
        return x / 2

    spec = registry.get(name)
    site = derive.Site((derive.TensorSig(torch.float32, ("n", 4)),), ())
    first = derive.derive(spec, site, registry=registry)
    assert derive.derive(spec, site, registry=registry) is first  # one generation: the body is kept
    registry.replace(dataclasses.replace(spec, doc="changed"))  # any change is a new generation
    again = derive.derive(registry.get(name), site, registry=registry)
    assert again is not first and again.proto.SerializeToString() == first.proto.SerializeToString()
    assert derive.derive(spec, site, registry=registry) is not first  # the old spec too: nothing stale


ALIASING = {"itself": (lambda x: x, lambda x: torch.empty_like(x)),
            "a view": (lambda x: x.view(-1), lambda x: x.new_empty(x.numel())),
            "a slice": (lambda x: x[1:], lambda x: x.new_empty(x.shape[0] - 1, *x.shape[1:]))}


@pytest.mark.parametrize("returns", list(ALIASING))
def test_op_returning_its_input_or_a_view_of_it_is_a_clear_error(registry, fresh_name, returns):
    name = fresh_name("alias")
    body, fake = ALIASING[returns]

    @bridge.op(name, fake=fake, registry=registry)
    def alias(x: torch.Tensor) -> torch.Tensor:
        return body(x)

    class M(torch.nn.Module):
        def forward(self, x):
            return alias(x) * 2

    with pytest.raises(RuntimeError, match="may not alias any inputs"):
        alias(torch.randn(3, 4))  # what torch says when the op runs
    message = (rf"opbridge: {name}: its implementation returns its input 'x' \(or a view of it\) as output 0, "
               r"and a custom op's outputs may not alias its inputs .*Return a copy instead \(e\.g\. x\.clone\(\)\)")
    with pytest.raises(bridge.OpBridgeError, match=message):
        bridge.export(M(), (torch.randn(3, 4),), registry=registry)
    site = derive.Site((derive.TensorSig(torch.float32, ("n", 4)),), ())
    with pytest.raises(bridge.OpBridgeError, match=message):
        derive.derive(registry.get(name), site, registry=registry)


def test_op_returning_a_copy_of_its_input_gets_a_body(registry, fresh_name, tmp_path):
    name = fresh_name("copy")

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry)
    def copy(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    class M(torch.nn.Module):
        def forward(self, x):
            return copy(x) * 2

    x = torch.randn(3, 4)
    proto = bridge.export(M(), (x,), tmp_path / "c.onnx", registry=registry)
    assert [f.name for f in proto.functions] == ["copy"]
    _assert_matches(M(), [(x,)], _run_plain_ort(tmp_path / "c.onnx", [(x,)]), rtol=0, atol=0)


def test_body_keyed_by_baked_values_gets_one_overload_each(registry, fresh_name, tmp_path):
    name = fresh_name("scale")

    @bridge.op(name, fake=lambda x, s: torch.empty_like(x), registry=registry)
    def scale(x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s

    class M(torch.nn.Module):
        def forward(self, x):
            return scale(x, 2.0) + scale(x, 0.25) + scale(x, 2.0)

    x = torch.randn(4)
    proto = bridge.export(M(), (x,), tmp_path / "s.onnx", registry=registry)
    overloads = sorted(f.overload for f in proto.functions)
    assert len(overloads) == 2 and all(o.startswith("derived_") for o in overloads)
    assert bridge.check_parity(M(), (x,), registry=registry).passed


def test_cli_shows_body_kind_and_the_body():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = forkserver.run(["-m", "bridge", "ops", "--show-body", "opbridge::crop"],
                       env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# opbridge::crop: written body") and "crop <box>(img) =>" in r.stdout
    onnx.parser.parse_function(r.stdout.split("\n", 1)[1])  # the onnx.printer text parses back


@pytest.mark.long
def test_cli_names_the_op_without_portable_body_and_why(tmp_path):
    (tmp_path / "np_ops.py").write_text(
        "import dataclasses, torch, bridge\n"
        "spec = bridge.REGISTRY.get('opbridge::numpy_sin')\n"
        "bridge.REGISTRY.replace(dataclasses.replace(spec, function=None))\n"
        "@bridge.op('np_cli::halve', fake=lambda x: torch.empty_like(x), reference=lambda x: x / 2,\n"
        "           sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(3, 4).to(dtype),))])\n"
        "def halve(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x / 2\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))

    def run(*args):
        return forkserver.run(["-m", "bridge", "-q", "--ops", "np_ops", *args], env=env, cwd=tmp_path, timeout=600)

    r = run("ops", "--bodies")  # NOTE: a plain `ops` lists without deriving
    assert r.returncode == 0, r.stderr
    assert ("note: opbridge::numpy_sin has no portable body (function tier): tracing its implementation failed "
            "(RuntimeError: .numpy() is not supported") in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("np_cli::halve"))
    assert " derived " in row
    r = run("ops", "--show-body", "np_cli::halve")
    assert r.returncode == 0 and "derived from its implementation at float32[3,4]" in r.stdout, r.stderr
    r = run("check", "--op", "opbridge::numpy_sin")
    assert r.returncode == 2 and "tier 'function' cannot run opbridge::numpy_sin: no portable body" in r.stderr
    assert ".numpy()" in r.stderr and "Traceback" not in r.stderr
    r = run("check", "--op", "opbridge::numpy_sin", "--tier", "native")
    assert r.returncode == 0 and "0 failed" in r.stdout, r.stdout + r.stderr


def _held_out_outputs(model, x, got):
    """Each output of the held-out model equals eager bit for bit (infinities' signs and NaN too)."""
    with torch.no_grad():
        expected = model(x)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(np.signbit(g), np.signbit(e.numpy()))
        np.testing.assert_array_equal(g, e.numpy())


@pytest.mark.parametrize("tier", ("function", "python"))
def test_a_derived_body_serves_only_the_attribute_values_it_was_derived_for(registry, fresh_name, tmp_path, tier):
    # NOTE: held-out probes: the body traced with k=4 symbolic was reused for k=-5 (-2 where eager
    # gives -3: ONNX's Div truncates), and the s=0.0 body for s=-0.0 (0.0 == -0.0 in a key)
    model = HeldOut(*held_out_ops(registry, fresh_name))
    x = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])
    path = tmp_path / "held_out.onnx"
    bridge.export(model, (x,), path, registry=registry)
    _held_out_outputs(model, x, _run_plain_ort(path, [(x,)])[0])
    sess = bridge.session(path, tier=tier, registry=registry)
    _held_out_outputs(model, x, sess.run(None, {sess.get_inputs()[0].name: x.numpy()}))


def test_later_sites_at_other_values_never_take_an_earlier_body(registry, fresh_name, tmp_path):
    floor_half, divide = held_out_ops(registry, fresh_name)
    x = torch.tensor([3.0, -7.0])
    for values in ((4, 0.0), (-5, -0.0), (-5, 0.0), (4, -0.0)):  # one export each: the cache outlives them

        class M(torch.nn.Module):
            def forward(self, x, k=values[0], s=values[1]):
                return floor_half(x, k), divide(x, s)

        path = tmp_path / "one.onnx"
        bridge.export(M(), (x,), path, registry=registry)
        got = _run_plain_ort(path, [(x,)])[0]
        with torch.no_grad():
            for e, g in zip(M()(x), got):
                np.testing.assert_array_equal(np.signbit(g), np.signbit(e.numpy()))
                np.testing.assert_array_equal(g, e.numpy())


def test_equal_derived_bodies_of_two_values_are_one_function(registry, fresh_name, tmp_path):
    floor_half, _ = held_out_ops(registry, fresh_name)

    class M(torch.nn.Module):
        def forward(self, x):
            return floor_half(x, 4) + floor_half(x, 6)  # both traced with k symbolic: the same program

    proto = bridge.export(M(), (torch.ones(3),), registry=registry)
    assert [(f.overload, list(f.attribute)) for f in proto.functions] == [("", ["k"])]


def test_a_function_tier_session_of_a_complete_file_traces_nothing(registry, fresh_name, tmp_path, monkeypatch):
    model = HeldOut(*held_out_ops(registry, fresh_name))
    x = torch.tensor([1.0, -2.0])
    path = tmp_path / "complete.onnx"
    bridge.export(model, (x,), path, registry=registry)

    def no_tracing(*args, **kwargs):
        raise AssertionError("a session traced a model")

    monkeypatch.setattr(torch.export, "export", no_tracing)
    monkeypatch.setattr(torch.onnx, "export", no_tracing)
    sess = bridge.session(path, tier="function", registry=registry)
    _held_out_outputs(model, x, sess.run(None, {sess.get_inputs()[0].name: x.numpy()}))


@pytest.mark.parametrize("tier", ("function", "python"))
def test_an_optional_int_called_with_none_gets_a_body_of_its_own(registry, fresh_name, tmp_path, tier):
    # NOTE: red team 4: `k: Optional[int] = 3` called with None died with a bare TypeError (int(None))
    name = fresh_name("optional_k")

    @bridge.op(name, fake=lambda x, k=3: torch.empty_like(x), registry=registry)
    def optional_k(x: torch.Tensor, k: int | None = 3) -> torch.Tensor:
        return x * (-2 if k is None else k)

    class M(torch.nn.Module):
        def forward(self, x):
            return optional_k(x, None), optional_k(x, 5), optional_k(x)

    x = torch.randn(3, 4)
    path = tmp_path / "optional.onnx"
    bridge.export(M(), (x,), path, registry=registry)
    _assert_matches(M(), [(x,)], _run_plain_ort(path, [(x,)]), rtol=0, atol=0)
    sess = bridge.session(path, tier=tier, registry=registry)
    _assert_matches(M(), [(x,)], [sess.run(None, {sess.get_inputs()[0].name: x.numpy()})], rtol=0, atol=0)
    site = derive.Site((derive.TensorSig(torch.float32, ("n", 4)),), (("k", None),))
    assert derive.derive(registry.get(name), site, registry=registry).fixed == (("k", None),)


def test_a_body_that_drops_an_empty_input_branch_is_refused(registry, fresh_name, tmp_path):
    # NOTE: red team 4: `if x.shape[0] == 0` was traced away (torch assumes dynamic sizes of 2 or more):
    # at 0 rows plain onnxruntime gave 1.0 where eager gives 8.0, while 4 and 1 rows agreed
    name = fresh_name("rows_or_eight")

    @bridge.op(name, fake=lambda x: x.new_empty(x.shape[1]), registry=registry)
    def rows_or_eight(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return x.new_full((x.shape[1],), 8.0)
        return x.sum(0) * 0 + 1

    site = derive.Site((derive.TensorSig(torch.float32, ("n", 3)),), ())
    with pytest.raises(derive.NoPortableBody, match=r"differs from eager at dynamic sizes \{'n': 0\}"):
        derive.derive(registry.get(name), site, registry=registry)

    class M(torch.nn.Module):
        def forward(self, x):
            return rows_or_eight(x)

    empty = torch.zeros(0, 3)
    path = tmp_path / "rows.onnx"
    bridge.export(M(), (torch.randn(4, 3),), path, registry=registry, dynamic_shapes=({0: Dim("n")},))
    with pytest.raises(bridge.OpBridgeError, match=r"differs from eager at dynamic sizes \{'n': 0\}"):
        bridge.session(path, tier="function", registry=registry)
    sess = bridge.session(path, tier="python", registry=registry)
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: empty.numpy()})[0], np.full(3, 8.0))
    # NOTE: plain onnxruntime: the file holds no body for the op, so it refuses the file (never 1.0)
    assert not onnx.load(path).functions
    with pytest.raises(Exception, match="rows_or_eight"):
        _run_plain_ort(path, [(empty,)])


def _identity_bytes() -> bytes:
    value = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [value],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None])])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]).SerializeToString()


def test_the_contained_runner_reports_each_outcome_and_outlives_a_child_that_dies(monkeypatch):
    model, x = _identity_bytes(), np.array([1.0, -2.0], np.float32)
    runner = contained.Runner()
    (ok, bad) = runner.run(model, [{"x": x}, {"nope": x}])
    assert ok[0] == "ok" and np.array_equal(ok[1][0], x) and bad[0] == "error" and "nope" in bad[1]
    # NOTE: a child that dies on its first message, as onnxruntime dies on a body: each feed says how, and
    # each gets a child of its own
    monkeypatch.setattr(contained, "_CHILD", "import os, signal, sys; sys.stdin.buffer.read(1); "
                                             "os.kill(os.getpid(), signal.SIGSEGV)")
    assert contained.Runner().run(model, [{"x": x}, {"x": x}]) == [("crash", "SIGSEGV")] * 2
    assert runner.run(model, [{"x": x}])[0][0] == "ok"  # NOTE: the first runner's child lives on


def test_a_body_whose_size_check_cannot_run_is_refused(registry, fresh_name, monkeypatch):
    # NOTE: no child process to run the check at 0 and 1 rows in: the body is refused, not used unchecked
    name = fresh_name("twice")

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry)
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    monkeypatch.setattr(derive_verify, "RUNNER", contained.Runner())
    monkeypatch.setattr(contained.sys, "executable", "/nonexistent/python")
    site = derive.Site((derive.TensorSig(torch.float32, ("n", 3)),), ())
    with pytest.raises(derive.NoPortableBody, match=r"could not be checked at dynamic sizes \{'n': 0\}: no child "
                                                    r"process to run it in \(FileNotFoundError"):
        derive.derive(registry.get(name), site, registry=registry)
    monkeypatch.undo()
    monkeypatch.setattr(derive_verify, "RUNNER", contained.Runner())
    site = derive.Site((derive.TensorSig(torch.float32, ("m", 3)),), ())  # NOTE: another site: not the cached failure
    assert derive.derive(registry.get(name), site, registry=registry).proto.name == name.split("::")[1]


@pytest.mark.parametrize("k", [18, 40, 100])
def test_a_slice_by_an_int_attribute_keeps_its_slice_past_the_traced_size(registry, fresh_name, tmp_path, k):
    """x[:, :k] with the dim dynamic (mmdeploy's AscendBatchNMSOp keeps keep_topk boxes of many). Before: traced at
    a size below k, the slice was a no-op and the body dropped it: plain onnxruntime gave all 300 columns, eager k,
    no warning (k = 18: no body and no word). Traced past the int attributes now, and verified on both sides."""
    @bridge.op(fresh_name("first_k"), fake=lambda x, k: x[:, :k].clone(), registry=registry)
    def first_k(x: torch.Tensor, k: int) -> torch.Tensor:
        return x[:, :k] * 2

    class M(torch.nn.Module):
        def forward(self, x):
            return first_k(x, k) + 1

    path = tmp_path / "first_k.onnx"
    bridge.export(M(), (torch.randn(1, 300),), path, registry=registry, dynamic_shapes=({1: Dim("n")},))
    feeds = [(torch.randn(1, n),) for n in (300, 150, 7)]
    _assert_matches(M(), feeds, _run_plain_ort(path, feeds))


def test_a_body_holding_only_below_a_constant_in_the_code_is_refused_not_written(registry, fresh_name):
    """x[:, :40] with the 40 in the code: the trace at size 17 guards the dim to [2, 39]. Before: that body was
    written (no slice), and plain onnxruntime gave 300 columns where eager gives 40."""
    @bridge.op(fresh_name("first_40"), fake=lambda x: x[:, :40].clone(), registry=registry)
    def first_40(x: torch.Tensor) -> torch.Tensor:
        return x[:, :40] * 2

    class M(torch.nn.Module):
        def forward(self, x):
            return first_40(x) + 1

    args, dynamic = (torch.randn(1, 300),), ({1: Dim("n")},)
    assert not bridge.export(M(), args, registry=registry, dynamic_shapes=dynamic).functions
    with pytest.raises(bridge.OpBridgeError, match=r"its trace holds only for dim 1 of 'x' from 2 to 39 \(the "
                                                   r"implementation chose by that size"):
        bridge.assert_parity(M(), args, registry=registry, dynamic_shapes=dynamic)
    bridge.assert_parity(M(), args, registry=registry, dynamic_shapes=dynamic, tier="python")


def test_a_body_is_derived_with_the_models_static_sizes_where_a_general_trace_fails(registry, fresh_name):
    """mmcv's psa_mask stand-in computes `p % w` of a size; traced with every dim dynamic, torch.onnx cannot translate
    it (a TypeError on a symbolic size). Before: no body. The model's sizes are static: traced with them, the body
    is derived and plain onnxruntime equals eager."""
    @bridge.op(fresh_name("roll_left"), fake=lambda x: torch.empty_like(x), registry=registry)
    def roll_left(x: torch.Tensor) -> torch.Tensor:
        p = torch.arange(x.shape[-1])
        return x[..., (p + 1) % x.shape[-1]] * 2

    class M(torch.nn.Module):
        def forward(self, x):
            return roll_left(x) + 1

    args = (torch.randn(2, 3, 7),)
    proto = bridge.export(M(), args, registry=registry)
    assert [f.name for f in proto.functions] == [roll_left.spec.name]
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": args[0].numpy()})
    np.testing.assert_array_equal(got[0], M()(*args).numpy())



def test_a_trace_that_stops_on_a_data_dependent_branch_prints_no_graph(registry, fresh_name, capfd):
    """Before: torch.export printed the failed trace's partial FX graph to stderr (100-430 lines for mmdeploy's
    rotated NMS) during a successful export; now the export says one warning: the op has no body, and why."""
    name = fresh_name("keep_positive")

    @bridge.op(name, registry=registry)
    def keep_positive(x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        return x * 0 if kept.shape[0] == 0 else x * 2

    @keep_positive.register_fake
    def _(x):
        return torch.empty_like(x)

    class M(torch.nn.Module):
        def forward(self, x):
            return keep_positive(x) + 1

    with pytest.warns(UserWarning, match=rf"^opbridge: the file holds {name} without a function body: .* Got {name}: "
                      r"tracing its implementation failed"):
        proto = bridge.export(M(), (torch.randn(5),), registry=registry)
    assert not proto.functions
    err = capfd.readouterr().err
    assert "def forward(self" not in err and "GraphModule" not in err, err[:500]


def test_a_body_is_checked_only_at_sizes_the_models_dims_take(registry, fresh_name):
    """Before: each dynamic dim was also tried at 0 and 1, even where the user's Dim(min=2) rules them out; an
    align-corners pixel grid (mmcv's RotatedFeatureAlign, grid_sample: NaN at size 1 in eager) lost its body.
    Now the body is checked at the sizes the model takes; without a min, 1 is still tried and refuses it."""
    name = fresh_name("point_sample")

    @bridge.op(name, registry=registry)
    def point_sample(x: torch.Tensor, points: torch.Tensor, scale: float) -> torch.Tensor:
        h, w = x.shape[-2:]
        grid = torch.stack([points[..., 0] * scale / (w - 1) * 2 - 1, points[..., 1] * scale / (h - 1) * 2 - 1], -1)
        return torch.nn.functional.grid_sample(x, grid, align_corners=True)

    @point_sample.register_fake
    def _(x, points, scale):
        return x.new_empty(x.shape[0], x.shape[1], points.shape[1], points.shape[2])

    class M(torch.nn.Module):
        def forward(self, x, points):
            return point_sample(x, points, 0.5)

    def args(h, w):
        return torch.randn(1, 2, h, w), torch.rand(1, h, w, 2) * 2 * min(h, w)

    for least, bodies in ((2, 1), (0, 0)):
        h, w = Dim("H", min=least, max=64), Dim("W", min=least, max=64)
        dims = ({2: h, 3: w}, {1: h, 2: w})
        with pytest.warns(UserWarning) if not bodies else contextlib.nullcontext():
            proto = bridge.export(M(), args(6, 7), registry=registry, dynamic_shapes=dims)
        assert len(proto.functions) == bodies
        if bodies:
            for shape in ((6, 7), (9, 4)):
                feed = args(*shape)
                got = _run_plain_ort_proto(proto, feed)
                np.testing.assert_allclose(got, M()(*feed).numpy(), rtol=1e-5, atol=1e-5)
