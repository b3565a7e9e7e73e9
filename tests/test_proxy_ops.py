"""Ops torch cannot keep opaque by themselves, bridged through a proxy op (bridge.proxy): C++ ops with only a
CompositeImplicitAutograd kernel and ``_0``-style names (torch-scatter's way), and torchbind methods no op
stands for. The vendor library (tests/vendor/legacy_ops.py) knows nothing of opbridge."""

import json
import os
from pathlib import Path

import forkserver
import numpy as np
import onnx
import pytest
import torch
from onnxscript import opset20 as op
from onnxscript import script, values
from vendor import cpp_ops, legacy_ops

import bridge
from ort_kernels.tiers import TIERS

ROOT = Path(__file__).resolve().parents[1]
NAMES = {"_0": "src", "_1": "index", "_2": "dim", "_3": "out", "_4": "dim_size"}
TARGETS = 5  # fixed number of target nodes; the number of points is dynamic


def _out_shape(src, dim, out, dim_size):
    if out is not None:
        return list(out.shape)
    s = list(src.shape)
    # NOTE: without dim_size the size is index.max() + 1: data-dependent
    s[dim] = dim_size if dim_size is not None else torch.library.get_ctx().new_dynamic_size()
    return s


def fake_sum(src, index, dim, out, dim_size):
    return src.new_empty(_out_shape(src, dim, out, dim_size))


def fake_max(src, index, dim, out, dim_size):
    s = _out_shape(src, dim, out, dim_size)
    return src.new_empty(s), index.new_empty(s, dtype=torch.int64)


# NOTE: the bodies read neither `out` (they handle only an omitted out) and need dim_size given;
# the index broadcasts over src's trailing dims, as torch-scatter's does. Plain functions, scripted
# per domain by bodies(): the real torch-scatter's domain is torch_scatter.
def scatter_sum(src, index, out, dim: int, dim_size: int):
    shape = op.Shape(src)
    extra = op.Sub(op.Size(shape), op.Size(op.Shape(index)))
    ones = op.Expand(op.Constant(value_ints=[1]), op.Reshape(extra, op.Constant(value_ints=[1])))
    idx = op.Expand(op.Reshape(index, op.Concat(op.Shape(index), ones, axis=0)), shape)
    axis = op.Reshape(op.Constant(value_int=dim), op.Constant(value_ints=[1]))
    size = op.Reshape(op.Constant(value_int=dim_size), op.Constant(value_ints=[1]))
    zeros = op.Expand(op.CastLike(op.Constant(value_float=0.0), src), op.ScatterElements(shape, axis, size))
    return op.ScatterElements(zeros, idx, src, axis=dim, reduction="add")


def scatter_max(src, index, out, dim: int, dim_size: int):
    shape = op.Shape(src)
    rank = op.Reshape(op.Size(shape), op.Constant(value_ints=[1]))
    extra = op.Sub(op.Size(shape), op.Size(op.Shape(index)))
    ones = op.Expand(op.Constant(value_ints=[1]), op.Reshape(extra, op.Constant(value_ints=[1])))
    idx = op.Expand(op.Reshape(index, op.Concat(op.Shape(index), ones, axis=0)), shape)
    axis = op.Reshape(op.Constant(value_int=dim), op.Constant(value_ints=[1]))
    size = op.Reshape(op.Constant(value_int=dim_size), op.Constant(value_ints=[1]))
    out_shape = op.ScatterElements(shape, axis, size)
    lowest = op.Expand(op.CastLike(op.Constant(value_float=float("-inf")), src), out_shape)
    best = op.ScatterElements(lowest, idx, src, axis=dim, reduction="max")
    n = op.Gather(shape, op.Constant(value_int=dim))
    # position of each src element along dim, broadcast to src's shape
    pos_shape = op.ScatterElements(op.Expand(op.Constant(value_ints=[1]), rank), axis, op.Constant(value_ints=[-1]))
    pos = op.Expand(op.Reshape(op.Range(op.Constant(value_int=0), n, op.Constant(value_int=1)), pos_shape), shape)
    hit = op.Equal(src, op.GatherElements(best, idx, axis=dim))
    candidate = op.Where(hit, pos, op.Expand(n, shape))
    arg = op.ScatterElements(op.Expand(n, out_shape), idx, candidate, axis=dim, reduction="min")  # first argmax
    empty = op.Equal(arg, n)
    return op.Where(empty, op.CastLike(op.Constant(value_float=0.0), src), best), arg


