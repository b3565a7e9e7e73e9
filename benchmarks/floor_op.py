"""The memory floor of bev_pool_v2 as an op of its own: ``bench::bev_pool_v2_floor`` takes bev_pool_v2's
inputs and attributes, reads every input byte once and writes every output byte once (floor_kernel.cc),
and runs in onnxruntime exactly as the native kernel does: the same session path, the same intra-op
threads (``intra_op_num_threads``), the same call overhead. So ``native / floor`` compares the kernel with
the least any kernel of that signature could do on the same threads, each byte moved once.

It lives in a registry of its own (:data:`REGISTRY`), never in ``bridge.REGISTRY``: importing this
module adds nothing to what opbridge's commands and tests see (only the torch op, which torch keeps).

    >>> FLOOR_REGISTRY_OPS == [s.qualname for s in REGISTRY]
    True
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnxruntime as ort
import torch

import bridge
from bridge.core.registry import Registry
from custom_ops.bev_pool_v2 import random_case

REGISTRY = Registry()
QUALNAME = "bench::bev_pool_v2_floor"
FLOOR_REGISTRY_OPS = [QUALNAME]


def _fake(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts, interval_lengths):
    b, z, y, x, c = bev_feat_shape
    return feat.new_empty(b, c, z, y, x), torch.empty(1, dtype=torch.int64)


def _samples(dtype):
    return [bridge.SampleInput(random_case(dtype=dtype))]


@bridge.op(QUALNAME, fake=_fake, sample_inputs=_samples, native="floor_kernel.cc", registry=REGISTRY)
def bev_pool_v2_floor(depth: torch.Tensor, feat: torch.Tensor, ranks_depth: torch.Tensor, ranks_feat: torch.Tensor,
                      ranks_bev: torch.Tensor, bev_feat_shape: list[int], interval_starts: torch.Tensor,
                      interval_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros of bev_pool_v2's output shape and the checksum of the inputs' bytes (``checksum``)."""
    inputs = (depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths)
    b, z, y, x, c = bev_feat_shape
    return feat.new_zeros(b, c, z, y, x), torch.tensor([checksum(inputs)], dtype=torch.int64)


def checksum(arrays) -> int:
    """The sum (mod 2^64, as int64) of every array's bytes read as little-endian uint64 words, a tail of
    fewer than 8 bytes byte by byte: what the floor kernel's second output holds."""
    total = 0
    for a in arrays:
        raw = np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a).tobytes()
        words = len(raw) // 8
        total += int(np.frombuffer(raw[:words * 8], "<u8").sum(dtype=np.uint64)) + sum(raw[words * 8:])
    total %= 1 << 64
    return total - (1 << 64) if total >= 1 << 63 else total


class FloorPool(torch.nn.Module):
    """bev_pool_v2.Pool with the floor op in place of bev_pool_v2 (same inputs, same attribute)."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, depth, feat, rd, rf, rb, starts, lengths):
        return torch.ops.bench.bev_pool_v2_floor(depth, feat, rd, rf, rb, self.shape, starts, lengths)


def floor_session(inputs, shape, sess_options: ort.SessionOptions, dynamic_shapes=None):
    """An onnxruntime session running the floor at bev_pool_v2's ``inputs`` and output ``shape``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "floor.onnx")
        bridge.export(FloorPool(shape), inputs, path, registry=REGISTRY, functions=False,
                      dynamic_shapes=dynamic_shapes)
        return bridge.session(path, tier="native", registry=REGISTRY, sess_options=sess_options)
