"""Derived ONNX function bodies: an op with no written ``function=`` body gets one traced from its own
PyTorch implementation, so ops written in plain torch need no ONNX code.

At each export site (a custom node of a model) the op's implementation — a ``torch.library.custom_op``'s
Python function, or the composite (CompositeImplicitAutograd) kernel of an op defined elsewhere — is
traced with ``torch.export`` at the site's input dtypes and ranks, every tensor dim and every int
attribute dynamic, exported with ``torch.onnx`` at the model's opset, and turned into a FunctionProto
in the op's domain with the op's input and attribute names:

- int / int[] attributes the trace keeps symbolic become FunctionProto attributes
  (``Constant <value_int: int = @k>``); float, bool and str attributes, and ints the implementation
  branches on, are baked in, so such a body is keyed by those values (and by the input dtypes). A model
  whose sites of one op need different bodies gets one body per key (ONNX function ``overload``).
- ScatterND with a reduction (what ``index_put(accumulate=True)`` and ``index_add`` become), which
  onnxruntime's threaded CPU kernel runs nondeterministically over duplicate indices, is rewritten to
  ScatterElements over the flattened data, which accumulates in a fixed order.
- before use, every body passes ``onnx.checker`` (full) and runs in onnxruntime against eager at the
  traced sizes and, where the site has dynamic dims, at other sizes.

An implementation that cannot be traced (NumPy, ``.item()``, data-dependent control flow, a C++
kernel) gives no body; :func:`body_status` says why in one line and the other tiers still run the op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper
from torch._library import custom_ops as torch_custom_ops
from torch.export import Dim

try:  # NOTE: torch.onnx's own pieces, to build its op registry once per process (not per body)
    from torch.onnx._internal.exporter import _constants as _onnx_constants
    from torch.onnx._internal.exporter import _core as _onnx_core
    from torch.onnx._internal.exporter import _registration as _onnx_registration
except ImportError:  # pragma: no cover  another torch: the public API, slower
    _onnx_core = None

from bridge.core.checks import guarded_body, unreadable
from bridge.core.domains import is_custom
from bridge.core.dtypes import TORCH_TO_ONNX, numpy_dtype, torch_dtype
from bridge.core.errors import OpBridgeError
from bridge.core.functional import SUFFIX
from bridge.core.progress import step
from bridge.core.registry import REGISTRY, Registry
from bridge.core.spec import AttrType, OpSpec, Param, SampleInput
from exporters.translation import translation

# NOTE: example sizes for dynamic dims: distinct primes, large enough that sizes computed from them
# (a slice past an offset) are rarely 0 or 1, which torch would specialise.
_SIZES = (17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79)
_ALT_STEP = 3  # verification also runs the dynamic dims at size + this
_REDUCING_SCATTER = {"add", "mul", "max", "min"}
# NOTE: (rtol, atol) for the self-check against eager: it catches wrong bodies, not ulps
_VERIFY_TOL = {torch.float16: (2e-2, 2e-2), torch.bfloat16: (5e-2, 5e-2), torch.float32: (1e-4, 1e-5),
               torch.float64: (1e-7, 1e-9)}


class NoPortableBody(OpBridgeError):
    """An op without a written body whose implementation cannot be turned into one; ``reason`` is one line."""

    def __init__(self, qualname: str, reason: str):
        self.qualname, self.reason = qualname, reason
        super().__init__(f"{qualname} has no portable ONNX body: {reason}. Got no function= body, and none "
                         "can be derived from its implementation. Give the op a function= body "
                         "(op.register_function), or use tier='native' or 'python'.")


@dataclasses.dataclass(frozen=True)
class TensorSig:
    """A tensor at an export site: dtype, and per dim a static size (int) or a symbol (str; equal
    symbols are equal sizes)."""

    dtype: torch.dtype
    dims: tuple[int | str, ...]


@dataclasses.dataclass(frozen=True)
class Site:
    """What a body is derived for: each tensor input (None: an absent optional one) and the attribute
    values (as the torch op takes them)."""

    tensors: tuple[TensorSig | None, ...]
    attrs: tuple[tuple[str, Any], ...]

    def __post_init__(self):  # NOTE: lists become tuples: sites are cache keys
        object.__setattr__(self, "attrs", tuple((n, tuple(v) if isinstance(v, list) else v) for n, v in self.attrs))

    @property
    def structure(self) -> tuple:
        """What any body for this site must agree on: dtypes, ranks, present inputs, list lengths."""
        return (tuple(None if t is None else (t.dtype, len(t.dims)) for t in self.tensors),
                tuple((n, len(v)) if isinstance(v, (list, tuple)) else (n, type(v).__name__) for n, v in self.attrs))

    def describe(self) -> str:
        shown = [f"{str(t.dtype).replace('torch.', '')}[{','.join(map(str, t.dims))}]" if t else "None"
                 for t in self.tensors]
        return ", ".join(shown + [f"{n}={v!r}" for n, v in self.attrs])


@dataclasses.dataclass(frozen=True)
class Derived:
    """A derived body and where it holds: the attributes baked in (by value), dims the trace fixed,
    and torch.export's guards (checked against each further site before the body is reused)."""

    proto: onnx.FunctionProto
    structure: tuple
    fixed: tuple[tuple[str, Any], ...]
    fixed_dims: tuple[tuple[int, int, int], ...]  # (tensor input, dim, size)
    guards: tuple[str, ...]
    parametric: tuple[str, ...]  # attributes the body reads from the node