def bodies(domain):
    """The onnxscript bodies of scatter_sum and scatter_max in ``domain``."""
    opset = values.Opset(domain, 1)
    return script(opset, default_opset=op)(scatter_sum), script(opset, default_opset=op)(scatter_max)


def bridge_scatter(registry=None, ns="legacy_scatter"):
    if ns == "legacy_scatter":
        legacy_ops.load()
    sum_body, max_body = bodies(ns)
    return (bridge.register(f"{ns}::scatter_sum", fake=fake_sum, function=sum_body, names=NAMES, registry=registry),
            bridge.register(f"{ns}::scatter_max", fake=fake_max, function=max_body, names=NAMES, registry=registry))


class Pool(torch.nn.Module):
    """Points (dynamic count) pooled into TARGETS nodes, as a GNN layer with torch-scatter does."""

    def forward(self, src, index):
        total = torch.ops.legacy_scatter.scatter_sum(src, index, 0, None, TARGETS)
        best, arg = torch.ops.legacy_scatter.scatter_max(src, index, 0, None, TARGETS)
        return total * 2 + best, arg


class Optionals(torch.nn.Module):
    """The optional arguments the other way round: out given, dim_size omitted."""

    def forward(self, src, index, out):
        return (torch.ops.legacy_scatter.scatter_sum(src, index, 0, out, None),
                torch.ops.legacy_scatter.scatter_sum(src, index, 0, None, None))


def reference(src, index, dim_size):
    """torch-scatter's semantics as a plain loop (dim 0, 1-D index): sums, max, first argmax, empty -> 0/N."""
    src, index = src.numpy(), index.numpy()
    n, f = src.shape
    total, best = np.zeros((dim_size, f), np.float32), np.zeros((dim_size, f), np.float32)
    arg = np.full((dim_size, f), n, np.int64)
    for i in range(n):
        for c in range(f):
            j = index[i]
            total[j, c] += src[i, c]
            if arg[j, c] == n or src[i, c] > best[j, c]:
                best[j, c], arg[j, c] = src[i, c], i
    return total * 2 + best, arg


def inputs(n, seed, targets=TARGETS - 1):
    g = torch.Generator().manual_seed(seed)
    # NOTE: rounded values make ties, so the first-argmax rule is tested; node TARGETS-1 stays empty
    return torch.randint(-3, 4, (n, 3), generator=g).float(), torch.randint(0, targets, (n,), generator=g)


DYNAMIC = ({0: torch.export.Dim("points")}, {0: torch.export.Dim("points")})


def test_composite_only_op_exports_as_one_node_in_its_own_domain(registry):
    sum_op, max_op = bridge_scatter(registry)
    assert [p.name for p in sum_op.spec.params] == ["src", "index", "dim", "out", "dim_size"]
    assert [(p.name, p.optional) for p in sum_op.spec.attributes] == [("dim", False), ("dim_size", True)]
    assert sum_op.spec.overload.namespace == "opbridge_proxy" and max_op.spec.num_outputs == 2
    proto = bridge.export(Pool(), inputs(9, 0), dynamic_shapes=DYNAMIC, registry=registry)
    custom = [(n.domain, n.op_type, list(n.input), {a.name: a.i for a in n.attribute})
              for n in proto.graph.node if n.domain]
    assert custom == [("legacy_scatter", "scatter_sum", ["src", "index"], {"dim": 0, "dim_size": TARGETS}),
                      ("legacy_scatter", "scatter_max", ["src", "index"], {"dim": 0, "dim_size": TARGETS})]
    schema = onnx.defs.get_schema("scatter_sum", 1, "legacy_scatter")
    assert [i.name for i in schema.inputs] == ["src", "index", "out"]
    assert {a.name: a.required for a in schema.attributes.values()} == {"dim": True, "dim_size": False}
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "points"
    onnx.checker.check_model(proto, full_check=True)


