"""Every private torch (and onnxscript) API opbridge uses, in one module; the rest of the code calls
public torch or this.

Each wrapper says what it does and the torch releases it is tested on (the torch matrix in
``benchmarks/torch_matrix.py`` runs the suite on each); where a release differs, the branch is here.

Example:
    >>> import torch
    >>> str(schema_of(torch.ops.aten.relu.default))
    'aten::relu(Tensor self) -> Tensor'
    >>> has_kernel("aten::relu", "CompositeImplicitAutograd")
    False
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# NOTE: importing the ops package fills onnxscript's torch_lib registry (onnxscript 0.5-0.7)
import onnxscript.function_libs.torch_lib.ops  # noqa: F401
import torch
import torch._library.custom_ops as _custom_ops
import torch._library.fake_class_registry as _fake_classes
import torch._library.simple_registry as _simple_registry
import torch.autograd.function as _autograd_function
import torch.utils._python_dispatch as _python_dispatch
import torch.utils._pytree as pytree  # noqa: F401  (re-exported: tree_flatten, tree_map, ...)
from onnxscript.function_libs.torch_lib import registration as _torchlib
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake  # noqa: F401  (re-exported)
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext  # noqa: F401

try:  # NOTE: torch.onnx's exporter pieces (2.12-2.15), to build its op registry once per opset
    from torch.onnx._internal.exporter import _constants as _onnx_constants
    from torch.onnx._internal.exporter import _core as _onnx_core
    from torch.onnx._internal.exporter import _registration as _onnx_registration
    _EXPORTER = True
except ImportError:  # pragma: no cover  another torch: callers use the public torch.onnx.export
    _EXPORTER = False

try:  # NOTE: the flag torch.onnx.is_in_onnx_export() reads while torch.onnx.export(dynamo=True) runs (2.12-2.15)
    from torch.onnx._internal.exporter import _flags as _onnx_flags
except ImportError:  # pragma: no cover  another torch: traced_as_torch_onnx() leaves the flag as it is
    _onnx_flags = None  # type: ignore[assignment]

try:  # NOTE: what torch.export's non-strict trace does to builtins: min/max of sizes are sym_min/sym_max (2.12-2.15)
    from torch._export.non_strict_utils import _override_builtin_ops
except ImportError:  # pragma: no cover  another torch: builtins stay as they are
    _override_builtin_ops = contextlib.nullcontext  # type: ignore[assignment]

try:  # NOTE: torch.onnx's TorchScript exporter (2.12-2.15 ship it, deprecated): symbolics run on its own graph
    from torch.onnx._internal.torchscript_exporter import jit_utils as _ts_jit_utils
    from torch.onnx._internal.torchscript_exporter import registration as _ts_registration
    from torch.onnx._internal.torchscript_exporter._globals import GLOBALS as _TS_GLOBALS
    TORCHSCRIPT = True
except ImportError:  # pragma: no cover  a torch without it: symbolic functions cannot run
    TORCHSCRIPT = False

# NOTE: the logger torch.onnx's dynamo exporter warns through while it builds its op registry
ONNX_REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"

# NOTE: the op classes torch keeps in the private torch._ops (2.12-2.15); isinstance checks only.
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket
HigherOrderOperator = torch._ops.HigherOrderOperator


def schema_of(op: Any) -> torch.FunctionSchema:
    """The ``FunctionSchema`` of an OpOverload (its private ``_schema``, 2.12-2.15)."""
    return op._schema


def writes(argument: Any) -> bool:
    """Whether a schema argument is written by its op (``Tensor(a!)``)."""
    return argument.alias_info is not None and argument.alias_info.is_write


def overload_name(op: Any) -> str:
    """The overload name of an OpOverload (``"default"`` for ``torch.ops.ns.name.default``)."""
    return op._overloadname


def parse_schema(text: str) -> torch.FunctionSchema:
    """Parse ``"ns::name(Tensor x) -> Tensor"`` into a ``FunctionSchema`` (``torch._C.parse_schema``)."""
    return torch._C.parse_schema(text)


def op_exists(qualname: str) -> bool:
    """Whether torch knows an op ``ns::name`` (any overload), without creating a packet for it."""
    return bool(torch._C._jit_get_schemas_for_operator(qualname))


def has_kernel(name: str, dispatch_key: str) -> bool:
    """Whether op ``name`` (``ns::op`` or ``ns::op.overload``) has a kernel for ``dispatch_key``."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, dispatch_key)


