"""Deriving a body at a site: int attributes traced symbolic first (the body reads them from the
node), else baked in. A body serves the exact site it was derived (and verified) for: its dtypes,
dims and attribute values (``Site.key``: -0.0 is not 0.0); bodies and failures are cached
(cache.CACHE) per site. Two sites share a function only where their bodies are the same bytes
(exporters.resolve), never because torch's guards seem to hold elsewhere."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import onnx
import torch

from bridge.core.basics.domains import is_custom
from bridge.core.basics.progress import step
from bridge.core.registry import REGISTRY, Registry
from bridge.core.spec import OpSpec
from exporters.derive.body import function_body
from exporters.derive.cache import CACHE, Generation
from exporters.derive.implementation import implementation
from exporters.derive.indices import index_checks
from exporters.derive.scatter import avoid_racy_scatter, racy_nodes
from exporters.derive.sites import Derived, NoPortableBody, Site, TensorSig, Untraceable  # noqa: F401  (doctest)
from exporters.derive.tracing import example_sizes, export_program, flat_roles, symbolic_int, to_onnx
from exporters.derive.verify import crash_lines, loads, refuse_aliases, verify


def derive(spec: OpSpec, site: Site, opset: int = 20, registry: Registry | None = None, *,
           translation: Callable | None = None) -> Derived:
    """The op's body at ``site``, derived from its implementation (once per site: cached), or
    exported with torch.onnx's ``translation`` of the op (``exporters.kinds.TranslatedBody``).

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
    cache = CACHE.of(reg)
    key = cache.key(spec, site, opset)
    if key in cache.bodies:
        return cache.bodies[key]
    if key in cache.failed:
        # NOTE: a cached failure is the latest failure too: last_failure (the function tier's reason) names it
        CACHE.fail(spec.qualname, cache.failed[key])
        raise NoPortableBody(spec.qualname, cache.failed[key])
    try:
        with step(f"derive the ONNX body of {spec.qualname} ({site.describe()})"), _quiet():
            body = _specialised(spec, site, opset, reg, cache, translation)
    except (NoPortableBody, Untraceable) as e:
        reason = e.reason if isinstance(e, NoPortableBody) else str(e)
        cache.failed[key] = reason
        CACHE.fail(spec.qualname, reason)
        raise NoPortableBody(spec.qualname, reason) from None
    cache.bodies[key] = body
    CACHE.fail(spec.qualname, None)
    return body


def last_failure(qualname: str) -> str | None:
    """The reason the latest derivation for ``qualname`` failed (None after a success or none tried)."""
    return CACHE.failure(qualname)


def _specialised(spec: OpSpec, site: Site, opset: int, registry: Registry, cache: Generation,
                 translation: Callable | None) -> Derived:
    """The body with int attributes symbolic where the trace allows, else with the site's values."""
    if translation is not None:  # NOTE: the op itself, kept opaque; a translation reads attributes as Python values
        return _derive(spec, spec.overload, site, opset, registry, symbolic=False, reused=translation)
    fn = implementation(spec)
    # NOTE: only a hint to skip a trace that failed at sites like this one; the body is derived per site
    signs = (spec.qualname, id(spec), site.structure, opset, tuple(v < 0 for v in _ints(spec, site)))
    if signs not in cache.values_only and any(symbolic_int(p) for p in spec.attributes):
        try:
            return _derive(spec, fn, site, opset, registry, symbolic=True)
        except Untraceable:
            cache.values_only.add(signs)  # NOTE: later sites like this one skip the symbolic attempt
    try:
        return _derive(spec, fn, site, opset, registry, symbolic=False)
    except Untraceable as general:
        if not any(isinstance(d, int) for t in site.tensors if t is not None for d in t.dims):
            raise
        # NOTE: the sizes the model has static, kept so: a trace making them general may fail where they are
        # known (mmcv's psa_mask: `%` of a size, which torch.onnx cannot translate on a symbol)
        try:
            return _derive(spec, fn, site, opset, registry, symbolic=False, static=True)
        except Untraceable:
            raise general from None


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
    return [int(x) for p in spec.attributes if symbolic_int(p) and values[p.name] is not None
            for x in (values[p.name] if isinstance(values[p.name], tuple) else (values[p.name],))]


# NOTE: torch's unbounded size (int_oo) compares above any int; a bound below this is a real one
_UNBOUNDED = 1 << 62


