"""The opbridge CLI as a user runs it: in this process through tests/cli_runner.py (stdout, stderr and
exit status as a subprocess gives them), and in a subprocess where a fresh process is the point
(what gets imported, --ops modules that register ops, exit at import or read sys.argv)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import numpy as np
import pytest
from cli_runner import run as in_process

import bridge
from bridge.core import cppbuild
from bridge.core.basics import installed
from bridge.core.basics.errors import OpBridgeError
from bridge.tools import cli, preflight

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=None):
    """``opbridge ARGS`` in a fresh process (tests/forkserver.py)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return forkserver.run(["-m", "bridge", *args], cwd=cwd or ROOT, env=env, timeout=600)


def test_ops_lists_the_five_seed_ops():
    r = run("ops")
    assert r.returncode == 0, r.stderr
    for name in ("bev::bev_pool_v2", "opbridge::identity_conv", "opbridge::crop", "opbridge::paste",
                 "opbridge::numpy_sin"):
        assert name in r.stdout
    assert "5 ops registered" in r.stdout
    data = json.loads(run("ops", "--json").stdout)
    bev = next(d for d in data if d["op"] == "bev::bev_pool_v2")
    assert bev["tiers"]["function"] and bev["attributes"] == {"bev_feat_shape": "INTS"} and bev["autograd"]


def test_export_run_check_on_the_demo(tmp_path):
    onnx_path = tmp_path / "demo.onnx"
    r = in_process("export", "-o", str(onnx_path))
    assert r.returncode == 0, r.stderr
    assert onnx_path.exists() and (tmp_path / "demo.inputs.npz").exists()
    assert "torch.export done" in r.stderr  # progress lines
    r = in_process("run", str(onnx_path))
    assert r.returncode == 0, r.stderr
    assert "shape [1, 8, 32, 32] float32" in r.stdout
    r = in_process("-q", "check", "--json", str(tmp_path / "report.json"), "--plot", str(tmp_path / "errors.png"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "[run 3]" in r.stdout and "1 passed, 0 failed" in r.stdout
    assert r.stderr == ""
    report = json.loads((tmp_path / "report.json").read_text())
    assert report[0]["passed"] and len(report[0]["outputs"]) == 3
    assert (tmp_path / "errors.png").read_bytes()[:4] == b"\x89PNG"


def test_check_one_op(tmp_path):
    r = in_process("-q", "check", "--op", "opbridge::crop")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") >= 15 and "15 passed, 0 failed" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (("run", "missing.onnx", "--inputs", "x.npz"), "no ONNX file at 'missing.onnx'"),
    (("run", "missing.onnx"), "no ONNX file at 'missing.onnx'"),  # the model first, not its inputs
    (("check", "--model", "nomodule"), "--model must be MODULE:FACTORY"),
    (("check", "--model", "no_such_module:build"), "cannot import module 'no_such_module'. Got "
                                                   "ModuleNotFoundError: No module named 'no_such_module'. Fix the "
                                                   "module, or pass a module name importable from here or a path to "
                                                   "a .py file to --model."),
    (("check", "--op", "bev::bev_pool"), "Did you mean bev::bev_pool_v2"),
    (("--ops", "no_such_module", "ops"), "cannot import op module 'no_such_module'. Got ModuleNotFoundError: "
                                         "No module named 'no_such_module'. Fix"),  # no location inside opbridge
])
def test_errors_are_messages_not_tracebacks(args, needle, tmp_path):
    r = in_process(*args, cwd=tmp_path)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_run_on_a_corrupt_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    (tmp_path / "x.npz").write_bytes(b"")
    r = in_process("run", str(bad), "--inputs", str(tmp_path / "x.npz"))
    assert r.returncode == 2 and "not a readable ONNX model" in r.stderr
    # without inputs beside it, the file's state is still what is said (its inputs would not help)
    r = in_process("run", str(bad))
    assert r.returncode == 2 and "not a readable ONNX model" in r.stderr and "no inputs" not in r.stderr


