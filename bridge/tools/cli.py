"""``opbridge`` command line: ops | export | run | check | doctor.

Examples (the demo model is the default ``--model``)::

    opbridge ops
    opbridge ops --show-body opbridge::crop   # the op's portable ONNX body (written or derived)
    opbridge export -o demo.onnx          # also writes demo.inputs.npz
    opbridge export --inline -o demo_inline.onnx   # custom nodes replaced by their ONNX bodies
    opbridge inline demo.onnx -o demo_inline.onnx  # the same for a file exported earlier
    opbridge run demo.onnx
    opbridge check                        # export + ORT + parity table; exit 1 on mismatch
    opbridge check --op bev::bev_pool_v2  # one op over its dtypes and sample inputs
    opbridge check --tier native          # the same through the C++ kernel library
    opbridge check --inline --runtime openvino     # the inlined file in OpenVINO
    opbridge check --localize             # on a mismatch, name the first ONNX node that diverges
    opbridge doctor --build               # build the native library, say what it serves
    opbridge build -o dist/               # the deployable native library + manifest.json
    opbridge attach in.onnx -o out.onnx   # re-attach function bodies at the file's opset
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

from bridge.core.errors import OpBridgeError
from bridge.tools.parity import check_parity
from bridge.core.progress import enable as enable_progress
from bridge.core.progress import format_table
from bridge.core.registry import REGISTRY
from bridge.tools.sessions import load_model, session
from bridge.tools.testing import ModelCase, OpModule, cases
from exporters.derive import body_status, show_body
from exporters.export import DEFAULT_OPSET, export
from exporters.inline import custom_op_types, inline_file
from exporters.opsets import attach_functions, onnx_opset
from exporters.portable import required_ir_version
from ort_kernels import build
from ort_kernels.tiers import NAMES as TIER_NAMES
from ort_kernels.tiers import TIERS

DEFAULT_MODEL = "custom_ops.demo:build"


def _import_error(name: str, e: BaseException) -> OpBridgeError:
    """The module's own error, its last frame inside the module, not a traceback of the CLI."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return OpBridgeError(f"cannot import op module {name!r}. Got {type(e).__name__}: {e}{where}. Fix the module, "
                         "or pass a module name importable from here or a path to a .py file to --ops.")


def import_ops(name: str):
    """Import ``--ops NAME``: a module name (the current folder on sys.path, as ``python -m`` has it)
    or a path to a ``.py`` file (its folder goes on sys.path, so its own imports work)."""
    path = Path(name)
    if name.endswith(".py") or os.sep in name:
        if not path.is_file():
            raise OpBridgeError(f"no op module file at {name!r}. Got a path that does not exist. "
                                "Pass a path to a .py file, or a module name.")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = path.stem
    elif "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001  any error of the user's module becomes one line
        raise _import_error(name, e) from None


def _load_ops(modules: list[str]) -> None:
    for name in ["custom_ops", *modules]:
        import_ops(name)


def _load_case(spec: str):
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise OpBridgeError(f"--model must be MODULE:FACTORY. Got {spec!r}. Use e.g. {DEFAULT_MODEL}.")
    try:
        factory = getattr(import_ops(module_name), attr)
    except AttributeError as e:
        raise OpBridgeError(f"cannot load model factory {spec!r}. Got {e}. "
                            "Pass MODULE:FACTORY of a function returning bridge.tools.testing.ModelCase.") from None
    case = factory()
    if not isinstance(case, ModelCase):
        raise OpBridgeError(f"{spec} must return a bridge.tools.testing.ModelCase. Got {type(case).__name__}. "
                            "Return ModelCase(model, args, dynamic_shapes).")
    return case


def _inputs_path(onnx_path: str) -> str:
    root, _ = os.path.splitext(onnx_path)
    return root + ".inputs.npz"


