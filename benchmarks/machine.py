"""What a benchmark ran on: the CPU model, core count, cache sizes and the vector ISA path the native
kernels took, recorded in every benchmark JSON beside the figures.

    >>> m = describe()
    >>> m["cores"] >= 1 and isinstance(m["cpu_model"], str)
    True
"""

from __future__ import annotations

import ctypes
import datetime
import os
import platform
import subprocess
from pathlib import Path

ISA_FLAGS = {"avx512": ("avx512f", "avx512vl"), "avx2": ("avx2", "fma")}
CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")
ROOT = Path(__file__).resolve().parents[1]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def caches() -> dict[str, str]:
    """Cache sizes as the kernel reports them, e.g. ``{"L1d": "48K", "L2": "2048K", "L3": "307200K"}``."""
    out = {}
    for index in sorted(CACHE_ROOT.glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            out[f"L{level}{'d' if kind == 'Data' else ''}"] = size
    return out


def cpu_isa_paths(flags: str | None = None) -> list[str]:
    """The kernel paths this CPU can run, best first (``baseline`` always)."""
    have = set((flags if flags is not None else _cpuinfo().get("flags", "")).split())
    return [p for p, need in ISA_FLAGS.items() if have.issuperset(need)] + ["baseline"]


def describe() -> dict:
    """The machine, for a benchmark's JSON."""
    info = _cpuinfo()
    return {"cpu_model": info.get("model name") or platform.processor() or platform.machine(),
            "cpu_family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
            "cores": os.cpu_count(), "caches": caches(), "isa_paths_available": cpu_isa_paths(info.get("flags", ""))}


def library_isa(path: str | os.PathLike) -> str:
    """The ISA path a built native library's kernels take in this process (its ``OpbridgeIsa()``)."""
    lib = ctypes.CDLL(os.fspath(path))
    lib.OpbridgeIsa.restype = ctypes.c_char_p
    return lib.OpbridgeIsa().decode()


def provenance(measures: list[str]) -> dict:
    """Which code a result measured: the commit checked out and whether the files it ``measures``
    (paths from the repository root) differed from it, with the date and load of the run. The rule
    tests/test_doc_figures.py holds the docs to: no commit after ``commit`` changed those files, and none
    of them was modified when it ran (``dirty`` empty)."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", *measures], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return {"commit": commit, "measures": measures, "dirty": [line[3:] for line in dirty],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average": list(os.getloadavg())}


def json_path(given, quick: bool, default):
    """Where a run writes its JSON: the path given, else the committed results (``default``) for a full
    run only: a --quick smoke run must not replace them.

        >>> json_path(None, True, "r.json") is None, json_path(None, False, "r.json"), json_path("x.json", True, "r.json")
        (True, 'r.json', 'x.json')
    """
    return given if given is not None else (None if quick else default)
