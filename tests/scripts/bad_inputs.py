"""Run every bad input of tests/op_db.py in every kernel tier; print one JSON line per (op, case, tier)
with the error's class and message (null for none).

Also runs, as controls that must pass, the valid samples the bad inputs mutate and each entry's
fixed examples (float32). Models are single custom nodes whose inputs have no declared shape,
so nothing but the kernels' own checks stands between a bad input and memory. Run in a
subprocess by tests/test_reliability.py: a crash (abort, segfault) kills only this process, and
the tests see it as a failure.
"""

import json
import sys
from pathlib import Path

import onnxruntime as ort
import torch
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: op_db

from op_db import F32, OPS, TIERS  # noqa: E402

import bridge  # noqa: E402


def single_node(spec, valid: tuple, call: tuple):
    """A model of one node of ``spec`` typed like the valid call, with the attributes of ``call``."""
    spec_f = bridge.REGISTRY.functional(spec)
    names = [p.name for p in spec_f.tensors]
    types = [helper.np_dtype_to_tensor_dtype(a.numpy().dtype) for a in valid if isinstance(a, torch.Tensor)]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)]
    outputs = [helper.make_empty_tensor_value_info(f"y{i}") for i in range(spec_f.num_outputs)]
    attrs = {p.name: p.to_onnx_value(a) for p, a in zip(spec.params, call) if not p.is_tensor}
    node = helper.make_node(spec_f.name, names, [o.name for o in outputs], domain=spec_f.domain, **attrs)
    return helper.make_model(helper.make_graph([node], "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(spec_f.domain, 1)])


def attempt(spec, tier: str, valid: tuple, call: tuple):
    """(error class, message) of building a session and running ``call``, or (None, None)."""
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 4  # the rejections are expected; keep stderr readable
    try:
        sess = bridge.session(single_node(spec, valid, call), tier=tier,
                              sess_options=quiet if tier != "python" else None)
        bridge.parity.run_ort(sess, [a for a in call if isinstance(a, torch.Tensor)])
        return None, None
    except Exception as e:  # the tests judge the class and the message
        return type(e).__name__, str(e)


def main():
    for entry in OPS:
        spec = entry.spec
        # controls: the valid call each bad input mutates, and the entry's fixed examples
        bad = [(b.name, *entry.bad_call(b)) for b in entry.bad_inputs]
        controls = {f"valid:{base.name}": base.args for _, base, _ in bad}
        controls.update({f"valid:example_{i}": entry.args(make(F32)) for i, make in enumerate(entry.examples)})
        calls = [(name, args, args) for name, args in controls.items()]
        calls += [(name, base.args, call) for name, base, call in bad]
        for name, valid, call in calls:
            for tier in TIERS:
                kind, message = attempt(spec, tier, valid, call)
                print(json.dumps({"op": spec.qualname, "case": name, "tier": tier, "type": kind, "error": message}),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
