"""The op test table: one entry per registered seed op; the parity, property, bad-input and opcheck
tests are generated from it (in the manner of PyTorch's OpInfo and onnxscript's ops_test_data).

An entry holds:
- ``dtypes``: the dtypes tested (checked against the op's declared dtypes);
- ``tolerances``: (rtol, atol) per dtype, the project defaults (``bridge.parity.tolerance``)
  unless given, and ``overrides``: ``tol(...)`` for one tier and/or one kind of test where that
  tier legitimately differs (each says why);
- ``inputs``: a hypothesis strategy drawing one whole valid call (shapes and values drawn by
  hypothesis, so failures shrink), and ``examples``: inputs every property run includes;
- ``bad_inputs``: mutations of a valid sample with the error every tier must give (each must fail
  the op's own check list with those fragments, tests/test_checks.py; a check of the list that no
  written bad input reaches first gets a generated one, ``spec_<index>_<kind>_<input>``);
- ``xfails``: ``xfail(reason, ...)`` for what is known to fail (a reason is required).

Importing this module checks the table against ``bridge.REGISTRY``: an entry for an op that is
not registered, or a registered op without an entry, is an error. Tier names come from one
import below.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import bridge
import custom_ops  # noqa: F401  (registers the seed ops)

TIERS = bridge.TIERS  # the one place the tests take the tier names from

F16, F32, F64 = torch.float16, torch.float32, torch.float64

# the kinds of generated tests an xfail or a tolerance override can be scoped to
TESTS = ("parity", "property", "bad_input", "bad_input_message", "opcheck", "eager")


class TableError(Exception):
    """The table is malformed or disagrees with the registry (raised at import)."""


# -- table records --------------------------------------------------------------------------------

def _tuple(value) -> tuple | None:
    if value is None:
        return None
    return tuple(value) if isinstance(value, (tuple, list, set, frozenset)) else (value,)


def _check_scope(what: str, tier, tests) -> None:
    if tier is not None and tier not in TIERS:
        raise TableError(f"{what}: unknown tier {tier!r}; tiers are {TIERS}")
    for t in tests or ():
        if t not in TESTS:
            raise TableError(f"{what}: unknown test kind {t!r}; kinds are {TESTS}")


@dataclasses.dataclass(frozen=True)
class XFail:
    reason: str
    dtypes: tuple | None
    tier: str | None
    tests: tuple | None
    cases: tuple | None  # sample names (parity, opcheck, eager) or bad-input names
    raises: type | tuple | None
    strict: bool

    def matches(self, test: str, tier: str | None, dtype, case: str | None) -> bool:
        return ((self.tests is None or test in self.tests) and (self.tier is None or self.tier == tier)
                and (self.dtypes is None or dtype in self.dtypes) and (self.cases is None or case in self.cases))

    def mark(self):
        return pytest.mark.xfail(reason=self.reason, raises=self.raises, strict=self.strict)


def xfail(reason: str, *, dtypes=None, tier: str | None = None, tests=None, cases=None, raises=None,
          strict: bool = True) -> XFail:
    """An expected failure of the generated tests matching every given scope; ``reason`` is required."""
    if not isinstance(reason, str) or not reason.strip():
        raise TableError(f"xfail needs a non-empty reason. Got {reason!r}")
    tests = _tuple(tests)
    _check_scope(f"xfail({reason!r})", tier, tests)
    return XFail(reason, _tuple(dtypes), tier, tests, _tuple(cases), raises, strict)


@dataclasses.dataclass(frozen=True)
class Tol:
    dtypes: tuple
    rtol: float
    atol: float
    tier: str | None
    tests: tuple | None
    why: str

    def matches(self, dtype, tier, test) -> bool:
        return dtype in self.dtypes and self.tier in (None, tier) and (self.tests is None or test in self.tests)


def tol(dtypes, rtol: float, atol: float, *, why: str, tier: str | None = None, tests=None) -> Tol:
    """A tolerance override for ``dtypes``, scoped to one tier and/or kinds of test; says why."""
    if not why.strip():
        raise TableError("a tolerance override needs a reason (why=)")
    tests = _tuple(tests)
    _check_scope(f"tol(why={why!r})", tier, tests)
    return Tol(_tuple(dtypes), float(rtol), float(atol), tier, tests, why)


@dataclasses.dataclass(frozen=True)
class BadInput:
    """A mutation of a valid float32 sample and the error every tier must give for it.

    Every tier must reject it with an OpBridgeError whose message names the op and ``input`` and
    holds each ``error`` fragment; ``detail``: {tier: a further fragment that tier's message
    holds} (its own wording, checked with the rejection); ``eager``: regex of eager torch's
    ValueError.
    """

    name: str
    mutate: Callable[[dict], None]
    input: str
    error: tuple
    eager: str
    sample: str | None = None  # the float32 sample mutated (default: the entry's bad_input_sample)
    detail: dict = dataclasses.field(default_factory=dict)


def bad(name, mutate, *, input, error, eager, sample=None, detail=None) -> BadInput:
    return BadInput(name, mutate, input, _tuple(error), eager, sample, dict(detail or {}))


@dataclasses.dataclass(frozen=True)
class OpEntry:
    qualname: str
    dtypes: tuple
    inputs: Callable[[torch.dtype], st.SearchStrategy]  # draws {param name: value}
    tolerances: dict = dataclasses.field(default_factory=dict)
    overrides: tuple = ()
    examples: tuple = ()  # callables dtype -> {param name: value}
    bad_inputs: tuple = ()
    bad_input_sample: str | None = None  # the float32 sample bad inputs mutate (default: the first)
    xfails: tuple = ()

    @property
    def spec(self):
        return bridge.REGISTRY.get(self.qualname)

    def args(self, named: dict) -> tuple:
        """The positional call from values by parameter name (robust to parameter reordering)."""
        return tuple(named[p.name] for p in self.spec.params)

    def named(self, args) -> dict:
        return dict(zip((p.name for p in self.spec.params), args))

    def strategy(self, dtype) -> st.SearchStrategy:
        return self.inputs(dtype).map(self.args)

    def tolerance(self, dtype, tier: str | None, test: str) -> tuple[float, float]:
        """(rtol, atol): the most specific override, else the op's per-dtype tolerance."""
        found = sorted((o for o in self.overrides if o.matches(dtype, tier, test)),
                       key=lambda o: (o.tier is not None) + (o.tests is not None), reverse=True)
        if found:
            return found[0].rtol, found[0].atol
        return self.tolerances.get(dtype) or bridge.parity.tolerance(dtype)

    def xfail(self, test: str, tier: str | None, dtype, case: str | None = None) -> XFail | None:
        return next((x for x in self.xfails if x.matches(test, tier, dtype, case)), None)

    def samples(self, dtype) -> list:
        return list(self.spec.sample_inputs(dtype))

    def bad_call(self, b: BadInput) -> tuple[bridge.SampleInput, tuple]:
        """(the valid float32 sample, the call bad input ``b`` makes of it), from a fresh sample."""
        wanted = b.sample or self.bad_input_sample
        samples = self.samples(F32)
        base = samples[0] if wanted is None else next(s for s in samples if s.name == wanted)
        named = self.named(base.args)
        b.mutate(named)
        return base, self.args(named)


