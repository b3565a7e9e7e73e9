"""Progress lines for long work (export, session start, runs), on stderr, off by default in the API."""

from __future__ import annotations

import contextlib
import sys
import time

_enabled = False


def enable(on: bool = True) -> None:
    """Turn progress lines on or off (the CLI turns them on)."""
    global _enabled
    _enabled = on


@contextlib.contextmanager
def step(label: str):
    """Print ``label ...`` then ``done (s)`` or ``failed`` around a block, when enabled.

    >>> with step("nothing"):
    ...     pass
    """
    if not _enabled:
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
