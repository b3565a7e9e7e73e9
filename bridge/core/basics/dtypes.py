"""The single torch <-> ONNX dtype table; everything else derives from it."""

from __future__ import annotations

import numpy as np
import onnx
import torch

# NOTE: the one place a dtype correspondence is written down; ONNX type strings,
# numpy dtypes and parity tolerances are all derived from these pairs.
TORCH_TO_ONNX: dict[torch.dtype, int] = {
    torch.float32: onnx.TensorProto.FLOAT,
    torch.float16: onnx.TensorProto.FLOAT16,
    torch.float64: onnx.TensorProto.DOUBLE,
    torch.bfloat16: onnx.TensorProto.BFLOAT16,
    torch.int8: onnx.TensorProto.INT8,
    torch.int16: onnx.TensorProto.INT16,
    torch.int32: onnx.TensorProto.INT32,
    torch.int64: onnx.TensorProto.INT64,
    torch.uint8: onnx.TensorProto.UINT8,
    torch.bool: onnx.TensorProto.BOOL,
}
ONNX_TO_TORCH: dict[int, torch.dtype] = {v: k for k, v in TORCH_TO_ONNX.items()}


def onnx_type_str(dtype: torch.dtype) -> str:
    """ONNX type-constraint string for a torch dtype.

    >>> onnx_type_str(torch.float16)
    'tensor(float16)'
    """
    return f"tensor({onnx.helper.tensor_dtype_to_string(TORCH_TO_ONNX[dtype]).split('.')[-1].lower()})"


ALL_TENSOR_TYPES: tuple[str, ...] = tuple(onnx_type_str(d) for d in TORCH_TO_ONNX)


def torch_dtype(elem_type: int) -> torch.dtype:
    """torch dtype of an ONNX element type, with a clear error for the ones torch lacks."""
    try:
        return ONNX_TO_TORCH[elem_type]
    except KeyError:
        name = onnx.helper.tensor_dtype_to_string(elem_type) if elem_type else "UNDEFINED"
        raise TypeError(
            f"opbridge: ONNX element type {name} has no torch dtype here. Got {elem_type}. "
            f"Use one of {sorted(str(d) for d in TORCH_TO_ONNX)}."
        ) from None


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """numpy dtype that carries a torch dtype across onnxruntime (bfloat16: ``ml_dtypes.bfloat16``)."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(TORCH_TO_ONNX[dtype]))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy in its own dtype: bfloat16 as ``ml_dtypes.bfloat16`` (numpy has none;
    onnx's own bfloat16 type), bit for bit, never widened to float32. Shares memory where torch can.

    >>> to_numpy(torch.tensor([1.5, -3.0], dtype=torch.bfloat16)).dtype
    dtype(bfloat16)
    >>> to_numpy(torch.tensor([2**60 + 2])).tolist()
    [1152921504606846978]
    """
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(numpy_dtype(torch.bfloat16))
    return t.numpy()
