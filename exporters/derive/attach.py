"""Derived bodies attached to a model: one per custom node's op without a written body or a
model-local function, with the op's check guards; sites needing different bodies get one each,
told apart by ONNX function ``overload``."""

from __future__ import annotations

import hashlib

import onnx
from onnx import helper

from bridge.core.domains import is_custom
from bridge.core.graphs import custom_nodes, model_value_types
from bridge.core.registry import Registry
from bridge.core.spec import BodyBuilder, OpSpec
from exporters.bodies.opsets import attach_built, guarded_copy, onnx_opset
from exporters.derive.cache import CACHE
from exporters.derive.derivation import derive
from exporters.derive.sites import Derived, NoPortableBody, Untraceable, site_of


def _model_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    types = model_value_types(model)
    wanted = {n for node in custom_nodes(model) for n in node.input if n}
    if not wanted <= types.keys():
        try:
            types = {**model_value_types(onnx.shape_inference.infer_shapes(model)), **types}
        except Exception:  # noqa: BLE001  what inference cannot type is reported per node
            pass
    return types


def _todo(model: onnx.ModelProto, registry: Registry) -> list[tuple[onnx.NodeProto, OpSpec]]:
    """The custom nodes whose op has no written body and no model-local function, with their op."""
    local = {(f.domain, f.name, f.overload) for f in model.functions}
    todo = []
    for node in custom_nodes(model):  # NOTE: the main graph's and those in If/Loop/Scan bodies
        if (node.domain, node.op_type, node.overload) not in local:
            spec = registry.find(node.domain, node.op_type)
            if spec is not None and spec.function is None:
                todo.append((node, spec))
    return todo


def _bodies(model: onnx.ModelProto, todo: list, opset: int, registry: Registry
            ) -> dict[tuple[str, str], list[tuple[onnx.NodeProto, Derived]]]:
    """Each node's body, by op (domain, name); nodes whose op gives none are left out."""
    types = _model_types(model)
    uses: dict[tuple[str, str], list[tuple[onnx.NodeProto, Derived]]] = {}
    for node, spec in todo:
        try:
            body = derive(spec, site_of(spec, node, types), opset, registry)
        except NoPortableBody:
            continue
        except Untraceable as e:
            CACHE.fail(spec.qualname, str(e))
            continue
        uses.setdefault((spec.domain, spec.name), []).append((node, body))
    return uses


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
    opset = onnx_opset(model)
    todo = _todo(model, registry)
    if not todo or opset is None:
        return []
    added = []
    for (domain, name), pairs in _bodies(model, todo, opset, registry).items():
        spec = registry.find(domain, name)
        assert spec is not None  # _todo found it
        _attach(model, spec, pairs, registry)
        added.append(spec.qualname)
    return added


def _attach(model: onnx.ModelProto, spec: OpSpec, pairs: list[tuple[onnx.NodeProto, Derived]],
            registry: Registry) -> None:
    """Add the bodies of one op's nodes to ``model`` and point each node at its own."""
    # NOTE: bodies are told apart by content, not by object: two sites may hold equal bodies derived
    # twice (a guard the evaluator cannot read), which must stay one function (one overload id)
    content = [(node, body.proto.SerializeToString()) for node, body in pairs]
    bodies = {data: body.proto for (_, data), (_, body) in zip(content, pairs)}
    for data, body in bodies.items():
        proto = guarded_copy(body, spec)
        # NOTE: one body keeps the plain name; several are told apart as ONNX function overloads
        proto.overload = "" if len(bodies) == 1 else "derived_" + hashlib.sha1(data).hexdigest()[:10]
        model.functions.append(proto)
        for node, d in content:
            if d == data:
                node.overload = proto.overload
        _import_opsets(model, proto, registry)
    if len(bodies) > 1:
        model.ir_version = max(model.ir_version, 10)  # overloads are IR 10


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
            if spec is not None and spec.function is not None and not isinstance(spec.function, BodyBuilder):
                model.functions.append(spec.function.to_function_proto())
    attach_built(model, registry)  # a body built per attribute values, of an op the implementation calls
