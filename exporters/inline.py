"""Inlining: every custom node replaced by its ONNX function body, for runtimes that do not inline.

onnxruntime expands a model-local function itself; other runtimes (OpenVINO, measured) stop at
a node of an unknown domain. ``inline_functions`` writes each custom op's body into the graph,
so the file holds standard ONNX only and any ONNX runtime reads it.
"""

from __future__ import annotations

import os

import onnx
import onnx.inliner

from bridge.core.basics import files
from bridge.core.basics.domains import ONNX_DOMAINS
from bridge.core.basics.errors import OpBridgeError
from bridge.core.basics.graphs import fold_type_probes, model_nodes, model_tensor_constants, nonstandard_ops
from bridge.core.basics.progress import step
from bridge.core.checks import unguarded
from bridge.core.registry import REGISTRY, Registry, fill_attributes
from exporters.derive import CrashSite, crash_sites, note_crashes
from exporters.resolve import attach_functions


def _check_bodies(model: onnx.ModelProto) -> None:
    local = {(f.domain, f.name) for f in model.functions}
    missing = [f"{d}::{t}" for d, t in nonstandard_ops(model) if (d, t) not in local]
    if missing:
        raise OpBridgeError(
            f"cannot inline {', '.join(missing)}: no ONNX function body in the file or the registry "
            f"(a native-only op has a C++ kernel, which no other runtime can load). Got ops without a "
            f"body: {missing}. Give each op a function= body on @bridge.op (or import the module that "
            "declares it), or deploy the non-inlined file with the native library (tier='native')."
        )


def inline_functions(model: onnx.ModelProto, registry: Registry | None = None, *,
                     guards: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` with every custom node replaced by its ONNX function body.

    Bodies come from the file (``model.functions``); ops whose body the file lacks get the
    registry's (``registry``, default ``bridge.REGISTRY``). The result holds standard ONNX only:
    no functions, no custom nodes, no custom opset imports; shapes are inferred and
    ``onnx.checker`` (full check) passes. A custom op without a body raises ``OpBridgeError``
    naming it (native-only ops cannot be inlined). The file is for deployment: the bodies' input
    check guards are left out (``guards=True`` keeps them; ``bridge.core.checks.unguarded``), every
    Constant is a tensor, and an ``If`` whose condition the inferred types decide (a dtype probe)
    is replaced by the branch it takes. Where a body makes onnxruntime die at some input size (its
    ``doc_string`` says, ``exporters.derive``), the inlined model says so in its ``opbridge.crashes``
    metadata entry, with the value each such node read: every tier refuses that size, as on the attached file.

    Example:
        >>> import torch, bridge, custom_ops
        >>> from exporters.inline import inline_functions
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.ops.opbridge.crop(x, [0, 0, 2, 2]) * 2
        >>> proto = bridge.export(M(), (torch.randn(1, 3, 4, 4),))
        >>> [n.op_type for n in proto.graph.node]
        ['crop', 'Mul']
        >>> flat = inline_functions(proto)
        >>> len(flat.functions), sorted({n.domain for n in flat.graph.node}), len(flat.graph.node) > 2
        (0, [''], True)
    """
    reg = REGISTRY if registry is None else registry
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    fill_attributes(proto, reg)  # NOTE: an omitted attribute is the op's default, not the body's inner op's
    # NOTE: a body may call another custom op; each round attaches and inlines one level more.
    rounds, crashes = 0, list[CrashSite]()
    while nonstandard_ops(proto):
        if rounds == 16:
            raise OpBridgeError(f"function bodies still call custom ops after 16 rounds of inlining. Got "
                                f"{nonstandard_ops(proto)}. Break the cycle between these ops' bodies.")
        attach_functions(proto, reg)
        _check_bodies(proto)
        # NOTE: inlining drops the bodies and their doc strings: the sizes they crash at, with the values
        # that carry them (graph values now, theirs or a nested op's after an earlier round), go to the metadata
        crashes += [s for s in crash_sites(proto, reg) if s.within is None]  # NOTE: those inline next round
        if not guards:
            for function in proto.functions:
                function.CopyFrom(unguarded(function))
        with step("inline function bodies"):
            # NOTE: the bodies the graph calls, one level a round: a custom node inside a body reaches the graph
            # (and the sizes its own body crashes at, the note) before it is inlined in turn
            called = {(n.domain, n.op_type) for n in model_nodes(proto)} & {(f.domain, f.name) for f in proto.functions}
            proto = onnx.inliner.inline_selected_functions(proto, sorted(called), exclude=False)
        rounds += 1
    del proto.functions[:]
    used = {n.domain for n in model_nodes(proto)}
    keep = [o for o in proto.opset_import if o.domain in used or o.domain in ONNX_DOMAINS]
    del proto.opset_import[:]
    proto.opset_import.extend(keep)
    model_tensor_constants(proto)
    with step("shape inference + onnx.checker (full)"):
        proto = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
        if fold_type_probes(proto):
            proto = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
        onnx.checker.check_model(proto, full_check=True)
    note_crashes(proto, list(dict.fromkeys(crashes)))
    return proto


def save_atomic(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` as one file, whole or not at all (``bridge.core.basics.files``): readers
    see the old file or the whole new one, never half of it."""
    size = model.ByteSize()
    if size >= files.SINGLE_FILE_LIMIT:
        raise OpBridgeError(f"the inlined model is {size / 2**30:.1f} GiB, past protobuf's 2 GiB for one "
                            f"file. Got {os.fspath(path)!r}. Keep the non-inlined file with external data for "
                            "this model.")
    files.save_model(model, path, external=False)
