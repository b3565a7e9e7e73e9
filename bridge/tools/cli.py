"""``opbridge`` command line: ops | export | run | check | inline | attach | doctor | build | cache.

The parser lives here and imports nothing heavy: ``opbridge --help`` and argument errors answer
without loading torch. The commands themselves are in ``bridge.tools.commands``.

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
    opbridge check --native-library lib.so  # nodes lib.so serves run its kernels (tier native)
    opbridge check --inline --runtime openvino     # the inlined file in OpenVINO
    opbridge check --localize             # on a mismatch, name the first ONNX node that diverges
    opbridge doctor --build               # build the native library, say what it serves
    opbridge build -o dist/               # the deployable native library + manifest.json
    opbridge build --triton repo --model demo.onnx  # a Triton model repository for the file
    opbridge attach in.onnx -o out.onnx   # re-attach function bodies at the file's opset
    opbridge cache                        # what opbridge keeps in its cache; `cache clean` empties it
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import faulthandler
import importlib
import os
import subprocess
import sys

from bridge.core.basics import progress

# NOTE: the commands module loads torch (seconds); it is loaded by name once the arguments parsed,
# as the facade loads its names, so that --help and argument errors stay instant.
COMMANDS = "bridge.tools.commands"
# NOTE: what needs no torch (arguments that name files, `opbridge cache`, the error line) runs first, from here
PREFLIGHT = "bridge.tools.preflight"
# NOTE: a progress label's part naming native code (bridge.tools.sessions.native_code): library, ops it serves
# NOTE: the watcher, run as `python -I -S -c` (nothing imported): lines starting \x1e (a step starts) or \x1f
# (it ends) carry the crash line of a step that runs native code; anything else is faulthandler's report of a
# fatal error, copied to stderr after the crash line of the step that was running (or ran last)
_WATCHER = r"""
import sys
steps, last, said = [], None, False
for raw in sys.stdin.buffer:
    line = raw.decode("utf-8", "replace")
    if line[:1] in ("\x1e", "\x1f"):
        text = line[1:].rstrip("\n")
        if line[0] == "\x1e":
            steps.append(text)
        elif text in steps:
            steps.remove(text)
            last = text
        continue
    if not said and (steps or last):
        cause = line.strip().removeprefix("Fatal Python error: ") or "a fatal error"
        when = "while running" if steps else "after running"
        sys.stderr.write((steps or [last])[-1].replace("{cause}", cause).replace("{when}", when) + "\n")
    said = True
    sys.stderr.write(line)
    sys.stderr.flush()