def custom_class_schemas() -> list:
    """The method schemas of every registered torchbind class (``torch._C._jit_get_custom_class_schemas``)."""
    return torch._C._jit_get_custom_class_schemas()  # type: ignore[attr-defined]  # NOTE: absent from torch's _C stubs


def custom_op_def(qualname: str) -> Any | None:
    """torch's ``CustomOpDef`` for ``qualname`` when it was made by ``torch.library.custom_op``, else None."""
    return _custom_ops.OPDEFS.get(qualname)


def overload_of(custom_op: Any) -> OpOverload | None:
    """The OpOverload behind a ``CustomOpDef`` (``_opoverload``), None for anything else."""
    return getattr(custom_op, "_opoverload", None) if is_custom_op_def(custom_op) else None


def is_custom_op_def(value: Any) -> bool:
    """Whether ``value`` is a ``torch.library.custom_op`` object (``CustomOpDef``)."""
    return isinstance(value, _custom_ops.CustomOpDef)


def python_impl(custom_op: Any) -> Callable | None:
    """The Python function a ``CustomOpDef`` was made from (its ``_init_fn``)."""
    return getattr(custom_op, "_init_fn", None)


def fake_impl(name: str) -> Callable | None:
    """The Python fake kernel registered for op ``name`` (``register_fake``), or None."""
    return _simple_registry.singleton.find(name).fake_impl.kernel


def custom_op_fake(custom_op: Any) -> Callable | None:
    """The fake kernel of a ``CustomOpDef`` (its ``_abstract_fn``), or None."""
    return custom_op._abstract_fn


def custom_op_backward(custom_op: Any) -> bool | None:
    """Whether a ``CustomOpDef`` has a backward registered (``register_autograd``: its ``_backward_fn``), also
    for the OpOverload of one (an op ``torch.library.custom_op`` made, registered by name: its Autograd kernel
    is there with or without a backward); None for an op without that record (whose autograd is a dispatch
    key)."""
    if not hasattr(custom_op, "_backward_fn") and hasattr(custom_op, "name"):
        custom_op = custom_op_def(custom_op.name().split(".")[0]) or custom_op
    if not hasattr(custom_op, "_backward_fn"):
        return None
    return custom_op._backward_fn is not None


def destroy_custom_op(custom_op: Any) -> None:
    """Undefine a ``CustomOpDef`` from torch (its private library's ``_destroy``), so a failed
    declaration leaves torch as it was."""
    destroy_library(custom_op._lib)


def destroy_library(lib: torch.library.Library) -> None:
    """Undefine every op and kernel a ``torch.library.Library`` defined (its private ``_destroy``)."""
    lib._destroy()


def find_fake_class(qualified_class: str) -> type | None:
    """The fake class registered for torchbind class ``__torch__.torch.classes.ns.Name``, or None."""
    return _fake_classes.find_fake_class(qualified_class)


def has_fake_class(qualified_class: str) -> bool:
    return _fake_classes.has_fake_class(qualified_class)


def register_fake_class(class_name: str, cls: type) -> None:
    """Register ``cls`` as the fake of torchbind class ``ns::Name`` (``torch._library.fake_class_registry``)."""
    # NOTE: torch annotates fake_class as an instance of its protocol; it takes (and we pass) the class
    _fake_classes.register_fake_class(class_name, cls)  # type: ignore[arg-type]


def deregister_fake_class(class_name: str) -> None:
    _fake_classes.deregister_fake_class(class_name)


def torchlib_translation(qualname: str) -> Any | None:
    """The onnxscript function torch.onnx translates op ``qualname`` (``ns::name``) with, from
    onnxscript's torch_lib registry (``default_registry``, keyed by qualified name), or None.

    Example:
        >>> torchlib_translation("torchvision::nms").name
        'torchvision_nms'
        >>> torchlib_translation("no_such::op") is None
        True
    """
    entry = _torchlib.default_registry._registry.get(qualname)
    if entry is None or not entry.overloads:
        return None
    # NOTE: torch.onnx passes the op's arguments as the graph node holds them, keyword-only ones by name; a
    # translation that cannot take them is none (onnxscript 0.7's torchvision_roi_pool takes (input, boxes,
    # output_size, spatial_scale), not the op's 5)
    schemas = torch._C._jit_get_schemas_for_operator(qualname)
    try:
        if schemas:
            arguments = schemas[0].arguments
            inspect.signature(entry.overloads[0]).bind(*[a for a in arguments if not a.kwarg_only],
                                                       **{a.name: a for a in arguments if a.kwarg_only})
    except TypeError:
        return None
    return entry.overloads[0]


