"""A deployed model with no Python and with no compiler: the library `opbridge build -o DIR` writes,
loaded by the C++ host of examples/c_host (ONNX Runtime's C API only) and by a plain onnxruntime
process that cannot reach a compiler or opbridge."""

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import bridge
import custom_ops.demo as demo
from bridge import cli
from ort_kernels import build

ROOT = Path(__file__).resolve().parents[1]
HOST = ROOT / "examples" / "c_host"
ORT_LIBRARY = next((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so*"))

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the library and the host")


def _load_writer():
    spec = importlib.util.spec_from_file_location("write_inputs", HOST / "write_inputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


write_inputs = _load_writer()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """DIR with demo.onnx (no function bodies) + demo.inputs.npz from `opbridge export --no-functions`
    and dist/ (library + manifest) from `opbridge build -o dist`."""
    folder = tmp_path_factory.mktemp("deploy")
    assert cli.main(["export", "--no-functions", "-o", str(folder / "demo.onnx")]) == 0
    assert cli.main(["build", "-o", str(folder / "dist")]) == 0
    return folder


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The C++ host, built with the README's g++ command."""
    exe = tmp_path_factory.mktemp("host") / "run_model"
    start = time.perf_counter()
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", "ort_kernels/include",
                    "examples/c_host/run_model.cc", "-o", str(exe), "-ldl"], cwd=ROOT, check=True, timeout=120)
    print(f"built the C host in {time.perf_counter() - start:.1f} s")
    return exe


def _run_host(host, folder, inputs, library=None, model="demo.onnx"):
    library = library or folder / "dist" / build.LIBRARY_NAME
    return subprocess.run([str(host), str(ORT_LIBRARY), str(library), str(folder / model), str(inputs)],
                          capture_output=True, text=True, timeout=120)


def _python_run(folder, feed):
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(folder / "dist" / build.LIBRARY_NAME))
    sess = ort.InferenceSession(str(folder / "demo.onnx"), options, providers=["CPUExecutionProvider"])
    return dict(zip((o.name for o in sess.get_outputs()), sess.run(None, feed)))


def test_host_header_stays_out_of_the_library_build():
    # the library's cache key hashes ort_kernels/include/*.h: the host header sits one folder down
    assert (build.INCLUDE_DIR / "host" / "ort_host_decl.h").is_file()
    assert "ort_host_decl.h" not in [p.name for p in build.INCLUDE_DIR.glob("*.h")]


def test_c_host_matches_python_on_every_frame(deployed, host, tmp_path):
    model = demo.build()
    with np.load(deployed / "demo.inputs.npz") as data:
        frames = [dict(data)]  # what `opbridge export` wrote, keyed by input name
    names = list(frames[0])
    frames += [dict(zip(names, (a.numpy() for a in args))) for args in model.extra_args]  # other point counts
    for i, feed in enumerate(frames):
        inputs = tmp_path / f"frame{i}.bin"
        inputs.write_bytes(write_inputs.encode(feed))
        r = _run_host(host, deployed, inputs)
        assert r.returncode == 0, r.stderr
        got = write_inputs.parse_outputs(r.stdout)
        want = _python_run(deployed, feed)
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
            print(f"frame {i} {name}: C host vs Python max abs diff {np.abs(got[name] - want[name]).max():.3g}")


def test_c_host_write_inputs_round_trips_the_npz(deployed, tmp_path):
    out = tmp_path / "demo.inputs.bin"
    write_inputs.write_inputs(str(deployed / "demo.inputs.npz"), str(out))
    with np.load(deployed / "demo.inputs.npz") as data:
        assert out.read_bytes() == write_inputs.encode(dict(data))


def test_c_host_errors_are_messages_not_crashes(deployed, host, tmp_path):
    with np.load(deployed / "demo.inputs.npz") as data:
        feed = dict(data)
    good = tmp_path / "good.bin"
    good.write_bytes(write_inputs.encode(feed))
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(good.read_bytes()[:1000])
    feed["ranks_bev"] = feed["ranks_bev"].copy()
    feed["ranks_bev"][7] = 10**9  # a BEV cell far outside the grid: the kernel refuses it
    bad_index = tmp_path / "bad_index.bin"
    bad_index.write_bytes(write_inputs.encode(feed))
    cases = [
        ({"inputs": tmp_path / "missing.bin"}, "No such file"),
        ({"inputs": truncated}, "truncated or not an input file"),
        ({"inputs": deployed / "demo.onnx"}, "not an input file"),
        ({"inputs": good, "library": tmp_path / "missing.so"}, "missing.so"),
        ({"inputs": good, "model": "missing.onnx"}, "missing.onnx"),
        ({"inputs": bad_index}, "bev::bev_pool_v2"),
    ]
    for kwargs, message in cases:
        r = _run_host(host, deployed, **kwargs)
        # the last line is the host's; ONNX Runtime may log the same error before it
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and last.startswith("run_model: ") and message in last, (kwargs, r.stderr)
    r = subprocess.run([str(host)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage:" in r.stderr


# NOTE: -S: site-packages' .pth files (opbridge's editable install among them) are not processed, so
# the process sees onnxruntime and numpy (their folder is put on sys.path) and no opbridge at all.
DEPLOY_SCRIPT = r"""
import sys
sys.path.append(sys.argv[1])
import importlib.util, os, shutil
import numpy as np
import onnxruntime as ort

assert importlib.util.find_spec("bridge") is None and importlib.util.find_spec("ort_kernels") is None
assert not [c for c in ("g++", "gcc", "cc", "c++", "clang") if shutil.which(c)], os.environ["PATH"]
assert "OPBRIDGE_CACHE_DIR" not in os.environ
options = ort.SessionOptions()
options.register_custom_ops_library(sys.argv[2])
sess = ort.InferenceSession(sys.argv[3], options, providers=["CPUExecutionProvider"])
with np.load(sys.argv[4]) as data:
    outputs = sess.run(None, dict(data))
np.save("out.npy", outputs[0])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "bridge", "ort_kernels", "custom_ops", "onnx")))
"""


def test_plain_onnxruntime_without_compiler_or_opbridge_matches_eager(deployed, tmp_path):
    bin_dir, home, work = tmp_path / "bin", tmp_path / "home", tmp_path / "work"
    for d in (bin_dir, home, work):
        d.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)  # the only command on PATH
    site = str(Path(ort.__file__).resolve().parents[1])
    env = {"PATH": str(bin_dir), "HOME": str(home)}
    r = subprocess.run([str(bin_dir / "python"), "-S", "-c", DEPLOY_SCRIPT, site,
                        str(deployed / "dist" / build.LIBRARY_NAME), str(deployed / "demo.onnx"),
                        str(deployed / "demo.inputs.npz")], cwd=work, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]"  # onnxruntime and numpy only: no torch, no opbridge, no onnx
    assert not [p for p in home.rglob("*") if "opbridge" in p.name]  # (onnxruntime keeps a ~/.cache of its own)
    case = demo.build()
    with torch.no_grad():
        eager = case.model(*case.args)
    report = bridge.compare("out", eager, np.load(work / "out.npy"))
    assert report.passed, report
