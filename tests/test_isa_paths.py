"""The native kernels' vector ISA paths (ort_kernels/include/opbridge_kernel.h): $OPBRIDGE_ISA picks
each path this CPU runs in one build, the library says which it took (OpbridgeIsa), every path gives
bitwise the same bev_pool_v2 result on 1 and 2 threads, within float32 rounding of a float64
evaluation, and a value naming no path is refused when the library registers."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import bridge
import custom_ops  # noqa: F401
from ort_kernels import build

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import machine  # noqa: E402
from bev_pool_v2 import Pool, bevdet_inputs  # noqa: E402

# NOTE: a child process per path: the library decides its path once per process
CHILD = textwrap.dedent("""
    import ctypes, json, sys
    import numpy as np, onnxruntime as ort
    model, feed_path, library = sys.argv[1:4]
    lib = ctypes.CDLL(library)
    lib.OpbridgeIsa.restype = ctypes.c_char_p
    out = {"isa": lib.OpbridgeIsa().decode()}
    with np.load(feed_path) as f:
        feed = dict(f)
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        try:
            so.register_custom_ops_library(library)
            got = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feed)[0]
        except Exception as e:
            out["error"] = str(e)
            break
        np.save(sys.argv[4] + f".{threads}.npy", got)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("isa")
    # NOTE: 48 channels: full vectors and a remainder on every path
    inputs, shape = bevdet_inputs(depth_bins=12, channels=48, h=8, w=22, grid=(64, 64, 1), seed=3)
    depth, feat, *ranks = inputs
    model = Pool(shape)
    path = tmp / "pool.onnx"
    bridge.export(model, inputs, str(path), functions=False)
    sess = bridge.session(str(path), tier="native")
    feed_path = tmp / "feed.npz"
    np.savez(feed_path, **bridge.parity.ort_feed(sess, inputs))
    with torch.no_grad():
        expected64 = model(depth.double(), feat.double(), *ranks).numpy()
    return tmp, path, feed_path, expected64


def run_path(pool_file, isa: str) -> dict:
    tmp, path, feed_path, _ = pool_file
    env = dict(os.environ, OPBRIDGE_ISA=isa)
    result = subprocess.run([sys.executable, "-c", CHILD, str(path), str(feed_path), str(build.library_path()),
                             str(tmp / isa)], env=env, capture_output=True, text=True, check=True)
    out = json.loads(result.stdout)
    if "error" not in out:
        out["results"] = [np.load(tmp / f"{isa}.{threads}.npy") for threads in (1, 2)]
    return out


@pytest.mark.parametrize("isa", machine.cpu_isa_paths())
def test_each_path_is_taken_and_agrees(pool_file, isa):
    expected64 = pool_file[3]
    out = run_path(pool_file, isa)
    assert out["isa"] == isa
    one, two = out["results"]
    assert np.array_equal(one, two)  # a cell's sum does not depend on how the work was split
    np.testing.assert_allclose(one, expected64, rtol=1e-5, atol=1e-5)
    best = machine.cpu_isa_paths()[0]
    if isa != best:  # the same multiplies and adds in the same order, none fused (-ffp-contract=off)
        assert np.array_equal(one, run_path(pool_file, best)["results"][0])


def test_auto_takes_the_best_path(pool_file):
    assert run_path(pool_file, "auto")["isa"] == machine.cpu_isa_paths()[0]


def test_a_value_naming_no_path_is_refused_at_registration(pool_file):
    out = run_path(pool_file, "sse9")
    assert "OPBRIDGE_ISA names no kernel path. Got 'sse9'" in out["error"]
    assert "auto, avx512, avx2 or baseline" in out["error"]


def test_a_path_named_in_capitals_is_that_path(pool_file):
    lowest = machine.cpu_isa_paths()[-1]
    assert run_path(pool_file, lowest.upper())["isa"] == lowest  # OPBRIDGE_ISA=AVX2 means avx2


# NOTE: a session of opbridge's own library, in a child (the library reads $OPBRIDGE_ISA once per process)
SESSION_CHILD = textwrap.dedent("""
    import sys
    import bridge, custom_ops
    try:
        bridge.session(sys.argv[1], tier="native")
        print("opened")
    except bridge.OpBridgeError as e:
        print(e)
""")


def test_a_refused_value_is_one_sentence_that_blames_the_variable_not_the_library(pool_file):
    # NOTE: red team 4: "... or unset it.. Rebuild it for this onnxruntime." although the library is fine
    env = dict(os.environ, OPBRIDGE_ISA="sse9")
    out = subprocess.run([sys.executable, "-c", SESSION_CHILD, str(pool_file[1])], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == ("opbridge: OPBRIDGE_ISA names no kernel path. Got 'sse9'. Set it to auto, avx512, avx2 or "
                   "baseline (any case), or unset it."), out


def test_cpu_paths_from_flags():
    assert machine.cpu_isa_paths("fpu sse2 avx2 fma") == ["avx2", "baseline"]
    assert machine.cpu_isa_paths("avx2 fma avx512f avx512vl") == ["avx512", "avx2", "baseline"]
    assert machine.cpu_isa_paths("avx2") == ["baseline"]  # no FMA: the AVX2 path needs both