# -- the implementation -----------------------------------------------------------------
def _schema_op(qualname: str) -> torch._ops.OpOverload | None:
    ns, _, name = qualname.partition("::")
    if not torch._C._jit_get_schemas_for_operator(qualname):
        return None
    return getattr(getattr(torch.ops, ns), name).default


def _python_impl(overload: torch._ops.OpOverload) -> Callable:
    qualname = overload.name().split(".")[0]
    opdef = torch_custom_ops.OPDEFS.get(qualname)
    if opdef is not None and opdef._init_fn is not None:
        return opdef._init_fn
    if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CompositeImplicitAutograd"):
        return overload.decompose
    raise _Untraceable("its kernel is C++ (no PyTorch implementation or composite kernel to trace)")


def implementation(spec: OpSpec) -> Callable:
    """The PyTorch code the op's body is derived from, called with the op's arguments in schema order.

    A custom_op's own function; an op defined elsewhere, its composite (CompositeImplicitAutograd)
    kernel; the functional twin of a mutating op, the op's implementation on copies of the tensors it
    writes (returning its results, then their new values). Raises ``NoPortableBody`` when there is none.

    Example:
        >>> import torch, bridge, custom_ops
        >>> fn = implementation(bridge.REGISTRY.get("opbridge::crop"))
        >>> tuple(fn(torch.ones(1, 4, 4), [0, 0, 2, 3]).shape)
        (1, 3, 2)
    """
    try:
        if spec.qualname.endswith(SUFFIX):
            original = _schema_op(spec.qualname[: -len(SUFFIX)])
            if original is not None:
                written = [i for i, a in enumerate(original._schema.arguments)
                           if a.alias_info is not None and a.alias_info.is_write]
                if written:
                    return _functional(_python_impl(original), written)
        return _python_impl(spec.overload)
    except _Untraceable as e:
        raise NoPortableBody(spec.qualname, str(e)) from None


def _functional(fn: Callable, written: list[int]) -> Callable:
    def functional(*args):
        args = list(args)
        for i in written:
            args[i] = args[i].clone()
        out = fn(*args)
        outs = () if out is None else (tuple(out) if isinstance(out, (tuple, list)) else (out,))
        return (*outs, *(args[i] for i in written))
    return functional


class _Untraceable(Exception):
    """Internal: the one-line reason a body cannot be derived."""


def _one_line(e: BaseException) -> str:
    while e.__cause__ is not None:  # NOTE: torch.onnx wraps the error that says what went wrong
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    text = text if len(text) <= 240 else text[:237] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# -- tracing ----------------------------------------------------------------------------
def _symbolic_int(p: Param) -> bool:
    return p.attr_type in (AttrType.INT, AttrType.INTS) and not p.is_bool


def _example_sizes(site: Site) -> dict:
    taken = {d for t in site.tensors if t is not None for d in t.dims if isinstance(d, int)}
    free = (s for s in _SIZES if s not in taken)
    symbols = sorted({d for t in site.tensors if t is not None for d in t.dims if isinstance(d, str)})
    return {s: next(free) for s in symbols}


def _example(sig: TensorSig, sizes: dict, generator: torch.Generator) -> torch.Tensor:
    shape = [sizes[d] if isinstance(d, str) else d for d in sig.dims]
    if sig.dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(sig.dtype)
    return torch.zeros(shape, dtype=sig.dtype)  # NOTE: 0 is a valid index into any non-empty dim


def _flat_roles(spec: OpSpec, site: Site, symbolic: bool) -> list[tuple]:
    """The traced module's inputs, in order: ("tensor", input index, param) for each present tensor,
    and, when ``symbolic``, ("int", param, element index or None) for each int attribute value."""
    roles, values, tensors = [], dict(site.attrs), iter(enumerate(site.tensors))
    for p in spec.params:
        if p.is_tensor:
            i, sig = next(tensors)
            if sig is not None:
                roles.append(("tensor", i, p))
        elif symbolic and _symbolic_int(p):
            v = values[p.name]
            roles += [("int", p, j) for j in range(len(v))] if isinstance(v, tuple) else [("int", p, None)]
    return roles


def _flat_values(roles: list[tuple], site: Site, tensors: Sequence) -> list:
    """Values for ``roles``: the given tensors (one per present input) and the site's ints."""
    values, it, out = dict(site.attrs), iter(tensors), []
    for role in roles:
        if role[0] == "tensor":
            out.append(next(it))
        else:
            v = values[role[1].name]
            out.append(int(v if role[2] is None else v[role[2]]))
    return out


def _call_args(spec: OpSpec, site: Site, roles: list[tuple], flat: Sequence) -> tuple[list, dict]:
    """The op's arguments (positional, keyword-only) from the flat inputs and the site's constants."""
    values = {n: list(v) if isinstance(v, tuple) else v for n, v in site.attrs}
    for p in spec.tensors:
        values[p.name] = None
    for role, value in zip(roles, flat):
        if role[0] == "tensor":
            values[role[2].name] = value
        elif role[2] is None:
            values[role[1].name] = value
        else:
            values[role[1].name][role[2]] = value
    args, kwargs = [], {}
    for p, arg in zip(spec.params, spec.overload._schema.arguments):
        if arg.kwarg_only:
            kwargs[p.name] = values[p.name]
        else:
            args.append(values[p.name])
    return args, kwargs


