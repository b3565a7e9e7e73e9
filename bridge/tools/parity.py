"""Parity: run eager torch and ONNX Runtime on the same inputs and compare every output."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import math
import numbers
import os
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch

from bridge.core.basics.dtypes import ONNX_TO_TORCH, TORCH_TO_ONNX, numpy_dtype, to_numpy
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.files import write_bytes
from bridge.core.basics.graphs import random_nodes
from bridge.core.basics.installed import pip_line
from bridge.core.basics.progress import format_table, step
from bridge.core.basics.torch_compat import pytree
from bridge.tools.localize import Localization, json_safe, wanted
from bridge.tools.localize import localize as localize_run
from bridge.tools.openvino_runtime import session as openvino_session
from bridge.tools.sessions import native_code, native_libraries, ort_feed, run_feed, session
from exporters.export import export_with_program
from exporters.names import call_args
from ort_kernels.base import Paths

# NOTE: (rtol, atol) per dtype; a finite pair passes when |ort - eager| <= atol + rtol * |eager|
# (NaN/inf only match themselves, see compare; integers and bool are exact, as integers). float16's
# rtol admits one ulp (2**-10); float32/float64 admit summation-order differences.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 1e-2),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def tolerance(dtype: torch.dtype, rtol=None, atol=None) -> tuple[float, float]:
    """(rtol, atol) for ``dtype``: overrides win (a float, or a {dtype: float} map); exact for ints."""

    def pick(override, base):
        if override is None:
            return base
        return override.get(dtype, base) if isinstance(override, Mapping) else float(override)

    base_r, base_a = TOLERANCES.get(dtype, (0.0, 0.0))
    return pick(rtol, base_r), pick(atol, base_a)


@dataclasses.dataclass
class OutputParity:
    """Comparison of one output."""

    name: str
    shape: tuple
    dtype: str
    max_abs: float | int  # an int for integer and bool outputs: their errors are exact
    max_rel: float
    mismatches: int
    numel: int
    rtol: float
    atol: float
    passed: bool
    note: str = ""
    worst: list = dataclasses.field(default_factory=list)  # top-k elements by abs error
    errors: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)  # |ort - eager|
    nonfinite: int = 0  # mismatches where eager or ORT is NaN/inf (counted in mismatches too)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "errors"}


TOP_K = 5


def _worst(diff: np.ndarray, expected: np.ndarray, actual: np.ndarray, k: int = TOP_K) -> list[dict]:
    """The k largest errors: index tuple, eager value, ORT value, abs error (largest first); Python
    ints where ``diff`` is an unsigned integer array (an integer output's exact errors)."""
    flat, eager, ort = diff.reshape(-1), expected.reshape(-1), actual.reshape(-1)
    exact = flat.dtype.kind == "u"
    # NOTE: ~ orders uint64 descending without rounding; ties (NaN/inf mismatches: inf) in index order
    top = np.argsort(~flat if exact else -flat, kind="stable")[:k]
    value = int if exact else float
    return [{"index": [int(j) for j in np.unravel_index(int(i), diff.shape)], "eager": value(eager[i]),
             "ort": value(ort[i]), "abs_err": value(flat[i])} for i in top if flat[i] > 0]


def compare(name: str, expected: torch.Tensor, actual: np.ndarray, *, rtol=None, atol=None) -> OutputParity:
    """Compare one ORT output against the eager tensor, as numpy's ``assert_allclose(equal_nan=True)``:
    NaN matches only NaN, +inf only +inf, -inf only -inf; finite pairs pass when
    ``|ort - eager| <= atol + rtol * |eager|``; integer and bool outputs compare exactly, as integers
    (never through float64, where 2**60 + 2 == 2**60), their ``max_abs`` an exact int.
    ``max_abs``/``max_rel`` are over finite pairs; NaN/inf mismatches count in ``mismatches``
    (and ``nonfinite``), their error is inf, and the note says how many there are.

    >>> r = compare("y", torch.tensor([1.0, 2.0]), np.array([1.0, 2.5], np.float32))
    >>> (r.passed, r.mismatches, r.max_abs)
    (False, 1, 0.5)
    >>> r = compare("y", torch.tensor([float("nan"), 2.0]), np.array([2.0, 2.0], np.float32))
    >>> (r.passed, r.mismatches, r.nonfinite, r.max_abs, r.worst[0]["index"])
    (False, 1, 1, 0.0, [0])
    """
    exact = not (expected.dtype.is_floating_point or expected.dtype.is_complex)
    # NOTE: integers compare exactly whatever the overrides; a relative error of an int means nothing
    r, a = (0.0, 0.0) if exact else tolerance(expected.dtype, rtol, atol)
    shape, dtype = tuple(expected.shape), str(expected.dtype).replace("torch.", "")
    actual = np.asarray(actual)
    note = ""
    if tuple(actual.shape) != shape:
        note = f"shape {tuple(actual.shape)} != eager {shape}"
    elif ((expected.dtype in TORCH_TO_ONNX and actual.dtype != numpy_dtype(expected.dtype))
          or (exact and actual.dtype.kind not in "biu")):
        note = f"dtype {actual.dtype} != eager {dtype}"
    if note:
        return OutputParity(name, shape, dtype, math.inf, math.inf, expected.numel(), expected.numel(),
                            r, a, False, note)
    if exact:
        return _compare_integers(name, to_numpy(expected), actual, dtype)
    e64 = to_numpy(expected).astype(np.float64)
    a64 = actual.astype(np.float64)
    diff, bad, finite = _elementwise(e64, a64, r, a)
    # NOTE: a difference over an expected 0 is inf relative error (overflow), not a warning
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.maximum(np.abs(e64), np.finfo(np.float64).tiny))
    max_abs, max_rel = (float(diff[finite].max()), float(rel[finite].max())) if finite.any() else (0.0, 0.0)
    n_bad, nonfinite = int(bad.sum()), int((bad & ~finite).sum())
    if nonfinite:
        note = f"{nonfinite} NaN/inf mismatch{'es' if nonfinite > 1 else ''}; max abs/rel over finite pairs"
    return OutputParity(name, shape, dtype, max_abs, max_rel, n_bad, int(diff.size), r, a, n_bad == 0,
                        note, worst=_worst(diff, e64, a64), errors=diff, nonfinite=nonfinite)


