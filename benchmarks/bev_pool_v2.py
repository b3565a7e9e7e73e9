"""bev_pool_v2 at BEVDet-R50 size: every implementation side by side in one process.

BEVDet-R50: 6 cameras, D=59 depth bins, 16x44 feature maps, C=64, grid 128x128x1 (~248k kept
points, ~13.5k intervals). Timed round-robin, medians over rounds, so load on the machine hits all
alike. Two phases of rounds, in this order:

1. back to back (each runs twice, the second call is timed): eager torch, torch.compile of pure-torch
   gather + index_add (the same sum without the custom op), ORT function tier (the op's portable ONNX
   body), ORT native forced onto each lower ISA path this CPU has (libraries built with
   -DOPBRIDGE_NO_AVX512 / -DOPBRIDGE_BASELINE_ONLY, loaded side by side), ORT native with 1 intra-op
   thread and the floor on 1 thread, ORT native with every index into a few L1-resident rows (the
   issue bound, bound.py's run), ORT native (2 intra-op threads; the best ISA path of this CPU) and the
   floor on the same 2 threads;
2. lone calls (what a frame-by-frame caller does): the floor's back-to-back pair, sleep 10 ms, one
   timed call of ORT native (2 threads); the floor's pair again, sleep 10 ms, one timed call of ORT
   native with 1 thread (what the second thread brings to a lone call); sleep 10 ms, one timed
   call of the floor (2 threads).

The floor (floor_op.py, floor_kernel.cc) is an op of bev_pool_v2's signature run in onnxruntime like
the kernel: it reads every input byte once and writes every output byte once, on the same intra-op
threads as the native contender it is held against (2 for native, 1 for native with 1 thread), through
the same session path. (A numpy copy, timed here before, moved each byte twice on one thread against a
kernel on two: it was no floor.)

NOTE: the phases are apart because idle time changes where the next calls' threads run, on a VM:
after a 10 ms sleep Linux wakes ORT's intra-op worker on the calling thread's CPU (presumably as
the halted vCPU counts as preempted), where it starts only when the call's own thread is done
(measured with sched_getcpu in the kernel: from the first sleep on, both loops of every call on
one CPU, the worker arriving after the last task). The worker then stays there, so calls "back to back" in
rounds that also sleep ran on one core (2 threads 0.77 ms vs 0.42 ms in rounds without sleeps).
benchmarks/run.py runs this in a process of its own.

Every ratio is taken per round (the two contenders timed in the same round, one after the other),
and reported as the quartiles of its rounds; a ratio of two phases (torch.compile over the lone call)
pairs no rounds: its range is the widest the two contenders' quartiles allow. A target is "met" only
when the whole interquartile range meets it, "not met" when none of it does, else "undecided"
(:func:`verdict`). The targets (issues #27, #35, #46):
- ``native / floor``: native back to back over the floor back to back, <= 1.3x;
- ``native avx2 / floor``: the AVX2 path back to back over the same floor, <= 1.5x (on an AVX-512 CPU
  the AVX2 path is forced by its library build; the JSON's ``isa_paths`` says which path each ran);
- ``native lone / floor lone``: the native lone call over a lone floor call under the same conditions
  (each after 10 ms idle, each after the other's data went through the caches), <= 1.3x;
- ``torch.compile / native lone``: torch.compile back to back over the native lone call, >= 25x.

Before timing: native float32 against a float64 evaluation; native bitwise equal over repeated
runs, and bitwise equal between 1 and 2 intra-op threads (a cell's sum must not depend on how the
work was split); function tier and torch.compile against eager.

    python benchmarks/bev_pool_v2.py [--repeats 40] [--quick] [--depth-bins 59] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

# NOTE: torch's OpenMP threads block instead of spinning, as the ORT sessions here do (see
# session_options): on 2 shared cores a spinning pool steals the cores from the runtime being
# timed. Only when this script starts the process (torch not yet loaded): an import (a test's) must
# not change the environment of the importing process and its children.
if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import floor_op  # noqa: E402
import machine  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from contenders import (  # noqa: E402
    COMPILED,
    EAGER,
    FLOOR,
    FLOOR_1T,
    FLOOR_LONE,
    FUNCTION,
    NATIVE,
    NATIVE_1T,
    NATIVE_1T_LONE,
    NATIVE_L1,
    NATIVE_LONE,
    native_path,
)
from spread import quartiles, spread, verdict  # noqa: E402

import bridge  # noqa: E402
import custom_ops  # noqa: E402,F401
from custom_ops.bev_pool_v2 import voxel_pooling_prepare  # noqa: E402
from custom_ops.demo import frustum_coords  # noqa: E402
from ort_kernels import build  # noqa: E402

# BEVDet-R50's view transformer (its public config: nuScenes' 6 cameras): cameras, depth bins, feature map,
# channels, grid (X, Y, Z)
R50 = {"cams": 6, "depth_bins": 59, "height": 16, "width": 44, "channels": 64, "grid": (128, 128, 1)}
# NOTE: every "floor" in a target is the floor back to back (FLOOR), the lone targets included.
TARGETS = {"native_vs_floor_max": 1.3, "native_avx2_vs_floor_max": 1.5, "native_lone_vs_floor_lone_max": 1.3,
           "compile_vs_native_min": 20.0,
           "compile_vs_native_lone_min": 25.0, "function_vs_eager_max": 0.35, "thread_speedup_min": 1.7,
           "native_vs_float64_max_abs": 1e-5}
# the code this benchmark measures (machine.provenance; tests/test_doc_figures.py's rule): the kernel, its
# library's build, the op's definition and body, the floor and the benchmark itself
MEASURES = ["ort_kernels/cpu/bev_op_bev_pool_v2.cc", "ort_kernels/cpu/common.cc", "ort_kernels/include",
            "ort_kernels/register.cc", "ort_kernels/build.py", "custom_ops/bev_pool_v2.py", "benchmarks/bev_pool_v2.py",
            "benchmarks/floor_op.py", "benchmarks/floor_kernel.cc", "benchmarks/spread.py"]
LONE_IDLE_S = 0.010  # the idle time before a lone call: a frame-by-frame caller's gap
# The build flags that leave the paths above an ISA out of the native library (ort_kernels/include/opbridge_kernel.h)
PATH_FLAGS = {"avx512": "", "avx2": "-DOPBRIDGE_NO_AVX512", "baseline": "-DOPBRIDGE_BASELINE_ONLY"}


class Pool(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, depth, feat, rd, rf, rb, starts, lengths):
        return torch.ops.bev.bev_pool_v2(depth, feat, rd, rf, rb, self.shape, starts, lengths)


def bevdet_inputs(depth_bins=R50["depth_bins"], channels=R50["channels"], cams=R50["cams"], h=R50["height"],
                  w=R50["width"], grid=R50["grid"], seed=0, batch=1):
    """Frustum points of a ring of cameras (``batch`` frames), prepared as BEVDet's
    voxel_pooling_prepare_v2 does."""
    g = torch.Generator().manual_seed(seed)
    coords = frustum_coords(batch, cams, depth_bins, h, w, grid, jitter=0.7, seed=seed)
    ranks = voxel_pooling_prepare(coords, grid)
    depth = torch.rand(batch, cams, depth_bins, h, w, generator=g).softmax(2)
    feat = torch.randn(batch, cams, h, w, channels, generator=g)
    return (depth, feat, *ranks), [batch, grid[2], grid[1], grid[0], channels]


def gather_index_add(depth, feat, ranks_depth, ranks_feat, ranks_bev, shape: list[int]):
    """The same sum in plain torch (every point adds into its own ranks_bev cell; the intervals of
    voxel_pooling_prepare partition the points, so this equals the op on its inputs)."""
    b, z, y, x, c = shape
    values = feat.reshape(-1, c)[ranks_feat.long()] * depth.reshape(-1)[ranks_depth.long()].unsqueeze(-1)
    out = torch.zeros(b * z * y * x, c, dtype=feat.dtype).index_add_(0, ranks_bev.long(), values)
    return out.reshape(b, z, y, x, c).permute(0, 4, 1, 2, 3).contiguous()


def bytes_touched(inputs, output) -> int:
    """The floor's size: each input and output byte once (re-reads of a feature row across depth
    bins are not counted again)."""
    return sum(t.numel() * t.element_size() for t in inputs) + output.numel() * output.element_size()


def round_robin(fns: dict, repeats: int, lone: tuple[str, ...] = ()) -> dict[str, float]:
    """Median ms of each callable over :func:`rounds`."""
    return {k: statistics.median(v) for k, v in rounds(fns, repeats, lone).items()}


def conditions() -> dict:
    """When and under what load a run was taken (the load averages over 1, 5 and 15 minutes)."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average": list(os.getloadavg()), "cpus_usable": len(os.sched_getaffinity(0))}


