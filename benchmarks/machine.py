"""What a benchmark ran on: the CPU model, core count, cache sizes and the vector ISA path the native
kernels took, recorded in every benchmark JSON beside the figures.

    >>> m = describe()
    >>> m["cores"] >= 1 and isinstance(m["cpu_model"], str)
    True
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

ISA_FLAGS = {"avx512": ("avx512f", "avx512vl"), "avx2": ("avx2", "fma")}
CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")


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