def declared_mismatch(declared: onnx.ValueInfoProto | None, expected: torch.Tensor) -> str | None:
    """How the type the file declares for an output (element type, rank, the dims it holds static)
    differs from eager's tensor; None where it agrees or declares nothing to compare.

    NOTE: onnxruntime returns what its kernels computed, whatever the file declares (it only logs a
    warning), so a file whose fake kernel lied passes a value-only comparison; tools that read the
    file's declared shapes (allocators, TensorRT, Triton's config) then get them wrong.

    >>> vi = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])
    >>> declared_mismatch(vi, torch.zeros(3))
    'the file declares float32[3,4], eager gives float32[3]'
    >>> declared_mismatch(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4]), torch.zeros(7, 4))
    """
    if declared is None or not declared.type.HasField("tensor_type"):
        return None
    t = declared.type.tensor_type
    dtype = ONNX_TO_TORCH.get(t.elem_type) if t.elem_type else expected.dtype
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    shape_ok = not t.HasField("shape") or (
        len(dims) == expected.dim() and all(not isinstance(d, int) or d == n for d, n in zip(dims, expected.shape)))
    if (dtype is None or dtype == expected.dtype) and shape_ok:
        return None

    def shown(dt, ds) -> str:
        name = str(dt).replace("torch.", "") if isinstance(dt, torch.dtype) else f"elem_type {t.elem_type}"
        return f"{name}[{','.join(map(str, ds))}]" if ds is not None else name

    return (f"the file declares {shown(dtype, dims if t.HasField('shape') else None)}, "
            f"eager gives {shown(expected.dtype, list(expected.shape))}")


