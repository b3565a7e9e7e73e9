"""How long `opbridge --help` and `opbridge cache` take next to `python -c "import torch"`, measured side by
side in one run (neither command imports torch).

    python benchmarks/cli_startup.py [--repeats 7] [--json benchmarks/results/cli_startup.json] [--readme]

Each round runs both commands once, in alternating order, as fresh processes of this interpreter;
the medians and their ratio are printed and written as JSON, and ``--readme`` puts the line into
the page holding the ``cli-startup`` block (docs/evidence.md).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
from pathlib import Path

import doc_markers
import machine
from readme_table import machine_line

from bridge.core.basics import files

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "cli_startup.json"
BLOCK = "cli-startup"
HELP, TORCH, CACHE = "opbridge --help", "python -c 'import torch'", "opbridge cache"
# the code this run measures (machine.provenance): what `opbridge --help` and `opbridge cache` import
MEASURES = ["bridge/__init__.py", "bridge/__main__.py", "bridge/tools/cli.py", "bridge/tools/commands.py",
            "bridge/core/basics/cache.py", "benchmarks/cli_startup.py"]
COMMANDS = {HELP: [sys.executable, "-m", "bridge", "--help"], TORCH: [sys.executable, "-c", "import torch"],
            CACHE: [sys.executable, "-m", "bridge", "cache"]}


def _seconds(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300)
    return time.perf_counter() - start


def measure(repeats: int) -> dict:
    """Median wall seconds of each command over ``repeats`` alternating rounds, and their ratio."""
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for i in range(repeats):
        for name in (list(COMMANDS) if i % 2 == 0 else list(reversed(COMMANDS))):
            times[name].append(_seconds(COMMANDS[name]))
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"median_s": medians, "repeats": repeats,
            "ratio": medians[HELP] / medians[TORCH],
            "date": datetime.date.today().isoformat(), "machine": machine.describe(),
            "provenance": machine.provenance(MEASURES)}


def render(result: dict) -> str:
    m = result["median_s"]
    # NOTE: a result written before `opbridge cache` was measured renders as it did
    cache = f"; `{CACHE}` {m[CACHE] * 1000:.0f} ms" if CACHE in m else ""
    return (f"`{HELP}` takes {m[HELP] * 1000:.0f} ms, {result['ratio']:.2f}x the {m[TORCH] * 1000:.0f} ms "
            f"of `{TORCH}`{cache} (medians of {result['repeats']} alternating runs, "
            f"`python benchmarks/cli_startup.py`, {result['date']}, {machine_line(result['machine'])}): the parser "
            "imports no torch.")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    parser.add_argument("--readme", action="store_true", help="write the line into the cli-startup block")
    args = parser.parse_args(argv)
    result = measure(args.repeats)
    files.write_json(args.json, result)
    line = render(result)
    if args.readme:
        doc_markers.write(BLOCK, line)
    print(line)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
