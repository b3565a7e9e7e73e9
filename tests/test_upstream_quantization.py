"""NVIDIA pytorch-quantization (TensorRT/tools/pytorch-quantization) as it ships: tensor_quant.py's
FakeTensorQuantFunction, TensorQuantFunction and ScaledE4M3Function (symbolics that read their ``amax`` tensor as a
constant: ``parse_args("v", "t", ...)``, ``amax.numel()``, arithmetic into ``Constant`` scales) and
nn/modules/tensor_quantizer.py's TensorQuantizer (``_get_amax``: the calibrated ``_amax`` buffer, or an amax reduced
from the input when none is loaded) inside QuantConv2d/QuantLinear-like layers, bridged with nothing changed but the
CUDA extension (stood in by plain torch). Each written node is compared with what ``torch.onnx.export(dynamo=False)``
writes for the same module where it can (its ``_get_amax`` reading ``self._amax.data``: dynamo=False refuses the
buffer itself), and the file runs in plain onnxruntime against eager."""

import io
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch._C._onnx as _C_onnx
from onnx import numpy_helper
from torch.autograd import Function
from torch.onnx import symbolic_helper

import bridge


@pytest.fixture
def reg():
    return bridge.Registry()


# -- tensor_quant.py, as shipped (cuda_ext stood in by plain torch) ---------------------------------------------------
def _fake_tensor_quant_backward(inputs, amax, grad_outputs):
    zero = grad_outputs.new_zeros(1)
    return torch.where(inputs.abs() <= amax, grad_outputs, zero)


def _onnx_int8_helper(g, inputs, amax, num_bits, unsigned, narrow_range):
    assert num_bits == 8, "Only INT8 ONNX export is supported for now."
    maxbound = (1 << (num_bits - 1 + int(unsigned))) - 1

    if amax.numel() == 1:
        zero_point, axis = torch.tensor(0.0, device=amax.device), None
    else:
        amax_init_shape = amax.shape
        amax = amax.squeeze().data
        assert len(amax.shape) == 1, "ONNX does not support multi-axis quantization."
        zero_point = torch.zeros_like(amax, dtype=torch.int32).data
        axis = list(amax_init_shape).index(list(amax.shape)[0])

    zero_point = g.op("Constant", value_t=zero_point)
    if not unsigned:
        assert not narrow_range, "ONNX does not support unsigned narrow range INT8."
        zero_point = g.op("Cast", zero_point, to_i=_C_onnx.TensorProtoDataType.INT8)
    else:
        zero_point = g.op("Cast", zero_point, to_i=_C_onnx.TensorProtoDataType.UINT8)

    scale = amax / maxbound
    scale.masked_fill_(scale == 0, 1.0)
    scale = g.op("Constant", value_t=scale)

    input_type = inputs.type().scalarType()
    if input_type == "Half" or input_type == "BFloat16":
        inputs = g.op("Cast", inputs, to_i=_C_onnx.TensorProtoDataType.FLOAT)

    quantized = g.op("QuantizeLinear", inputs, scale, zero_point, axis_i=axis)
    out = g.op("DequantizeLinear", quantized, scale, zero_point, axis_i=axis)

    if input_type == "Half":
        out = g.op("Cast", out, to_i=_C_onnx.TensorProtoDataType.FLOAT16)
    elif input_type == "BFloat16":
        out = g.op("Cast", out, to_i=_C_onnx.TensorProtoDataType.BFLOAT16)
    return out


def _tensor_quant(inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
    """Shared body of TensorQuantFunction and FakeTensorQuantFunction (the CPU path, as shipped)."""
    input_dtype = inputs.dtype
    if inputs.dtype == torch.half:
        inputs = inputs.float()
    if amax.dtype == torch.half:
        amax = amax.float()
    max_bound = torch.tensor((2.0 ** (num_bits - 1 + int(unsigned))) - 1.0, device=amax.device)
    if unsigned:
        min_bound = 0
    elif narrow_range:
        min_bound = -max_bound
    else:
        min_bound = -max_bound - 1
    scale = max_bound / amax
    outputs = torch.clamp((inputs * scale).round_(), min_bound, max_bound)
    if input_dtype == torch.half:
        outputs = outputs.half()
    return outputs, scale


class FakeTensorQuantFunction(Function):
    """Fake version of TensorQuantFunction use CUDA extension"""

    @staticmethod
    @symbolic_helper.parse_args("v", "t", "i", "b", "b")
    def symbolic(g, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        return _onnx_int8_helper(g, inputs, amax, num_bits, unsigned, narrow_range)

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        ctx.save_for_backward(inputs, amax)
        outputs, scale = _tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)
        return outputs / scale.to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad_outputs):
        inputs, amax = ctx.saved_tensors
        return _fake_tensor_quant_backward(inputs, amax, grad_outputs), None, None, None, None