def test_eager_runs_the_ops_own_kernel_outside_export(registry):
    bridge_scatter(registry)
    src, index = inputs(6, 1)
    before = legacy_ops.calls("scatter_sum"), legacy_ops.calls("scatter_max")
    out, arg = Pool()(src, index)
    bridge.export(Pool(), (src, index), registry=registry)  # export runs fakes only
    again, _ = Pool()(src, index)
    assert (legacy_ops.calls("scatter_sum"), legacy_ops.calls("scatter_max")) == (before[0] + 2, before[1] + 2)
    want, want_arg = reference(src, index, TARGETS)
    np.testing.assert_allclose(out.numpy(), want)
    np.testing.assert_array_equal(arg.numpy(), want_arg)
    assert torch.equal(out, again)


def test_function_tier_matches_eager_and_the_loop_reference(registry):
    bridge_scatter(registry)
    src, index = inputs(11, 2)
    report = bridge.check_parity(Pool(), (src, index), dynamic_shapes=DYNAMIC, extra_args=(inputs(4, 3),),
                                 registry=registry, tier="function")
    assert report.passed, report
    assert report.outputs[1].max_abs == 0.0 and report.outputs[3].max_abs == 0.0  # argmax exact
    sess = bridge.session(bridge.export(Pool(), (src, index), dynamic_shapes=DYNAMIC, registry=registry),
                          tier="function", registry=registry)
    for n, seed in ((11, 2), (30, 4), (1, 5)):
        src, index = inputs(n, seed)
        out, arg = sess.run(None, {"src": src.numpy(), "index": index.numpy()})
        want, want_arg = reference(src, index, TARGETS)
        np.testing.assert_allclose(out, want)
        np.testing.assert_array_equal(arg, want_arg)
        assert (arg[TARGETS - 1] == n).all()  # the empty slot


