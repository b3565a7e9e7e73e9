"""The benchmark suite, one command: ratios measured side by side in one process.

    python benchmarks/run.py [--quick] [--json benchmarks/results.json]

1. export overhead: bridge.export vs the same torch.export + torch.onnx.export without the
   bridge's extra passes (graph checks, rewrites, function attachment, full checker); target <= 10%
2. bridge.session() creation vs a plain onnxruntime.InferenceSession on the same file; target <= 5%
3. whole models per frame (the demo and IdentityModel): eager torch, torch.compile, AOTInductor
   (where it can compile the model), ORT native / function / python
4. bev_pool_v2 at BEVDet-R50 size: the floor (each byte the op touches read or written once, on
   the same threads: floor_op.py), ORT native
   (2 and 1 intra-op threads), ORT function, eager torch, torch.compile of gather + index_add, then
   lone calls (one call after 10 ms idle) of ORT native and of the floor (bev_pool_v2.measure, in a
   process of its own: on a VM the idle time before lone calls moves ORT's workers onto the calling
   thread's CPU for the calls that follow, bev_pool_v2's NOTE)
5. bev_pool_v2 scaling with point count (10k..2M) per tier, more depth bins on BEVDet-R50's fixed
   grid; the log-log slope says if cost is linear (the floor's own slope shows what the fixed
   grid's output allows; below 64k points the floor, as the kernel, runs on the calling thread)
6. the same over B = 1..8 frames of BEVDet-R50 in one call (everything grows with the points)
Each round times the second of two back-to-back calls of each contender (bev_pool_v2.round_robin;
the lone calls of 4. are timed once each, after the idle).
Absolute times are context; the ratios are the result. ``--quick`` (a smoke run) skips
torch.compile and AOTInductor, uses few repeats and points up to 100k.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

# NOTE: torch's OpenMP threads block instead of spinning, as the ORT sessions here do (see
# session_options): on 2 shared cores a spinning pool steals the cores from the runtime being
# timed. Only when this script starts the process (torch not yet loaded), never on import.
if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bev_pool_v2 as bev  # noqa: E402
import floor_op  # noqa: E402
import machine  # noqa: E402
from contenders import EAGER, FLOOR, FUNCTION, NATIVE, PYTHON  # noqa: E402
from spread import spread  # noqa: E402

import bridge  # noqa: E402
import custom_ops.demo as demo  # noqa: E402
from bridge.core.basics import files  # noqa: E402
from exporters.bodies.translation import translation_table  # noqa: E402

# the code this suite measures (machine.provenance): bev_pool_v2.py's, and for its export, session and
# whole-model sections every library folder; the suite itself
MEASURES = [*bev.MEASURES, "bridge", "exporters", "ort_kernels", "custom_ops", "benchmarks/run.py"]


def median_s(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def export_overhead(repeats: int, warmup: bool = True) -> dict:
    case = demo.build()

    def plain():
        program = torch.export.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes, strict=False)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(program, dynamo=True, custom_translation_table=translation_table(bridge.REGISTRY),
                              opset_version=20, optimize=True, verify=False, external_data=False)

    def full():
        bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)

    # NOTE: interleaved, so drift on the machine hits both sides alike; one warm-up of each (not
    # in --quick mode, which only checks that the measurement runs)
    t_plain, t_full = [], []
    if warmup:
        plain(), full()
    for _ in range(repeats):
        t_plain.append(median_s(plain, 1, 0))
        t_full.append(median_s(full, 1, 0))
    p, f = statistics.median(t_plain), statistics.median(t_full)
    return {"plain_s": p, "bridge_s": f, "overhead": f / p - 1, "target": 0.10}


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


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def aoti_runner(case, tmp: str):
    """AOTInductor package of the model, loaded back; raises where it cannot compile the model."""
    program = torch.export.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes, strict=False)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package = torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(tmp, "model.pt2"))
    return torch._inductor.aoti_load_package(package)


def model_runs(case, repeats: int, quick: bool, tiers=("native", "function", "python")) -> dict:
    """One frame of ``case`` per runtime, round-robin; every runtime's answer checked against eager."""
    proto = bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes)
    with torch.no_grad():
        expected = case.model(*case.args)
    fns = {EAGER: lambda: case.model(*case.args)}
    notes = {}
    with tempfile.TemporaryDirectory() as tmp:
        if quick:
            notes["torch.compile"] = notes["AOTInductor"] = "skipped in --quick mode"
        else:
            compiled = torch.compile(case.model)
            with torch.no_grad():
                assert bridge.compare("torch.compile", expected, compiled(*case.args).numpy()).passed
            fns["torch.compile"] = lambda: compiled(*case.args)
            try:
                runner = aoti_runner(case, tmp)
                with torch.no_grad():
                    got = runner(*case.args)
                got = got[0] if isinstance(got, (list, tuple)) else got
                assert bridge.compare("AOTInductor", expected, got.numpy()).passed
                fns["AOTInductor"] = lambda: runner(*case.args)
            except Exception as e:  # recorded, not faked: the reason goes into the JSON and README
                notes["AOTInductor"] = _first_line(e)
        for tier in tiers:
            sess = bridge.session(proto, tier=tier, sess_options=bev.session_options())
            feed = bridge.parity.ort_feed(sess, case.args)
            assert bridge.compare(tier, expected, sess.run(None, feed)[0]).passed
            fns[f"ORT {tier}"] = lambda s=sess, f=feed: s.run(None, f)
        with torch.no_grad():
            times = bev.rounds(fns, repeats)
    ms = {k: statistics.median(v) for k, v in times.items()}
    eager, native = ms[EAGER], ms.get(NATIVE)
    return {"name": case.name, "ms": ms, "vs_eager": {k: v / eager for k, v in ms.items()},
            "vs_native": {k: v / native for k, v in ms.items()} if native else {}, "notes": notes,
            "repeats": repeats, "ratio_quartiles": {f"{k} / {EAGER}": spread(v, times[EAGER])
                                                    for k, v in times.items() if k != EAGER}}


