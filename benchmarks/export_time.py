"""Export time and the first `opbridge check`, each measured side by side in one run (issue #27 item 4).

    python benchmarks/export_time.py [--quick] [--repeats N] [--no-cold] [--json PATH] [--readme]

1. ``bridge.export`` vs plain ``torch.onnx.export(model, args, dynamo=True)`` of the same model, at the
   same opset, with and without dynamic shapes, where plain export can run the model: its custom op has
   a torch.onnx translation that plain export is handed through ``custom_translation_table``:
   - ``demo``: the BEVDet-like demo (identity_conv, bev_pool_v2); plain export gets the registry's
     translations (custom nodes, no bodies); bridge.export adds the checks, the function bodies and the
     full checker;
   - ``roi_align``: an op named as torchvision's (``torchvision::roi_align``, defined here when torchvision
     is not installed) whose translation torch.onnx's torch_lib holds; plain export inlines it, bridge.export
     keeps one node with that translation as its body (``bridge.register`` without ``function=``);
   - ``derived``: an op declared with ``@bridge.op`` and no ONNX code; plain export gets its translation
     (a custom node), bridge.export also derives its body from the implementation.
   Each contender is warmed up first (the first export in a process pays one-time costs, shared by
   both), then the contenders alternate, ``gc.collect()`` before each call; medians and ratios.
   Target: bridge.export <= 1.2x plain. The full run also reports benchmarks/run.py's ``export`` entry
   (torch.export + torch.onnx.export of the ExportedProgram vs bridge.export of the demo) and the first
   export of each case in a fresh process (``--first CASE CONTENDER`` children, alternating), what one
   CLI call pays.
2. ``opbridge check`` (the README's main command) as a fresh process on a warm cache (the cache root
   of this environment, ``$OPBRIDGE_CACHE_DIR`` or ``~/.cache/opbridge``; the native library and the demo's
   C++ extension built before the first timed run), next to ``python -c "import torch"`` and to a plain
   script doing the same job by hand (plain torch.onnx.export of the demo, an onnxruntime session with
   the native library, eager vs ORT on the three frames). Rounds alternate the commands. The wall time
   is broken down from the progress lines' arrival: startup (interpreter, imports, loading the model),
   export, session, runs + parity, builds, report + exit. The full run adds
   ``opbridge check --tier native`` (the plain script's runtime) and, with a fresh temporary
   ``OPBRIDGE_CACHE_DIR`` each, the cold-cache figures of both checks (every C++ build included).

``--quick`` (a smoke run, under a minute on a warm cache) does one round of the export comparison (no
warm-up), one round of the warm-cache commands (no warm-up run), no fresh-process exports, no --tier
native and no cold run.
The JSON's keys are what the docs render: ``export.cases[name].ratio`` (and ``.median_s``),
``export.max_ratio``, ``export.met``, ``export.first_in_process[case].ratio``, ``export.run_py``,
``check.warm.median_s``, ``check.warm.ratios`` (``check_vs_import_torch``, ``check_vs_plain``,
``check_native_vs_plain``), ``check.warm.breakdown_s``, ``check.cold`` (``s``, ``breakdown_s``, ``vs_warm``).
``--readme`` writes the ``export-time`` block (docs/evidence.md).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import importlib.util
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

# NOTE: as benchmarks/run.py: torch's OpenMP threads block instead of spinning (2 shared cores), only
# when this script starts the process, never on import
if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import doc_markers  # noqa: E402
import machine  # noqa: E402
import run  # noqa: E402  (benchmarks/run.py: its export entry, side by side in this process)
import vision_ops  # noqa: E402  (tests/vision_ops.py: torchvision's ops by name, with plain CPU kernels)

import bridge  # noqa: E402
import custom_ops.demo as demo  # noqa: E402
from bridge.core import cppbuild  # noqa: E402
from bridge.core.basics import files  # noqa: E402
from bridge.core.basics.domains import is_onnx  # noqa: E402
from bridge.core.basics.torch_compat import torchlib_translation  # noqa: E402
from exporters.bodies.translation import translation_table  # noqa: E402
from exporters.export import DEFAULT_OPSET  # noqa: E402
from ort_kernels import build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "export_time.json"
BLOCK = "export-time"
# the code this run measures (machine.provenance): everything an export and a check go through
MEASURES = ["exporters", "bridge", "ort_kernels", "custom_ops/demo.py", "benchmarks/export_time.py"]
TARGET = 1.2
BRIDGE, PLAIN = "bridge.export", "torch.onnx.export"
CHECK, CHECK_NATIVE, PLAIN_JOB, TORCH = ("opbridge check", "opbridge check --tier native",
                                         "plain export + session", "python -c 'import torch'")

# ---------------------------------------------------------------------------------------------------
# 1. bridge.export vs torch.onnx.export


def roi_align_op():
    """``torch.ops.torchvision.roi_align``: torchvision's own where it is installed, else the one with
    torchvision's schema (the name torch_lib keys its translation by) and a plain CPU kernel that the
    tests use too (``tests/vision_ops.py``)."""
    if importlib.util.find_spec("torchvision") is not None:
        importlib.import_module("torchvision")
    elif not hasattr(torch.ops.torchvision, "roi_align"):
        vision_ops.define("torchvision")
    return torch.ops.torchvision.roi_align.default


class RoiPool(torch.nn.Module):
    """conv -> roi_align (7x7 bins, 2x2 samples, aligned) -> per-roi features."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, images, rois):
        feat = torch.relu(self.conv(images))
        return torch.ops.torchvision.roi_align(feat, rois, 0.5, 7, 7, 2, True).flatten(1)


