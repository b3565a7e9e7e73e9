"""Where a parity failure starts: eager intermediates against onnxruntime intermediates, node by node.

torch.onnx names each ONNX value computed from an FX node after that node, and records the node in
``pkg.torch.onnx.fx_node`` metadata. So the program torch.onnx translated (``Exported.program``),
run node by node in an FX Interpreter, gives the eager value of every such ONNX value; the same
ONNX model with those values added as graph outputs, opened with ``bridge.session`` in any tier,
gives the ORT value. Comparing the two in the graph's topological order finds the first node whose
outputs leave tolerance while the values it reads are within it: the node that introduced the
error. Nodes inside a model-local function are covered by their calling node (the custom op):
eager has no values inside a custom op to compare with.

This runs a second session and a second eager pass, so ``check_parity`` calls it only when asked
(``localize=True``) and only for a failing run; a passing check never gets here.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence

import onnx
import torch
from torch.export.graph_signature import InputKind

from bridge.core.basics.domains import is_custom
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.progress import format_table, step
from bridge.core.basics.torch_compat import pytree
from bridge.tools.sessions import load_model, ort_feed, run_feed, session
from exporters.names import call_args
from ort_kernels.function import FunctionTier

_FX_NODE_KEY = "pkg.torch.onnx.fx_node"
_FX_NAME = re.compile(r"^%([\w.]+)\s*:")


@dataclasses.dataclass
class NodeParity:
    """One ONNX node whose outputs have eager counterparts, compared output by output.

    ``node``: the ONNX node's name; ``op``: ``domain::op_type`` and the torch op it came from;
    ``inputs``: the compared values it depends on (through ONNX-only values in between);
    ``inputs_ok``: all of those within tolerance; ``via``: the ONNX nodes between those inputs and
    this node's outputs (one torch op often becomes several ONNX nodes); ``body``: in the function
    tier, the op types of the model-local function a custom node runs (its values are not compared:
    eager has none inside a custom op).
    """

    index: int  # position in the ONNX graph (topological order)
    node: str
    onnx_op: str
    torch_op: str
    fx_node: str
    outputs: list  # bridge.tools.parity.OutputParity per compared output value
    inputs: list[str]
    inputs_ok: bool
    via: list[str] = dataclasses.field(default_factory=list)
    body: list[str] = dataclasses.field(default_factory=list)

    @property
    def op(self) -> str:
        return f"{self.onnx_op} ({self.torch_op})" if self.torch_op else self.onnx_op

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def worst_output(self):
        """The output with the largest error (a failing one first)."""
        return max(self.outputs, key=lambda o: (not o.passed, o.max_abs))

    @property
    def max_abs(self) -> float:
        return self.worst_output.max_abs

    @property
    def worst(self) -> list[dict]:
        """The largest elementwise errors of the worst output: index, eager, ORT, abs error."""
        return self.worst_output.worst

    def describe(self) -> str:
        """One line: node, op, what went wrong, and whether its inputs were fine."""
        o = self.worst_output
        what = o.note or (f"max abs err {o.max_abs:.3g}, {o.mismatches}/{o.numel} elements past rtol/atol "
                          f"{o.rtol:g}/{o.atol:g}")
        inputs = ", ".join(self.inputs) or "graph inputs and constants only"
        state = "within tolerance" if self.inputs_ok else "NOT all within tolerance"
        return f"ONNX node {self.node!r} {self.op}: output {o.name!r} {what}; its inputs ({inputs}) are {state}"

    def to_dict(self) -> dict:
        return {"index": self.index, "node": self.node, "op": self.op, "onnx_op": self.onnx_op,
                "torch_op": self.torch_op, "fx_node": self.fx_node, "passed": self.passed,
                "inputs": self.inputs, "inputs_ok": self.inputs_ok, "via": self.via, "body": self.body,
                "outputs": [json_safe(o.to_dict()) for o in self.outputs]}


def json_safe(output: dict) -> dict:
    """One output's comparison (``OutputParity.to_dict()``) as strict JSON holds it: JSON has no
    inf nor NaN, so a statistic becomes null and an element's own value "nan", "inf" or "-inf".

    Example:
        >>> json_safe({"max_abs": float("inf"), "worst": [{"eager": float("nan"), "abs_err": float("inf")}]})
        {'max_abs': None, 'worst': [{'eager': 'nan', 'abs_err': None}]}
    """
    def clean(key: str, value):
        if not isinstance(value, float) or math.isfinite(value):
            return value
        return repr(value) if key in ("eager", "ort") else None

    safe = {k: clean(k, v) for k, v in output.items()}
    safe["worst"] = [{k: clean(k, v) for k, v in w.items()} for w in output.get("worst", [])]
    return safe


@dataclasses.dataclass
class Localization:
    """The node-by-node comparison of one run; ``first_divergence`` is the node to look at."""

    tier: str
    run: int  # which run of the check (1-based) was localized
    nodes: list[NodeParity]  # every compared node, in topological order
    first_divergence: NodeParity | None
    uncompared: int  # main-graph ONNX nodes with no eager counterpart of their own
    seconds: float

    def to_dict(self) -> dict:
        return {"tier": self.tier, "run": self.run, "seconds": round(self.seconds, 3),
                "uncompared_nodes": self.uncompared,
                "first_divergence": None if self.first_divergence is None else self.first_divergence.to_dict(),
                "nodes": [n.to_dict() for n in self.nodes]}

    def summary(self) -> str:
        """One line naming the first divergent node (or saying there is none)."""
        d = self.first_divergence
        if d is None:
            return f"no intermediate leaves tolerance ({len(self.nodes)} nodes compared, run {self.run})"
        return "first divergence at " + d.describe()

    def table(self, limit: int = 40) -> str:
        """The per-node table; past ``limit`` rows, the rows around the first divergence."""
        head = ("#", "onnx node", "op", "torch op", "value", "max abs", "max rel", "mismatch", "inputs", "result")
        rows: list[tuple[str, ...]] = []
        first = self.first_divergence
        for n in self.nodes:
            for o in n.outputs:
                mark = "FAIL" if not o.passed else "ok"
                if n is first:
                    mark += "  <- first divergence"
                rows.append((str(n.index), n.node, n.onnx_op, n.torch_op or "-", o.name, f"{o.max_abs:.3g}",
                             f"{o.max_rel:.3g}", f"{o.mismatches}/{o.numel}", "ok" if n.inputs_ok else "FAIL",
                             mark + (f" ({o.note})" if o.note else "")))
        if len(rows) > limit:
            at = next((i for i, r in enumerate(rows) if "first divergence" in r[-1]), 0)
            lo = max(0, min(at - limit // 2, len(rows) - limit))
            skipped_before, skipped_after = lo, len(rows) - lo - limit
            rows = rows[lo:lo + limit]
            if skipped_before:
                rows.insert(0, ("...", f"{skipped_before} rows before", *[""] * 8))
            if skipped_after:
                rows.append(("...", f"{skipped_after} rows after", *[""] * 8))
        return format_table([head] + rows)

    def __str__(self) -> str:
        lines = [f"localization (run {self.run}, ORT tier {self.tier} vs eager, node by node: {len(self.nodes)} "
                 f"nodes compared, {self.uncompared} ONNX-only nodes checked through the nodes they feed; "
                 f"{self.seconds:.2f} s):", self.summary()]
        d = self.first_divergence
        if d is not None:
            if len(d.via) > 1:
                lines.append(f"  computed by ONNX nodes: {', '.join(d.via)}")
            if d.body:
                lines.append(f"  its model-local function body (not compared inside): {', '.join(d.body)}")
            lines.append(f"  worst elements of {d.worst_output.name}:")
            lines += [f"    at {tuple(w['index'])}: eager {w['eager']:.6g}  ort {w['ort']:.6g}  "
                      f"abs err {w['abs_err']:.3g}" for w in d.worst]
        lines.append(self.table())
        return "\n".join(lines)

    def plot(self, ax) -> None:
        """Draw max |ORT - eager| per compared node onto matplotlib axes ``ax`` (log scale)."""
        names = [f"{n.index}:{n.node}" for n in self.nodes]
        errors = [max(n.max_abs, 1e-16) if math.isfinite(n.max_abs) else 1e16 for n in self.nodes]
        colors = ["tab:red" if n is self.first_divergence else ("tab:orange" if not n.passed else "tab:blue")
                  for n in self.nodes]
        ax.bar(range(len(names)), errors, color=colors)
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=90, fontsize=6)
        ax.set_ylabel("max |ORT - eager| per node")
        d = self.first_divergence
        title = f"red: first divergence ({d.node}, {d.op}); orange: fails after it" if d else "no divergence"
        ax.set_title(title, fontsize=8)


def _fx_name(node: onnx.NodeProto) -> str | None:
    for p in node.metadata_props:
        if p.key == _FX_NODE_KEY:
            m = _FX_NAME.match(p.value)
            return m.group(1) if m else None
    return None


def _program_inputs(program: torch.export.ExportedProgram, args: Sequence, kwargs: dict | None) -> list:
    """The graph module's flat inputs: lifted parameters, buffers and constants, then the user's."""
    user = pytree.tree_leaves((call_args(args), kwargs or {}))
    n_user = sum(1 for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT)
    if n_user != len(user):
        raise OpBridgeError(f"the exported program takes {n_user} inputs but the call has {len(user)}. "
                            "Got mismatched inputs. Pass the inputs used at export.")
    user_it = iter(user)
    lifted = {**program.constants, **program.state_dict}
    flat = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(user_it))
        elif spec.target in lifted:
            flat.append(lifted[spec.target])
        else:
            raise OpBridgeError(f"the exported program's input {spec.arg} ({spec.kind.name}) has no value. "
                                f"Got target {spec.target!r}. Export the model again.")
    return flat


class _Recorder(torch.fx.Interpreter):
    """Runs a graph module and keeps every tensor each node produces, by node name."""

    def __init__(self, module: torch.fx.GraphModule):
        super().__init__(module)
        self.values: dict[str, torch.Tensor] = {}

    def run_node(self, n: torch.fx.Node):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            self.values[n.name] = out.detach()
        return out


def eager_values(program: torch.export.ExportedProgram, args: Sequence, kwargs: dict | None = None,
                 ) -> dict[str, torch.Tensor]:
    """Every tensor the program's FX nodes compute on ``args``, by node name (eager torch).

    Example:
        >>> import torch
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.relu(x) * 2
        >>> ep = torch.export.export(M(), (torch.tensor([-1.0, 3.0]),))
        >>> {k: v.tolist() for k, v in eager_values(ep, (torch.tensor([-1.0, 3.0]),)).items()}
        {'x': [-1.0, 3.0], 'relu': [0.0, 3.0], 'mul': [0.0, 6.0]}
    """
    recorder = _Recorder(program.graph_module)
    with torch.no_grad():
        recorder.run(*_program_inputs(program, args, kwargs))
    return recorder.values


def add_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """Make the main graph of ``model`` (edited in place) also output the values ``names``, typed from
    its value_info where known (onnxruntime infers the rest); return it.

    >>> from onnx import helper
    >>> x, z = helper.make_tensor_value_info("x", 1, [2]), helper.make_tensor_value_info("z", 1, [2])
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
    ...                       "g", [x], [z])
    >>> [o.name for o in add_outputs(helper.make_model(g), ["y", "z"]).graph.output]
    ['z', 'y']
    """
    have = {o.name for o in model.graph.output}
    typed = {v.name: v for v in model.graph.value_info}
    for name in names:
        if name not in have:
            model.graph.output.append(typed[name] if name in typed else onnx.helper.make_empty_tensor_value_info(name))
            have.add(name)
    return model


def wanted(mode: bool | str, *, passed: bool) -> bool:
    """Whether ``check_parity(localize=mode)`` localizes a run: ``True`` when it failed, ``"always"``
    whatever happened, ``False`` never.

    >>> wanted(True, passed=True), wanted(True, passed=False), wanted("always", passed=True)
    (False, True, True)
    """
    if mode is not True and mode is not False and mode != "always":
        raise OpBridgeError(f"localize must be True, False or 'always'. Got {mode!r}. Pass localize=True to "
                            "localize failures only (a passing check then costs nothing extra).")
    return mode == "always" or (mode is True and not passed)


def localize(program: torch.export.ExportedProgram, model, args: Sequence, kwargs: dict | None = None, *,
             compare: Callable, tier: str = FunctionTier.name, registry=None, rtol=None, atol=None, run: int = 1,
             native_library=None) -> Localization:
    """Compare every intermediate value of ``model`` (an ONNX path or proto exported from ``program``)
    in onnxruntime (``tier``) against eager, and find the first node that diverges.

    ``program`` is the program torch.onnx translated (``exporters.export.export_with_program``'s
    ``.program``); ``compare`` is ``bridge.tools.parity.compare`` (per-dtype tolerances, overridable
    with ``rtol``/``atol``). The model may be edited after export: values keep their names.
    ``native_library``: as ``bridge.session``'s, for tier "native".
    Usually called through ``bridge.check_parity(..., localize=True)``.

    Example:
        >>> import torch, bridge, custom_ops
        >>> from exporters.export import export_with_program
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.identity_conv(torch.relu(x), 2) + 1
        >>> x = torch.randn(1, 2, 3, 3)
        >>> exported = export_with_program(M(), (x,))
        >>> loc = localize(exported.program, exported.proto, (x,), compare=bridge.compare)
        >>> [(n.node, n.passed) for n in loc.nodes], loc.first_divergence
        ([('node_relu', True), ('node_identity_conv', True), ('node_add', True)], None)
    """
    start = time.perf_counter()
    proto = load_model(model)  # a private copy: the probe outputs go into it
    with step("localize: eager intermediates"):
        eager = eager_values(program, args, kwargs)
    graph = proto.graph
    with step(f"localize: onnxruntime intermediates ({tier} tier)"):
        values = _onnxruntime_values(proto, _candidates(graph, eager), args, kwargs, tier=tier, registry=registry,
                                     native_library=native_library)
    results = {n: compare(n, eager[n], v, rtol=rtol, atol=atol) for n, v in values.items()}
    # NOTE: only the function tier runs the bodies; the other tiers drop the ones they serve
    bodies = {(f.domain, f.name): [n.op_type for n in f.node] for f in proto.functions if tier == FunctionTier.name}
    targets = {n.name: str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    nodes, uncompared = _walk(graph, results, targets, bodies)
    return Localization(tier, run, nodes, _first_divergence(nodes), uncompared, time.perf_counter() - start)


def _candidates(graph: onnx.GraphProto, eager: dict) -> list[str]:
    """The values of ``graph`` worth comparing: node outputs eager has, but the graph's inputs and initializers."""
    exact = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    return [out for node in graph.node for out in node.output if out and out in eager and out not in exact]