# NOTE: the order of each round, as in bev_pool_v2.measure: torch first, native last before the
# floor. A call right after eager torch runs slower for a while after it (measured at BEVDet-R50
# size: native 1.08 ms there vs 0.77 ms after the other ORT tiers), whichever call that is.
ORDER = ("function", "python", "native")


def floor_fn(session, inputs):
    """The floor at this size (floor_op.py: each byte read or written once, on the 2 intra-op threads
    the native session has), in ``session`` (one per export), fed ``inputs``."""
    feed = bridge.parity.ort_feed(session, inputs)
    return lambda: session.run(None, feed)


def loglog_slope(rows: list[dict], key: str, low: int = 0, minus: float = 0.0) -> float | None:
    """Least-squares slope of log(time - minus) over log(points), rows with at least ``low`` points."""
    pts = [(r["points"], r[key] - minus) for r in rows if key in r and r["points"] >= low]
    if len(pts) < 3 or any(t <= 0 for _, t in pts):
        return None
    return float(np.polyfit(np.log([p for p, _ in pts]), np.log([t for _, t in pts]), 1)[0])


def _slopes(rows, low=0, minus=None) -> dict:
    keys = [k for k in rows[0] if k not in ("target", "points", "batch")]
    out = {k: loglog_slope(rows, k, low, minus[k] if minus else 0.0) for k in keys}
    return {k: v for k, v in out.items() if v is not None}


