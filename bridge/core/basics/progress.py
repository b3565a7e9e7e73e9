"""Progress lines for long work (export, session start, runs; stderr, off by default in the API) and plain tables."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence

_enabled = False
_quiet = False  # NOTE: asked silence (`opbridge -q`): not even the lines of work a user waits for
# NOTE: under quiet, told each step's label and native code as it starts (True) and ends (False): the CLI
# keeps the line naming the native code that runs, for a crash to print (bridge.tools.cli)
Native = Mapping[str, Sequence[str]]  # NOTE: a library's path -> the ops it serves
_witness: Callable[[str, Native, bool], None] | None = None


def enable(on: bool = True, *, quiet: bool = False) -> None:
    """Turn progress lines on or off (the CLI turns them on); ``quiet``: also the ``always`` ones."""
    global _enabled, _quiet
    _enabled, _quiet = on, quiet


def witness(fn: Callable[[str, Native, bool], None] | None) -> None:
    """While quiet, call ``fn(label, native, True)`` as each step starts and ``fn(label, native, False)`` as
    it ends, printing nothing (None: no one is told)."""
    global _witness
    _witness = fn


@contextlib.contextmanager
def step(label: str, *, always: bool = False, native: Native | None = None):
    """Print ``label ...`` then ``done (s)`` or ``failed`` around a block, when enabled (or ``always``:
    work a user should never wait for silently, e.g. a C++ build), unless turned off with ``quiet``.
    ``native``: the native code the block runs (library path -> ops), which the label names too.

    >>> with step("nothing"):
    ...     pass
    """
    if _quiet and _witness is not None:
        told, native = _witness, native or {}
        told(label, native, True)
        try:
            yield
        finally:
            told(label, native, False)
        return
    if _quiet or not (_enabled or always):
        yield
        return
    print(f"[opbridge] {label} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        print(f"[opbridge] {label} failed", file=sys.stderr, flush=True)
        raise
    print(f"[opbridge] {label} done ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)


def format_table(rows: Sequence[tuple[str, ...]]) -> str:
    """Plain-text table: the first row is the header, underlined; columns padded to their widest
    cell (readable in a terminal and in CI logs alike).

    >>> print(format_table([("op", "tiers"), ("bev::bev_pool_v2", "3")]))
    op                tiers
    ----------------  -----
    bev::bev_pool_v2  3
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
