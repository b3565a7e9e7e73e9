"""The native library cache trusts nothing it did not build: planted, truncated or empty libraries are
rebuilt, locks are never followed through symlinks, unusable caches fall back with a warning, a
missing kernel entry is named, and a built library loads with no compiler on PATH."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import bridge
from bridge.core import cppbuild
from bridge.core.opnames import op_names
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
