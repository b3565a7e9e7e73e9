"""The benchmark suite, one command: ratios measured side by side in one process.

    python benchmarks/run.py [--quick] [--json benchmarks/results.json]

1. export overhead: bridge.export vs the same torch.export + torch.onnx.export without the
   bridge's extra passes (graph checks, rewrites, function attachment, full checker); target <= 10%
2. demo model run per ORT tier vs eager torch
3. bev_pool_v2 scaling with point count (10k..1M) per tier; the log-log slope says if cost is linear
4. bridge.session() creation vs a plain onnxruntime.InferenceSession on the same file; target <= 5%
Absolute times are context; the ratios are the result.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bridge  # noqa: E402
import custom_ops.demo as demo  # noqa: E402
from bev_pool_v2 import Pool, bevdet_inputs  # noqa: E402
from exporters.translation import translation_table  # noqa: E402


def median_s(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def export_overhead(repeats: int) -> dict:
    case = demo.build()

    def plain():
        program = torch.export.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes, strict=False)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(program, dynamo=True, custom_translation_table=translation_table(bridge.REGISTRY),
                              opset_version=20, optimize=True, verify=False, external_data=False)

    def full():
        bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)

    # NOTE: interleaved, so drift on the machine hits both sides alike
    t_plain, t_full = [], []
    plain(), full()
    for _ in range(repeats):
        t_plain.append(median_s(plain, 1, 0))
        t_full.append(median_s(full, 1, 0))
    p, f = statistics.median(t_plain), statistics.median(t_full)
    return {"plain_s": p, "bridge_s": f, "overhead": f / p - 1, "target": 0.10}


def demo_runs(repeats: int) -> dict:
    case = demo.build()
    proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    out = {}
    with torch.no_grad():
        out["eager torch"] = median_s(lambda: case.model(*case.args), repeats)
    for tier in ("function", "native", "python"):
        sess = bridge.session(proto, tier=tier)
        feed = bridge.parity.ort_feed(sess, case.args)
        out[f"ORT {tier}"] = median_s(lambda s=sess: s.run(None, feed), repeats)
    return {k: {"ms": v * 1e3, "vs_eager": v / out["eager torch"]} for k, v in out.items()}


def scaling(points_targets, repeats: int) -> dict:
    rows = []
    for target in points_targets:
        depth_bins = max(1, round(target / (6 * 16 * 44 * 0.8)))
        inputs, shape = bevdet_inputs(depth_bins=depth_bins)
        model = Pool(shape)
        proto = bridge.export(model, inputs)
        row = {"points": int(inputs[2].numel())}
        with torch.no_grad():
            row["eager torch"] = median_s(lambda: model(*inputs), repeats) * 1e3
        tiers = ("native", "function") + (("python",) if target <= 100_000 else ())
        for tier in tiers:
            sess = bridge.session(proto, tier=tier)
            feed = bridge.parity.ort_feed(sess, inputs)
            row[f"ORT {tier}"] = median_s(lambda s=sess: s.run(None, feed), repeats) * 1e3
        rows.append(row)
    slopes = {}
    for key in rows[0]:
        if key == "points":
            continue
        pts = [(r["points"], r[key]) for r in rows if key in r]
        if len(pts) >= 3:
            x, y = np.log([p for p, _ in pts]), np.log([t for _, t in pts])
            slopes[key] = float(np.polyfit(x, y, 1)[0])
    return {"rows": rows, "loglog_slope": slopes}


def session_overhead(repeats: int) -> dict:
    case = demo.build()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "demo.onnx")
        bridge.export(case.model, case.args, path, dynamic_shapes=case.dynamic_shapes)
        t_plain, t_bridge = [], []
        for _ in range(repeats):  # interleaved
            t_plain.append(median_s(lambda: ort.InferenceSession(path, providers=["CPUExecutionProvider"]), 1, 0))
            t_bridge.append(median_s(lambda: bridge.session(path), 1, 0))
    p, b = statistics.median(t_plain), statistics.median(t_bridge)
    return {"plain_ms": p * 1e3, "bridge_ms": b * 1e3, "overhead": b / p - 1, "target": 0.05}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repeats and points up to 100k (a smoke run)")
    parser.add_argument("--json", help="write all results here")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else 15
    targets = (10_000, 30_000, 100_000) if args.quick else (10_000, 30_000, 100_000, 300_000, 1_000_000)

    results = {"machine": {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                           "onnxruntime": ort.__version__, "torch": torch.__version__}}
    results["export"] = e = export_overhead(2 if args.quick else 5)
    print(f"1. export of the demo: bridge {e['bridge_s']:.2f} s vs plain torch.onnx {e['plain_s']:.2f} s -> "
          f"overhead {e['overhead']:+.1%} (target <= {e['target']:.0%})")
    results["demo_run"] = d = demo_runs(reps * 4)
    print("2. demo model run (median):")
    for k, v in d.items():
        print(f"   {k:<14}{v['ms']:>9.3f} ms  {v['vs_eager']:>6.2f}x eager")
    results["scaling"] = s = scaling(targets, max(3, reps // 3))
    keys = [k for k in s["rows"][0] if k != "points"] + (["ORT python"] if "ORT python" not in s["rows"][0] else [])
    print("3. bev_pool_v2 scaling (median ms):")
    print("   " + f"{'points':>9}" + "".join(f"{k:>15}" for k in keys))
    for row in s["rows"]:
        print("   " + f"{row['points']:>9}" + "".join(f"{row[k]:>15.2f}" if k in row else f"{'-':>15}" for k in keys))
    print("   log-log slope (1.0 = linear): " + ", ".join(f"{k} {v:.2f}" for k, v in s["loglog_slope"].items()))
    results["session"] = so = session_overhead(reps * 2)
    print(f"4. session creation: bridge.session {so['bridge_ms']:.1f} ms vs InferenceSession {so['plain_ms']:.1f} ms "
          f"-> overhead {so['overhead']:+.1%} (target <= {so['target']:.0%})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