class SoftClip(torch.nn.Module):
    """conv -> an op with no ONNX code (its body derived at export) -> conv."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.conv2(self.op(self.conv1(x), 2.0))


def cases() -> dict:
    """``{name: (model, args, dynamic_shapes, registry, translations for plain export)}``."""
    torch.manual_seed(0)
    demo_case = demo.build()
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 32, 32, generator=g)
    xy = torch.rand(12, 2, generator=g) * 48
    rois = torch.cat([torch.randint(0, 2, (12, 1), generator=g).float(), xy, xy + 4 + torch.rand(12, 2, generator=g) * 12], 1)
    roi_align = roi_align_op()
    vision = bridge.Registry()
    bridge.register("torchvision::roi_align", registry=vision)  # no function=: torch_lib's translation is the body
    derived = bridge.Registry()

    @bridge.op("bench_export_time::soft_clip", fake=lambda x, limit: torch.empty_like(x), registry=derived)
    def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
        """limit * tanh(x / limit), no ONNX code: its body is derived from this implementation."""
        return limit * torch.tanh(x / limit)

    return {
        "demo": (demo_case.model, demo_case.args, demo_case.dynamic_shapes, bridge.REGISTRY,
                 translation_table(bridge.REGISTRY)),
        "roi_align": (RoiPool().eval(), (images, rois), (None, {0: torch.export.Dim("rois", min=2)}), vision,
                      {roi_align: torchlib_translation("torchvision::roi_align")}),
        "derived": (SoftClip(soft_clip).eval(), (torch.randn(2, 3, 16, 16, generator=g),),
                    ({0: torch.export.Dim("batch", min=1)},), derived, translation_table(derived)),
    }


def plain_export(model, args, dynamic_shapes, table) -> onnx.ModelProto:
    """What a user writes without opbridge: torch.onnx.export(dynamo=True), the op's translation handed in."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NOTE: as bridge.export: torch.onnx's own progress and warnings
        program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=dynamic_shapes, opset_version=DEFAULT_OPSET,
                                    custom_translation_table=table, verify=False, external_data=False)
    assert program is not None
    return program.model_proto


