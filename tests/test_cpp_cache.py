"""C++ builds under one cache root and one set of rules (bridge.core.cppbuild): the torch-extension cache
(seed-002's torchbind library) and the native kernel cache verify a digest before every load and
rebuild a truncated or planted file; the native key covers $OPBRIDGE_CXXFLAGS and the compiler; and
nothing compiles at import: without a compiler only the C++ op's first use fails, naming g++."""

import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bridge
from bridge.core import cppbuild
from custom_ops import identity_conv
from ort_kernels import build

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, cache: Path, *, compiler: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env.update(OPBRIDGE_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    if not compiler:
        env["PATH"] = str(Path(sys.executable).parent)  # python and the venv's tools: no g++, no c++
    assert compiler or shutil.which("g++", path=env["PATH"]) is None
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=cache.parent, timeout=timeout)


def _seeded_torch_ext(tmp_path: Path) -> Path:
    """A private cache holding a copy of this machine's built torch extension; the copy's .so."""
    built = identity_conv.load_library()  # builds once per machine (default cache)
    cache = tmp_path / "cache"
    folder = cache / "torch_ext" / built.parent.name
    folder.parent.mkdir(parents=True, mode=0o700)
    shutil.copytree(built.parent, folder, ignore=shutil.ignore_patterns("build.lock", "tmp*"))
    return folder / built.name