# -- value strategies -----------------------------------------------------------------------------

SPECIALS = (math.nan, math.inf, -math.inf, 6e4, -6e4, 0.0)  # 6e4: huge, yet finite in float16
_WIDTH = {F16: 16, F32: 32, F64: 64}


def ints(lo: int, hi: int) -> st.SearchStrategy:
    return st.integers(lo, hi)


@st.composite
def tensors(draw, dtype, shape, *, low=-8.0, high=8.0, extreme=True):
    """A ``dtype`` tensor of ``shape``: every value drawn by hypothesis from [low, high], and
    (``extreme``) up to three NaN/Inf/huge entries at drawn positions."""
    np_dtype = torch.empty((), dtype=dtype).numpy().dtype
    # fill=nothing: each element is drawn (no shared fill value), so sums see varied values
    arr = draw(hnp.arrays(np_dtype, tuple(shape), elements=st.floats(low, high, width=_WIDTH[dtype]),
                          fill=st.nothing()))
    arr = np.array(arr)  # writable, contiguous, owned
    if extreme and arr.size:
        for index, value in draw(st.lists(st.tuples(ints(0, arr.size - 1), st.sampled_from(SPECIALS)),
                                          max_size=3)):
            arr.flat[index] = value
    return torch.from_numpy(arr)


