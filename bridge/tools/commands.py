"""The ``opbridge`` commands (``cmd_<name>(args)``), run by ``bridge.tools.cli`` after it parsed the
arguments: this module loads torch, onnx and onnxruntime; the parser does not."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import io
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

from bridge.core import cppbuild
from bridge.core.basics import files
from bridge.core.basics.errors import BRIDGE_FOLDER, OpBridgeError, raised_at
from bridge.core.basics.graphs import custom_nodes, nonstandard_ops
from bridge.core.basics.progress import enable as enable_progress
from bridge.core.basics.progress import format_table
from bridge.core.origins import class_name
from bridge.core.registry import REGISTRY
from bridge.tools import openvino_runtime, preflight
from bridge.tools.parity import check_parity, plot_missing
from bridge.tools.sessions import check_nodes, input_arrays, session
from bridge.tools.testing import ModelCase, OpModule, cases
from bridge.tools.triton import write_repository
from exporters.bodies.opsets import onnx_opset
from exporters.export import DEFAULT_OPSET, export
from exporters.inline import inline_functions, save_atomic
from exporters.kinds import body_kind
from exporters.portable import relativize_paths, required_ir_version
from exporters.resolve import attach_functions
from ort_kernels import build, tiers
from ort_kernels.libraries import user_libraries

# NOTE: an import error's location is shown only where it is the user's code, never opbridge's own
_NOT_THE_MODULE = (BRIDGE_FOLDER, os.path.dirname(importlib.__file__) + os.sep,
                   "<frozen importlib")


def _import_error(name: str, e: BaseException, option: str = "--ops") -> OpBridgeError:
    """The module's own error, its last frame inside the module, not a traceback of the CLI."""
    where = raised_at(e, _NOT_THE_MODULE)
    # NOTE: our own message quoted once: no second "opbridge: ", and its period after the location
    text = str(e).removeprefix("opbridge: ").rstrip(". ")
    what = "op module" if option == "--ops" else "module"
    return OpBridgeError(f"cannot import {what} {name!r}. Got {type(e).__name__}: {text}{where}. Fix the module, "
                         f"or pass a module name importable from here or a path to a .py file to {option}.")


def import_ops(name: str, option: str = "--ops"):
    """Import ``--ops NAME``: a module name (the current folder on sys.path, as ``python -m`` has it)
    or a path to a ``.py`` file, loaded from exactly that file (its folder goes on sys.path, so its
    own imports work)."""
    path = Path(name)
    if path.suffix in (".onnx", ".npz"):
        raise OpBridgeError(f"{option} takes the Python module that registers your ops (a name or a .py file), not a "
                            f"{path.suffix} file. Got {option} {name}. Pass the file to the command itself (opbridge "
                            f"run model.onnx), and the module to {option} (e.g. {option} my_ops).")
    if name.endswith(".py") or os.sep in name:
        if not path.is_file():
            raise OpBridgeError(f"no op module file at {name!r}. Got a path that does not exist. "
                                "Pass a path to a .py file, or a module name.")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        return _import_alone(name, functools.partial(_load_file, path.resolve()), option)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return _import_alone(name, functools.partial(importlib.import_module, name), option)


def _load_file(path: Path):
    """The module of the file ``path`` itself: under its own name when importing that name reaches this
    file (so the user's other modules share it), else under a name of its own (``json.py`` beside
    the standard library's json, a second ``ops.py``): never another module of the same name."""
    name = path.stem
    try:
        found = importlib.util.find_spec(name) if name.isidentifier() else None
    except (ImportError, ValueError):  # NOTE: a broken module of that name elsewhere: not this file
        found = None
    if found is None or not found.origin or Path(found.origin).resolve() != path:
        name = f"_opbridge_ops_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{name}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # NOTE: a .py file always has a spec
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_alone(name: str, load, option: str = "--ops"):
    """Import the user's module (``load()``) as if it were imported by a bare ``python``.

    NOTE: during the import ``sys.argv`` is the program name alone (an argparse at import time parses
    nothing of opbridge's), and what the module writes to stderr is held until the import ends: a
    ``sys.exit()`` (or argparse's exit) becomes one error line quoting the module's last line."""
    argv, held = sys.argv, io.StringIO()
    sys.argv = argv[:1]
    try:
        with contextlib.redirect_stderr(held):
            return load()
    except SystemExit as e:
        said = held.getvalue().strip().splitlines()
        held = io.StringIO()
        quoted = f", after printing {said[-1].strip()!r}" if said else ""
        raise OpBridgeError(f"op module {name!r} exited while being imported (sys.exit({e.code!r}){quoted}). Got "
                            "SystemExit. Keep its script part under `if __name__ == \"__main__\":` so importing it "
                            "only registers ops.") from None
    except Exception as e:  # noqa: BLE001  any error of the user's module becomes one line
        raise _import_error(name, e, option) from None
    finally:
        sys.argv = argv
        sys.stderr.write(held.getvalue())


