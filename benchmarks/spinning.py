"""onnxruntime's intra-op spinning on or off, for a native session called frame after frame (the
figures of docs/tiers.md's note on spinning).

    python benchmarks/spinning.py [--repeats 40] [--processes 3] [--json PATH] [--readme]

bev_pool_v2 at BEVDet-R50 size in the native tier with 2 intra-op threads and
``session.intra_op.allow_spinning`` "1" (onnxruntime's default) or "0", each session in a process of
its own (the processes alternate: on, off, on, off, ...): in each, ``repeats`` back-to-back pairs (the
second call of each timed), then ``repeats`` lone calls (each after 10 ms idle). Then one process with
spinning off whose rounds mix both (a back-to-back pair, then 10 ms idle and a lone call): there the
back-to-back call follows idle time, which leaves the worker on the caller's CPU (bev_pool_v2's NOTE).
Medians and quartiles over all processes' calls. Writes benchmarks/results/spinning.json (not with
--quick, unless --json says where); ``--readme`` writes the ``spinning`` block of docs/tiers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bev_pool_v2 as bev
import doc_markers
import machine
import numpy as np
import torch
from readme_table import fmt_ms, machine_line
from spread import quartiles

import bridge
import custom_ops  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "spinning.json"
BLOCK = "spinning"
MODES = {"on": "1", "off": "0"}
IDLE_S = 0.010
# the code this run measures (machine.provenance): the kernel, its build, the benchmark
MEASURES = ["ort_kernels/cpu/bev_op_bev_pool_v2.cc", "ort_kernels/cpu/common.cc", "ort_kernels/include",
            "ort_kernels/register.cc", "ort_kernels/build.py", "benchmarks/bev_pool_v2.py", "benchmarks/spinning.py"]


def child(path: str, spinning: str, repeats: int, mixed: bool) -> dict:
    """One process's calls: back-to-back and lone apart (``mixed`` False) or in the same rounds."""
    options = bev.session_options(2)
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    sess = bridge.session(path, tier="native", sess_options=options)
    with np.load(path + ".npz") as data:
        feed = dict(data)

    def timed() -> float:
        start = time.perf_counter()
        sess.run(None, feed)
        return (time.perf_counter() - start) * 1e3

    sess.run(None, feed)
    back, lone = [], []
    for _ in range(repeats):
        sess.run(None, feed)
        back.append(timed())
        if mixed:
            time.sleep(IDLE_S)
            lone.append(timed())
    for _ in range(0 if mixed else repeats):
        time.sleep(IDLE_S)
        lone.append(timed())
    return {"back_to_back": back, "lone": lone}


def _run_child(path: str, mode: str, repeats: int, mixed: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", path, MODES[mode], str(repeats), "1" if mixed else "0"]
    # NOTE: torch's OpenMP threads block (as in bev_pool_v2.py); the child's own environment otherwise
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.splitlines()[-1])


def _summary(times: list[float]) -> list[float]:
    q1, q3 = quartiles(times)
    return [q1, statistics.median(times), q3]


def measure(repeats: int = 40, processes: int = 3, quick: bool = False) -> dict:
    inputs, shape = bev.bevdet_inputs(depth_bins=8 if quick else bev.R50["depth_bins"])
    start = bev.conditions()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.onnx")
        bridge.export(bev.Pool(shape), inputs, path, functions=False)
        sess = bridge.session(path, tier="native")
        np.savez(path + ".npz", **bridge.parity.ort_feed(sess, inputs))
        calls: dict[str, dict[str, list[float]]] = {m: {"back_to_back": [], "lone": []} for m in MODES}
        for _ in range(processes):
            for mode in MODES:
                for kind, times in _run_child(path, mode, repeats).items():
                    calls[mode][kind] += times
        mixed = _run_child(path, "off", repeats, mixed=True)
    return {"machine": machine.describe(), "conditions": {"start": start, "end": bev.conditions()},
            "provenance": machine.provenance(MEASURES), "points": int(inputs[2].numel()), "threads": 2,
            "repeats": repeats, "processes": processes, "idle_ms": IDLE_S * 1e3, "quick": quick,
            "torch": torch.__version__,
            "ms": {m: {k: _summary(v) for k, v in c.items()} for m, c in calls.items()},
            "mixed_off_ms": {k: _summary(v) for k, v in mixed.items()}}


def render(r: dict) -> str:
    start = r["conditions"]["start"]

    def cell(q: list[float]) -> str:
        return f"{fmt_ms(q[1])} ({q[0]:.3g}-{q[2]:.3g})"

    lines = [f"One run of `benchmarks/spinning.py` on {machine_line(r['machine'])}, {start['date'][:10]}, load "
             f"average {start['load_average'][0]:.2f} at the start; bev_pool_v2 at {r['points']:,} points, "
             f"{r['threads']} intra-op threads ({r['machine']['isa_paths_available'][0]} path), each setting in "
             f"{r['processes']} processes of its own, {r['repeats']} calls of each kind per process; medians "
             "(quartiles):", "", f"| spinning | back to back | lone call after {r['idle_ms']:g} ms idle |",
             "|---|---|---|"]
    for mode, label in (("on", "on (the default)"), ("off", "off")):
        lines.append(f"| {label} | {cell(r['ms'][mode]['back_to_back'])} | {cell(r['ms'][mode]['lone'])} |")
    lines += ["", "Within one process with spinning off, rounds of calls that also slept gave "
              f"{cell(r['mixed_off_ms']['back_to_back'])} back to back."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3 calls, 1 process each, 8 depth bins (a smoke run)")
    parser.add_argument("--json", help=f"write results here (default without --quick: {DEFAULT_JSON})")
    parser.add_argument("--readme", action="store_true", help=f"write the {BLOCK} block into its page")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        path, spinning, repeats, mixed = args.child
        print(json.dumps(child(path, spinning, int(repeats), mixed == "1")))
        return {}
    r = measure(3 if args.quick else args.repeats, 1 if args.quick else args.processes, args.quick)
    text = render(r)
    print(text)
    path = machine.json_path(args.json, args.quick, str(DEFAULT_JSON))
    if path is not None:
        Path(path).write_text(json.dumps(r, indent=1) + "\n")
    if args.readme:
        doc_markers.write(BLOCK, text)
    return r


if __name__ == "__main__":
    main()