@st.composite
def identity_conv_inputs(draw, dtype):
    shape = draw(st.lists(ints(0, 4), min_size=2, max_size=4))
    return {"x": draw(tensors(dtype, shape)), "channels": shape[1]}


@st.composite
def crop_inputs(draw, dtype):
    lead = draw(st.lists(ints(0, 3), max_size=2))
    img = draw(tensors(dtype, (*lead, draw(ints(0, 6)), draw(ints(0, 6)))))
    left, top = draw(ints(-4, 8)), draw(ints(-4, 8))
    return {"img": img, "box": [left, top, left + draw(ints(0, 6)), top + draw(ints(0, 6))]}


@st.composite
def paste_inputs(draw, dtype):
    lead = draw(st.lists(ints(1, 3), max_size=2))
    image = draw(tensors(dtype, (*lead, draw(ints(0, 6)), draw(ints(0, 6)))))
    patch = draw(tensors(dtype, (*lead, draw(ints(0, 5)), draw(ints(0, 5)))))
    return {"image": image, "patch": patch, "left": draw(ints(-6, 8)), "top": draw(ints(-6, 8))}


@st.composite
def numpy_sin_inputs(draw, dtype):
    shape = draw(st.lists(ints(0, 5), max_size=3))
    # the op overwrites ``output``: whatever it held (NaN included) must not show through
    return {"input": draw(tensors(dtype, shape)), "output": draw(tensors(dtype, shape))}


def _bev_ranks(xyz, grid, frustum):
    """BEVDet's voxel pooling preparation: frustum points (x, y, z voxel coordinates) outside the
    grid dropped, the rest sorted by BEV cell; one interval per cell. int32 ranks and intervals."""
    b, n, d, h, w = frustum
    gx, gy, gz = grid
    x, y, z = (a.reshape(-1) for a in xyz)
    point = np.arange(b * n * d * h * w)
    batch = point // (n * d * h * w)
    feat_row = (point // (d * h * w)) * (h * w) + point % (h * w)  # (b, n, h, w) of the point
    keep = (x < gx) & (y < gy) & (z < gz)
    cell = ((batch * gz + z) * gy + y) * gx + x
    order = np.argsort(cell[keep], kind="stable")
    rd, rf, rb = point[keep][order], feat_row[keep][order], cell[keep][order]
    starts = np.flatnonzero(np.r_[True, rb[1:] != rb[:-1]]) if rb.size else np.zeros(0, np.int64)
    lengths = np.diff(np.r_[starts, rb.size])
    return [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)) for a in (rd, rf, rb, starts, lengths)]


@st.composite
def bev_pool_v2_inputs(draw, dtype):
    """BEVDet's layout: every frustum point gets drawn voxel coordinates, a drawn share of them
    outside the grid (from all points kept to none), many sharing a cell. Half the examples then
    regroup the points into any intervals: several on one cell, empty ones, points no interval
    covers."""
    frustum = draw(st.tuples(ints(1, 2), ints(1, 2), ints(1, 4), ints(1, 3), ints(1, 3)))
    c = draw(ints(1, 5))
    grid = draw(st.tuples(ints(1, 4), ints(1, 4), ints(0, 2)))  # Z = 0: an empty grid, every tier runs it
    spread = draw(st.sampled_from([1, 2, 4]))  # coordinates drawn from [0, spread * grid size)
    xyz = [draw(hnp.arrays(np.int64, frustum, elements=ints(0, max(g, 1) * spread - 1))) for g in grid]
    rd, rf, rb, starts, lengths = _bev_ranks(xyz, grid, frustum)
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(ints(0, len(rd)), max_size=8)))
        starts = torch.tensor(cuts, dtype=torch.int32)
        lengths = torch.tensor([draw(ints(0, e - s)) for s, e in zip(cuts, cuts[1:] + [len(rd)])], dtype=torch.int32)
    b, n, d, h, w = frustum
    gx, gy, gz = grid
    return {
        "depth": draw(tensors(dtype, frustum, low=0.0, high=4.0, extreme=False)),
        "feat": draw(tensors(dtype, (b, n, h, w, c))),
        "ranks_depth": rd, "ranks_feat": rf, "ranks_bev": rb,
        "interval_starts": starts, "interval_lengths": lengths,
        "bev_feat_shape": [b, gz, gy, gx, c],
    }