def _load_ops(modules: list[str]) -> None:
    # NOTE: opbridge's own seed ops (entry points: preflight.seed_modules), imported plainly: their progress
    # lines show as they come
    for seed in preflight.seed_modules():
        try:
            importlib.import_module(seed)
        except Exception as e:  # noqa: BLE001
            raise _import_error(seed, e) from None
    for name in modules:
        import_ops(name)


def _load_case(spec: str):
    module_name, attr = preflight.model_factory(spec)
    try:
        factory = getattr(import_ops(module_name, "--model"), attr)
    except AttributeError as e:
        raise OpBridgeError(f"cannot load model factory {spec!r}. Got {e}. "
                            "Pass MODULE:FACTORY of a function returning bridge.testing.ModelCase.") from None
    case = factory()
    if not isinstance(case, ModelCase):
        raise OpBridgeError(f"{spec} must return a bridge.testing.ModelCase. Got {type(case).__name__}. "
                            "Return ModelCase(model, args, dynamic_shapes).")
    return case


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _op_row(spec, thorough: bool) -> dict:
    """One op as ``opbridge ops --json`` shows it (``thorough``: derive bodies to see they work)."""
    onnx_spec = REGISTRY.functional(spec)
    body, body_note = body_kind(onnx_spec).status(opset=DEFAULT_OPSET, try_it=thorough)
    runs = {name: tier.why_not(onnx_spec, thorough=thorough) is None for name, tier in tiers.TIERS.items()}
    return {
        "op": spec.qualname, "onnx": f"{spec.domain}::{spec.name} v{spec.version}",
        "inputs": [p.name for p in spec.tensors],
        "attributes": {p.name: p.attr_type.name + ("(bool)" if p.is_bool else "") for p in spec.attributes},
        "mutates": list(spec.mutated), "torchbind": list(spec.torchbind),
        "dtypes": [_dtype_name(d) for d in spec.dtypes],
        "fake": spec.has_fake, "autograd": spec.has_autograd, "reference": spec.reference is not None,
        "samples": spec.sample_inputs is not None, "body": body, "body_note": body_note, "body_tried": thorough,
        "tiers": runs,
        "skipped": {name: {_dtype_name(d): why for d in spec.dtypes
                           if runs[name] and (why := tier.why_not(onnx_spec, d, thorough=thorough))}
                    for name, tier in tiers.TIERS.items()},
        "missing": REGISTRY.missing(spec),
        "function_class": class_name(fb.cls) if (fb := spec.origin.function) is not None else None,
    }


def _op_notes(r: dict) -> Iterator[str]:
    """The lines under the ops table for one op: skipped dtypes, torchbind methods, gaps, body."""
    for tier_name, dtypes in r["skipped"].items():
        for why in sorted(set(dtypes.values())):
            names = ", ".join(d for d, w in dtypes.items() if w == why)
            yield f"tier {tier_name} skips {r['op']} {names}: {why}"
    if r["function_class"]:
        yield f"note: {r['op']} is the node of torch.autograd.Function {r['function_class']} (bridge.register)"
    for method in r["torchbind"]:
        yield f"note: {r['op']} also stands for torchbind {method} (object state -> attributes)"
    for gap in r["missing"]:
        yield f"note: {r['op']} lacks {gap}"
    if r["body"] == "none":
        yield f"note: {r['op']} has no portable body (function tier): {r['body_note']}"
    elif r["body_note"]:
        yield f"note: {r['op']} body: {r['body_note']}"


def _ops_table(rows: list[dict]) -> str:
    mark = {True: "yes", False: "-"}
    head = ("op", "onnx node", "attributes", "fake", "autograd", "ref", "samples", "body", *tiers.NAMES)
    return format_table([head] + [
        (r["op"], r["onnx"], ",".join(f"{k}:{v}" for k, v in r["attributes"].items()) or "-",
         mark[r["fake"]], mark[r["autograd"]], mark[r["reference"]], mark[r["samples"]], r["body"],
         *(mark[r["tiers"][t]] for t in tiers.NAMES)) for r in rows])