def _placeholders(program, site: Site, roles: list[tuple]) -> tuple[dict, set]:
    """Each traced input's role by its name, and the int attributes the trace fixed; a dim it fixed
    that the site has dynamic is refused."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"
                    and n.name in program.graph_signature.user_inputs]
    ranges = {str(symbol): bounds for symbol, bounds in program.range_constraints.items()}
    by_name, fixed_ints = {}, set()
    for node, role in zip(placeholders, roles):
        by_name[node.name] = role
        val = node.meta.get("val")
        if role[0] != "tensor":
            if not isinstance(val, torch.SymInt):
                fixed_ints.add(role[1].name)
            continue
        for d, size in enumerate(val.shape):
            if not isinstance(site.tensors[role[1]].dims[d], str):
                continue
            if isinstance(size, int):
                raise Untraceable(f"its implementation fixes dim {d} of '{role[2].name}' to {size}, "
                                  "which the model has dynamic")
            # NOTE: a guard on the traced size (x[:, :k] with k past it): the body holds in that range only
            bounds = ranges.get(str(size))
            if bounds is not None and bool(bounds.upper < _UNBOUNDED):
                raise Untraceable(f"its trace holds only for dim {d} of '{role[2].name}' from {bounds.lower} to "
                                  f"{bounds.upper} (the implementation chose by that size, as x[:, :k] does with a k "
                                  "past it), which the model has dynamic")
    return by_name, fixed_ints


def _outputs(program, spec: OpSpec) -> list:
    """The traced outputs (fx nodes), as many as the op declares."""
    out_node = program.graph.output_node()
    outputs = list(out_node.args[0]) if out_node.args else []
    if len(outputs) != spec.num_outputs or not all(isinstance(o, torch.fx.Node) for o in outputs):
        raise Untraceable(f"its implementation returns {len(outputs)} values, the op declares "
                          f"{spec.num_outputs} tensors")
    return outputs


def _translated(program, opset: int, registry: Registry, translated: dict) -> onnx.ModelProto:
    """The trace in ONNX, with only custom nodes opbridge knows and no racy ScatterND."""
    model = to_onnx(program, opset, registry, translated)
    for node in model.graph.node:
        if is_custom(node.domain) and registry.find(node.domain, node.op_type) is None:
            raise Untraceable(f"its trace holds custom node {node.domain}::{node.op_type}, which opbridge has "
                              "no record of")
    avoid_racy_scatter(model)
    racy = racy_nodes(model.graph.node)
    if racy:
        raise Untraceable(f"torch.onnx translated it to {racy[0]}, which onnxruntime runs nondeterministically "
                          "over duplicate indices")
    return model


def _derive(spec: OpSpec, fn: Callable, site: Site, opset: int, registry: Registry, symbolic: bool,
            reused: Callable | None = None, static: bool = False) -> Derived:
    sizes = example_sizes(site)
    roles = flat_roles(spec, site, symbolic)
    if reused is None:
        refuse_aliases(spec, fn, site, roles, sizes)
    program = export_program(spec, fn, site, roles, sizes, static=static)
    by_name, fixed_ints = _placeholders(program, site, roles)
    outputs = _outputs(program, spec)
    model = _translated(program, opset, registry, {} if reused is None else {spec.overload: reused})
    parametric = {r[1].name for r in roles if r[0] == "int"} - fixed_ints
    proto = function_body(spec, model, by_name, parametric)
    out_types = [(o.meta["val"].dtype, o.meta["val"].dim()) for o in outputs]
    if reused is None:
        crashes = verify(spec, fn, site, roles, proto, sizes, out_types)
        if crashes:  # NOTE: said in the body itself: the function tier refuses those sizes (files keep doc strings)
            proto.doc_string = "\n".join(filter(None, [proto.doc_string, crash_lines(crashes)]))
    else:
        # NOTE: torch.onnx's own translation: random example values are no valid input for such ops
        # (box indices, sorted scores), so it is only loaded here; parity runs on the model's inputs
        loads(spec, site, proto, out_types)
    fixed = tuple((n, v) for n, v in site.attrs if n not in parametric)
    return Derived(proto, fixed, tuple(p.name for p in spec.attributes if p.name in parametric),
                   index_checks(program, by_name) if reused is None else ())
