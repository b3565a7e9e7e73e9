"""How big each seed op's portable ONNX body is, and what bev_pool_v2's costs at BEVDet-R50 size.

    python benchmarks/body_size.py [--repeats 15] [--quick] [--json PATH]

1. nodes per op body: each seed op with a written function body, exported from its first float32
   sample, then inlined (``exporters.inline.inline_functions``, what runtimes other than
   onnxruntime get): the nodes the body puts in the graph (``nodes``), the same counting the
   nodes inside If/Loop branches (``nodes_with_branches``), and both for the body without its
   check guards (``unguarded``); bev_pool_v2's target: at most half of the 421 nodes it had;
2. bev_pool_v2 at BEVDet-R50 size (benchmarks/bev_pool_v2.py's inputs): the function tier (plain
   onnxruntime running the guarded body, 2 intra-op threads) against eager torch, timed
   round-robin in one process (bev_pool_v2.round_robin: medians, the second of two back-to-back
   calls); target <= 0.35x eager. The ratio is the result; absolute times are context.
``--quick`` (a smoke run) times 2 rounds at 8 depth bins.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

# NOTE: as in bev_pool_v2.py: torch's OpenMP threads block rather than spin (set before torch loads),
# only when this script starts the process, never on import
if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bev_pool_v2 as bev  # noqa: E402
import machine  # noqa: E402
from contenders import EAGER, FUNCTION  # noqa: E402

import bridge  # noqa: E402
import custom_ops  # noqa: E402,F401
from bridge.core.basics import files  # noqa: E402
from bridge.core.basics.domains import ONNX_DOMAINS  # noqa: E402
from bridge.core.basics.graphs import walk  # noqa: E402
from bridge.core.spec import Written  # noqa: E402
from bridge.tools.testing import OpModule  # noqa: E402
from exporters.bodies.opsets import convert_function, onnx_opset, portable_constants  # noqa: E402
from exporters.inline import inline_functions  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the code this run measures (machine.provenance): the ops' bodies and checks, inlining, the benchmark
MEASURES = ["custom_ops", "bridge/core/checks/guards.py", "bridge/core/checks/vocabulary.py", "exporters/inline.py",
            "exporters/resolve.py", "exporters/bodies", "benchmarks/body_size.py"]
DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "body_size.json")
BEV = "bev::bev_pool_v2"
BEFORE = 421  # bev_pool_v2's inlined body before issue #27 (guards included)
TARGETS = {"bev_pool_v2_nodes_max": BEFORE // 2, "function_vs_eager_max": 0.35}


def _counts(model: onnx.ModelProto) -> dict[str, int]:
    """Nodes the custom nodes' bodies put into ``model`` once inlined: top level, and with branches."""
    others = [n for n in model.graph.node if n.domain in ONNX_DOMAINS]
    flat = inline_functions(model, guards=True)  # NOTE: the body as a function-tier file carries it
    return {"nodes": len(flat.graph.node) - len(others),
            "nodes_with_branches": len(list(walk(flat.graph.node))) - len(list(walk(others)))}


def _unguarded(model: onnx.ModelProto, spec) -> onnx.ModelProto:
    """``model`` with ``spec``'s body as written, without its check guards."""
    proto = spec.function.to_function_proto()  # NOTE: as written: guards are added where it goes into a model
    proto = portable_constants(convert_function(proto, onnx_opset(model)))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for f in out.functions:
        if (f.domain, f.name) == (spec.domain, spec.name):
            f.CopyFrom(proto)
    return out


def body_sizes() -> dict[str, dict]:
    """{op: {nodes, nodes_with_branches, unguarded: {...}}} of every seed op with a written body."""
    sizes = {}
    for spec in bridge.REGISTRY:
        if not isinstance(spec.function, Written) or not spec.sample_inputs:
            continue
        samples = spec.sample_inputs(torch.float32)
        if not samples:
            continue
        module, tensors = OpModule.from_sample(spec, samples[0])
        model = bridge.export(module, tensors)
        sizes[spec.qualname] = {**_counts(model), "guarded_checks": sum(c.guarded for c in spec.checks or ()),
                                "unguarded": _counts(_unguarded(model, spec))}
    return sizes