class TensorQuantFunction(Function):
    """Real quantization: returns (outputs, scale), its symbolic writes one value."""

    @staticmethod
    @symbolic_helper.parse_args("v", "t", "i", "b", "b")
    def symbolic(g, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        return _onnx_int8_helper(g, inputs, amax, num_bits, unsigned, narrow_range)

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        ctx.save_for_backward(inputs, amax)
        outputs, scale = _tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)
        return outputs, scale.to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad_outputs, grad_scale):
        inputs, amax = ctx.saved_tensors
        return _fake_tensor_quant_backward(inputs, amax, grad_outputs), None, None, None, None


def _onnx_fp8_quantize(g, inputs, scale_inv):
    output_shape = torch.onnx.symbolic_helper._get_tensor_sizes(inputs)
    if inputs.type().scalarType() == "Half" or inputs.type().scalarType() == "BFloat16":
        inputs = g.op("Cast", inputs, to_i=_C_onnx.TensorProtoDataType.FLOAT)
    scale = g.op("Constant", value_t=torch.tensor(scale_inv))
    return g.op("trt::TRT_FP8QuantizeLinear", inputs,
                scale).setType(inputs.type().with_dtype(torch.uint8).with_sizes(output_shape))


def _onnx_fp8_dequantize(g, inputs, scale_inv, otype=None):
    output_shape = torch.onnx.symbolic_helper._get_tensor_sizes(inputs)
    scale = g.op("Constant", value_t=torch.tensor(scale_inv))
    out = g.op("trt::TRT_FP8DequantizeLinear", inputs,
               scale).setType(inputs.type().with_dtype(torch.float32).with_sizes(output_shape))
    if otype == "Half":
        out = g.op("Cast", out, to_i=_C_onnx.TensorProtoDataType.FLOAT16)
    elif otype == "BFloat16":
        out = g.op("Cast", out, to_i=_C_onnx.TensorProtoDataType.BFLOAT16)
    return out


def _fake_e4m3fy(inputs):
    """Stands in for cuda_ext.fake_e4m3fy: round to float8 e4m3 and back."""
    return inputs.to(torch.float8_e4m3fn).to(inputs.dtype)


class ScaledE4M3Function(Function):
    """E4M3fy input with scale"""

    @staticmethod
    @symbolic_helper.parse_args("v", "t", "i", "b", "b")
    def symbolic(g, inputs, amax=None, E=4, M=3):
        if amax is None:
            scale = 1.0
        else:
            scale = 448.0 / amax
            scale = float(scale.masked_fill_(scale == 0, 1.0))
        input_type = inputs.type().scalarType()
        q_tensor = _onnx_fp8_quantize(g, inputs, 1.0 / scale)
        return _onnx_fp8_dequantize(g, q_tensor, 1.0 / scale, input_type)

    @staticmethod
    def forward(ctx, inputs, amax=None, E=4, M=3):
        if E != 4 or M != 3:
            raise NotImplementedError("Only support E=4 & M=3 for now.")
        ctx.save_for_backward(inputs)
        ctx.amax = amax
        zero_mask = inputs.abs() < 1. / (1 << 24)
        if amax is None:
            outputs = _fake_e4m3fy(inputs)
        else:
            scale = 448.0 / amax
            outputs = _fake_e4m3fy(inputs * scale) / scale
        return outputs.masked_fill(zero_mask, 0.)


fake_tensor_quant = FakeTensorQuantFunction.apply
tensor_quant = TensorQuantFunction.apply
scaled_e4m3 = ScaledE4M3Function.apply


# -- nn/modules/tensor_quantizer.py and the quant layers, as users export them -----------------------------------------
def reduce_amax(input, axis=None, keepdims=True):
    """pytorch_quantization.utils.reduce_amax: max of |input| over ``axis`` (all of it for None)."""
    with torch.no_grad():
        output = input.abs()
        if axis is None:
            return torch.max(output)
        for i in sorted(axis, reverse=True):
            output = torch.max(output, dim=i, keepdim=keepdims)[0]
        return output


