"""The function tier: each custom node runs its model-local ONNX function body (standard ONNX ops),
so plain onnxruntime, or any runtime that inlines functions, runs the file with nothing else."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import torch

from bridge.domains import custom_nodes
from bridge.errors import UnsupportedInTier
from bridge.registry import Registry
from bridge.spec import OpSpec
from exporters.opsets import attach_functions
from ort_kernels.base import Prepared, Tier


class FunctionTier(Tier):
    name = "function"
    summary = "the op's ONNX function body, stored in the model: plain onnxruntime runs the file"

    def why_not(self, spec: OpSpec, dtype: torch.dtype | None = None) -> str | None:
        return None if spec.function is not None else "no function body (register_function / function=)"

    def prepare(self, model: onnx.ModelProto, registry: Registry, options: ort.SessionOptions | None,
                library: str | os.PathLike | None = None) -> Prepared:
        added = attach_functions(model, registry)
        local = {(f.domain, f.name) for f in model.functions}
        missing = [f"{d}::{t}" for d, t in custom_nodes(model) if (d, t) not in local]
        if missing:
            raise UnsupportedInTier(
                f"tier 'function' cannot run {', '.join(missing)}: no model-local function and no "
                f"registered function body. Got ops {missing}. Give the op a function= body "
                "(op.register_function), or use tier='native'."
            )
        return Prepared(options, changed=bool(added))
