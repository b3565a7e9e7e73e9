"""A fake kernel checked against its op's forward before an export trusts it: the output types and shapes
the file declares for a custom node are what the op's fake kernel says, and onnxruntime never checks
them (it runs and returns what the kernel computed), so a fake that lies is a file that lies.

Each op with samples is checked once per spec (a changed op is a new spec): on each sample of each
dtype it declares, the fake kernel's outputs and the forward's agree in count, dtype, rank and every
size the fake gives as a number (a data-dependent size it leaves symbolic is not compared)."""

from __future__ import annotations

import torch

from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.torch_compat import fake_mode, pytree
from bridge.core.spec import OpSpec, SampleInput

# NOTE: id -> (the spec, held so that its id stays its own; the lie found, or None)
_CHECKED: dict[int, tuple[OpSpec, str | None]] = {}


def check_fake(spec: OpSpec) -> None:
    """Raise OpBridgeError naming the output where ``spec``'s fake kernel, on one of the op's samples,
    gives another dtype, rank or size than its forward; nothing for an op without samples.

    Example:
        >>> import torch, bridge
        >>> reg = bridge.Registry()
        >>> @bridge.op("doc43::row_sums", fake=lambda x: x.new_empty(x.shape[0], 4), registry=reg,
        ...            sample_inputs=lambda dtype: [bridge.SampleInput((torch.ones(3, 4, dtype=dtype),))])
        ... def row_sums(x: torch.Tensor) -> torch.Tensor:
        ...     return x.sum(-1)
        >>> try:
        ...     check_fake(reg.get("doc43::row_sums"))
        ... except bridge.OpBridgeError as e:
        ...     print(str(e).split(", its forward")[0])
        opbridge: doc43::row_sums: its fake kernel says output 0 is float32[3,4]
    """
    lie = fake_disagreement(spec)
    if lie is not None:
        raise OpBridgeError(lie)


def fake_disagreement(spec: OpSpec) -> str | None:
    """:func:`check_fake`'s error (without raising it), or None where the fake agrees with the forward on the
    op's samples (or it has none); worked out once per record."""
    entry = _CHECKED.get(id(spec))
    if entry is None or entry[0] is not spec:
        entry = _CHECKED[id(spec)] = (spec, _lie(spec))
    return entry[1]


def _samples(spec: OpSpec) -> list[tuple[torch.dtype, SampleInput]]:
    if spec.sample_inputs is None or spec.mutated:  # NOTE: a mutating op's results are what it writes
        return []
    return [(dtype, s) for dtype in spec.dtypes for s in spec.sample_inputs(dtype)]


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _shown(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}[{','.join(str(d) for d in t.shape)}]"


def _lie(spec: OpSpec) -> str | None:
    """The first disagreement of the fake kernel with the forward on the op's samples, as the error."""
    for dtype, sample in _samples(spec):
        args, kwargs = pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v,
                                       (sample.args, sample.kwargs))
        try:
            with torch.no_grad():
                real = _outputs(spec.overload(*args, **kwargs))
        except Exception:  # noqa: BLE001  a sample the forward refuses says nothing about the fake
            continue
        try:
            with fake_mode(shape_env=True) as mode:
                fake_args, fake_kwargs = pytree.tree_map(
                    lambda v: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v, (args, kwargs))
                fake = _outputs(spec.overload(*fake_args, **fake_kwargs))
        except Exception:  # noqa: BLE001  a fake refusing a sample is reported by the tiers that run it
            continue
        where = f"on its {str(dtype).replace('torch.', '')} sample{f' {sample.name!r}' if sample.name else ''}"
        fix = "Make the fake return what the op returns: the same dtype, rank and sizes (fake=, op.register_fake)."
        if len(fake) != len(real):
            return (f"{spec.qualname}: its fake kernel returns {len(fake)} outputs, its forward {len(real)} {where}. "
                    f"Got {len(fake)} != {len(real)}. {fix}")
        for i, (f, r) in enumerate(zip(fake, real)):
            if not (isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor)):
                continue
            sizes_agree = f.dim() == r.dim() and all(
                not isinstance(a, int) or a == b for a, b in zip(f.shape, r.shape))
            if f.dtype != r.dtype or not sizes_agree:
                return (f"{spec.qualname}: its fake kernel says output {i} is {_shown(f)}, its forward gives "
                        f"{_shown(r)} {where}; the exported file would declare the fake's type, which onnxruntime "
                        f"never checks. Got output {i} as {_shown(f)} from the fake. {fix}")
    return None
