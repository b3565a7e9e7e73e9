"""bridge.core.basics.files: the one model loader and the one atomic writer, and every CLI artifact through it.

File modes are checked under umask 022 and 077 in a fresh process (the umask is per process); a full
disk is a small tmpfs and a read-only folder a read-only tmpfs (root writes into a chmod-ed folder,
so chmod proves nothing there); both are skipped, with the reason, where mounting is refused.
"""

import ast
import contextlib
import doctest
import errno
import json
import os
import re
import stat
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge.core.basics import files
from bridge.core.basics.errors import OpBridgeError
from bridge.tools import openvino_runtime
from bridge.tools.testing import ModelCase
from ort_kernels import build
from tests.models import HeldOut, held_out_ops

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("bridge", "exporters", "ort_kernels")


class _Ident(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 3) + 1


def big_input_case() -> ModelCase:
    """A small model with a 48 KiB input: its .inputs.npz is far bigger than its .onnx."""
    return ModelCase(_Ident().eval(), (torch.randn(1, 3, 64, 64),))


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _listing(folder) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir())


def _model(n: int = 4) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.arange(n, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mount_tmpfs(folder: Path, options: str):
    """Mount a tmpfs at ``folder`` (created); skip the test with the reason where that is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(r.stderr or r.stdout).strip() or r.returncode}); "
                    "needs root or CAP_SYS_ADMIN")
    return folder


@pytest.fixture
def tmpfs(tmp_path):
    """``make(name, options)``: a tmpfs under tmp_path, unmounted after the test."""
    mounted = []

    def make(name: str, options: str = "size=64k") -> Path:
        mounted.append(mount_tmpfs(tmp_path / name, options))
        return mounted[-1]

    yield make
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(folder: Path, leave: int = 0) -> None:
    """Fill the file system of ``folder`` so that ``leave`` bytes stay free."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with open(folder / "filler", "wb") as fh:
        fh.write(b"\0" * max(free - leave, 0))
    assert os.statvfs(folder).f_bavail * st.f_frsize <= leave


def _cli(*args, cwd=None, umask=None):
    # NOTE: forkserver imported here, not at the top: the commands import this module
    # (`--model tests.test_files:big_input_case`) where tests/ is not on sys.path
    import forkserver

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return forkserver.run(["-m", "bridge", "-q", *map(str, args)], cwd=cwd or ROOT, env=env, timeout=600,
                          umask=umask)


def _one_line_error(r, needle: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: opbridge: ") and needle in lines[0], r.stderr


# --- the writer -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask,plain,executable", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_new_files_get_the_umask_mode(tmp_path, mask, plain, executable):
    with _umask(mask):
        writers = {
            "bytes.bin": lambda p: files.write_bytes(p, b"x"),
            "text.txt": lambda p: files.write_text(p, "x"),
            "r.json": lambda p: files.write_json(p, {"a": 1}),
            "x.npz": lambda p: files.save_npz(p, {"x": np.zeros(2)}),
            "m.onnx": lambda p: files.save_model(_model(), p),
            "copy.txt": lambda p: files.copy_file(tmp_path / "text.txt", p),
        }
        for name, write in writers.items():
            write(tmp_path / name)
            assert _mode(tmp_path / name) == plain, name
        files.copy_file(tmp_path / "bytes.bin", tmp_path / "lib.so", executable=True)
    assert _mode(tmp_path / "lib.so") == executable
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert np.load(tmp_path / "x.npz")["x"].tolist() == [0, 0]
    assert (tmp_path / "copy.txt").read_text() == "x"
    assert _listing(tmp_path) == sorted([*writers, "lib.so"])  # no temp file left


def test_replacing_keeps_the_mode_only_when_asked(tmp_path):
    target = tmp_path / "m.onnx"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    with _umask(0o022):
        files.save_model(_model(), target, keep_mode=True)
        assert _mode(target) == 0o640 and files.load_model(target).graph.name == "g"
        files.save_model(_model(), target)
        assert _mode(target) == 0o644


def test_a_failed_write_leaves_the_target_and_no_temp_file(tmp_path):
    target = tmp_path / "x.npz"
    target.write_bytes(b"old")

    def boom(fh):
        fh.write(b"half")
        raise ValueError("stopped half way")

    with pytest.raises(ValueError, match="half way"):
        files.write_atomic(target, boom)
    assert target.read_bytes() == b"old" and _listing(tmp_path) == ["x.npz"]


def test_a_failed_rename_says_disk_full_and_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OpBridgeError, match=r"no space left on the device holding .*Free space there"):
        files.write_json(target, {"new": True})
    assert target.read_text() == "old" and _listing(tmp_path) == ["r.json"]


@pytest.mark.parametrize("case,needle", [
    ("missing_folder", "its folder does not exist. Got"),
    ("folder_is_a_file", "its folder is a file"),
    ("target_is_a_directory", "it names a folder, not a file. Got an existing directory. Name a file"),
    ("trailing_slash", "it names a folder, not a file. Got a path ending in /"),
])
def test_bad_targets_are_clear_errors(tmp_path, case, needle):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    path = {"missing_folder": tmp_path / "no" / "x.bin", "folder_is_a_file": tmp_path / "a_file" / "x.bin",
            "target_is_a_directory": tmp_path / "a_dir", "trailing_slash": f"{tmp_path}/new/"}[case]
    before = _listing(tmp_path)
    with pytest.raises(OpBridgeError, match=needle) as info:
        files.write_bytes(path, b"x")
    assert str(path) in str(info.value) and _listing(tmp_path) == before


def test_a_read_only_folder_is_a_clear_error(tmp_path, tmpfs):
    if os.geteuid() == 0:  # NOTE: root writes into a chmod 0500 folder; only a read-only mount refuses it
        folder = tmpfs("ro", "size=64k,ro")
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
    with pytest.raises(OpBridgeError, match="is not writable .* Write elsewhere"):
        files.write_bytes(folder / "x.bin", b"x")
    with pytest.raises(OpBridgeError, match="is not writable"):
        files.make_folder(folder / "dist")
    assert _listing(folder) == []


def test_a_full_disk_is_a_clear_error_and_keeps_the_old_file(tmpfs):
    disk = tmpfs("small", "size=64k")
    target = disk / "x.npz"
    files.save_npz(target, {"x": np.arange(10)})
    old = target.read_bytes()
    _fill(disk)
    for write in (lambda: files.save_npz(target, {"x": np.zeros(1 << 16)}),
                  lambda: files.save_model(_model(1 << 14), target),
                  lambda: files.save_model(_model(1 << 14), target, external=True)):
        with pytest.raises(OpBridgeError, match="no space left on the device holding") as info:
            write()
        assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC  # code catching OSError still does
        assert target.read_bytes() == old and _listing(disk) == ["filler", "x.npz"]


# --- models ---------------------------------------------------------------------------------------------

def test_big_models_get_one_data_file_beside_them(tmp_path):
    with _umask(0o022):
        files.save_model(_model(), tmp_path / "m.onnx", external=True)
    assert _listing(tmp_path) == ["m.onnx", "m.onnx.data"]
    assert _mode(tmp_path / "m.onnx") == _mode(tmp_path / "m.onnx.data") == 0o644
    loaded = files.load_model(tmp_path / "m.onnx")
    assert numpy_helper.to_array(loaded.graph.initializer[0]).tolist() == [0, 1, 2, 3]
    shallow = files.load_model(tmp_path / "m.onnx", external_data=False)
    assert onnx.external_data_helper.uses_external_data(shallow.graph.initializer[0])
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(OpBridgeError, match="external data of .* cannot be read.*Keep the .data file"):
        files.load_model(tmp_path / "m.onnx")
    assert not files.needs_external_data(_model())


def test_load_model_says_what_is_wrong(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07garbage" * 3)
    (tmp_path / "a_dir.onnx").mkdir()
    cases = {tmp_path / "missing.onnx": "no ONNX file at", tmp_path / "a_dir.onnx": "is a folder, not an ONNX file",
             tmp_path / "empty.onnx": "not a readable ONNX model (truncated or corrupt?). Got no graph",
             tmp_path / "junk.onnx": "not a readable ONNX model", b"junk": "the model bytes are not a readable"}
    for source, needle in cases.items():
        with pytest.raises(OpBridgeError, match=re.escape(needle)):
            files.load_model(source)
    proto = _model()
    copy = files.load_model(proto)
    copy.graph.name = "changed"
    assert proto.graph.name == "g" and files.load_model(proto.SerializeToString()).graph.name == "g"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file: unreadable files cannot be made")
def test_load_model_unreadable_file(tmp_path):
    path = tmp_path / "m.onnx"
    files.save_model(_model(), path)
    path.chmod(0)
    with pytest.raises(OpBridgeError, match="cannot read .* no read permission"):
        files.load_model(path)


def test_sessions_and_openvino_load_through_files(tmp_path):
    with pytest.raises(OpBridgeError, match="no ONNX file at"):
        bridge.session(tmp_path / "missing.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(OpBridgeError, match="not a readable ONNX model"):
        bridge.session(tmp_path / "empty.onnx")
    with pytest.raises(OpBridgeError, match="no ONNX file at"):
        openvino_runtime.session(tmp_path / "missing.onnx")


def test_export_checks_its_target_before_exporting(tmp_path, monkeypatch):
    def no_export(*a, **k):
        raise AssertionError("torch.export ran for a target that cannot be written")

    monkeypatch.setattr(torch.export, "export", no_export)
    with pytest.raises(OpBridgeError, match="it names a folder, not a model"):
        bridge.export(_Ident(), (torch.randn(1, 3, 4, 4),), tmp_path)


# --- one module for the concern -------------------------------------------------------------------------

def _library_sources():
    for package in LIBRARY:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_the_2_gib_limit_is_written_once():
    spelled = [str(p.relative_to(ROOT)) for p in _library_sources()
               if any(s in p.read_text() for s in ("1 << 31", "2**31", "2 ** 31", "2147483648"))]
    assert spelled == ["bridge/core/basics/files.py"]


# NOTE: the native library's build cache (ort_kernels/build.py) keeps its own private files
# NOTE: cppbuild and the native build stage C++ builds in private cache folders (digest after the file), not user files
_WRITERS_ALLOWED = {"bridge/core/basics/files.py", "bridge/core/cppbuild.py", "ort_kernels/build.py"}
_WRITE_CALLS = {"os.replace", "os.rename", "np.savez", "np.savez_compressed", "numpy.savez", "onnx.save",
                "onnx.save_model", "tempfile.mkstemp", "tempfile.NamedTemporaryFile", "json.dump", "shutil.copy",
                "shutil.copyfile", "shutil.copy2", "shutil.copyfileobj"}


def _writes(call: ast.Call) -> bool:
    name = ast.unparse(call.func)
    if name.startswith("files."):  # the one writer itself
        return False
    if name in _WRITE_CALLS or name.endswith((".write_text", ".write_bytes")):
        return True
    if name.endswith(".savefig"):  # NOTE: a figure is rendered into memory, then written through files
        return ast.unparse(call.args[0]) != "image"
    mode = call.args[1] if name == "open" and len(call.args) > 1 else None
    return isinstance(mode, ast.Constant) and bool(set(str(mode.value)) & set("wax+"))


def test_every_writer_goes_through_files():
    found = [f"{p.relative_to(ROOT)}:{node.lineno} {ast.unparse(node.func)}" for p in _library_sources()
             if str(p.relative_to(ROOT)) not in _WRITERS_ALLOWED
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Call) and _writes(node)]
    assert not found, f"writers outside bridge.core.basics.files: {found}"


def test_files_docstring_examples_run():
    result = doctest.testmod(files, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 6


# --- the CLI's artifacts ----------------------------------------------------------------------------------

_DRIVER = """
import json, sys
from bridge.tools.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    if code != 0:
        sys.exit(f"{argv}: exit {code}")
"""


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_cli_artifacts_get_the_umask_mode(tmp_path, mask):
    # NOTE: one fresh process per umask runs the CLI's main for each command, as `opbridge` does
    plain, executable = 0o666 & ~mask, 0o777 & ~mask
    kept = tmp_path / "kept.onnx"
    commands = [["-q", "export", "--model", "tests.test_files:big_input_case", "-o", str(tmp_path / "m.onnx")],
                ["-q", "inline", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "flat.onnx")],
                ["-q", "attach", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "attached.onnx")],
                ["-q", "attach", str(kept)],
                ["-q", "build", "-o", str(tmp_path / "dist")]]
    bridge.export(_Ident(), (torch.randn(1, 3, 4, 4),), kept, functions=False)
    os.chmod(kept, 0o640)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    import forkserver  # NOTE: here, not at the top: see _cli

    r = forkserver.run(["-c", _DRIVER, json.dumps(commands)], cwd=ROOT, env=env, timeout=900, umask=mask)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("m.onnx", "m.inputs.npz", "flat.onnx", "attached.onnx", "dist/manifest.json"):
        assert _mode(tmp_path / name) == plain, (name, oct(_mode(tmp_path / name)))
    assert _mode(tmp_path / "dist" / build.LIBRARY_NAME) == executable
    assert _mode(kept) == 0o640  # rewritten in place: the user's mode stays
    assert files.load_model(kept).functions  # ... and it did get the bodies
    assert sorted(p.name for p in tmp_path.rglob(".*")) == []  # no temp file anywhere


def test_a_failed_re_export_keeps_the_old_pair(tmp_path, tmpfs):
    disk = tmpfs("small", "size=256k")
    (disk / "m.onnx").write_bytes(b"o")
    np.savez(disk / "m.inputs.npz", x=np.arange(5))
    old = (disk / "m.inputs.npz").read_bytes()
    _fill(disk, leave=16 << 10)  # NOTE: room for the small .onnx, not for the 48 KiB .inputs.npz
    r = _cli("export", "--model", "tests.test_files:big_input_case", "-o", disk / "m.onnx")
    _one_line_error(r, "no space left on the device holding")
    # NOTE: the .onnx fitted, the .inputs.npz write failed: neither lands, the old pair stays whole
    assert (disk / "m.onnx").read_bytes() == b"o" and (disk / "m.inputs.npz").read_bytes() == old
    assert _listing(disk) == ["filler", "m.inputs.npz", "m.onnx"]


# NOTE: the CLI under a file-size limit (a fresh process: the limit is per process); Python ignores
# SIGXFSZ, so a write past the limit is OSError EFBIG
_LIMITED = """
import resource, sys
from bridge.tools.cli import main
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.exit(main(sys.argv[2:]))
"""


def test_a_re_export_failing_at_its_inputs_leaves_the_previous_model_and_inputs(tmp_path):
    # NOTE: red team 4: failing while writing m.inputs.npz (a file-size limit) deleted the new m.onnx,
    # which had already replaced the old one: no model was left
    import forkserver  # NOTE: here, not at the top: see _cli

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    export = ["-q", "export", "--model", "tests.test_files:big_input_case", "-o", str(tmp_path / "m.onnx")]
    r = forkserver.run(["-c", _LIMITED, str(1 << 30), *export], cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    pair = {name: (tmp_path / name).read_bytes() for name in ("m.onnx", "m.inputs.npz")}
    assert len(pair["m.onnx"]) < 24 << 10 < len(pair["m.inputs.npz"])
    r = forkserver.run(["-c", _LIMITED, str(24 << 10), *export], cwd=ROOT, env=env, timeout=600)
    _one_line_error(r, f"cannot write '{tmp_path}/m.inputs.npz': it is larger than this process may write")
    assert {name: (tmp_path / name).read_bytes() for name in ("m.onnx", "m.inputs.npz")} == pair
    assert _listing(tmp_path) == ["m.inputs.npz", "m.onnx"]  # no temp file either


def test_a_pair_whose_second_move_fails_puts_the_first_back(tmp_path, monkeypatch):
    model, inputs = tmp_path / "m.onnx", tmp_path / "m.inputs.npz"
    files.save_model(_model(), model, also=[(inputs, files.npz_writer({"x": np.arange(4)}))])
    before = model.read_bytes(), inputs.read_bytes()
    real_replace, calls = os.replace, []

    def second_move_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", second_move_fails)
    with pytest.raises(OSError, match="Input/output error"):
        files.save_model(_model(8), model, also=[(inputs, files.npz_writer({"x": np.arange(9)}))])
    monkeypatch.undo()
    assert (model.read_bytes(), inputs.read_bytes()) == before  # the first file moved, and was moved back
    assert _listing(tmp_path) == ["m.inputs.npz", "m.onnx"]


@pytest.mark.parametrize("case,needle", [
    ("export_full_disk", "cannot write '{d}/m.onnx': no space left on the device holding '{d}'"),
    ("build_full_disk", "no space left on the device holding '{d}/dist'"),
    ("build_read_only", "cannot write '{d}/dist': the folder '{d}' is not writable"),
])
def test_cli_full_disk_and_read_only_folder_are_one_line_errors(case, needle, tmpfs):
    disk = tmpfs("disk", "size=64k,ro" if case == "build_read_only" else "size=64k")
    if case == "export_full_disk":
        (disk / "m.onnx").write_bytes(b"old")
        _fill(disk)
        r = _cli("export", "--model", "tests.test_files:big_input_case", "-o", disk / "m.onnx")
        assert (disk / "m.onnx").read_bytes() == b"old"
    else:
        r = _cli("build", "-o", disk / "dist")
    _one_line_error(r, needle.format(d=disk))
    assert _listing(disk) == (["filler", "m.onnx"] if case == "export_full_disk" else [])  # no temp file, no dist/


def test_npz_members_may_have_any_name_and_no_objects(tmp_path):
    """Names numpy.savez would take as its own arguments stay members; object arrays are refused."""
    arrays = {"allow_pickle": np.arange(3), "file": np.ones((2, 2), np.float16), "x.y": np.array([True])}
    target = files.save_npz(tmp_path / "x.npz", arrays)
    with np.load(target, allow_pickle=False) as data:
        assert data.files == list(arrays)
        for name, array in arrays.items():
            assert data[name].dtype == array.dtype and data[name].tolist() == array.tolist()
    with pytest.raises(ValueError, match="allow_pickle"):
        files.save_npz(tmp_path / "o.npz", {"o": np.array([object()], dtype=object)})
    assert _listing(tmp_path) == ["x.npz"]


def test_no_path_of_this_machine_in_files_with_derived_bodies(registry, fresh_name, tmp_path):
    # NOTE: derived bodies carry torch.onnx's stack traces; paths were made relative before they were attached
    model = HeldOut(*held_out_ops(registry, fresh_name))
    x = torch.tensor([1.0, -2.0])
    plain, flat = tmp_path / "derived.onnx", tmp_path / "derived_inline.onnx"
    for path, opset in ((plain, 20), (tmp_path / "derived23.onnx", 23)):
        bridge.export(model, (x,), path, registry=registry, opset_version=opset)
    bridge.export(model, (x,), flat, registry=registry, inline=True)
    root = Path(__file__).resolve().parents[1]
    machine = {str(root), os.path.realpath(root), os.path.expanduser("~") + "/", sys.prefix,
               os.path.realpath(sys.prefix), "site-packages", "dist-packages", str(tmp_path)}
    for path in (plain, tmp_path / "derived23.onnx", flat):
        data = path.read_bytes()
        assert b"derived by opbridge" in data or path == flat
        for text in machine:
            assert text.encode() not in data, (path.name, text)


def test_a_device_or_fifo_is_never_replaced_by_a_write(tmp_path):
    """Before: the write's rename put a regular file where the FIFO (or /dev/full, as root) was."""
    fifo, link = tmp_path / "fifo", tmp_path / "null"
    os.mkfifo(fifo)
    link.symlink_to(os.devnull)
    for target in (fifo, link):
        with pytest.raises(OpBridgeError, match=r"it is no regular file \(a device, FIFO or socket\), which a write "
                                                r"would replace\. Got mode [pc]"):
            files.write_json(target, {"a": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(link)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    with pytest.raises(OpBridgeError, match=r"is no regular file \(a device, FIFO or socket\), not an ONNX file\. "
                                            r"Got mode p"):  # NOTE: before: 'a path that does not exist'
        files.check_model_file(fifo)


def _elf_files() -> list[str]:
    import onnxruntime
    folders = (Path(onnxruntime.__file__).parent / "capi", Path(torch.__file__).parent / "lib")
    return [os.path.realpath(sys.executable)] + sorted(str(p) for d in folders for p in d.glob("*.so*"))[:8]


@pytest.mark.parametrize("path", _elf_files(), ids=os.path.basename)
def test_elf_extent_of_real_libraries_fits_them_and_a_cut_copy_falls_short(path, tmp_path):
    """The extent read from the headers never exceeds a whole library (no false "cut short"), and a copy
    one byte shorter than it is named as cut short."""
    size = os.path.getsize(path)
    extent = files._elf_extent(path)
    assert size // 2 < extent <= size
    cut = tmp_path / "cut.so"
    with open(path, "rb") as fh:
        cut.write_bytes(fh.read(extent - 1))
    assert files._elf_extent(str(cut)) > extent - 1
    with pytest.raises(OpBridgeError, match="is cut short: its ELF headers describe"):
        files.check_library_file(cut)


def _elf32(phent: int, phnum: int, segments: list[tuple[int, int]], size: int) -> bytes:
    """A little-endian ELF32 file: header (52 bytes), program headers at 52 (p_type, p_offset, p_vaddr,
    p_paddr, p_filesz, p_memsz, p_flags, p_align), no section headers, padded to ``size``."""
    head = b"\x7fELF" + bytes([1, 1, 1]) + bytes(9)
    head += struct.pack("<HHIIIIIHHHHHH", 3, 3, 1, 0, 52, 0, 0, 52, phent, phnum, 0, 0, 0)
    table = b"".join(struct.pack("<IIIIIIII", 1, offset, 0, 0, filesz, filesz, 5, 4096)[:phent]
                     for offset, filesz in segments)
    return (head + table).ljust(size, b"\0")


def test_elf_extent_reads_32_bit_program_headers_and_survives_hostile_ones(tmp_path):
    elf = tmp_path / "lib32.so"
    elf.write_bytes(_elf32(32, 2, [(0, 120), (200, 100)], 300))
    assert files._elf_extent(str(elf)) == 300
    elf.write_bytes(_elf32(32, 2, [(0, 120), (200, 100)], 299))
    assert files._elf_extent(str(elf)) == 300
    for phent, phnum in ((4, 2), (32, 60000)):  # NOTE: entries too small for a program header; more than the file
        elf.write_bytes(_elf32(phent, phnum, [(0, 120), (200, 100)], 300))
        assert files._elf_extent(str(elf)) == 52 + phent * phnum
    elf.write_bytes(b"\x7fELF\x01")
    assert files._elf_extent(str(elf)) == 6


class _Weighted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 3, 8, 8))

    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 3) + self.w


@pytest.mark.parametrize("damage", ["missing", "cut"])
@pytest.mark.parametrize("tier", bridge.TIERS)
def test_a_session_names_an_unreadable_data_file_not_the_kernels(tier, damage, tmp_path):
    """Before: 'onnxruntime could not load the model ... Check the op kernels for tier ...' (the session loaded
    the data file outside files.py); a data file cut short read as a corrupt model in files.load_model too."""
    x = torch.randn(1, 3, 8, 8)
    proto = bridge.export(_Weighted(), (x,), functions=tier != "native")
    files.save_model(proto, tmp_path / "m.onnx", external=True)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:100]) if damage == "cut" else data.unlink()
    needle = r"^opbridge: the external data of '.*m\.onnx' cannot be read\. Got .*Keep the \.data file the model names"
    for read in (lambda: bridge.session(tmp_path / "m.onnx", tier=tier), lambda: files.load_model(tmp_path / "m.onnx")):
        with pytest.raises(OpBridgeError, match=needle):
            read()
