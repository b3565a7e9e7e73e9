"""Drop-in names for BEVDet's view transformer: change only its import.

BEVDet imports ``bev_pool_v2`` from its CUDA extension and calls it as
``bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts,
interval_lengths)`` with ``bev_feat_shape`` a tuple ``(B, Z, Y, X, C)``; it returns (B, C, Z, Y, X).
The same call here runs ``torch.ops.bev.bev_pool_v2``, so the model exports to ONNX with the op as
one node and runs in every opbridge tier.

Example:
    >>> import torch
    >>> from custom_ops.bevdet import bev_pool_v2, voxel_pooling_prepare_v2
    >>> coords = torch.zeros(1, 1, 2, 1, 1, 3, dtype=torch.long)  # two depth bins, one voxel
    >>> ranks_bev, ranks_depth, ranks_feat, starts, lengths = voxel_pooling_prepare_v2(coords, (2, 2, 1))
    >>> out = bev_pool_v2(torch.ones(1, 1, 2, 1, 1), torch.ones(1, 1, 1, 1, 3), ranks_depth, ranks_feat,
    ...                   ranks_bev, (1, 1, 2, 2, 3), starts, lengths)
    >>> tuple(out.shape), out[0, :, 0, 0, 0].tolist()
    ((1, 3, 1, 2, 2), [2.0, 2.0, 2.0])
"""

from __future__ import annotations

import torch

from custom_ops.bev_pool_v2 import voxel_pooling_prepare_v2

__all__ = ["bev_pool_v2", "voxel_pooling_prepare_v2"]


def bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts, interval_lengths):
    """BEVDet's ``bev_pool_v2`` call, served by ``torch.ops.bev.bev_pool_v2`` (output (B, C, Z, Y, X))."""
    return torch.ops.bev.bev_pool_v2(depth, feat, ranks_depth, ranks_feat, ranks_bev, tuple(bev_feat_shape),
                                     interval_starts, interval_lengths)
