"""The cache root and its folders: where every C++ build opbridge makes is kept, what is there, and
cleaning it (``opbridge cache``). Imports nothing heavy (no torch): the builds are bridge/core/cppbuild.py.

One cache root (``$OPBRIDGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opbridge``, else ``~/.cache/opbridge``);
each kind of build in a folder only this user can write, marked as opbridge's (``clean`` removes only those).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import functools
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

CACHE_ENV = "OPBRIDGE_CACHE_DIR"
CACHE_MARKER = ".opbridge-cache"
# NOTE: in the cache root, which `clean` never removes: builds hold it shared, `clean` exclusive
LOCK_NAME = ".opbridge-cache.lock"


def cache_root() -> Path:
    """``$OPBRIDGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opbridge``, else ``~/.cache/opbridge``.

    >>> bool(os.environ.get(CACHE_ENV)) or cache_root().name == "opbridge"
    True
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    # NOTE: the XDG spec says a relative XDG_CACHE_HOME is invalid and is to be ignored
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "opbridge"


def private_folder(path: Path) -> Path:
    """``path`` as a folder only this user can write: created 0700; refused when it is a symlink,
    not a folder, owned by someone else, or writable by others."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{path} is a symlink or not a folder")
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(f"{path} belongs to uid {info.st_uid} with mode {oct(info.st_mode & 0o777)}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"{path} is not writable")
    return path


@functools.cache
def _fallback_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="opbridge-cache-"))
    # NOTE: the folder serves this process only: removed at exit, so no run leaves a build behind in /tmp
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def sealed_folder(path: Path) -> bool:
    """Whether ``path`` is a folder (not a symlink) this process can read and only its owner can write:
    what a cache another user or a container image made (read-only to us) must be for its files to be
    loaded (their digests checked, as always). Nothing is created.

    >>> sealed_folder(Path("/nonexistent")), sealed_folder(Path("/"))
    (False, True)
    """
    try:
        info = path.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and not info.st_mode & 0o022
            and os.access(path, os.R_OK | os.X_OK))


def readable_folder(kind: str) -> Path | None:
    """``cache_root()/kind`` where it exists as a :func:`sealed_folder` (a read-only cache: a container
    image, a shared mount, are read from as they are), else None. Nothing is created or warned about."""
    folder = cache_root() / kind
    return folder if sealed_folder(cache_root()) and sealed_folder(folder) else None


@contextlib.contextmanager
def cache_lock(root: Path, *, exclusive: bool, waiting: Callable[[], object] | None = None) -> Iterator[None]:
    """Hold the cache root's lock: shared for a build (many at once), exclusive for ``clean``, so a clean
    never removes the folder a build is writing. ``waiting`` is called once when the lock is held
    elsewhere (before waiting for it). A root that does not exist or cannot hold the lock file (read-only:
    nothing builds there) is not locked.

    >>> import tempfile
    >>> with cache_lock(Path(tempfile.mkdtemp()), exclusive=True):
    ...     pass
    """
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        if root.is_dir() and not os.access(root, os.W_OK):
            yield  # NOTE: read-only: no build can write here, and no clean can remove anything
            return
        raise
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


def mark(folder: Path) -> Path:
    """``folder`` (a kind folder) with opbridge's marker, which ``clean`` looks for."""
    marker = folder / CACHE_MARKER
    if not marker.exists():
        marker.touch()  # NOTE: `opbridge cache clean` removes only folders that carry it
    return folder


def cache_folder(kind: str) -> Path:
    """``cache_root()/kind``, a folder only this user can write; when that is not possible, a private
    temp folder for this process (with a warning)."""
    wanted = cache_root() / kind
    try:
        return mark(private_folder(wanted))
    except OSError as e:
        fallback = _fallback_root() / kind
        warnings.warn(f"opbridge: the {kind} cache {str(wanted)!r} cannot be used safely ({e}). Got an unusable "
                      f"folder. Building in {fallback} for this process; set {CACHE_ENV} to a private folder.",
                      stacklevel=2)
        return private_folder(fallback)


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One cached item: ``kind`` (native, torch_ext, ...), its ``key`` folder, bytes and seconds since use."""

    kind: str
    key: str
    path: Path
    size: int
    age_s: float


def _size(path: Path) -> int:
    return sum(f.lstat().st_size for f in path.rglob("*") if not f.is_symlink() and f.is_file())


def _kinds() -> list[Path]:
    """The kind folders of the cache root that opbridge made (they carry its marker)."""
    root = cache_root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and (p / CACHE_MARKER).is_file())


def cache_entries() -> list[CacheEntry]:
    """What opbridge keeps under the cache root, one entry per key folder.

    >>> all(e.size >= 0 for e in cache_entries())
    True
    """
    now = time.time()
    return [CacheEntry(kind.name, key.name, key, _size(key), now - key.lstat().st_mtime)
            for kind in _kinds() for key in sorted(kind.iterdir()) if key.is_dir() and not key.is_symlink()]


def clean_cache(kinds: Sequence[str] | None = None, *, waiting: Callable[[], object] | None = None) -> list[Path]:
    """Remove opbridge's kind folders (all, or those named) from the cache root; return what went.
    Only folders opbridge made are touched, never the root itself nor anything else in it. A build
    running in another process is waited for (``waiting`` is called first): a clean never removes
    the folder a build is writing."""
    root = cache_root()
    if not root.is_dir():
        return []
    with cache_lock(root, exclusive=True, waiting=waiting):
        gone = [k for k in _kinds() if kinds is None or k.name in kinds]
        for kind in gone:
            shutil.rmtree(kind)
    return gone
