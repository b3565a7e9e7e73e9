"""The demo: a small BEVDet-like view transformer using identity_conv and bev_pool_v2.

image conv -> identity_conv -> depth/feature head -> depth softmax -> bev_pool_v2 -> BEV conv.
The frustum-to-grid geometry is synthetic (cameras on a ring looking outwards), prepared with
BEVDet's ``voxel_pooling_prepare_v2`` logic; the number of kept points varies with ``jitter``.

Example:
    >>> import custom_ops.demo as demo
    >>> case = demo.build()
    >>> tuple(case.model(*case.args).shape)
    (1, 8, 32, 32)
"""

from __future__ import annotations

import math

import torch
from torch import nn

import custom_ops  # noqa: F401  (registers the seed ops)
from bridge import ModelCase
from custom_ops.bev_pool_v2 import voxel_pooling_prepare
from custom_ops.identity_conv import IdentityConvClass


class BEVDemo(nn.Module):
    """Lift-splat view transformer: (B, N, 3, H, W) images + ranks -> (B, out, Y, X) BEV map."""

    def __init__(self, batch=1, cams=6, depth_bins=16, channels=16, grid=(32, 32, 1), out_channels=8):
        super().__init__()
        self.batch, self.cams, self.depth_bins, self.channels, self.grid = batch, cams, depth_bins, channels, grid
        self.backbone = nn.Conv2d(3, 32, 3, padding=1)
        self.head = nn.Conv2d(32, depth_bins + channels, 1)
        self.bev_conv = nn.Conv2d(channels * grid[2], out_channels, 3, padding=1)

    def forward(self, images, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths):
        b, n, d, c = self.batch, self.cams, self.depth_bins, self.channels
        gx, gy, gz = self.grid
        x = torch.relu(self.backbone(images.flatten(0, 1)))
        x = torch.ops.opbridge.identity_conv(x, 32)
        x = self.head(x)
        h, w = x.shape[-2:]
        depth = x[:, :d].softmax(dim=1).reshape(b, n, d, h, w)
        feat = x[:, d:].permute(0, 2, 3, 1).reshape(b, n, h, w, c)
        bev = torch.ops.bev.bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, (b, gz, gy, gx, c),
                                        interval_starts, interval_lengths)  # BEVDet's argument order
        return self.bev_conv(bev.flatten(1, 2))


def frustum_coords(batch, cams, depth_bins, height, width, grid, jitter=0.0, seed=0):
    """Integer voxel coords (B, N, D, H, W, 3) of a ring of outward-looking cameras."""
    g = torch.Generator().manual_seed(seed)
    gx, gy, gz = grid
    yaw = torch.arange(cams) * (2 * math.pi / cams)
    azimuth = yaw[:, None] + (torch.arange(width) / max(width - 1, 1) - 0.5) * (2 * math.pi / cams)
    dist = 1.0 + (torch.arange(depth_bins) + 0.5) * (gx / 2.0) / depth_bins
    r = dist[None, :, None, None].expand(cams, depth_bins, height, width)
    phi = azimuth[:, None, None, :].expand(cams, depth_bins, height, width)
    x = gx / 2 + r * torch.cos(phi)
    y = gy / 2 + r * torch.sin(phi)
    z = (torch.arange(height) * gz // max(height, 1))[None, None, :, None].expand_as(x).float()
    xyz = torch.stack([x, y, z], -1).expand(batch, cams, depth_bins, height, width, 3)
    if jitter:
        xyz = xyz + jitter * torch.randn(xyz.shape, generator=g) * torch.tensor([1.0, 1.0, 0.0])
    return xyz.floor().long()


def make_inputs(model: BEVDemo, height=8, width=22, jitter=0.0, seed=0):
    """Images and prepared ranks for ``model``; ``jitter`` moves points so the count varies."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(model.batch, model.cams, 3, height, width, generator=g)
    coords = frustum_coords(model.batch, model.cams, model.depth_bins, height, width, model.grid, jitter, seed)
    return (images, *voxel_pooling_prepare(coords, model.grid))


def dynamic_shapes():
    """Points and intervals vary per frame; images are fixed size."""
    points, intervals = torch.export.Dim("points"), torch.export.Dim("intervals")
    return (None, {0: points}, {0: points}, {0: points}, {0: intervals}, {0: intervals})


def build() -> ModelCase:
    """The demo model, its example inputs, dynamic shapes, and two more frames of other sizes."""
    torch.manual_seed(0)
    model = BEVDemo().eval()
    return ModelCase(model, make_inputs(model), dynamic_shapes(),
                     extra_args=(make_inputs(model, jitter=1.0, seed=1), make_inputs(model, jitter=4.0, seed=2)),
                     name="BEVDemo (conv, identity_conv, depth softmax, bev_pool_v2, conv)")


class IdentityModel(torch.nn.Module):
    """The seeds' four layers: native conv, torchbind IdentityConvClass, identity_conv op, native conv."""

    def __init__(self, channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.identity = IdentityConvClass(channels)
        self.conv2 = nn.Conv2d(channels, 2, 1)
        self.channels = channels
        # NOTE: weights on a grid of 1/8 (and integer inputs, see identity_model) make every conv
        # sum exact in float32, so torch and ORT agree bit for bit whatever their summation order;
        # bitwise parity then tests the custom layers in between.
        with torch.no_grad():
            for p in self.parameters():
                p.copy_((p * 8).round() / 8)

    def forward(self, x):
        x = self.conv1(x)
        x = self.identity.forward(x)
        x = torch.ops.opbridge.identity_conv(x, self.channels)
        return self.conv2(x)


def identity_model() -> ModelCase:
    """IdentityModel with a dynamic batch; ``opbridge check --model custom_ops.demo:identity_model``."""
    torch.manual_seed(0)
    model = IdentityModel().eval()
    batch = torch.export.Dim("batch")
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(-4, 5, (n, 3, 8, 8), generator=g).float() for n in (2, 5)]
    return ModelCase(model, (images[0],), ({0: batch},), extra_args=((images[1],),),
                     name="IdentityModel (conv, torchbind, op, conv)")