class _Call(torch.nn.Module):
    def __init__(self, spec: OpSpec, fn: Callable, site: Site, roles: list[tuple]):
        super().__init__()
        self.spec, self.fn, self.site, self.roles = spec, fn, site, roles

    def forward(self, *inputs):
        args, kwargs = _call_args(self.spec, self.site, self.roles, inputs)
        out = self.fn(*args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _export_program(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], sizes: dict):
    g = torch.Generator().manual_seed(0)
    flat = _flat_values(roles, site, [_example(t, sizes, g) for t in site.tensors if t is not None])
    # NOTE: every dim and int dynamic; AUTO (not DYNAMIC) lets the trace fix what it must, which is
    # then checked: a fixed dim the model has dynamic refuses the body, a fixed int keys it by value.
    dynamic = [{d: Dim.AUTO for d in range(v.dim())} if isinstance(v, torch.Tensor) else Dim.AUTO for v in flat]
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(_Call(spec, fn, site, roles), tuple(flat), dynamic_shapes=(tuple(dynamic),),
                                       strict=False)
    except Exception as e:  # noqa: BLE001  whatever the trace trips on is the reason, in one line
        raise _Untraceable(f"tracing its implementation failed ({_one_line(e)})") from None


_onnx_registries: dict[int, Any] = {}


