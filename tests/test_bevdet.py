"""BEVDet's call convention: its view transformer works by changing only the bev_pool_v2 import."""

import pytest
import torch

import bridge
import custom_ops.demo as demo
from custom_ops.bev_pool_v2 import reference
from custom_ops.bevdet import bev_pool_v2, voxel_pooling_prepare_v2


class ViewTransformer(torch.nn.Module):
    """Written the way BEVDet's LSS view transformer calls the op (prepare, then pool with a tuple
    shape before the intervals); only the import of bev_pool_v2 differs from BEVDet."""

    def __init__(self, grid=(8, 6, 1), channels=5):
        super().__init__()
        self.grid_size = torch.tensor(grid)
        self.channels = channels
        # NOTE: sizes as Python ints for export (int() of a tensor attribute inside forward is
        # data-dependent under torch.export); BEVDet's deploy path likewise fixes them up front
        self.zyx = (int(grid[2]), int(grid[1]), int(grid[0]))

    def voxel_pooling_v2(self, coor, depth, feat):
        ranks_bev, ranks_depth, ranks_feat, interval_starts, interval_lengths = \
            voxel_pooling_prepare_v2(coor, [int(g) for g in self.grid_size])
        bev_feat_shape = (depth.shape[0], int(self.grid_size[2]), int(self.grid_size[1]),
                          int(self.grid_size[0]), feat.shape[-1])
        bev_feat = bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape,
                               interval_starts, interval_lengths)
        return torch.cat(bev_feat.unbind(dim=2), 1)  # BEVDet collapses Z into channels

    def forward(self, depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths):
        shape = (depth.shape[0], *self.zyx, feat.shape[-1])
        return bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, shape, interval_starts, interval_lengths)


def _frame(seed=0, n=2, d=4, h=3, w=5):
    g = torch.Generator().manual_seed(seed)
    model = ViewTransformer()
    coords = demo.frustum_coords(1, n, d, h, w, tuple(model.grid_size.tolist()), jitter=1.0, seed=seed)
    depth = torch.rand(1, n, d, h, w, generator=g).softmax(2)
    feat = torch.randn(1, n, h, w, model.channels, generator=g)
    return model, coords, depth, feat


def test_bevdet_call_in_eager_matches_the_reference():
    model, coords, depth, feat = _frame()
    out = model.voxel_pooling_v2(coords, depth, feat)
    rb, rd, rf, starts, lengths = voxel_pooling_prepare_v2(coords, (8, 6, 1))
    expected = reference(depth, feat, rd, rf, rb, [1, 1, 6, 8, 5], starts, lengths)
    torch.testing.assert_close(out, torch.cat(expected.unbind(dim=2), 1))
    by_name = torch.ops.bev.bev_pool_v2(depth=depth, feat=feat, ranks_depth=rd, ranks_feat=rf, ranks_bev=rb,
                                        interval_starts=starts, interval_lengths=lengths,
                                        bev_feat_shape=[1, 1, 6, 8, 5])
    torch.testing.assert_close(by_name, expected)


@pytest.mark.parametrize("tier", bridge.TIERS)
def test_bevdet_call_exports_and_matches_in_every_tier(tier):
    model, coords, depth, feat = _frame()
    rb, rd, rf, starts, lengths = voxel_pooling_prepare_v2(coords, (8, 6, 1))
    points, intervals = torch.export.Dim("points"), torch.export.Dim("intervals")
    other = _frame(seed=3)
    rb2, rd2, rf2, s2, l2 = voxel_pooling_prepare_v2(other[1], (8, 6, 1))
    report = bridge.check_parity(
        model, (depth, feat, rd, rf, rb, starts, lengths), tier=tier,
        dynamic_shapes=(None, None, {0: points}, {0: points}, {0: points}, {0: intervals}, {0: intervals}),
        extra_args=((other[2], other[3], rd2, rf2, rb2, s2, l2),))
    assert report.passed, report
    assert rd.numel() != rd2.numel()  # two point counts through one file
