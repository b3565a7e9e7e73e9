"""A symbolic registered for ``prim::PythonOp`` that dispatches Functions on their name, as NVIDIA's DL4AGX
bev_deploy ships it (``AV-Solutions/vad-trt/export_eval/bev_deploy/patch/custom_op.py``: a list of handlers, one
``custom_handler(g, *args, **kwargs)`` registered for ``prim::PythonOp`` that reads ``kwargs["name"]`` and asks
each handler, ``symbolic_helper._unimplemented`` for a name none takes). The TorchScript exporter ran it for each
Function without a symbolic of its own; opbridge does the same: the nodes equal ``dynamo=False``'s, parity holds,
a Function no handler takes is traced as plain torch code."""

import io
import warnings

import onnx
import pytest
import torch
import torch.onnx.symbolic_helper as sym_help
from torch.onnx import register_custom_op_symbolic, unregister_custom_op_symbolic

import bridge
from bridge.core.basics.graphs import custom_nodes

HANDLERS = []


def register(callback):
    HANDLERS.append(callback)
    return callback


def custom_handler(g, *args, **kwargs):
    node_name = kwargs["name"]
    for callback in HANDLERS:
        ret = callback(g, *args, **kwargs)
        if ret is not None:
            return ret
    return sym_help._unimplemented(node_name, "unimplemented")


class ScaleShift(torch.autograd.Function):
    """A plugin's Function (its CUDA kernel replaced by plain torch), no symbolic of its own."""

    @staticmethod
    def forward(ctx, x, shift, alpha: float = 0.5):
        return x * alpha + shift


class MyClip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, min):
        return input.clamp(min=min)


class MyRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        return input.clamp(min=0)


class NoHandler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor):
        return x * 3 + 1


@register
def scale_shift_handler(g, *args, **kwargs):
    if kwargs["name"] == "ScaleShift":
        assert g.original_node.pyname() == "ScaleShift" and g.original_node.kind() == "prim::PythonOp"
        return g.op("custom_op::ScaleShiftPlugin", args[0], args[1], alpha_f=args[2])


@register
def standard_handler(g, *args, **kwargs):
    if kwargs["name"] == "MyClip":
        return g.op("Clip", args[0], g.op("Constant", value_t=torch.tensor(args[1], dtype=torch.float32)))
    if kwargs["name"] == "MyRelu":
        return g.op("Relu", args[0])


@pytest.fixture
def handler():
    register_custom_op_symbolic("prim::PythonOp", custom_handler, 1)
    yield
    unregister_custom_op_symbolic("prim::PythonOp", 1)  # NOTE: torch.onnx's registry is global


class Plugin(torch.nn.Module):
    def forward(self, x, shift):
        return ScaleShift.apply(MyRelu.apply(MyClip.apply(x, 0.5)), shift, 0.25)


def legacy_export(model, args) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, f, dynamo=False, opset_version=17, do_constant_folding=False)
    return onnx.load_from_string(f.getvalue())


def _ops(proto):
    return [(n.domain, n.op_type) for n in proto.graph.node if n.op_type != "Constant"]


def _attributes(node):
    return [(a.name, a.type, onnx.helper.get_attribute_value(a)) for a in node.attribute]


ARGS = (torch.randn(3, 4), torch.randn(3, 4))


def test_export_writes_what_the_handler_writes_and_says_so(handler, registry):
    with pytest.warns(UserWarning, match=r"ScaleShift is exported as the node the symbolic registered with "
                                         r"torch.onnx.register_custom_op_symbolic\('prim::PythonOp'"):
        ours = bridge.export(Plugin(), ARGS, registry=registry)
    theirs = legacy_export(Plugin(), ARGS)
    assert _ops(ours) == _ops(theirs) == [("", "Clip"), ("", "Relu"), ("custom_op", "ScaleShiftPlugin")]
    (mine,), (legacy,) = custom_nodes(ours), custom_nodes(theirs)
    assert _attributes(mine) == _attributes(legacy) == [("alpha", onnx.AttributeProto.FLOAT, 0.25)]
    bridge.assert_parity(Plugin(), ARGS, registry=registry, tier="python")


def test_standard_ops_a_handler_writes_run_in_every_tier(handler, registry):
    class Clipped(torch.nn.Module):
        def forward(self, x):
            return MyRelu.apply(MyClip.apply(x, 0.5)) * 2

    x = torch.randn(5, 6)
    proto = bridge.export(Clipped(), (x,), registry=registry)
    assert not list(custom_nodes(proto)) and _ops(proto) == [("", "Clip"), ("", "Relu"), ("", "Mul")]
    for tier in ("python", "function", "native"):
        bridge.assert_parity(Clipped(), (x,), registry=registry, tier=tier)


def test_a_function_no_handler_takes_is_traced_as_plain_torch(handler, registry):
    class Both(torch.nn.Module):
        def forward(self, x, shift):
            return NoHandler.apply(ScaleShift.apply(x, shift, 2.0))

    proto = bridge.export(Both(), ARGS, registry=registry)
    assert [(n.domain, n.op_type) for n in custom_nodes(proto)] == [("custom_op", "ScaleShiftPlugin")]
    assert registry.for_function(NoHandler) is None
    bridge.assert_parity(Both(), ARGS, registry=registry, tier="python")


def test_registering_a_function_no_handler_takes_names_the_fix(handler, registry):
    with pytest.raises(bridge.OpBridgeError, match=r"NoHandler: the symbolic registered for prim::PythonOp does "
                                                   r"not export it.*register it with name= and function="):
        bridge.register(NoHandler, registry=registry)
    op = bridge.register(NoHandler, name="mine::NoHandler", registry=registry)
    assert op.spec.qualname == "mine::NoHandler"


def test_a_handler_reading_the_nodes_outputs_is_refused_clearly(registry):
    def reads_outputs(g, *args, **kwargs):
        if kwargs["name"] != "ScaleShift":
            return sym_help._unimplemented(kwargs["name"], "unimplemented")
        return g.op("custom_op::ScaleShiftPlugin", args[0], args[1], alpha_f=args[2],
                    outputs=g.original_node.outputsSize())

    register_custom_op_symbolic("prim::PythonOp", reads_outputs, 1)
    try:
        with pytest.raises(bridge.OpBridgeError, match=r"the symbolic registered for prim::PythonOp \(test_python_op_"
                                                       r"symbolics.*reads_outputs\) for test_python_op_symbolics"
                                                       r".ScaleShift uses torch.onnx's graph context in a way "
                                                       r"opbridge cannot read.*outputsSize"):
            bridge.export(Plugin(), ARGS, registry=registry)
    finally:
        unregister_custom_op_symbolic("prim::PythonOp", 1)


def test_without_a_handler_a_function_without_symbolic_is_what_it_was(registry):
    with pytest.raises(bridge.OpBridgeError, match=r"ScaleShift: it has no symbolic, so its ONNX node needs a name"):
        bridge.register(ScaleShift, registry=registry)
    proto = bridge.export(Plugin(), ARGS, registry=registry)
    assert not list(custom_nodes(proto))