def cmd_ops(args) -> int:
    if args.show_body:
        spec = REGISTRY.functional(REGISTRY.get(args.show_body))
        print(body_kind(spec).show(opset=DEFAULT_OPSET))
        return 0
    rows = [_op_row(spec, args.bodies) for spec in REGISTRY]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(_ops_table(rows))
    for r in rows:
        for line in _op_notes(r):
            print(line)
    for pending in REGISTRY.deferred:  # NOTE: a Function class, or a torchbind method "ns::Class.method"
        what = (f"torchbind method {pending}" if isinstance(pending, str)
                else f"torch.autograd.Function {class_name(pending)}")
        print(f"note: {what} is registered; its node is described at its first call in an export (no annotation, "
              "default, sample or attributes= tells it before)")
    for name, tier in tiers.TIERS.items():  # NOTE: the table says what each tier serves; this, what runs here
        if needs := tier.missing(REGISTRY):
            print(f"note: tier {name} runs nothing here: {needs.removeprefix('opbridge: ')}")
    print(f"{len(rows)} ops registered")
    return 0


def cmd_export(args) -> int:
    inputs_path = preflight.inputs_path(args.output)
    files.check_writable(args.output, what="model")  # NOTE: both targets before the export, not after
    files.check_writable(inputs_path)
    case = _load_case(args.model)
    proto = export(case.model, case.args, dynamic_shapes=case.dynamic_shapes,
                   functions=not args.no_functions, inline=args.inline, opset_version=args.opset)
    # NOTE: the tensor arguments only: a non-tensor one is a constant of the file
    arrays = input_arrays([i.name for i in proto.graph.input], case.args)
    # NOTE: the model and its inputs as one write: a failure leaves the previous pair as it was
    files.save_model(proto, args.output, also=[(inputs_path, files.npz_writer(arrays))])
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1024:.1f} KiB) and {inputs_path}")
    if args.no_functions:
        _warn_unserved(proto)
    return 0


def _warn_unserved(proto: onnx.ModelProto) -> None:
    """Warn (stderr) of each custom op of a file without bodies that opbridge's library has no C++ kernel for:
    no runtime with only that library (the README's deployment) can load the file."""
    ops = {(n.domain, n.op_type) for n in custom_nodes(proto)} - {(f.domain, f.name) for f in proto.functions}
    specs = [s for d, t in sorted(ops) if (s := REGISTRY.find(d, t)) is not None]
    for spec in specs:
        why = tiers.get("native").why_not(spec)
        if why is not None:
            print(f"opbridge: warning: {spec.qualname} has {why}, and this file holds no function body for it "
                  f"(--no-functions). Got a file that onnxruntime with opbridge's library alone cannot load. Export "
                  "without --no-functions (its body runs anywhere), or load a library serving it.", file=sys.stderr)


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
    missing, extra = [n for n in names if n not in arrays], sorted(set(arrays) - set(names))
    raise OpBridgeError(f"{path} holds arrays {sorted(arrays)}; the model takes inputs {names}. Got missing "
                        f"{missing}, extra {extra}. Save one array per model input, keyed by input name (or arr_0... "
                        "in input order).")


def _summary(value) -> str:
    """One output as ``opbridge run`` prints it: shape, dtype and value range; strings, sequences and
    maps (which have no range) by what they hold."""
    if isinstance(value, list):
        kinds = sorted({str(v.dtype) if isinstance(v, np.ndarray) else type(v).__name__ for v in value})
        return f"sequence of {len(value)} ({', '.join(kinds)})" if value else "sequence, empty"
    if isinstance(value, dict):
        return f"map of {len(value)} entries"
    if not isinstance(value, np.ndarray):
        return type(value).__name__
    kind = "string" if value.dtype.kind in "OUS" else str(value.dtype)
    head = f"shape {list(value.shape)} {kind}"
    if value.size == 0:
        return f"{head} empty"
    if kind == "string":
        return head
    return f"{head} min {value.min():.4g} max {value.max():.4g} mean {value.mean():.4g}"


