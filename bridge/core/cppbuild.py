"""C++ builds and their cache, held to one set of rules: the native kernel library and torch extensions.

One cache root (``$OPBRIDGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opbridge``, else ``~/.cache/opbridge``);
each kind of build in a folder only this user can write; a built file is loaded only when its SHA-256
matches the digest recorded right after the build (a truncated, empty or planted file is rebuilt);
one build per key at a time, across processes. The key a caller gives (its sources, flags, the
runtime it builds for) is joined with the compiler's identity (``$CXX`` and its version line); with no
compiler on the machine, a file built earlier from the same key is used, whichever compiler made it.

Example:
    >>> verified(Path("/nonexistent/libx.so"))  # no file, no digest: never loaded
    False
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import importlib
import io
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

# NOTE: the cache's folders live in bridge/core/basics/cache.py (no torch: `opbridge cache` is a light command);
# its names are this module's too, as the one place builds reach them
from bridge.core.basics.cache import (  # noqa: F401
    CACHE_ENV,
    CACHE_MARKER,
    LOCK_NAME,
    CacheEntry,
    cache_entries,
    cache_folder,
    cache_lock,
    cache_root,
    clean_cache,
    mark,
    private_folder,
    readable_folder,
    sealed_folder,
)
from bridge.core.basics.errors import BuildError, OpBridgeError
from bridge.core.basics.progress import step

# NOTE: the environment variables this module reads, each named once.
CXX_ENV = "CXX"
DEFAULT_CXX = "g++"
DIGEST_SUFFIX = ".sha256"
_STALE_S = 3600  # an interrupted build's temp folder older than this is removed


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verified(path: Path) -> bool:
    """Whether ``path`` is a file this cache built: a regular file (not a symlink) whose SHA-256
    matches the digest recorded when it was built. Nothing else is ever loaded."""
    digest = path.with_name(path.name + DIGEST_SUFFIX)
    try:
        if not stat.S_ISREG(path.lstat().st_mode) or not stat.S_ISREG(digest.lstat().st_mode):
            return False
        return digest.read_text().strip() == file_sha256(path)
    except OSError:
        return False


def find_compiler() -> str | None:
    """The C++ compiler builds use (``$CXX``, else g++) as a path, or None when there is none."""
    return shutil.which(os.environ.get(CXX_ENV) or DEFAULT_CXX)


def compiler(purpose: str, fix: str = "") -> str:
    """The C++ compiler, or OpBridgeError (one line) naming g++ and how to install it."""
    found = find_compiler()
    if found is None:
        wanted = os.environ.get(CXX_ENV) or DEFAULT_CXX
        raise OpBridgeError(f"building {purpose} needs a C++ compiler. Got CXX={wanted!r}, not found on PATH. "
                            f"Install g++ (apt-get install g++) or set CXX to a C++ compiler{fix}.")
    return found


# NOTE: how each cause of a failed build shows, in an OSError's errno or in the compiler's own output
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DISK_TEXT = ("No space left on device", "Disk quota exceeded")
_DENIED_TEXT = ("Permission denied", "Operation not permitted", "Read-only file system")
_COMPILER_TEXT = ("cannot execute", "error trying to exec", "installation problem", "not found", "command not found")


def _cause(detail: str, code: int | None) -> str:
    """``disk``, ``permission``, ``compiler`` or ``source``: why a build failed, from an errno or its output."""
    if code in _DISK_ERRNOS or any(t in detail for t in _DISK_TEXT):
        return "disk"
    if code is not None or any(t in detail for t in _DENIED_TEXT):
        return "permission"  # NOTE: any other OSError of the build's own file work: a folder it cannot write
    if any(t in line for line in detail.splitlines() if "fatal error" in line or "g++:" in line
                               for t in _COMPILER_TEXT):
        return "compiler"
    return "source"


def _line(detail: str, needles: Sequence[str]) -> str:
    """The first line of ``detail`` naming one of ``needles`` (else its last line), short."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()] or ["(no output)"]
    return next((line for line in lines if any(n in line for n in needles)), lines[-1])[:300]


