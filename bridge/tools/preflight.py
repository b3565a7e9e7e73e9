"""What the ``opbridge`` command does before the commands module loads torch (3-5 s): every argument
that names a file checked (``--native-library``, the model file, ``--inputs``, each output), the
``--model`` form, ``opbridge cache``, and the one error line. An argument error so costs a fraction
of a second, and no export starts on arguments that cannot work.

Imports nothing heavy: no torch, no onnxruntime (``bridge.core.basics.files`` reads onnx).
"""

from __future__ import annotations

import os
import sys
import traceback

from bridge.core.basics import cache, files, installed
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.progress import format_table

# NOTE: what the CLI loads unasked (the seed ops, the demo model) sits above the library (ARCHITECTURE.md):
# pyproject.toml names it as entry points of opbridge's own distribution, read here, so no library module
# names it. `opbridge.ops`: modules every command imports (they register ops); `opbridge.models`: the default
# --model (its `demo` entry).
OPS_GROUP, MODELS_GROUP, DEFAULT_MODEL = "opbridge.ops", "opbridge.models", "demo"


def default_model() -> str:
    """The ``--model`` of ``opbridge export``/``check`` when none is given: the ``demo`` entry point."""
    found = installed.entry_points(MODELS_GROUP).get(DEFAULT_MODEL)
    if found is None:
        raise OpBridgeError(f"no default --model. Got no {DEFAULT_MODEL!r} entry point in group {MODELS_GROUP!r} of "
                            "opbridge's metadata (opbridge not installed, or installed before pyproject.toml declared "
                            "it). Pass --model MODULE:FACTORY, or reinstall opbridge (pip install -e CHECKOUT).")
    return found


def seed_modules() -> list[str]:
    """The op modules every command imports first (the ``opbridge.ops`` entry points, in name order)."""
    return [module for _, module in sorted(installed.entry_points(OPS_GROUP).items())]


def inputs_path(onnx_path: str) -> str:
    """Where ``opbridge export`` writes a model's example inputs, and ``opbridge run`` reads them."""
    return os.path.splitext(onnx_path)[0] + ".inputs.npz"


def model_factory(spec: str) -> tuple[str, str]:
    """``--model MODULE:FACTORY`` split in two; anything else is an error naming the form."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        example = installed.entry_points(MODELS_GROUP).get(DEFAULT_MODEL, "mypackage.models:build")
        raise OpBridgeError(f"--model must be MODULE:FACTORY. Got {spec!r}. Use e.g. {example}.")
    return module_name, attr


def run_inputs(args) -> str:
    """The inputs file of ``opbridge run`` (``--inputs``, else the one beside the model), once it exists."""
    path = args.inputs or inputs_path(args.model_file)
    if not os.path.isfile(path):
        # NOTE: a file that is no model is the first thing to fix: its inputs would not help (read only here,
        # on the way to an error, as a run reads the model once, later)
        files.load_model(args.model_file, external_data=False)
        raise OpBridgeError(f"no inputs for {args.model_file}. Got no file {path!r}. "
                            "Pass --inputs FILE.npz (arrays keyed by input name), or export with `opbridge export`.")
    return path


def _targets(args) -> list[tuple[str, str]]:
    """(path, what) of every file the command will write, as it is given."""
    if args.command == "export":
        return [(args.output, "model"), (inputs_path(args.output), "file")]
    if args.command == "check":
        return [(p, what) for p, what in ((args.output, "model"), (args.json, "report"), (args.plot, "plot")) if p]
    if args.command == "inline":
        return [(args.output or os.path.splitext(args.model_file)[0] + "_inline.onnx", "model")]
    if args.command == "attach":
        return [(args.output or args.model_file, "model")]
    return []


def check_arguments(args) -> None:
    """Every argument that names a file or a factory, checked before anything is loaded: the files
    read (a model, ``--inputs``, ``--native-library``) exist, the files written can be written."""
    if args.command in ("run", "inline", "attach"):
        files.check_model_file(args.model_file)  # NOTE: the model first, then its inputs
    if args.command == "run":
        run_inputs(args)
    for path in getattr(args, "native_library", None) or []:
        files.check_library_file(path)
    if args.command in ("export", "check") and getattr(args, "model", None):
        model_factory(args.model)
    for path, what in _targets(args):
        files.check_writable(path, what=what)
    if args.command == "build" and args.output and not args.triton:
        files.check_folder(args.output)
    if args.command == "build" and args.triton and args.model:
        files.check_model_file(args.model)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def cmd_cache(args) -> int:
    """``opbridge cache``: what opbridge keeps under its cache root; ``cache clean``: remove it."""
    if args.action == "clean":
        gone = cache.clean_cache(args.kind or None, waiting=lambda: print(
            "a C++ build is running in another process: cleaning once it ends", flush=True))
        print(f"removed {len(gone)} cache folders under {cache.cache_root()}"
              + (f": {', '.join(p.name for p in gone)}" if gone else ""))
        return 0
    entries = [e for e in cache.cache_entries() if not args.kind or e.kind in args.kind]
    print(f"cache root: {cache.cache_root()} ($OPBRIDGE_CACHE_DIR, else $XDG_CACHE_HOME/opbridge, "
          "else ~/.cache/opbridge)")
    if entries:
        print(format_table([("kind", "key", "size", "age")] + [
            (e.kind, e.key, f"{e.size / 2**20:.1f} MiB", _age(e.age_s)) for e in entries]))
    noun = "entry" if len(entries) == 1 else "entries"
    print(f"{len(entries)} {noun}, {sum(e.size for e in entries) / 2**20:.1f} MiB")
    return 0


def error(e: OpBridgeError, verbose: bool) -> int:
    """An OpBridgeError as the CLI shows it: one ``error:`` line on stderr (``-v``: the trace first); exit 2."""
    if verbose:  # NOTE: the trace of what went wrong (torch's own error is the cause)
        traceback.print_exception(e, file=sys.stderr)
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)  # NOTE: one line, whatever the message holds
    return 2


def run(args) -> int | None:
    """The light part of a command: its arguments checked, and ``opbridge cache`` run (without ``--ops``,
    which loads modules); the exit status, or None when the commands module takes it from here."""
    try:
        check_arguments(args)
        if args.command == "cache" and not args.ops:
            return cmd_cache(args)
    except OpBridgeError as e:
        return error(e, args.verbose)
    return None