def _onnx_export(program, opset: int, registry: Registry):
    nested = {}
    for node in program.graph.nodes:
        inner = registry.for_overload(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
        if inner is None:
            continue
        if inner.function is not None:
            nested[node.target] = inner  # NOTE: stays a node, run by its written body
        elif not torch._C._dispatch_has_kernel_for_dispatch_key(inner.overload.name(), "CompositeImplicitAutograd"):
            raise _Untraceable(f"its implementation calls custom op {inner.qualname}, which has no written body "
                               "(derived bodies do not nest)")
    if nested or _onnx_core is None:  # NOTE: an implementation calling bridged ops: their translations
        return torch.onnx.export(program, dynamo=True, opset_version=opset, optimize=True, verify=False,
                                 external_data=False,
                                 custom_translation_table={t: translation(s) for t, s in nested.items()})
    # NOTE: torch.onnx.export builds its registry of ATen translations anew on every call (seconds);
    # a body per site would pay that each time, so it is built here once per opset, as
    # torch.onnx.export builds it, and handed to the exporter torch.onnx.export calls.
    if opset not in _onnx_registries:
        _onnx_registries[opset] = _onnx_registration.ONNXRegistry.from_torchlib(
            opset_version=max(opset, _onnx_constants.TORCHLIB_OPSET))
    return _onnx_core.export(program, registry=_onnx_registries[opset], optimize=True, verify=False,
                             opset_version=opset, verbose=False)


def _to_onnx(program, opset: int, registry: Registry) -> onnx.ModelProto:
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnx_program = _onnx_export(program, opset, registry)
    except Exception as e:  # noqa: BLE001
        raise _Untraceable(f"torch.onnx could not translate its trace ({_one_line(e)})") from None
    return onnx_program.model_proto


# -- ScatterND with a reduction -> ScatterElements -------------------------------------------
def _value_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    out = {v.name: v.type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    for t in graph.initializer:
        out[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return out


def _last_dim(type_proto: onnx.TypeProto | None) -> int | None:
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = type_proto.tensor_type.shape.dim
    return dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None


def _deterministic_scatter(node: onnx.NodeProto, k: int) -> list[onnx.NodeProto]:
    """ScatterND(data, indices[..., k], updates, reduction=r) as ScatterElements on data seen as
    [prod(dims[:k]), prod(dims[k:])]: the same result, accumulated in index order."""
    data, indices, updates = node.input
    p = (node.name or node.output[0]) + "__det_"
    reduction = next(a.s.decode() for a in node.attribute if a.name == "reduction")

    def const(name, values):
        return helper.make_node("Constant", [], [p + name], value=helper.make_tensor(
            p + name, onnx.TensorProto.INT64, [len(values)], values))

    out = [const("zero", [0]), const("k", [k]), const("big", [2**62]), const("last", [-1]), const("one", [1]),
           helper.make_node("Shape", [data], [p + "shape"]),
           helper.make_node("Slice", [p + "shape", p + "zero", p + "k"], [p + "lead"]),
           helper.make_node("Slice", [p + "shape", p + "k", p + "big"], [p + "rest"]),
           helper.make_node("ReduceProd", [p + "lead"], [p + "n"], keepdims=1),
           helper.make_node("ReduceProd", [p + "rest"], [p + "r"], keepdims=1),
           helper.make_node("Concat", [p + "n", p + "r"], [p + "flat_shape"], axis=0),
           helper.make_node("Reshape", [data, p + "flat_shape"], [p + "flat"]),
           # negative indices count from the end, as ScatterND reads them
           helper.make_node("Less", [indices, p + "zero"], [p + "neg"]),
           helper.make_node("Add", [indices, p + "lead"], [p + "wrapped"]),
           helper.make_node("Where", [p + "neg", p + "wrapped", indices], [p + "idx"])]
    strides = []
    for i in range(k):  # stride of index column i: prod(dims[i+1:k])
        out += [const(f"s{i}", [i + 1]),
                helper.make_node("Slice", [p + "lead", p + f"s{i}", p + "k"], [p + f"tail{i}"]),
                helper.make_node("ReduceProd", [p + f"tail{i}"], [p + f"stride{i}"], keepdims=1)]
        strides.append(p + f"stride{i}")
    out += [helper.make_node("Concat", strides, [p + "strides"], axis=0),
            helper.make_node("Mul", [p + "idx", p + "strides"], [p + "scaled"]),
            helper.make_node("ReduceSum", [p + "scaled", p + "last"], [p + "lin"], keepdims=0),
            helper.make_node("Reshape", [p + "lin", p + "last"], [p + "rows"]),
            helper.make_node("Shape", [p + "rows"], [p + "m"]),
            helper.make_node("Concat", [p + "m", p + "r"], [p + "upd_shape"], axis=0),
            helper.make_node("Reshape", [updates, p + "upd_shape"], [p + "upd"]),
            helper.make_node("Unsqueeze", [p + "rows", p + "one"], [p + "col"]),
            helper.make_node("Expand", [p + "col", p + "upd_shape"], [p + "where"]),
            helper.make_node("ScatterElements", [p + "flat", p + "where", p + "upd"], [p + "scattered"],
                             axis=0, reduction=reduction),
            helper.make_node("Reshape", [p + "scattered", p + "shape"], [node.output[0]])]
    return out


def _avoid_racy_scatter(model: onnx.ModelProto) -> None:
    """Rewrite each main-graph ScatterND with a reduction (racy in onnxruntime's threaded CPU kernel
    over duplicate indices) to ScatterElements; raise where one cannot be rewritten."""
    types = _value_types(model.graph)
    nodes = []
    for node in model.graph.node:
        reduction = next((a.s.decode() for a in node.attribute if a.name == "reduction"), "none")
        if node.op_type == "ScatterND" and node.domain in ("", "ai.onnx") and reduction in _REDUCING_SCATTER:
            k = _last_dim(types.get(node.input[1]))
            if not k:
                raise _Untraceable(
                    f"torch.onnx translated it to ScatterND(reduction={reduction}), which onnxruntime runs "
                    "nondeterministically over duplicate indices, and the index depth is not static, so "
                    "opbridge cannot rewrite it to ScatterElements")
            nodes.extend(_deterministic_scatter(node, k))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _racy_nodes(nodes) -> list[str]:
    found = []
    for node in nodes:
        reduction = next((a.s.decode() for a in node.attribute if a.name == "reduction"), "none")
        if node.op_type == "ScatterND" and reduction in _REDUCING_SCATTER:
            found.append(f"ScatterND(reduction={reduction})")
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                found += _racy_nodes(g.node)
    return found


# -- graph -> FunctionProto ------------------------------------------------------------------
class _Names:
    """Value names inside the body: op inputs keep the op's names, nothing else may take them."""

    def __init__(self, reserved: set[str]):
        self.reserved, self.map, self.used = set(reserved), {}, set(reserved)

    def __call__(self, name: str) -> str:
        if not name:
            return name
        if name not in self.map:
            new, i = name, 0
            while new in self.used:
                i += 1
                new = f"{name}__{i}"
            self.map[name] = new
            self.used.add(new)
        return self.map[name]

    def fresh(self, hint: str) -> str:
        new, i = hint, 0
        while new in self.used or new in self.map:
            i += 1
            new = f"{hint}__{i}"
        self.used.add(new)
        return new


def _renamed(node: onnx.NodeProto, names: _Names) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    out.input[:] = [names(n) for n in node.input]
    out.output[:] = [names(n) for n in node.output]
    for a in out.attribute:  # NOTE: subgraphs read outer values by name
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            _rename_graph(g, names)
    return out


def _rename_graph(graph: onnx.GraphProto, names: _Names) -> None:
    for v in list(graph.input) + list(graph.output) + list(graph.value_info):
        v.name = names(v.name)
    for t in graph.initializer:
        t.name = names(t.name)
    renamed = [_renamed(n, names) for n in graph.node]
    del graph.node[:]
    graph.node.extend(renamed)


def _ref(attr: str, kind: int, ref: str) -> onnx.AttributeProto:
    a = onnx.AttributeProto()
    a.name, a.type, a.ref_attr_name = attr, kind, ref
    return a


def _function(spec: OpSpec, model: onnx.ModelProto, roles: dict[str, tuple], parametric: set[str]) -> onnx.FunctionProto:
    graph = model.graph
    names = _Names({p.name for p in spec.params})
    nodes: list[onnx.NodeProto] = []
    whole: set[str] = set()  # int[] attributes whose Constant (all elements) is emitted
    for inp in graph.input:
        role = roles[inp.name]
        if role[0] == "tensor" or role[2] is None:  # a tensor, or an int attribute: the op's own name
            p = role[2] if role[0] == "tensor" else role[1]
            names.map[inp.name] = p.name
            if role[0] == "int":
                node = helper.make_node("Constant", [], [p.name])
                node.attribute.append(_ref("value_int", onnx.AttributeProto.INT, p.name))
                nodes.append(node)
            continue
        _, p, j = role  # one element of an int[] attribute
        if p.name not in whole:
            whole.add(p.name)
            node = helper.make_node("Constant", [], [p.name])
            node.attribute.append(_ref("value_ints", onnx.AttributeProto.INTS, p.name))
            nodes.append(node)
        index = names.fresh(f"{p.name}_{j}_index")
        nodes += [helper.make_node("Constant", [], [index], value_int=j),
                  helper.make_node("Gather", [p.name, index], [names.fresh(f"{p.name}_{j}")], axis=0)]
        names.map[inp.name] = nodes[-1].output[0]
    for t in graph.initializer:
        nodes.append(helper.make_node("Constant", [], [names(t.name)], value=t))
    nodes += [_renamed(n, names) for n in graph.node]
    outputs, seen = [], set()
    produced = {o for n in nodes for o in n.output}
    for o in graph.output:
        name = names(o.name)
        if name not in produced or name in seen:  # an input or a repeated value: give it its own output
            copy = names.fresh(f"{name}__out")
            nodes.append(helper.make_node("Identity", [name], [copy]))
            name = copy
        seen.add(name)
        outputs.append(name)
    attrs = [p for p in spec.attributes if p.name in parametric]
    proto = helper.make_function(
        spec.domain, spec.name, [p.name for p in spec.tensors], outputs, nodes,
        opset_imports=list(model.opset_import),
        attributes=[p.name for p in attrs if not p.has_default or p.default is None],
        doc_string=f"derived by opbridge from the PyTorch implementation of {spec.qualname}")
    for p in attrs:
        if p.has_default and p.default is not None:  # NOTE: an omitted optional (None) has no ONNX value
            proto.attribute_proto.append(helper.make_attribute(p.name, p.to_onnx_value(p.default)))
    return proto


# -- self-check ----------------------------------------------------------------------------
def _onnx_attrs(spec: OpSpec, site: Site) -> dict:
    values = dict(site.attrs)
    return {p.name: p.to_onnx_value(values[p.name]) for p in spec.attributes if values[p.name] is not None}


def _wrap(spec: OpSpec, site: Site, proto: onnx.FunctionProto, outputs: Sequence[tuple[torch.dtype, int]]
          ) -> onnx.ModelProto:
    """A one-node model calling ``proto`` at ``site``; ``outputs`` gives each output's dtype and rank."""
    inputs, names = [], []
    for p, sig in zip(spec.tensors, site.tensors):
        names.append("" if sig is None else p.name)
        if sig is not None:
            inputs.append(helper.make_tensor_value_info(p.name, TORCH_TO_ONNX[sig.dtype], list(sig.dims)))
    while names and not names[-1]:
        names.pop()
    out_names = [f"out{i}" for i in range(len(outputs))]
    node = helper.make_node(spec.name, names, out_names, domain=spec.domain, **_onnx_attrs(spec, site))
    graph = helper.make_graph([node], f"{spec.name}_body_check", inputs, [
        helper.make_tensor_value_info(n, TORCH_TO_ONNX[dtype], [None] * rank)
        for n, (dtype, rank) in zip(out_names, outputs)])
    opsets = {o.domain: o.version for o in proto.opset_import}
    opsets[spec.domain] = spec.version
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                             functions=[proto], ir_version=10)


def _verify(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], proto: onnx.FunctionProto, sizes: dict,
            outputs: Sequence[tuple[torch.dtype, int]]) -> None:
    model = _wrap(spec, site, proto, outputs)
    try:
        onnx.checker.check_model(model, full_check=True)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        raise _Untraceable(f"the derived body does not load ({_one_line(e)})") from None
    trials = [sizes] + ([{s: n + _ALT_STEP for s, n in sizes.items()}] if sizes else [])
    for trial in trials:
        g = torch.Generator().manual_seed(0)
        tensors = [None if t is None else _example(t, trial, g) for t in site.tensors]
        present = [t for t in tensors if t is not None]
        try:
            args, kwargs = _call_args(spec, site, roles, _flat_values(roles, site, [t.clone() for t in present]))
            with torch.no_grad():
                expected = fn(*args, **kwargs)
        except Exception:  # noqa: BLE001  eager refuses these sizes: nothing to compare
            continue
        expected = tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)
        feed = {p.name: t.numpy() if t.dtype != torch.bfloat16 else t.float().numpy()
                for p, t in zip(spec.tensors, tensors) if t is not None}
        try:
            got = sess.run(None, feed)
        except Exception as e:  # noqa: BLE001
            raise _Untraceable(f"the derived body fails in onnxruntime at sizes {trial} ({_one_line(e)})") from None
        for i, (e, a) in enumerate(zip(expected, got)):
            problem = _differs(e, a)
            if problem:
                where = f" at dynamic sizes {trial}" if trial is not sizes else ""
                raise _Untraceable(f"the derived body differs from eager{where}: output {i} {problem} "
                                   "(the trace fixed a size- or value-dependent choice)")