def rounds(fns: dict, repeats: int, lone: tuple[str, ...] = ()) -> dict[str, list[float]]:
    """The ms of each callable in each of ``repeats`` rounds, in the order given; in each round every
    callable runs twice back to back and the second call is timed, except names in ``lone``: after
    ``LONE_IDLE_S`` of sleep, one call, timed.

    NOTE: the second call is warm: its threads awake and, where they fit the 32 MiB L3, its inputs
    still in cache (the floor's two buffers too, up to BEVDet-R50 size) - a best case, near a model
    that runs frame after frame. A lone call is what a frame-by-frame caller gets: the idle workers
    have gone to sleep (and their cores may have been halted), the caches hold what ran before.
    """
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if name in lone:
                time.sleep(LONE_IDLE_S)
            else:
                fn()
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def session_options(threads: int = 2) -> ort.SessionOptions:
    """ORT options for sessions timed side by side: ``threads`` intra-op threads, no spinning.

    NOTE: an idle ORT pool spins its threads after each run; with several sessions (and torch's
    own pool) in one process on 2 cores, the spinning pools of the sessions not running steal the
    cores from the one that is (measured: native with 2 threads slower than with 1). Real
    deployments run one session; here none spins, so the side-by-side times stay comparable.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def path_libraries() -> dict[str, str]:
    """A native library per ISA path this CPU runs, best first, each built without the paths above it
    (cached like any build), keyed by the path its kernels report taking."""
    libraries = {}
    saved = os.environ.get(build.CXXFLAGS_ENV)
    try:
        for isa in machine.cpu_isa_paths():
            os.environ[build.CXXFLAGS_ENV] = " ".join(filter(None, (saved, PATH_FLAGS[isa])))
            path = str(build.library_path())
            libraries[machine.library_isa(path)] = path
    finally:
        if saved is None:
            os.environ.pop(build.CXXFLAGS_ENV, None)
        else:
            os.environ[build.CXXFLAGS_ENV] = saved
    return libraries


def measure(repeats: int = 40, quick: bool = False, config: dict | None = None) -> dict:
    """Everything above at one size (``config`` overrides R50's sizes); ``quick`` skips torch.compile."""
    cfg = dict(R50, **(config or {}))
    inputs, shape = bevdet_inputs(cfg["depth_bins"], cfg["channels"], cfg["cams"], cfg["height"], cfg["width"],
                                  tuple(cfg["grid"]))
    depth, feat, rd, rf, rb, starts, lengths = inputs
    model = Pool(shape)
    with torch.no_grad():
        expected = model(*inputs)
        expected64 = model(depth.double(), feat.double(), *inputs[2:])
    libraries = path_libraries()
    best, *lower = libraries
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.onnx")
        bridge.export(model, inputs, path)
        sessions = {NATIVE: bridge.session(path, tier="native", sess_options=session_options(2),
                                           native_library=libraries[best]),
                    NATIVE_1T: bridge.session(path, tier="native", sess_options=session_options(1),
                                              native_library=libraries[best]),
                    FUNCTION: bridge.session(path, tier="function", sess_options=session_options(2))}
        sessions.update({native_path(isa): bridge.session(path, tier="native", sess_options=session_options(2),
                                                          native_library=libraries[isa]) for isa in lower})
    isa_paths = {**dict.fromkeys((NATIVE, NATIVE_1T, NATIVE_LONE, NATIVE_1T_LONE), best),
                 **{native_path(isa): isa for isa in lower}}
    feed = bridge.parity.ort_feed(sessions[NATIVE], inputs)

    checks = {}
    runs = [sessions[NATIVE].run(None, feed)[0] for _ in range(5)]
    checks["native_deterministic"] = all(np.array_equal(runs[0], r) for r in runs[1:])
    # NOTE: the kernel may take a serial or a parallel path; a cell's sum must be the same on both
    checks["native_same_on_1_and_2_threads"] = all(
        np.array_equal(runs[0], sessions[NATIVE_1T].run(None, feed)[0]) for _ in range(2))
    checks["native_vs_float64_max_abs"] = float(np.abs(runs[0].astype(np.float64) - expected64.numpy()).max())
    for isa in lower:  # NOTE: every path rounds each multiply and add apart, in the same order
        got = sessions[native_path(isa)].run(None, feed)[0]
        checks[f"native {isa} path bitwise equal to {best}"] = bool(np.array_equal(runs[0], got))
        checks[f"native {isa} path vs float64 max abs"] = float(np.abs(got.astype(np.float64) - expected64.numpy()).max())
    got_function = [sessions[FUNCTION].run(None, feed)[0] for _ in range(2)]
    checks["function_deterministic"] = np.array_equal(got_function[0], got_function[1])
    checks["function_vs_eager"] = bridge.compare(FUNCTION, expected, got_function[0]).max_abs
    for name in sessions:
        row = bridge.compare(name, expected, sessions[name].run(None, feed)[0])
        assert row.passed, row  # same answer before timing anything

    # the floor, on the same threads as the native contender it is held against (floor_op.py)
    floors = {FLOOR: floor_op.floor_session(inputs, shape, session_options(2)),
              FLOOR_1T: floor_op.floor_session(inputs, shape, session_options(1))}
    for name, sess in floors.items():
        zeros, total = sess.run(None, feed)
        checks[f"{name} read each input byte once"] = int(total[0]) == floor_op.checksum(inputs)
        assert zeros.shape == expected.shape and not zeros.any(), name
    hot = bridge.parity.ort_feed(sessions[NATIVE], hot_indices(inputs))
    threads = {**dict.fromkeys((NATIVE, NATIVE_L1, NATIVE_LONE, FLOOR, FLOOR_LONE, FUNCTION), 2),
               **dict.fromkeys((NATIVE_1T, NATIVE_1T_LONE, FLOOR_1T), 1), **{native_path(isa): 2 for isa in lower},
               EAGER: torch.get_num_threads()}
    isa_paths[NATIVE_L1] = best

    nbytes = bytes_touched(inputs, expected)
    # NOTE: torch first: its OpenMP threads spin a little after each call, which would slow the next
    # call; that is then an ORT session's (tens of ms), never the floor's or native's.
    fns = {EAGER: lambda: model(*inputs)}
    compiled_note = None
    if quick:
        compiled_note = "skipped in --quick mode"
    else:
        compiled = torch.compile(gather_index_add, dynamic=False)
        with torch.no_grad():
            got = compiled(depth, feat, rd, rf, rb, shape)
        row = bridge.compare(COMPILED, expected, got.numpy())
        assert row.passed, row
        checks["compile_vs_eager"] = row.max_abs
        fns[COMPILED] = lambda: compiled(depth, feat, rd, rf, rb, shape)
        threads[COMPILED] = torch.get_num_threads()
    fns[FUNCTION] = lambda: sessions[FUNCTION].run(None, feed)
    paths = [native_path(isa) for isa in lower]
    fns.update({name: (lambda s=sessions[name]: s.run(None, feed)) for name in paths})
    # NOTE: each floor right after the native contender held against it: a per-round ratio pairs
    # two calls a few milliseconds apart
    fns[NATIVE_1T] = lambda: sessions[NATIVE_1T].run(None, feed)
    fns[FLOOR_1T] = lambda: floors[FLOOR_1T].run(None, feed)
    fns[NATIVE_L1] = lambda: sessions[NATIVE].run(None, hot)
    fns[NATIVE] = lambda: sessions[NATIVE].run(None, feed)
    fns[FLOOR] = lambda: floors[FLOOR].run(None, feed)
    start = conditions()
    with torch.no_grad():
        times = rounds(fns, repeats)
    # the lone calls (rounds sleeps before each): each native one after the floor's pair, the floor's
    # own lone call after a native call, so each finds the other's data in the caches
    again = FLOOR + " again"
    lone = {FLOOR: fns[FLOOR], NATIVE_LONE: fns[NATIVE], again: fns[FLOOR], NATIVE_1T_LONE: fns[NATIVE_1T],
            FLOOR_LONE: fns[FLOOR]}
    lone_times = rounds(lone, repeats, lone=(NATIVE_LONE, NATIVE_1T_LONE, FLOOR_LONE))
    end = conditions()
    times.update({k: v for k, v in lone_times.items() if k not in (FLOOR, again)})
    ms = {k: statistics.median(v) for k, v in times.items()}

    def q(a: str, b: str) -> list[float]:  # paired when both were timed in the same phase's rounds
        return spread(times[a], times[b], paired=(a in lone_times) == (b in lone_times))

    spreads = {"native / floor": q(NATIVE, FLOOR),
               "native 1 thread / floor 1 thread": q(NATIVE_1T, FLOOR_1T),
               **{f"native {isa} / floor": q(native_path(isa), FLOOR) for isa in lower},
               "native lone / floor lone": q(NATIVE_LONE, FLOOR_LONE),
               "native indices in L1 / native": q(NATIVE_L1, NATIVE),
               "native lone / native": q(NATIVE_LONE, NATIVE),
               "native lone, 1 -> 2 threads speedup": q(NATIVE_1T_LONE, NATIVE_LONE),
               "eager / native": q(EAGER, NATIVE),
               "function / native": q(FUNCTION, NATIVE),
               "function / eager": q(FUNCTION, EAGER),
               "native 1 -> 2 threads speedup": q(NATIVE_1T, NATIVE),
               "floor 1 -> 2 threads speedup": q(FLOOR_1T, FLOOR)}
    if COMPILED in ms:
        spreads["torch.compile / native"] = q(COMPILED, NATIVE)
        spreads["torch.compile / native lone"] = q(COMPILED, NATIVE_LONE)
        spreads["eager / torch.compile"] = q(EAGER, COMPILED)
    result = {"config": {**cfg, "grid": list(cfg["grid"])}, "points": int(rd.numel()),
              "intervals": int(starts.numel()), "output_shape": list(expected.shape), "bytes_touched": nbytes,
              "repeats": repeats, "machine": machine.describe(), "conditions": {"start": start, "end": end},
              "provenance": machine.provenance(MEASURES),
              "isa_paths": isa_paths, "threads": threads,
              "floor": "bench::bev_pool_v2_floor: each input byte read once, each output byte written once, "
                       "in onnxruntime on the native contender's intra-op threads (benchmarks/floor_op.py)",
              "quartiles_ms": {k: quartiles(v) for k, v in times.items()},
              "torch_threads": torch.get_num_threads(), "ort_intra_op_spinning": False,
              "lone_idle_ms": LONE_IDLE_S * 1e3, "median_ms": ms,
              "vs_floor": {k: v / ms[FLOOR] for k, v in ms.items()},
              "floor_gbps": nbytes / (ms[FLOOR] * 1e6), "ratios": {k: v[1] for k, v in spreads.items()},
              "ratio_quartiles": spreads, "checks": checks, "targets": TARGETS,
              "torch.compile": compiled_note or "compiled"}
    result["verdicts"] = {name: v for name, *_, v in target_rows(result)}
    return result


def hot_indices(inputs):
    """``inputs`` with every rank inside a few rows that stay in L1 (same lengths and intervals):
    ``ranks_feat % 8`` (8 feat rows, 2 KiB at C=64), ``ranks_depth % 64``."""
    depth, feat, rd, rf, rb, starts, lengths = inputs
    return depth, feat, rd % 64, rf % 8, rb, starts, lengths


def target_rows(r: dict) -> list[tuple[str, list[float], bool, float, str]]:
    """The issue's native targets: (ratio name, its [q1, median, q3], True for an upper bound, bound,
    :func:`verdict`)."""
    spreads, targets = r["ratio_quartiles"], r["targets"]
    rows = [("native / floor", True, targets["native_vs_floor_max"])]
    avx2 = "native / floor" if r["isa_paths"][NATIVE] == "avx2" else "native avx2 / floor"
    if avx2 in spreads and avx2 != "native / floor":
        rows.append((avx2, True, targets["native_avx2_vs_floor_max"]))
    rows.append(("native lone / floor lone", True, targets["native_lone_vs_floor_lone_max"]))
    if "torch.compile / native lone" in spreads:
        rows.append(("torch.compile / native lone", False, targets["compile_vs_native_lone_min"]))
    return [(n, spreads[n], up, b, verdict(spreads[n], b, up)) for n, up, b in rows]


def report(r: dict) -> str:
    m = r["machine"]
    lines = [f"bev_pool_v2: {r['points']} points, {r['intervals']} intervals, C={r['config']['channels']}, output "
             f"{r['output_shape']}, {r['bytes_touched'] / 1e6:.2f} MB touched, {r['repeats']} rounds, "
             f"{m['cpu_model']} ({m['cpu_family_model']}), {m['cores']} cores, caches {m['caches']}",
             f"{'kernel':<36}{'median ms':>10}{'x floor':>9}  ISA path threads"]
    for name, ms in r["median_ms"].items():
        lines.append(f"{name:<36}{ms:>10.3f}{r['vs_floor'][name]:>9.2f}  {r['isa_paths'].get(name, ''):9s}"
                     f"{r['threads'].get(name, '')}")
    lines.append("ratios [q1, median, q3]: " + ", ".join(f"{k} {a:.2f}-{m:.2f}-{b:.2f}" for k, (a, m, b)
                                                         in r["ratio_quartiles"].items()))
    lines.append("targets: " + "; ".join(
        f"{name} {q1:.2f}-{q3:.2f} {'<=' if upper else '>='} {bound:g}: {v.upper()}"
        for name, (q1, _, q3), upper, bound, v in target_rows(r)))
    c = r["conditions"]
    lines.append(f"load average {c['start']['load_average'][0]:.2f} -> {c['end']['load_average'][0]:.2f}, "
                 f"{c['start']['date']}")
    lines.append("checks: " + ", ".join(f"{k} {v}" for k, v in r["checks"].items()))
    if r["torch.compile"] != "compiled":
        lines.append(f"torch.compile: {r['torch.compile']}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="skip torch.compile (a smoke run)")
    parser.add_argument("--depth-bins", type=int, default=R50["depth_bins"], help="fewer for a smaller run")
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args(argv)
    result = measure(args.repeats, args.quick, {"depth_bins": args.depth_bins})
    print(report(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
