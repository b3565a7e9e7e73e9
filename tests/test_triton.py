"""Triton model repository: the written config.pbtxt parses with Triton's own ModelConfig schema
(tritonclient's model_config_pb2) and matches the ONNX file; the copied model runs with the copied library."""

import doctest
import importlib.util
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from tritonclient.utils import np_to_triton_dtype

import bridge.tools.triton as triton
import custom_ops.demo as demo
from bridge.core.basics.errors import OpBridgeError
from bridge.tools import cli
from exporters.export import export
from ort_kernels import build

# NOTE: loaded from its file: `import tritonclient.grpc` needs grpcio (the package's __init__), which
# the schema does not; tritonclient without extras plus onnx's protobuf is all the test needs.
_SPEC = importlib.util.spec_from_file_location(
    "triton_model_config_pb2",
    Path(importlib.util.find_spec("tritonclient").submodule_search_locations[0]) / "grpc" / "model_config_pb2.py")
model_config_pb2 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(model_config_pb2)


def parse_config(model_dir: Path):
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def expected_type(value: onnx.ValueInfoProto) -> str:
    """Triton's own numpy -> data type table (tritonclient), an independent reference to TRITON_TYPES."""
    wire = np_to_triton_dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    return "TYPE_" + ("STRING" if wire == "BYTES" else wire)  # NOTE: BYTES on the wire, TYPE_STRING in configs


def expected_dims(shape, max_batch_size: int) -> list[int]:
    """Dims from onnxruntime's reading of the file (ints, names or None), batch dim dropped if batching."""
    dims = [d if isinstance(d, int) else -1 for d in shape]
    return dims[1:] if max_batch_size > 0 else dims


def check_against_file(config, model_path: Path, max_batch_size: int) -> None:
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    proto = onnx.load(str(model_path), load_external_data=False)
    values = {v.name: v for v in [*proto.graph.input, *proto.graph.output]}
    for section, ort_values in ((config.input, sess.get_inputs()), (config.output, sess.get_outputs())):
        assert [t.name for t in section] == [v.name for v in ort_values]
        for tensor, ort_value in zip(section, ort_values):
            assert model_config_pb2.DataType.Name(tensor.data_type) == expected_type(values[tensor.name])
            dims = expected_dims(ort_value.shape, max_batch_size)
            if dims:
                assert list(tensor.dims) == dims and not tensor.HasField("reshape")
            else:  # Triton wants non-empty dims: a scalar is [1] reshaped to []
                assert list(tensor.dims) == [1] and tensor.HasField("reshape") and list(tensor.reshape.shape) == []


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    case = demo.build()
    export(case.model, case.args, folder / "demo.onnx", dynamic_shapes=case.dynamic_shapes)
    return folder / "demo.onnx", case


def batched_model(path: Path, external: bool = False) -> Path:
    """Every input/output batched along a dynamic first dim; several element types; a per-item scalar."""
    types = {"f32": onnx.TensorProto.FLOAT, "f16": onnx.TensorProto.FLOAT16, "i64": onnx.TensorProto.INT64,
             "b": onnx.TensorProto.BOOL, "u8": onnx.TensorProto.UINT8, "f64": onnx.TensorProto.DOUBLE}
    inputs = [onnx.helper.make_tensor_value_info(n, t, ["batch", "seq", 3] if n == "f32" else ["batch", 5])
              for n, t in types.items()]
    outputs = [onnx.helper.make_tensor_value_info("out_" + n, t, ["batch", "seq", 3] if n == "f32" else ["batch", 5])
               for n, t in types.items()]
    outputs.append(onnx.helper.make_tensor_value_info("count", onnx.TensorProto.FLOAT, ["batch"]))
    weight = onnx.numpy_helper.from_array(np.arange(3 * 4096, dtype=np.float32).reshape(4096, 3) % 7, "w")
    nodes = [onnx.helper.make_node("Identity", [n], ["out_" + n]) for n in types if n != "f32"]
    nodes += [onnx.helper.make_node("Gather", ["w", "zero"], ["row"]),
              onnx.helper.make_node("Add", ["f32", "row"], ["out_f32"]),
              onnx.helper.make_node("ReduceSum", ["f32", "axes"], ["count"], keepdims=0)]
    inits = [weight, onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
             onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "axes")]
    graph = onnx.helper.make_graph(nodes, "batched", inputs, outputs, inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, str(path), save_as_external_data=external, location=path.name + ".data",
                    size_threshold=1024)
    return path