def _compare_integers(name: str, expected: np.ndarray, actual: np.ndarray, dtype: str) -> OutputParity:
    """Integer or bool output against eager, exactly and in integer arithmetic: the error of each
    element is ``|ort - eager|`` as a uint64 (every difference of two int64 fits), no tolerance.

    >>> r = _compare_integers("i", np.array([2**60 + 2, -2**63]), np.array([2**60, 2**63 - 1]), "int64")
    >>> r.mismatches, r.max_abs == 2**64 - 1, r.worst[1]["abs_err"]
    (2, True, 2)
    """
    wide = np.uint64 if expected.dtype.kind == actual.dtype.kind == "u" else np.int64  # uint64 as itself
    e, a = expected.astype(wide), actual.astype(wide)
    # NOTE: uint64 arithmetic wraps modulo 2**64, so the larger minus the smaller is the exact distance
    eu, au = e.astype(np.uint64), a.astype(np.uint64)
    diff = np.where(a >= e, au - eu, eu - au)
    n_bad = int(np.count_nonzero(diff))
    max_abs = int(diff.max()) if diff.size else 0
    return OutputParity(name, tuple(expected.shape), dtype, max_abs, math.nan, n_bad, int(diff.size), 0.0, 0.0,
                        n_bad == 0, worst=_worst(diff, e, a), errors=diff)


def _elementwise(e64: np.ndarray, a64: np.ndarray, rtol: float, atol: float):
    """(|ort - eager| with 0 at matching and inf at mismatching NaN/inf, mismatch mask, finite-pair mask).

    >>> d, bad, fin = _elementwise(np.array([np.nan, np.inf, 1.0, np.inf]), np.array([np.nan, -np.inf, 1.5, 1.0]), 0, 1)
    >>> d.tolist(), bad.tolist(), fin.tolist()
    ([0.0, inf, 0.5, inf], [False, True, False, True], [False, False, True, False])
    """
    finite = np.isfinite(e64) & np.isfinite(a64)
    with np.errstate(invalid="ignore", over="ignore"):
        # NOTE: NaN only matches NaN, an inf only the same inf (numpy's isclose(equal_nan=True))
        special_ok = (e64 == a64) | (np.isnan(e64) & np.isnan(a64))
        diff = np.where(finite, np.abs(a64 - e64), np.where(special_ok, 0.0, np.inf))
        bad = np.where(finite, ~(diff <= atol + rtol * np.abs(e64)), ~special_ok)
    return diff, bad, finite


RUNTIMES = ("onnxruntime", "openvino")


_NO_MATPLOTLIB = "plotting needs matplotlib. Got no matplotlib. Install it with `{}`."


def plot_missing() -> str | None:
    """What ``ParityReport.plot`` lacks here (matplotlib), as an error message; None when nothing."""
    return _NO_MATPLOTLIB.format(pip_line("plot")) if importlib.util.find_spec("matplotlib") is None else None


