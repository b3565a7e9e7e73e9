"""What ``check_parity(localize=True)`` costs: nothing when it passes; one session and eager pass more when it fails.

    python benchmarks/localize_cost.py [--repeats N] [--json out.json]

1. passing check (the demo, function tier, three runs): localize=False vs localize=True,
   interleaved; also counts the sessions opened and the eager interpretations run in each
2. failing check (tests/test_localize.py's HalfMulModel, a float16 round trip before a Mul):
   localize=False vs True, and the localization's own time
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bridge  # noqa: E402
import bridge.tools.localize  # noqa: E402
import bridge.tools.parity  # noqa: E402
import custom_ops.demo as demo  # noqa: E402
from bridge.core.basics import files  # noqa: E402
from tests import test_localize as broken  # noqa: E402


class Counter:
    """Wraps ``module.name`` and counts its calls."""

    def __init__(self, module, name: str):
        self.module, self.name, self.calls = module, name, 0
        self.original = getattr(module, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(module, name, counted)

    def restore(self) -> None:
        setattr(self.module, self.name, self.original)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def side_by_side(check, repeats: int) -> dict:
    """``check(localize)`` for False and True, interleaved; median seconds and calls counted per side."""
    counters = [Counter(bridge.parity, "session"), Counter(bridge.localize, "session"),
                Counter(bridge.localize, "eager_values")]
    times = {False: [], True: []}
    calls = {}
    try:
        check(False)  # warm-up: imports, first-session costs
        for _ in range(repeats):
            for mode in (False, True):
                before = [c.calls for c in counters]
                seconds, report = timed(lambda m=mode: check(m))
                times[mode].append(seconds)
                calls[mode] = {"sessions": counters[0].calls + counters[1].calls - before[0] - before[1],
                               "eager interpretations": counters[2].calls - before[2],
                               "passed": report.passed,
                               "localization_s": report.localization.seconds if report.localization else 0.0}
    finally:
        for c in counters:
            c.restore()
    off, on = statistics.median(times[False]), statistics.median(times[True])
    return {"localize_false_s": off, "localize_true_s": on, "ratio": on / off,
            "spread_false_s": [min(times[False]), max(times[False])],
            "spread_true_s": [min(times[True]), max(times[True])], "calls": {str(k): v for k, v in calls.items()}}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    case = demo.build()

    def passing(localize):
        return bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes,
                                   extra_args=case.extra_args, localize=localize)

    results = {"machine": {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                           "torch": torch.__version__}}
    results["passing"] = p = side_by_side(passing, args.repeats)
    print(f"1. passing check (demo, 3 runs): localize=False {p['localize_false_s']:.2f} s, localize=True "
          f"{p['localize_true_s']:.2f} s (median of {args.repeats}, ratio {p['ratio']:.3f}); "
          f"sessions {p['calls']['False']['sessions']} vs {p['calls']['True']['sessions']}, eager interpretations "
          f"{p['calls']['False']['eager interpretations']} vs {p['calls']['True']['eager interpretations']}")

    export_module = sys.modules["exporters.export"]
    original = export_module.translation_table
    half = broken.half_mul_case()  # installs the float16 translation
    try:
        def failing(localize):
            return bridge.check_parity(half.model, half.args, extra_args=half.extra_args, localize=localize)

        results["failing"] = f = side_by_side(failing, args.repeats)
    finally:
        export_module.translation_table = original
    print(f"2. failing check (HalfMulModel): localize=False {f['localize_false_s']:.2f} s, localize=True "
          f"{f['localize_true_s']:.2f} s (localization itself {f['calls']['True']['localization_s']:.3f} s); "
          f"sessions {f['calls']['False']['sessions']} vs {f['calls']['True']['sessions']}")
    if args.json:
        print(f"wrote {files.write_json(args.json, results)}")
    return results


if __name__ == "__main__":
    main()