def _ort_session(proto: onnx.ModelProto, library: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def check_answers(name: str, model, args, registry, bridge_proto, plain_proto, library: Path) -> None:
    """Both files stand for the model: the bridge's file run in its function tier matches eager; plain
    export's file, run in onnxruntime (with the native library where it holds custom nodes), matches eager
    where a kernel serves each of its nodes, and else holds the same custom nodes as the bridge's file."""
    with torch.no_grad():
        expected = model(*args)
    feed = {i.name: a.numpy() for i, a in zip(bridge_proto.graph.input, args)}
    outputs = {BRIDGE: bridge.session(bridge_proto, registry=registry).run(None, feed)[0]}
    custom = [(n.domain, n.op_type) for n in plain_proto.graph.node if not is_onnx(n.domain)]
    if not custom or set(custom) <= set(build.served_ops(registry)):
        plain = _ort_session(plain_proto, library if custom else None)
        outputs[PLAIN] = plain.run(None, {i.name: a.numpy() for i, a in zip(plain.get_inputs(), args)})[0]
    elif custom != [(n.domain, n.op_type) for n in bridge_proto.graph.node if not is_onnx(n.domain)]:
        raise SystemExit(f"opbridge: the {PLAIN} file of {name} holds other custom nodes than the bridge's. "
                         f"Got {custom}. Fix the benchmark's translations.")
    for who, got in outputs.items():
        report = bridge.compare(f"{name} {who}", expected, got, rtol=1e-4, atol=1e-4)
        if not report.passed:
            raise SystemExit(f"opbridge: the {who} file of {name} differs from eager. Got {report}. Fix the export.")


def _timed(fn: Callable) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(fns: dict[str, Callable], repeats: int, warmup: int) -> dict:
    """Median seconds of each callable over ``repeats`` rounds, the order reversed every other round,
    after ``warmup`` untimed calls of each; also the spread (min, max) of each."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats):
        for name in (list(fns) if i % 2 == 0 else list(reversed(fns))):
            times[name].append(_timed(fns[name]))
    return {"median_s": {k: statistics.median(v) for k, v in times.items()},
            "range_s": {k: [min(v), max(v)] for k, v in times.items()}}


def export_times(repeats: int, warmup: int, library: Path) -> dict:
    """bridge.export vs torch.onnx.export per case, with and without dynamic shapes."""
    rows = {}
    for name, (model, args, dynamic, registry, table) in cases().items():
        check_answers(name, model, args, registry, bridge.export(model, args, dynamic_shapes=dynamic, registry=registry),
                      plain_export(model, args, dynamic, table), library)
        for shapes, dyn in (("dynamic shapes", dynamic), ("static shapes", None)):
            fns = {BRIDGE: lambda m=model, a=args, d=dyn, r=registry: bridge.export(m, a, dynamic_shapes=d, registry=r),
                   PLAIN: lambda m=model, a=args, d=dyn, t=table: plain_export(m, a, d, t)}
            row = alternate(fns, repeats, warmup)
            row["ratio"] = row["median_s"][BRIDGE] / row["median_s"][PLAIN]
            rows[f"{name}, {shapes}"] = row
            print(f"  {name + ', ' + shapes:<28} {BRIDGE} {row['median_s'][BRIDGE]:.3f} s, {PLAIN} "
                  f"{row['median_s'][PLAIN]:.3f} s -> {row['ratio']:.2f}x", flush=True)
    worst = max(r["ratio"] for r in rows.values())
    return {"cases": rows, "max_ratio": worst, "target": TARGET, "met": worst <= TARGET, "repeats": repeats,
            "warmup": warmup, "opset": DEFAULT_OPSET}


def first_export(case: str, contender: str) -> float:
    """Seconds of the first export of ``case`` by ``contender`` in this process (its one-time costs included)."""
    model, args, dynamic, registry, table = cases()[case]
    start = time.perf_counter()
    if contender == BRIDGE:
        bridge.export(model, args, dynamic_shapes=dynamic, registry=registry)
    else:
        plain_export(model, args, dynamic, table)
    return time.perf_counter() - start


def first_export_times(repeats: int) -> dict:
    """The first export in a fresh process (what one CLI call pays), per case with dynamic shapes: each
    contender in a process of its own (this script, ``--first CASE CONTENDER``), alternating."""
    rows = {}
    for name in ("demo", "roi_align", "derived"):
        times: dict[str, list[float]] = {BRIDGE: [], PLAIN: []}
        for i in range(repeats):
            for who in ((BRIDGE, PLAIN) if i % 2 == 0 else (PLAIN, BRIDGE)):
                done = subprocess.run([sys.executable, __file__, "--first", name, who], cwd=ROOT, capture_output=True,
                                      text=True, timeout=600)
                if done.returncode != 0:
                    raise SystemExit(f"opbridge: the first {who} of {name} failed. Got:\n{done.stderr[-3000:]}Fix it.")
                times[who].append(json.loads(done.stdout.strip().splitlines()[-1])["first_export_s"])
        median = {k: statistics.median(v) for k, v in times.items()}
        rows[name] = {"median_s": median, "ratio": median[BRIDGE] / median[PLAIN], "repeats": repeats}
        print(f"  first in a fresh process, {name:<10} {BRIDGE} {median[BRIDGE]:.3f} s, {PLAIN} {median[PLAIN]:.3f} s "
              f"-> {rows[name]['ratio']:.2f}x", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------------
# 2. the first `opbridge check`, a fresh process

# NOTE: the check's job done by hand with the same tools: plain export (the registry's translations: custom
# nodes without bodies), a session on the native library, eager vs ORT on the demo's three frames. It
# prints progress lines in the CLI's format, so one parser breaks both down.
PLAIN_SCRIPT = """
import contextlib, io, os, sys, tempfile, time, warnings
def step(label, start=None):
    print(f"[opbridge] {label} " + ("..." if start is None else f"done ({time.perf_counter() - start:.1f} s)"),
          file=sys.stderr, flush=True)
    return time.perf_counter()
import numpy as np, onnxruntime as ort, torch
import custom_ops.demo as demo
from bridge.core.registry import REGISTRY
from exporters.bodies.translation import translation_table
from ort_kernels.build import library_path
case = demo.build()
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.onnx")
    t = step("torch.onnx.export (plain)")
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(case.model, case.args, path, dynamo=True, dynamic_shapes=case.dynamic_shapes,
                          opset_version=int(sys.argv[1]), custom_translation_table=translation_table(REGISTRY),
                          verify=False, external_data=False)
    step("torch.onnx.export (plain)", t)
    t = step("onnxruntime session (native library)")
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library_path(build=False)))
    sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    step("onnxruntime session (native library)", t)
    for run, args in enumerate([case.args, *case.extra_args]):
        t = step(f"eager + onnxruntime run {run + 1}")
        with torch.no_grad():
            expected = case.model(*args).numpy()
        got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        step(f"eager + onnxruntime run {run + 1}", t)