@dataclasses.dataclass
class ParityReport:
    """Per-output parity of ORT against eager; print it for a table, ``to_json()`` for machines."""

    model: str
    tier: str
    outputs: list[OutputParity]
    onnx_path: str | None = None
    runtime: str = "onnxruntime"
    localization: Localization | None = None  # node by node, when check_parity(localize=...) ran it
    kernels: dict[str, str] = dataclasses.field(default_factory=dict)  # op -> library path or "function body"
    # op -> why none of the user's libraries (native_library=) serves it, and what runs it instead
    unserved: dict[str, str] = dataclasses.field(default_factory=dict)
    # torch.autograd.Function classes whose symbolic's standard ops the file holds in place of their forward
    symbolics: tuple[str, ...] = ()
    # input -> its shape at each run, for the inputs whose shapes differ between runs (extra_args=)
    sizes: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    @property
    def first_divergence(self):
        """The first ONNX node whose outputs leave tolerance while its inputs are within it (a
        ``bridge.tools.localize.NodeParity``), when localization ran and found one; else None."""
        return None if self.localization is None else self.localization.first_divergence

    def to_dict(self) -> dict:
        return {"model": self.model, "tier": self.tier, "runtime": self.runtime, "passed": self.passed,
                "onnx_path": self.onnx_path, "outputs": [o.to_dict() for o in self.outputs],
                "localization": None if self.localization is None else self.localization.to_dict(),
                "kernels": dict(self.kernels), "unserved": dict(self.unserved), "symbolics": list(self.symbolics),
                "sizes": dict(self.sizes)}

    def to_json(self, **kwargs) -> str:
        d = self.to_dict()  # NOTE: the localization's outputs are JSON-safe already
        d["outputs"] = [json_safe(o) for o in d["outputs"]]
        return json.dumps(d, allow_nan=False, **kwargs)

    def plot(self, path: str | os.PathLike) -> str:
        """Write a PNG histogram of log10 |ort - eager| per output (needs matplotlib); return the path."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise OpBridgeError(_NO_MATPLOTLIB.format(pip_line("plot"))) from None
        fig, axes = plt.subplots(2 if self.localization else 1, 1, squeeze=False,
                                 figsize=(7, 8 if self.localization else 4))
        ax = axes[0][0]
        for o in self.outputs:
            if o.errors is None or o.errors.size == 0:
                continue
            err = o.errors.reshape(-1)
            finite = err[np.isfinite(err)]
            exact = int((finite == 0).sum())
            ax.hist(np.log10(finite[finite > 0]), bins=40, alpha=0.6,
                    label=f"{o.name} ({exact}/{err.size} exact, tol atol={o.atol:g})")
        ax.set_xlabel("log10 |ORT - eager| (exact matches not shown)")
        ax.set_ylabel("elements")
        for atol in sorted({o.atol for o in self.outputs if o.atol > 0}):
            ax.axvline(np.log10(atol), color="red", linestyle="--", linewidth=1)
        ax.set_title(f"{self.model}\nORT tier {self.tier} vs eager; dashed: atol", fontsize=8)
        ax.legend(fontsize=7)
        if self.localization is not None:
            self.localization.plot(axes[1][0])
        fig.tight_layout()
        image = io.BytesIO()  # NOTE: rendered in memory, written whole through bridge.core.basics.files
        fig.savefig(image, format=os.path.splitext(os.fspath(path))[1][1:].lower() or "png", dpi=100)
        plt.close(fig)
        return write_bytes(path, image.getvalue())

    def __str__(self) -> str:
        runner = {"onnxruntime": "ORT", "openvino": "OpenVINO"}.get(self.runtime, self.runtime)
        lines = [f"parity: {self.model} | {runner} tier {self.tier} vs eager torch | "
                 f"{'PASS' if self.passed else 'FAIL'}", self._table()]
        lines += [f"kernel of {op}: {where}" for op, where in self.kernels.items()]
        lines += [f"{op} {why}" for op, why in self.unserved.items()]
        lines += [f"standard ops written by {name}.symbolic stand for its forward here"
                  + ("" if self.passed else ": where they compute a failing output, the symbolic disagrees with its "
                     "own forward (no opbridge kernel runs them); compare the two for these inputs")
                  for name in self.symbolics]
        lines += self._notes()
        if self.localization is not None:
            lines.append(str(self.localization))
        return "\n".join(lines)

    def _table(self) -> str:
        """One row per output: shape, dtype, errors, mismatches, tolerances and the result."""
        head = ("output", "shape", "dtype", "max abs", "max rel", "mismatch", "rtol/atol", "result")
        rows = [head]
        for o in self.outputs:
            rows.append((o.name, "x".join(map(str, o.shape)) or "scalar", o.dtype, _number(o.max_abs, ".3g"),
                         "-" if math.isnan(o.max_rel) else f"{o.max_rel:.3g}", f"{o.mismatches}/{o.numel}",
                         f"{o.rtol:g}/{o.atol:g}",
                         ("PASS" if o.passed else "FAIL") + (f" ({o.note})" if o.note else "")))
        return format_table(rows)

    def _notes(self) -> list[str]:
        """What the table alone would leave a reader to guess: which bound a PASS held by, an output type the file
        declares wrongly, the worst elements of each failing output."""
        lines = [f"runs differ in input shapes: {'; '.join(f'{n} ' + ' | '.join(s) for n, s in self.sizes.items())}"
                 ] if self.sizes else []
        # NOTE: a max rel past rtol beside PASS reads as a contradiction: say which bound held
        by_atol = [o.name for o in self.outputs if o.passed and not math.isnan(o.max_rel) and o.max_rel > o.rtol]
        if by_atol:
            lines.append(f"max rel past rtol, yet PASS: {', '.join(by_atol)}: only elements with a small |eager| are "
                         "past rtol, and they pass by atol (each element: |ort - eager| <= atol + rtol * |eager|)")
        lying = [o.name for o in self.outputs if "the file declares" in o.note]
        if lying:
            lines.append(f"declared type differs from eager: {', '.join(lying)}: a custom op's output types and shapes "
                         "in the file come from its fake kernel; make each fake return what its op returns (dtype, "
                         "rank, sizes)")
        for o in self.outputs:
            if not o.passed and o.worst:
                lines.append(f"worst elements of {o.name}:")
                lines += [f"  at {tuple(w['index'])}: eager {_number(w['eager'], '.6g')}  "
                          f"ort {_number(w['ort'], '.6g')}  abs err {_number(w['abs_err'], '.3g')}" for w in o.worst]
        return lines

    def assert_ok(self) -> None:
        """Raise AssertionError with the table (first line: the divergent node, if localized) when any output fails."""
        if not self.passed:
            where = f": {self.localization.summary()}" if self.localization is not None else ""
            raise AssertionError(f"opbridge parity failed{where}\n" + str(self))


def _number(value: float | int, spec: str) -> str:
    """A float in ``spec``; an int (an integer output's value or error) in full: it is exact."""
    return str(value) if isinstance(value, int) else format(value, spec)


def _tensor_leaves(tree) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _copies(tree):
    """``tree`` with every tensor cloned: eager runs on these, so a model that mutates its inputs leaves
    the caller's tensors, and what every tier is fed, as they were given."""
    return pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, tree)


