"""What a body is derived for (a :class:`Site`: input dtypes and dims, attribute values), what it
gives (:class:`Derived`), and the errors that say why there is none."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import onnx
import torch

from bridge.core.basics.dtypes import torch_dtype
from bridge.core.basics.errors import OpBridgeError
from bridge.core.spec import OpSpec, SampleInput, node_attributes, values_key


class NoPortableBody(OpBridgeError):
    """An op without a written body whose implementation cannot be turned into one; ``reason`` is one line."""

    def __init__(self, qualname: str, reason: str):
        self.qualname, self.reason = qualname, reason
        super().__init__(f"{qualname} has no portable ONNX body: {reason}. Got no function= body, and none "
                         "can be derived from its implementation. Give the op a function= body "
                         "(op.register_function), or use tier='native' or 'python'.")


class Untraceable(Exception):
    """Internal: the one-line reason a body cannot be derived."""


def one_line(e: BaseException) -> str:
    """The innermost cause of ``e`` as ``Type: first line`` (at most 240 characters)."""
    while e.__cause__ is not None:  # NOTE: torch.onnx wraps the error that says what went wrong
        e = e.__cause__
    text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    text = text if len(text) <= 240 else text[:237] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


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
    # (dim symbol, the least size the model takes): the min of the user's Dim (Dim("H", min=2)), where bodies are
    # attached during bridge.export; a body is not checked at sizes below it
    floors: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):  # NOTE: lists become tuples: sites are cache keys
        object.__setattr__(self, "attrs", tuple((n, tuple(v) if isinstance(v, list) else v) for n, v in self.attrs))

    def takes(self, sizes: Mapping[str, int]) -> bool:
        """Whether the model takes ``sizes`` (dim symbol -> size): none below its floor.

        >>> site = Site((TensorSig(torch.float32, ("H",)),), (), (("H", 2),))
        >>> site.takes({"H": 1}), site.takes({"H": 2})
        (False, True)
        """
        floors = dict(self.floors)
        return all(n >= floors.get(d, 0) for d, n in sizes.items())

    @property
    def structure(self) -> tuple:
        """What any body for this site must agree on: dtypes, ranks, present inputs, list lengths."""
        return (tuple(None if t is None else (t.dtype, len(t.dims)) for t in self.tensors),
                tuple((n, len(v)) if isinstance(v, (list, tuple)) else (n, type(v).__name__) for n, v in self.attrs))

    @property
    def key(self) -> tuple:
        """What tells this site apart from every other: dtypes, dims and the exact attribute values
        (``bridge.core.spec.value_key``: -0.0 is not 0.0, every NaN is one)."""
        return (tuple(None if t is None else (t.dtype, t.dims) for t in self.tensors), values_key(self.attrs),
                self.floors)

    def describe(self) -> str:
        shown = [f"{str(t.dtype).replace('torch.', '')}[{','.join(map(str, t.dims))}]" if t else "None"
                 for t in self.tensors]
        return ", ".join(shown + [f"{n}={v!r}" for n, v in self.attrs])


@dataclasses.dataclass(frozen=True)
class Derived:
    """A body derived (and verified) for one site: the attributes baked in (by value) and those it
    reads from the node."""

    proto: onnx.FunctionProto
    fixed: tuple[tuple[str, Any], ...]
    parametric: tuple[str, ...]  # attributes the body reads from the node
    checks: tuple = ()  # NOTE: range checks on the op inputs it indexes with (derive.indices), guarded as declared


def _tensor_sig(name: str, t: onnx.TypeProto | None, param: str) -> TensorSig:
    if t is None or not t.tensor_type.HasField("shape"):
        raise Untraceable(f"the model records no type and shape for its input '{param}' ({name})")
    try:
        dtype = torch_dtype(t.tensor_type.elem_type)
    except TypeError as e:
        raise Untraceable(one_line(e)) from None
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{name}:{k}")
                 for k, d in enumerate(t.tensor_type.shape.dim))
    return TensorSig(dtype, dims)


# NOTE: the least sizes the user's Dims give the dynamic dims (by dim name), while bridge.export attaches bodies
# (floored_sites): the resolver's sites carry them (in their key). Bodies attached to a file later know none.
_FLOORS: contextvars.ContextVar[Mapping[str, int]] = contextvars.ContextVar(
    "opbridge_dim_floors", default=MappingProxyType({}))


@contextlib.contextmanager
def floored_sites(floors: Mapping[str, int]) -> Iterator[None]:
    """While active, :func:`site_of` gives its sites these floors (dim name -> least size)."""
    token = _FLOORS.set(dict(floors))
    try:
        yield
    finally:
        _FLOORS.reset(token)


def site_of(spec: OpSpec, node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> Site:
    """The export site of ``node`` (a node of ``spec``'s op): its input types and attribute values (and the
    floors of its dims, during :func:`floored_sites`)."""
    tensors = []
    for i, p in enumerate(spec.tensors):
        name = node.input[i] if i < len(node.input) else ""
        tensors.append(_tensor_sig(name, types.get(name), p.name) if name else None)
    try:
        values = node_attributes(spec, node)
    except OpBridgeError as e:
        raise Untraceable(str(e).removeprefix("opbridge: ")) from None
    attrs = [(p.name, values[p.name]) for p in spec.attributes]
    floors, symbols = _FLOORS.get(), {d for t in tensors if t is not None for d in t.dims if isinstance(d, str)}
    return Site(tuple(tensors), tuple(attrs), tuple(sorted((d, floors[d]) for d in symbols & set(floors))))


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