def test_demo_repository_matches_the_file_and_triton_schema(demo_file, tmp_path):
    model_path, case = demo_file
    model_dir = triton.write_repository(tmp_path / "repo", model_path)
    assert model_dir == tmp_path / "repo" / "demo"
    config = parse_config(model_dir)
    assert config.name == "demo" and config.platform == "onnxruntime_onnx" and config.max_batch_size == 0
    check_against_file(config, model_path, 0)
    proto = onnx.load(str(model_path))
    assert len(config.input) == len(proto.graph.input) == 6 and len(config.output) == 1
    library = model_dir / "libopbridge_ort.so"
    assert list(config.model_operations.op_library_filename) == [str(library.resolve())]
    assert os.path.isabs(config.model_operations.op_library_filename[0])
    assert library.read_bytes() == build.library_path().read_bytes()
    assert (model_dir / "1" / "model.onnx").read_bytes() == model_path.read_bytes()


def test_copied_model_runs_with_the_copied_library_as_triton_loads_it(demo_file, tmp_path):
    """What Triton's onnxruntime backend does: register op_library_filename, open 1/model.onnx."""
    model_path, case = demo_file
    model_dir = triton.write_repository(tmp_path / "repo", model_path, name="bev")
    config = parse_config(model_dir)
    options = ort.SessionOptions()
    options.register_custom_ops_library(config.model_operations.op_library_filename[0])
    sess = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    feeds = {t.name: a.numpy() for t, a in zip(config.input, case.args)}
    got = sess.run([config.output[0].name], feeds)[0]
    with torch.no_grad():
        want = case.model(*case.args).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_batched_repository_drops_the_batch_dim(tmp_path):
    model_path = batched_model(tmp_path / "b.onnx")
    served = "/models/batched/libopbridge_ort.so"
    model_dir = triton.write_repository(tmp_path / "repo", model_path, name="batched", max_batch_size=4,
                                        library_path_as_served=served)
    config = parse_config(model_dir)
    assert config.name == "batched" and config.platform == "onnxruntime_onnx" and config.max_batch_size == 4
    check_against_file(config, model_path, 4)
    assert {model_config_pb2.DataType.Name(t.data_type) for t in config.input} == {
        "TYPE_FP32", "TYPE_FP16", "TYPE_INT64", "TYPE_BOOL", "TYPE_UINT8", "TYPE_FP64"}
    assert list(config.input[0].dims) == [-1, 3]
    count = config.output[-1]
    assert count.name == "count" and list(count.dims) == [1] and list(count.reshape.shape) == []
    assert list(config.model_operations.op_library_filename) == [served]


def test_external_data_files_are_copied_beside_the_model(tmp_path):
    model_path = batched_model(tmp_path / "ext.onnx", external=True)
    assert (tmp_path / "ext.onnx.data").is_file()
    model_dir = triton.write_repository(tmp_path / "repo", model_path)
    copy = model_dir / "1" / "ext.onnx.data"
    assert copy.read_bytes() == (tmp_path / "ext.onnx.data").read_bytes()
    sess = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.zeros((2, 4, 3), np.float32)
    feeds = {i.name: np.zeros([2, 5], onnx.helper.tensor_dtype_to_np_dtype(t.type.tensor_type.elem_type))
             for i, t in zip(sess.get_inputs(), onnx.load(str(model_path), load_external_data=False).graph.input)}
    feeds["f32"] = x
    out = sess.run(["out_f32"], feeds)[0]
    np.testing.assert_array_equal(out[0, 0], np.arange(3, dtype=np.float32) % 7)  # row 0 of the external weight


