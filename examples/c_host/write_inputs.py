"""Write a model's inputs from an .npz into the binary file examples/c_host/run_model.cc reads.

    python examples/c_host/write_inputs.py demo.inputs.npz demo.inputs.bin

Layout (little-endian): b"OPBIN001", uint32 count, then per array: uint32 name length, the name
(UTF-8), int32 ONNX element type, uint32 rank, int64 dims[rank], uint64 byte count, the bytes in
C order. Needs numpy only. ``parse_outputs`` reads back what run_model prints.
"""

from __future__ import annotations

import struct
import sys

import numpy as np

MAGIC = b"OPBIN001"
# numpy dtype -> ONNX TensorProto element type
ONNX_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
              "float16": 10, "float64": 11, "uint32": 12, "uint64": 13}


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    """The file's bytes for ``arrays`` (name -> array), in the dict's order."""
    parts = [MAGIC, struct.pack("<I", len(arrays))]
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype.name not in ONNX_TYPES:
            raise ValueError(f"input {name!r} has dtype {array.dtype}; run_model reads {sorted(ONNX_TYPES)}")
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        key = name.encode()
        parts += [struct.pack("<I", len(key)), key, struct.pack("<iI", ONNX_TYPES[array.dtype.name], array.ndim),
                  struct.pack(f"<{array.ndim}q", *array.shape), struct.pack("<Q", len(data)), data]
    return b"".join(parts)


def write_inputs(npz_path: str, out_path: str) -> None:
    with np.load(npz_path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    with open(out_path, "wb") as fh:
        fh.write(encode(arrays))


def parse_outputs(text: str) -> dict[str, np.ndarray]:
    """run_model's printed outputs as arrays: "output NAME DTYPE [d0,...]" lines, each followed by its values."""
    lines = text.splitlines()
    out = {}
    for i, line in enumerate(lines):
        if line.startswith("output "):
            _, name, dtype, shape = line.split(" ")
            dims = [int(d) for d in shape.strip("[]").split(",") if d]
            out[name] = np.array(lines[i + 1].split(), dtype=dtype).reshape(dims)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python write_inputs.py INPUTS.npz OUT.bin")
    write_inputs(sys.argv[1], sys.argv[2])
