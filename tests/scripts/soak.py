"""Run one small model N times in one session; print RSS before/after as JSON (for leak checks).

Usage: soak.py TIER N
"""

import json
import sys
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: models

from models import pool_case  # noqa: E402

import bridge  # noqa: E402


def main(tier, n):
    pool, args = pool_case()
    sess = bridge.session(bridge.export(pool, args), tier=tier)
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
