"""A derived body refuses the indices eager refuses (exporters/derive/indices.py): an op input that
gather, scatter_add, index_select, ... index with gets ``values_in(input, 0, <indexed dim>)``, guarded
as a declared check; ONNX would wrap a negative one (a silent result) or fail in onnxruntime's words."""

import numpy as np
import onnx
import pytest
import torch
from torch.export import Dim

import bridge
from bridge import checks as C
from exporters import derive

TIERS = ("function", "native", "python")


def _gather_perm(registry, name, checks=None):
    @bridge.op(name, fake=lambda x, idx, perm, scale: torch.empty_like(torch.gather(x, 1, idx)).permute(perm),
               registry=registry, checks=checks)
    def gather_perm(x: torch.Tensor, idx: torch.Tensor, perm: list[int], scale: float) -> torch.Tensor:
        return torch.gather(x, 1, idx).permute(perm) * scale

    class M(torch.nn.Module):
        def forward(self, x, idx):
            return gather_perm(x, idx, [0, 2, 1], 2.0)

    return M()


def _export(model, feed, path, registry):
    batch = Dim("batch")
    proto = bridge.export(model, feed, path, registry=registry,
                          dynamic_shapes=tuple({0: batch} for _ in feed))
    return [n.name for f in proto.functions for n in f.node if n.name.startswith("opbridge_check/")], proto


def _refused(model, path, registry, feeds, name, index, high):
    """Each feed: eager raises, and every tier refuses it; the function tier in the op's own words."""
    for feed in feeds:
        with pytest.raises((RuntimeError, IndexError)):  # NOTE: index_select raises IndexError
            model(*feed)
        for tier in TIERS:
            sess = bridge.session(path, tier=tier, registry=registry)
            inputs = dict(zip((i.name for i in sess.get_inputs()), (t.numpy() for t in feed)))
            # NOTE: the native tier runs the op's body (no C++ kernel) and explains its guards as the function
            # tier does (bridge.session); the python tier runs eager: its IndexError, worded by the tier, or the
            # op's declared check
            checked = rf"opbridge: {name}: input '{index}' values must lie in \[0, {high}\)"
            match = {"function": checked, "native": checked,
                     "python": rf"opbridge: {name}: (the Python kernel raised|input '{index}' values must lie)"}[tier]
            with pytest.raises(bridge.OpBridgeError, match=match):
                sess.run(None, inputs)


def _matches(model, path, registry, feeds):
    for feed in feeds:
        expected = model(*feed).numpy()
        for tier in TIERS:
            sess = bridge.session(path, tier=tier, registry=registry)
            got = sess.run(None, dict(zip((i.name for i in sess.get_inputs()), (t.numpy() for t in feed))))[0]
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_gather_with_an_input_index_refuses_what_eager_refuses_in_every_tier(registry, fresh_name, tmp_path):
    name = fresh_name("gather_perm")
    model = _gather_perm(registry, name)
    x, idx = torch.randn(2, 10, 3), torch.randint(0, 10, (2, 4, 3))
    path = tmp_path / "gather.onnx"
    guards, proto = _export(model, (x, idx), path, registry)
    assert guards == [f"opbridge_check/{name}/idx/0.values_in"]
    # NOTE: the body says what it guards: a session on the file in any process words the failure (function tier)
    assert "opbridge index check: input 'idx' values must lie in [0, x.shape[1])" in proto.functions[0].doc_string
    _matches(model, path, registry, [(x, idx), (torch.randn(5, 10, 3), torch.randint(0, 10, (5, 4, 3)))])
    _refused(model, path, registry, [(x, torch.full((2, 4, 3), -1)), (x, torch.full((2, 4, 3), 15))],
             name, "idx", 10)


def test_a_declared_check_on_the_index_is_not_duplicated(registry, fresh_name, tmp_path):
    name = fresh_name("gather_checked")
    model = _gather_perm(registry, name, checks=[C.values_in("idx", 0, C.dim("x", 1))])
    x, idx = torch.randn(2, 10, 3), torch.randint(0, 10, (2, 4, 3))
    path = tmp_path / "checked.onnx"
    guards, proto = _export(model, (x, idx), path, registry)
    assert guards == [f"opbridge_check/{name}/idx/0.values_in"]
    assert "opbridge index check" not in proto.functions[0].doc_string
    _refused(model, path, registry, [(x, torch.full((2, 4, 3), -1))], name, "idx", 10)


def test_index_select_and_scatter_add_with_input_indices(registry, fresh_name, tmp_path):
    name = fresh_name("pick_add")

    @bridge.op(name, fake=lambda x, rows, cols, src: torch.empty_like(x), registry=registry)
    def pick_add(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        picked = x.index_select(0, rows)
        return x + picked.scatter_add(1, cols, src).sum(0, keepdim=True)

    class M(torch.nn.Module):
        def forward(self, x, rows, cols, src):
            return pick_add(x, rows, cols, src)

    x, rows, cols, src = torch.randn(6, 7), torch.tensor([0, 5, 2]), torch.randint(0, 7, (3, 4)), torch.randn(3, 4)
    path = tmp_path / "pick_add.onnx"
    proto = bridge.export(M(), (x, rows, cols, src), path, registry=registry,
                          dynamic_shapes=({0: Dim("n"), 1: Dim("w")}, {0: Dim("k")}, {0: Dim("k")}, {0: Dim("k")}))
    body = next(f for f in proto.functions if f.name == name.split("::")[1])
    assert {n.name for n in body.node if n.name.startswith("opbridge_check/")} == {
        f"opbridge_check/{name}/rows/0.values_in", f"opbridge_check/{name}/cols/1.values_in"}
    _matches(M(), path, registry, [(x, rows, cols, src),
                                   (torch.randn(9, 2), torch.tensor([8, 0]), torch.randint(0, 2, (2, 4)),
                                    torch.randn(2, 4))])
    _refused(M(), path, registry, [(x, torch.tensor([0, -1, 2]), cols, src), (x, torch.tensor([6, 0, 0]), cols, src)],
             name, "rows", 6)
    _refused(M(), path, registry, [(x, rows, torch.full((3, 4), -2), src), (x, rows, torch.full((3, 4), 7), src)],
             name, "cols", 7)


def test_only_input_indices_get_a_check(registry, fresh_name):
    # NOTE: an index the implementation computes is not checked (docs/ops.md, derived bodies)
    name = fresh_name("computed")

    @bridge.op(name, fake=lambda x, idx: torch.empty_like(idx, dtype=x.dtype), registry=registry)
    def computed(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, idx.abs()) + x.index_select(0, idx.view(-1))

    site = derive.Site((derive.TensorSig(torch.float32, ("n",)), derive.TensorSig(torch.int64, ("k",))), ())
    body = derive.derive(registry.get(name), site, registry=registry)
    assert body.checks == (C.values_in("idx", 0, C.dim("x", 0)),)
    assert not onnx.printer.to_text(body.proto).count("opbridge_check")  # NOTE: guarded as it goes into a model