def cmd_run(args) -> int:
    files.check_model_file(args.model_file)  # NOTE: the model first, then its inputs
    inputs_path = preflight.run_inputs(args)
    sess = session(args.model_file, tier=args.tier, native_library=args.native_library)
    feed = load_inputs(inputs_path, [i.name for i in sess.get_inputs()])
    start = time.perf_counter()
    try:
        outputs = sess.run(None, feed)
    except OpBridgeError:
        raise  # NOTE: the session's own message (the op's, the feed's) says what to do
    except Exception as e:
        raise OpBridgeError(f"onnxruntime failed to run {args.model_file}. Got {type(e).__name__}: "
                            f"{str(e)[:600].rstrip('.')}. Check the inputs.") from None
    ms = (time.perf_counter() - start) * 1e3
    for meta, out in zip(sess.get_outputs(), outputs):
        print(f"{meta.name}: {_summary(out)}")
    print(f"ran in {ms:.1f} ms ({args.tier} tier)")
    return 0


def _check_targets(args) -> None:
    """NOTE: every file ``check`` writes is checked before the check runs, not after it."""
    for path, what in ((args.output, "model"), (args.json, "report"), (args.plot, "plot")):
        if path:
            files.check_writable(path, what=what)


def _nothing_checked(spec, args, run: list, skipped: list[str]) -> OpBridgeError:
    """``check --op`` found no case to run: that is no pass. Say why and how to give it samples."""
    if spec.sample_inputs is None:
        return OpBridgeError(f"nothing was checked: {spec.qualname} has no sample inputs. Got sample_inputs=None. "
                             "Give the op samples: sample_inputs=lambda dtype: [bridge.SampleInput((tensor, ...))] "
                             "in its @bridge.op(...) or bridge.register(...), or @my_op.register_samples.")
    if not run:
        return OpBridgeError(f"nothing was checked: tier {args.tier!r} runs none of {spec.qualname}'s dtypes. Got "
                             f"{'; '.join(skipped) or 'no dtypes'}. Pick another tier (opbridge ops shows which "
                             "run it), or add what it lacks.")
    return OpBridgeError(f"nothing was checked: the sample inputs of {spec.qualname} are empty. Got no "
                         f"SampleInput for {', '.join(map(_dtype_name, run))}. Return at least one "
                         "bridge.SampleInput per dtype from its sample_inputs.")


def _op_reports(args) -> tuple[list, list[str]]:
    """``check --op``: one report per dtype and sample the tier runs, and the dtypes it skips."""
    spec = REGISTRY.get(args.op)
    tier, onnx_spec = tiers.TIERS[args.tier], REGISTRY.functional(spec)
    # NOTE: a library of the user's own may serve an op opbridge has no C++ kernel for: its session says
    why = None if args.native_library else tier.why_not(onnx_spec)
    if why is not None and not args.inline:
        raise OpBridgeError(f"tier {args.tier!r} cannot run {spec.qualname}: {why}. Got --tier {args.tier}. "
                            "Pick another tier (opbridge ops shows which run it), or add what it lacks.")
    # NOTE: dtypes a tier does not run are reported as skipped, with the tier's reason
    run = [d for d in spec.dtypes if args.inline or args.native_library or tier.why_not(onnx_spec, d) is None]
    skipped = [f"{spec.qualname} {_dtype_name(d)} (tier {args.tier} {tier.why_not(onnx_spec, d)})"
               for d in spec.dtypes if d not in run]
    selected = cases([spec], dtypes=tuple(run))
    if not selected:
        raise _nothing_checked(spec, args, run, skipped)
    if args.tier == "function" and body_kind(onnx_spec).status(opset=DEFAULT_OPSET)[0] == "derived":
        print(f"note: {spec.qualname} runs the ONNX body derived from its PyTorch implementation")
    reports = []
    for case in selected:
        module, tensors = OpModule.from_sample(spec, case.sample)
        reports.append(check_parity(module, tensors, tier=args.tier, rtol=args.rtol, atol=args.atol,
                                    name=case.id, inline=args.inline, runtime=args.runtime, localize=args.localize,
                                    native_library=args.native_library))
    return reports, skipped


def _model_report(args):
    case = _load_case(args.model)
    return check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes, extra_args=case.extra_args,
                        tier=args.tier, rtol=args.rtol, atol=args.atol, path=args.output,
                        name=case.name or args.model, inline=args.inline, runtime=args.runtime, localize=args.localize,
                        native_library=args.native_library)