def scaling(points_targets, repeats: int, python_max: int | None = None) -> dict:
    per_bin = bev.R50["cams"] * bev.R50["height"] * bev.R50["width"] * 0.8  # kept points per depth bin, roughly
    cases = [(t, *bev.bevdet_inputs(depth_bins=max(2, round(t / per_bin)))) for t in points_targets]
    # NOTE: one export with the depth bins, points and intervals dynamic, one session per tier for all sizes
    model = bev.Pool(cases[0][2])
    d, p, i = torch.export.Dim("depth_bins", min=2), torch.export.Dim("points"), torch.export.Dim("intervals")
    proto = bridge.export(model, cases[0][1], dynamic_shapes=({2: d}, None, {0: p}, {0: p}, {0: p}, {0: i}, {0: i}))
    sessions = {}
    for tier in ("native", "function", "python"):
        sessions[tier] = bridge.session(proto, tier=tier, sess_options=bev.session_options())
    floor = floor_op.floor_session(cases[0][1], cases[0][2], bev.session_options(),
                                   dynamic_shapes=({2: d}, None, {0: p}, {0: p}, {0: p}, {0: i}, {0: i}))
    # NOTE: the grid is fixed (BEVDet's 128x128), so every call also writes the whole output: a
    # cost that does not depend on the points. It is measured at 0 points (same grid, empty ranks
    # and intervals) and taken out for the slope of the per-point cost. The floor (each byte touched
    # at each size read or written once) shows what that fixed part allows.
    first = cases[0][1]
    empty = (*first[:2], *(t[:0] for t in first[2:]))
    rows = []
    for target, inputs, _ in [(0, empty, cases[0][2]), *cases]:
        fns = {EAGER: lambda i=inputs: model(*i)}
        for tier in ORDER:
            if tier == "python" and python_max is not None and target > python_max:  # a shorter run only
                continue
            feed = bridge.parity.ort_feed(sessions[tier], inputs)
            fns[f"ORT {tier}"] = lambda s=sessions[tier], f=feed: s.run(None, f)
        fns[FLOOR] = floor_fn(floor, inputs)
        with torch.no_grad():
            rows.append({"target": target, "points": int(inputs[2].numel()), **bev.round_robin(fns, repeats)})
    fixed, rows = rows[0], rows[1:]
    zero = {k: v for k, v in fixed.items() if k not in ("target", "points")}
    return {"rows": rows, "zero_points_ms": zero, "loglog_slope": _slopes(rows),
            "loglog_slope_above_100k": _slopes(rows, 100_000),
            "loglog_slope_above_100k_per_point": _slopes(rows, 100_000, zero), "target_above_100k": [0.9, 1.1]}


def scaling_frames(batches, repeats: int) -> dict:
    """B frames of BEVDet-R50 in one call: the points, feature maps and BEV output all grow with B."""
    rows = []
    for b in batches:
        inputs, shape = bev.bevdet_inputs(batch=b)
        model = bev.Pool(shape)
        proto = bridge.export(model, inputs)
        with torch.no_grad():
            expected = model(*inputs)
        fns = {EAGER: lambda m=model, i=inputs: m(*i)}
        for tier in ORDER:
            sess = bridge.session(proto, tier=tier, sess_options=bev.session_options())
            feed = bridge.parity.ort_feed(sess, inputs)
            assert bridge.compare(tier, expected, sess.run(None, feed)[0]).passed
            fns[f"ORT {tier}"] = lambda s=sess, f=feed: s.run(None, f)
        fns[FLOOR] = floor_fn(floor_op.floor_session(inputs, shape, bev.session_options()), inputs)
        with torch.no_grad():
            rows.append({"batch": b, "points": int(inputs[2].numel()), **bev.round_robin(fns, repeats)})
    return {"rows": rows, "loglog_slope": _slopes(rows), "target": [0.9, 1.1]}