"""


def _common(parser: argparse.ArgumentParser, suffix: str) -> None:
    """``--ops``, ``-q`` and ``-v``, accepted before and after the subcommand (kept apart by ``suffix``,
    since a subparser's defaults would overwrite the main parser's values)."""
    parser.add_argument("--ops", action="append", default=[], metavar="MODULE", dest=f"ops{suffix}",
                        help="import MODULE (a module name or a path to a .py file) to register more ops "
                             "(repeatable); custom_ops is always loaded")
    parser.add_argument("-q", "--quiet", action="store_true", dest=f"quiet{suffix}", help="no progress lines")
    parser.add_argument("-v", "--verbose", action="store_true", dest=f"verbose{suffix}",
                        help="on an error, also print the full trace")


def _sub(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    p = sub.add_parser(name, **kwargs)
    _common(p, "_after")
    return p


def _tier_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", help="kernel tier (`opbridge ops` lists them; default: function, or native with "
                                  "--native-library)")
    p.add_argument("--native-library", action="append", metavar="PATH",
                   help="a custom-op library of yours (.so) whose kernels run the nodes it serves, before "
                        "opbridge's own (tier native; repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opbridge", description=__doc__.split("\n")[0].replace("``", ""))
    _common(parser, "")
    sub = parser.add_subparsers(dest="command")

    p = _sub(sub, "ops", help="list registered ops, their pieces and kernel tiers")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--show-body", metavar="NS::NAME",
                   help="print the op's portable ONNX body (written, or derived from its first sample)")
    p.add_argument("--bodies", action="store_true",
                   help="derive the bodies of ops without a written one, to show they work (a trace each)")

    p = _sub(sub, "export", help="export a model to ONNX (+ its example inputs as .inputs.npz)")
    p.add_argument("--model", help="MODULE:FACTORY returning a ModelCase (default: the demo)")
    p.add_argument("-o", "--output", default="model.onnx")
    p.add_argument("--no-functions", action="store_true", help="do not attach model-local function bodies")
    p.add_argument("--inline", action="store_true",
                   help="replace each custom node by its ONNX body (standard ONNX only)")
    p.add_argument("--opset", type=int, help="ONNX opset, 17 and up (default: opbridge's, see bridge.export)")

    p = _sub(sub, "inline", help="replace each custom node of an .onnx file by its ONNX function body")
    p.add_argument("model_file")
    p.add_argument("-o", "--output", help="where to write (default: MODEL_inline.onnx); written atomically")

    p = _sub(sub, "run", help="run an .onnx file in ONNX Runtime on saved inputs")
    p.add_argument("model_file")
    p.add_argument("--inputs", help=".npz with one array per model input (default: MODEL.inputs.npz)")
    _tier_arguments(p)

    p = _sub(sub, "doctor", help="report the native kernel library: built?, loads?, ops and domains served")
    p.add_argument("--build", action="store_true", help="build the library if it is not built yet")

    p = _sub(sub, "build", help="write the deployable native library (registered ops) and a manifest")
    p.add_argument("-o", "--output", metavar="DIR", help="folder to write into (created)")
    p.add_argument("--triton", metavar="REPO", help="write a Triton model repository REPO/NAME for --model instead")
    p.add_argument("--model", metavar="FILE", help="with --triton: the .onnx file to serve")
    p.add_argument("--name", help="with --triton: the model's name (default: the file's stem)")
    p.add_argument("--max-batch-size", type=int, default=0, metavar="N",
                   help="with --triton: Triton's max_batch_size (>0: first dim is the batch dim; default 0)")
    p.add_argument("--library-path", metavar="PATH",
                   help="with --triton: the library's path as the server sees it (default: the absolute "
                        "path of the copy in REPO/NAME)")

    p = _sub(sub, "attach", help="attach the function bodies a file lacks (written or derived), at its opset")
    p.add_argument("model_file")
    p.add_argument("--replace", action="store_true",
                   help="also replace the file's bodies of registered ops with the registry's (restores broken ones)")
    p.add_argument("-o", "--output", help="file to write (default: replace MODEL_FILE, atomically)")

    p = _sub(sub, "check", help="export, run in ORT and compare against eager (parity table)")
    p.add_argument("--model", help="MODULE:FACTORY returning a ModelCase (default: the demo)")
    p.add_argument("--op", help="check one registered op over its dtypes and sample inputs instead")
    _tier_arguments(p)
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

    p = _sub(sub, "cache",
             help="show what opbridge keeps in its cache (kind, key, size, age); `cache clean` removes it")
    p.add_argument("action", nargs="?", choices=("show", "clean"), default="show")
    p.add_argument("--kind", action="append", help="only this kind (native, torch_ext, ...; repeatable)")
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed arguments, ``--ops``/``-q``/``-v`` merged from both sides of the subcommand.

    >>> args = parse(["--ops", "a", "check", "--ops", "b.py", "-q", "--tier", "native"])
    >>> args.command, args.ops, args.quiet, args.tier
    ('check', ['a', 'b.py'], True, 'native')
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # NOTE: parse_args would report a missing command before an unknown option: `opbridge --bogus` said
    # "the following arguments are required: command", hiding the typo
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error("a command is required: one of those in braces above (opbridge -h says what each does)")
    args.ops = args.ops + args.ops_after
    args.quiet = args.quiet or args.quiet_after
    args.verbose = args.verbose or args.verbose_after
    del args.ops_after, args.quiet_after, args.verbose_after
    return args


class CrashLine:
    """Under ``-q``, the one line a crash in native code leaves on stderr, naming the library (its path)
    and the ops it serves, though no progress line named them: told each step and its native code
    (``progress.witness``),
    it starts a watcher process at the first step that runs native code and points faulthandler at it;
    the watcher prints the line only when faulthandler reports a fatal error, so a run that ends well
    prints nothing.

    NOTE: a crashed process runs no more Python code (a segfault in a kernel), and faulthandler writes
    only stacks: the line is printed by another process, which outlives it.

    Example:
        >>> CrashLine().line("eager + onnxruntime run 1; native code: libu.so serves a::f, a::g",
        ...                  {"/x/libu.so": ["a::f", "a::g"]})
        'opbridge: native code ended this process ({cause}) {when} "eager + onnxruntime run 1; native code: libu.so \
serves a::f, a::g". Got /x/libu.so serving a::f, a::g. Fix the kernels of that library for these ops, or run \
them without it (drop --native-library, or --tier function).'
    """

    def __init__(self) -> None:
        self._watcher: subprocess.Popen | None = None

    @staticmethod
    def line(label: str, native: progress.Native) -> str:
        """The crash line of a step ``label`` running ``native`` ("" for none); the watcher fills in
        ``{cause}`` (faulthandler's) and ``{when}``."""
        if not native:
            return ""
        got = "; ".join(f"{lib} serving {', '.join(ops)}" for lib, ops in native.items())
        return (f'opbridge: native code ended this process ({{cause}}) {{when}} "{label}". Got {got}. Fix the kernels '
                "of that library for these ops, or run them without it (drop --native-library, or --tier function).")

    def __call__(self, label: str, native: progress.Native, starts: bool) -> None:
        line = self.line(label, native)
        if not line or (self._watcher is None and not (starts and self._start())):
            return
        assert self._watcher is not None and self._watcher.stdin is not None
        with contextlib.suppress(OSError, ValueError):  # NOTE: a watcher gone (its pipe closed): none to tell
            self._watcher.stdin.write(("\x1e" if starts else "\x1f").encode() + line.encode() + b"\n")
            self._watcher.stdin.flush()

    def _start(self) -> bool:
        try:
            self._watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER], stdin=subprocess.PIPE,
                                             stdout=subprocess.DEVNULL)
        except (OSError, ValueError):  # NOTE: no process to start: faulthandler's stack alone, on stderr
            return False
        with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):
            faulthandler.enable(file=self._watcher.stdin)  # type: ignore[arg-type]
        return True

    def close(self) -> None:
        """Point faulthandler back at stderr and let the watcher end (it prints nothing)."""
        if self._watcher is None:
            return
        with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):
            faulthandler.enable()
        with contextlib.suppress(OSError, ValueError):
            self._watcher.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._watcher.wait(timeout=5)
        self._watcher = None


def main(argv: list[str] | None = None) -> int:
    """Run ``opbridge ARGV``; return the exit status (0 ok, 1 parity failure, 2 error)."""
    args = parse(argv)
    # NOTE: native code that crashes (a user's kernel library) ends the process: the stack goes to stderr
    # after the progress line that named the library and its ops (under -q, after the CrashLine)
    if not faulthandler.is_enabled():
        with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):  # NOTE: a stderr without a fd
            faulthandler.enable()
    crash_line = CrashLine()
    progress.witness(crash_line if args.quiet else None)
    try:
        code = importlib.import_module(PREFLIGHT).run(args)
        return code if code is not None else importlib.import_module(COMMANDS).run(args)
    finally:
        progress.witness(None)
        crash_line.close()


def console() -> None:
    """The ``opbridge`` executable: ``main()``, then exit at once.

    NOTE: tearing down torch and onnxruntime at interpreter exit takes 1-3 s after the last line;
    the output is flushed and the exit handlers run, so nothing is lost by skipping it.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    console()
