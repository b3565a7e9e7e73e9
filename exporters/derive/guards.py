"""Whether an earlier body serves a further site: the same structure, the same baked values and
fixed dims, and torch.export's guards holding at the site's sizes (a dynamic size is a symbol: a
guard that asks more about it than equality with itself is assumed to hold)."""

from __future__ import annotations

import math
import operator
import types

from bridge.core.spec import OpSpec
from exporters.derive.sites import Derived, Site
from exporters.derive.tracing import flat_roles, flat_values


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


# NOTE: torch 2.14 writes a min/max of sizes in a guard as torch.sym_min/sym_max (2.13: min/max); on
# ints (and on the symbols here, which make them undecided) they are Python's own
_TORCH_IN_GUARDS = types.SimpleNamespace(sym_max=max, sym_min=min, sym_not=operator.not_, sym_int=int,
                                         sym_float=float)
_GUARD_GLOBALS = {"__builtins__": {}, "min": min, "max": max, "abs": abs, "math": math, "torch": _TORCH_IN_GUARDS}


def _guard_holds(guard: str, scope: dict) -> bool:
    """A torch.export guard at a site: True, False, or (a dynamic size involved) assumed True."""
    try:
        return bool(eval(guard, dict(_GUARD_GLOBALS), scope))  # noqa: S307
    except _Undecided:
        return True
    except Exception:  # noqa: BLE001  a guard this evaluator does not understand: the body is not shared
        return False


def fits(body: Derived, spec: OpSpec, site: Site) -> bool:
    """Whether ``body`` (derived at another site) is right at ``site`` too."""
    if site.structure != body.structure:
        return False
    values = dict(site.attrs)
    if any(values[n] != v for n, v in body.fixed):
        return False
    if any((t := site.tensors[i]) is None or t.dims[d] != size for i, d, size in body.fixed_dims):  # same inputs
        return False
    roles = flat_roles(spec, site, symbolic=bool(body.parametric))
    inputs = flat_values(roles, site, [_GuardTensor(t.dims) for t in site.tensors if t is not None])
    return all(_guard_holds(g, {"L": {"inputs": inputs}}) for g in body.guards)
