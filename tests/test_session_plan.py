"""A session walks the model once before onnxruntime sees it (#44 item 4): one plan, read by the node
checks, every tier's ``prepare`` and the report.

A walk of the model is a call of a walker of ``bridge.core.basics.graphs`` (``walk``: nodes and their
subgraphs; ``graphs``: a graph and its subgraphs) that starts at the model's main graph; walks of a
subgraph or a function body made inside such a walk are part of it. Counted from every module that
imported the walkers, over the whole ``bridge.session`` call (load, checks, prepare, report).

Before the plan (6d10bf1): function 8 walks, native 8, python 9. With it: 1 each (the function tier hands
the resolver, ``attach_functions`` in exporters/resolve.py, the plan's nodes: it walks nothing itself)."""

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

import bridge
import custom_ops.demo as demo
from bridge.core.basics import graphs

TIERS = ("function", "native", "python")


@pytest.fixture(scope="module")
def model():
    case = demo.build()
    return bridge.export(case.model, case.args, dynamic_shapes=case.dynamic_shapes), case


def _counting(monkeypatch, first: str) -> list:
    """Wrap the walkers everywhere they were imported; each walk starting at the main graph (its first
    node is ``first``) appends the walker's name to the list returned."""
    walks: list[str] = []
    original_walk, original_graphs = graphs.walk, graphs.graphs

    def starts_main(nodes) -> bool:
        try:
            return len(nodes) > 0 and nodes[0].name == first
        except TypeError:  # NOTE: an iterator: not a graph's node list
            return False

    def walk(nodes):
        if starts_main(nodes):
            walks.append(f"walk from {_callers()}")
        return original_walk(nodes)

    def graphs_(graph):
        if starts_main(graph.node):
            walks.append(f"graphs from {_callers()}")
        return original_graphs(graph)

    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if not name.startswith(("bridge", "exporters", "ort_kernels")):
            continue
        if getattr(module, "walk", None) is original_walk:
            monkeypatch.setattr(module, "walk", walk)
        if getattr(module, "graphs", None) is original_graphs:
            monkeypatch.setattr(module, "graphs", graphs_)
    return walks


def _callers() -> str:
    """The functions that asked for a walk (two frames above the walker)."""
    frames = [sys._getframe(i) for i in (3, 4)]
    return " <- ".join(f"{f.f_code.co_name} ({f.f_globals.get('__name__')})" for f in frames)


@pytest.mark.parametrize("tier", TIERS)
def test_a_session_walks_the_model_once(model, tier, monkeypatch):
    proto, case = model
    bridge.session(proto, tier=tier)  # NOTE: builds what the tier needs (the native library) outside the count
    walks = _counting(monkeypatch, proto.graph.node[0].name)
    sess = bridge.session(proto, tier=tier)
    print(f"{tier}: {len(walks)} walks {walks}")
    assert len(walks) == 1, walks
    feed = bridge.parity.ort_feed(sess, case.args)
    np.testing.assert_allclose(sess.run(None, feed)[0], case.model(*case.args).detach().numpy(), rtol=1e-4,
                               atol=1e-4)


def test_sessions_are_opened_in_one_place():
    """Every onnxruntime session of sessions and tiers is a ``ort_kernels.base.Session``; the raw calls left
    are the export-time checks of derived bodies (exporters/derive: verify, and contained's child process)."""
    root = Path(__file__).resolve().parent.parent
    raw = []
    for path in sorted(p for folder in ("bridge", "exporters", "ort_kernels") for p in (root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                    "InferenceSession":
                raw.append(str(path.relative_to(root)))
    assert sorted(set(raw)) == ["exporters/derive/contained.py", "exporters/derive/verify.py"], raw