def _differs(expected: torch.Tensor, actual: np.ndarray) -> str | None:
    if tuple(expected.shape) != tuple(actual.shape):
        return f"has shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
    if expected.dtype in TORCH_TO_ONNX and actual.dtype != numpy_dtype(expected.dtype) and \
            expected.dtype != torch.bfloat16:
        return f"has dtype {actual.dtype}, eager {expected.dtype}"
    rtol, atol = _VERIFY_TOL.get(expected.dtype, (0.0, 0.0))
    e = expected.detach().double().numpy()
    a = actual.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~((e == a) | (np.isnan(e) & np.isnan(a)) | (np.abs(a - e) <= atol + rtol * np.abs(e)))
    if bad.any():
        return f"differs by up to {float(np.nanmax(np.where(bad, np.abs(a - e), 0))):.3g}"
    return None


# -- deriving, cached ---------------------------------------------------------------------------
_bodies: dict[tuple, list[Derived]] = {}  # (op, torch op, structure, opset) -> bodies derived so far
_failed: dict[tuple, str] = {}  # ... + site -> why no body
_values_only: set[tuple] = set()  # (key, signs of the ints) whose symbolic-int trace failed once
_last_failure: dict[str, str] = {}


class _Undecided(Exception):
    pass


class _Symbol:
    """A dynamic size inside a guard: equal to itself; any other question about it is undecided."""

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other):
        if isinstance(other, _Symbol) and other.name == self.name:
            return True
        raise _Undecided

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(self.name)

    def _undecided(self, *_):
        raise _Undecided

    __lt__ = __le__ = __gt__ = __ge__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _undecided
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __neg__ = __truediv__ = __rtruediv__ = _undecided
    __bool__ = __index__ = __int__ = __pow__ = _undecided


