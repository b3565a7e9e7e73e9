"""The native C++ custom-op library: build, ABI, safety, threads, tooling."""

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import forkserver
import numpy as np
import onnxruntime as ort
import pytest
import torch
from models import pool_case
from op_db import OPS

import bridge
import custom_ops.demo as demo
from ort_kernels import build

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def library():
    return build.library_path()


def test_library_exports_entry_point_and_serves_the_registry(library):
    lib = ctypes.CDLL(str(library))
    assert hasattr(lib, "RegisterCustomOps")
    lib.OpbridgeServedOps.restype = ctypes.c_char_p
    served = lib.OpbridgeServedOps().decode().split()
    expected = [f"{e.spec.domain}::{e.spec.name}:{e.spec.version}:{str(e.dtype).replace('torch.', '')}"
                for e in build.native_entries(bridge.REGISTRY)]
    assert sorted(served) == sorted(expected)
    assert {s.split(":")[2] for s in served if s.startswith("bev::")} == {"bev_pool_v2"}
    # every op of the test table, in each of its dtypes (a mutating op through its functional form)
    table = set()
    for entry in OPS:
        spec = bridge.REGISTRY.functional(entry.spec)
        table |= {f"{spec.domain}::{spec.name}:{spec.version}:{str(d).replace('torch.', '')}" for d in entry.dtypes}
    assert sorted(served) == sorted(table)


def test_library_loads_into_a_plain_onnxruntime_session(library):
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library))  # what any ORT host does


def test_build_is_cached_by_key(library):
    key = build.build_key(build.native_entries(bridge.REGISTRY))
    assert library.parent.name == key
    assert build.library_path() == library


def test_hypothesis_fuzz_never_crashes_and_matches_eager():
    r = forkserver.run([str(ROOT / "tests/scripts/fuzz_native.py"), "200"], env=ENV, timeout=600)
    assert r.returncode == 0, f"fuzz run failed (rc={r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    matched = int(r.stdout.split("fuzz: ")[1].split()[0])
    assert matched >= 50, r.stdout


@pytest.fixture(scope="module")
def demo_native(tmp_path_factory):
    case = demo.build()
    path = tmp_path_factory.mktemp("native") / "demo.onnx"
    bridge.export(case.model, case.args, path, dynamic_shapes=case.dynamic_shapes)
    return case, path


def test_demo_parity_native_tier(demo_native):
    case, _ = demo_native
    report = bridge.check_parity(case.model, case.args, dynamic_shapes=case.dynamic_shapes,
                                 extra_args=case.extra_args, tier="native")
    assert report.passed, report
    assert report.tier == "native" and len(report.outputs) == 3


@pytest.mark.parametrize("threads", [1, 2])
def test_result_does_not_depend_on_intra_op_threads(demo_native, threads):
    case, path = demo_native
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sess = bridge.session(path, tier="native", sess_options=options)
    got = bridge.parity.run_ort(sess, case.args)[0]
    with torch.no_grad():
        assert bridge.compare("out", case.model(*case.args), got).passed


def test_parallel_pass_matches_float64_for_any_thread_count_and_names_the_first_bad_rank():
    """Input large enough for the parallel pass (>= 64k points: tasks of ~4k points, each reading
    ahead): float64 eager agrees, 1 and 2 threads agree bit for bit, out-of-order intervals take the
    serial path to the same answer, and a bad index in a late task is named by its position."""
    model, inputs = pool_case(b=2, n=6, d=20, h=16, w=44, c=16, grid=(64, 64, 2), seed=3)
    assert inputs[2].numel() > 100_000
    intervals = torch.export.Dim("intervals")
    proto = bridge.export(model, inputs, dynamic_shapes=(None,) * 5 + ({0: intervals},) * 2)
    with torch.no_grad():
        expected = model(inputs[0].double(), inputs[1].double(), *inputs[2:]).numpy()
    sessions = {}
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        sessions[threads] = bridge.session(proto, tier="native", sess_options=options)
    got = {t: bridge.parity.run_ort(s, inputs)[0] for t, s in sessions.items()}
    np.testing.assert_array_equal(got[1], got[2])
    np.testing.assert_allclose(got[2], expected, rtol=1e-5, atol=1e-5)
    starts, lengths = inputs[5].flip(0), inputs[6].flip(0)  # cells out of order: the serial path
    np.testing.assert_array_equal(bridge.parity.run_ort(sessions[2], (*inputs[:5], starts, lengths))[0], got[2])
    keep = torch.arange(inputs[5].numel()) != inputs[5].numel() // 2  # a gap: sorted, not a partition
    gap = (*inputs[:5], inputs[5][keep], inputs[6][keep])
    with torch.no_grad():
        expected_gap = model(gap[0].double(), gap[1].double(), *gap[2:]).numpy()
    np.testing.assert_allclose(bridge.parity.run_ort(sessions[2], gap)[0], expected_gap, rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected_gap, expected)  # the dropped interval mattered
    rows = inputs[1].numel() // inputs[1].shape[-1]
    ranks_feat = inputs[3].clone()
    late, early = ranks_feat.numel() - 5, ranks_feat.numel() // 3
    ranks_feat[late] = rows
    with pytest.raises(bridge.OpBridgeError, match=f"'ranks_feat' has value {rows} at position {late},"):
        bridge.parity.run_ort(sessions[2], (*inputs[:3], ranks_feat, *inputs[4:]))
    ranks_feat[early] = -7
    with pytest.raises(bridge.OpBridgeError, match=f"'ranks_feat' has value -7 at position {early},"):
        bridge.parity.run_ort(sessions[2], (*inputs[:3], ranks_feat, *inputs[4:]))