def test_python_tier_runs_the_ops_own_kernel(tmp_path):
    # NOTE: a subprocess: the python tier declares every op at a process's first session
    code = f"""
import json, sys, torch
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
import bridge
import test_proxy_ops as t
from vendor import legacy_ops
t.bridge_scatter()
before = legacy_ops.calls("scatter_max")
reports = [bridge.check_parity(t.Pool(), t.inputs(n, n), tier="python", dynamic_shapes=t.DYNAMIC) for n in (5, 13)]
calls = legacy_ops.calls("scatter_max") - before
# the other optional cases: out given (an input), dim_size omitted (no attribute; size from the index)
src, index = t.inputs(9, 3)
optional = bridge.check_parity(t.Optionals(), (src, index, torch.full((t.TARGETS, 3), 0.5)), tier="python")
print(json.dumps({{"passed": [r.passed for r in reports], "calls": calls, "optional": optional.passed,
                  "shapes": [list(o.shape) for o in optional.outputs],
                  "exact": [r.outputs[1].max_abs == 0.0 for r in reports],
                  "text": [str(r) for r in reports + [optional]]}}))
"""
    r = forkserver.run(["-c", code], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["passed"] == [True, True] and out["exact"] == [True, True], out["text"]
    assert out["calls"] >= 4  # eager twice, the python-tier kernel twice: the vendor's own C++ code
    assert out["optional"], out["text"][-1]
    assert out["shapes"] == [[TARGETS, 3], [TARGETS - 1, 3]], out["text"][-1]  # dim_size omitted: index.max() + 1


def test_dynamic_size_into_an_int_argument_names_the_op_and_the_fix(registry):
    bridge_scatter(registry)

    class PerPoint(torch.nn.Module):
        def forward(self, src, index):
            return torch.ops.legacy_scatter.scatter_sum(src, index, 0, None, src.shape[0])

    with pytest.raises(bridge.OpBridgeError, match=r"legacy_scatter::scatter_sum: argument 'dim_size' is declared "
                                                   r"int.*marked dynamic.*Got dim_size=s\d+.*SymInt.*fixed size"):
        bridge.export(PerPoint(), inputs(7, 0), dynamic_shapes=DYNAMIC, registry=registry)
    class Keywords(torch.nn.Module):  # keywords by the op's own (C++-inferred) names
        def forward(self, src, index):
            return torch.ops.legacy_scatter.scatter_sum(src, index, _2=0, _3=None, _4=src.shape[0])

    with pytest.raises(bridge.OpBridgeError, match=r"argument 'dim_size' is declared int"):
        bridge.export(Keywords(), inputs(7, 0), dynamic_shapes=DYNAMIC, registry=registry)
    proto = bridge.export(Keywords(), inputs(7, 0), registry=registry)
    assert {a.name: a.i for a in next(n for n in proto.graph.node if n.domain).attribute} == {"dim": 0, "dim_size": 7}
    proto = bridge.export(PerPoint(), inputs(7, 0), registry=registry)  # static: the size is a constant
    assert {a.name: a.i for a in next(n for n in proto.graph.node if n.domain).attribute} == {"dim": 0, "dim_size": 7}


def test_function_body_says_which_optional_case_it_handles(registry):
    bridge_scatter(registry)

    class WithOut(torch.nn.Module):
        def forward(self, src, index, out):
            return torch.ops.legacy_scatter.scatter_sum(src, index, 0, out, TARGETS)

    class NoSize(torch.nn.Module):
        def forward(self, src, index):
            return torch.ops.legacy_scatter.scatter_sum(src, index, 0, None, None)

    src, index = inputs(6, 0)
    with pytest.raises(bridge.UnsupportedInTier, match=r"scatter_sum ignores its input 'out'.*handles only the case"):
        bridge.session(bridge.export(WithOut(), (src, index, torch.ones(TARGETS, 3)), registry=registry),
                       tier="function", registry=registry)
    with pytest.raises(bridge.UnsupportedInTier, match=r"needs attribute 'dim_size'.*only the case where 'dim_size' "
                                                       r"is given.*without it"):
        bridge.session(bridge.export(NoSize(), (src, index), registry=registry), tier="function", registry=registry)


def test_names_errors(registry):
    legacy_ops.load()
    with pytest.raises(bridge.OpBridgeError, match=r"names= renames arguments the op does not have. Got \['_9'\]"):
        bridge.register("legacy_scatter::scatter_sum", fake=fake_sum, names={"_9": "x"}, registry=registry)
    with pytest.raises(bridge.OpBridgeError, match=r"distinct Python identifiers"):
        bridge.register("legacy_scatter::scatter_sum", fake=fake_sum, names={"_0": "x", "_1": "x"}, registry=registry)
    with pytest.raises(bridge.OpBridgeError, match=r"names= renames through a proxy op.*Pass fake= as well"):
        bridge.register("legacy_scatter::scatter_sum", names=NAMES, registry=registry)
    assert "legacy_scatter::scatter_sum" not in registry


# -- torchbind methods no op stands for ------------------------------------------------------------

@script(values.Opset("legacy_scatter", 1), default_opset=op)
def Affine_forward(x, scale: float, shift: int):
    return op.Add(op.Mul(x, op.CastLike(op.Constant(value_float=scale), x)),
                  op.CastLike(op.Constant(value_int=shift), x))


def bridge_affine(registry=None):
    legacy_ops.load()
    return bridge.register("legacy_scatter::Affine.forward", function=Affine_forward, names={"_1": "x"},
                           fake=lambda x, scale, shift: torch.empty_like(x), registry=registry)


class Holder(torch.nn.Module):
    def __init__(self, scale=2.5, shift=3):
        super().__init__()
        self.affine = torch.classes.legacy_scatter.Affine(scale, shift)

    def forward(self, x):
        return self.affine.forward(x) * 2


def test_torchbind_method_exports_with_state_attributes_and_matches_in_function_tier(registry):
    method = bridge_affine(registry)
    spec = method.spec
    assert ([p.name for p in spec.tensors], [(p.name, p.attr_type.name) for p in spec.attributes]) == \
        (["x"], [("scale", "FLOAT"), ("shift", "INT")])
    x = torch.randn(4, 3)
    dyn = ({0: torch.export.Dim("rows")},)
    proto = bridge.export(Holder(), (x,), dynamic_shapes=dyn, registry=registry)
    node = next(n for n in proto.graph.node if n.domain)
    assert (node.domain, node.op_type) == ("legacy_scatter", "Affine_forward")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"scale": 2.5, "shift": 3}
    assert [i.name for i in proto.graph.input] == ["x"]
    report = bridge.check_parity(Holder(-1.5, 7), (x,), dynamic_shapes=dyn, extra_args=((torch.randn(9, 3),),),
                                 registry=registry, tier="function")
    assert report.passed, report
    np.testing.assert_allclose(Holder(-1.5, 7)(x).numpy(), (x.numpy() * -1.5 + 7) * 2, rtol=1e-6)


