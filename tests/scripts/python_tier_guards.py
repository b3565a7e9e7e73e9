"""Exercise every guarded onnxruntime-extensions failure of the Python tier; print JSON per case.

Run in a subprocess by tests/test_python_tier.py: the unguarded failures abort or segfault, so a
dead process here is a test failure, not a dead test runner.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: models

import bridge  # noqa: E402
from bridge.tools.testing import OpModule  # noqa: E402
from models import pool_case  # noqa: E402


def outcome(fn):
    try:
        value = fn()
        return {"ok": True, "value": value}
    except Exception as e:
        return {"ok": False, "type": type(e).__name__, "error": str(e)}


def main():
    results = {}
    pool, args = pool_case()
    proto = bridge.export(pool, args, functions=False)
    sess = bridge.session(proto, tier="python")
    feed = bridge.parity.ort_feed(sess, args)
    results["valid"] = outcome(lambda: float(np.abs(sess.run(None, feed)[0]).sum()))
    bad = dict(feed)
    bad[list(feed)[2]] = np.full_like(feed[list(feed)[2]], 10**6)  # ranks_depth out of range: eager raises
    results["kernel_exception"] = outcome(lambda: sess.run(None, bad))
    results["after_exception"] = outcome(lambda: float(np.abs(sess.run(None, feed)[0]).sum()))

    half = bridge.export(*pool_case(dtype=torch.float16), functions=False)
    results["float16"] = outcome(lambda: bridge.session(half, tier="python"))
    crop = bridge.REGISTRY.get("opbridge::crop")
    module, tensors = OpModule.from_sample(crop, bridge.SampleInput((torch.randn(2, 4, 4, dtype=torch.float64),
                                                                     [0, 0, 2, 2])))
    results["float64"] = outcome(lambda: bridge.session(bridge.export(module, tensors), tier="python"))

    @bridge.op("late::twice", fake=lambda x: torch.empty_like(x),
               sample_inputs=lambda d: [bridge.SampleInput((torch.ones(2, dtype=d),))])
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    class Late(torch.nn.Module):
        def forward(self, x):
            return twice(x)

    late = bridge.export(Late(), (torch.ones(3),), functions=False)
    results["declared_after_register"] = outcome(lambda: bridge.session(late, tier="python"))
    results["process_still_serves"] = outcome(
        lambda: float(np.abs(bridge.session(proto, tier="python").run(None, feed)[0]).sum()))
    for name, result in results.items():
        print(json.dumps({"case": name, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