# -- bad-input mutations (of a dict of the call's values by parameter name) -------------------------

def put(name: str, position: int, value: int):
    def mutate(a):
        t = a[name].clone()
        t[position] = value
        a[name] = t
    return mutate


def change(**fns):
    """Replace each named value by ``fn(old value)``."""
    def mutate(a):
        for name, fn in fns.items():
            a[name] = fn(a[name])
    return mutate


def const(value):
    return lambda _old: value


# -- the table ------------------------------------------------------------------------------------

OPS = [
    OpEntry(
        "bev::bev_pool_v2", dtypes=(F32, F16, F64), inputs=bev_pool_v2_inputs, bad_input_sample="small",
        overrides=(
            # the reference and the function tier sum in float64; the C++ kernel sums float16 and float32
            # in float32 and the python tier (eager index_add) float32 in float32: on drawn huge values
            # that cancel, the summation order shows
            tol(F16, 2e-3, 2e-3, tier="native", tests="property",
                why="float16 sums in float32 in the C++ kernel, in a different order than the float64 reference"),
            tol(F32, 1e-4, 1e-5, tier="native", tests="property",
                why="float32 sums in float32 in the C++ kernel, in a different order than the float64 reference"),
            tol(F32, 1e-4, 1e-5, tier="python", tests="property",
                why="float32 sums in float32 in eager index_add, in a different order than the float64 reference"),
        ),
        bad_inputs=(
            bad("ranks_depth_high", put("ranks_depth", 3, 10**6), input="ranks_depth", error="[0, 120)",
                eager="input 'ranks_depth' values must lie",
                detail={"native": "input 'ranks_depth' has value 1000000 at position 3, outside [0, 120)"}),
            bad("ranks_depth_negative", put("ranks_depth", 0, -1), input="ranks_depth", error="[0, 120)",
                eager="input 'ranks_depth' values must lie",
                detail={"native": "input 'ranks_depth' has value -1 at position 0"}),
            bad("ranks_feat_high", change(ranks_feat=lambda t: torch.full_like(t, 10**6)), input="ranks_feat",
                error="[0, 30)", eager="input 'ranks_feat' values must lie",
                detail={"native": "input 'ranks_feat' has value 1000000 at position 0, outside [0, 30)"}),
            bad("ranks_bev_high", change(ranks_bev=lambda t: torch.full_like(t, 10**6)), input="ranks_bev",
                error="[0, 40)", eager="input 'ranks_bev' values must lie",
                detail={"native": "input 'ranks_bev' has value 1000000 at position 0, outside [0, 40)"}),
            bad("ranks_bev_negative", change(ranks_bev=lambda t: torch.full_like(t, -1)), input="ranks_bev",
                error="[0, 40)", eager="input 'ranks_bev' values must lie",
                detail={"native": "input 'ranks_bev' has value -1 at position 0"}),
            bad("length_negative", put("interval_lengths", 1, -5), input="interval_lengths", error=">= 0",
                eager="input 'interval_lengths' values must be >= 0",
                detail={"native": "input 'interval_lengths' has value -5 at position 1, must be >= 0"}),
            bad("interval_past_end", change(interval_starts=lambda t: t + 10**5), input="interval_starts",
                error=("100000", "99", "points"),
                eager=r"intervals \[interval_starts, interval_starts \+ interval_lengths\) must lie",
                detail={"native": "interval 0 = [100000, 100005)"}),
            bad("interval_start_negative", change(interval_starts=lambda t: t - 10**5), input="interval_starts",
                error=("-100000", "99", "points"),
                eager=r"intervals \[interval_starts, interval_starts \+ interval_lengths\) must lie",
                detail={"native": "interval 0 = [-100000, -99995)"}),
            bad("short_ranks_feat", change(ranks_feat=lambda t: t[:-1]), input="ranks_feat",
                error=("must have one entry per point", "99", "98"),
                eager="ranks_depth, ranks_feat and ranks_bev must have one entry per point",
                detail={"native": "must have one entry per point, got lengths 99, 98, 99"}),
            bad("short_lengths", change(interval_lengths=lambda t: t[:-1]), input="interval_lengths",
                error=("must have equal length", "38", "37"),
                eager="inputs 'interval_starts' and 'interval_lengths' must have equal length",
                detail={"native": "'interval_starts' and 'interval_lengths' must have equal length, "
                                  "got 38 and 37"}),
            bad("feat_wrong_channels", change(feat=lambda t: torch.zeros(*t.shape[:4], 7)), input="feat",
                error="must equal feat.shape[4]",
                eager=r"attribute bev_feat_shape\[4\] \(C\) = \d+ must equal feat.shape",
                detail={"native": "C = 6 must equal feat.shape[4] = 7"}),
            bad("bev_feat_shape_channels", change(bev_feat_shape=const([1, 2, 4, 5, 99])),
                input="bev_feat_shape", error=("99", "must equal feat.shape[4]"),
                eager=r"attribute bev_feat_shape\[4\] \(C\) = \d+ must equal feat.shape",
                detail={"native": "C = 99 must equal feat.shape[4] = 6"}),
            bad("bev_feat_shape_rank", change(bev_feat_shape=const([1, 2, 3])), input="bev_feat_shape",
                error=("must be", "[B, Z, Y, X, C]", "[1, 2, 3]"),
                eager=r"attribute 'bev_feat_shape' must be \[B, Z, Y, X, C\]",
                detail={"native": "attribute 'bev_feat_shape' must be 5 sizes [B, Z, Y, X, C] >= 0, got [1, 2, 3]"}),
            bad("bev_feat_shape_overflow", change(bev_feat_shape=const([2**31, 2**31, 2**31, 2**31, 6])),
                input="bev_feat_shape", error=("describes more elements than memory can hold", "2147483648"),
                eager=r"attribute 'bev_feat_shape' describes more elements than memory can hold",
                detail={"native": "describes more elements than memory can hold"}),
            bad("bev_feat_shape_negative", change(bev_feat_shape=const([1, -2, 4, 5, 6])), input="bev_feat_shape",
                error=("[B, Z, Y, X, C] >= 0", "[1, -2, 4, 5, 6]"),
                eager=r"attribute 'bev_feat_shape' must be \[B, Z, Y, X, C\] >= 0. Got \[1, -2, 4, 5, 6\]",
                detail={"native": "attribute 'bev_feat_shape' must be 5 sizes [B, Z, Y, X, C] >= 0, got [1, -2"}),
            bad("feat_rank", change(feat=lambda t: t.reshape(-1)), input="feat", error="180",
                eager=r"input 'feat' must be \(B,N,H,W,C\)",
                detail={"native": "input 'feat' must have 5 dims, got shape [180]"}),
            bad("depth_empty", change(depth=lambda t: torch.zeros((0, *t.shape[1:]))), input="ranks_depth",
                error="[0, 0)", eager=r"input 'ranks_depth' values must lie in \[0, 0\)",
                detail={"native": "input 'ranks_depth' has value 4 at position 0, outside [0, 0)"}),
            bad("ranks_depth_int64", change(ranks_depth=lambda t: t.long()), input="ranks_depth",
                error="int32", eager="input 'ranks_depth' must be int32",
                detail={tier: "bev::bev_pool_v2: input 'ranks_depth' must be int32 (tensor(int32)). Got int64"
                        for tier in TIERS}),
        ),
    ),
    OpEntry(
        "opbridge::identity_conv", dtypes=(F32, F16, F64), inputs=identity_conv_inputs,
        examples=(lambda dtype: {"x": torch.zeros(1, 3, 2, 2, dtype=dtype), "channels": 3},),
        bad_inputs=(
            bad("wrong_channels", change(x=const(torch.ones(1, 4, 2, 2))), input="x",
                error=("channels=3", "1, 4, 2, 2"),
                eager=r"input 'x' must be \(N, channels=3, \.\.\.\). Got shape \(1, 4, 2, 2\)",
                detail={"native": "opbridge::identity_conv: input 'x' must be (N, channels=3, ...), "
                                  "got shape [1, 4, 2, 2]"}),
            bad("channels_attribute", change(x=const(torch.ones(1, 3, 2, 2)), channels=const(4)), input="x",
                error=("channels=4", "1, 3, 2, 2"),
                eager=r"input 'x' must be \(N, channels=4, \.\.\.\). Got shape \(1, 3, 2, 2\)",
                detail={"native": "input 'x' must be (N, channels=4, ...), got shape [1, 3, 2, 2]"}),
        ),
    ),
    OpEntry(
        "opbridge::crop", dtypes=(F32, F16, F64), inputs=crop_inputs,
        examples=(lambda dtype: {"img": torch.ones(2, 4, 4, dtype=dtype), "box": [-3, -3, 9, 2]},
                  lambda dtype: {"img": torch.ones(2, 0, 0, dtype=dtype), "box": [-3, -3, 9, 2]}),
        bad_inputs=(
            bad("bad_box", change(box=const([3, 0, 1, 1])), input="box",
                error=("must be [left, top, right, bottom]", "right >= left", "[3, 0, 1, 1]"),
                eager=r"attribute 'box' must be \[left, top, right, bottom\] with right >= left",
                detail={"native": "opbridge::crop: attribute 'box' must be [left, top, right, bottom]"}),
            bad("box_of_three", change(box=const([1, 2, 5])), input="box",
                error=("must be [left, top, right, bottom]", "[1, 2, 5]"),
                eager=r"attribute 'box' must be \[left, top, right, bottom\]. Got \[1, 2, 5\]"),
            bad("image_rank_1", change(img=lambda t: t.reshape(-1)[:5]), input="img", error="5",
                eager=r"input 'img' must be an image \(\.\.\., H, W\). Got shape \(5,\)",
                detail={"native": "input 'img' must have at least 2 dims, got shape [5]"}),
        ),
    ),
    OpEntry(
        "opbridge::paste", dtypes=(F32, F16, F64), inputs=paste_inputs,
        examples=(lambda dtype: {"image": torch.zeros(2, 5, 5, dtype=dtype),
                                 "patch": torch.ones(2, 9, 9, dtype=dtype), "left": 1, "top": -1},),
        bad_inputs=(
            bad("leading_dims", change(image=const(torch.zeros(2, 5, 5)), patch=const(torch.zeros(3, 2, 2)),
                                       left=const(1), top=const(-1)),
                input="patch", error=("image", "leading dims", "2, 5, 5", "3, 2, 2"),
                eager=r"inputs 'image' \(\.\.\., H, W\) and 'patch' \(\.\.\., h, w\) must have equal leading dims",
                detail={"native": "opbridge::paste: inputs 'image' [2, 5, 5] and 'patch' [3, 2, 2] must share "
                                  "their leading"}),
            bad("patch_rank", change(patch=lambda t: t[0]), input="patch", error=("image", "leading dims", "3, 4"),
                eager=r"inputs 'image' \(\.\.\., H, W\) and 'patch' \(\.\.\., h, w\) must have equal leading dims"),
        ),
    ),
    OpEntry(
        "opbridge::numpy_sin", dtypes=(F32, F64), inputs=numpy_sin_inputs,
        tolerances={F32: (1e-6, 1e-5)},
        bad_inputs=(
            bad("output_shape", change(output=lambda t: torch.zeros(4, 6)), input="output", error="4, 6",
                eager=r"input 'output' must have the shape of 'input'. Got \(4, 5\) and \(4, 6\)"),
        ),
    ),
]



