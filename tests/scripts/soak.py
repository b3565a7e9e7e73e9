"""Run one small model N times in one session; print RSS before/after as JSON (for leak checks).

Usage: soak.py TIER N
"""

import json
import sys

import numpy as np
import psutil
import torch

import bridge
import custom_ops  # noqa: F401
from custom_ops.bev_pool_v2 import random_case


class Pool(torch.nn.Module):
    def forward(self, *args):
        return torch.ops.bev.bev_pool_v2(*args, [1, 2, 4, 5, 6])


def main(tier, n):
    args = random_case()[:7]
    sess = bridge.session(bridge.export(Pool(), args), tier=tier)
    feed = bridge.parity.ort_feed(sess, args)
    bad = dict(feed)
    bad[list(feed)[2]] = np.full_like(feed[list(feed)[2]], -1)  # every 10th run fails: error paths must not leak
    proc = psutil.Process()
    for _ in range(500):  # warm-up: arenas and caches settle
        sess.run(None, feed)
    before = proc.memory_info().rss
    first = sess.run(None, feed)[0]
    errors = 0
    for i in range(n):
        if i % 10 == 9:
            try:
                sess.run(None, bad)
            except Exception:
                errors += 1
        else:
            out = sess.run(None, feed)[0]
    after = proc.memory_info().rss
    print(json.dumps({"tier": tier, "runs": n, "rss_before": before, "rss_after": after, "errors": errors,
                      "same_result": bool(np.array_equal(out, first))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
