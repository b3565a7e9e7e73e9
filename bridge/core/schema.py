"""ONNX OpSchema and type/shape inference derived from an op's torch schema and fake kernel."""

from __future__ import annotations

import onnx
import torch
from onnx import defs, helper

from bridge.core.basics.dtypes import ALL_TENSOR_TYPES, TORCH_TO_ONNX, torch_dtype
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.torch_compat import DimDynamic, FakeTensorMode, ShapeEnv, StatelessSymbolicContext

# NOTE: unknown ONNX dims are given distinct hint sizes >= 2 so the ShapeEnv does not
# specialise them to 0/1; the hint only steers guards, the output stays symbolic.
_HINT_BASE = 11


def build_onnx_schema(spec) -> defs.OpSchema:
    """OpSchema of ``spec``: tensors -> inputs (own type param each), scalars/lists -> attributes."""
    inputs, constraints = [], []
    for p in spec.tensors:
        option = (defs.OpSchema.FormalParameterOption.Optional if p.optional
                  else defs.OpSchema.FormalParameterOption.Single)
        inputs.append(defs.OpSchema.FormalParameter(p.name, f"T_{p.name}", param_option=option))
        constraints.append((f"T_{p.name}", list(ALL_TENSOR_TYPES), f"type of {p.name}"))
    outputs = []
    for i in range(spec.num_outputs):
        outputs.append(defs.OpSchema.FormalParameter(f"out{i}", f"T_out{i}"))
        constraints.append((f"T_out{i}", list(ALL_TENSOR_TYPES), f"type of output {i}"))
    attributes = []
    for p in spec.attributes:
        desc = f"{p.name} ({'bool as 0/1' if p.is_bool else p.attr_type.name})"
        if p.optional:  # NOTE: no ONNX default: an absent attribute is the call's None (Param.absent)
            desc += f"; absent means None{'' if p.default is None else f', the op default {p.default!r} is written'}"
        default = p.onnx_default
        if default is not None:
            attributes.append(defs.OpSchema.Attribute(p.name, default, desc))
        else:
            attributes.append(defs.OpSchema.Attribute(p.name, p.attr_type, desc,
                                                      required=not (p.has_default or p.optional)))
    schema = defs.OpSchema(spec.name, spec.domain, spec.version,
                           spec.doc or f"{spec.qualname} (torch custom op, exported by opbridge)",
                           inputs=inputs, outputs=outputs, type_constraints=constraints,
                           attributes=attributes)
    schema.set_type_and_shape_inference_function(lambda ctx: infer_from_fake(spec, ctx))
    return schema


def _fake_input(mode, type_proto: onnx.TypeProto, first_hint: int, symbols: dict, hints: dict):
    tt = type_proto.tensor_type
    dims, dynamic, params = [], [], []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
            dynamic.append(DimDynamic.STATIC)
        else:
            # NOTE: one dim_param, one hint: the ShapeEnv (duck sizing) gives equal hints one symbol,
            # so dims the model says are equal stay equal in the fake kernel
            dims.append(hints.setdefault(d.dim_param, first_hint + i) if d.HasField("dim_param") else first_hint + i)
            dynamic.append(DimDynamic.DYNAMIC)
        params.append(d.dim_param if d.HasField("dim_param") else None)
    real = torch.empty(dims, dtype=torch_dtype(tt.elem_type), device="meta")
    fake = mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dynamic))
    for size, param in zip(fake.shape, params):
        if isinstance(size, torch.SymInt) and param:
            symbols.setdefault(size.node.expr, param)
    # NOTE: on the CPU, as export ran the kernel: a forward that makes tensors without device= (mmcv's stand-ins,
    # torch.arange(n)) and combines them with its inputs fails on meta inputs
    with mode:
        return fake.to("cpu")


def _output_type(out: torch.Tensor, symbols: dict) -> onnx.TypeProto:
    dims: list = []
    for s in out.shape:
        if isinstance(s, int):
            dims.append(s)
        else:
            expr = s.node.expr
            dims.append(int(expr) if expr.is_number else symbols.get(expr))
    return helper.make_tensor_type_proto(TORCH_TO_ONNX[out.dtype], dims)


def infer_from_fake(spec, ctx) -> None:
    """ONNX type/shape inference for ``spec``'s node, computed by running its fake kernel.

    Input dims with a ``dim_param`` become symbols; an output dim equal to an input
    symbol keeps that name, a derived expression becomes an unnamed dim.
    """
    mode = FakeTensorMode(shape_env=ShapeEnv())
    symbols: dict = {}
    hints: dict = {}
    args: list = []
    index = 0
    for p in spec.params:
        if p.is_tensor:
            present = index < ctx.get_num_inputs() and ctx.has_input(index)
            tp = ctx.get_input_type(index) if present else None
            index += 1
            if tp is None:
                if p.optional:
                    args.append(None)
                    continue
                return  # input type unknown yet: nothing to infer
            if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
                return
            args.append(_fake_input(mode, tp, _HINT_BASE + 8 * index, symbols, hints))
        else:
            attr = ctx.get_attribute(p.name)
            args.append(p.absent if attr is None else p.from_onnx_value(helper.get_attribute_value(attr)))
    positional, keywords = spec.call_args(args)
    try:
        with mode:
            out = spec.overload(*positional, **keywords)
    except OpBridgeError as e:  # NOTE: the op's own check refusing the node: its sentence, as it is
        raise onnx.shape_inference.InferenceError(str(e)) from e
    except Exception as e:  # surfaced by onnx as an InferenceError naming the op
        raise onnx.shape_inference.InferenceError(
            f"opbridge: {spec.qualname}: the fake kernel failed during ONNX shape inference. "
            f"Got {type(e).__name__}: {e}. Make the fake kernel accept these input shapes."
        ) from e
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for i, o in enumerate(outs):
        ctx.set_output_type(i, _output_type(o, symbols))
