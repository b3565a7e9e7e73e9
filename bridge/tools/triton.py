"""An NVIDIA Triton Inference Server model repository for an exported ONNX file.

``write_repository(REPO, "m.onnx")`` writes::

    REPO/NAME/config.pbtxt          inputs/outputs from the file, model_operations naming the library
    REPO/NAME/1/model.onnx          a copy of the file (and its external-data files, if any)
    REPO/NAME/libopbridge_ort.so    the native custom-op library (every registered op with a C++ kernel)

Triton's onnxruntime backend hands ``model_operations.op_library_filename`` unchanged to ONNX Runtime's
``RegisterCustomOpsLibrary`` (a ``dlopen``): a relative path resolves against the *server's* working
folder, not the model's, and a bare file name is searched on ``LD_LIBRARY_PATH``. So the default is the
absolute path of the copied library; pass ``library_path_as_served`` when the server sees the repository
elsewhere (e.g. ``/models/NAME/libopbridge_ort.so`` inside a container).
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf import text_encoding

from bridge.core.basics import files
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import custom_ops, model_tensors
from bridge.core.registry import REGISTRY
from bridge.tools.sessions import load_model
from ort_kernels import build

CONFIG_NAME = "config.pbtxt"
MODEL_NAME = "model.onnx"
VERSION = "1"
PLATFORM = "onnxruntime_onnx"

# NOTE: the one table of ONNX element type -> Triton DataType (model_config.proto's enum names: the
# ONNX name, floats by width); ONNX types absent here (complex, float8, int4, ...) have no Triton type.
_SAME_NAME = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "STRING")
TRITON_TYPES: dict[int, str] = {getattr(onnx.TensorProto, name): f"TYPE_{name}" for name in _SAME_NAME} | {
    onnx.TensorProto.FLOAT16: "TYPE_FP16", onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16"}


def triton_type(value: onnx.ValueInfoProto) -> str:
    """Triton data type of a graph input or output.

    >>> triton_type(onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2]))
    'TYPE_FP32'
    """
    if not value.type.HasField("tensor_type"):
        raise OpBridgeError(f"Triton serves tensors only; {value.name!r} is not a tensor. Got type "
                            f"{value.type.WhichOneof('value')}. Export a model whose inputs and outputs are tensors.")
    elem = value.type.tensor_type.elem_type
    if elem not in TRITON_TYPES:
        raise OpBridgeError(f"{value.name!r} has ONNX element type {_type_name(elem)}, which Triton has no data "
                            f"type for. Got {elem}. Use one of {sorted(map(_type_name, TRITON_TYPES))}.")
    return TRITON_TYPES[elem]


def _type_name(elem: int) -> str:
    return onnx.helper.tensor_dtype_to_string(elem).split(".")[-1] if elem else "UNDEFINED"


def onnx_dims(value: onnx.ValueInfoProto) -> list[int]:
    """Dimensions of a tensor in the file, -1 for a dynamic one (named or unknown).

    >>> onnx_dims(onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, None]))
    [-1, 3, -1]
    """
    if not value.type.tensor_type.HasField("shape"):
        raise OpBridgeError(f"{value.name!r} has no shape (not even a rank) in the file. Got an unranked tensor. "
                            "Triton needs each tensor's rank: export with shapes (onnx.shape_inference) first.")
    return [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim]


def triton_dims(value: onnx.ValueInfoProto, max_batch_size: int) -> list[int]:
    """The tensor's ``dims`` as Triton reads them: without the batch dim when ``max_batch_size > 0``.

    >>> v = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])
    >>> triton_dims(v, 0), triton_dims(v, 8)
    ([-1, 3], [3])
    """
    dims = onnx_dims(value)
    if max_batch_size <= 0:
        return dims
    if not dims or dims[0] != -1:
        got = f"shape {dims}" if dims else "a scalar"
        raise OpBridgeError(f"with max_batch_size {max_batch_size} Triton takes the first dim of every input and "
                            f"output as the batch dim, so it must be dynamic; {value.name!r} has {got}. Export "
                            "with a dynamic first dim (dynamic_shapes), or use max_batch_size 0.")
    return dims[1:]


def _quote(text: str) -> str:
    return '"' + text_encoding.CEscape(text, as_utf8=True) + '"'


def _tensor_block(value: onnx.ValueInfoProto, max_batch_size: int) -> str:
    dims = triton_dims(value, max_batch_size)
    # NOTE: Triton wants non-empty dims; a scalar (per batch item) is dims [1] reshaped to []
    shape = f"dims: [ {', '.join(map(str, dims))} ]" if dims else "dims: [ 1 ]\n    reshape: { shape: [ ] }"
    return f"  {{\n    name: {_quote(value.name)}\n    data_type: {triton_type(value)}\n    {shape}\n  }}"


def config_text(model: onnx.ModelProto, name: str, *, max_batch_size: int = 0,
                op_library: str | None = None) -> str:
    """``config.pbtxt`` (protobuf text of Triton's ``ModelConfig``) for ``model``.

    >>> x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])
    >>> y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT64, ["n"])
    >>> m = onnx.helper.make_model(onnx.helper.make_graph([], "g", [x], [y]))
    >>> print(config_text(m, "demo", max_batch_size=8, op_library="/models/demo/libopbridge_ort.so"))
    name: "demo"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [
      {
        name: "x"
        data_type: TYPE_FP32
        dims: [ 4 ]
      }
    ]
    output [
      {
        name: "y"
        data_type: TYPE_INT64
        dims: [ 1 ]
        reshape: { shape: [ ] }
      }
    ]
    model_operations {
      op_library_filename: "/models/demo/libopbridge_ort.so"
    }
    <BLANKLINE>
    """
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]  # NOTE: IR < 4 lists weights as inputs
    lines = [f"name: {_quote(name)}", f"platform: {_quote(PLATFORM)}", f"max_batch_size: {max_batch_size}"]
    for section, values in (("input", inputs), ("output", model.graph.output)):
        if values:
            lines.append(f"{section} [\n" + ",\n".join(_tensor_block(v, max_batch_size) for v in values) + "\n]")
    if op_library is not None:
        lines.append(f"model_operations {{\n  op_library_filename: {_quote(op_library)}\n}}")
    return "\n".join(lines) + "\n"


def _external_files(model: onnx.ModelProto, model_path: Path) -> list[str]:
    """Relative locations of the file's external-data tensors, each checked to lie beside the model."""
    locations = {e.value for t in model_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL
                 for e in t.external_data if e.key == "location"}
    folder = model_path.resolve().parent
    for location in sorted(locations):
        where = (folder / location).resolve()
        if Path(location).is_absolute() or folder not in where.parents or not where.is_file():
            raise OpBridgeError(f"{model_path} keeps tensor data in {location!r}, which is not a file beside it. "
                                f"Got {where}. Keep the external-data files in the model's folder (onnx.save_model).")
    return sorted(locations)


