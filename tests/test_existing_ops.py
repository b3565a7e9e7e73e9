"""bridge.register: ops that already exist (another package's custom_op, a C++ TORCH_LIBRARY op)."""

import json
import os
from collections.abc import Sequence
from pathlib import Path

import forkserver
import pytest
import torch
from onnxscript import opset20 as op
from onnxscript import script, values
from vendor import cpp_ops, py_ops

import bridge

ROOT = Path(__file__).resolve().parents[1]


@script(values.Opset("vendor", 1), default_opset=op)
def swish(x, beta: float):
    return op.Mul(x, op.Sigmoid(op.Mul(op.CastLike(op.Constant(value_float=beta), x), x)))


@script(values.Opset("vendorcpp", 1), default_opset=op)
def affine_head(x, k: int, scale: float, offsets: Sequence[int]):
    shift = op.ReduceSum(op.Constant(value_ints=offsets), keepdims=0)
    out = op.Add(op.Mul(x, op.CastLike(op.Constant(value_float=scale), x)), op.CastLike(shift, x))
    end = op.Reshape(op.Constant(value_int=k), op.Constant(value_ints=[1]))
    head = op.Slice(x, op.Constant(value_ints=[0]), end, op.Constant(value_ints=[1]))
    return out, op.ArgMax(head, axis=1, keepdims=0)


class Both(torch.nn.Module):
    """A model calling both vendor ops."""

    def forward(self, x):
        y = torch.ops.vendor.swish(x, 1.5)
        return torch.ops.vendorcpp.affine_head(y, 3, 0.5, [1, 2])


def bridge_both(registry=None):
    cpp_ops.load()
    return (bridge.register(py_ops.swish, function=swish, registry=registry),
            bridge.register("vendorcpp::affine_head", function=affine_head, registry=registry))


def test_registered_ops_export_and_match_eager_at_two_sizes(registry):
    swish_op, head_op = bridge_both(registry)
    assert [p.name for p in head_op.spec.params] == ["x", "k", "scale", "offsets"]
    assert (head_op.spec.domain, head_op.spec.num_outputs) == ("vendorcpp", 2)
    g = torch.Generator().manual_seed(0)
    args, more = (torch.randn(5, 6, generator=g),), (torch.randn(9, 6, generator=g),)
    calls = py_ops.CALLS["swish"]
    report = bridge.check_parity(Both(), args, dynamic_shapes=({0: torch.export.Dim("rows")},),
                                 extra_args=(more,), registry=registry)
    assert report.passed, report
    assert [o.shape for o in report.outputs] == [(5, 6), (5,), (9, 6), (9,)]
    assert report.outputs[1].max_abs == 0.0 and report.outputs[3].max_abs == 0.0  # argmax exact
    assert py_ops.CALLS["swish"] > calls  # eager still ran the vendor's own kernel