# -- bad inputs generated from each op's check list (bridge.checks) ----------------------------------
# Every check of an op's spec that no written bad input above reaches first gets one generated
# violation, so all tiers are held to every check the spec states.

def _violation(check, named: dict) -> tuple[Callable, tuple] | None:
    """(a mutation making ``check`` fail on a call, the fragments every tier's message holds), or
    None for check kinds the written bad inputs cover."""
    t = named.get(check.input)
    if check.kind == "rank":
        if check.violation({check.input: t}) is None and t.dim() > 1:
            new = t.reshape(-1)[:5]  # fewer dims (of at-least checks, too)
        else:
            new = t.unsqueeze(0)
        new = new if check.violation({check.input: new}) is not None else t.unsqueeze(0)
        return change(**{check.input: const(new)}), (", ".join(map(str, new.shape)),)
    if check.kind == "same_shape":
        new = t.unsqueeze(0)
        return change(**{check.input: const(new)}), (", ".join(map(str, new.shape)),)
    if check.kind == "same_len":
        return change(**{check.input: lambda old: old[:-1]}), (str(t.numel() - 1),)
    if check.kind in ("dtype_is", "same_dtype"):
        dtype = torch.int64 if t.dtype == torch.int32 else torch.float64
        return change(**{check.input: lambda old: old.to(dtype)}), (str(dtype).replace("torch.", ""),)
    return None