class TensorQuantizer(torch.nn.Module):
    """The export path of pytorch-quantization's TensorQuantizer: ``_get_amax`` returns the calibrated ``_amax``
    buffer (per tensor, or per channel with the input's rank: [C, 1, 1, 1]), else reduces it from the input."""

    def __init__(self, amax=None, axis=None, num_bits=8, fake_quant=True, unsigned=False, narrow_range=False):
        super().__init__()
        self._num_bits, self._axis, self._fake_quant = num_bits, axis, fake_quant
        self._unsigned, self._narrow_range, self._scale_amax, self._learn_amax = unsigned, narrow_range, None, False
        self._scale = None if not fake_quant else 1.
        if amax is not None:
            self.register_buffer("_amax", torch.as_tensor(amax, dtype=torch.float32))

    def _get_amax(self, inputs):
        if hasattr(self, "_amax"):
            amax = self._amax
        else:
            if self._axis is None:
                reduce_axis = None
            else:
                axis = self._axis if isinstance(self._axis, (list, tuple)) else [self._axis]
                reduce_axis = [i for i in range(inputs.dim()) if i not in axis]
            amax = reduce_amax(inputs, axis=reduce_axis, keepdims=True).detach()
        if self._scale_amax is not None:
            amax = amax.detach() * self._scale_amax
        return amax

    def _quant_forward(self, inputs):
        amax = self._get_amax(inputs)
        if self._fake_quant:
            if isinstance(self._num_bits, tuple):
                E, M = self._num_bits  # noqa: N806
                return scaled_e4m3(inputs, amax, E, M)
            return fake_tensor_quant(inputs, amax, self._num_bits, self._unsigned, self._narrow_range)
        outputs, self._scale = tensor_quant(inputs, amax, self._num_bits, self._unsigned)
        return outputs

    def forward(self, inputs):
        return self._quant_forward(inputs)


def _channel_amax(n: int, rank: int) -> torch.Tensor:
    """A calibrated per-channel amax as MaxCalibrator keeps it: shape [n, 1, ...] (keepdims over the rest)."""
    return (torch.linspace(0.5, 1.5, n) * torch.arange(1, n + 1) / n + 0.25).reshape(n, *([1] * (rank - 1)))


class QuantConv2d(torch.nn.Conv2d):
    """pytorch-quantization's QuantConv2d: an input quantizer (per tensor) and a weight quantizer (per output
    channel, amax [C, 1, 1, 1]) before the convolution."""

    def __init__(self, in_channels=4, out_channels=6, kernel_size=3, input_amax=2.5, weight_quantizer=None):
        super().__init__(in_channels, out_channels, kernel_size, padding=1)
        self._input_quantizer = TensorQuantizer(input_amax)
        self._weight_quantizer = weight_quantizer or TensorQuantizer(_channel_amax(out_channels, 4) * 0.3, axis=0)

    def forward(self, input):
        quant_input = self._input_quantizer(input)
        quant_weight = self._weight_quantizer(self.weight)
        return self._conv_forward(quant_input, quant_weight, self.bias)


class QuantLinear(torch.nn.Linear):
    """pytorch-quantization's QuantLinear: per-tensor input amax, per-row weight amax [out_features, 1]."""

    def __init__(self, in_features=5, out_features=3):
        super().__init__(in_features, out_features)
        self._input_quantizer = TensorQuantizer(3.0)
        self._weight_quantizer = TensorQuantizer(_channel_amax(out_features, 2) * 0.5, axis=0)

    def forward(self, input):
        return torch.nn.functional.linear(self._input_quantizer(input), self._weight_quantizer(self.weight), self.bias)


class QuantNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = QuantConv2d()
        self.fc = QuantLinear(6 * 6 * 6, 3)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


# -- what dynamo=False writes ------------------------------------------------------------------------------------
def legacy_export(model, args, opset: int, monkeypatch) -> onnx.ModelProto:
    """What torch.onnx's TorchScript exporter writes for ``model`` with each TensorQuantizer's ``_get_amax``
    reading ``self._amax.data`` (a constant in its trace: it refuses the buffer itself, a prim::Param)."""
    get_amax = TensorQuantizer._get_amax
    with monkeypatch.context() as m:
        m.setattr(TensorQuantizer, "_get_amax", lambda self, inputs: get_amax(self, inputs).data)
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, args, f, dynamo=False, opset_version=opset, do_constant_folding=False)
    return onnx.load_from_string(f.getvalue())