def bevdet_r50(quick: bool) -> dict:
    """bev_pool_v2.measure at BEVDet-R50 size, run in a process of its own (``bev_pool_v2.py --json``).

    NOTE: its lone calls sleep, and on a VM the idle time leaves ORT's intra-op workers waking on the
    calling thread's CPU for the calls after it (bev_pool_v2's NOTE): the sections after it time
    2-thread sessions. A fresh process also gives eager torch the same start every run (run last
    in this process, after the scaling sections, its eager call took 30 ms instead of 48 ms)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bevdet_r50.json")
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bev_pool_v2.py"),
               "--repeats", str(3 if quick else 40), "--json", out, *(["--quick"] if quick else [])]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as fh:
            return json.load(fh)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repeats and points up to 100k (a smoke run)")
    parser.add_argument("--json", help="write all results here")
    args = parser.parse_args(argv)
    quick = args.quick
    reps = 2 if quick else 15
    targets = (10_000, 30_000, 100_000) if quick else (10_000, 30_000, 100_000, 300_000, 1_000_000, 2_000_000)

    results = {"machine": {**machine.describe(), **bev.conditions(), "torch_threads": torch.get_num_threads(),
                           "onnxruntime": ort.__version__, "torch": torch.__version__,
                           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "ort_intra_op_spinning": False,
                           "load_average_at_start": list(os.getloadavg())}}
    results["export"] = e = export_overhead(1 if quick else 5, warmup=not quick)
    print(f"1. export of the demo: bridge {e['bridge_s']:.2f} s vs plain torch.onnx {e['plain_s']:.2f} s -> "
          f"overhead {e['overhead']:+.1%} (target <= {e['target']:.0%})")
    results["session"] = so = session_overhead(reps * 2)
    print(f"2. session creation: bridge.session {so['bridge_ms']:.1f} ms vs InferenceSession {so['plain_ms']:.1f} ms "
          f"-> overhead {so['overhead']:+.1%} (target <= {so['target']:.0%})")
    results["models"] = models = {
        "demo": model_runs(demo.build(), reps * 4, quick),
        "identity": model_runs(demo.identity_model(), reps * 4, quick, tiers=("native", "function")),
    }
    print("3. whole models, one frame (median ms, x eager, x ORT native):")
    for m in models.values():
        print(f"   {m['name']}")
        for k, v in m["ms"].items():
            print(f"     {k:<16}{v:>9.3f} ms {m['vs_eager'][k]:>7.2f}x {m['vs_native'].get(k, float('nan')):>7.2f}x")
        for k, v in m["notes"].items():
            print(f"     {k}: {v}")
    results["bevdet_r50"] = r50 = bevdet_r50(quick)
    print("4. " + bev.report(r50).replace("\n", "\n   "))
    results["scaling"] = s = scaling(targets, 2 if quick else 9)
    keys = [EAGER, NATIVE, FUNCTION, PYTHON, FLOOR]
    print("5. bev_pool_v2 scaling, fixed 128x128 grid, more depth bins (median ms):")
    print("   " + f"{'points':>9}" + "".join(f"{k:>15}" for k in keys))
    for row in s["rows"]:
        print("   " + f"{row['points']:>9}" + "".join(f"{row[k]:>15.2f}" if k in row else f"{'-':>15}" for k in keys))
    print("   log-log slope (1.0 = linear): " + ", ".join(f"{k} {v:.2f}" for k, v in s["loglog_slope"].items()))
    print("   above 100k points: " + ", ".join(f"{k} {v:.2f}" for k, v in s["loglog_slope_above_100k"].items()))
    print("   at 0 points (the fixed grid's cost): "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in s["zero_points_ms"].items()))
    print("   above 100k, per-point cost (time - time at 0 points): "
          + ", ".join(f"{k} {v:.2f}" for k, v in s["loglog_slope_above_100k_per_point"].items()))
    frames = (1, 2) if quick else (1, 2, 4, 8)
    results["scaling_frames"] = f = scaling_frames(frames, 2 if quick else 9)
    keys = [EAGER, NATIVE, FUNCTION, PYTHON, FLOOR]
    print("6. bev_pool_v2 over B frames of BEVDet-R50 (median ms):")
    print("   " + f"{'frames':>7}{'points':>9}" + "".join(f"{k:>16}" for k in keys))
    for row in f["rows"]:
        print("   " + f"{row['batch']:>7}{row['points']:>9}" + "".join(f"{row[k]:>16.2f}" for k in keys))
    print("   log-log slope (1.0 = linear): " + ", ".join(f"{k} {v:.2f}" for k, v in f["loglog_slope"].items()))
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    results["provenance"] = machine.provenance(MEASURES)
    path = machine.json_path(args.json, quick, None)
    if path:
        print(f"wrote {files.write_json(path, results)}")
    return results


if __name__ == "__main__":
    main()
