"""Seed ops: eager vs independent reference, torch.library.opcheck, eager bad inputs (generated
from tests/op_db.py), gradcheck in float64."""

import op_db
import pytest
import torch
from models import Pool, pool_case
from op_db import F32, F64, OP_DB, eager_bad_params, sample_params

import bridge


def _eager_result(case):
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in case.sample.args]
    out = case.entry.spec.overload(*args)
    if case.entry.spec.mutated:  # a mutating op's result is the new value of its mutated tensor
        index = [p.name for p in case.entry.spec.params].index(case.entry.spec.mutated[0])
        return args[index]
    return out


@pytest.mark.parametrize("case", sample_params("eager"))
def test_eager_matches_reference(case):
    expected = case.entry.spec.reference(*case.sample.args)
    got = _eager_result(case)
    rtol, atol = case.entry.tolerance(case.dtype, None, "eager")
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", sample_params("opcheck", dtypes=(F32, F64)))
def test_opcheck(case):
    grad = case.entry.spec.has_autograd
    args = tuple(a.clone().requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                 for a in case.sample.args)
    torch.library.opcheck(case.entry.spec.overload, args)


@pytest.mark.parametrize("entry,bad", eager_bad_params())
def test_eager_rejects_bad_input(entry, bad):
    _, args = entry.bad_call(bad)
    # the op's checks name it by qualname; an eager kernel with its own check (C++) by its short name
    with pytest.raises(ValueError, match=f"opbridge: (?:{entry.qualname}: |{entry.spec.name}:? ){bad.eager}"):
        entry.spec.overload(*args)


def test_table_has_one_entry_per_registered_op():
    assert set(OP_DB) == {s.qualname for s in bridge.REGISTRY}


def test_table_refuses_an_xfail_without_a_reason():
    with pytest.raises(TypeError):
        op_db.xfail()  # reason is a required argument
    for reason in ("", "  ", None):
        with pytest.raises(op_db.TableError, match="xfail needs a non-empty reason"):
            op_db.xfail(reason, tier="native")
    with pytest.raises(op_db.TableError, match="unknown tier"):
        op_db.xfail("a reason", tier="gpu")


def test_table_tolerance_overrides_are_scoped():
    bev = OP_DB["bev::bev_pool_v2"]
    default = bridge.parity.tolerance(torch.float16)
    assert bev.tolerance(torch.float16, "native", "property") == (2e-3, 2e-3)
    assert bev.tolerance(torch.float16, "function", "property") == default
    assert bev.tolerance(torch.float16, "native", "parity") == default
    assert OP_DB["opbridge::numpy_sin"].tolerance(F32, "native", "parity") == (1e-6, 1e-5)


def test_bev_pool_v2_gradcheck():
    pool, (depth, feat, *ranks) = pool_case(b=1, n=2, d=3, h=2, w=3, c=4, grid=(3, 3, 2), dtype=torch.float64, seed=3)
    depth.requires_grad_()
    feat.requires_grad_()
    assert torch.autograd.gradcheck(lambda d, f: pool(d, f, *ranks), (depth, feat))


def test_bev_pool_v2_backward_matches_autograd_of_reference_math():
    pool, (depth, feat, rd, rf, rb, starts, lengths) = pool_case(dtype=torch.float64, seed=4)
    shape = pool.bev_feat_shape
    depth.requires_grad_()
    feat.requires_grad_()
    grad = torch.randn(shape[0], shape[4], *shape[1:4], dtype=torch.float64)
    pool(depth, feat, rd, rf, rb, starts, lengths).backward(grad)
    # independent: the same pooling with differentiable torch ops, one interval at a time
    d2, f2 = depth.detach().clone().requires_grad_(), feat.detach().clone().requires_grad_()
    out = torch.zeros(shape[0] * shape[1] * shape[2] * shape[3], shape[4], dtype=torch.float64)
    rows = []
    for s, n in zip(starts.tolist(), lengths.tolist()):
        pts = torch.arange(s, s + n)
        rows.append((rb[s].item(), (d2.reshape(-1)[rd[pts].long()].unsqueeze(-1)
                                     * f2.reshape(-1, shape[4])[rf[pts].long()]).sum(0)))
    out = torch.stack([r for _, r in rows]) if rows else out[:0]
    cells = torch.tensor([c for c, _ in rows], dtype=torch.long)
    g = grad.permute(0, 2, 3, 4, 1).reshape(-1, shape[4])[cells]
    (out * g).sum().backward()
    torch.testing.assert_close(depth.grad, d2.grad)
    torch.testing.assert_close(feat.grad, f2.grad)


def test_crop_and_paste_gradcheck():
    img = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    patch = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: torch.ops.opbridge.crop(x, [-1, 2, 4, 7]), (img,))
    assert torch.autograd.gradcheck(lambda x, p: torch.ops.opbridge.paste(x, p, 4, -1), (img, patch))


def test_crop_gradient_is_paste_of_grad():
    img = torch.randn(3, 6, 7, requires_grad=True)
    grad = torch.randn(3, 4, 3)
    torch.ops.opbridge.crop(img, [5, -1, 8, 3]).backward(grad)
    expected = torch.zeros(3, 6, 7)
    expected[:, 0:3, 5:7] = grad[:, 1:4, 0:2]
    torch.testing.assert_close(img.grad, expected)


def test_bev_pool_v2_float16_accumulates_in_float32():
    # 2048 points of 1.0 * 1.0 into one cell: a float16 accumulator would stall at 2048's ulp steps
    n = 3000
    depth = torch.ones(1, 1, n, 1, 1, dtype=torch.float16)
    feat = torch.ones(1, 1, 1, 1, 1, dtype=torch.float16)
    rd = torch.arange(n, dtype=torch.int32)
    zeros = torch.zeros(n, dtype=torch.int32)
    out = Pool([1, 1, 1, 1, 1])(depth, feat, rd, zeros, zeros, torch.tensor([0], dtype=torch.int32),
                                torch.tensor([n], dtype=torch.int32))
    assert out.item() == 3000.0


def test_numpy_sin_writes_output_in_place():
    x = torch.randn(5)
    out = torch.zeros(5)
    torch.ops.opbridge.numpy_sin(x, out)
    torch.testing.assert_close(out, torch.sin(x))