def onnx_registry(opset: int, extra: dict | None = None) -> Any | None:
    """torch.onnx's table of ATen translations at ``opset`` (torch_lib's), plus ``extra``
    (``{OpOverload: onnxscript function}``), as ``torch.onnx.export`` builds it; None where this torch
    has no such internal exporter (use ``torch.onnx.export`` then)."""
    if not _EXPORTER:
        return None
    registry = _onnx_registration.ONNXRegistry.from_torchlib(opset_version=max(opset, _onnx_constants.TORCHLIB_OPSET))
    return with_translations(registry, extra) if extra else registry


def with_translations(registry: Any, extra: dict) -> Any:
    """A copy of ``registry`` (from :func:`onnx_registry`) with ``extra`` translations added; ``registry``
    itself is left as it was."""
    registry = copy.copy(registry)
    # NOTE: the lists too: registering a target the table already holds inserts into its list
    registry.functions = {k: list(v) for k, v in registry.functions.items()}
    for target, function in extra.items():
        registry.register_op(target, function)
    return registry


def lacks_translation(registry: Any, op: Any) -> bool:
    """Whether a registry from :func:`onnx_registry` lacks torch_lib's translation of ``op`` (an
    OpOverload) that one built now would hold: torch.onnx fills its table only with the ops that exist
    when it is built (torchvision's only with torchvision installed), keyed by the op's name."""
    name = op.name()
    return (name not in registry.functions and torchlib_translation(name) is not None
            and _onnx_registration._get_overload(name) is not None)


def onnx_export(program: Any, registry: Any, opset: int) -> Any:
    """``torch.onnx.export(program, dynamo=True, optimize=False)`` with a prebuilt ``registry``
    (:func:`onnx_registry`); the caller optimizes the ONNXProgram (its public ``optimize()``)."""
    return _onnx_core.export(program, registry=registry, optimize=False, verify=False, opset_version=opset,
                             verbose=False)


@contextlib.contextmanager
def traced_as_torch_onnx():
    """Inside, torch.export traces as ``torch.onnx.export(dynamo=True)`` has it trace (its ``_core.export`` and
    non-strict capture strategy): ``torch.onnx.is_in_onnx_export()`` is True (upstream code branches on it: mmcv's
    batched_nms, ``torch.onnx.ops.symbolic`` under ``if torch.onnx.is_in_onnx_export():``), and a dynamic dim whose
    example size is 0 or 1 stays dynamic (``backed_size_oblivious``: a batch of 1 for a dynamic batch).

    >>> with traced_as_torch_onnx():
    ...     torch.onnx.is_in_onnx_export()
    True
    >>> torch.onnx.is_in_onnx_export()
    False
    """
    oblivious = (torch.fx.experimental._config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]
                 if hasattr(torch.fx.experimental._config, "backed_size_oblivious") else contextlib.nullcontext())
    with oblivious, _onnx_exporting():
        yield


@contextlib.contextmanager
def data_sizes_kept_inside():
    """Inside a fake kernel run under torch's fake mode: sizes it computes from data for values it does not return
    (``torch.where(mask)[0]`` in BEVFusion's QuickCumsumCuda forward) are its own business: torch would otherwise
    refuse them as ``PendingUnbackedSymbolNotFound`` once the kernel returns. Nothing changes outside fake mode.
    NOTE: a returned size computed from data is still refused (torch's shape environment binds those from outputs).

    >>> with data_sizes_kept_inside():
    ...     int(torch.where(torch.tensor([True, False, True]))[0].numel())
    2
    """
    mode = torch._guards.detect_fake_mode()
    shape_env = getattr(mode, "shape_env", None)
    if shape_env is None:
        yield
        return
    with shape_env.ignore_fresh_unbacked_symbols():
        yield


def builtins_as_export_has_them() -> contextlib.AbstractContextManager:
    """Inside, builtins ``min``/``max`` of sizes are ``torch.sym_min``/``sym_max``, as in torch.export's own
    non-strict trace. torch.onnx traces the program again (``run_decompositions``) without that, and Python code
    run there (a Function's forward standing in as its node's fake: mmdeploy's ``min(num_boxes, keep_topk)``)
    would then fix a dynamic size to the example's, dropping the guard.

    >>> with builtins_as_export_has_them():
    ...     min(torch.tensor([0.0, 2.0]), 1.0)
    tensor([0., 1.])
    """
    return _override_builtin_ops()