print("plain: 3 frames match")
sys.stdout.flush()
os._exit(0)  # NOTE: as the opbridge executable (bridge.tools.cli.console): no 1-3 s torch/ORT teardown
"""

COMMANDS = {CHECK: [sys.executable, "-m", "bridge", "check"],
            CHECK_NATIVE: [sys.executable, "-m", "bridge", "check", "--tier", "native"],
            PLAIN_JOB: [sys.executable, "-c", PLAIN_SCRIPT, str(DEFAULT_OPSET)],
            TORCH: [sys.executable, "-c", "import torch"]}
_LINE = re.compile(r"^\[opbridge\] (.*?) (\.\.\.|done \([\d.]+ s\)|failed)$")
PHASES = ("startup", "export", "session", "runs + parity", "C++ builds", "other steps", "report + exit")


def phase_of(label: str) -> str:
    """The phase a progress line's label belongs to."""
    if label.startswith("building"):
        return "C++ builds"
    if label.startswith(("torch.export", "torch.onnx.export", "onnx.checker", "derive ", "inline ", "shape inference")):
        return "export"
    if label.startswith("onnxruntime session"):
        return "session"
    if label.startswith("eager + "):
        return "runs + parity"
    return "other steps"


def breakdown(events: list[tuple[float, str, str]], end: float) -> dict[str, float]:
    """Seconds per phase from progress lines ``(arrival seconds, label, '...'|'done ...')`` of a process that
    started at 0 and ended at ``end``: each step's own time (nested steps, e.g. a C++ build inside a run,
    taken out) goes to its phase, the time before a top-level step to that step's phase (the work leading
    to it: attaching bodies before the checker, preparing a tier before its session), the time before the
    first line to startup and after the last to report + exit.

    >>> breakdown([(1.0, "torch.export", "..."), (2.0, "torch.export", "done (1.0 s)"),
    ...            (2.5, "eager + onnxruntime run 1", "..."), (2.6, "building x", "..."),
    ...            (3.6, "building x", "done (1.0 s)"), (4.0, "eager + onnxruntime run 1", "done (1.5 s)")], 4.5)
    {'startup': 1.0, 'export': 1.0, 'session': 0.0, 'runs + parity': 1.0, 'C++ builds': 1.0, 'other steps': 0.0, 'report + exit': 0.5}
    """
    phases = dict.fromkeys(PHASES, 0.0)
    stack: list[list] = []  # [label, start, time of nested steps]
    last = None  # end of the last top-level step
    for t, label, what in events:
        if what == "...":
            if not stack:
                phases["startup" if last is None else phase_of(label)] += t - (0.0 if last is None else last)
            stack.append([label, t, 0.0])
            continue
        while stack and stack[-1][0] != label:  # NOTE: a step that never said done (it raised): closed here
            stack.pop()
        if not stack:
            continue
        _, start, nested = stack.pop()
        phases[phase_of(label)] += (t - start) - nested
        if stack:
            stack[-1][2] += t - start
        else:
            last = t
    phases["report + exit" if last is not None else "startup"] += end - (last if last is not None else 0.0)
    return {k: round(v, 4) for k, v in phases.items()}


