"""Shared test models: the bev_pool_v2 pooling module, for pytest tests and tests/scripts alike;
a custom node inside an If branch; a file calling a checked op of a test registry.

Tests import it as ``models`` (pytest puts tests/ on sys.path); the scripts in tests/scripts,
run in subprocesses, put tests/ on sys.path themselves. bev_pool_v2 is called by keyword, so
the module keeps working whatever the position of ``bev_feat_shape`` in the op's schema.
"""

from __future__ import annotations

import onnx
import torch
from onnx import TensorProto, helper

import bridge
import custom_ops  # noqa: F401  (registers the seed ops)
from custom_ops.bev_pool_v2 import random_case

# the tensor inputs of Pool.forward, in order: the ONNX graph inputs of an exported Pool
POOL_INPUTS = ("depth", "feat", "ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths")


class Pool(torch.nn.Module):
    """``forward(*POOL_INPUTS)``: bev_pool_v2 into a fixed ``bev_feat_shape`` [B, Z, Y, X, C]."""

    def __init__(self, bev_feat_shape):
        super().__init__()
        self.bev_feat_shape = [int(s) for s in bev_feat_shape]

    def grid(self, depth: torch.Tensor) -> list:
        return self.bev_feat_shape

    def forward(self, depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths):
        return torch.ops.bev.bev_pool_v2(depth=depth, feat=feat, ranks_depth=ranks_depth, ranks_feat=ranks_feat,
                                         ranks_bev=ranks_bev, interval_starts=interval_starts,
                                         interval_lengths=interval_lengths, bev_feat_shape=self.grid(depth))


class PoolBatchFromInput(Pool):
    """Pool whose B is read from ``depth.shape[0]`` (a symbolic size when the batch is dynamic)."""

    def grid(self, depth):
        return [depth.shape[0], *self.bev_feat_shape[1:]]


def pool_case(model=Pool, **random_case_kwargs) -> tuple[Pool, tuple]:
    """(module, the POOL_INPUTS tensors) from ``custom_ops.bev_pool_v2.random_case(**kwargs)``.

    The random case is read by the op's parameter names, not by position.
    """
    spec = bridge.REGISTRY.get("bev::bev_pool_v2")
    named = dict(zip((p.name for p in spec.params), random_case(**random_case_kwargs)))
    return model(named["bev_feat_shape"]), tuple(named[n] for n in POOL_INPUTS)


def pool_dynamic_shapes() -> tuple:
    """dynamic_shapes for Pool: a dynamic point count and a dynamic interval count."""
    points, intervals = torch.export.Dim("points"), torch.export.Dim("intervals")
    return (None, None, {0: points}, {0: points}, {0: points}, {0: intervals}, {0: intervals})


def crop_in_a_branch(box, x_shape=(4, 4)) -> onnx.ModelProto:
    """A model whose If runs opbridge::crop(x, box) in its then-branch and passes x through in the
    other (inputs ``cond``, a bool scalar, and float ``x`` of ``x_shape``, None: any)."""
    spec = bridge.REGISTRY.get("opbridge::crop")
    out = lambda name: [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)]  # noqa: E731
    then = helper.make_graph([helper.make_node("crop", ["x"], ["c"], domain=spec.domain, box=box)], "then", [],
                             out("c"))
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], out("e"))
    graph = helper.make_graph([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)], "g",
                              [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)], out("y"))
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 18),
                                                                helper.make_opsetid(spec.domain, spec.version)])


def held_out_ops(registry: bridge.Registry, fresh_name) -> tuple:
    """Two ops whose derived bodies must not be shared across attribute values (held-out probes):
    ``floor_half(x, k) = x * (k // 2)`` (an int the trace keeps symbolic: floor division of a
    negative k differs from ONNX's truncating Div) and ``divide(x, s) = x / s`` (a float baked in:
    ``s = -0.0`` and ``s = 0.0`` give infinities of opposite signs)."""

    @bridge.op(fresh_name("floor_half"), fake=lambda x, k: torch.empty_like(x), registry=registry)
    def floor_half(x: torch.Tensor, k: int) -> torch.Tensor:
        return x * (k // 2)

    @bridge.op(fresh_name("divide"), fake=lambda x, s: torch.empty_like(x), registry=registry)
    def divide(x: torch.Tensor, s: float) -> torch.Tensor:
        return x / s

    return floor_half, divide


class HeldOut(torch.nn.Module):
    """Each held-out op at attribute values one body must not serve together."""

    def __init__(self, floor_half, divide):
        super().__init__()
        self.floor_half, self.divide = floor_half, divide

    def forward(self, x):
        # NOTE: -0.0 divides -x: torch.onnx's common-subexpression pass (onnx_ir) compares attribute
        # values with ==, and merges two nodes of one input whose attributes are 0.0 and -0.0
        return (self.floor_half(x, 4), self.floor_half(x, -5), self.divide(x, 0.0), self.divide(-x, -0.0),
                self.divide(x, float("nan")))


def rows_file(registry: bridge.Registry, fresh_name, path) -> str:
    """Export to ``path`` a model calling a fresh op declared in ``registry`` only (its rows of ``x`` at
    ``idx``, checked: ``values_in("idx", 0, dim("x", 0))``), on x [4, 3] float32 and idx [2] int64; the op's
    qualname. Opened with another registry (or by the CLI), the op is one whose module was not imported."""
    name = fresh_name("rows")

    @bridge.op(name, fake=lambda x, idx: x.new_empty(idx.shape[0], *x.shape[1:]), registry=registry,
               checks=[bridge.checks.values_in("idx", 0, bridge.checks.dim("x", 0))])
    def rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        rows.check(x, idx)
        return x.index_select(0, idx) * 2

    class Rows(torch.nn.Module):
        def forward(self, x, idx):
            return rows(x, idx)

    bridge.export(Rows(), (torch.ones(4, 3), torch.tensor([0, 3])), path, registry=registry)
    return name