class _GuardTensor:
    def __init__(self, dims):
        self.dims = [(_Symbol(d) if isinstance(d, str) else d) for d in dims]

    def size(self, d=None):
        return self.dims if d is None else self.dims[d]

    def dim(self):
        return len(self.dims)

    def stride(self, d=None):
        if any(isinstance(x, _Symbol) for x in self.dims):
            raise _Undecided
        strides = [math.prod(self.dims[i + 1:]) for i in range(len(self.dims))]
        return strides if d is None else strides[d]

    def storage_offset(self):
        return 0


def _guard_holds(guard: str, scope: dict) -> bool:
    """A torch.export guard at a site: True, False, or (a dynamic size involved) assumed True."""
    try:
        return bool(eval(guard, {"__builtins__": {}, "min": min, "max": max, "abs": abs, "math": math}, scope))  # noqa: S307
    except _Undecided:
        return True
    except Exception:  # noqa: BLE001  a guard this evaluator does not understand: the body is not shared
        return False


def derive(spec: OpSpec, site: Site, opset: int = 20, registry: Registry | None = None) -> Derived:
    """The op's body at ``site``, derived from its implementation (or an earlier body that fits).

    Int attributes are first traced symbolic (FunctionProto attributes); where that trace fails, they
    are traced as the site's values. Raises :class:`NoPortableBody` with the one-line reason when the
    implementation cannot be traced or translated, or its body does not match eager.

    Example:
        >>> import torch, bridge, custom_ops
        >>> spec = bridge.REGISTRY.get("opbridge::paste")
        >>> site = Site((TensorSig(torch.float32, ("n", 6, 7)), TensorSig(torch.float32, ("n", 3, 4))),
        ...             (("left", 2), ("top", 1)))
        >>> body = derive(spec, site)
        >>> body.proto.domain, body.proto.name, list(body.proto.input), body.parametric
        ('opbridge', 'paste', ['image', 'patch'], ('left', 'top'))
    """
    reg = REGISTRY if registry is None else registry
    key = (spec.qualname, id(spec.custom_op), site.structure, opset)
    for body in _bodies.get(key, []):
        if _fits(body, spec, site):
            return body
    if key + (site,) in _failed:
        raise NoPortableBody(spec.qualname, _failed[key + (site,)])
    try:
        fn = implementation(spec)
        with step(f"derive the ONNX body of {spec.qualname} ({site.describe()})"), _quiet():
            body = None
            signs = (key, tuple(v < 0 for v in _ints(spec, site)))
            if signs not in _values_only and any(_symbolic_int(p) for p in spec.attributes):
                try:
                    body = _derive(spec, fn, site, opset, reg, symbolic=True)
                except _Untraceable:
                    _values_only.add(signs)  # NOTE: later sites like this one skip the symbolic attempt
            if body is None:
                body = _derive(spec, fn, site, opset, reg, symbolic=False)
    except NoPortableBody as e:
        _failed[key + (site,)] = _last_failure[spec.qualname] = e.reason
        raise
    except _Untraceable as e:
        _failed[key + (site,)] = _last_failure[spec.qualname] = str(e)
        raise NoPortableBody(spec.qualname, str(e)) from None
    _bodies.setdefault(key, []).append(body)
    _last_failure.pop(spec.qualname, None)
    return body