def _with_spec_bad_inputs(entry: OpEntry) -> OpEntry:
    checks = entry.spec.checks
    reached = set()
    for b in entry.bad_inputs:
        env = entry.named(entry.bad_call(b)[1])
        reached.add(next(i for i, c in enumerate(checks) if c.violation(env) is not None))
    generated = []
    for index, check in enumerate(checks):
        base = entry.samples(F32)[0] if entry.bad_input_sample is None else \
            next(x for x in entry.samples(F32) if x.name == entry.bad_input_sample)
        found = None if index in reached else _violation(check, entry.named(base.args))
        if found is None:
            continue
        mutate, fragments = found
        name = f"spec_{index}_{check.kind}_{check.input}"
        env = entry.named(base.args)
        mutate(env)
        eager = re.escape(check.what(env))
        generated.append(bad(name, mutate, input=check.input, error=fragments, eager=eager))
    return dataclasses.replace(entry, bad_inputs=entry.bad_inputs + tuple(generated))


OPS = [_with_spec_bad_inputs(e) for e in OPS]
OP_DB: dict[str, OpEntry] = {e.qualname: e for e in OPS}


# -- import-time checks ---------------------------------------------------------------------------

def _check_table() -> None:
    if len(OP_DB) != len(OPS):
        raise TableError("the table has two entries for one op")
    registered = {s.qualname for s in bridge.REGISTRY}
    unknown = sorted(set(OP_DB) - registered)
    if unknown:
        raise TableError(f"tests/op_db.py has entries for ops that are not registered: {unknown}")
    missing = sorted(registered - set(OP_DB))
    if missing:
        raise TableError(f"registered ops without an entry in tests/op_db.py: {missing}. Add one.")
    for entry in OPS:
        spec, name = entry.spec, entry.qualname
        if set(entry.dtypes) != set(spec.dtypes):
            raise TableError(f"{name}: the table tests {entry.dtypes}, the op declares {spec.dtypes}")
        if spec.reference is None or spec.sample_inputs is None:
            raise TableError(f"{name}: the generated tests need the op's reference and sample_inputs")
        params = {p.name for p in spec.params}
        samples = [s.name for s in entry.samples(F32)]
        for b in entry.bad_inputs:
            if b.input not in params:
                raise TableError(f"{name}: bad input {b.name!r} names {b.input!r}, not a parameter of the op")
            if (b.sample or entry.bad_input_sample or next(iter(samples))) not in samples:
                raise TableError(f"{name}: bad input {b.name!r} mutates an unknown sample")
            if not b.error or not all(b.error) or set(b.detail) - set(TIERS):
                raise TableError(f"{name}: bad input {b.name!r} needs error text (and details only for {TIERS})")
            re.compile(b.eager)
        if len({b.name for b in entry.bad_inputs}) != len(entry.bad_inputs):
            raise TableError(f"{name}: two bad inputs share a name")
        sample_names = {d: [s.name for s in entry.samples(d)] for d in entry.dtypes}
        generated = [(t, tier, d, c) for t in ("parity", "property", "opcheck", "eager")
                     for tier in (TIERS if t in ("parity", "property") else (None,))
                     for d in entry.dtypes for c in (sample_names[d] if t != "property" else (None,))]
        generated += [(t, tier, F32, b.name) for t in ("bad_input", "bad_input_message") for tier in TIERS
                      for b in entry.bad_inputs]
        for x in entry.xfails:
            if x.cases and set(x.cases) - {b.name for b in entry.bad_inputs} - set().union(*sample_names.values()):
                raise TableError(f"{name}: xfail({x.reason!r}) names unknown cases {x.cases}")
            if not any(x.matches(*g) for g in generated):
                raise TableError(f"{name}: xfail({x.reason!r}) matches no generated test; remove it")
        for o in entry.overrides:
            if set(o.dtypes) - set(entry.dtypes):
                raise TableError(f"{name}: tolerance override ({o.why}) names dtypes the op is not tested in")
            same = [p for p in entry.overrides if p is not o and p.tier == o.tier and p.tests == o.tests
                    and set(p.dtypes) & set(o.dtypes)]
            if same:
                raise TableError(f"{name}: tolerance overrides overlap for one scope: {o.why!r}")