def test_torchbind_method_runs_the_real_method_in_the_python_tier():
    code = f"""
import json, sys, torch
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
import bridge
import test_proxy_ops as t
op = t.bridge_affine()
direct = op(torch.ones(2), 0.5, 4).tolist()  # the proxy's kernel: an object rebuilt from the state
reports = [bridge.check_parity(t.Holder(s, b), (torch.randn(n, 3),), tier="python",
                               dynamic_shapes=({{0: torch.export.Dim("rows")}},))
           for n, s, b in ((3, 1.5, 2), (8, -2.0, 0))]
print(json.dumps({{"passed": [r.passed for r in reports], "direct": direct, "text": [str(r) for r in reports]}}))
"""
    r = forkserver.run(["-c", code], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["direct"] == [4.5, 4.5]
    assert out["passed"] == [True, True], out["text"]


def test_torchbind_method_errors_name_the_fix(registry):
    legacy_ops.load()
    with pytest.raises(bridge.OpBridgeError, match=r"legacy_scatter::Affine has no method 'backward'.*\['forward'\]"):
        bridge.register("legacy_scatter::Affine.backward", attributes=["scale", "shift"], registry=registry)
    with pytest.raises(bridge.OpBridgeError, match=r"attributes= must name each of the 2 values.*\['float', 'int'\]"):
        bridge.register("legacy_scatter::Affine.forward", attributes=["scale"],
                        fake=lambda x, s: x, registry=registry)
    pending = bridge.register("legacy_scatter::Affine.forward", fake=lambda x, s, b: x, registry=registry)
    with pytest.raises(bridge.OpBridgeError, match=r"names of the object's state .* are read from the object at "
                                                   r"export"):
        pending.spec  # noqa: B018  named by the first export of a model holding an Affine (tests/test_torchbind.py)


def test_opbridge_ops_lists_proxied_ops_under_their_own_names(tmp_path):
    (tmp_path / "legacy_bridge.py").write_text("import test_proxy_ops as t\nt.bridge_scatter()\nt.bridge_affine()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(tmp_path)]))
    r = forkserver.run(["-m", "bridge", "--ops", "legacy_bridge", "ops", "--json"],
                       env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["op"]: row for row in json.loads(r.stdout[r.stdout.index("["):])}
    row = rows["legacy_scatter::scatter_max"]
    assert (row["onnx"], row["inputs"], row["attributes"]) == \
        ("legacy_scatter::scatter_max v1", ["src", "index", "out"], {"dim": "INT", "dim_size": "INT"})
    assert row["fake"] and row["body"] == "written" and row["tiers"]["function"] and row["tiers"]["python"]
    row = rows["legacy_scatter::Affine.forward"]
    assert (row["onnx"], row["inputs"], row["torchbind"]) == \
        ("legacy_scatter::Affine_forward v1", ["x"], ["legacy_scatter::Affine.forward"])


def test_torchbind_method_uses_the_users_fake_class_when_no_fake_is_given(registry):
    legacy_ops.load()
    seen = []

    class FakeAffine:
        def __init__(self, scale, shift):
            self.scale, self.shift = scale, shift

        @classmethod
        def __obj_unflatten__(cls, flat):
            return cls(**dict(flat))

        def forward(self, x):
            seen.append((self.scale, self.shift))
            return torch.empty_like(x)

    fakes = torch._library.fake_class_registry
    ours = fakes.find_fake_class("__torch__.torch.classes.legacy_scatter.Affine")
    if ours is not None:
        fakes.deregister_fake_class("legacy_scatter::Affine")
    fakes.register_fake_class("legacy_scatter::Affine", FakeAffine)
    try:
        bridge.register("legacy_scatter::Affine.forward", function=Affine_forward, names={"_1": "x"},
                        registry=registry)
        proto = bridge.export(Holder(0.5, 2), (torch.randn(3, 2),), registry=registry)
    finally:
        fakes.deregister_fake_class("legacy_scatter::Affine")
        if ours is not None:
            fakes.register_fake_class("legacy_scatter::Affine", ours)
    assert (0.5, 2) in seen  # the proxy's fake asked the user's fake class, with the object's state
    assert [n.op_type for n in proto.graph.node] == ["Affine_forward", "Mul"]


def test_composite_only_op_without_a_body_says_so_and_still_runs_in_the_python_tier(registry):
    legacy_ops.load()
    sum_op = bridge.register("legacy_scatter::scatter_sum", fake=fake_sum, names=NAMES, registry=registry)
    assert TIERS["function"].why_not(sum_op.spec) is not None and TIERS["python"].why_not(sum_op.spec) is None


def test_export_of_an_unbridged_composite_only_op_points_at_bridge_register(registry):
    legacy_ops.load()
    bridge.register("legacy_scatter::scatter_sum", fake=fake_sum, names=NAMES, registry=registry)  # max is not
    with pytest.raises(bridge.OpBridgeError, match=r"traced into an op's own \(C\+\+\) kernel.*Got: The tensor has "
                                                   r"a non-zero number.*bridge.register\('ns::name', fake=\.\.\.\)"):
        bridge.export(Pool(), inputs(6, 0), registry=registry)


def test_dynamic_size_into_an_int_argument_of_any_bridged_op_is_named(registry):
    cpp_ops.load()
    bridge.register("vendorcpp::affine_head", registry=registry)

    class Head(torch.nn.Module):
        def forward(self, x):
            return torch.ops.vendorcpp.affine_head(x, x.shape[0], 0.5, [1])

    with pytest.raises(bridge.OpBridgeError, match=r"vendorcpp::affine_head: argument 'k' is declared int"):
        bridge.export(Head(), (torch.randn(3, 6),), dynamic_shapes=({0: torch.export.Dim("rows", max=6)},),
                      registry=registry)


def test_names_apply_to_an_op_with_kernels_of_its_own(registry, fresh_name):
    name = fresh_name("plain")
    ns, short = name.split("::")
    lib = torch.library.Library(ns, "DEF")
    lib.define(f"{short}(Tensor _0, float _1) -> Tensor")
    lib.impl(short, lambda x, s: x * s, "CPU")
    calls = []
    op_ = bridge.register(name, fake=lambda x, s: calls.append(s) or torch.empty_like(x),
                          names={"_0": "x", "_1": "scale"}, registry=registry)
    assert [p.name for p in op_.spec.params] == ["x", "scale"] and op_.spec.origin.proxied

    class M(torch.nn.Module):
        def forward(self, x):
            return getattr(getattr(torch.ops, ns), short)(x, 3.0) + 1

    proto = bridge.export(M(), (torch.ones(2, 2),), dynamic_shapes=({0: torch.export.Dim("n")},), functions=False,
                          registry=registry)
    node = next(n for n in proto.graph.node if n.domain)
    assert (node.domain, node.op_type, [a.name for a in node.attribute]) == (ns, short, ["scale"])
    assert 3.0 in calls  # the op's own fake, through the proxy
    assert torch.equal(M()(torch.ones(2)), torch.full((2,), 4.0))  # eager: the op's own CPU kernel


_KEYWORD_LIBS = []  # NOTE: the test ops' libraries stay alive (torch ops cannot be undefined)


def keyword_op(ns, registry=None, own_kernel=False):
    """``ns::scaled(x, *, k=1, mode=None)``: keyword-only arguments, an omitted ``str?`` adds 100.
    Composite-only with fake= (readable names), or a CPU kernel of its own bridged with names=."""
    lib = torch.library.Library(ns, "DEF")
    _KEYWORD_LIBS.append(lib)
    arg = ("_0", "_1", "_2") if own_kernel else ("x", "k", "mode")
    lib.define(f"scaled(Tensor {arg[0]}, *, int {arg[1]}=1, str? {arg[2]}=None) -> Tensor")

    def kernel(x, **kw):
        k, mode = kw.get(arg[1], 1), kw.get(arg[2])
        return x * k + (100.0 if mode is None else float(len(mode)))

    lib.impl("scaled", kernel, "CPU" if own_kernel else "CompositeImplicitAutograd")
    names = {"_0": "x", "_1": "k", "_2": "mode"} if own_kernel else None
    # NOTE: the fake is called as the op is: keyword-only arguments by the op's own names
    return bridge.register(f"{ns}::scaled", fake=lambda x, **kw: torch.empty_like(x), names=names, registry=registry)


class Keywords(torch.nn.Module):
    """Calls of ``ns::scaled`` with its keyword-only arguments by their names (the op's own, ``_1``
    and ``_2`` for the one with C++-style names)."""

    def __init__(self, ns, own_kernel=False):
        super().__init__()
        self.ns, self.k, self.mode = ns, "_1" if own_kernel else "k", "_2" if own_kernel else "mode"

    def forward(self, x):
        f = getattr(torch.ops, self.ns).scaled
        return f(x, **{self.k: 3}), f(x, **{self.k: 2, self.mode: "abc"})


@pytest.mark.parametrize("own_kernel", [False, True])
def test_keyword_only_arguments_go_by_name_through_the_proxy(registry, fresh_name, own_kernel):
    ns = fresh_name("kw").split("::")[0]
    op_ = keyword_op(ns, registry, own_kernel)
    assert op_.spec.overload.namespace == "opbridge_proxy"
    assert [p.name for p in op_.spec.params] == ["x", "k", "mode"]
    x = torch.ones(2, 2)
    assert torch.equal(op_.spec.overload(x, 3, None), torch.full((2, 2), 103.0))  # eager through the proxy
    assert torch.equal(op_(x, 2, "ab"), torch.full((2, 2), 4.0))
    proto = bridge.export(Keywords(ns, own_kernel), (x,), dynamic_shapes=({0: torch.export.Dim("n")},), functions=False,
                          registry=registry)
    nodes = [(n.domain, n.op_type, {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute})
             for n in proto.graph.node if n.domain]
    assert nodes == [(ns, "scaled", {"k": 3}), (ns, "scaled", {"k": 2, "mode": b"abc"})]
    # eager: the op's own
    assert [t.tolist() for t in Keywords(ns, own_kernel)(x)] == [[[103.0] * 2] * 2, [[5.0] * 2] * 2]



def test_keyword_only_arguments_and_an_omitted_str_attribute_in_the_python_tier():
    # NOTE: a subprocess: the python tier declares every op at a process's first session
    code = f"""
import json, sys, torch
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
import bridge
import test_proxy_ops as t
for ns, own in (("kwonly_composite", False), ("kwonly_own", True)):
    t.keyword_op(ns, own_kernel=own)

class Both(torch.nn.Module):  # one model: the python tier declares ops at the first session
    def forward(self, x):
        return (*t.Keywords("kwonly_composite")(x), *t.Keywords("kwonly_own", True)(x))

x = torch.ones(3, 2)
sess = bridge.session(bridge.export(Both(), (x,)), tier="python")
outs = [o.tolist() for o in sess.run(None, {{sess.get_inputs()[0].name: x.numpy()}})]
out = {{"kwonly_composite": outs[:2], "kwonly_own": outs[2:]}}
print(json.dumps(out))
"""
    r = forkserver.run(["-c", code], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    want = [[[103.0] * 2] * 3, [[5.0] * 2] * 3]  # mode omitted: None (+100); mode="abc": +3
    assert out == {"kwonly_composite": want, "kwonly_own": want}


def test_a_proxy_keeps_its_names_and_other_names_are_refused(registry, fresh_name):
    name = fresh_name("twice")
    ns, short = name.split("::")
    lib = torch.library.Library(ns, "DEF")
    _KEYWORD_LIBS.append(lib)
    lib.define(f"{short}(Tensor _0, int _1) -> Tensor")
    lib.impl(short, lambda x, k: x * k, "CompositeImplicitAutograd")
    fake = lambda x, k: torch.empty_like(x)  # noqa: E731
    first = bridge.register(name, fake=fake, names={"_0": "x", "_1": "k"}, registry=registry)
    other = bridge.Registry()
    again = bridge.register(name, fake=fake, names={"_0": "x", "_1": "k"}, registry=other)
    assert again.spec.overload is first.spec.overload  # the same names: the same proxy
    other.remove(name)
    with pytest.raises(bridge.OpBridgeError, match=r"already bridged through a proxy with names \{'_0': 'x', "
                                                   r"'_1': 'k'\}\. Got names \{'_0': 'src'\}\. Use the same names="):
        bridge.register(name, fake=fake, names={"_0": "src"}, registry=other)
    assert [a.name for a in first.spec.overload._schema.arguments] == ["x", "k"]  # the first registry's still hold
    assert first(x=torch.ones(2), k=3).tolist() == [3.0, 3.0]
