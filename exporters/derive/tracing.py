"""The op alone, traced and translated: its implementation called with the site's tensors (every
dim and int attribute dynamic) under ``torch.export``, then ``torch.onnx`` at the model's opset."""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Callable, Sequence

import onnx
import onnx_ir as ir
import torch
from onnx_ir.passes.common import InlinePass
from torch.export import Dim

from bridge.core.basics import torch_compat
from bridge.core.basics.graphs import ir_custom_nodes
from bridge.core.registry import Registry
from bridge.core.spec import AttrType, OpSpec, Param
from exporters.bodies.translation import translation
from exporters.derive.cache import CACHE
from exporters.derive.sites import Site, TensorSig, Untraceable, one_line

# NOTE: example sizes for dynamic dims: distinct primes, large enough that sizes computed from them
# (a slice past an offset) are rarely 0 or 1, which torch would specialise.
_SIZES = (17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79)


def symbolic_int(p: Param) -> bool:
    """Whether ``p`` is an int or int[] attribute (traced symbolic at first)."""
    return p.attr_type in (AttrType.INT, AttrType.INTS) and not p.is_bool


# NOTE: the most elements an example tensor may get from sizes raised past the int attributes
_ELEMENTS = 1 << 20


def example_sizes(site: Site, *, past_ints: bool = True) -> dict:
    """A size for each dim symbol of ``site``, none equal to a static size of it; ``past_ints``: each above
    every int attribute value where the example tensors stay small (``x[:, :k]`` traced at a size past k keeps
    its slice; traced below k, the slice is dropped and the body is wrong for sizes past k).

    >>> site = Site((TensorSig(torch.float32, (1, "n")),), (("k", 40),))
    >>> example_sizes(site), example_sizes(site, past_ints=False)
    ({'n': 57}, {'n': 17})
    """
    taken = {d for t in site.tensors if t is not None for d in t.dims if isinstance(d, int)}
    symbols = sorted({d for t in site.tensors if t is not None for d in t.dims if isinstance(d, str)})

    def pick(offset: int) -> dict:
        offset = max(offset, *dict(site.floors).values()) if site.floors else offset  # NOTE: no size below a floor
        free = (s + offset for s in _SIZES if s + offset not in taken)
        return {s: next(free) for s in symbols}

    ints = [v for _, value in site.attrs for v in (value if isinstance(value, tuple) else (value,))
            if isinstance(v, int) and not isinstance(v, bool)]
    sizes = pick(max([0, *ints]) if past_ints else 0)
    if any(math.prod(sizes.get(d, d) for d in t.dims) > _ELEMENTS for t in site.tensors if t is not None):
        return pick(0)
    return sizes


def example(sig: TensorSig, sizes: dict, generator: torch.Generator) -> torch.Tensor:
    """A tensor for ``sig`` at ``sizes``: random floats, zeros otherwise."""
    shape = [sizes[d] if isinstance(d, str) else d for d in sig.dims]
    if sig.dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(sig.dtype)
    return torch.zeros(shape, dtype=sig.dtype)  # NOTE: 0 is a valid index into any non-empty dim


def flat_roles(spec: OpSpec, site: Site, symbolic: bool) -> list[tuple]:
    """The traced module's inputs, in order: ("tensor", input index, param) for each present tensor,
    and, when ``symbolic``, ("int", param, element index or None) for each int attribute value."""
    roles: list[tuple] = []
    values, tensors = dict(site.attrs), iter(enumerate(site.tensors))
    for p in spec.params:
        if p.is_tensor:
            i, sig = next(tensors)
            if sig is not None:
                roles.append(("tensor", i, p))
        elif symbolic and symbolic_int(p) and values[p.name] is not None:
            # NOTE: an optional int passed None is no int to trace: it stays None (baked in, keyed by it)
            v = values[p.name]
            roles += [("int", p, j) for j in range(len(v))] if isinstance(v, tuple) else [("int", p, None)]
    return roles


def flat_values(roles: list[tuple], site: Site, tensors: Sequence) -> list:
    """Values for ``roles``: the given tensors (one per present input) and the site's ints."""
    values, it, out = dict(site.attrs), iter(tensors), []
    for role in roles:
        if role[0] == "tensor":
            out.append(next(it))
        else:
            v = values[role[1].name]
            out.append(int(v if role[2] is None else v[role[2]]))
    return out


def call_args(spec: OpSpec, site: Site, roles: list[tuple], flat: Sequence) -> tuple[list, dict]:
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
    args, kwargs = spec.call_args([values[p.name] for p in spec.params])
    return list(args), kwargs