def test_native_tier_names_ops_without_a_kernel(bare_op_model, registry):
    name, path = bare_op_model
    with pytest.raises(bridge.UnsupportedInTier, match=f"no C\\+\\+ kernel for {name}"):
        bridge.session(path, tier="native", registry=registry)


def test_half_conversion_matches_numpy(tmp_path):
    harness = tmp_path / "half.cc"
    harness.write_text(r'''
#include <cstdio>
#include <cstdint>
#include "opbridge_kernel.h"
int main() {
  for (uint32_t h = 0; h < 65536; ++h) { float f = opbridge::half_to_float((uint16_t)h); fwrite(&f, 4, 1, stdout); }
  float f;
  while (fread(&f, 4, 1, stdin) == 1) { uint16_t h = opbridge::float_to_half(f); fwrite(&h, 2, 1, stdout); }
}''')
    exe = tmp_path / "half"
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{build.INCLUDE_DIR}", str(harness),
                    str(build.SOURCE_DIR / "cpu/common.cc"), "-o", str(exe)], check=True)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    floats = np.concatenate([bits.view(np.float32), np.float32([0.0, -0.0, 65504, 65520, 65519.99, 6e-8, 3e-8,
                                                                2.98e-8, np.inf, -np.inf, 1e-45])])
    out = subprocess.run([str(exe)], input=floats.tobytes(), capture_output=True, check=True).stdout
    to_float = np.frombuffer(out[:65536 * 4], np.float32)
    all_half = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(to_float, all_half)  # NaN == NaN for assert_array_equal
    to_half = np.frombuffer(out[65536 * 4:], np.uint16).view(np.float16)
    with np.errstate(over="ignore"):
        expected = floats.astype(np.float16)
    same = (to_half == expected) | (np.isnan(to_half) & np.isnan(expected))
    assert same.all(), floats[~same][:5]


@pytest.mark.long
def test_official_header_switch(tmp_path, monkeypatch):
    monkeypatch.setenv(build.ORT_INCLUDE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(bridge.OpBridgeError, match="must point at a folder holding onnxruntime_c_api.h"):
        build.library_path()
    # a folder with a header of that name: the build takes it through -DOPBRIDGE_OFFICIAL_ORT_HEADERS
    shutil.copy(build.INCLUDE_DIR / "ort_abi_decl.h", tmp_path / "onnxruntime_c_api.h")
    monkeypatch.setenv(build.ORT_INCLUDE_ENV, str(tmp_path))
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    path = build.library_path()
    assert "-DOPBRIDGE_OFFICIAL_ORT_HEADERS" in (path.parent / "build.txt").read_text()
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(path))


def test_doctor_reports_library_and_served_ops(library):
    r = forkserver.run(["-m", "bridge", "doctor"], env=ENV,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert str(library) in r.stdout and "built: yes" in r.stdout and "loads in onnxruntime: yes" in r.stdout
    assert "bev::bev_pool_v2 v1 float32,float16,float64" in r.stdout


@pytest.mark.slow
def test_heavy_native_fuzz():
    r = subprocess.run([sys.executable, str(ROOT / "tests/scripts/fuzz_native.py"), "3000"], capture_output=True,
                       text=True, env=ENV, timeout=1800)
    assert r.returncode == 0, f"fuzz run failed (rc={r.returncode}):\n{r.stderr[-3000:]}"


# NOTE: a fresh process: the user's op joins the global registry, beside the seed ops
BROKEN_KERNEL = """import json, sys
import numpy as np, torch
import bridge, custom_ops

@bridge.op("brokennat::twice", fake=lambda x: torch.empty_like(x), native=sys.argv[1],
           sample_inputs=lambda d: [bridge.SampleInput((torch.ones(3, dtype=d),))])
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2

class Ident(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.identity_conv(x, 2)

class Twice(torch.nn.Module):
    def forward(self, x):
        return twice(x)

out = {}
x = torch.randn(1, 2, 3, 3)
sess = bridge.session(bridge.export(Ident(), (x,)), tier="native")
out["ident"] = bool(np.array_equal(sess.run(None, {"x": x.numpy()})[0], x.numpy()))
try:
    bridge.session(bridge.export(Twice(), (torch.ones(3),)), tier="native")
    out["twice"] = None
except bridge.OpBridgeError as e:
    out["twice"] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


@pytest.mark.long
def test_a_broken_user_kernel_fails_only_the_sessions_that_use_its_op(tmp_path):
    """One user op whose C++ file does not compile: a native session of a model with only identity_conv
    still runs (the library is built without the broken kernel); a session of the broken op's model
    fails naming its file and the compiler's error."""
    source = tmp_path / "twice.cc"
    source.write_text('#include "opbridge_kernel.h"\nnamespace opbridge {\nthis is not C++;\n}\n')
    r = forkserver.run(["-c", BROKEN_KERNEL, str(source)], env=ENV,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = __import__("json").loads(r.stdout.splitlines()[-1])
    assert out["ident"] is True, out
    kind, message = out["twice"]
    assert kind == "BuildError" and "brokennat::twice: its C++ kernel" in message and str(source) in message, message
    assert "does not compile" in message and "this is not C++" in message, message