@contextlib.contextmanager
def _onnx_exporting():
    """Inside, torch.onnx's exporting flag is set (on a torch without it, nothing changes)."""
    if _onnx_flags is None:
        yield
        return
    before, _onnx_flags._is_onnx_exporting = _onnx_flags._is_onnx_exporting, True
    try:
        yield
    finally:
        _onnx_flags._is_onnx_exporting = before


def fake_mode(*, shape_env: bool = False) -> FakeTensorMode:
    """A ``FakeTensorMode`` that takes real tensors as inputs; ``shape_env=True`` gives it a fresh
    ``ShapeEnv`` (``torch.fx.experimental.symbolic_shapes``, 2.12-2.15), so a fake kernel may make
    data-dependent sizes (``torch.library.get_ctx().new_dynamic_size()``, ``nonzero``) where a
    bare mode raises ``DynamicOutputShapeException``.

    Example:
        >>> import torch
        >>> with fake_mode(shape_env=True):
        ...     n = torch.ones(3).nonzero().shape[0]
        >>> str(n).startswith("u")
        True
    """
    # NOTE: inputs keep their static shapes: only the outputs' sizes may be new symbols
    if shape_env:
        return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    return FakeTensorMode(allow_non_fake_inputs=True)


def opaque_to_dynamo(fn: Callable) -> Callable:
    """``fn`` as dynamo calls it whole rather than tracing its Python (``torch._dynamo.nonstrict_trace``): the
    branches of ``torch.cond`` are traced by dynamo, which cannot follow a Function's export forward (it reads
    the symbolic). Called outside dynamo, the wrapper calls ``fn``.

    NOTE: torch._dynamo is loaded here, on first use (about 1.5 s): every torch.export loads it anyway."""
    mark = getattr(importlib.import_module("torch._dynamo"), "nonstrict_trace", None)
    return fn if mark is None else mark(fn)


def function_has_setup_context(cls: type) -> bool:
    """Whether ``torch.autograd.Function`` subclass ``cls`` defines ``setup_context`` (then its forward
    takes no ctx), as torch's own ``_is_setup_context_defined`` decides (2.12-2.15).

    Example:
        >>> class F(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         return x
        >>> function_has_setup_context(F)
        False
    """
    return _autograd_function._is_setup_context_defined(getattr(cls, "setup_context", None))


# NOTE: the base classes (private in torch.nn.modules) of the layers whose forward differs between train()
# and eval(): BatchNorm*, Dropout*, InstanceNorm* (2.12-2.15)
MODE_DEPENDENT_MODULES: tuple[type, ...] = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.dropout._DropoutNd,
                                            torch.nn.modules.instancenorm._InstanceNorm)


# -- symbolic functions of the TorchScript exporter, run on its own graph context ----------------------