def _eager_refusal(model, args: tuple, kwargs: dict | None) -> OpBridgeError | None:
    """Where an export failed: eager's own error on the same call, as the cause to name (a call eager refuses, say
    float64 inputs to float32 weights, fails in the exporter with a message about the graph); None where eager runs
    it (or ``model`` is no module: the export's error says so)."""
    if not isinstance(model, torch.nn.Module):
        return None
    try:
        with torch.no_grad():
            model(*_copies(args), **_copies(kwargs or {}))
    except Exception as e:  # noqa: BLE001  eager's own refusal, named
        return OpBridgeError(f"eager torch refuses the call, so there is nothing to compare. Got {type(e).__name__}: "
                             f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}. Pass inputs the "
                             "model runs on in eager torch.")
    return None


def refuse_random(proto) -> None:
    """Raise OpBridgeError when the file draws random numbers: no run of it can be compared with eager."""
    drawn = random_nodes(proto)
    if drawn:
        names = ", ".join(f"{n.name or n.output[0]} ({n.op_type})" for n in drawn[:5])
        raise OpBridgeError(f"the exported file draws random numbers on every run, so no parity check can hold. "
                            f"Got {names}. Call model.eval() before checking (a Dropout in training mode drops "
                            "values at random), or take the random op out of forward().")