@contextlib.contextmanager
def _quiet():
    """torch's warnings while tracing (0/1 specialisation, guard evaluation) are the trace's business:
    what matters reaches the user as the reason, or through the self-check."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _ints(spec: OpSpec, site: Site) -> list[int]:
    values = dict(site.attrs)
    return [int(x) for p in spec.attributes if _symbolic_int(p)
            for x in (values[p.name] if isinstance(values[p.name], tuple) else (values[p.name],))]


def last_failure(qualname: str) -> str | None:
    """The reason the latest derivation for ``qualname`` failed (None after a success or none tried)."""
    return _last_failure.get(qualname)


def _fits(body: Derived, spec: OpSpec, site: Site) -> bool:
    if site.structure != body.structure:
        return False
    values = dict(site.attrs)
    if any(values[n] != v for n, v in body.fixed):
        return False
    if any(site.tensors[i].dims[d] != size for i, d, size in body.fixed_dims):
        return False
    roles = _flat_roles(spec, site, symbolic=bool(body.parametric))
    inputs = _flat_values(roles, site, [_GuardTensor(t.dims) for t in site.tensors if t is not None])
    return all(_guard_holds(g, {"L": {"inputs": inputs}}) for g in body.guards)


def _derive(spec: OpSpec, fn: Callable, site: Site, opset: int, registry: Registry, symbolic: bool) -> Derived:
    sizes = _example_sizes(site)
    roles = _flat_roles(spec, site, symbolic)
    program = _export_program(spec, fn, site, roles, sizes)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"
                    and n.name in program.graph_signature.user_inputs]
    by_name, fixed_dims, fixed_ints = {}, [], set()
    for node, role in zip(placeholders, roles):
        by_name[node.name] = role
        val = node.meta.get("val")
        if role[0] == "tensor":
            for d, size in enumerate(val.shape):
                if isinstance(size, int):
                    if isinstance(site.tensors[role[1]].dims[d], str):
                        raise _Untraceable(f"its implementation fixes dim {d} of '{role[2].name}' to {size}, "
                                           "which the model has dynamic")
                    fixed_dims.append((role[1], d, size))
        elif not isinstance(val, torch.SymInt):
            fixed_ints.add(role[1].name)
    out_node = program.graph.output_node()
    outputs = list(out_node.args[0]) if out_node.args else []
    if len(outputs) != spec.num_outputs or not all(isinstance(o, torch.fx.Node) for o in outputs):
        raise _Untraceable(f"its implementation returns {len(outputs)} values, the op declares "
                           f"{spec.num_outputs} tensors")
    model = _to_onnx(program, opset, registry)
    for node in model.graph.node:
        if is_custom(node.domain) and registry.find(node.domain, node.op_type) is None:
            raise _Untraceable(f"its trace holds custom node {node.domain}::{node.op_type}, which opbridge has "
                               "no record of")
    _avoid_racy_scatter(model)
    racy = _racy_nodes(model.graph.node)
    if racy:
        raise _Untraceable(f"torch.onnx translated it to {racy[0]}, which onnxruntime runs nondeterministically "
                           "over duplicate indices")
    parametric = {r[1].name for r in roles if r[0] == "int"} - fixed_ints
    proto = _function(spec, model, by_name, parametric)
    _verify(spec, fn, site, roles, proto, sizes, [(o.meta["val"].dtype, o.meta["val"].dim()) for o in outputs])
    guards = tuple(getattr(program, "_guards_code", ()) or ())
    fixed = tuple((n, v) for n, v in site.attrs if n not in parametric)
    return Derived(proto, site.structure, fixed, tuple(fixed_dims), guards,
                   tuple(p.name for p in spec.attributes if p.name in parametric))


# -- export sites and the model ------------------------------------------------------------------
def _model_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    types = _value_types(model.graph)
    wanted = {n for node in model.graph.node if is_custom(node.domain) for n in node.input if n}
    if not wanted <= types.keys():
        try:
            types = {**_value_types(onnx.shape_inference.infer_shapes(model).graph), **types}
        except Exception:  # noqa: BLE001  what inference cannot type is reported per node
            pass
    return types


def site_of(spec: OpSpec, node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> Site:
    """The export site of ``node`` (a node of ``spec``'s op): its input types and attribute values."""
    tensors = []
    for i, p in enumerate(spec.tensors):
        name = node.input[i] if i < len(node.input) else ""
        if not name:
            tensors.append(None)
            continue
        t = types.get(name)
        if t is None or not t.tensor_type.HasField("shape"):
            raise _Untraceable(f"the model records no type and shape for its input '{p.name}' ({name})")
        try:
            dtype = torch_dtype(t.tensor_type.elem_type)
        except TypeError as e:
            raise _Untraceable(_one_line(e)) from None
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{name}:{k}")
                     for k, d in enumerate(t.tensor_type.shape.dim))
        tensors.append(TensorSig(dtype, dims))
    given = {a.name: a for a in node.attribute}
    attrs = []
    for p in spec.attributes:
        if p.name in given:
            attrs.append((p.name, p.from_onnx_value(helper.get_attribute_value(given[p.name]))))
        elif p.has_default:
            attrs.append((p.name, p.default))
        else:
            raise _Untraceable(f"the node lacks its attribute '{p.name}'")
    return Site(tuple(tensors), tuple(attrs))


def sample_site(spec: OpSpec, sample: SampleInput) -> Site:
    """The site of one sample call (static sizes; the trace still makes every dim dynamic).

    Example:
        >>> import torch, bridge, custom_ops
        >>> spec = bridge.REGISTRY.get("opbridge::crop")
        >>> sample_site(spec, spec.sample_inputs(torch.float32)[0]).describe()
        'float32[3,6,7], box=(1, 2, 5, 4)'
    """
    bound = spec.bind(*sample.args, **sample.kwargs)
    tensors = tuple(None if bound[p.name] is None else TensorSig(bound[p.name].dtype, tuple(bound[p.name].shape))
                    for p in spec.tensors)
    return Site(tensors, tuple((p.name, bound[p.name]) for p in spec.attributes))