@dataclasses.dataclass(frozen=True)
class GraphInput:
    """A tensor argument of a symbolic function: a graph input named ``name``, typed by ``dtype`` and
    ``shape`` (None where unknown; a dim None where dynamic), as ``.type()`` shows it to the symbolic."""

    name: str
    dtype: torch.dtype | None = None
    shape: tuple[int | None, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ConstantInput:
    """A tensor argument a symbolic function reads as a constant (``parse_args('t')``, ``.numel()``, arithmetic),
    as the TorchScript exporter gave it a module's constant: a real tensor, ``value`` (a tensor, array or number
    of the value the export knows), else ones of ``dtype`` and ``shape`` (a stand-in that gives its kind only).
    Made while torch.export's fake and proxy modes are off, so it is real even during a trace."""

    name: str
    dtype: torch.dtype | None = None
    shape: tuple[int | None, ...] | None = None
    value: Any = None

    def tensor(self) -> torch.Tensor:
        """The real tensor the symbolic gets (call with the current modes off: :func:`run_symbolic` does)."""
        if self.value is not None:
            return torch.as_tensor(self.value, dtype=self.dtype).clone()
        return torch.ones([1 if d is None else d for d in self.shape or ()], dtype=self.dtype or torch.float32)


class SymbolicFailed(Exception):
    """The symbolic function raised (``__cause__`` is what it raised)."""


@contextlib.contextmanager
def _export_opset(opset: int):
    """torch.onnx's helpers read the opset from a global the TorchScript exporter sets for its run."""
    old = _TS_GLOBALS.export_onnx_opset_version
    _TS_GLOBALS.export_onnx_opset_version = opset
    try:
        yield
    finally:
        _TS_GLOBALS.export_onnx_opset_version = old


def run_symbolic(symbolic: Callable, args: Sequence, opset: int, hook: Callable | None = None) -> Any:
    """``symbolic(g, *args)`` on the TorchScript exporter's own graph context at ``opset`` (2.12-2.15), as
    ``torch.onnx.export(dynamo=False)`` runs it for one call: each :class:`GraphInput` in ``args`` is a
    graph input (a ``torch._C.Value``), each :class:`ConstantInput` its real tensor, every other argument is
    passed as the call gave it. Returns the
    graph as that exporter serializes it (an ``onnx.ModelProto``'s bytes, inputs named as given, no
    shape inference or constant folding); raises :class:`SymbolicFailed` from what the symbolic raised.

    ``hook(write, opname, inputs, outputs, attributes)`` sees each ``g.op`` call and makes it (``write(*inputs,
    outputs=..., **attributes)``, with the attributes it chooses); with a hook the graph is not serialized:
    the ids (``Value.unique()``) of the values symbolic returned are (None for a trailing None it returned: an
    output it does not convert; the serialized graph leaves those out), and the graph is gone with the call.

    Example:
        >>> import onnx
        >>> sym = lambda g, x, axes: g.op("Squeeze", x, axes_i=axes)
        >>> m = onnx.load_from_string(run_symbolic(sym, [GraphInput("x", torch.float32, (2, 1)), [1]], 11))
        >>> [(n.op_type, [a.ints for a in n.attribute]) for n in m.graph.node]
        [('Squeeze', [[1]])]
    """
    graph = torch._C.Graph()
    values = []
    for a in args:
        if isinstance(a, GraphInput):
            v = graph.addInput()
            v.setDebugName(a.name)
            t: Any = torch._C.TensorType.get()
            if a.dtype is not None:
                t = t.with_dtype(a.dtype)
            if a.shape is not None:
                t = t.with_sizes(list(a.shape))
            v.setType(t)
            values.append(v)
        else:
            values.append(a)
    # NOTE: no node is being converted (the TorchScript exporter passes the prim::PythonOp); helpers that read it
    # fail with their own error
    context: Any = (_ts_jit_utils.GraphContext if hook is None else _HookedContext)(
        graph=graph, block=graph.block(), opset=opset, original_node=None,  # type: ignore[arg-type]
        params_dict={}, env={}, values_in_env=set(), new_nodes=[])
    if hook is not None:
        context.hook = hook
    # NOTE: also while torch.export traces (its fake and proxy modes off): constants the symbolic makes or reads
    # (torch.tensor(...), parse_args' int(...)) are real tensors, as under the TorchScript exporter
    with _export_opset(opset), _python_dispatch._disable_current_modes():
        called: list[Any] = [v.tensor() if isinstance(v, ConstantInput) else v for v in values]
        try:
            out = symbolic(context, *called)
        except Exception as e:  # noqa: BLE001  the user's symbolic: the caller names it
            raise SymbolicFailed(f"{type(e).__name__}: {e}") from e
    outs, written = _returned(out)
    # NOTE: a symbolic may rename its inputs (mmdeploy's GemmOp: input.setDebugName('A')): the graph's inputs keep
    # the names given, which the body is read by
    for v, a in zip(values, args):
        if isinstance(a, GraphInput):
            v.setDebugName(a.name)
    if hook is not None:
        return [o.unique() for o in written] + [None] * (len(outs) - len(written))
    for o in written:
        graph.registerOutput(o)
    torch._C._jit_pass_dce_allow_deleting_nodes_with_side_effects(graph)  # NOTE: unused constants go
    return graph._export_onnx({}, opset, {}, False,  # type: ignore[attr-defined]
                              torch._C._onnx.OperatorExportTypes.ONNX, True, False, {}, False, "", {})[0]


def _returned(out: Any) -> tuple[list, list]:
    """(every output, the written ones) of what a symbolic returned; raises SymbolicFailed for anything but graph
    values, of which trailing ones may be None: the TorchScript exporter's "conversion for that particular output
    is not supported" (torchvision's roi_pool symbolic returns (MaxRoiPool, None))."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    written = list(itertools.takewhile(lambda o: o is not None, outs))
    if not written or any(o is not None for o in outs[len(written):]) or \
            not all(isinstance(o, torch._C.Value) for o in written):
        raise SymbolicFailed(f"it returned {out!r}, not the value(s) g.op gave (None only for trailing outputs)")
    return outs, written


def graph_value(x: Any) -> tuple[str | None, int] | None:
    """For a value of a symbolic's graph (a ``torch._C.Value``): the name of the graph input it is (None for
    a computed one) and its id (``unique()``); None for anything else."""
    if not isinstance(x, torch._C.Value):
        return None
    return (x.debugName() if x.node().kind() == "prim::Param" else None), x.unique()


if TORCHSCRIPT:
    class _HookedContext(_ts_jit_utils.GraphContext):
        """The TorchScript exporter's graph context whose ``op`` goes through a hook (``run_symbolic``)."""

        hook: Callable

        def op(self, opname, *raw_args, outputs=1, **kwargs):  # type: ignore[override]
            def write(*inputs, outputs=outputs, **attributes):
                return super(_HookedContext, self).op(opname, *inputs, outputs=outputs, **attributes)
            return self.hook(write, opname, raw_args, outputs, kwargs)


