"""What bounds each ISA path of the native bev_pool_v2: the core or memory.

    python benchmarks/bound.py [--repeats 30] [--threads 1] [--quick] [--json PATH]

The same pooling at BEVDet-R50 size (benchmarks/bev_pool_v2.py's inputs) run twice per path, timed
round-robin in one process: with the real indices, and with every index pointing into a few
L1-resident rows (``ranks_feat % 8``: 8 feat rows, 2 KiB; ``ranks_depth % 64``), the same points,
intervals and output writes. ``L1 / real`` near 1 says the path is bound by the core (instructions
per point), not by the gathers' cache misses. Each path is a library built without the paths above
it (``bev_pool_v2.path_libraries``). Each ratio is taken per round and reported as [q1, median, q3]
(``spread.py``). ``--quick`` (a smoke run) times 2 rounds at 8 depth bins and writes
no JSON unless ``--json`` names a file (the committed results stay the full run's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile

# NOTE: as in bev_pool_v2.py: torch's OpenMP threads block rather than spin (set before torch loads),
# only when this script starts the process, never on import
if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import bev_pool_v2 as bev  # noqa: E402
import machine  # noqa: E402
from readme_table import machine_line  # noqa: E402
from spread import spread  # noqa: E402

import bridge  # noqa: E402
import custom_ops  # noqa: E402,F401

# the code this run measures (machine.provenance): the kernel, its build, the benchmark
MEASURES = [*bev.MEASURES, "benchmarks/bound.py"]
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bound.json")


def measure(repeats: int = 30, threads: int = 1, quick: bool = False) -> dict:
    inputs, shape = bev.bevdet_inputs(depth_bins=8 if quick else bev.R50["depth_bins"])
    model = bev.Pool(shape)
    libraries = bev.path_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.onnx")
        bridge.export(model, inputs, path, functions=False)
        sessions = {isa: bridge.session(path, tier="native", sess_options=bev.session_options(threads),
                                        native_library=library) for isa, library in libraries.items()}
    first = next(iter(sessions.values()))
    feeds = {"real": bridge.parity.ort_feed(first, inputs), "L1": bridge.parity.ort_feed(first, bev.hot_indices(inputs))}
    fns = {f"{isa} {kind}": (lambda s=s, f=f: s.run(None, f)) for isa, s in sessions.items() for kind, f in feeds.items()}
    times = bev.rounds(fns, 2 if quick else repeats)
    ms = {name: statistics.median(t) for name, t in times.items()}
    best = next(iter(sessions))
    # NOTE: each ratio per round, as [q1, median, q3] (spread.py): L1 over real of one path, a path over the best
    paths = {isa: {"real_ms": ms[f"{isa} real"], "l1_ms": ms[f"{isa} L1"],
                   "l1_over_real": spread(times[f"{isa} L1"], times[f"{isa} real"])[1],
                   "l1_over_real_quartiles": spread(times[f"{isa} L1"], times[f"{isa} real"]),
                   "vs_best_quartiles": spread(times[f"{isa} real"], times[f"{best} real"])} for isa in sessions}
    return {"machine": machine.describe(), "points": int(inputs[2].numel()), "threads": threads,
            "repeats": 2 if quick else repeats, "paths": paths,
            "vs_best": {isa: p["vs_best_quartiles"][1] for isa, p in paths.items()},
            "quick": quick, "date": datetime.date.today().isoformat(), "conditions": bev.conditions(),
            "provenance": machine.provenance(MEASURES)}


def report(r: dict) -> str:
    lines = [f"bev_pool_v2, {r['points']:,} points, {r['threads']} intra-op thread(s), "
             f"{machine_line(r['machine'])}:"]
    for isa, p in r["paths"].items():
        (a, m, b), (c, n, d) = p["l1_over_real_quartiles"], p["vs_best_quartiles"]
        lines.append(f"  {isa:9s} real indices {p['real_ms']:.3f} ms, indices in L1 {p['l1_ms']:.3f} ms: "
                     f"L1/real {m:.2f} ({a:.2f}-{b:.2f}); {n:.2f}x ({c:.2f}-{d:.2f}) the best path")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="2 rounds at 8 depth bins (a smoke run; writes no "
                        "JSON unless --json names a file)")
    parser.add_argument("--json", help=f"write results here (default without --quick: {DEFAULT_JSON})")
    args = parser.parse_args(argv)
    r = measure(args.repeats, args.threads, args.quick)
    print(report(r))
    path = machine.json_path(args.json, args.quick, DEFAULT_JSON)
    if path is not None:
        with open(path, "w") as f:
            json.dump(r, f, indent=1)
    return r



if __name__ == "__main__":
    main()
