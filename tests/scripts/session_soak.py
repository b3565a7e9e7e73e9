"""Open N sessions of one small model in one tier; print RSS growth after a warm-up as JSON (leak check
per session: each tier's options, library registrations and declarations).

Usage: session_soak.py TIER N
"""

import gc
import json
import sys
import time

import psutil
import torch

import bridge
import custom_ops  # noqa: F401  (registers the seed ops)

WARM_UP = 500  # sessions before the first measure: arenas, caches and the tier's one-time state settle


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 2)


def main(tier, n):
    data = bridge.export(Model(), (torch.randn(1, 2, 3, 3),)).SerializeToString()
    proc = psutil.Process()
    for _ in range(WARM_UP):
        bridge.session(data, tier=tier)
    gc.collect()
    before, start = proc.memory_info().rss, time.perf_counter()
    for _ in range(n):
        bridge.session(data, tier=tier)
    gc.collect()
    print(json.dumps({"tier": tier, "sessions": n, "rss_before": before, "rss_after": proc.memory_info().rss,
                      "seconds": time.perf_counter() - start}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