_check_table()


# -- generated test parameters --------------------------------------------------------------------

def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _param(values, ident, x: XFail | None):
    return pytest.param(*values, id=ident, marks=[x.mark()] if x else [])


@dataclasses.dataclass(frozen=True)
class Case:
    """One sample call of an op at one dtype."""

    entry: OpEntry
    dtype: torch.dtype
    sample: bridge.SampleInput

    @property
    def id(self) -> str:
        return f"{self.entry.qualname}-{_dtype_name(self.dtype)}-{self.sample.name}"


def sample_cases(dtypes=None) -> list[Case]:
    return [Case(e, d, s) for e in OPS for d in e.dtypes if dtypes is None or d in dtypes for s in e.samples(d)]


def parity_params() -> list:
    """(case, tier) for every op x dtype x sample x tier."""
    return [_param((c, tier), f"{tier}-{c.id}", c.entry.xfail("parity", tier, c.dtype, c.sample.name))
            for tier in TIERS for c in sample_cases()]


def sample_params(test: str, dtypes=None) -> list:
    """(case,) for every op x dtype x sample: tests without a tier (opcheck, eager)."""
    return [_param((c,), c.id, c.entry.xfail(test, None, c.dtype, c.sample.name)) for c in sample_cases(dtypes)]


def property_params() -> list:
    """(entry, tier, dtype) for every op x tier x dtype."""
    return [_param((e, tier, d), f"{tier}-{e.qualname}-{_dtype_name(d)}", e.xfail("property", tier, d))
            for e in OPS for tier in TIERS for d in e.dtypes]


def bad_input_params(test: str) -> list:
    """(entry, bad input, tier) for every op x bad input x tier."""
    return [_param((e, b, tier), f"{tier}-{e.qualname}-{b.name}", e.xfail(test, tier, F32, b.name))
            for e in OPS for b in e.bad_inputs for tier in TIERS]


def eager_bad_params() -> list:
    """(entry, bad input) for every op x bad input: eager torch, no tier."""
    return [_param((e, b), f"{e.qualname}-{b.name}", e.xfail("eager", None, F32, b.name))
            for e in OPS for b in e.bad_inputs]