def _onnxruntime_values(proto: onnx.ModelProto, candidates: list[str], args: Sequence, kwargs: dict | None, *,
                        tier: str, registry, native_library) -> dict:
    """The values of ``candidates`` onnxruntime computes (those the session can give as outputs), by name."""
    sess = session(add_outputs(proto, candidates), tier=tier, registry=registry, native_library=native_library)
    available = {o.name for o in sess.get_outputs()}
    names = [n for n in candidates if n in available]
    try:
        return dict(zip(names, run_feed(sess, names, ort_feed(sess, args, kwargs))))
    except Exception as e:
        raise OpBridgeError(f"onnxruntime failed to run the model with its intermediate values as outputs. "
                            f"Got {type(e).__name__}: {str(e)[:500]}. Check the inputs against the kernels' "
                            "contract (the check itself ran them).") from e


def _first_divergence(nodes: list[NodeParity]) -> NodeParity | None:
    """The first failing node whose inputs passed, else the first failing node, else None."""
    return next((n for n in nodes if not n.passed and n.inputs_ok), None) or \
        next((n for n in nodes if not n.passed), None)


def _lineage(node: onnx.NodeProto, i: int, producer: dict, results: dict, depends: dict) -> tuple[set, set]:
    """The compared values ``node`` depends on, and the uncompared nodes between them and it."""
    ancestors, segment = set(), {i}
    for name in node.input:
        if name not in producer:
            continue  # graph input, initializer, omitted optional: exact on both sides
        if name in results:
            ancestors.add(name)
        else:
            a, s = depends[name]
            ancestors |= a
            segment |= s
    return ancestors, segment