def build_failure(purpose: str, detail: str, *, code: int | None = None, exit_code: int | None = None,
                  cause: str | None = None) -> BuildError:
    """The error for a failed build of ``purpose``, by its cause, each with its fix: a full disk, a folder
    it may not write, a missing or broken compiler, or the C++ source. ``detail``: the compiler's
    output (``exit_code``: its exit status), or an OSError's text (``code``: its errno).

    >>> build_failure("x", "cc1plus: fatal error: out.s: No space left on device", exit_code=1).cause
    'disk'
    >>> build_failure("x", "k.cc:3:1: error: expected ';' before '}' token", exit_code=1).cause
    'source'
    """
    cause = cause or _cause(detail, code)
    root = cache_root()
    if cause == "disk":
        message = (f"building {purpose} ran out of disk space. Got {_line(detail, _DISK_TEXT)!r}. Free space on the "
                   f"disk of {str(root)!r} (the build cache, ${CACHE_ENV}) and of the temp folder ($TMPDIR), or "
                   f"point ${CACHE_ENV} at a disk with room.")
    elif cause == "permission":
        message = (f"building {purpose} could not write its files. Got {_line(detail, _DENIED_TEXT)!r}. Make "
                   f"{str(root)!r} (the build cache) a folder this user can write, or point ${CACHE_ENV} at one.")
    elif cause == "compiler":
        message = (f"building {purpose} could not run the C++ compiler. Got {_line(detail, _COMPILER_TEXT)!r}. "
                   "Install g++ (apt-get install g++), or set CXX to a working C++ compiler.")
    else:
        message = (f"building {purpose} failed in the C++ source. Got exit {exit_code}:\n{detail[-3000:]}\n"
                   "Fix the C++ source named above.")
    return BuildError(message, cause, detail)


def run_compiler(cmd: Sequence[str], purpose: str) -> subprocess.CompletedProcess:
    """Run a compiler command; a compiler that cannot be started is a ``compiler`` BuildError."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True)
    except OSError as e:
        raise build_failure(purpose, f"{cmd[0]}: {e.strerror or e}", cause="compiler") from None


@functools.cache
def _version_line(cxx: str) -> str:
    result = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return (result.stdout.splitlines() or [""])[0]


def toolchain(cxx: str) -> str:
    """What identifies a compiler in cache keys and ``build.txt``: its path and version line."""
    return f"{cxx}\n{_version_line(cxx)}"


def full_key(key: str) -> str:
    """The cache folder name for ``key`` built with the machine's compiler."""
    cxx = find_compiler()
    return f"{key}-{hashlib.sha256(toolchain(cxx).encode()).hexdigest()[:8] if cxx else 'nocompiler'}"


def _prebuilt(folder: Path, key: str, filename: str) -> Path | None:
    """The newest file built earlier for ``key`` (any compiler) that verifies, if any."""
    found = [p for p in folder.glob(f"{key}-*/{filename}") if verified(p)]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def _shared(path: Path) -> Path | None:
    """``path`` when it verifies in a folder only its owner can write, else None."""
    return path if sealed_folder(path.parent) and verified(path) else None


def cached_path(kind: str, key: str, filename: str) -> Path:
    """Where ``cached_build`` keeps ``filename`` for ``key`` on this machine (built or not).

    A verified file in the cache as it is (a read-only cache too: a container image, a shared mount,
    whose folders only their owner can write) is used as it is: nothing is created, and no compiler is
    needed. Only a build needs a folder this user can write (else a private temp folder)."""
    shared, compiler_found = readable_folder(kind), find_compiler() is not None
    if shared is not None:
        found = _shared(shared / full_key(key) / filename)
        if found is None and not compiler_found:
            found = _prebuilt(shared, key, filename)
            found = None if found is None else _shared(found)
        if found is not None:
            return found
    folder = cache_folder(kind)
    target = folder / full_key(key) / filename
    if verified(target) or compiler_found:
        return target
    return _prebuilt(folder, key, filename) or target


def _clean_stale(folder: Path) -> None:
    for tmp in folder.glob("tmp*"):
        with contextlib.suppress(OSError):
            if tmp.is_dir() and not tmp.is_symlink() and time.time() - tmp.lstat().st_mtime > _STALE_S:
                shutil.rmtree(tmp, ignore_errors=True)


