"""Seed ops: eager vs independent reference, torch.library.opcheck, gradcheck in float64."""

import pytest
import torch

import bridge
from bridge.testing import cases
from custom_ops.bev_pool_v2 import random_case

ALL = cases(bridge.REGISTRY)


def _eager_result(case):
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in case.sample.args]
    out = case.spec.overload(*args)
    if case.spec.mutated:  # a mutating op's result is the new value of its mutated tensor
        index = [p.name for p in case.spec.params].index(case.spec.mutated[0])
        return args[index]
    return out


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_eager_matches_reference(case):
    expected = case.spec.reference(*case.sample.args)
    got = _eager_result(case)
    rtol, atol = bridge.parity.tolerance(case.dtype)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)


OPCHECK = cases(bridge.REGISTRY, dtypes=(torch.float32, torch.float64))


@pytest.mark.parametrize("case", OPCHECK, ids=[c.id for c in OPCHECK])
def test_opcheck(case):
    grad = case.spec.has_autograd
    args = tuple(a.clone().requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                 for a in case.sample.args)
    torch.library.opcheck(case.spec.overload, args)


def test_every_seed_op_is_declared():
    assert {s.qualname for s in bridge.REGISTRY} >= {
        "bev::bev_pool_v2", "opbridge::identity_conv", "opbridge::crop", "opbridge::paste", "opbridge::numpy_sin"}


def test_bev_pool_v2_gradcheck():
    depth, feat, *rest = random_case(b=1, n=2, d=3, h=2, w=3, c=4, grid=(3, 3, 2), dtype=torch.float64, seed=3)
    depth.requires_grad_()
    feat.requires_grad_()
    assert torch.autograd.gradcheck(lambda d, f: torch.ops.bev.bev_pool_v2(d, f, *rest), (depth, feat))


def test_bev_pool_v2_backward_matches_autograd_of_reference_math():
    depth, feat, rd, rf, rb, starts, lengths, shape = random_case(dtype=torch.float64, seed=4)
    depth.requires_grad_()
    feat.requires_grad_()
    grad = torch.randn(shape[0], shape[4], *shape[1:4], dtype=torch.float64)
    torch.ops.bev.bev_pool_v2(depth, feat, rd, rf, rb, starts, lengths, shape).backward(grad)
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
    out = torch.ops.bev.bev_pool_v2(depth, feat, rd, zeros, zeros, torch.tensor([0], dtype=torch.int32),
                                    torch.tensor([n], dtype=torch.int32), [1, 1, 1, 1, 1])
    assert out.item() == 3000.0


@pytest.mark.parametrize("mutate,match", [
    (lambda a: a.__setitem__(2, a[2].clone().fill_(10**6)), "ranks_depth values must lie"),
    (lambda a: a.__setitem__(4, a[4].clone().fill_(-1)), "ranks_bev values must lie"),
    (lambda a: a.__setitem__(6, a[6].clone().fill_(-3)), "interval_lengths must be >= 0"),
    (lambda a: a.__setitem__(5, a[5] + 10**5), "intervals must lie"),
    (lambda a: a.__setitem__(2, a[2].long()), "ranks_depth must be a 1-D int32"),
    (lambda a: a.__setitem__(7, [1, 2, 3]), r"bev_feat_shape must be \[B, Z, Y, X, C\]"),
    (lambda a: a.__setitem__(7, [1, 2, 4, 5, 99]), r"bev_feat_shape\[4\] \(C\) must equal feat.shape"),
])
def test_bev_pool_v2_rejects_bad_input(mutate, match):
    args = list(random_case())
    mutate(args)
    with pytest.raises(ValueError, match="opbridge: bev_pool_v2: " + match):
        torch.ops.bev.bev_pool_v2(*args)


def test_identity_conv_rejects_wrong_channels():
    with pytest.raises(ValueError, match="channels=4.*Got shape \\(1, 3, 2, 2\\)"):
        torch.ops.opbridge.identity_conv(torch.ones(1, 3, 2, 2), 4)


def test_crop_rejects_bad_box():
    with pytest.raises(ValueError, match="right >= left"):
        torch.ops.opbridge.crop(torch.ones(2, 2), [3, 0, 1, 1])


def test_numpy_sin_writes_output_in_place():
    x = torch.randn(5)
    out = torch.zeros(5)
    torch.ops.opbridge.numpy_sin(x, out)
    torch.testing.assert_close(out, torch.sin(x))