def python_op_node(g: Any, args: Sequence, attributes: Mapping[str, Any]) -> Any:
    """A node on ``g``'s graph (not inserted) with the graph values in ``args`` as inputs and ``attributes`` (str:
    ``s``, int: ``i``), as a ``prim::PythonOp`` symbolic reads the node it converts. Its kind is
    ``opbridge::PythonOp``: torch's methods of a real ``prim::PythonOp`` (``pyname``, ``scalar_args``) then refuse
    it rather than read memory it does not have."""
    node = g.graph.create("opbridge::PythonOp", [a for a in args if isinstance(a, torch._C.Value)], 0)
    for key, value in attributes.items():
        if isinstance(value, str):
            node.s_(key, value)
        else:
            node.i_(key, value)
    return node


def registered_symbolic(qualname: str, opset: int) -> Callable | None:
    """The symbolic registered for ``qualname`` with ``torch.onnx.register_custom_op_symbolic`` (or shipped
    by torch) that the TorchScript exporter would use at ``opset``, if any."""
    if not TORCHSCRIPT:
        return None
    group = _ts_registration.registry.get_function_group(qualname)
    return None if group is None else group.get(opset)


def torchscript_argument(g: Any, value: Any) -> Any:
    """``value``, a non-tensor argument of an op call, as the TorchScript exporter hands it to the op's symbolic
    (2.12-2.15; its passes turn the traced ``prim::Constant`` into these): an ``onnx::Constant`` holding an int
    as a 0-d int64 tensor, a float as 0-d float64, a bool as 0-d bool, an int list as 1-d int64, a float list as
    1-d of torch's default dtype, a str as a string; None as a ``prim::Constant`` of type None. Made on ``g`` (a
    graph context of :func:`run_symbolic`) past any hook. Anything else (a graph value, a placeholder) as it is.

    Example:
        >>> import onnx
        >>> sym = lambda g, x, k: g.op("mine::Op", x, torchscript_argument(g, k))
        >>> m = onnx.load_from_string(run_symbolic(sym, [GraphInput("x"), 3], 17))
        >>> [(n.op_type, [onnx.numpy_helper.to_array(a.t).tolist() for a in n.attribute]) for n in m.graph.node]
        [('Constant', [3]), ('Op', [])]
    """
    numbers = (isinstance(value, (list, tuple)) and bool(value)
               and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))
    if isinstance(value, (bool, int, float)) or numbers:
        tensor = torch.tensor(list(value) if numbers else value,
                              dtype=None if isinstance(value, bool) or numbers else
                              torch.int64 if isinstance(value, int) else torch.float64)
    elif isinstance(value, str):
        return _ts_jit_utils.GraphContext.op(g, "Constant", value_s=value)
    elif value is None:
        return _ts_jit_utils.GraphContext.op(g, "prim::Constant").setType(torch._C.NoneType.get())
    else:
        return value
    return _ts_jit_utils.GraphContext.op(g, "Constant", value_t=tensor)



def script_object_class(value: Any) -> str | None:
    """``"ns::Class"`` of a torchbind object (a ``torch.ScriptObject``: its ``_type()``, 2.12-2.15), else None."""
    if not isinstance(value, torch.ScriptObject):
        return None
    parts = value._type().qualified_name().split(".")  # NOTE: '__torch__.torch.classes.ns.Class'
    return f"{parts[-2]}::{parts[-1]}"