def _attribute(a: onnx.AttributeProto):
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        arr = numpy_helper.to_array(v)
        return (v.data_type, list(v.dims), arr.tolist())
    return v


def node_identity(node: onnx.NodeProto, graph: onnx.GraphProto):
    """Domain, type, attributes (name, type, value; a tensor by dtype, dims and values) and, for each input, the
    graph input it is (by position), else 'computed'."""
    sources = [i.name for i in graph.input]
    return (node.domain, node.op_type, [(a.name, a.type, _attribute(a)) for a in node.attribute],
            [sources.index(i) if i in sources else "computed" for i in node.input])


QUANT_OPS = {"Constant", "Cast", "QuantizeLinear", "DequantizeLinear", "TRT_FP8QuantizeLinear",
             "TRT_FP8DequantizeLinear"}


def quant_nodes(proto: onnx.ModelProto) -> list:
    return [node_identity(n, proto.graph) for n in proto.graph.node if n.op_type in QUANT_OPS]


def run_ort(proto: onnx.ModelProto, *args: torch.Tensor) -> list[np.ndarray]:
    sess = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})


# -- FakeTensorQuantFunction: amax a buffer of the module -----------------------------------------------------------
def test_dynamo_false_itself_refuses_the_amax_buffer_as_shipped():
    """Why the comparisons below patch ``_get_amax`` to ``.data``: dynamo=False cannot read the buffer itself."""
    f = io.BytesIO()
    with warnings.catch_warnings(), pytest.raises(Exception, match="Expected node type 'onnx::Constant' for argument "
                                                                   "'amax'.*got 'prim::Param'"):
        warnings.simplefilter("ignore")
        torch.onnx.export(TensorQuantizer(2.5), (torch.randn(3, 4),), f, dynamo=False, opset_version=17)


@pytest.mark.parametrize("amax, axis, shape", [
    (2.5, None, (3, 4)),                                    # per tensor: a 0-d buffer
    (_channel_amax(4, 4), 0, (4, 3, 2, 2)),                 # per channel, a weight: [C, 1, 1, 1]
    (_channel_amax(3, 4).reshape(1, 3, 1, 1), 1, (2, 3, 4, 4)),  # per channel of an activation: axis 1
], ids=["per_tensor", "per_channel_axis0", "per_channel_axis1"])
def test_fake_tensor_quant_amax_buffer_is_the_nodes_dynamo_false_wrote(reg, monkeypatch, amax, axis, shape):
    """The symbolic reads the buffer's value (numel, arithmetic): the file holds QuantizeLinear/DequantizeLinear
    with the scale and zero point as Constants and the axis, node for node what dynamo=False writes; no custom
    node and no amax initializer are left, and plain onnxruntime matches eager."""
    bridge.register(FakeTensorQuantFunction, registry=reg)
    model = TensorQuantizer(amax, axis=axis)
    x = torch.randn(*shape) * 2
    proto = bridge.export(model, (x,), registry=reg, opset_version=17)
    legacy = legacy_export(model, (x,), 17, monkeypatch)
    assert quant_nodes(proto) == quant_nodes(legacy)
    ops = [n.op_type for n in proto.graph.node]
    assert ops == [n.op_type for n in legacy.graph.node] == ["Constant", "Cast", "Constant", "QuantizeLinear",
                                                              "DequantizeLinear"]
    q = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear")
    assert [a.i for a in q.attribute if a.name == "axis"] == ([] if axis is None else [axis])
    assert not proto.graph.initializer and not proto.functions
    assert {o.domain for o in proto.opset_import} == {""}
    (got,) = run_ort(proto, x)
    np.testing.assert_array_equal(got, run_ort(legacy, x)[0])
    # NOTE: eager divides by 127/amax, DequantizeLinear multiplies by amax/127: one float32 ulp apart at most
    np.testing.assert_allclose(got, model(x).numpy(), rtol=0, atol=1e-6)
    bridge.assert_parity(model, (x,), registry=reg, atol=1e-6, rtol=0)


