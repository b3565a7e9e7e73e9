"""The native library cache trusts nothing it did not build: planted, truncated or empty libraries are
rebuilt, locks are never followed through symlinks, unusable caches fall back with a warning, a
missing kernel entry is named, and a built library loads with no compiler on PATH."""

import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import bridge
from bridge.core import cppbuild
from bridge.core.basics.opnames import op_names
from ort_kernels import build

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def small(registry):
    """A registry with one small kernel (identity_conv), so each rebuild here takes seconds."""
    spec = bridge.REGISTRY.get("opbridge::identity_conv")
    bridge.register(spec.overload, sample_inputs=spec.sample_inputs, dtypes=(torch.float32,), registry=registry,
                    native=str(ROOT / "ort_kernels" / op_names(spec.qualname).source_file))
    return registry


def _load_in_subprocess(path: Path) -> subprocess.CompletedProcess:
    code = f"import onnxruntime as ort; ort.SessionOptions().register_custom_ops_library({str(path)!r}); print('ok')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.long
def test_a_damaged_or_planted_library_is_rebuilt_not_loaded(cache, small):
    good = build.library_path(small)
    assert cppbuild.verified(good)
    data = good.read_bytes()
    digest = good.with_name(good.name + ".sha256")
    damages = {"truncated": lambda: good.write_bytes(data[: len(data) // 3]),
               "empty": lambda: good.write_bytes(b""),
               "planted": lambda: (good.write_bytes(b"\x7fELF planted"), digest.unlink())}
    for damage, apply in damages.items():
        apply()
        assert not cppbuild.verified(good), damage
        again = build.library_path(small)
        assert again == good and cppbuild.verified(again) and again.read_bytes() == data, damage
    assert _load_in_subprocess(good).stdout.strip() == "ok"


def test_a_symlinked_lock_is_refused_and_its_target_untouched(cache, small, tmp_path):
    entries = build.cached_entries(small)
    folder = cache / "native" / build.build_key(entries)
    folder.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (folder / "build.lock").symlink_to(victim)
    with pytest.raises(bridge.OpBridgeError, match="could not write its files. Got '.*build.lock: ") as info:
        build.library_path(small)
    assert info.value.cause == "permission"
    assert victim.read_text() == "keep me"


def test_stale_build_folders_are_removed(cache, small):
    path = build.library_path(small)
    stale = path.parent / "tmpdeadbeef"
    stale.mkdir()
    os.utime(stale, (1, 1))
    path.unlink()  # forces a build, which sweeps the folder
    build.library_path(small)
    assert not stale.exists()


@pytest.mark.parametrize("kind", ["file", "world_writable"])
def test_an_unusable_cache_falls_back_to_a_private_folder_with_a_warning(tmp_path, monkeypatch, kind):
    bad = tmp_path / "bad"
    if kind == "file":
        bad.write_text("not a folder")
    else:
        (bad / "native").mkdir(parents=True)
        os.chmod(bad / "native", 0o777)
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(bad))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = build.cache_dir()
    assert any("cannot be used safely" in str(w.message) for w in caught)
    assert folder.is_dir() and not str(folder).startswith(str(bad)) and (folder.stat().st_mode & 0o077) == 0


def test_the_fallback_folder_is_removed_when_the_process_exits(tmp_path):
    """A process whose cache is unusable builds in a private temp folder, gone after it exits."""
    bad = tmp_path / "bad"
    bad.write_text("not a folder")
    code = ("import warnings; warnings.simplefilter('ignore'); from bridge.core import cppbuild; "
            "f = cppbuild.cache_folder('native'); (f / 'lib.so').write_bytes(b'x'); print(f)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OPBRIDGE_CACHE_DIR=str(bad)))
    assert r.returncode == 0, r.stderr
    folder = Path(r.stdout.strip())
    assert folder.name == "native" and folder.parent.name.startswith("opbridge-cache-")
    assert not folder.parent.exists()


def test_a_built_library_loads_without_a_compiler(tmp_path):
    build.library_path()  # the default cache, as a user has it
    code = ("import custom_ops, bridge; from ort_kernels import build; from bridge.core import cppbuild; "
            "p = build.library_path(); print(cppbuild.verified(p))")
    env = dict(os.environ, PATH=str(Path(sys.executable).parent), CXX="no-such-compiler")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("True"), r.stderr[-2000:]


def test_a_kernel_without_its_entry_symbol_is_named(cache, registry, fresh_name, tmp_path):
    name = fresh_name("noentry")
    symbol = op_names(name).symbol
    source = tmp_path / "noentry.cc"
    source.write_text('#include "opbridge_kernel.h"\nnamespace opbridge { int not_the_entry = 0; }\n')

    @bridge.op(name, fake=lambda x: torch.empty_like(x), native=str(source), registry=registry,
               sample_inputs=lambda dtype: [bridge.SampleInput((torch.ones(2, dtype=dtype),))])
    def noentry(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(bridge.OpBridgeError, match=rf"no entry symbol for {symbol}.*noentry.cc must define "
                                                   rf"`extern const KernelDef {symbol}"):
        build.library_path(registry)


# -- a cache read as it is, and a clean beside a build (red team 4) ---------------------------------------
# NOTE: the `small` registry, in a fresh process: the same op table, so the same library key
_SMALL = f"""
import sys, warnings
warnings.simplefilter("error")  # NOTE: a fallback to a temp folder warns: that is a failure here
import onnxruntime, torch, bridge, custom_ops
from bridge.core import cppbuild
from bridge.core.basics.opnames import op_names
from ort_kernels import build
spec = bridge.REGISTRY.get("opbridge::identity_conv")
reg = bridge.Registry()
bridge.register(spec.overload, sample_inputs=spec.sample_inputs, dtypes=(torch.float32,), registry=reg,
                native={str(ROOT / "ort_kernels")!r} + "/" + op_names(spec.qualname).source_file)
path = build.library_path(reg)
onnxruntime.SessionOptions().register_custom_ops_library(str(path))
print(path, cppbuild.verified(path))
"""


def _small_in_subprocess(cache: Path, *, compiler: bool, cxx: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env.update(OPBRIDGE_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    if cxx:
        env["CXX"] = cxx
    if not compiler:
        env["PATH"] = str(Path(sys.executable).parent)  # python and the venv's tools: no g++, no c++
    return subprocess.run([sys.executable, "-c", _SMALL], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture
def read_only_cache(cache, small, tmp_path):
    """A read-only cache (a read-only tmpfs, as a container image or a shared mount is: root cannot write
    it either) holding the small registry's library built here; its root."""
    from tests.test_files import mount_tmpfs

    built = build.library_path(small)
    ro = mount_tmpfs(tmp_path / "ro", "size=16m,mode=0755")
    try:
        shutil.copytree(cache, ro, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock", "tmp*"))
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        yield ro, built.relative_to(cache)
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


@pytest.mark.parametrize("compiler", [False, True])
def test_a_verified_library_in_a_read_only_cache_is_used_as_it_is(read_only_cache, compiler):
    ro, relative = read_only_cache
    r = _small_in_subprocess(ro, compiler=compiler)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [str(ro / relative), "True"]  # no compiler asked for, nothing built, no warning
    assert "building" not in r.stderr


def test_a_verified_library_in_another_users_cache_is_used_without_a_compiler(cache, small):
    built = build.library_path(small)
    for path in (cache, *cache.rglob("*")):
        os.chown(path, 12345, 12345, follow_symlinks=False)  # NOTE: as a shared mount another user filled
    r = _small_in_subprocess(cache, compiler=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [str(built), "True"]


def test_a_clean_while_another_process_builds_waits_for_the_build(cache, tmp_path):
    # NOTE: red team 4: `opbridge cache clean` beside a build failed it with "op_table.cc: No such file or
    # directory. Fix the C++ source"; a compiler that takes seconds keeps the build running meanwhile
    started = tmp_path / "compiling"
    slow = tmp_path / "slow-g++"
    slow.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then exec g++ --version; fi\n"
                    f"touch {started}\nsleep 4\nexec g++ \"$@\"\n")
    slow.chmod(0o755)
    env = dict(os.environ, OPBRIDGE_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), CXX=str(slow))
    # NOTE: the child only builds: the clean, once the build ends, removes what it built
    code = _SMALL.split("onnxruntime.SessionOptions()")[0] + "print('built', path.name)\n"
    builder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not started.exists():
            assert builder.poll() is None and time.monotonic() < deadline, builder.communicate()
            time.sleep(0.1)
        said = []
        gone = cppbuild.clean_cache(waiting=lambda: said.append("waiting"))
        out, err = builder.communicate(timeout=600)
    finally:
        if builder.poll() is None:
            builder.kill()
    assert builder.returncode == 0, err[-3000:]
    assert out.split() == ["built", build.LIBRARY_NAME], err[-3000:]
    assert said == ["waiting"] and [p.name for p in gone] == ["native"]  # the clean waited, then cleaned


def test_a_build_whose_folder_is_removed_under_it_says_so(cache, small, monkeypatch):
    real = build._compile

    def removed_meanwhile(entries, tmp, cxx):
        shutil.rmtree(tmp)  # NOTE: what a cleaner that ignores opbridge's lock does
        return real(entries, tmp, cxx)

    monkeypatch.setattr(build, "_compile", removed_meanwhile)
    with pytest.raises(bridge.OpBridgeError, match="lost its build folder: .* was removed while the compiler ran") \
            as info:
        build.library_path(small)
    assert info.value.cause == "removed" and "Fix the C++ source" not in str(info.value)
