"""Files: the one ONNX model loader and the one atomic writer every file opbridge writes goes through.

A write lands whole or not at all: the bytes go to a temp file in the target's folder, are flushed
and fsynced, and ``os.replace`` puts the file in place. The new file gets the mode the umask gives
(0644 under umask 022, 0755 for a library), like any other tool's output; ``keep_mode=True``
(a file rewritten in place) keeps the existing file's mode. On any failure the existing target
is untouched and no temp file is left. A missing folder, a directory in the way, a folder that
cannot be written and a full disk are each an ``OpBridgeError`` naming the path and the fix.

Example:
    >>> import os, tempfile
    >>> from bridge.core.basics.files import load_model, save_model, write_json
    >>> import onnx
    >>> folder = tempfile.mkdtemp()
    >>> graph = onnx.helper.make_graph([], "g", [], [])
    >>> path = save_model(onnx.helper.make_model(graph), os.path.join(folder, "m.onnx"))
    >>> load_model(path).graph.name
    'g'
    >>> old = os.umask(0o022)
    >>> oct(os.stat(write_json(os.path.join(folder, "r.json"), {"ok": True})).st_mode & 0o777)
    '0o644'
    >>> _ = os.umask(old)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
import struct
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import BinaryIO

import numpy as np
import onnx
from onnx import external_data_helper

from bridge.core.basics.errors import OpBridgeError

SINGLE_FILE_LIMIT = 1 << 31  # NOTE: protobuf cannot serialise a message past 2 GiB: bigger models use external data

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


# --- loading ------------------------------------------------------------------------------------------

def load_model(model: str | os.PathLike | bytes | onnx.ModelProto, *,
               external_data: bool = True) -> onnx.ModelProto:
    """The model in ``model`` (a path, the bytes of a file, or a proto, which is copied).

    A path that is missing, a folder, unreadable, or not an ONNX model is an ``OpBridgeError`` with
    one message per cause. ``external_data=False`` leaves tensors stored beside the file unloaded.

    Example:
        >>> load_model("nowhere.onnx")
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: no ONNX file at 'nowhere.onnx'. Got a path that does ...
        >>> load_model(b"not a model")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: the model bytes are not a readable ONNX model ...
    """
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, (bytes, bytearray, memoryview)):
        _refuse_ort_format(bytes(model[:8]), "the model bytes")
        return _parse(lambda: onnx.load_from_string(bytes(model)), "the model bytes",
                      "Pass the bytes of a saved .onnx file.")
    path = check_model_file(model)
    with open(path, "rb") as f:
        _refuse_ort_format(f.read(8), repr(path))
    return _parse(lambda: onnx.load(path, load_external_data=external_data), repr(path), "Export it again.")


def load_external_data(proto: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Load into ``proto`` (read from ``path`` with ``external_data=False``) the tensors its file stores beside
    it; a data file missing or cut short is the ``OpBridgeError`` :func:`load_model` gives for it."""
    def load() -> onnx.ModelProto:
        external_data_helper.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
        return proto
    _parse(load, repr(os.fspath(path)), "Export it again.")


def check_external_data(tensors: Iterable[onnx.TensorProto], path: str | os.PathLike) -> None:
    """Each of ``tensors`` (a model's, read from ``path``) stored beside the file has its data file there, holding
    its bytes (a stat per file, nothing read); else the ``OpBridgeError`` :func:`load_model` gives for it.

    >>> t = onnx.TensorProto(name="w", data_location=onnx.TensorProto.EXTERNAL)
    >>> _ = t.external_data.add(key="location", value="gone.data")
    >>> check_external_data([t], "m.onnx")
    Traceback (most recent call last):
    ...
    bridge.core.basics.errors.OpBridgeError: opbridge: the external data of 'm.onnx' cannot be read. Got ...
    """
    folder = os.path.dirname(os.path.abspath(path))
    for tensor in tensors:
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        where = os.path.join(folder, info.location)
        size = os.path.getsize(where) if os.path.isfile(where) else None
        if size is None or (info.length is not None and (info.offset or 0) + info.length > size):
            got = "no such file" if size is None else f"a file of {size} bytes"
            raise _external_data_error(repr(os.fspath(path)), f"tensor {tensor.name!r} is stored in "
                                       f"{info.location!r}, {got}")