@pytest.mark.parametrize("argv,needle", [
    (["--bogus"], "unrecognized arguments: --bogus"),  # not "the following arguments are required: command"
    (["--bogus", "ops"], "unrecognized arguments: --bogus"),
    ([], "a command is required"),
])
def test_argument_errors_name_what_is_wrong_first(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


# --- every failure a one-line error, found before the expensive work --------------------------------------

def _one_line_error(r, needle: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: opbridge: ") and needle in lines[0], r.stderr


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """An exported crop model and broken copies: a node with too many inputs, an attribute of the
    wrong type, a recursive model-local function; models with string and sequence outputs."""
    import numpy as np
    import onnx
    import torch
    from onnx import TensorProto as T
    from onnx import helper as h

    import bridge
    import custom_ops  # noqa: F401

    folder = tmp_path_factory.mktemp("bad_files")

    class Crop(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.crop(x, [0, 0, 2, 2]) * 2

    good = bridge.export(Crop(), (torch.randn(1, 3, 4, 4),), folder / "good.onnx")
    many = onnx.ModelProto()
    many.CopyFrom(good)
    crop = next(n for n in many.graph.node if n.op_type == "crop")
    crop.input.append(crop.input[0])
    onnx.save(many, folder / "many_inputs.onnx")
    typed = onnx.ModelProto()
    typed.CopyFrom(good)
    crop = next(n for n in typed.graph.node if n.op_type == "crop")
    del crop.attribute[:]
    crop.attribute.append(h.make_attribute("box", 1.5))
    onnx.save(typed, folder / "wrong_attribute.onnx")
    opsets = [h.make_opsetid("", 20), h.make_opsetid("rec", 1)]
    loop = h.make_function("rec", "loop", ["x"], ["y"], [h.make_node("loop", ["x"], ["y"], domain="rec")], opsets)
    x, y = h.make_tensor_value_info("x", T.FLOAT, [2]), h.make_tensor_value_info("y", T.FLOAT, [2])
    graph = h.make_graph([h.make_node("loop", ["x"], ["y"], domain="rec")], "g", [x], [y])
    onnx.save(h.make_model(graph, opset_imports=opsets, functions=[loop]), folder / "recursive.onnx")
    graph = h.make_graph([h.make_node("Cast", ["x"], ["y"], to=T.STRING)], "g", [x],
                         [h.make_tensor_value_info("y", T.STRING, [2])])
    onnx.save(h.make_model(graph, opset_imports=opsets[:1]), folder / "strings.onnx")
    graph = h.make_graph([h.make_node("SequenceConstruct", ["x", "x"], ["y"])], "g", [x],
                         [h.make_tensor_sequence_value_info("y", T.FLOAT, [2])])
    onnx.save(h.make_model(graph, opset_imports=opsets[:1]), folder / "sequence.onnx")
    np.savez(folder / "x.npz", x=np.array([1.5, -2], np.float32))
    (folder / "a_dir").mkdir()
    return folder


@pytest.mark.parametrize("args,needle", [
    (("check", "--json", "{d}/missing/dir/x.json"), "cannot write '{d}/missing/dir/x.json': its folder does not exist"),
    (("check", "--plot", "{d}/a_dir"), "it names a folder, not a plot"),
    (("attach", "{d}/good.onnx", "-o", "{d}/missing/"), "it names a folder, not a model. Got a path ending in /"),
    (("inline", "{d}/good.onnx", "-o", "{d}/missing/"), "it names a folder, not a model. Got a path ending in /"),
    (("inline", "{d}/good.onnx", "-o", "{d}/no/such/m.onnx"), "its folder does not exist"),
    (("export", "-o", "{d}/a_dir"), "it names a folder, not a model. Got an existing directory. Name a file"),
    (("build", "-o", "{d}/good.onnx"), "cannot write into folder '{d}/good.onnx': the path is not a folder"),
    (("build", "-o", "{d}/good.onnx/dist"), "the path is not a folder. Got a file at"),
])
def test_unwritable_targets_fail_before_the_work(args, needle, bad_files):
    r = in_process("-q", *(a.format(d=bad_files) for a in args))
    _one_line_error(r, needle.format(d=bad_files))
    assert r.stdout == "" and sorted(p.name for p in bad_files.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("command", ["inline", "attach"])
@pytest.mark.parametrize("name,needle", [
    ("many_inputs", "node 'node_crop' (opbridge::crop) has 2 inputs; the op takes 1 to 1"),
    ("wrong_attribute", "node 'node_crop' (opbridge::crop) has attribute 'box' of type FLOAT, the op declares INTS"),
    ("recursive", "Cycle detected in model-local function references: rec::loop -> rec::loop"),
])
def test_broken_models_are_one_line_errors(command, name, needle, bad_files, tmp_path):
    source = tmp_path / f"{name}.onnx"
    source.write_bytes((bad_files / f"{name}.onnx").read_bytes())
    before = source.read_bytes()
    r = in_process("-q", command, str(source))
    _one_line_error(r, needle)
    assert source.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [source.name]


@pytest.mark.parametrize("name,line", [("strings", "y: shape [2] string"), ("sequence", "y: sequence of 2 (float32)")])
def test_run_prints_string_and_sequence_outputs(name, line, bad_files):
    r = in_process("-q", "run", str(bad_files / f"{name}.onnx"), "--inputs", str(bad_files / "x.npz"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[0] == line


@pytest.mark.parametrize("source,needle", [
    ("import sys\nsys.exit('no thanks')\n", "op module 'exits' exited while being imported (sys.exit('no thanks'))"),
    ("import argparse\nargparse.ArgumentParser().add_argument('data')\nimport sys\n"
     "p = argparse.ArgumentParser()\np.add_argument('data')\np.parse_args()\n",
     "exited while being imported (sys.exit(2), after printing"),
])
def test_op_modules_that_exit_at_import(source, needle, tmp_path):
    (tmp_path / "exits.py").write_text(source)
    _one_line_error(run("-q", "--ops", "exits", "ops", cwd=tmp_path), needle)


def test_op_modules_parse_an_empty_argv(tmp_path):
    # NOTE: a module whose argparse runs at import sees the program name only, not opbridge's arguments
    (tmp_path / "parses.py").write_text("import argparse, sys\np = argparse.ArgumentParser()\n"
                                        "p.add_argument('--scale', type=float, default=1.0)\n"
                                        "print('argv', sys.argv[1:], p.parse_args().scale, file=sys.stderr)\n")
    r = run("-q", "--ops", "parses", "ops", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "argv [] 1.0\n", r.stderr
    assert "5 ops registered" in r.stdout


NO_SAMPLES = """
import torch, bridge
@bridge.op("mine::nosamp", dtypes=(torch.float32,))
def nosamp(x: torch.Tensor) -> torch.Tensor:
    return x * 2
@bridge.op("mine::emptysamp", dtypes=(torch.float32,), sample_inputs=lambda dtype: [])
def emptysamp(x: torch.Tensor) -> torch.Tensor:
    return x * 3
"""


@pytest.mark.parametrize("op,needle", [
    ("mine::nosamp",
     "nothing was checked: mine::nosamp has no sample inputs. Got sample_inputs=None. Give the op samples"),
    ("mine::emptysamp", "nothing was checked: the sample inputs of mine::emptysamp are empty"),
])
def test_check_op_without_samples_is_not_a_pass(op, needle, tmp_path):
    (tmp_path / "no_samples.py").write_text(NO_SAMPLES)
    r = run("-q", "--ops", "no_samples", "check", "--op", op, cwd=tmp_path)
    _one_line_error(r, needle)
    assert "passed" not in r.stdout


LYING_FAKE = """
import torch, bridge
@bridge.op("mine::dtfake", fake=lambda x: x.new_empty(x.shape, dtype=torch.float64),
           sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(3).to(dtype),))])
def dtfake(x: torch.Tensor) -> torch.Tensor:
    return x * 2
"""


@pytest.mark.parametrize("tier", ["function", "python"])
def test_check_op_with_a_fake_of_another_dtype_names_the_fake_in_every_tier(tier, tmp_path):
    """The function tier's derived body fails to load against the node the fake types: the error is the fake's
    (before: onnx's 'elem type differs (11) vs (1)'), as the python tier's is."""
    (tmp_path / "lying.py").write_text(LYING_FAKE)
    r = run("-q", "--ops", "lying", "check", "--op", "mine::dtfake", "--tier", tier, cwd=tmp_path)
    _one_line_error(r, "mine::dtfake: its fake kernel says output 0 is float64[3], its forward gives float32[3]")


# --- a fast CLI: the parser loads nothing heavy; prerequisites before any export; --ops anywhere ----------

def test_help_and_argument_errors_load_no_torch():
    code = ("import sys\nfrom bridge.tools import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "try:\n    cli.main(['check', '--no-such-flag'])\nexcept SystemExit as e:\n    assert e.code == 2\n"
            "print('heavy:', sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'numpy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "heavy: []" in r.stdout, r.stdout


def test_ops_option_before_or_after_the_subcommand(tmp_path):
    (tmp_path / "extra_ops.py").write_text("import bridge\nprint('extra ops imported')\n")
    for args in (("--ops", "extra_ops", "ops"), ("ops", "--ops", "extra_ops"),
                 ("-q", "ops", "-q", "--ops", "extra_ops")):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stderr)
        assert "5 ops registered" in r.stdout and "extra ops imported" in r.stderr + r.stdout, args


def test_missing_prerequisites_are_named_before_any_export(monkeypatch):
    # NOTE: onnxruntime-extensions and openvino hidden from the command: both checks fail at once
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("onnxruntime_extensions", "openvino") else real(name, *a))
    runs = [in_process("check", "--tier", "python"), in_process("check", "--inline", "--runtime", "openvino")]
    assert [r.returncode for r in runs] == [2, 2], [r.stdout + r.stderr for r in runs]
    lines = [line for r in runs for line in r.stderr.splitlines() if line.startswith("error:")]
    assert f'-m pip install -e "{ROOT}[python-tier]"' in lines[0] and "openvino" in lines[1], lines
    assert not any("torch.export" in r.stderr or "building" in r.stderr for r in runs)  # no export step started


def test_cache_shows_and_cleans_only_what_opbridge_made(tmp_path, monkeypatch):
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    (cppbuild.cache_folder("native") / "k1").mkdir()
    (cppbuild.cache_folder("native") / "k1" / "lib.so").write_bytes(b"x" * 2048)
    (tmp_path / "cache" / "not-ours").mkdir()
    r = in_process("cache")
    assert r.returncode == 0, r.stderr
    assert "native" in r.stdout and "k1" in r.stdout and "1 entry," in r.stdout and "not-ours" not in r.stdout
    r = in_process("cache", "clean")
    assert r.returncode == 0 and "removed 1 cache folders" in r.stdout, r.stdout + r.stderr
    # NOTE: the root's lock stays (builds and cleans meet on it; removing it would let two of them hold two locks)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [cppbuild.LOCK_NAME, "not-ours"]


def test_ops_lists_without_deriving_unless_asked(tmp_path):
    (tmp_path / "nb_ops.py").write_text(
        "import torch, bridge\n"
        "@bridge.op('nb::double', sample_inputs=lambda dtype: [bridge.SampleInput((torch.ones(3, dtype=dtype),))])\n"
        "def double(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n"
        "@double.register_fake\ndef _(x):\n    return torch.empty_like(x)\n")
    quick = run("--ops", "nb_ops", "ops", "--json", cwd=tmp_path)
    assert quick.returncode == 0, quick.stderr
    assert "derive the ONNX body" not in quick.stderr
    row = next(r for r in json.loads(quick.stdout) if r["op"] == "nb::double")
    assert row["body"] == "derived" and not row["body_tried"] and row["tiers"]["function"]
    full = run("--ops", "nb_ops", "ops", "--bodies", "--json", cwd=tmp_path)
    assert full.returncode == 0 and "derive the ONNX body of nb::double" in full.stderr, full.stderr
    assert next(r for r in json.loads(full.stdout) if r["op"] == "nb::double")["body_tried"]


def test_export_of_a_case_with_a_non_tensor_argument(tmp_path):
    """A --model case whose args hold an int (a constant of the exported file): the .npz holds the tensor
    inputs only, and `opbridge run` runs the pair."""
    (tmp_path / "scaled.py").write_text(
        "import torch, bridge\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x, k):\n"
        "        return torch.ops.opbridge.identity_conv(x, 2) * k\n"
        "def case():\n"
        "    return bridge.ModelCase(M(), (torch.ones(1, 2, 3, 3), 3))\n")
    onnx_path = tmp_path / "scaled.onnx"
    r = in_process("-q", "export", "--model", "scaled:case", "-o", str(onnx_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    with np.load(tmp_path / "scaled.inputs.npz") as data:
        assert data.files == ["x"] and data["x"].shape == (1, 2, 3, 3)
    r = in_process("-q", "run", str(onnx_path), cwd=tmp_path)
    assert r.returncode == 0 and "min 3 max 3" in r.stdout, r.stdout + r.stderr


def test_export_without_bodies_warns_of_ops_no_cpp_kernel_serves(tmp_path, fresh_name):
    # NOTE: a new user's file from --no-functions failed only on the deploying machine ("is not a registered
    # function/op"); the export now says which op opbridge's library cannot serve there
    runs = {}
    for flags in ((), ("--no-functions",)):
        name = fresh_name("twice")
        (tmp_path / f"{name.replace('::', '_')}.py").write_text(
            "import torch, bridge\n"
            f"@torch.library.custom_op({name!r}, mutates_args=())\n"
            "def twice(x: torch.Tensor) -> torch.Tensor:\n"
            "    return x * 2\n"
            "twice.register_fake(lambda x: torch.empty_like(x))\n"
            f"bridge.register({name!r})\n"
            "class M(torch.nn.Module):\n"
            "    def forward(self, x):\n"
            "        return twice(torch.ops.opbridge.identity_conv(x, 2))\n"
            "def case():\n"
            "    return bridge.ModelCase(M(), (torch.ones(1, 2, 3, 3),))\n")
        runs[flags] = name, in_process("-q", "export", "--model", f"{name.replace('::', '_')}:case", *flags, "-o",
                                       "m.onnx", cwd=tmp_path)
    for name, _ in runs.values():  # NOTE: the modules registered their ops in this process's registry
        bridge.REGISTRY.remove(name)
    (_, full), (name, bare) = runs[()], runs[("--no-functions",)]
    assert bare.returncode == full.returncode == 0, bare.stderr + full.stderr
    warned = [line for line in bare.stderr.splitlines() if line.startswith("opbridge: warning:")]
    assert len(warned) == 1 and f"{name} has no C++ kernel" in warned[0], bare.stderr
    assert "Export without --no-functions" in warned[0] and full.stderr == "", full.stderr


# --- the first hour (issue #45): -q quiet, public names, doctor, arguments before work -------------------

BUILDS_AT_IMPORT = ("from bridge.core.basics import progress\n"
                    "with progress.step('building the C++ library of mine::slow', always=True):\n"
                    "    pass\n")


def test_quiet_silences_even_the_build_lines(tmp_path):
    # NOTE: a C++ build prints its line even with progress off (the API default); -q is asked silence
    (tmp_path / "builds.py").write_text(BUILDS_AT_IMPORT)
    loud = in_process("--ops", "builds.py", "cache", cwd=tmp_path)
    assert loud.returncode == 0 and "building the C++ library of mine::slow" in loud.stderr, loud.stderr
    quiet = in_process("-q", "--ops", "builds.py", "cache", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_model_factory_errors_name_the_public_model_case(tmp_path):
    (tmp_path / "wrong.py").write_text("def case():\n    return 42\n")
    r = in_process("check", "--model", "wrong:case", cwd=tmp_path)
    _one_line_error(r, "must return a bridge.testing.ModelCase. Got int.")
    r = in_process("check", "--model", "wrong:nothing", cwd=tmp_path)
    _one_line_error(r, "of a function returning bridge.testing.ModelCase")
    assert "bridge.tools.testing" not in r.stderr


def _hide(monkeypatch, *modules):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else real(name, *a))


def _tier_lines(stdout: str, name: str) -> list[str]:
    """The indented lines doctor prints under ``tier NAME:``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"tier {name}:")) + 1
    end = next((j for j in range(start, len(lines)) if not lines[j].startswith("  ")), len(lines))
    return lines[start:end]


def test_doctor_without_onnxruntime_extensions_says_the_python_tier_serves_nothing(monkeypatch):
    _hide(monkeypatch, "onnxruntime_extensions")
    r = in_process("doctor")
    assert r.returncode == 0, r.stderr
    python = _tier_lines(r.stdout, "python")
    assert len(python) == 1 and "serves no ops here" in python[0] and "needs onnxruntime-extensions" in python[0], python
    assert "serves 5 ops" in _tier_lines(r.stdout, "function")[0]


def test_doctor_without_a_compiler_suggests_no_build(monkeypatch, tmp_path):
    monkeypatch.setenv("OPBRIDGE_CACHE_DIR", str(tmp_path / "cache"))  # nothing built
    monkeypatch.setenv("CXX", "no-such-compiler-45")
    monkeypatch.delenv("OPBRIDGE_NATIVE_LIBRARY", raising=False)
    r = in_process("doctor")
    assert r.returncode == 0, r.stderr
    assert "doctor --build" not in r.stdout
    assert "built: no (no C++ compiler here to build it; tier native below says what to do)" in r.stdout, r.stdout
    native = _tier_lines(r.stdout, "native")
    assert len(native) == 1 and "serves no ops here" in native[0] and "needs a C++ compiler" in native[0], native


def test_doctor_names_each_op_as_ops_does():
    r = in_process("doctor")
    assert r.returncode == 0, r.stderr
    assert "numpy_sin_functional" not in r.stdout
    assert all("opbridge::numpy_sin" in " ".join(_tier_lines(r.stdout, t)) for t in ("function", "native", "python"))


def test_build_manifest_names_each_op_as_ops_does(monkeypatch, tmp_path):
    from ort_kernels import build
    fake = tmp_path / "libfake.so"
    fake.write_bytes(b"\x7fELF")
    monkeypatch.setattr(build, "library_path", lambda *a, **k: fake)  # NOTE: the manifest, not the compile
    r = in_process("-q", "build", "-o", str(tmp_path / "dist"))
    assert r.returncode == 0, r.stderr
    ops = {o["op"]: o for o in json.loads((tmp_path / "dist" / "manifest.json").read_text())["ops"]}
    assert "opbridge::numpy_sin" in ops and ops["opbridge::numpy_sin"]["name"] == "numpy_sin", sorted(ops)


def test_native_library_is_checked_before_any_export(tmp_path):
    r = in_process("check", "--native-library", "nope.so", cwd=tmp_path)
    _one_line_error(r, "no native kernel library at 'nope.so'. Got a missing file.")
    assert "[opbridge]" not in r.stderr and r.stdout == ""  # no import of the ops, no export step
    (tmp_path / "not_a_library.so").write_bytes(b"text")  # there, but onnxruntime cannot load it
    r = in_process("check", "--native-library", "not_a_library.so", cwd=tmp_path)
    _one_line_error(r, "onnxruntime could not load the native library 'not_a_library.so'")
    assert "torch.export" not in r.stderr


# NOTE: each in a fresh interpreter: the point is what a command imports
LIGHT = [("cache",), ("check", "--native-library", "nope.so"), ("run", "missing.onnx"),
         ("export", "-o", "no/such/dir/m.onnx"), ("check", "--model", "nomodule"),
         ("build", "-o", "pyproject.toml")]


def test_cache_and_argument_errors_load_no_torch(tmp_path):
    code = ("import sys\nfrom bridge.tools import cli\n"
            f"codes = [cli.main(list(a)) for a in {LIGHT!r}]\n"
            "print('codes:', codes, 'heavy:', sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    env = dict(os.environ, OPBRIDGE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "codes: [0, 2, 2, 2, 2, 2] heavy: []" in r.stdout, r.stdout + r.stderr
    assert r.stderr.count("error: opbridge: ") == 5, r.stderr


def test_ops_says_which_tiers_this_machine_cannot_run(monkeypatch):
    _hide(monkeypatch, "onnxruntime_extensions")
    r = in_process("ops")
    assert r.returncode == 0, r.stderr
    (line,) = [line for line in r.stdout.splitlines() if line.startswith("note: tier python")]
    assert "runs nothing here: tier 'python' needs onnxruntime-extensions" in line and "-m pip install" in line, line


def test_plot_without_matplotlib_is_named_before_any_export(monkeypatch, tmp_path):
    _hide(monkeypatch, "matplotlib")
    r = in_process("check", "--plot", str(tmp_path / "errors.png"))
    _one_line_error(r, f'plotting needs matplotlib. Got no matplotlib. Install it with `{sys.executable} -m pip install')
    assert r.stdout == ""  # no check ran


def test_the_seed_ops_and_the_demo_come_from_opbridges_entry_points(monkeypatch):
    # NOTE: pyproject.toml names them ([project.entry-points]); the library itself never does
    assert preflight.seed_modules() == ["custom_ops"]
    assert preflight.default_model() == "custom_ops.demo:build"
    monkeypatch.setattr(installed, "entry_points", lambda group: {})  # not installed, or installed before them
    assert preflight.seed_modules() == []
    with pytest.raises(OpBridgeError, match=r"^opbridge: no default --model\. Got no 'demo' entry point in group "
                                                   r"'opbridge\.models'.*Pass --model MODULE:FACTORY"):
        preflight.default_model()


def test_run_without_ops_words_a_failed_guard_from_its_node(registry, fresh_name, tmp_path):
    """``opbridge run`` on a file whose op's module is not imported (no --ops): a bad input fails the body's
    guard, and the one-line error names the op, the input and the check, and says to import the module."""
    from models import rows_file

    path = tmp_path / "rows.onnx"
    name = rows_file(registry, fresh_name, path)
    np.savez(tmp_path / "bad.npz", x=np.ones((4, 3), np.float32), idx=np.array([1, 4]))
    r = in_process("-q", "run", str(path), "--inputs", str(tmp_path / "bad.npz"))
    _one_line_error(r, f"opbridge: {name}: input 'idx' failed its check 0 (values_in) inside the model")
    assert "onnxruntime failed to run" not in r.stderr and f"registers {name} before opening" in r.stderr, r.stderr
    assert "--ops MODULE" in r.stderr, r.stderr


def test_help_reads_as_text_and_a_model_given_to_ops_is_named():
    r = in_process("--help")
    assert "opbridge command line: ops | export" in r.stdout and "``" not in r.stdout
    r = in_process("--ops", "model.onnx", "ops")
    _one_line_error(r, "--ops takes the Python module that registers your ops (a name or a .py file), not a .onnx "
                       "file. Got --ops model.onnx. Pass the file to the command itself")


def test_ops_lists_an_op_whose_fake_lies_and_says_why_it_has_no_body(tmp_path):
    (tmp_path / "lying.py").write_text(LYING_FAKE)
    r = run("-q", "--ops", "lying", "ops", "--json", "--bodies", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    row = next(o for o in json.loads(r.stdout) if o["op"] == "mine::dtfake")
    assert row["body"] == "none" and row["body_note"].startswith("mine::dtfake: its fake kernel says output 0 is "
                                                                 "float64[3], its forward gives float32[3]")