def run_ort(sess, args: Sequence, kwargs: dict | None = None) -> list[np.ndarray]:
    """Run ``sess`` on torch inputs, each fed as its own dtype (``ort_feed``, bfloat16 included;
    ``run_feed``), raising OpBridgeError (not a bare ORT error) on failure."""
    feed = ort_feed(sess, args, kwargs)
    try:
        return run_feed(sess, None, feed)
    except OpBridgeError:
        raise  # another runtime's session (bridge.tools.openvino_runtime) words its own errors
    except Exception as e:
        raise OpBridgeError(f"onnxruntime failed to run the model. Got {type(e).__name__}: "
                            f"{str(e)[:600]}. Check the inputs against the kernel's contract.") from e


def check_parity(model: torch.nn.Module, args: Sequence, *, kwargs: dict | None = None, dynamic_shapes=None,
                 tier: str = "function", rtol=None, atol=None, path: str | os.PathLike | None = None,
                 extra_args: Sequence[Sequence] = (), registry=None, name: str | None = None, inline: bool = False,
                 runtime: str = "onnxruntime", localize: bool | str = False,
                 native_library: Paths | None = None) -> ParityReport:
    """Export ``model``, run eager and ORT on ``args`` (and each of ``extra_args``), compare outputs.

    Tolerances default per dtype (see ``TOLERANCES``); ``rtol``/``atol`` override with a float
    or a ``{dtype: float}`` map. ``extra_args`` reuse the same ONNX file (dynamic shapes).
    ``inline=True`` checks the inlined file (custom nodes replaced by their bodies; tier
    "inlined"); ``runtime="openvino"`` runs it in OpenVINO (``bridge.tools.openvino_runtime``).
    ``localize=True``: when a run fails, compare every intermediate value too and report the first
    node that diverges (``report.first_divergence``; ``bridge.tools.localize``); a passing check costs
    nothing extra. ``localize="always"`` compares the intermediates of the first run even when it passes.
    ``native_library`` (tier "native"): custom-op libraries of your own that serve the nodes they
    know, as ``bridge.session``'s; ``report.kernels`` says which library ran each custom op.

    Example:
        >>> import torch, bridge, custom_ops
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.identity_conv(x, 2) * 2
        >>> report = bridge.check_parity(M(), (torch.randn(1, 2, 4, 4),))
        >>> report.passed, report.outputs[0].max_abs
        (True, 0.0)
    """
    _check_options(runtime, tier, inline, rtol, atol)
    args, extra_args = call_args(args), [call_args(a) for a in extra_args]
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.fspath(path) if path is not None else os.path.join(tmp, "model.onnx")
        try:
            exported = export_with_program(model, args, onnx_path, kwargs=kwargs, dynamic_shapes=dynamic_shapes,
                                           registry=registry, inline=inline)
        except Exception as e:
            refused = _eager_refusal(model, args, kwargs)
            if refused is None:
                raise
            raise refused from e
        refuse_random(exported.proto)
        sess = (openvino_session(onnx_path) if runtime == "openvino"
                else session(onnx_path, tier=tier, registry=registry, native_library=native_library))
        rows: list[OutputParity] = []
        localization = None
        declared = {o.name: o for o in exported.proto.graph.output}
        for run, run_args in enumerate([args, *extra_args]):
            native = native_libraries(getattr(sess, "kernels", {}))
            with step(f"eager + {runtime} run {run + 1}{native_code(native)}", native=native), torch.no_grad():
                # NOTE: eager on copies: every tier is fed the inputs as they were before eager ran
                expected = _tensor_leaves(model(*_copies(run_args), **_copies(kwargs or {})))
                actual = run_ort(sess, run_args, kwargs)
            suffix = f" [run {run + 1}]" if extra_args else ""
            rows += _output_rows([o.name for o in sess.get_outputs()], expected, actual, declared, suffix,
                                 rtol=rtol, atol=atol)
            # NOTE: intermediates are compared in onnxruntime; an OpenVINO check reports outputs only
            if (runtime == "onnxruntime" and localization is None
                    and wanted(localize, passed=all(r.passed for r in rows))):
                localization = localize_run(exported.program, exported.proto, run_args, kwargs, compare=compare,
                                            tier=tier, registry=registry, rtol=rtol, atol=atol, run=run + 1,
                                            native_library=native_library)
    return ParityReport(name or type(model).__name__, "inlined" if inline else tier, rows,
                        onnx_path if path is not None else None, runtime, localization=localization,
                        kernels=dict(getattr(sess, "kernels", {})),
                        unserved=dict(getattr(sess, "unserved", {})), symbolics=exported.symbolics,
                        sizes=_sizes([i.name for i in sess.get_inputs()], [args, *extra_args]))


