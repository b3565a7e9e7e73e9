"""Regenerate the README's performance block from the benchmarks' JSON (no hand-typed figures).

    python benchmarks/run.py --json benchmarks/results.json      # native, function, python tiers
    python benchmarks/body_size.py                               # benchmarks/results/body_size.json
    python benchmarks/export_time.py                             # benchmarks/results/export_time.json
    python benchmarks/readme_perf.py [--check]

Rewrites the lines between ``<!-- performance:start -->`` and ``<!-- performance:end -->`` in the page
that holds them (README.md); ``--check`` exits 1 when the page differs from what the JSON gives. Every
ratio is one run's, measured side by side in one process; each line states its target and whether
that run met it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import doc_markers
from contenders import (
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
    PYTHON,
    native_path,
)
from readme_table import fmt_ms, machine_line
from spread import verdict

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks"
BLOCK = "performance"
# NOTE: the python tier's target (issue #27); the other targets come with their benchmark's JSON
PYTHON_VS_EAGER_MAX = 1.2


def fmt_x(v: float) -> str:
    """A ratio beside its target: two decimals below 10 (readme_table's two digits would show 1.19 as 1.2)."""
    return f"{v:.2f}x" if v < 10 else f"{v:.0f}x"


def fmt_q(q: list[float]) -> str:
    """A ratio with its spread: the median and the interquartile range of its rounds."""
    return f"{fmt_x(q[1])} ({q[0]:.3g}-{q[2]:.3g})"


def fmtverdict(verdict: str) -> str:
    """spread.verdict's word, as the table shows it."""
    return {"met": "met", "not met": "**not met**", "undecided": "undecided (the spread straddles it)"}[verdict]


def row(what: str, result: str, target: float | None = None, sense: str = "<=", verdict: str = "",
        unit: str = "x") -> str:
    """One table row: the measure, its result, its target and verdict (or "for context")."""
    tail = "for context" if target is None else f"{sense} {target:g}{unit}: {fmtverdict(verdict)}"
    return f"| {what} | {result} | {tail} |"


def path_rows(b: dict) -> list[str]:
    """A row per ISA path this CPU runs, best first, each against the floor on the same 2 threads."""
    ms, spreads, targets, paths, threads = b["median_ms"], b["ratio_quartiles"], b["targets"], b["isa_paths"], b["threads"]
    best, floor = paths[NATIVE], fmt_ms(ms[FLOOR])
    q = spreads["native / floor"]
    bound = targets["native_avx2_vs_floor_max"] if best == "avx2" else targets["native_vs_floor_max"]
    rows = [row(f"native bev_pool_v2, {best} path (this CPU's best), {threads[NATIVE]} intra-op threads, back to back: "
                f"{fmt_ms(ms[NATIVE])} vs {floor} for the floor on the same {threads[FLOOR]} threads",
                fmt_q(q) + " the floor", bound, "<=", verdict(q, bound, True))]
    for isa in (p for p in ("avx2", "baseline") if native_path(p) in ms):
        q = spreads[f"native {isa} / floor"]
        same = b["checks"].get(f"native {isa} path bitwise equal to {best}", False)
        what = (f"... the {isa} path (a library built without the paths above it): {fmt_ms(ms[native_path(isa)])}; "
                f"output {'bitwise equal to' if same else '**differs from**'} the {best} path's")
        if isa == "avx2":
            bound = targets["native_avx2_vs_floor_max"]
            rows.append(row(what, fmt_q(q) + " the floor", bound, "<=", verdict(q, bound, True) if same else "not met"))
        else:
            rows.append(row(what, fmt_q(q) + " the floor"))
    return rows


def load(root: Path = RESULTS) -> dict:
    """The three result files this block reads."""
    return {"run": json.loads((root / "results.json").read_text()),
            "body": json.loads((root / "results" / "body_size.json").read_text()),
            "export": json.loads((root / "results" / "export_time.json").read_text())}


def header(b: dict, mach: dict) -> str:
    """What the run ran on and under which conditions: CPU, ISA path, threads, date, load."""
    start, end = b["conditions"]["start"], b["conditions"]["end"]
    return (f"One run of `benchmarks/` on {machine_line(b['machine'])} (onnxruntime {mach['onnxruntime']}, torch "
            f"{mach['torch']}), {start['date'][:10]}, load average {start['load_average'][0]:.2f} at the start and "
            f"{end['load_average'][0]:.2f} at the end on {start['cpus_usable']} CPUs; bev_pool_v2 at BEVDet-R50 size "
            f"({b['points']:,} points, {b['bytes_touched'] / 1e6:.2f} MB touched), {b['repeats']} rounds. The floor "
            "is a kernel of bev_pool_v2's signature that reads each input byte once and writes each output byte once, "
            "run in onnxruntime on the same intra-op threads as the native call it is held against "
            "(`benchmarks/floor_op.py`). Each ratio: the median of its per-round ratios (the interquartile range in "
            "brackets); a target is met only when the whole range meets it (`benchmarks/spread.py`). Generated by "
            "`benchmarks/readme_perf.py` from the benchmarks' JSON:")


def block(r: dict) -> str:
    run, body, export = r["run"], r["body"], r["export"]
    b = run["bevdet_r50"]
    ms, spreads, targets, threads = b["median_ms"], b["ratio_quartiles"], b["targets"], b["threads"]
    demo = run["models"]["demo"]
    bev_nodes, node_max = body["bodies"]["bev::bev_pool_v2"]["nodes"], body["targets"]["bev_pool_v2_nodes_max"]
    fn_max = targets["function_vs_eager_max"]
    ex, warm = export["export"], export["check"]["warm"]
    first = max(c["ratio"] for c in ex["first_in_process"].values())
    lone_max, compile_min = targets["native_lone_vs_floor_lone_max"], targets["compile_vs_native_lone_min"]
    q_lone, q_fn = spreads["native lone / floor lone"], spreads["function / eager"]
    q_py = demo["ratio_quartiles"][f"{PYTHON} / {EAGER}"]
    rows = [
        *path_rows(b),
        row(f"... {threads[NATIVE_1T]} intra-op thread: {fmt_ms(ms[NATIVE_1T])} vs {fmt_ms(ms[FLOOR_1T])} for the "
            f"floor on {threads[FLOOR_1T]} thread", fmt_q(spreads["native 1 thread / floor 1 thread"]) + " the floor"),
        row(f"... every index into a few L1-resident rows (the issue bound: same points, intervals and writes, "
            f"`benchmarks/bound.py`'s run): {fmt_ms(ms[NATIVE_L1])}",
            fmt_q(spreads["native indices in L1 / native"]) + " the real indices' time"),
        row(f"... a lone call (after {b['lone_idle_ms']:g} ms idle): {fmt_ms(ms[NATIVE_LONE])} (1 intra-op thread: "
            f"{fmt_ms(ms[NATIVE_1T_LONE])}) vs a lone floor call after the same idle: {fmt_ms(ms[FLOOR_LONE])}",
            fmt_q(q_lone) + " the lone floor", lone_max, "<=", verdict(q_lone, lone_max, True)),
    ]
    if COMPILED in ms:
        q = spreads["torch.compile / native lone"]
        rows.append(row(f"... torch.compile of the same sum in pure torch: {fmt_ms(ms[COMPILED])} (its rounds and "
                        "the lone calls' are apart: the range is the widest their quartiles allow)",
                        fmt_q(q) + " a lone native call", compile_min, ">=", verdict(q, compile_min, False)))
    rows += [
        row(f"function tier (portable ONNX body): {fmt_ms(ms[FUNCTION])} vs eager torch {fmt_ms(ms[EAGER])}",
            fmt_q(q_fn) + " eager", fn_max, "<=", verdict(q_fn, fn_max, True)),
        row("bev_pool_v2's portable body, inlined, with its input checks", f"{bev_nodes} nodes", node_max, "<=",
            "met" if bev_nodes <= node_max else "not met", unit=""),
        row(f"python tier on the demo model: {fmt_ms(demo['ms'][PYTHON])} vs eager torch {fmt_ms(demo['ms'][EAGER])}",
            fmt_q(q_py) + " eager", PYTHON_VS_EAGER_MAX, "<=", verdict(q_py, PYTHON_VS_EAGER_MAX, True)),
        row("`bridge.export` vs plain `torch.onnx.export` of the same models (in one process; first export in a "
            f"fresh process: up to {fmt_x(first)}; `benchmarks/export_time.py`'s own run of {export['date']}, "
            f"{export_machine(export)})", "up to " + fmt_x(ex["max_ratio"]), ex["target"], "<=",
            "met" if ex["max_ratio"] <= ex["target"] and first <= ex["target"] else "not met"),
    ]
    lines = [header(b, run["machine"]), "", "| measure | result | target |", "|---|---|---|", *rows]
    lines += ["", f"The first `opbridge check` on a warm cache takes {warm['median_s']['opbridge check']:.1f} s, "
              f"{fmt_x(warm['ratios']['check_vs_plain'])} the same export, session and run written by hand (export_time.py's "
              f"run of {export['date']}). Details and every other figure: [docs/evidence.md](docs/evidence.md)."]
    return "\n".join(lines)


def export_machine(export: dict) -> str:
    """The CPU export_time.py's run names, or that it names none."""
    m = export.get("machine", {})
    return f"on {machine_line(m)}" if "cpu_model" in m else "its CPU not recorded"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not what the JSON gives")
    args = parser.parse_args(argv)
    if not doc_markers.write(BLOCK, block(load()), check=args.check):
        print(f"the {BLOCK} block is out of date with the benchmarks' JSON: run benchmarks/readme_perf.py")
        return 1
    print(f"the {BLOCK} block is {'up to date' if args.check else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