def test_quant_conv_and_linear_as_users_export_them(reg, monkeypatch):
    """QuantConv2d (input per tensor, weight per output channel) and QuantLinear (weight per row): four quantizers,
    each written with its own buffer's value, where the weight's QuantizeLinear reads the weight initializer."""
    bridge.register(FakeTensorQuantFunction, registry=reg)
    model = QuantNet().eval()
    x = torch.randn(2, 4, 6, 6)
    proto = bridge.export(model, (x,), registry=reg, opset_version=17)
    legacy = legacy_export(model, (x,), 17, monkeypatch)
    assert quant_nodes(proto) == quant_nodes(legacy)
    qs = [n for n in proto.graph.node if n.op_type == "QuantizeLinear"]
    assert [[a.i for a in n.attribute] for n in qs] == [[], [0], [], [0]]
    weights = {t.name for t in proto.graph.initializer}
    assert [n.input[0] in weights for n in qs] == [False, True, False, True]
    assert not [n for n in proto.graph.node if n.domain not in ("", "ai.onnx")]
    assert not any("amax" in t.name for t in proto.graph.initializer)
    np.testing.assert_allclose(run_ort(proto, x)[0], run_ort(legacy, x)[0], rtol=0, atol=1e-6)
    report = bridge.check_parity(model, (x,), registry=reg, atol=1e-5, rtol=1e-5)
    assert report.passed, str(report)
    assert report.symbolics == ("test_upstream_quantization.FakeTensorQuantFunction",)  # NOTE: the report names it


def test_fake_tensor_quant_registered_before_a_call_and_dynamic_batch(reg):
    """Registered with nothing but the class, a dynamic batch: the call tells amax is a tensor, the export its
    value; extra batch sizes run the same file."""
    bridge.register(FakeTensorQuantFunction, registry=reg)
    model = QuantConv2d()
    batch = torch.export.Dim("batch")
    bridge.assert_parity(model, (torch.randn(2, 4, 5, 5),), registry=reg, dynamic_shapes=({0: batch},),
                         extra_args=[(torch.randn(3, 4, 5, 5),)], atol=1e-5, rtol=1e-5)


# -- amax not known at export: reduced from the input (no calibrated _amax) --------------------------------------
def test_amax_computed_from_the_input_is_refused_naming_why_and_the_fix(reg):
    bridge.register(FakeTensorQuantFunction, registry=reg)
    model = TensorQuantizer(None)  # NOTE: never calibrated: _get_amax reduces |x| at run time
    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: .*FakeTensorQuantFunction\.symbolic reads tensor "
                                                   r"argument 'amax' as a constant, and this call's 'amax' is not "
                                                   r"known at export: the model computes it at run time.* Got 'amax' "
                                                   r"from node .*\(ReduceMax\).* Keep it in a buffer, parameter or "
                                                   r"constant of the module"):
        bridge.export(model, (torch.randn(3, 4),), registry=reg)


# -- TensorQuantFunction: real quantization returning (outputs, scale) -----------------------------------------------
def test_tensor_quant_function_through_tensor_quantizer_is_refused_as_dynamo_false_refuses(reg, monkeypatch):
    """TensorQuantizer's real-quant path calls tensor_quant(inputs, amax, num_bits, unsigned): narrow_range keeps
    its default True, which the symbolic's own assert refuses; both exporters stop there, opbridge naming the
    symbolic, its arguments and the assert."""
    model = TensorQuantizer(2.5, fake_quant=False)
    x = torch.randn(3, 4)
    with pytest.raises(Exception, match="ONNX does not support unsigned narrow range INT8"):
        legacy_export(model, (x,), 17, monkeypatch)
    bridge.register(TensorQuantFunction, registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"TensorQuantFunction\.symbolic raised when run .* with the "
                                                   r"arguments \['<tensor>', '<tensor amax read as a constant>', 8, "
                                                   r"False, True\]\. Got AssertionError: ONNX does not support "
                                                   r"unsigned narrow range INT8"):
        bridge.export(model, (x,), registry=reg)


class RealQuant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("_amax", torch.tensor(2.5))

    def forward(self, x):
        outputs, scale = tensor_quant(x, self._amax, 8, False, False)
        return outputs / scale


def test_tensor_quant_function_two_outputs_one_written_is_refused_as_dynamo_false_refuses(reg, monkeypatch):
    """Called with narrow_range=False, its forward returns (outputs, scale) and its symbolic writes one value:
    dynamo=False refuses the call, and so does opbridge, naming both counts."""
    x = torch.randn(3, 4)
    f = io.BytesIO()
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match=r"incorrect number of outputs \(expected 2, "
                                                                      r"but got 1\)"):
        warnings.simplefilter("ignore")
        torch.onnx.export(DataRealQuant(), (x,), f, dynamo=False, opset_version=17)
    bridge.register(TensorQuantFunction, registry=reg)
    with pytest.raises(bridge.OpBridgeError, match=r"TensorQuantFunction\.symbolic writes 1 output\(s\) where "
                                                   r"forward returns 2.* Got forward returning 2 tensors\. Return one "
                                                   r"value per output of forward"):
        bridge.export(RealQuant(), (x,), registry=reg)