def _write_reports(args, reports: list) -> None:
    if args.json:
        files.write_json(args.json, [json.loads(r.to_json()) for r in reports])
    if args.plot:
        root, ext = os.path.splitext(args.plot)
        for i, r in enumerate(reports):
            target = args.plot if len(reports) == 1 else f"{root}-{i}{ext or '.png'}"
            print(f"wrote {r.plot(target)}")


def cmd_check(args) -> int:
    _check_targets(args)
    reports, skipped = _op_reports(args) if args.op else ([_model_report(args)], [])
    for r in reports:
        print(r)
        print()
    for line in skipped:
        print(f"skipped {line}")
    print(f"{sum(r.passed for r in reports)} passed, {sum(not r.passed for r in reports)} failed"
          + (f", {len(skipped)} dtypes skipped" if skipped else ""))
    _write_reports(args, reports)
    return 0 if all(r.passed for r in reports) else 1


@contextlib.contextmanager
def _onnx_errors(path: str, action: str) -> Iterator[None]:
    """onnx's own errors (checker, shape inference, inliner) as one OpBridgeError naming the file;
    onnx's message names the node or function at fault."""
    try:
        yield
    except OpBridgeError:
        raise
    except (Exception, RecursionError) as e:  # noqa: BLE001  onnx raises several types, C++ ones included
        said = " ".join(str(e).split())[:500].rstrip(".")
        raise OpBridgeError(f"onnx cannot {action} {path}. Got {type(e).__name__}: {said}. "
                            "Fix the node or function it names, or export the model again with opbridge.") from None


def _load_checked(path: str, *, bodies: bool = True):
    """The model at ``path`` (external tensors loaded), its custom nodes checked against the registry:
    a wrong attribute type or input count is named by node before onnx meets it; ``bodies``: and its
    functions computing their outputs (``attach`` repairs those)."""
    proto = files.load_model(path)
    check_nodes(proto, REGISTRY, bodies=bodies)
    return proto


def cmd_inline(args) -> int:
    output = args.output or os.path.splitext(args.model_file)[0] + "_inline.onnx"
    files.check_writable(output, what="model")
    original = _load_checked(args.model_file)
    with _onnx_errors(args.model_file, "inline"):
        inlined = inline_functions(original, REGISTRY)
    save_atomic(inlined, output)
    ops = ", ".join(f"{d}::{t}" for d, t in nonstandard_ops(original)) or "none"
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
    # NOTE: `doctor --build` is suggested only where it can work: a machine with a compiler
    how = ("run `opbridge doctor --build`; a native session builds it too" if cppbuild.find_compiler() else
           "no C++ compiler here to build it; tier native below says what to do")
    print(f"built: {'yes' if built else f'no ({how})'}")
    if built:
        try:
            onnxruntime.SessionOptions().register_custom_ops_library(str(path))
            print("loads in onnxruntime: yes")
        except Exception as e:
            print(f"loads in onnxruntime: NO ({e})")
            return 1
    for name, tier in tiers.TIERS.items():
        print(f"tier {name}: {tier.summary}")
        needs = tier.missing(REGISTRY)  # NOTE: a tier this machine cannot run serves nothing here
        for line in ([f"serves no ops here: {needs.removeprefix('opbridge: ')}"] if needs else tier.report(REGISTRY)):
            print(f"  {line}")
    return 0


def cmd_build(args) -> int:
    """Copy the native library (every registered op with a C++ kernel) and a manifest into ``-o DIR``,
    or write a Triton model repository for ``--model FILE`` with ``--triton REPO``."""
    if args.triton:
        return _build_triton(args)
    if not args.output or args.model:
        raise OpBridgeError(f"build needs -o DIR (the library and a manifest) or --triton REPO --model FILE. "
                            f"Got -o {args.output!r}, --model {args.model!r}. Pass one of the two forms.")
    files.check_folder(args.output)  # NOTE: before the build, which can take a minute
    library = build.library_path(build=True)
    served = build.served_ops(REGISTRY)
    specs = {key: spec for key in served if (spec := REGISTRY.find(*key)) is not None}  # every served op is registered
    manifest = {
        "library": build.LIBRARY_NAME, "onnxruntime_c_api": 17, "built_with_onnxruntime": onnxruntime.__version__,
        "ops": [{"op": REGISTRY.declared(specs[d, n]).qualname, "domain": d, "name": n, "version": specs[d, n].version,
                 "dtypes": [_dtype_name(t) for t in dtypes]} for (d, n), dtypes in sorted(served.items())],
    }
    created = not os.path.isdir(args.output)
    out = Path(files.make_folder(args.output))
    # NOTE: each file lands whole or not at all, with the umask's mode (the library's with exec bits)
    try:
        files.copy_file(library, out / build.LIBRARY_NAME, executable=True)
        files.write_json(out / "manifest.json", manifest)
    except BaseException:
        if created and not any(out.iterdir()):
            out.rmdir()  # NOTE: a folder this command made stays only with what it was made for
        raise
    print(f"wrote {out / build.LIBRARY_NAME} ({len(served)} ops) and {out / 'manifest.json'}")
    print("load it with onnxruntime.SessionOptions().register_custom_ops_library(PATH); no compiler needed")
    return 0


