"""bev_pool_v2 at BEVDet size: native ORT kernel vs eager torch vs ORT function tier (one process).

~200k kept points, C=80, output 1x80x1x128x128 (6 cameras, 16x44 feature maps, D depth bins).
Prints the median time of each, the ratios, and achieved GB/s against a same-size memory copy.

    python benchmarks/bev_pool_v2.py [--repeats 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bridge  # noqa: E402
import custom_ops  # noqa: E402,F401
from custom_ops.demo import frustum_coords  # noqa: E402
from custom_ops.bev_pool_v2 import voxel_pooling_prepare  # noqa: E402


class Pool(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, depth, feat, rd, rf, rb, starts, lengths):
        return torch.ops.bev.bev_pool_v2(depth, feat, rd, rf, rb, starts, lengths, self.shape)


def bevdet_inputs(depth_bins=48, channels=80, cams=6, h=16, w=44, grid=(128, 128, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    coords = frustum_coords(1, cams, depth_bins, h, w, grid, jitter=0.7, seed=seed)
    ranks = voxel_pooling_prepare(coords, grid)
    depth = torch.rand(1, cams, depth_bins, h, w, generator=g).softmax(2)
    feat = torch.randn(1, cams, h, w, channels, generator=g)
    return (depth, feat, *ranks), [1, grid[2], grid[1], grid[0], channels]


def median_ms(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args(argv)

    inputs, shape = bevdet_inputs()
    points, intervals = inputs[2].numel(), inputs[5].numel()
    model = Pool(shape)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.onnx")
        bridge.export(model, inputs, path)
        sessions = {tier: bridge.session(path, tier=tier) for tier in ("native", "function")}
        feed = bridge.parity.ort_feed(sessions["native"], inputs)
        with torch.no_grad():
            expected = model(*inputs)
        for tier, sess in sessions.items():  # same answer before timing anything
            row = bridge.compare(tier, expected, sess.run(None, feed)[0])
            assert row.passed, row
        times = {"eager torch": median_ms(lambda: model(*inputs), args.repeats)}
        for tier, sess in sessions.items():
            times[f"ORT {tier}"] = median_ms(lambda s=sess: s.run(None, feed), args.repeats)
        # thread scaling of the native kernel: one session per intra-op thread count
        import onnxruntime as ort

        threads = {}
        for n in sorted({1, 2, os.cpu_count() or 1}):
            options = ort.SessionOptions()
            options.intra_op_num_threads = n
            sess = bridge.session(path, tier="native", sess_options=options)
            threads[n] = median_ms(lambda s=sess: s.run(None, feed), args.repeats)

    channels = shape[4]
    # bytes a kernel must move: per point a feat row, a depth value and three int32 ranks; plus the output
    moved = points * (channels * 4 + 4 + 12) + expected.numel() * 4
    src = np.ones(moved // 4, np.float32)
    dst = np.empty_like(src)
    copy_ms = median_ms(lambda: np.copyto(dst, src), args.repeats)
    gbps = {k: moved / (v * 1e6) for k, v in times.items()}
    copy_gbps = moved / (copy_ms * 1e6)

    print(f"bev_pool_v2: {points} points, {intervals} intervals, C={channels}, output {list(expected.shape)}, "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores")
    print(f"{'kernel':<14}{'median ms':>10}{'vs native':>11}{'GB/s':>8}{'of memcpy':>11}")
    native = times["ORT native"]
    for name, ms in times.items():
        print(f"{name:<14}{ms:>10.2f}{ms / native:>10.2f}x{gbps[name]:>8.2f}{gbps[name] / copy_gbps:>10.0%}")
    print(f"{'memcpy':<14}{copy_ms:>10.2f}{'':>11}{copy_gbps:>8.2f}{1:>10.0%}")
    print("native by intra-op threads: " + ", ".join(f"{n}: {ms:.2f} ms ({threads[1] / ms:.2f}x)"
                                                    for n, ms in threads.items()))
    print(f"native is {times['eager torch'] / native:.1f}x faster than eager torch (target >= 3x) and "
          f"{times['ORT function'] / native:.1f}x faster than the ORT function tier (target >= 2x)")
    result = {"points": points, "intervals": intervals, "channels": channels, "median_ms": times,
              "memcpy_ms": copy_ms, "gbps": gbps, "memcpy_gbps": copy_gbps,
              "speedup_vs_eager": times["eager torch"] / native, "speedup_vs_function": times["ORT function"] / native,
              "native_ms_by_threads": threads}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
