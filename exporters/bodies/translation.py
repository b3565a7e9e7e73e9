"""The onnxscript translation of an op, generated from its spec."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from bridge.core.basics.errors import OpBridgeError
from bridge.core.spec import OpSpec, python_signature


def _is_concrete(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_concrete(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def symbolic_attribute_error(spec: OpSpec, name: str, value) -> OpBridgeError:
    """The error for a traced (symbolic) value where ONNX needs a constant attribute."""
    return OpBridgeError(
        f"{spec.qualname}: attribute '{name}' must be a constant at export, but it depends on a "
        f"dynamic input size. Got {value}. Pass a Python constant for '{name}' (e.g. a fixed batch "
        "size), or mark that dimension static in dynamic_shapes, or carry the value as a tensor input."
    )


def build_translation(spec: OpSpec) -> Callable:
    """A translation function whose signature mirrors the torch schema.

    Tensors pass through as node inputs; attributes go by keyword (ONNX sorts attributes by
    name, so positional passing would pair them wrongly).
    """
    sig = python_signature(spec, annotate=True)

    def translation(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        attrs = {}
        for p in spec.attributes:
            value = values[p.name]
            if not _is_concrete(value):
                raise symbolic_attribute_error(spec, p.name, value)
            if value is not None:
                value = p.to_onnx_value(value)
                # NOTE: an empty list has no type of its own (onnx-ir would guess INTS, and log it): the schema's
                attrs[p.name] = ir.Attr(p.name, ir.AttributeType(p.onnx_attribute_type), []) if value == [] else value
        return spec.onnx_op(*(values[p.name] for p in spec.tensors), **attrs)

    translation.__signature__ = sig  # type: ignore[attr-defined]  # NOTE: typeshed's functions lack it; inspect reads it
    translation.__annotations__ = {p.name: p.annotation for p in spec.attributes}
    translation.__name__ = translation.__qualname__ = spec.name
    translation.__doc__ = f"Translation of {spec.qualname} to {spec.domain}::{spec.name} v{spec.version}."
    return translation


def translation(spec: OpSpec) -> Callable:
    """The function the exporter's translation table maps ``spec``'s op to: the op's own
    ``translation=`` if it gave one, else the one derived from its schema."""
    return spec.custom_translation or build_translation(spec)


def translation_table(registry) -> dict:
    """``{OpOverload: translation}`` for ``torch.onnx.export(custom_translation_table=...)``.

    >>> import torch, bridge, custom_ops
    >>> table = translation_table(bridge.REGISTRY)
    >>> table[torch.ops.bev.bev_pool_v2.default].__name__
    'bev_pool_v2'
    """
    return {s.overload: translation(s) for s in registry.exportable()}
