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
    FLOOR_LONE,
    FUNCTION,
    NATIVE,
    NATIVE_1T_LONE,
    NATIVE_LONE,
    PYTHON,
    native_path,
)
from readme_table import fmt_ms, fmt_ok, machine_line

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks"
BLOCK = "performance"
# NOTE: the python tier's target (issue #27); the other targets come with their benchmark's JSON
PYTHON_VS_EAGER_MAX = 1.2


def fmt_x(v: float) -> str:
    """A ratio beside its target: two decimals below 10 (readme_table's two digits would show 1.19 as 1.2)."""
    return f"{v:.2f}x" if v < 10 else f"{v:.0f}x"


def _one_thread(ms: dict) -> str:
    """The lone call with 1 intra-op thread, and a pointer to why when the second thread barely helped."""
    if NATIVE_1T_LONE not in ms:
        return ""
    one = ms[NATIVE_1T_LONE]
    why = (" (the second thread barely helps a lone call here: on a VM the idle worker wakes on the caller's CPU, "
           "[docs/tiers.md](docs/tiers.md))" if one < 1.2 * ms[NATIVE_LONE] else "")
    return f"; with 1 intra-op thread {fmt_ms(one)}{why}"


def path_rows(b: dict) -> list[tuple]:
    """A row for each lower ISA path the run forced (the AVX2 one against its target)."""
    ms, ratios, targets, paths = b["median_ms"], b["ratios"], b["targets"], b["isa_paths"]
    best, rows = paths[NATIVE], []
    for isa in (p for p in ("avx2", "baseline") if native_path(p) in ms):
        ratio = ratios[f"native {isa} / floor"]
        target = targets["native_avx2_vs_floor_max"] if isa == "avx2" else None
        same = b["checks"].get(f"native {isa} path bitwise equal to {best}", False)
        rows.append((f"... the {isa} path, forced by a library built without the paths above it (this CPU's best: "
                     f"{best}): {fmt_ms(ms[native_path(isa)])}; its output "
                     f"{'bitwise equal to' if same else '**differs from**'} the {best} path's", fmt_x(ratio) + " the memcpy",
                     target, same and (target is None or ratio <= target), "<="))
    return rows


def load(root: Path = RESULTS) -> dict:
    """The three result files this block reads."""
    return {"run": json.loads((root / "results.json").read_text()),
            "body": json.loads((root / "results" / "body_size.json").read_text()),
            "export": json.loads((root / "results" / "export_time.json").read_text())}


def block(r: dict) -> str:
    run, body, export = r["run"], r["body"], r["export"]
    b = run["bevdet_r50"]
    ms, ratios, targets = b["median_ms"], b["ratios"], b["targets"]
    demo = run["models"]["demo"]
    bev_nodes, node_max = body["bodies"]["bev::bev_pool_v2"]["nodes"], body["targets"]["bev_pool_v2_nodes_max"]
    fn_max = targets["function_vs_eager_max"]
    ex, warm = export["export"], export["check"]["warm"]
    first = max(c["ratio"] for c in ex["first_in_process"].values())
    mach = run["machine"]
    q1, q3 = b["floor_quartiles_ms"][FLOOR]
    lone_target = targets["native_lone_vs_floor_lone_max"]
    rows = [
        (f"native bev_pool_v2 ({b['isa_paths'][NATIVE]} path), back to back: "
         f"{fmt_ms(ms[NATIVE])} vs {fmt_ms(ms[FLOOR])} for a memcpy of the bytes it touches (its rounds' quartiles "
         f"{q1:.3g}-{q3:.3g} ms)", fmt_x(ratios["native / floor"]) + " the memcpy", targets["native_vs_floor_max"],
         ratios["native / floor"] <= targets["native_vs_floor_max"], "<="),
        *path_rows(b),
        (f"... a lone call (after {b['lone_idle_ms']:g} ms idle): {fmt_ms(ms[NATIVE_LONE])}" + _one_thread(ms)
         + f", vs a lone memcpy of the same bytes after the same idle: {fmt_ms(ms[FLOOR_LONE])}",
         fmt_x(ratios["native lone / floor lone"]) + " the lone memcpy", lone_target,
         ratios["native lone / floor lone"] <= lone_target, "<="),
        (f"... torch.compile of the same sum in pure torch: {fmt_ms(ms[COMPILED])}",
         fmt_x(ratios["torch.compile / native lone"]) + " a lone native call", targets["compile_vs_native_lone_min"],
         ratios["torch.compile / native lone"] >= targets["compile_vs_native_lone_min"], ">="),
        (f"function tier (portable ONNX body): {fmt_ms(ms[FUNCTION])} vs eager torch {fmt_ms(ms[EAGER])}",
         fmt_x(ratios["function / eager"]) + " eager", fn_max, ratios["function / eager"] <= fn_max, "<="),
        ("bev_pool_v2's portable body, inlined, with its input checks",
         f"{bev_nodes} nodes", node_max, bev_nodes <= node_max, "<="),
        (f"python tier on the demo model: {fmt_ms(demo['ms'][PYTHON])} vs eager torch {fmt_ms(demo['ms'][EAGER])}",
         fmt_x(demo["vs_eager"][PYTHON]) + " eager", PYTHON_VS_EAGER_MAX,
         demo["vs_eager"][PYTHON] <= PYTHON_VS_EAGER_MAX, "<="),
        ("`bridge.export` vs plain `torch.onnx.export` of the same models (in one process; first export in a "
         f"fresh process: up to {fmt_x(first)}; `benchmarks/export_time.py`'s own run of {export['date']}, its CPU "
         "not recorded)", "up to " + fmt_x(ex["max_ratio"]), ex["target"],
         ex["max_ratio"] <= ex["target"] and first <= ex["target"], "<="),
    ]
    lines = [f"One run of `benchmarks/` on {machine_line(b['machine'])} (onnxruntime {mach['onnxruntime']}, torch "
             f"{mach['torch']}), bev_pool_v2 at BEVDet-R50 size ({b['points']:,} points); generated by "
             "`benchmarks/readme_perf.py` from the benchmarks' JSON:", "",
             "| measure | result | target |", "|---|---|---|"]
    for what, result, target, met, sense in rows:
        unit = "" if "nodes" in result else "x"
        lines.append(f"| {what} | {result} | " + ("for context |" if target is None else
                                                   f"{sense} {target:g}{unit}: {fmt_ok(met)} |"))
    lines += ["", f"The first `opbridge check` on a warm cache takes {warm['median_s']['opbridge check']:.1f} s, "
              f"{fmt_x(warm['ratios']['check_vs_plain'])} the same export, session and run written by hand (export_time.py's "
              "run). Details "
              "and every other figure: [docs/evidence.md](docs/evidence.md)."]
    return "\n".join(lines)


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