def _sizes(names: list[str], runs: Sequence[Sequence]) -> dict[str, list[str]]:
    """Each input (of ``names``, the tensor leaves of each run's args in order) whose shape differs between
    ``runs`` -> its shape at each run.

    >>> _sizes(["x", "n"], [(torch.ones(2, 3), torch.ones(5)), (torch.ones(2, 3), torch.ones(7))])
    {'n': ['5', '7']}
    """
    shapes = [["x".join(map(str, t.shape)) or "scalar" for t in _tensor_leaves(tuple(run))] for run in runs]
    return {n: [s[i] for s in shapes] for i, n in enumerate(names)
            if all(len(s) == len(names) for s in shapes) and len({s[i] for s in shapes}) > 1}


def _check_options(runtime: str, tier: str, inline: bool, rtol=None, atol=None) -> None:
    """Refuse a runtime check_parity does not know, a tier asked of an inlined file, and a tolerance that is no
    finite number >= 0 (a negative one fails every output; an infinite one passes any)."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        values = value.values() if isinstance(value, Mapping) else [] if value is None else [value]
        bad = [v for v in values
               if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= float(v) < math.inf]
        if bad:
            raise OpBridgeError(f"{name} must be a finite number >= 0 (or a {{dtype: number}} map of them). Got "
                                f"{name}={value!r}. Pass {name}=0 for exact, or leave it out for the per-dtype "
                                "default.")
    if runtime not in RUNTIMES:
        raise OpBridgeError(f"unknown runtime. Got {runtime!r}. Use one of {RUNTIMES}.")
    if inline and tier != "function":
        raise OpBridgeError(f"an inlined file has no custom nodes for tier {tier!r} to run. Got inline=True, "
                            f"tier={tier!r}. Drop tier= to check the inlined file, or inline= to check the tier.")


def _output_rows(names: list[str], expected: list, actual: list, declared: dict, suffix: str, *, rtol,
                 atol) -> list[OutputParity]:
    """One row per output of one run (named ``<output><suffix>``); an output the file declares otherwise than eager
    returns it fails."""
    if len(actual) != len(expected):
        raise OpBridgeError(f"ORT returned {len(actual)} outputs, eager {len(expected)}. "
                            f"Got outputs {names}. Return tensors only from forward().")
    rows = []
    for out_name, e, a in zip(names, expected, actual):
        row = compare(out_name + suffix, e, a, rtol=rtol, atol=atol)
        # NOTE: what the file declares is part of the answer: a fake kernel's lie fails here
        lie = declared_mismatch(declared.get(out_name), e)
        if lie:
            row = dataclasses.replace(row, passed=False, note="; ".join(filter(None, (lie, row.note))))
        rows.append(row)
    return rows


def assert_parity(model: torch.nn.Module, args: Sequence, **kwargs) -> ParityReport:
    """pytest helper: ``check_parity`` then fail with the table if any output differs.

    >>> import torch, bridge, custom_ops
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.ops.opbridge.identity_conv(x, 1)
    >>> bridge.assert_parity(M(), (torch.randn(1, 1, 2, 2),)).passed
    True
    """
    kwargs.setdefault("localize", True)  # only a failing check pays for it
    report = check_parity(model, args, **kwargs)
    report.assert_ok()
    return report
