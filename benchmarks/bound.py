"""What bounds each ISA path of the native bev_pool_v2: the core or memory.

    python benchmarks/bound.py [--repeats 30] [--threads 1] [--quick] [--json benchmarks/results/bound.json]

The same pooling at BEVDet-R50 size (benchmarks/bev_pool_v2.py's inputs) run twice per path, timed
round-robin in one process: with the real indices, and with every index pointing into a few
L1-resident rows (``ranks_feat % 8``: 8 feat rows, 2 KiB; ``ranks_depth % 64``), the same points,
intervals and output writes. ``L1 / real`` near 1 says the path is bound by the core (instructions
per point), not by the gathers' cache misses. Each path is a library built without the paths above
it (``bev_pool_v2.path_libraries``). ``--quick`` (a smoke run) times 2 rounds at 8 depth bins.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile

# NOTE: as in bev_pool_v2.py: torch's OpenMP threads block rather than spin (set before torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import bev_pool_v2 as bev  # noqa: E402
import machine  # noqa: E402
from readme_table import machine_line  # noqa: E402

import bridge  # noqa: E402
import custom_ops  # noqa: E402,F401

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bound.json")


def hot_indices(inputs):
    """``inputs`` with every rank inside a few rows that stay in L1 (same lengths and intervals)."""
    depth, feat, rd, rf, rb, starts, lengths = inputs
    return depth, feat, rd % 64, rf % 8, rb, starts, lengths


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
    feeds = {"real": bridge.parity.ort_feed(first, inputs), "L1": bridge.parity.ort_feed(first, hot_indices(inputs))}
    fns = {f"{isa} {kind}": (lambda s=s, f=f: s.run(None, f)) for isa, s in sessions.items() for kind, f in feeds.items()}
    times = bev.rounds(fns, 2 if quick else repeats)
    ms = {name: statistics.median(t) for name, t in times.items()}
    paths = {isa: {"real_ms": ms[f"{isa} real"], "l1_ms": ms[f"{isa} L1"],
                   "l1_over_real": ms[f"{isa} L1"] / ms[f"{isa} real"]} for isa in sessions}
    best = next(iter(sessions))
    return {"machine": machine.describe(), "points": int(inputs[2].numel()), "threads": threads,
            "repeats": 2 if quick else repeats, "paths": paths,
            "vs_best": {isa: p["real_ms"] / paths[best]["real_ms"] for isa, p in paths.items()},
            "quick": quick, "date": datetime.date.today().isoformat()}


def report(r: dict) -> str:
    lines = [f"bev_pool_v2, {r['points']:,} points, {r['threads']} intra-op thread(s), "
             f"{machine_line(r['machine'])}:"]
    for isa, p in r["paths"].items():
        lines.append(f"  {isa:9s} real indices {p['real_ms']:.3f} ms, indices in L1 {p['l1_ms']:.3f} ms: "
                     f"L1/real {p['l1_over_real']:.2f}; {r['vs_best'][isa]:.2f}x the best path")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="2 rounds at 8 depth bins (a smoke run)")
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    r = measure(args.repeats, args.threads, args.quick)
    print(report(r))
    with open(args.json, "w") as f:
        json.dump(r, f, indent=1)
    return r


if __name__ == "__main__":
    main()