def _check_served(model: onnx.ModelProto, registry) -> None:
    """Every custom node runs in Triton: the library serves it, or the file carries its function body."""
    served = set(build.served_ops(registry))
    local = {(f.domain, f.name) for f in model.functions}
    missing = [f"{d}::{t}" for d, t in custom_ops(model) if (d, t) not in served | local]
    if missing:
        raise OpBridgeError(f"the model has custom nodes that neither the native library nor a function body in "
                            f"the file serves. Got {missing}. Import the module that registers them (--ops) or "
                            "export with function bodies attached.")


def _model_name(name: str | None, model_path: Path) -> str:
    name = model_path.stem if name is None else name
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise OpBridgeError(f"the Triton model name is its folder name, so it must be one plain path part. "
                            f"Got {name!r}. Pass --name with letters, digits, '-', '_' or '.'.")
    return name


def write_repository(repo: str | os.PathLike, model_path: str | os.PathLike, *, name: str | None = None,
                     max_batch_size: int = 0, library_path_as_served: str | None = None,
                     registry=None) -> Path:
    """Write ``REPO/NAME/{config.pbtxt, 1/model.onnx, libopbridge_ort.so}`` for Triton; return ``REPO/NAME``.

    ``name`` defaults to the file's stem. With ``max_batch_size > 0`` the first dim of every input and
    output is Triton's batch dim (it must be dynamic in the file). ``library_path_as_served`` is the
    library's path as the *server* sees it (default: the absolute path of the copy written here; see the
    module docstring for how Triton resolves it). ``registry`` defaults to the global one.

    Example:
        >>> import shutil, tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])
        >>> y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])
        >>> graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
        >>> onnx.save(onnx.helper.make_model(graph), folder / "relu.onnx")
        >>> model_dir = write_repository(folder / "repo", folder / "relu.onnx", max_batch_size=8)
        >>> model_dir.name, (model_dir / "config.pbtxt").read_text().count("dims: [ 4 ]")
        ('relu', 2)
        >>> sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*"))
        ['1', '1/model.onnx', 'config.pbtxt', 'libopbridge_ort.so']
        >>> shutil.rmtree(folder)
    """
    model_path = Path(model_path)
    if not isinstance(max_batch_size, int) or max_batch_size < 0:
        raise OpBridgeError(f"max_batch_size must be an int >= 0 (0: Triton does not batch). Got {max_batch_size!r}. "
                            "Pass 0, or the largest batch the model takes along its first dim.")
    if library_path_as_served is not None and not str(library_path_as_served).strip():
        raise OpBridgeError("library_path_as_served is empty. Got ''. Pass the library's path inside the server, "
                            "or leave it out for the repository's own copy.")
    model = load_model(model_path)
    name = _model_name(name, model_path)
    registry = REGISTRY if registry is None else registry
    _check_served(model, registry)
    external = _external_files(model, model_path)
    model_dir = Path(repo) / name
    served_as = library_path_as_served or str((model_dir / build.LIBRARY_NAME).resolve())
    text = config_text(model, name, max_batch_size=max_batch_size, op_library=str(served_as))  # errors before writing
    library = build.library_path(registry, build=True)
    (model_dir / VERSION).mkdir(parents=True, exist_ok=True)
    files.copy_file(library, model_dir / build.LIBRARY_NAME, executable=True)
    for location in external:
        (model_dir / VERSION / location).parent.mkdir(parents=True, exist_ok=True)
        files.copy_file(model_path.parent / location, model_dir / VERSION / location)
    files.copy_file(model_path, model_dir / VERSION / MODEL_NAME)
    files.write_text(model_dir / CONFIG_NAME, text)
    return model_dir