def cmd_ops(args) -> int:
    if args.show_body:
        spec = REGISTRY.functional(REGISTRY.get(args.show_body))
        print(show_body(spec, opset=DEFAULT_OPSET))
        return 0
    rows = []
    for spec in REGISTRY:
        onnx_spec = REGISTRY.functional(spec)
        body, body_note = body_status(onnx_spec, opset=DEFAULT_OPSET)
        rows.append({
            "op": spec.qualname, "onnx": f"{spec.domain}::{spec.name} v{spec.version}",
            "inputs": [p.name for p in spec.tensors],
            "attributes": {p.name: p.attr_type.name + ("(bool)" if p.is_bool else "") for p in spec.attributes},
            "mutates": list(spec.mutated), "torchbind": list(spec.torchbind), "dtypes": [str(d).replace("torch.", "") for d in spec.dtypes],
            "fake": spec.has_fake, "autograd": spec.has_autograd, "reference": spec.reference is not None,
            "samples": spec.sample_inputs is not None, "body": body, "body_note": body_note,
            "tiers": {name: tier.why_not(onnx_spec) is None for name, tier in TIERS.items()},
            "skipped": {name: {str(d).replace("torch.", ""): why for d in spec.dtypes
                               if (why := tier.why_not(onnx_spec, d)) and tier.why_not(onnx_spec) is None}
                        for name, tier in TIERS.items()},
            "missing": REGISTRY.missing(spec),
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    mark = {True: "yes", False: "-"}
    head = ("op", "onnx node", "attributes", "fake", "autograd", "ref", "samples", "body", *TIER_NAMES)
    print(format_table([head] + [
        (r["op"], r["onnx"], ",".join(f"{k}:{v}" for k, v in r["attributes"].items()) or "-",
         mark[r["fake"]], mark[r["autograd"]], mark[r["reference"]], mark[r["samples"]], r["body"],
         *(mark[r["tiers"][t]] for t in TIER_NAMES)) for r in rows]))
    for r in rows:
        for tier_name, dtypes in r["skipped"].items():
            for why in sorted(set(dtypes.values())):
                names = ", ".join(d for d, w in dtypes.items() if w == why)
                print(f"tier {tier_name} skips {r['op']} {names}: {why}")
        for method in r["torchbind"]:
            print(f"note: {r['op']} also stands for torchbind {method} (object state -> attributes)")
        for gap in r["missing"]:
            print(f"note: {r['op']} lacks {gap}")
        if r["body"] == "none":
            print(f"note: {r['op']} has no portable body (function tier): {r['body_note']}")
        elif r["body_note"]:
            print(f"note: {r['op']} body: {r['body_note']}")
    print(f"{len(rows)} ops registered")
    return 0


def cmd_export(args) -> int:
    case = _load_case(args.model)
    proto = export(case.model, case.args, args.output, dynamic_shapes=case.dynamic_shapes,
                   functions=not args.no_functions, inline=args.inline, opset_version=args.opset)
    tensors = [a.detach().numpy() for a in case.args]
    np.savez(_inputs_path(args.output), **dict(zip((i.name for i in proto.graph.input), tensors)))
    size = os.path.getsize(args.output)
    print(f"wrote {args.output} ({size / 1024:.1f} KiB) and {_inputs_path(args.output)}")
    return 0


def load_inputs(path: str, names: list[str]) -> dict[str, np.ndarray]:
    """The feed from an ``.npz``: arrays keyed by input name, or ``arr_0``... in input order."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as e:  # noqa: BLE001  not a zip, object arrays, truncated: one clear line
        raise OpBridgeError(f"{path} is not a readable .npz of numeric arrays. Got {type(e).__name__}: "
                            f"{str(e)[:200]}. Save the inputs with numpy.savez(path, name=array, ...).") from None
    positional = [f"arr_{i}" for i in range(len(names))]
    if set(arrays) == set(names):
        return {n: arrays[n] for n in names}
    if set(arrays) == set(positional):
        return dict(zip(names, (arrays[k] for k in positional)))
    raise OpBridgeError(f"{path} holds arrays {sorted(arrays)}; the model takes inputs {names}. Got a mismatch. "
                        "Save one array per model input, keyed by input name (or arr_0... in input order).")


def cmd_run(args) -> int:
    inputs_path = args.inputs or _inputs_path(args.model_file)
    if not os.path.isfile(inputs_path):
        raise OpBridgeError(f"no inputs for {args.model_file}. Got no file {inputs_path!r}. "
                            "Pass --inputs FILE.npz (arrays keyed by input name), or export with `opbridge export`.")
    sess = session(args.model_file, tier=args.tier)
    feed = load_inputs(inputs_path, [i.name for i in sess.get_inputs()])
    start = time.perf_counter()
    try:
        outputs = sess.run(None, feed)
    except Exception as e:
        raise OpBridgeError(f"onnxruntime failed to run {args.model_file}. Got {type(e).__name__}: "
                            f"{str(e)[:600]}. Check the inputs.") from None
    ms = (time.perf_counter() - start) * 1e3
    for meta, out in zip(sess.get_outputs(), outputs):
        stats = f"min {out.min():.4g} max {out.max():.4g} mean {out.mean():.4g}" if out.size else "empty"
        print(f"{meta.name}: shape {list(out.shape)} {out.dtype} {stats}")
    print(f"ran in {ms:.1f} ms ({args.tier} tier)")
    return 0


def cmd_check(args) -> int:
    reports, skipped = [], []
    if args.op:
        spec = REGISTRY.get(args.op)
        tier = TIERS[args.tier]
        why = tier.why_not(REGISTRY.functional(spec))
        if why is not None and not args.inline:
            raise OpBridgeError(f"tier {args.tier!r} cannot run {spec.qualname}: {why}. Got --tier {args.tier}. "
                                "Pick another tier (opbridge ops shows which run it), or add what it lacks.")
        if args.tier == "function" and body_status(REGISTRY.functional(spec), opset=DEFAULT_OPSET)[0] == "derived":
            print(f"note: {spec.qualname} runs the ONNX body derived from its PyTorch implementation")
        # NOTE: dtypes a tier does not run are reported as skipped, with the tier's reason
        run = [d for d in spec.dtypes if args.inline or tier.why_not(REGISTRY.functional(spec), d) is None]
        skipped = [f"{spec.qualname} {str(d).replace('torch.', '')} (tier {args.tier} "
                   f"{tier.why_not(REGISTRY.functional(spec), d)})" for d in spec.dtypes if d not in run]
        for case in cases([spec], dtypes=tuple(run)):
            module, tensors = OpModule.from_sample(spec, case.sample)
            reports.append(check_parity(module, tensors, tier=args.tier, rtol=args.rtol, atol=args.atol,
                                        name=case.id, inline=args.inline, runtime=args.runtime,
                                        localize=args.localize))
    else:
        case = _load_case(args.model)
        reports.append(check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes,
                                    extra_args=case.extra_args, tier=args.tier, rtol=args.rtol,
                                    atol=args.atol, path=args.output, name=case.name or args.model,
                                    inline=args.inline, runtime=args.runtime, localize=args.localize))
    for r in reports:
        print(r)
        print()
    for line in skipped:
        print(f"skipped {line}")
    ok = all(r.passed for r in reports)
    print(f"{sum(r.passed for r in reports)} passed, {sum(not r.passed for r in reports)} failed"
          + (f", {len(skipped)} dtypes skipped" if skipped else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([json.loads(r.to_json()) for r in reports], fh, indent=2)
    if args.plot:
        root, ext = os.path.splitext(args.plot)
        for i, r in enumerate(reports):
            target = args.plot if len(reports) == 1 else f"{root}-{i}{ext or '.png'}"
            print(f"wrote {r.plot(target)}")
    return 0 if ok else 1


def cmd_inline(args) -> int:
    output = args.output or os.path.splitext(args.model_file)[0] + "_inline.onnx"
    original, inlined = inline_file(args.model_file, output)
    ops = ", ".join(f"{d}::{t}" for d, t in custom_op_types(original)) or "none"
    print(f"inlined {ops}: {len(original.graph.node)} -> {len(inlined.graph.node)} nodes")
    print(f"wrote {output} ({os.path.getsize(output) / 1024:.1f} KiB)")
    return 0


def cmd_doctor(args) -> int:
    print(f"python {platform.python_version()}, torch {torch.__version__}, "
          f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}")
    include = os.environ.get(build.ORT_INCLUDE_ENV)
    print(f"ORT C headers: {'official, from ' + include if include else 'opbridge declaration (C API v17)'}")
    path = build.library_path(build=args.build)
    built = path.is_file()
    print(f"native library: {path}")
    print(f"built: {'yes' if built else 'no (run `opbridge doctor --build`; a native session builds it too)'}")
    if built:
        options = onnxruntime.SessionOptions()
        try:
            options.register_custom_ops_library(str(path))
            print("loads in onnxruntime: yes")
        except Exception as e:
            print(f"loads in onnxruntime: NO ({e})")
            return 1
    for name, tier in TIERS.items():
        print(f"tier {name}: {tier.summary}")
        for line in tier.report(REGISTRY):
            print(f"  {line}")
    return 0


def cmd_build(args) -> int:
    """Copy the native library (every registered op with a C++ kernel) and a manifest into ``-o DIR``."""
    library = build.library_path(build=True)
    served = build.served_ops(REGISTRY)
    manifest = {
        "library": build.LIBRARY_NAME, "onnxruntime_c_api": 17, "built_with_onnxruntime": onnxruntime.__version__,
        "ops": [{"op": REGISTRY.find(d, n).qualname, "domain": d, "name": n, "version": REGISTRY.find(d, n).version,
                 "dtypes": [str(t).replace("torch.", "") for t in dtypes]} for (d, n), dtypes in sorted(served.items())],
    }
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    # NOTE: each file lands whole or not at all (temp file in the target folder, then rename)
    for name, write in ((build.LIBRARY_NAME, lambda f: shutil.copyfileobj(open(library, "rb"), f)),
                        ("manifest.json", lambda f: f.write(json.dumps(manifest, indent=2).encode()))):
        with tempfile.NamedTemporaryFile(dir=out, delete=False) as tmp:
            write(tmp)
        os.replace(tmp.name, out / name)
    print(f"wrote {out / build.LIBRARY_NAME} ({len(served)} ops) and {out / 'manifest.json'}")
    print("load it with onnxruntime.SessionOptions().register_custom_ops_library(PATH); no compiler needed")
    return 0


def cmd_attach(args) -> int:
    """Give a file (e.g. one ``onnx.version_converter`` or another tool rewrote) the registered
    function bodies it lacks, at its own opset; write it whole or not at all."""
    proto = load_model(args.model_file)
    onnx.external_data_helper.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(args.model_file)))
    changed = attach_functions(proto, REGISTRY)
    proto.ir_version = max(proto.ir_version, required_ir_version(proto))
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as e:  # noqa: BLE001  checker errors are one line for the user
        raise OpBridgeError(f"{args.model_file} fails onnx.checker after attaching bodies. Got {type(e).__name__}: "
                            f"{str(e)[:300]}. Export the model again with opbridge.") from None
    target = Path(args.output or args.model_file)
    external = proto.ByteSize() >= 1 << 31  # NOTE: protobuf's 2 GiB limit
    # NOTE: the .onnx lands whole or not at all (temp file in the target folder, then rename)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".onnx", delete=False) as tmp:
        pass
    try:
        onnx.save_model(proto, tmp.name, save_as_external_data=external,
                        location=target.name + ".data" if external else None)
        os.replace(tmp.name, target)
    finally:
        if os.path.exists(tmp.name):
            os.unlink(tmp.name)
    print(f"{'attached or converted ' + ', '.join(changed) if changed else 'nothing to attach'} "
          f"(ONNX opset {onnx_opset(proto)}); wrote {target}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opbridge", description=__doc__.split("\n")[0])
    parser.add_argument("--ops", action="append", default=[], metavar="MODULE",
                        help="import MODULE (a module name or a path to a .py file) to register more ops "
                             "(repeatable); custom_ops is always loaded")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.add_argument("-v", "--verbose", action="store_true", help="on an error, also print the full trace")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ops", help="list registered ops, their pieces and kernel tiers")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--show-body", metavar="NS::NAME",
                   help="print the op's portable ONNX body (written, or derived from its first sample)")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("export", help="export a model to ONNX (+ its example inputs as .inputs.npz)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="MODULE:FACTORY returning a ModelCase")
    p.add_argument("-o", "--output", default="model.onnx")
    p.add_argument("--no-functions", action="store_true", help="do not attach model-local function bodies")
    p.add_argument("--inline", action="store_true", help="replace each custom node by its ONNX body (standard ONNX only)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset, 17 and up (default {DEFAULT_OPSET})")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("inline", help="replace each custom node of an .onnx file by its ONNX function body")
    p.add_argument("model_file")
    p.add_argument("-o", "--output", help="where to write (default: MODEL_inline.onnx); written atomically")
    p.set_defaults(func=cmd_inline)

    p = sub.add_parser("run", help="run an .onnx file in ONNX Runtime on saved inputs")
    p.add_argument("model_file")
    p.add_argument("--inputs", help=".npz with one array per model input (default: MODEL.inputs.npz)")
    p.add_argument("--tier", default="function", choices=TIER_NAMES)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("doctor", help="report the native kernel library: built?, loads?, ops and domains served")
    p.add_argument("--build", action="store_true", help="build the library if it is not built yet")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("build", help="write the deployable native library (registered ops) and a manifest")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write into (created)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("attach", help="re-attach the registered function bodies a file lacks, at its opset")
    p.add_argument("model_file")
    p.add_argument("-o", "--output", help="file to write (default: replace MODEL_FILE, atomically)")
    p.set_defaults(func=cmd_attach)

    p = sub.add_parser("check", help="export, run in ORT and compare against eager (parity table)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="MODULE:FACTORY returning a ModelCase")
    p.add_argument("--op", help="check one registered op over its dtypes and sample inputs instead")
    p.add_argument("--tier", default="function", choices=TIER_NAMES)
    p.add_argument("--inline", action="store_true", help="check the inlined file (custom nodes replaced by bodies)")
    p.add_argument("--runtime", default="onnxruntime", choices=("onnxruntime", "openvino"),
                   help="run the file in this runtime (openvino needs --inline and `pip install openvino`)")
    p.add_argument("--rtol", type=float, help="override the per-dtype relative tolerance")
    p.add_argument("--atol", type=float, help="override the per-dtype absolute tolerance")
    p.add_argument("-o", "--output", help="keep the exported .onnx here")
    p.add_argument("--json", help="write the report(s) as JSON to this file")
    p.add_argument("--plot", metavar="PNG", help="write a histogram of the errors per output (needs matplotlib)")
    p.add_argument("--localize", nargs="?", const=True, default=False, choices=["always"],
                   help="on a failure, compare every intermediate value and name the first node that diverges "
                        "(--localize always: also when the check passes)")
    p.set_defaults(func=cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    enable_progress(not args.quiet)
    try:
        _load_ops(args.ops)
        return args.func(args)
    except OpBridgeError as e:
        if args.verbose:  # NOTE: the trace of what went wrong (torch's own error is the cause)
            traceback.print_exception(e, file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