def _planted_library(tmp_path: Path) -> tuple[Path, Path]:
    """A shared library whose constructor writes a marker file: (library, marker)."""
    marker = tmp_path / "constructor_ran"
    source = tmp_path / "planted.c"
    source.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{ '
                      f'FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    library = tmp_path / "planted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True, timeout=120)
    return library, marker


def test_cache_root_is_the_env_var_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cppbuild.cache_root() == tmp_path / "mine"
    monkeypatch.delenv("OPBRIDGE_CACHE_DIR")
    assert cppbuild.cache_root() == tmp_path / "xdg" / "opbridge"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: a relative path is invalid
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cppbuild.cache_root() == tmp_path / "home" / ".cache" / "opbridge"
    assert build.cache_dir() == tmp_path / "home" / ".cache" / "opbridge" / "native"


def test_native_key_covers_cxxflags_and_the_compiler(monkeypatch, tmp_path):
    monkeypatch.delenv("OPBRIDGE_CXXFLAGS", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    entries = build.cached_entries(bridge.REGISTRY)
    plain, plain_source = build.build_key(entries), build.source_key(entries)
    monkeypatch.setenv("OPBRIDGE_CXXFLAGS", "-DOPBRIDGE_TEST_FLAG=1")
    assert build.build_key(entries) != plain and build.source_key(entries) != plain_source
    monkeypatch.delenv("OPBRIDGE_CXXFLAGS")
    wrapper = tmp_path / "my-cxx"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("g++")} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert build.build_key(entries) != plain and build.source_key(entries) == plain_source
    assert build.build_key(entries).startswith(plain_source + "-")


def test_import_compiles_nothing_and_without_a_compiler_the_cpp_op_names_gpp(tmp_path):
    cache = tmp_path / "cache"
    r = _run("""
        import sys
        import torch, bridge, custom_ops
        import bridge.tools.cli, bridge.tools.commands
        from custom_ops.identity_conv import IdentityConvClass
        print("cpp_extension imported:", "torch.utils.cpp_extension" in sys.modules)

        class Crop(torch.nn.Module):
            def forward(self, x):
                return torch.ops.opbridge.crop(x, [0, 1, 3, 4]) * 2

        report = bridge.check_parity(Crop(), (torch.randn(1, 2, 5, 5),), tier="function")
        print("crop function tier:", report.passed)

        class Conv(torch.nn.Module):
            def forward(self, x):
                return torch.ops.opbridge.identity_conv(x, 3) + 1

        x = torch.randn(1, 3, 4)
        sess = bridge.session(bridge.export(Conv(), (x,)), tier="function")
        print("identity_conv exported and run:", bool((sess.run(None, {"x": x.numpy()})[0] == (x + 1).numpy()).all()))
        for use in (lambda: torch.ops.opbridge.identity_conv(x, 3), lambda: IdentityConvClass(3)):
            try:
                use()
                print("ran")
            except bridge.OpBridgeError as e:
                print("error:", str(e))
        """, cache, compiler=False)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[:3] == ["cpp_extension imported: False", "crop function tier: True",
                         "identity_conv exported and run: True"], r.stdout
    errors = [line for line in lines[3:] if line.startswith("error: ")]
    assert len(errors) == 2 and len(lines) == 5, r.stdout
    for error in errors:
        assert "opbridge::identity_conv" in error and "needs a C++ compiler" in error
        assert "g++" in error and "apt-get install g++" in error
    assert not list(cache.glob("torch_ext/*/*.so")) and not list(cache.glob("native/*/*.so"))


@pytest.mark.long
def test_a_truncated_torch_extension_is_rebuilt_not_loaded(tmp_path):
    library = _seeded_torch_ext(tmp_path)
    good = library.read_bytes()
    library.write_bytes(good[: len(good) // 3])  # loading this would kill the process (SIGBUS)
    r = _run("""
        import torch
        from bridge.core import cppbuild
        from custom_ops.identity_conv import IdentityConvClass, load_library
        x = torch.randn(2, 3, 4)
        print(cppbuild.verified(load_library()), torch.equal(IdentityConvClass(3).forward(x), x))
        """, tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "True"]
    assert "[opbridge] building the C++ library of opbridge::identity_conv and" in r.stderr  # the progress line
    assert cppbuild.verified(library) and library.stat().st_size > len(good) // 3


def test_a_planted_torch_extension_with_a_wrong_digest_is_not_loaded(tmp_path):
    library = _seeded_torch_ext(tmp_path)
    planted, marker = _planted_library(tmp_path)
    shutil.copy(planted, library)  # the digest beside it is the real library's
    r = _run("""
        import torch, bridge
        from custom_ops.identity_conv import load_library
        try:
            load_library()
        except bridge.OpBridgeError as e:
            print(e)
        """, tmp_path / "cache", compiler=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "needs a C++ compiler" in r.stdout and "apt-get install g++" in r.stdout
    assert not marker.exists()  # the planted constructor never ran


@pytest.mark.long
def test_a_truncated_native_library_is_rebuilt_not_loaded_in_a_fresh_process(tmp_path):
    r = _run("""
        import bridge, custom_ops, onnxruntime
        from bridge.core import cppbuild
        from bridge.core.basics.opnames import op_names
        from ort_kernels import build
        spec = bridge.REGISTRY.get("opbridge::identity_conv")
        reg = bridge.Registry()
        bridge.register(spec.overload, sample_inputs=spec.sample_inputs, registry=reg)
        path = build.library_path(reg)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
        again = build.library_path(reg)
        onnxruntime.SessionOptions().register_custom_ops_library(str(again))
        print(again == path, cppbuild.verified(again), again.read_bytes() == data)
        """, tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "True", "True"]


@pytest.mark.long
def test_a_planted_native_library_is_not_loaded_without_a_compiler(tmp_path):
    planted, marker = _planted_library(tmp_path)
    code = """
        import bridge, custom_ops
        from ort_kernels import build
        spec = bridge.REGISTRY.get("opbridge::identity_conv")
        reg = bridge.Registry()
        bridge.register(spec.overload, sample_inputs=spec.sample_inputs, registry=reg)
        try:
            print(build.library_path(reg))
        except bridge.OpBridgeError as e:
            print(e)
        """
    r = _run(code, tmp_path / "cache")  # built with the compiler, then replaced by the planted file
    assert r.returncode == 0, r.stderr[-3000:]
    built = Path(r.stdout.strip())
    shutil.copy(planted, built)
    r = _run(code, tmp_path / "cache", compiler=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "needs a C++ compiler" in r.stdout and "apt-get install g++" in r.stdout
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["torch_ext", "native"])
def test_both_caches_live_under_the_one_root_in_private_folders(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(tmp_path / "root"))
    folder = cppbuild.cache_folder(kind)
    assert folder == tmp_path / "root" / kind and (folder.stat().st_mode & 0o077) == 0


# -- a failed build names its cause -------------------------------------------------------------------------
def _fake_compiler(folder: Path, stderr: str, code: int = 1) -> str:
    """A CXX that answers --version and fails every build, printing ``stderr`` as the compiler would."""
    path = folder / "fake-g++"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'fake g++ 1.0'; exit 0; fi\n"
                    f"cat >&2 <<'EOF'\n{stderr}\nEOF\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


def _native_build_error(monkeypatch, tmp_path, cxx) -> bridge.OpBridgeError:
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(bridge.OpBridgeError) as info:
        build.library_path(bridge.REGISTRY)
    return info.value


@pytest.mark.parametrize("stderr,cause,needles", [
    ("cc1plus: fatal error: error writing to /tmp/ccX.s: No space left on device", "disk",
     ["ran out of disk space", "No space left on device", "Free space"]),
    ("/usr/bin/ld: cannot open output file libopbridge_ort.so: Permission denied", "permission",
     ["could not write its files", "Permission denied", "OPBRIDGE_CACHE_DIR"]),
    ("g++: fatal error: cannot execute 'cc1plus': execvp: No such file or directory", "compiler",
     ["could not run the C++ compiler", "cannot execute 'cc1plus'", "Install g++"]),
    ("kernel.cc:3:1: error: expected ';' before '}' token", "source",
     ["failed in the C++ source", "expected ';'", "Fix the C++ source"]),
])
def test_a_failed_compiler_run_names_its_cause(stderr, cause, needles, monkeypatch, tmp_path):
    """The compiler's own output says why: a full disk, a folder it may not write, a broken compiler
    install, or the source; each gets its own fix (a full disk was told to fix the C++ source)."""
    error = _native_build_error(monkeypatch, tmp_path, _fake_compiler(tmp_path, stderr))
    assert error.cause == cause, error
    assert all(n in str(error) for n in needles), error
    assert cause == "source" or "Fix the C++ source" not in str(error)


@pytest.mark.parametrize("errno_,cause,needle", [(28, "disk", "ran out of disk space"),
                                                 (13, "permission", "could not write its files")])
def test_the_builds_own_file_errors_name_their_cause(errno_, cause, needle, monkeypatch, tmp_path):
    """An OSError of the build's own file work (writing the generated table) by errno: ENOSPC, EACCES."""
    real_write = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "op_table.cc":
            raise OSError(errno_, os.strerror(errno_), str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    error = _native_build_error(monkeypatch, tmp_path, shutil.which("g++") or "g++")
    assert error.cause == cause and needle in str(error) and os.strerror(errno_) in str(error), error


def test_a_cache_root_under_a_file_is_a_folder_error_not_a_source_error(monkeypatch, tmp_path):
    """A cache root that cannot be a folder (a path under a plain file) and no private temp folder to
    fall back on: the error says the build cannot write, and how to point the cache elsewhere."""
    (tmp_path / "plain").write_text("")
    monkeypatch.setattr(cppbuild, "cache_folder", lambda kind: tmp_path / "plain" / kind)
    error = _native_build_error(monkeypatch, tmp_path, shutil.which("g++") or "g++")
    assert error.cause == "permission" and "OPBRIDGE_CACHE_DIR" in str(error), error


def test_a_compiler_that_cannot_start_is_a_compiler_error(monkeypatch, tmp_path):
    """$CXX names a file that exists but cannot run (no exec permission for the loader: not ELF)."""
    bad = tmp_path / "not-a-compiler"
    bad.write_bytes(b"\x00\x01 not a program")
    bad.chmod(0o755)
    monkeypatch.setattr(cppbuild, "_version_line", lambda cxx: "unknown")
    error = _native_build_error(monkeypatch, tmp_path, str(bad))
    assert error.cause == "compiler" and "Install g++" in str(error), error


# -- torch's CUDA-probe line -------------------------------------------------------------------------------
def test_the_cuda_probe_line_is_left_out_of_a_build_only(monkeypatch, capsys):
    """torch.utils.cpp_extension, imported on a CUDA build of torch without a GPU, warns "No CUDA runtime
    is found" (simulated: torch says it was built with CUDA, CUDA_HOME exists): a plain import keeps the
    line; inside a build (without_cuda_probe) it is left out and other output passes on."""
    import logging

    import torch

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("torch.utils.cpp_extension")
    logger.addHandler(handler)
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_HOME", str(Path(__file__).parent))
    monkeypatch.setattr(torch.utils, "cpp_extension", getattr(torch.utils, "cpp_extension", None), raising=False)
    original = sys.modules.get("torch.utils.cpp_extension")
    try:
        for quiet in (False, True):
            monkeypatch.delitem(sys.modules, "torch.utils.cpp_extension", raising=False)
            seen.clear()
            with cppbuild.without_cuda_probe() if quiet else contextlib.nullcontext():
                importlib.import_module("torch.utils.cpp_extension")
                print("the build's own line", file=sys.stderr)
            said = [m for m in seen if cppbuild.CUDA_PROBE_LINE in m]
            assert bool(said) != quiet, (quiet, seen)
            err = capsys.readouterr().err
            assert "the build's own line" in err and cppbuild.CUDA_PROBE_LINE not in err
    finally:
        logger.removeHandler(handler)
        sys.modules.pop("torch.utils.cpp_extension", None)  # NOTE: the simulated import is not kept
        if original is not None:
            sys.modules["torch.utils.cpp_extension"] = original


def test_a_flag_of_opbridge_cxxflags_the_compiler_refuses_is_named_not_the_source(monkeypatch, tmp_path):
    """Before: 'failed in the C++ source ... Fix the C++ source named above', where no source was at fault."""
    monkeypatch.setenv("OPBRIDGE_CXXFLAGS", "--no-such-flag")
    error = _native_build_error(monkeypatch, tmp_path, _fake_compiler(
        tmp_path, "g++: error: unrecognized command-line option '--no-such-flag'"))
    assert error.cause == "flags", error
    assert "compiler refused a flag of $OPBRIDGE_CXXFLAGS ('--no-such-flag'). Got \"unrecognized command-line " \
           "option '--no-such-flag'\". Fix or unset OPBRIDGE_CXXFLAGS." in str(error)