def _walk(graph: onnx.GraphProto, results: dict, targets: dict[str, str], bodies: dict,
          ) -> tuple[list[NodeParity], int]:
    """Each node with compared outputs, in topological order, with the compared values it depends on."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    depends: dict[str, tuple[frozenset, frozenset]] = {}  # value -> (compared ancestors, nodes computing it)
    nodes, uncompared = [], 0
    for i, node in enumerate(graph.node):
        ancestors, segment = _lineage(node, i, producer, results, depends)
        for out in node.output:
            depends[out] = (frozenset(ancestors), frozenset(segment))
        compared = [results[o] for o in node.output if o in results]
        if not compared:
            uncompared += 1
            continue
        # NOTE: the node's own FX node (metadata) first: the optimizer may have renamed its output
        # after a later no-op node (a copy), whose eager value is the same tensor
        fx = _fx_name(node) or next(o for o in node.output if o in results)
        via = [f"{graph.node[j].name} ({graph.node[j].op_type})" for j in sorted(segment)
               if graph.node[j].op_type != "Constant"]
        nodes.append(NodeParity(
            index=i, node=node.name or f"#{i}", onnx_op=f"{node.domain}::{node.op_type}",
            torch_op=targets.get(fx, ""), fx_node=fx,
            outputs=compared, inputs=sorted(ancestors, key=producer.__getitem__),
            inputs_ok=all(results[a].passed for a in ancestors),
            via=via, body=bodies.get((node.domain, node.op_type), []) if is_custom(node.domain) else []))
    return nodes, uncompared