def test_names_with_quotes_backslashes_and_non_ascii_survive_the_text_format(tmp_path):
    names = ['in "1" \\ é', "out\tñ"]
    x = onnx.helper.make_tensor_value_info(names[0], onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info(names[1], onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", [names[0]], [names[1]])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph), tmp_path / "q.onnx")
    config = parse_config(triton.write_repository(tmp_path / "repo", tmp_path / "q.onnx", name="q"))
    assert [config.input[0].name, config.output[0].name] == names


def test_static_batch_dim_with_max_batch_size_is_an_error_and_writes_nothing(demo_file, tmp_path):
    model_path, _ = demo_file
    with pytest.raises(OpBridgeError,
                       match=r"opbridge: with max_batch_size 2 .* 'images' has shape \[1, 6, 3, 8, 22\]"):
        triton.write_repository(tmp_path / "repo", model_path, max_batch_size=2)
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "a/b"}, "one plain path part"),
    ({"name": ".."}, "one plain path part"),
    ({"max_batch_size": -1}, "max_batch_size must be an int >= 0"),
    ({"library_path_as_served": " "}, "library_path_as_served is empty"),
])
def test_bad_arguments_are_errors(tmp_path, kwargs, message):
    model_path = batched_model(tmp_path / "b.onnx")
    with pytest.raises(OpBridgeError, match=message):
        triton.write_repository(tmp_path / "repo", model_path, **kwargs)
    assert not (tmp_path / "repo").exists()


def test_types_without_a_triton_type_and_unserved_custom_nodes_are_errors(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.COMPLEX64, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.COMPLEX64, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph), tmp_path / "c.onnx")
    with pytest.raises(OpBridgeError, match="'x' has ONNX element type COMPLEX64, which Triton has no data type"):
        triton.write_repository(tmp_path / "repo", tmp_path / "c.onnx")
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Nope", ["x"], ["y"], domain="nosuch")], "g", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                          onnx.helper.make_opsetid("nosuch", 1)])
    onnx.save(model, tmp_path / "u.onnx")
    with pytest.raises(OpBridgeError, match=r"Got \['nosuch::Nope'\]"):
        triton.write_repository(tmp_path / "repo", tmp_path / "u.onnx")
    assert not (tmp_path / "repo").exists()


def test_files_get_the_umask_mode(demo_file, tmp_path):
    model_path, _ = demo_file
    old = os.umask(0o022)
    try:
        model_dir = triton.write_repository(tmp_path / "repo", model_path)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in model_dir.rglob("*") if p.is_file()}
    assert modes == {"config.pbtxt": 0o644, "model.onnx": 0o644, "libopbridge_ort.so": 0o755}
    assert not [p for p in model_dir.rglob("*") if p.name.endswith(".tmp")]


def test_cli_build_triton(demo_file, tmp_path, capsys):
    model_path, _ = demo_file
    repo = tmp_path / "repo"
    assert cli.main(["-q", "build", "--triton", str(repo), "--model", str(model_path), "--name", "m",
                     "--library-path", "/models/m/libopbridge_ort.so"]) == 0
    assert "tritonserver --model-repository=" + str(repo) in capsys.readouterr().out
    config = parse_config(repo / "m")
    assert config.name == "m" and list(config.model_operations.op_library_filename) == ["/models/m/libopbridge_ort.so"]
    check_against_file(config, model_path, 0)
    assert cli.main(["-q", "build", "--triton", str(repo), "--model", str(model_path), "--max-batch-size", "3"]) == 2
    assert cli.main(["-q", "build", "--triton", str(repo)]) == 2
    assert cli.main(["-q", "build"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("error: opbridge: ") for line in err)
    assert "has shape [1, 6, 3, 8, 22]" in err[0] and "needs --model FILE" in err[1] and "-o DIR" in err[2]


def test_docstring_examples():
    result = doctest.testmod(triton, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