def run_timed(cmd: list[str], env: dict) -> tuple[float, dict[str, float]]:
    """Wall seconds of ``cmd`` as a fresh process and its breakdown; SystemExit with its output if it fails."""
    events, lines = [], []
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, ""):
        now = time.perf_counter() - start
        lines.append(line)
        found = _LINE.match(line.rstrip("\n"))
        if found:
            events.append((now, found.group(1), found.group(2)))
    code = proc.wait(timeout=900)
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"opbridge: {' '.join(cmd[:4])} exited {code}. Got:\n{''.join(lines[-30:])}Fix it before timing.")
    return wall, breakdown(events, wall)


def _median_phases(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}


def check_times(repeats: int, warmup: bool, cold: bool, commands: list[str]) -> dict:
    """The commands as fresh processes on the warm cache (alternating rounds), and cold where asked."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    walls: dict[str, list[float]] = {name: [] for name in commands}
    phases: dict[str, list[dict]] = {name: [] for name in commands}
    if warmup:
        for name in commands:
            run_timed(COMMANDS[name], env)
    for i in range(repeats):
        for name in (commands if i % 2 == 0 else list(reversed(commands))):
            wall, parts = run_timed(COMMANDS[name], env)
            walls[name].append(wall)
            phases[name].append(parts)
    median = {k: statistics.median(v) for k, v in walls.items()}
    ratios = {"check_vs_import_torch": median[CHECK] / median[TORCH], "check_vs_plain": median[CHECK] / median[PLAIN_JOB]}
    if CHECK_NATIVE in median:
        ratios["check_native_vs_plain"] = median[CHECK_NATIVE] / median[PLAIN_JOB]
    result = {"warm": {"median_s": median, "range_s": {k: [min(v), max(v)] for k, v in walls.items()},
                       "breakdown_s": {k: _median_phases(v) for k, v in phases.items() if k != TORCH},
                       "ratios": ratios, "repeats": repeats,
                       "cache": "$" + cppbuild.CACHE_ENV if cppbuild.CACHE_ENV in os.environ else "the default root"},
              "cold": None}
    if cold:
        seconds, parts = {}, {}
        for name in (CHECK, CHECK_NATIVE):
            with tempfile.TemporaryDirectory() as tmp:
                seconds[name], parts[name] = run_timed(COMMANDS[name], {**env, cppbuild.CACHE_ENV: tmp})
        result["cold"] = {"s": seconds, "breakdown_s": parts,
                          "vs_warm": {k: v / median[k] for k, v in seconds.items() if k in median}}
    return result


# ---------------------------------------------------------------------------------------------------


def render(result: dict) -> str:
    """The ``export-time`` block of docs/evidence.md."""
    e, w, cold = result["export"], result["check"]["warm"], result["check"]["cold"]
    lines = [f"One run here ({result['machine']['cores']} cores, torch {result['machine']['torch']}, onnxruntime "
             f"{result['machine']['onnxruntime']}, {result['date']}; `python benchmarks/export_time.py --readme`"
             f"{', --quick' if result['quick'] else ''}), medians of alternating runs:", "",
             f"| export of (opset {e['opset']}) | `{BRIDGE}` | plain `{PLAIN}` | ratio (target <= {e['target']}x) |",
             "|---|---|---|---|"]
    for name, row in e["cases"].items():
        lines.append(f"| {name} | {row['median_s'][BRIDGE]:.2f} s | {row['median_s'][PLAIN]:.2f} s | "
                     f"{row['ratio']:.2f}x |")
    if "run_py" in e:
        r = e["run_py"]
        lines += ["", f"benchmarks/run.py's `export` entry (the demo, bridge.export vs torch.export + torch.onnx.export "
                  f"of the ExportedProgram): {r['bridge_s']:.2f} s vs {r['plain_s']:.2f} s, "
                  f"{r['bridge_s'] / r['plain_s']:.2f}x."]
    if e.get("first_in_process"):
        lines += ["", "The first export in a fresh process (dynamic shapes; the process's one-time costs included, "
                  "what one CLI call pays): " + ", ".join(
                      f"{name} {r['median_s'][BRIDGE]:.2f} s vs {r['median_s'][PLAIN]:.2f} s ({r['ratio']:.2f}x)"
                      for name, r in e["first_in_process"].items()) + "."]
    m = w["median_s"]
    lines += ["", f"A fresh process on a warm cache: `{CHECK}` {m[CHECK]:.1f} s, "
              f"{w['ratios']['check_vs_import_torch']:.1f}x `{TORCH}` ({m[TORCH]:.1f} s) and "
              f"{w['ratios']['check_vs_plain']:.2f}x the same job written by hand ({PLAIN_JOB}: plain export, "
              f"a session on the native library, eager vs ORT on three frames, {m[PLAIN_JOB]:.1f} s)"
              + (f"; `{CHECK_NATIVE}` {m[CHECK_NATIVE]:.1f} s, {w['ratios']['check_native_vs_plain']:.2f}x"
                 if CHECK_NATIVE in m else "") + ".", "",
              "| seconds | " + " | ".join(p for p in PHASES) + " |", "|---|" + "---|" * len(PHASES)]
    for name, parts in w["breakdown_s"].items():
        lines.append(f"| `{name}` | " + " | ".join(f"{parts[p]:.2f}" for p in PHASES) + " |")
    if cold:
        lines += ["", "Cold cache (a fresh `OPBRIDGE_CACHE_DIR`, every C++ build included): "
                  + ", ".join(f"`{k}` {v:.1f} s ({cold['breakdown_s'][k]['C++ builds']:.1f} s of builds)"
                              for k, v in cold["s"].items()) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round of each, no cold cache")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 7 for exports, 5 for processes)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-cache checks")
    parser.add_argument("--json", help=f"write results here (default without --quick: {DEFAULT_JSON})")
    parser.add_argument("--readme", action="store_true", help=f"write the {BLOCK} block into its page")
    parser.add_argument("--first", nargs=2, metavar=("CASE", "CONTENDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first:  # NOTE: one child process of first_export_times
        print(json.dumps({"first_export_s": first_export(*args.first)}))
        return {}
    quick = args.quick
    result: dict = {"date": datetime.date.today().isoformat(), "quick": quick,
                    "machine": {**machine.describe(), "torch": torch.__version__, "onnxruntime": ort.__version__,
                                "onnx": onnx.__version__, "load_average_at_start": list(os.getloadavg())}}
    # NOTE: the warm cache: the native library and the demo's C++ extension (built at its first eager call)
    library = build.library_path(build=True)
    warm = demo.build()
    with torch.no_grad():
        warm.model(*warm.args)
    print("1. export time, bridge.export vs plain torch.onnx.export (median s):", flush=True)
    # NOTE: --quick has no warm-up: checking the answers exported each model once with both already
    result["export"] = export_times(1 if quick else (args.repeats or 7), 0 if quick else 2, library)
    if not quick:
        result["export"]["run_py"] = entry = run.export_overhead(args.repeats or 5)
        print(f"  benchmarks/run.py export entry: bridge {entry['bridge_s']:.3f} s vs torch.export + "
              f"torch.onnx.export {entry['plain_s']:.3f} s -> {entry['bridge_s'] / entry['plain_s']:.2f}x", flush=True)
    result["export"]["first_in_process"] = None if quick else first_export_times(args.repeats or 3)
    print("2. the first `opbridge check`, fresh processes (median s) ...", flush=True)
    commands = [CHECK, PLAIN_JOB, TORCH] if quick else [CHECK, CHECK_NATIVE, PLAIN_JOB, TORCH]
    result["check"] = check_times(1 if quick else (args.repeats or 5), not quick, not (quick or args.no_cold), commands)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    result["provenance"] = machine.provenance(MEASURES)
    path = machine.json_path(args.json, quick, str(DEFAULT_JSON))
    if path is not None:
        files.write_json(path, result)
    text = render(result)
    if args.readme:
        doc_markers.write(BLOCK, text)
    print(text)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