def attach_derived(model: onnx.ModelProto, registry: Registry) -> list[str]:
    """Add a derived body to ``model.functions`` for each custom node whose op has no written body and
    no model-local function; return the ops given one. Sites of one op that need different bodies
    (other baked attribute values, dtypes) get one body each, told apart by ``overload``. Ops whose
    implementation cannot be traced are skipped (:func:`last_failure` says why).

    Example:
        >>> import torch, bridge
        >>> reg = bridge.Registry()
        >>> @bridge.op("doc_derive::scaled_sum", fake=lambda x, k: x.new_empty(x.shape[:-1]), registry=reg)
        ... def scaled_sum(x: torch.Tensor, k: int) -> torch.Tensor:
        ...     return x.sum(-1) * k
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return scaled_sum(x, 3)
        >>> proto = bridge.export(M(), (torch.randn(2, 5),), registry=reg)   # attach_derived runs in export
        >>> [(f.name, list(f.attribute)) for f in proto.functions]
        [('scaled_sum', ['k'])]
    """
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    local = {(f.domain, f.name, f.overload) for f in model.functions}
    todo = []
    for node in model.graph.node:
        if is_custom(node.domain) and (node.domain, node.op_type, node.overload) not in local:
            spec = registry.find(node.domain, node.op_type)
            if spec is not None and spec.function is None:
                todo.append((node, spec))
    if not todo or opset is None:
        return []
    types = _model_types(model)
    uses: dict[tuple[str, str], list[tuple[onnx.NodeProto, Derived]]] = {}
    for node, spec in todo:
        try:
            body = derive(spec, site_of(spec, node, types), opset, registry)
        except NoPortableBody:
            continue
        except _Untraceable as e:
            _last_failure[spec.qualname] = str(e)
            continue
        uses.setdefault((spec.domain, spec.name), []).append((node, body))
    added = []
    for (domain, name), pairs in uses.items():
        bodies = list({id(b): b for _, b in pairs}.values())
        spec = registry.find(domain, name)
        for body in bodies:
            proto = _with_guards(body.proto, spec)
            # NOTE: one body keeps the plain name; several are told apart as ONNX function overloads
            proto.overload = "" if len(bodies) == 1 else \
                "derived_" + hashlib.sha1(body.proto.SerializeToString()).hexdigest()[:10]
            model.functions.append(proto)
            for node, b in pairs:
                if b is body:
                    node.overload = proto.overload
            _import_opsets(model, proto, registry)
        if len(bodies) > 1:
            model.ir_version = max(model.ir_version, 10)  # overloads are IR 10
        added.append(registry.find(domain, name).qualname)
    return added


def _with_guards(proto: onnx.FunctionProto, spec: OpSpec) -> onnx.FunctionProto:
    """A copy of a derived body, with the op's check guards (bridge.core.checks) where the body keeps
    every attribute they read as a function attribute."""
    if spec.checks is not None:
        names = {*proto.attribute, *(a.name for a in proto.attribute_proto)}  # without and with defaults
        kept = {p.name: getattr(onnx.AttributeProto, p.attr_type.name) for p in spec.attributes if p.name in names}
        # NOTE: a check reading an attribute baked into this body (its value was checked when the
        # body was traced) gets no guard; every other check keeps its own
        guarded = guarded_body(proto, spec.checks, kept, skip=list(unreadable(proto, spec.checks, kept)))
        if guarded is not proto:
            return guarded
    copy = onnx.FunctionProto()
    copy.CopyFrom(proto)
    return copy


def _import_opsets(model: onnx.ModelProto, proto: onnx.FunctionProto, registry: Registry) -> None:
    have = {o.domain for o in model.opset_import}
    for imp in proto.opset_import:
        if imp.domain not in have:
            model.opset_import.append(helper.make_opsetid(imp.domain, imp.version))
            have.add(imp.domain)
    for node in proto.node:  # a written body of an op the implementation calls
        if is_custom(node.domain) and not any((f.domain, f.name) == (node.domain, node.op_type)
                                              for f in model.functions):
            spec = registry.find(node.domain, node.op_type)
            if spec is not None and spec.function is not None:
                model.functions.append(spec.function.to_function_proto())


# -- status for `opbridge ops`, tiers and `--show-body` ---------------------------------------------
def _status_dtype(spec: OpSpec, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]


def body_status(spec: OpSpec, dtype: torch.dtype | None = None, opset: int = 20,
                registry: Registry | None = None) -> tuple[str, str | None]:
    """Where the op's portable body comes from: ``("written", None)``, ``("derived", note)`` (derived
    from the first sample at ``dtype``; the note says when there is no sample to try), or
    ``("none", reason)``.

    Example:
        >>> import torch, bridge, custom_ops
        >>> body_status(bridge.REGISTRY.get("opbridge::crop"))
        ('written', None)
    """
    if spec.function is not None:
        return "written", None
    try:
        implementation(spec)
    except NoPortableBody as e:
        return "none", e.reason
    dtype = _status_dtype(spec, dtype)
    samples = spec.sample_inputs(dtype) if spec.sample_inputs is not None else []
    if not samples:
        return "derived", "derived at each export (no sample inputs to try it here)"
    try:
        derive(spec, sample_site(spec, samples[0]), opset, registry)
    except NoPortableBody as e:
        return "none", e.reason
    return "derived", None


def show_body(spec: OpSpec, dtype: torch.dtype | None = None, opset: int = 20,
              registry: Registry | None = None) -> str:
    """The op's portable body as onnx.printer text: the written one, or the one derived from its
    first sample at ``dtype`` (a comment line says which)."""
    if spec.function is not None:
        return f"# {spec.qualname}: written body\n" + onnx.printer.to_text(spec.function.to_function_proto())
    dtype = _status_dtype(spec, dtype)
    samples = spec.sample_inputs(dtype) if spec.sample_inputs is not None else []
    if not samples:
        implementation(spec)
        raise OpBridgeError(f"{spec.qualname}: its body is derived at each export site, and it has no sample "
                            "inputs to derive one from here. Got no samples. Register samples "
                            "(op.register_samples), or export a model and read model.functions.")
    site = sample_site(spec, samples[0])
    body = derive(spec, site, opset, registry)
    baked = ", ".join(f"{n}={v!r}" for n, v in body.fixed) or "none"
    head = (f"# {spec.qualname}: derived from its implementation at {site.describe()} "
            f"(attributes read from the node: {', '.join(body.parametric) or 'none'}; baked in: {baked})")
    return head + "\n" + onnx.printer.to_text(body.proto)
