"""Exercise every guarded onnxruntime-extensions failure of the Python tier; print JSON per case.

Run in a subprocess by tests/test_python_tier.py: the unguarded failures abort or segfault, so a
dead process here is a test failure, not a dead test runner.
"""

import json
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnxruntime.capi import _pybind_state as C

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: models

from models import pool_case  # noqa: E402

import bridge  # noqa: E402
from bridge.tools.testing import OpModule  # noqa: E402


def outcome(fn):
    try:
        value = fn()
        return {"ok": True, "value": value}
    except Exception as e:
        return {"ok": False, "type": type(e).__name__, "error": str(e)}


def run_methods(sess) -> dict:
    """Each run method of a session, as feed -> the first output (a numpy array)."""
    out = sess.get_outputs()[0].name

    def ort_values(feed):
        values = {n: ort.OrtValue.ortvalue_from_numpy(v) for n, v in feed.items()}
        return sess.run_with_ort_values(None, values)[0].numpy()

    def iobinding(feed):
        binding = sess.io_binding()
        for n, v in feed.items():
            binding.bind_cpu_input(n, v)
        binding.bind_output(out)
        sess.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]

    def ortvaluevector(feed):
        feeds, fetches = C.OrtValueVector(), C.OrtValueVector()
        for v in feed.values():
            feeds.push_back(ort.OrtValue.ortvalue_from_numpy(v)._ortvalue)
        sess.run_with_ortvaluevector(ort.RunOptions(), list(feed), feeds, [out], fetches,
                                     [C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)])
        return np.asarray(fetches[0].numpy())

    def run_async(feed):
        done, box = threading.Event(), {}

        def callback(results, user_data, error):
            box.update(results=results, error=error)
            done.set()

        sess.run_async(None, feed, callback, None)
        if not done.wait(120):
            raise TimeoutError("run_async never called back")
        if box["error"]:
            raise RuntimeError(f"callback error: {box['error']}")
        return box["results"][0]

    return {"run_with_ort_values": ort_values, "run_with_iobinding": iobinding,
            "run_with_ortvaluevector": ortvaluevector, "run_async": run_async}


def reuse(proto, tier, feed, bad) -> dict:
    """A session of ``tier`` on the one SessionOptions object every tier shares: valid and bad runs."""
    sess = bridge.session(proto, tier=tier, sess_options=SHARED_OPTIONS)
    return {"tier": tier, "valid": outcome(lambda: float(np.abs(sess.run(None, feed)[0]).sum())),
            "bad": outcome(lambda: sess.run(None, bad))}


SHARED_OPTIONS = ort.SessionOptions()


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
    for method, call in run_methods(sess).items():
        results[f"{method}_valid"] = outcome(lambda call=call: float(np.abs(call(feed)).sum()))
        results[f"{method}_kernel_exception"] = outcome(lambda call=call: call(bad).shape)
    results["options_reuse"] = {"runs": [reuse(proto, tier, feed, bad) for tier in
                                         ("native", "python", "function", "python", "native", "function")]}

    def exact(module, tensors) -> dict:
        """The python tier's first output vs eager torch at the tensors' own dtype."""
        sess = bridge.session(bridge.export(module, tensors, functions=False), tier="python")
        got = sess.run(None, bridge.parity.ort_feed(sess, tensors))[0]
        with torch.no_grad():
            want = module(*tensors).numpy()
        return {"dtype": str(got.dtype), "equal": bool(np.array_equal(got, want)), "shape": list(got.shape)}

    results["float16"] = outcome(lambda: exact(*pool_case(dtype=torch.float16)))
    crop = bridge.REGISTRY.get("opbridge::crop")
    module, tensors = OpModule.from_sample(crop, bridge.SampleInput((torch.randn(2, 4, 4, dtype=torch.float64),
                                                                     [0, 0, 2, 2])))
    results["float64"] = outcome(lambda: exact(module, tensors))

    @bridge.op("late::twice", fake=lambda x: torch.empty_like(x),
               sample_inputs=lambda d: [bridge.SampleInput((torch.ones(2, dtype=d),))])
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    class Late(torch.nn.Module):
        def forward(self, x):
            return twice(x)

    late = bridge.export(Late(), (torch.ones(3),), functions=False)
    x3 = {"x": np.arange(3, dtype=np.float32)}
    # an op registered after the first python-tier session runs, in a later generation of declarations
    results["declared_after_register"] = outcome(
        lambda: bridge.session(late, tier="python").run(None, x3)[0].tolist())
    # options that got the kernels before late::twice existed cannot learn it: refused, naming the fix
    results["declared_after_register_reused_options"] = outcome(
        lambda: bridge.session(late, tier="python", sess_options=SHARED_OPTIONS).run(None, x3)[0].tolist())
    results["process_still_serves"] = outcome(
        lambda: float(np.abs(bridge.session(proto, tier="python").run(None, feed)[0]).sum()))
    for name, result in results.items():
        print(json.dumps({"case": name, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