def function_vs_eager(repeats: int, depth_bins: int) -> dict:
    """bev_pool_v2's function tier against eager torch at BEVDet-R50 size (``depth_bins`` fewer for a smoke run)."""
    inputs, shape = bev.bevdet_inputs(depth_bins=depth_bins)
    model = bev.Pool(shape)
    session = bridge.session(bridge.export(model, inputs), tier="function", sess_options=bev.session_options(2))
    feed = bridge.parity.ort_feed(session, inputs)
    with torch.no_grad():
        expected = model(*inputs)
        row = bridge.compare(FUNCTION, expected, session.run(None, feed)[0])
        assert row.passed, row  # the same answer before timing anything
        ms = bev.round_robin({EAGER: lambda: model(*inputs), FUNCTION: lambda: session.run(None, feed)}, repeats)
    return {"points": int(inputs[2].numel()), "intervals": int(inputs[5].numel()), "depth_bins": depth_bins,
            "repeats": repeats, "median_ms": ms, "function_vs_eager": ms[FUNCTION] / ms[EAGER],
            "function_vs_eager_max_abs": row.max_abs, "ort_intra_op_threads": 2,
            "torch_threads": torch.get_num_threads()}


def measure(repeats: int = 15, quick: bool = False) -> dict:
    sizes = body_sizes()
    timing = function_vs_eager(2 if quick else repeats, 8 if quick else bev.R50["depth_bins"])
    bev_nodes = sizes[BEV]["nodes"]
    return {"bodies": sizes, "bev_pool_v2": timing, "targets": TARGETS,
            "met": {"bev_pool_v2_nodes": bev_nodes <= TARGETS["bev_pool_v2_nodes_max"],
                    "function_vs_eager": timing["function_vs_eager"] <= TARGETS["function_vs_eager_max"]},
            "machine": {"cores": os.cpu_count(), "onnxruntime": ort.__version__, "torch": torch.__version__,
                        "load_average": list(os.getloadavg())},
            "quick": quick, "date": datetime.date.today().isoformat(), "provenance": machine.provenance(MEASURES)}


def report(r: dict) -> str:
    lines = [f"{'op body (inlined nodes)':<28}{'guarded':>9}{'+branches':>11}{'unguarded':>11}{'+branches':>11}"]
    for name, s in r["bodies"].items():
        u = s["unguarded"]
        lines.append(f"{name:<28}{s['nodes']:>9}{s['nodes_with_branches']:>11}{u['nodes']:>11}"
                     f"{u['nodes_with_branches']:>11}")
    t = r["bev_pool_v2"]
    lines.append(f"bev_pool_v2: {r['bodies'][BEV]['nodes']} nodes (was {BEFORE}; target <= "
                 f"{r['targets']['bev_pool_v2_nodes_max']})")
    lines.append(f"bev_pool_v2 at {t['points']} points, {t['intervals']} intervals ({t['repeats']} rounds): "
                 + ", ".join(f"{k} {v:.2f} ms" for k, v in t["median_ms"].items())
                 + f" -> function / eager {t['function_vs_eager']:.2f} (target <= "
                 f"{r['targets']['function_vs_eager_max']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="2 rounds at 8 depth bins (a smoke run)")
    parser.add_argument("--json", help=f"write results here (default without --quick: {DEFAULT_JSON})")
    args = parser.parse_args(argv)
    result = measure(args.repeats, args.quick)
    print(report(result))
    path = machine.json_path(args.json, args.quick, DEFAULT_JSON)
    if path is not None:
        print(f"wrote {files.write_json(path, result)}")
    return result


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main(sys.argv[1:])