class _Call(torch.nn.Module):
    def __init__(self, spec: OpSpec, fn: Callable, site: Site, roles: list[tuple]):
        super().__init__()
        self.spec, self.fn, self.site, self.roles = spec, fn, site, roles

    def forward(self, *inputs):
        args, kwargs = call_args(self.spec, self.site, self.roles, inputs)
        out = self.fn(*args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def example_inputs(roles: list[tuple], site: Site, sizes: dict) -> list:
    """The flat example inputs for ``roles`` at ``sizes`` (seeded: the same on every call)."""
    g = torch.Generator().manual_seed(0)
    return flat_values(roles, site, [example(t, sizes, g) for t in site.tensors if t is not None])


def export_program(spec: OpSpec, fn: Callable, site: Site, roles: list[tuple], sizes: dict, *, static: bool = False):
    """``fn`` at ``site`` under ``torch.export`` (non-strict), every dim and int dynamic; ``static``: the dims
    the site has static kept static."""
    flat = example_inputs(roles, site, sizes)
    # NOTE: every dim and int dynamic; AUTO (not DYNAMIC) lets the trace fix what it must, which is
    # then checked: a fixed dim the model has dynamic refuses the body, a fixed int keys it by value.
    sigs = iter(t for t in site.tensors if t is not None)
    dynamic = [{d: Dim.AUTO for d, size in enumerate(next(sigs).dims) if not (static and isinstance(size, int))}
               if isinstance(v, torch.Tensor) else Dim.AUTO for v in flat]
    try:
        # NOTE: stderr too: a failed torch.export prints its partial FX graph there (100s of lines), and a failed
        # trace here is an answer (no body, its reason said in one line), not the user's error
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(_Call(spec, fn, site, roles), tuple(flat), dynamic_shapes=(tuple(dynamic),),
                                       strict=False)
    except Exception as e:  # noqa: BLE001  whatever the trace trips on is the reason, in one line
        raise Untraceable(f"tracing its implementation failed ({one_line(e)})") from None


def _onnx_export(program, opset: int, registry: Registry, translated: dict):
    nested = {}
    for node in program.graph.nodes:
        inner = registry.for_overload(node.target) if isinstance(node.target, torch_compat.OpOverload) else None
        if inner is None or node.target in translated:
            continue
        if inner.function is not None:
            nested[node.target] = inner  # NOTE: stays a node, run by its written body
        elif not torch_compat.has_kernel(inner.overload.name(), "CompositeImplicitAutograd"):
            raise Untraceable(f"its implementation calls custom op {inner.qualname}, which has no written body "
                              "(derived bodies do not nest)")
    # NOTE: an implementation calling bridged ops: their translations, through the public entry point
    return onnx_program(program, opset, {**{t: translation(s) for t, s in nested.items()}, **translated},
                        public=bool(nested))


def program_calls(program: torch.export.ExportedProgram):
    """The call_function nodes of ``program``'s graph and of every subgraph (torch.cond / map branches)."""
    graphs = [m.graph for m in program.graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
    return (n for g in graphs for n in g.nodes if n.op == "call_function")


def onnx_program(program: torch.export.ExportedProgram, opset: int, table: dict, *, public: bool = False):
    """``torch.onnx.export(program, dynamo=True, custom_translation_table=table)`` at ``opset`` (an
    ONNXProgram), through torch.onnx's table of ATen translations built once per opset
    (``CACHE.onnx_registry``), and built again when ``program`` calls an op torch_lib translates that
    did not exist when it was built; ``public=True``: through torch.onnx.export itself.

    NOTE: torch.onnx.export builds that table anew on every call (about half a second): every export
    and every derived body goes through here instead. torch.onnx fills it from torch_lib only for
    ops that exist when it is built (torchvision's only with torchvision installed)."""
    base = None if public else CACHE.onnx_registry(opset)
    if base is None:  # NOTE: a torch without the exporter's internals: its public entry point
        with torch_compat.builtins_as_export_has_them():
            return optimize(torch.onnx.export(program, dynamo=True, custom_translation_table=table,
                                              opset_version=opset, optimize=False, verify=False, external_data=False))
    ops = {n.target for n in program_calls(program) if isinstance(n.target, torch_compat.OpOverload)}
    if any(torch_compat.lacks_translation(base, op) for op in ops):
        base = CACHE.onnx_registry(opset, fresh=True)
    with torch_compat.builtins_as_export_has_them():
        return optimize(torch_compat.onnx_export(
            program, torch_compat.with_translations(base, table) if table else base, opset))


# NOTE: torch.onnx's optimizer merges nodes whose attributes compare equal with == (onnx_ir's
# CommonSubexpressionEliminationPass), so op(x, 0.0) and op(x, -0.0) would become one node and one call
# would compute the other's answer. While it runs, each custom node with float attributes carries their
# exact values (float.hex) in this attribute too: calls merge only when their attributes are bitwise equal.
_EXACT_FLOATS = "_opbridge_exact_floats"
_FLOAT_TYPES = (ir.AttributeType.FLOAT, ir.AttributeType.FLOATS)


def optimize(program):
    """``program`` (an ONNXProgram) after torch.onnx's own optimization (``ONNXProgram.optimize()``:
    inlining, constant folding, rewrites, common subexpressions), where two custom nodes merge only when
    their attribute values are bitwise equal (``0.0`` and ``-0.0`` stay two calls)."""
    InlinePass()(program.model)  # NOTE: a node from a function body gets its actual values
    for node in ir_custom_nodes(program.model):
        floats = [f"{k}={_hex(a.value)}" for k, a in sorted(node.attributes.items()) if a.type in _FLOAT_TYPES]
        if floats:
            node.attributes[_EXACT_FLOATS] = ir.AttrString(_EXACT_FLOATS, " ".join(floats))
    program.optimize()
    for node in ir_custom_nodes(program.model):
        node.attributes.pop(_EXACT_FLOATS, None)
    return program


def _hex(value) -> str:
    return ",".join(float(v).hex() for v in value) if isinstance(value, Sequence) else float(value).hex()


def to_onnx(program, opset: int, registry: Registry, translated: dict | None = None) -> onnx.ModelProto:
    """The traced program as an ONNX model at ``opset`` (bridged ops it calls keep their written bodies;
    ``translated`` maps ops kept opaque to the translation torch.onnx gives them)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnx_program = _onnx_export(program, opset, registry, translated or {})
    except Exception as e:  # noqa: BLE001
        raise Untraceable(f"torch.onnx could not translate its trace ({one_line(e)})") from None
    return onnx_program.model_proto