def cached_build(kind: str, key: str, filename: str, build: Callable[[Path, str], Path], *, purpose: str,
                 fix: str = "") -> Path:
    """``filename`` built for ``key`` under ``cache_folder(kind)``, building it when no verified copy exists.

    ``build(tmp, cxx)`` builds into the fresh private folder ``tmp`` with compiler ``cxx`` and returns the
    built file (a ``build.txt`` it leaves in ``tmp`` is kept beside the result). The digest is recorded
    after the file is in place, so a reader never trusts a half-written one. Without a compiler, a
    verified file built earlier for ``key`` is returned, else OpBridgeError names g++ (``compiler``).
    """
    target = cached_path(kind, key, filename)
    if verified(target):
        return target
    cxx = compiler(purpose, fix)
    try:
        # NOTE: the root's lock, shared: `opbridge cache clean` in another process waits for this build
        # (it would remove the folder the compiler is writing), and no build starts while it cleans
        with cache_lock(target.parents[2], exclusive=False):
            mark(private_folder(target.parents[1]))  # NOTE: again: a clean may have removed it meanwhile
            folder = private_folder(target.parent)
            # NOTE: O_NOFOLLOW: a lock planted as a symlink is refused instead of truncating its target
            fd = os.open(folder / "build.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key, even across processes
                if not verified(target):
                    _clean_stale(folder)
                    with tempfile.TemporaryDirectory(dir=folder) as tmp:
                        built = _lost_folder(build, Path(tmp), cxx, purpose)
                        _install(built, target)
    except OSError as e:  # NOTE: the build's own file work (the compiler's is in its output): disk or folder
        where = f"{e.filename}: " if e.filename else ""
        raise build_failure(purpose, f"{where}{e.strerror or e}",
                            cause="disk" if e.errno in _DISK_ERRNOS else "permission") from None
    return target


def _lost_folder(build: Callable[[Path, str], Path], tmp: Path, cxx: str, purpose: str) -> Path:
    """``build(tmp, cxx)``; a failure after its folder was removed under it (by another process: a
    manual rm, a cleaner that ignores opbridge's lock) says so, not that the C++ source is wrong."""
    try:
        return build(tmp, cxx)
    except (BuildError, OSError) as e:
        if tmp.is_dir():
            raise
        detail = e.detail if isinstance(e, BuildError) else str(e)
        raise BuildError(f"building {purpose} lost its build folder: {str(tmp)!r} was removed while the compiler "
                         f"ran (another process removed the cache). Got {_line(detail, ('No such file',))!r}. "
                         "Build again; clean the cache with `opbridge cache clean`, which waits for builds.",
                         "removed", detail) from None


def _install(built: Path, target: Path) -> None:
    digest = built.with_name(built.name + DIGEST_SUFFIX)
    digest.write_text(file_sha256(built) + "\n")
    note = built.parent / "build.txt"
    if note.is_file():
        os.replace(note, target.parent / "build.txt")
    # NOTE: the digest lands after the file: a reader never sees a digest without its file
    os.replace(built, target)
    os.replace(digest, target.with_name(target.name + DIGEST_SUFFIX))


# NOTE: what torch.utils.cpp_extension says at import on a CUDA build of torch on a machine without a
# GPU (a logger warning in torch 2.12-2.15, a print to stderr before): nothing about opbridge's build
CUDA_PROBE_LINE = "No CUDA runtime is found"
_CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"


def _not_cuda_probe(record: logging.LogRecord) -> bool:
    return CUDA_PROBE_LINE not in record.getMessage()


@contextlib.contextmanager
def without_cuda_probe():
    """Around a torch extension build only: torch's CUDA-probe line left out (its logger's record, or
    the line on stderr); everything else the build says is passed on. The user's own imports of
    torch.utils.cpp_extension keep the line."""
    logger, held = logging.getLogger(_CPP_EXTENSION_LOGGER), io.StringIO()
    logger.addFilter(_not_cuda_probe)
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        logger.removeFilter(_not_cuda_probe)
        sys.stderr.write("".join(line for line in held.getvalue().splitlines(keepends=True)
                                 if CUDA_PROBE_LINE not in line))


def build_torch_extension(name: str, sources: Sequence[str | os.PathLike], *, purpose: str) -> Path:
    """Build (once per sources, torch version and compiler; cached and verified) and load a C++ torch
    extension library (``TORCH_LIBRARY`` ops, torchbind classes) into torch; returns its path.

    A library built earlier loads without a compiler; with no compiler and no such library, the
    OpBridgeError names g++. The build prints one progress line.
    """
    # NOTE: torch.utils.cpp_extension is imported only here, when a library is wanted: importing it
    # probes for CUDA (a warning line on a CUDA build of torch without a GPU, left out: without_cuda_probe)
    # and costs time.
    h = hashlib.sha256(f"{name}\n{torch.__version__}\n".encode())
    for source in sources:
        h.update(Path(source).read_bytes())

    def build(tmp: Path, cxx: str) -> Path:
        with step(f"building {purpose} ({name}.so, once; cached)", always=True), without_cuda_probe():
            cpp_extension = importlib.import_module("torch.utils.cpp_extension")
            cpp_extension.load(name=name, sources=[str(s) for s in sources], build_directory=str(tmp),
                               is_python_module=False, verbose=False)
        (tmp / "build.txt").write_text(toolchain(cxx) + "\n")
        return tmp / f"{name}.so"

    path = cached_build("torch_ext", h.hexdigest()[:16], f"{name}.so", build, purpose=purpose)
    torch.ops.load_library(str(path))
    return path
