"""Where an op's portable body comes from, for ``opbridge ops``, the tiers and ``--show-body``."""

from __future__ import annotations

import onnx
import torch

from bridge.core.basics.errors import OpBridgeError
from bridge.core.registry import Registry
from bridge.core.spec import BodyBuilder, OpSpec, Written
from exporters.bodies.translation import torch_translation
from exporters.derive.derivation import derive
from exporters.derive.implementation import implementation
from exporters.derive.sites import NoPortableBody, sample_site


def _samples(spec: OpSpec, dtype: torch.dtype | None) -> list:
    """The op's samples at ``dtype`` (None: float32 where the op takes it, else its first dtype)."""
    if dtype is None:
        dtype = torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]
    return spec.sample_inputs(dtype) if spec.sample_inputs is not None else []


def body_status(spec: OpSpec, dtype: torch.dtype | None = None, opset: int = 20,
                registry: Registry | None = None, *, try_it: bool = True) -> tuple[str, str | None]:
    """Where the op's portable body comes from: ``("written", None)`` (``("written", note)`` for a body
    built per attribute values), ``("translated", note)`` (torch.onnx's own translation of the op, the
    note names it), ``("derived", note)`` (derived from the first sample at ``dtype``; the note says
    when there is no sample to try), or ``("none", reason)``. ``try_it=False`` does not derive (a
    trace and an export per op): an implementation that exists is ``("derived", None)``.

    Example:
        >>> import torch, bridge, custom_ops
        >>> body_status(bridge.REGISTRY.get("opbridge::crop"))
        ('written', None)
    """
    if spec.function is not None:
        return "written", spec.function.note
    reused = torch_translation(spec)
    if reused is not None:
        return "translated", (f"torch.onnx's translation ({reused.name}, onnxscript torch_lib), exported at the "
                              "model's opset per attribute values")
    try:
        implementation(spec)
    except NoPortableBody as e:
        return "none", e.reason
    if not try_it:
        return "derived", None
    samples = _samples(spec, dtype)
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
    if isinstance(spec.function, Written):
        return f"# {spec.qualname}: written body\n" + onnx.printer.to_text(spec.function.to_function_proto())
    samples = _samples(spec, dtype)
    if not samples:
        implementation(spec)
        raise OpBridgeError(f"{spec.qualname}: its body is derived at each export site, and it has no sample "
                            "inputs to derive one from here. Got no samples. Register samples "
                            "(op.register_samples), or export a model and read model.functions.")
    site = sample_site(spec, samples[0])
    if isinstance(spec.function, BodyBuilder):  # its body for the sample's attribute values
        built = spec.function.function(dict(site.attrs)).to_function_proto()
        return f"# {spec.qualname}: written body built for {site.describe()}\n" + onnx.printer.to_text(built)
    body = derive(spec, site, opset, registry)
    baked = ", ".join(f"{n}={v!r}" for n, v in body.fixed) or "none"
    reused = torch_translation(spec)
    origin = "its implementation" if reused is None else f"torch.onnx's translation {reused.name}"
    head = (f"# {spec.qualname}: derived from {origin} at {site.describe()} "
            f"(attributes read from the node: {', '.join(body.parametric) or 'none'}; baked in: {baked})")
    return head + "\n" + onnx.printer.to_text(body.proto)