def test_registered_ops_run_in_the_python_tier_through_their_own_kernels(tmp_path):
    # NOTE: a subprocess: the python tier declares every op at a process's first session
    script_ = f"""
import json, sys, torch
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
import bridge
import test_existing_ops as t
from vendor import py_ops
t.bridge_both()
g = torch.Generator().manual_seed(1)
reports = [bridge.check_parity(t.Both(), (torch.randn(n, 6, generator=g),), tier="python",
                               dynamic_shapes=({{0: torch.export.Dim("rows")}},)) for n in (4, 11)]
print(json.dumps({{"passed": [r.passed for r in reports], "calls": py_ops.CALLS["swish"],
                  "text": [str(r) for r in reports]}}))
"""
    r = forkserver.run(["-c", script_], timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["passed"] == [True, True], out["text"]
    assert out["calls"] >= 4  # eager twice, the python-tier kernel twice: the vendor's own code


def test_bridge_op_on_an_existing_name_is_refused_and_the_op_keeps_working(registry):
    with pytest.raises(bridge.OpBridgeError, match=r"torch already has op vendor::swish \(torch.library.custom_op "
                                                   r"in module 'vendor.py_ops'.*bridge.register\('vendor::swish'"):
        @bridge.op("vendor::swish", registry=registry)
        def impostor(x: torch.Tensor, beta: float) -> torch.Tensor:
            return x
    cpp_ops.load()
    with pytest.raises(bridge.OpBridgeError, match=r"torch already has op vendorcpp::affine_head \(defined in C\+\+"):
        bridge.op("vendorcpp::affine_head", registry=registry)
    calls = py_ops.CALLS["swish"]
    x = torch.randn(3)
    torch.testing.assert_close(torch.ops.vendor.swish(x, 2.0), x * torch.sigmoid(2 * x))
    assert py_ops.CALLS["swish"] == calls + 1 and "vendor::swish" not in registry


def test_register_errors_name_the_fix(registry):
    lib = torch.library.Library("vendor_err", "DEF")
    lib.define("nofake(Tensor x) -> Tensor")
    lib.impl("nofake", lambda x: x.clone(), "CPU")
    with pytest.raises(bridge.OpBridgeError, match=r"has no fake \(meta\) kernel.*torch.library.register_fake"):
        bridge.register("vendor_err::nofake", registry=registry)
    with pytest.raises(bridge.OpBridgeError, match="already has a fake"):
        bridge.register(py_ops.swish, fake=lambda x, beta: x, registry=registry)
    lib.define("many(Tensor[] xs) -> Tensor")
    with pytest.raises(bridge.OpBridgeError, match=r"argument 'xs' has type List\[Tensor\]"):
        bridge.register("vendor_err::many", fake=lambda xs: xs[0], registry=registry)
    lib.define("two.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    with pytest.raises(bridge.OpBridgeError, match="only the default overload"):
        bridge.register("vendor_err::two.out", registry=registry)
    with pytest.raises(bridge.OpBridgeError, match="torch has no op 'vendor_err::missing'"):
        bridge.register("vendor_err::missing", registry=registry)
    with pytest.raises(bridge.OpBridgeError, match="takes an op"):
        bridge.register(42, registry=registry)
    ok = bridge.register(torch.ops.vendor_err.nofake, fake=lambda x: torch.empty_like(x), registry=registry)
    with pytest.raises(bridge.OpBridgeError, match="already registered"):
        bridge.register("vendor_err::nofake", registry=registry)
    with pytest.raises(bridge.OpBridgeError, match="already bridged"):
        bridge.register(ok, registry=registry)
    assert registry.get("vendor_err::nofake").has_fake


def test_multi_output_custom_node_values_are_named_after_the_op(registry):
    bridge_both(registry)
    proto = bridge.export(Both(), (torch.randn(5, 6),), registry=registry)
    node = next(n for n in proto.graph.node if n.op_type == "affine_head")
    assert list(node.output) == ["affine_head_out0", "affine_head_out1"]
    assert not any(v.startswith("getitem") for n in proto.graph.node for v in n.output)


@torch.library.custom_op("existing_grad::plain", mutates_args=())
def _plain(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@torch.library.custom_op("existing_grad::with_backward", mutates_args=())
def _with_backward(x: torch.Tensor) -> torch.Tensor:
    return x * 2


_with_backward.register_autograd(lambda ctx, grad: grad * 2)


@pytest.mark.parametrize("name,grad", [("existing_grad::plain", False), ("existing_grad::with_backward", True)])
def test_an_existing_custom_op_has_autograd_only_with_a_backward(registry, name, grad):
    """torch.library.custom_op gives every op an Autograd kernel (one that raises without register_autograd):
    registered by name, the op has autograd as its backward says, as `opbridge ops` shows it."""
    spec = bridge.register(name, registry=registry).spec
    assert spec.has_autograd is grad
    x = torch.ones(3, requires_grad=True)
    out = getattr(torch.ops.existing_grad, name.split("::")[1])(x).sum()
    if grad:
        out.backward()
        assert torch.equal(x.grad, torch.full((3,), 2.0))
    else:
        with pytest.raises(RuntimeError, match="no autograd formula"):
            out.backward()