def check_model_file(path: str | os.PathLike) -> str:
    """``path`` as a string, once it names a readable file; else the ``OpBridgeError`` that says what
    it is instead (missing, a folder, unreadable). Cheap: commands check their files before any work.

    >>> check_model_file("nowhere.onnx")
    Traceback (most recent call last):
    ...
    bridge.core.basics.errors.OpBridgeError: opbridge: no ONNX file at 'nowhere.onnx'. Got a path that does not ...
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise OpBridgeError(f"{path!r} is a folder, not an ONNX file. Got a directory. Pass the path of a .onnx file.")
    if os.path.exists(path) and not os.path.isfile(path):
        raise OpBridgeError(f"{path!r} is no regular file (a device, FIFO or socket), not an ONNX file. Got mode "
                            f"{stat.filemode(os.stat(path).st_mode)}. Pass the path of a .onnx file.")
    if not os.path.isfile(path):
        raise OpBridgeError(f"no ONNX file at {path!r}. Got a path that does not exist. "
                            "Export one first with `opbridge export` or bridge.export(...).")
    if not os.access(path, os.R_OK):
        raise OpBridgeError(f"cannot read {path!r}. Got no read permission. Make the file readable "
                            f"(chmod u+r {path}) or run as its owner.")
    return path


def check_library_file(path: str | os.PathLike) -> str:
    """``path`` as a string, once it names a file (a custom-op library to load); else the
    ``OpBridgeError`` that says what it is instead. Cheap: checked before any export.

    >>> check_library_file("no/such/lib.so")
    Traceback (most recent call last):
    ...
    bridge.core.basics.errors.OpBridgeError: opbridge: no native kernel library at 'no/such/lib.so'. Got a missing ...
    """
    text = os.fspath(path)
    if not os.path.exists(text):
        raise OpBridgeError(f"no native kernel library at {text!r}. Got a missing file. Pass the path of a "
                            "custom-op library (.so), or build opbridge's own with `opbridge build -o DIR`.")
    if not os.path.isfile(text):
        raise OpBridgeError(f"the native kernel library {text!r} is not a file. Got a "
                            f"{'folder' if os.path.isdir(text) else 'special file'}. Pass the path of the .so itself.")
    size, need = os.path.getsize(text), _elf_extent(text)
    if need > size:  # NOTE: loading it would map pages past its end: the process dies of SIGBUS
        raise OpBridgeError(f"the native kernel library {text!r} is cut short: its ELF headers describe {need} bytes. "
                            f"Got a file of {size} bytes (an interrupted copy or build). Copy or build it again "
                            "(`opbridge build -o DIR`).")
    return text


def _elf_extent(path: str) -> int:
    """The bytes an ELF file's headers say it holds (header tables and loaded segments); 0 for another file.

    >>> import sys; _elf_extent(sys.executable) > 0, _elf_extent(__file__)
    (True, 0)
    """
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF":
            return 0
        wide, order = head[4:5] == b"\x02", "<" if head[5:6] == b"\x01" else ">"
        if len(head) < (64 if wide else 52):
            return len(head) + 1
        # NOTE: the ELF header's e_phoff, e_shoff, and e_phentsize, e_phnum, e_shentsize, e_shnum
        phoff, shoff = struct.unpack_from(order + ("QQ" if wide else "II"), head, 32 if wide else 28)
        phent, phnum, shent, shnum = struct.unpack_from(order + "HHHH", head, 54 if wide else 42)
        fh.seek(phoff)
        table = fh.read(phent * phnum)
    need = max(phoff + phent * phnum, shoff + shent * shnum)
    # NOTE: a program header's p_offset and p_filesz (64-bit: after p_type, p_flags; 32-bit: p_offset first)
    segment = struct.Struct(order + ("8xQ16xQ" if wide else "4xI8xI"))
    if len(table) == phent * phnum and phent >= segment.size:
        for i in range(phnum):
            offset, filesz = segment.unpack_from(table, i * phent)
            need = max(need, offset + filesz)
    return need


# NOTE: an ORT-format model is a FlatBuffer whose file identifier (bytes 4-8) is "ORTM"
ORT_FORMAT_ID = b"ORTM"


def _refuse_ort_format(head: bytes, what: str) -> None:
    """An ORT-format model (``convert_onnx_models_to_ort``) is no ONNX model: say so, and what opens it."""
    if head[4:8] == ORT_FORMAT_ID:
        raise OpBridgeError(
            f"{what} is an ORT-format model (.ort), not an ONNX model: opbridge reads and checks ONNX files only. "
            "Got the ORT format's identifier 'ORTM'. Open it with onnxruntime.InferenceSession(path, options) "
            "directly (for a file converted with --custom_op_library, first "
            "options.register_custom_ops_library(<libopbridge_ort.so from `opbridge build -o DIR`>)), or give "
            "opbridge the .onnx file it was converted from (docs/toolchain.md).")


def _parse(load: Callable[[], onnx.ModelProto], what: str, fix: str) -> onnx.ModelProto:
    try:
        proto = load()
    except Exception as e:  # noqa: BLE001  truncated, not protobuf, damaged: one message
        if isinstance(e, (FileNotFoundError, onnx.checker.ValidationError)) or "External data" in str(e):
            # NOTE: onnx reads external tensors after the proto: their file is missing, outside the folder or short
            raise _external_data_error(what, f"{type(e).__name__}: {str(e)[:200]}") from None
        raise _unreadable(what, f"{type(e).__name__}: {str(e)[:200]}", fix) from None
    if not proto.HasField("graph"):
        # NOTE: protobuf parses an empty file (and some other bytes) as a message with no graph
        raise _unreadable(what, f"no graph in {proto.ByteSize()} bytes of model fields", fix)
    return proto


def _external_data_error(what: str, got: str) -> OpBridgeError:
    return OpBridgeError(f"the external data of {what} cannot be read. Got {got}. Keep the .data file the model "
                         "names, whole, beside the .onnx file.")


def _unreadable(what: str, got: str, fix: str) -> OpBridgeError:
    verb = "are" if what.endswith("bytes") else "is"
    return OpBridgeError(f"{what} {verb} not a readable ONNX model (truncated or corrupt?). Got {got}. {fix}")


# --- writing ------------------------------------------------------------------------------------------

def check_writable(path: str | os.PathLike, *, what: str = "file") -> str:
    """Raise ``OpBridgeError`` unless a file can be written at ``path``; return the path.

    Call it before expensive work whose result goes to ``path``: a missing folder, a directory in
    the way (a path ending in ``/`` names a folder) and a folder that cannot be written are found
    before anything is computed.

    Example:
        >>> check_writable("no/such/folder/m.onnx")
        Traceback (most recent call last):
        ...
        bridge.core.basics.errors.OpBridgeError: opbridge: cannot write 'no/such/folder/m.onnx': its folder does ...
    """
    shown = os.fspath(path)
    if shown.endswith(os.sep) or os.path.isdir(shown):
        example = os.path.join(shown, f"out{_SUFFIX.get(what, '')}")
        raise OpBridgeError(f"cannot write {shown!r}: it names a folder, not a {what}. Got "
                            f"{'an existing directory' if os.path.isdir(shown) else 'a path ending in /'}. "
                            f"Name a file, e.g. {example}.")
    if os.path.exists(shown) and not os.path.isfile(shown):
        # NOTE: a write replaces the target by a new file: a device or FIFO (/dev/null, /dev/full) would go
        raise OpBridgeError(f"cannot write {shown!r}: it is no regular file (a device, FIFO or socket), which a "
                            f"write would replace. Got mode {stat.filemode(os.stat(shown).st_mode)}. Name a {what} "
                            "path instead.")
    folder = os.path.dirname(shown) or "."
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise OpBridgeError(f"cannot write {shown!r}: its folder is a file. Got {folder!r}, not a directory. "
                                "Write elsewhere, or move that file away.")
        raise OpBridgeError(f"cannot write {shown!r}: its folder does not exist. Got {folder!r}. "
                            f"Create it first (mkdir -p {folder}) or write elsewhere.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _not_writable(shown, folder)
    return shown


def check_folder(path: str | os.PathLike) -> str:
    """Raise ``OpBridgeError`` unless ``path`` is a folder files can be written into, or one that
    can be created (its nearest existing parent is a writable folder); return the path.

    Example:
        >>> import tempfile
        >>> check_folder(tempfile.mkdtemp() + "/new/dist").endswith("dist")
        True
    """
    shown = os.fspath(path)
    existing = os.path.abspath(shown)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        got = "an existing file" if existing == os.path.abspath(shown) else f"a file at {existing!r}"
        raise OpBridgeError(f"cannot write into folder {shown!r}: the path is not a folder. Got {got}. "
                            "Pass a folder (it is created if missing), or move that file away.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _not_writable(shown, existing)
    return shown


def make_folder(path: str | os.PathLike) -> str:
    """``check_folder``, then create the folder and its parents where missing; return the path."""
    shown = check_folder(path)
    with _translated(os.path.join(shown, ".")):
        os.makedirs(shown, exist_ok=True)
    return shown


_SUFFIX = {"model": ".onnx", "report": ".json", "plot": ".png"}


def _not_writable(path: str, folder: str) -> OpBridgeError:
    return OpBridgeError(f"cannot write {path!r}: the folder {folder!r} is not writable (read-only or owned by "
                         "another user). Got a permission error. Write elsewhere, or make the folder writable "
                         f"(chmod u+w {folder}).")


class WriteError(OpBridgeError, OSError):
    """A write the file system refused (disk full, read-only, no permission): an ``OpBridgeError``
    for the user, and still the ``OSError`` (same ``errno``) code that catches those sees."""

    def __init__(self, message: str, errno_: int | None):
        super().__init__(message)
        self.errno = errno_


def _translate(e: OSError, path: str) -> OSError | OpBridgeError:
    """The user-facing error for a failed write; an OSError of another cause stays as it is."""
    folder = os.path.dirname(path) or "."
    if e.errno in _NO_SPACE:
        return WriteError(f"cannot write {path!r}: no space left on the device holding {folder!r}. Got "
                          f"[Errno {e.errno}] {os.strerror(e.errno)}; the existing file, if any, is unchanged. "
                          "Free space there or write elsewhere.", e.errno)
    if e.errno in _NOT_WRITABLE:
        return WriteError(str(_not_writable(path, folder)), e.errno)
    if e.errno == errno.EFBIG:
        return WriteError(f"cannot write {path!r}: it is larger than this process may write (its file-size "
                          f"limit, `ulimit -f`). Got [Errno {e.errno}] {os.strerror(e.errno)}; the existing file, "
                          "if any, is unchanged. Raise the limit (ulimit -f unlimited) or write less.", e.errno)
    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
        try:
            check_writable(path)
        except OpBridgeError as found:
            return found
    return e


@contextlib.contextmanager
def _translated(path: str) -> Iterator[None]:
    """An OSError inside as :func:`_translate` gives it for a write of ``path``."""
    try:
        yield
    except OSError as e:
        if (translated := _translate(e, path)) is not e:
            raise translated from None
        raise


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], *, executable: bool = False,
                 keep_mode: bool = False) -> str:
    """Write ``path`` whole or not at all with ``write(binary_file)``; return the path.

    The file's mode is what the umask gives a new file (``0o666 & ~umask``; ``0o777 & ~umask`` when
    ``executable``); ``keep_mode=True`` keeps the mode (and, where allowed, the owner) of the file
    being replaced. See the module doc for the guarantees.

    Example:
        >>> import os, tempfile
        >>> target = os.path.join(tempfile.mkdtemp(), "a.bin")
        >>> write_atomic(target, lambda fh: fh.write(b"abc")) == target, open(target, "rb").read()
        (True, b'abc')
    """
    return _replace_with(path, _path_fill(write), executable=executable, keep_mode=keep_mode)


def _replace_with(path: str | os.PathLike, fill: Callable[[str], object], *, executable: bool = False,
                  keep_mode: bool = False) -> str:
    """The one write: a new temp file beside ``path`` (mode from the umask), ``fill(temp_path)``,
    fsync, ``os.replace``; on failure the temp file goes and the target stays."""
    return _replace_all([(path, fill, executable, keep_mode)])[0]


# (target, fill(temp path), executable, keep_mode): one file of a write
_Entry = tuple["str | os.PathLike", Callable[[str], object], bool, bool]


def _replace_all(entries: Sequence[_Entry]) -> list[str]:
    """Several files written as one: every temp file is filled and fsynced first, then the files that
    exist are kept aside (hard links), then each temp file replaces its target. A failure at any step
    leaves every target as it was (those already replaced are put back) and no temp file."""
    targets = [check_writable(e[0]) for e in entries]
    staged: list[tuple[str, str]] = []  # (target, temp file)
    try:
        for target, (_, fill, executable, keep_mode) in zip(targets, entries):
            with _translated(target):
                staged.append((target, _stage(target, fill, executable, keep_mode)))
        _commit(staged)
    finally:
        for _, tmp in staged:  # NOTE: only this call's temp files; those moved into place are gone already
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    for folder in dict.fromkeys(os.path.dirname(t) or "." for t in targets):
        _sync_folder(folder)
    return targets


def _hidden(target: str, kind: str) -> str:
    return os.path.join(os.path.dirname(target) or ".", f".{os.path.basename(target)}.{secrets.token_hex(8)}.{kind}")


def _stage(target: str, fill: Callable[[str], object], executable: bool, keep_mode: bool) -> str:
    """A temp file beside ``target`` (mode from the umask, or the target's with ``keep_mode``), filled
    by ``fill`` and fsynced; its path. On failure it is removed."""
    previous = os.stat(target) if keep_mode and os.path.isfile(target) else None
    tmp, created = _hidden(target, "tmp"), False
    try:
        # NOTE: os.open applies the umask itself, as for any new file; O_EXCL never reuses a file
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o777 if executable else 0o666))
        created = True
        fill(tmp)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
            if previous is not None:
                _keep(fd, previous)
        finally:
            os.close(fd)
    except BaseException:
        if created:  # NOTE: only the temp file this call made
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    return tmp


def _commit(staged: Sequence[tuple[str, str]]) -> None:
    """Move each temp file onto its target; with more than one, all or none: the targets that exist are
    first kept aside (a hard link, else a copy), and put back where a later move fails."""
    kept: dict[str, str | None] = {}  # target -> its old file kept aside (None: there was none)
    moved: list[str] = []
    try:
        if len(staged) > 1:
            for target, _ in staged:
                with _translated(target):
                    kept[target] = _keep_aside(target)
        for target, tmp in staged:
            with _translated(target):
                os.replace(tmp, target)
            moved.append(target)
    except BaseException:
        for target in reversed(moved):  # NOTE: put the old files back: the user's pair stays a pair
            with contextlib.suppress(OSError):
                old = kept.get(target)
                if old is None:
                    os.unlink(target)
                else:
                    os.replace(old, target)
                    kept[target] = None
        raise
    finally:
        for old in kept.values():
            if old is not None:
                with contextlib.suppress(OSError):
                    os.unlink(old)


def _keep_aside(target: str) -> str | None:
    """A second name for the file at ``target`` (None where there is no file): a hard link, or, where the
    file system has none, a copy."""
    if not os.path.isfile(target):
        return None
    old = _hidden(target, "old")
    try:
        os.link(target, old)
    except OSError:
        shutil.copy2(target, old)
    return old


def _keep(fd: int, previous: os.stat_result) -> None:
    with contextlib.suppress(PermissionError):  # NOTE: only root may give a file to another owner
        os.fchown(fd, previous.st_uid, previous.st_gid)
    os.fchmod(fd, stat.S_IMODE(previous.st_mode))


def _sync_folder(folder: str) -> None:
    """Make the rename durable (best effort: some file systems refuse fsync on a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes, *, executable: bool = False, keep_mode: bool = False) -> str:
    """Write ``data`` to ``path`` atomically (see ``write_atomic``); return the path."""
    return write_atomic(path, lambda fh: fh.write(data), executable=executable, keep_mode=keep_mode)


def write_text(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically; return the path."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, value, *, indent: int = 2) -> str:
    """Write ``value`` as JSON (with a final newline) to ``path`` atomically; return the path."""
    return write_text(path, json.dumps(value, indent=indent) + "\n")


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> str:
    """Write ``arrays`` as an uncompressed ``.npz`` (what ``numpy.savez`` writes) to ``path`` atomically.

    Any name is a member name (also ``allow_pickle`` or ``file``, which ``numpy.savez`` would take as
    its own arguments); object arrays are refused (a file ``np.load`` must not unpickle).

    Example:
        >>> import os, tempfile
        >>> arrays = {"x": np.arange(3), "allow_pickle": np.ones(1)}
        >>> target = save_npz(os.path.join(tempfile.mkdtemp(), "x.npz"), arrays)
        >>> with np.load(target) as data: [(k, data[k].tolist()) for k in data.files]
        [('x', [0, 1, 2]), ('allow_pickle', [1.0])]
    """
    return write_atomic(path, npz_writer(arrays))


def npz_writer(arrays: Mapping[str, np.ndarray]) -> Callable[[BinaryIO], None]:
    """What writes ``arrays`` as an uncompressed ``.npz`` into a binary file (``save_npz``, or one file
    of ``save_model(..., also=...)``)."""
    def write(fh: BinaryIO) -> None:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in arrays.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)

    return write


def copy_file(src: str | os.PathLike, dst: str | os.PathLike, *, executable: bool = False) -> str:
    """Copy the file ``src`` to ``dst`` atomically, with the umask's mode (see ``write_atomic``)."""
    return write_atomic(dst, _copier(src), executable=executable)


def needs_external_data(proto: onnx.ModelProto) -> bool:
    """True for a model past protobuf's 2 GiB: its tensors must go to a ``.data`` file."""
    return proto.ByteSize() >= SINGLE_FILE_LIMIT


def save_model(proto: onnx.ModelProto, path: str | os.PathLike, *, external: bool | None = None,
               keep_mode: bool = False,
               also: Sequence[tuple[str | os.PathLike, Callable[[BinaryIO], object]]] = ()) -> str:
    """Write ``proto`` to ``path`` atomically; return the path.

    One file, unless the model is past protobuf's 2 GiB (or ``external=True``): then its tensors go
    to ``<name>.data`` beside it. ``also``: more files, each ``(path, write(binary_file))``, written
    with the model as one (its inputs beside it). The model's files and those land together or not at
    all: a failure writing any of them leaves every one as it was.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
        >>> def fails(fh):
        ...     raise ValueError("no inputs to write")
        >>> _ = save_model(model, os.path.join(folder, "m.onnx"), also=[(os.path.join(folder, "m.txt"),
        ...                                                             lambda fh: fh.write(b"old"))])
        >>> model.graph.name = "new"
        >>> save_model(model, os.path.join(folder, "m.onnx"), also=[(os.path.join(folder, "m.txt"), fails)])
        Traceback (most recent call last):
        ...
        ValueError: no inputs to write
        >>> load_model(os.path.join(folder, "m.onnx")).graph.name, sorted(os.listdir(folder))
        ('g', ['m.onnx', 'm.txt'])
    """
    target = check_writable(path, what="model")
    others: list[_Entry] = [(p, _path_fill(write), False, False) for p, write in also]
    if not (needs_external_data(proto) if external is None else external):
        return _replace_all([(target, lambda tmp: onnx.save_model(proto, tmp, format="protobuf"), False, keep_mode),
                             *others])[0]
    folder, name = os.path.split(os.path.abspath(target))
    # NOTE: onnx writes the model and its .data file into a private folder beside the target; the files
    # are then moved into place as one write, so modes and failures follow the one rule
    with _translated(target):
        staging = tempfile.mkdtemp(prefix=".opbridge-", dir=folder)
        try:
            onnx.save_model(proto, os.path.join(staging, name), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=name + ".data", size_threshold=0)
            return _replace_all([
                (target + ".data", _path_fill(_copier(os.path.join(staging, name + ".data"))), False, False),
                (target, _path_fill(_copier(os.path.join(staging, name))), False, keep_mode), *others])[1]
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _path_fill(write: Callable[[BinaryIO], object]) -> Callable[[str], None]:
    def fill(tmp: str) -> None:
        with open(tmp, "r+b") as fh:
            write(fh)
    return fill


def _copier(src: str | os.PathLike) -> Callable[[BinaryIO], None]:
    def write(fh: BinaryIO) -> None:
        with open(src, "rb") as source:
            shutil.copyfileobj(source, fh, 1 << 20)
    return write