class DataRealQuant(RealQuant):
    def forward(self, x):
        outputs, scale = tensor_quant(x, self._amax.data, 8, False, False)
        return outputs / scale


# -- ScaledE4M3Function: fp8 through TensorRT's TRT_FP8QuantizeLinear/TRT_FP8DequantizeLinear -----------------------
def test_scaled_e4m3_writes_the_trt_fp8_nodes_dynamo_false_wrote(reg, monkeypatch):
    """Its symbolic reads amax into a float scale and writes TensorRT's own custom nodes (trt::TRT_FP8QuantizeLinear,
    trt::TRT_FP8DequantizeLinear), not ONNX's QuantizeLinear: the file holds them as dynamo=False wrote them.
    onnxruntime has no kernel for the trt domain, so it cannot run the file: the nodes are compared, and eager is
    checked against fp8 rounding."""
    bridge.register(ScaledE4M3Function, registry=reg)
    model = TensorQuantizer(2.5, num_bits=(4, 3))
    x = torch.randn(3, 4)
    proto = bridge.export(model, (x,), registry=reg, opset_version=17)
    legacy = legacy_export(model, (x,), 17, monkeypatch)
    assert quant_nodes(proto) == quant_nodes(legacy)
    assert [(n.domain, n.op_type) for n in proto.graph.node if n.op_type != "Constant"] == \
        [("trt", "TRT_FP8QuantizeLinear"), ("trt", "TRT_FP8DequantizeLinear")]
    assert not proto.functions and not proto.graph.initializer  # NOTE: TensorRT's own ops: no body, amax gone
    scales = [numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node if n.op_type == "Constant"]
    assert [float(s) for s in scales] == [np.float32(2.5 / 448.0)] * 2
    want = (x * (448.0 / 2.5)).to(torch.float8_e4m3fn).float() / (448.0 / 2.5)
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    with pytest.raises(Exception, match="TRT_FP8QuantizeLinear"):
        run_ort(proto, x)


# -- moved from test_upstream_functions.py ------------------------------------------------------------------------
class DataTensorQuantizer(TensorQuantizer):
    """A TensorQuantizer whose ``_get_amax`` reads ``self._amax.data`` (as dynamo=False needs)."""

    def forward(self, x):
        amax = self._amax.data
        if amax.dtype not in (torch.double, torch.float):
            amax = amax.float()
        return FakeTensorQuantFunction.apply(x, amax, 8, False, False)


def test_pytorch_quantization_amax_data_names_dot_data_and_detach(reg):
    """``.data`` cuts the value from torch.export's graph, which then refuses it from inside torch; the error says
    what the model does and the fix (a registered FakeTensorQuantFunction stops before, at its symbolic)."""
    with warnings.catch_warnings(), pytest.raises(bridge.OpBridgeError, match=r"a tensor's \.data .*self\._amax\.data.*"
                                                                                r" Read it with \.detach\(\) instead"):
        warnings.simplefilter("ignore")  # NOTE: the unregistered Function's symbolic is not used (warned once)
        bridge.export(DataTensorQuantizer(2.5), (torch.randn(3, 4),), registry=reg)


class DetachTensorQuantizer(TensorQuantizer):
    """The newer TensorQuantizers under export: ``_get_amax`` returns ``amax.detach()``."""

    def _get_amax(self, inputs):
        return super()._get_amax(inputs).detach()


def test_amax_read_with_detach_is_the_buffer_value(reg, monkeypatch):
    """The fix the .data error names works: amax.detach() of the buffer is still the value the module holds."""
    bridge.register(FakeTensorQuantFunction, registry=reg)
    model = DetachTensorQuantizer(_channel_amax(4, 4), axis=0)
    x = torch.randn(4, 3, 2, 2)
    proto = bridge.export(model, (x,), registry=reg, opset_version=17)
    assert quant_nodes(proto) == quant_nodes(legacy_export(model, (x,), 17, monkeypatch))
    bridge.assert_parity(model, (x,), registry=reg, atol=1e-6, rtol=0)