def _build_triton(args) -> int:
    if not args.model or args.output:
        raise OpBridgeError(f"build --triton REPO needs --model FILE (an .onnx file) and no -o. Got --model "
                            f"{args.model!r}, -o {args.output!r}. Pass --model m.onnx.")
    model_dir = write_repository(args.triton, args.model, name=args.name, max_batch_size=args.max_batch_size,
                                 library_path_as_served=args.library_path)
    print(f"wrote Triton model {model_dir.name!r} in {model_dir}; serve it with: "
          f"tritonserver --model-repository={args.triton}")
    return 0


def cmd_attach(args) -> int:
    """Give a file (e.g. one ``onnx.version_converter`` or another tool rewrote) the function bodies
    it lacks (written, built or derived: exporters.resolve), at its own opset; ``--replace``: also
    replace the bodies it has of registered ops with the registry's. Write it whole or not at all."""
    target = args.output or args.model_file
    files.check_writable(target, what="model")
    proto = _load_checked(args.model_file, bodies=False)
    with _onnx_errors(args.model_file, "attach bodies to"):
        changed = attach_functions(proto, REGISTRY, replace=args.replace)
        relativize_paths(proto)
        proto.ir_version = max(proto.ir_version, required_ir_version(proto))
        onnx.checker.check_model(proto, full_check=True)
    # NOTE: a file rewritten in place keeps its mode; a new -o file gets the umask's
    in_place = os.path.isfile(target) and os.path.samefile(target, args.model_file)
    files.save_model(proto, target, keep_mode=in_place)
    print(f"{'attached or converted ' + ', '.join(changed) if changed else 'nothing to attach'} "
          f"(ONNX opset {onnx_opset(proto)}); wrote {target}")
    return 0


def _complete(args) -> None:
    """Defaults the parser leaves open (it loads nothing), and every prerequisite of the command
    checked before any export: the tier's package or compiler, OpenVINO."""
    if getattr(args, "model", None) is None and args.command in ("export", "check"):
        args.model = preflight.default_model()
    if getattr(args, "opset", None) is None and args.command == "export":
        args.opset = DEFAULT_OPSET
    if getattr(args, "native_library", None):
        user_libraries(args.native_library)  # NOTE: each loads in onnxruntime, before any export
    if hasattr(args, "tier"):
        if args.tier is None:
            args.tier = "native" if args.native_library else "function"
        tier = tiers.get(args.tier)
        # NOTE: with libraries of the user's own, what else the native tier needs is known per model
        needs = tier.missing(REGISTRY) if args.command in ("check", "run") and not args.native_library else None
        if needs:
            raise OpBridgeError(needs)
    if getattr(args, "runtime", None) == "openvino" and (needs := openvino_runtime.missing()):
        raise OpBridgeError(needs)
    if getattr(args, "plot", None) and (needs := plot_missing()):
        raise OpBridgeError(needs)


COMMANDS = {"ops": cmd_ops, "export": cmd_export, "inline": cmd_inline, "run": cmd_run, "doctor": cmd_doctor,
            "build": cmd_build, "attach": cmd_attach, "check": cmd_check, "cache": preflight.cmd_cache}


def run(args) -> int:
    """Run parsed arguments (``bridge.tools.cli.parse``); an OpBridgeError is one ``error:`` line, exit 2."""
    enable_progress(not args.quiet, quiet=args.quiet)
    try:
        _load_ops(args.ops)
        _complete(args)
        return COMMANDS[args.command](args)
    except OpBridgeError as e:
        return preflight.error(e, args.verbose)
    except BrokenPipeError:  # NOTE: output piped into `head`: stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
