"""Graph rewrites that make programs torch.onnx can translate.

``functionalize_mutations``: every call of a registered mutating op becomes a call of its
functional twin (derived from the op's schema); later reads of the mutated tensors are
rerouted to the twin's results, and mutated graph inputs/buffers keep their update outputs.
"""

from __future__ import annotations

import operator

import torch

from bridge.core.basics import torch_compat
from bridge.core.basics.errors import OpBridgeError


def is_auto_functionalized(target) -> bool:
    """Whether ``target`` is torch's ``auto_functionalized`` wrapper of a mutating op's call."""
    return isinstance(target, torch_compat.HigherOrderOperator) and target.name().startswith("auto_functionalized")


def _calls_mutating_op(program, registry) -> bool:
    specs = (registry.for_overload(n.target) for n in program.graph.nodes
             if n.op == "call_function" and isinstance(n.target, torch_compat.OpOverload))
    return any(spec is not None and spec.mutated for spec in specs)


def _twin_args(node, spec):
    """Positional args of the twin call, read from an auto_functionalized node."""
    kwargs = dict(node.kwargs)
    bases = kwargs.pop("_all_bases", None)
    args = []
    for p in spec.params:
        if not p.mutated:
            args.append(kwargs.get(p.name, p.default))
            continue
        base = kwargs.get(f"_{p.name}_base_index")
        view_keys = [k for k in kwargs if k.startswith(f"_{p.name}_") and k not in
                     (f"_{p.name}_base_index", f"_{p.name}_alias")]
        if bases is None or base is None or view_keys:
            raise OpBridgeError(
                f"{spec.qualname}: mutated argument '{p.name}' is a view of another tensor, which the "
                f"functional rewrite does not support. Got view info {view_keys or 'none'}. "
                f"Pass a whole tensor (e.g. .contiguous() copy) as '{p.name}'."
            )
        args.append(bases[base])
    return tuple(args)


def functionalize_mutations(program: torch.export.ExportedProgram, registry) -> torch.export.ExportedProgram:
    """Replace mutating custom-op calls with their functional twins (see module docstring)."""
    if not _calls_mutating_op(program, registry):
        return program
    # NOTE: functionalization (an empty decomposition table) turns each mutating call into
    # auto_functionalized(op, ...) whose results already carry the rerouting; only the
    # higher-order node itself, which torch.onnx cannot translate, is swapped for the twin.
    program = program.run_decompositions({})
    graph = program.graph
    renames = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or not is_auto_functionalized(node.target):
            continue
        spec = registry.for_overload(node.args[0])
        if spec is None:
            continue  # not ours: torch.onnx reports it
        twin = registry.functional(spec)
        n_returns = spec.num_outputs
        slots = n_returns if n_returns > 1 else 1  # auto_functionalized packs (out, *new_bases)
        bases = {p.name: node.kwargs[f"_{p.name}_base_index"] for p in spec.params if p.mutated}
        with graph.inserting_before(node):
            new = graph.call_function(twin.overload, _twin_args(node, spec))
        val = node.meta.get("val")
        if val is not None:
            outs = list(val[:n_returns]) + [val[slots + bases[m]] for m in spec.mutated]
            new.meta["val"] = outs[0] if len(outs) == 1 else tuple(outs)
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise OpBridgeError(f"{spec.qualname}: unexpected use {user.format_node()} of its functional form. "
                                    "Got a non-getitem user. Report this graph.")
            index = user.args[1]
            position = index if index < slots else n_returns + [bases[m] for m in spec.mutated].index(index - slots)
            if twin.num_outputs == 1:
                user.replace_all_uses_with(new)
                renames[user.name] = new.name
                graph.erase_node(user)
            else:
                user.args = (new, position)
        graph.erase_node(node)
    for out in program.graph_signature.output_specs:
        if getattr(out.arg, "name", None) in renames:
            out.arg.name = renames[out.arg.name]
    program.graph_module.recompile()
    return program


def _is_torchbind_call(node) -> bool:
    return node.op == "call_function" and (getattr(node.target, "__name__", "") == "call_torchbind"
                                           or "call_torchbind" in str(node.target))


def _op_for_call(program, node, obj_inputs: dict, registry) -> tuple:
    """The op standing for a ``call_torchbind`` node, and the called object's state (its attributes)."""
    obj_node, method = node.args[:2]
    in_spec = obj_inputs.get(obj_node.name)
    if in_spec is None:
        raise OpBridgeError(f"torchbind call {node.format_node()} does not read a module attribute. "
                            "Got an object created inside forward(). Create it in __init__.")
    parts = in_spec.arg.class_fqn.split(".")  # '__torch__.torch.classes.ns.Cls' -> 'ns::Cls'
    class_name = f"{parts[-2]}::{parts[-1]}" if len(parts) >= 2 else in_spec.arg.class_fqn
    spec = registry.for_torchbind(class_name, method)
    if spec is None:
        raise OpBridgeError(
            f"the model calls {class_name}.{method} (torchbind), which no op stands for. Got "
            f"node {node.name}. Declare an op with @bridge.op(..., torchbind=['{class_name}.{method}']) "
            "whose tensors are the method's arguments and whose attributes are the object's state."
        )
    state = dict(program.constants[in_spec.target].__obj_flatten__())
    attr_names = {p.name for p in spec.attributes}
    required = {p.name for p in spec.attributes if not p.has_default}
    if not required <= set(state) <= attr_names:
        raise OpBridgeError(
            f"{class_name}.__obj_flatten__() gives state {sorted(state)} but {spec.qualname} has attributes "
            f"{sorted(attr_names)} (required {sorted(required)}). Got a mismatch. Make the flattened "
            "state names equal the op's attribute names."
        )
    return spec, state


def _replace_call(graph, node, spec, state: dict) -> None:
    """Swap a ``call_torchbind`` node for a call of ``spec``'s op with the state as its attributes."""
    tensors = iter(node.args[2:])
    call = [next(tensors) if p.is_tensor else state.get(p.name, p.default) for p in spec.params]
    positional, keywords = spec.call_args(call)
    with graph.inserting_before(node):
        new = graph.call_function(spec.overload, positional, keywords)
    new.meta.update({k: v for k, v in node.meta.items() if k in ("val", "tensor_meta", "stack_trace")})
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def _drop_unused_objects(program, obj_inputs: dict) -> None:
    graph = program.graph
    for name, in_spec in obj_inputs.items():
        placeholder = next(n for n in graph.nodes if n.op == "placeholder" and n.name == name)
        if not placeholder.users:
            graph.erase_node(placeholder)
            program.graph_signature.input_specs.remove(in_spec)
            program.constants.pop(in_spec.target, None)


def torchbind_to_ops(program: torch.export.ExportedProgram, registry) -> torch.export.ExportedProgram:
    """Turn ``call_torchbind(obj, method, *args)`` into the op declared for that method.

    The object's ``__obj_flatten__()`` state becomes the op's attributes, so the graph no longer
    needs the object: its input is dropped and the ONNX node is self-contained.
    """
    graph = program.graph
    obj_inputs = {s.arg.name: s for s in program.graph_signature.input_specs
                  if s.kind == torch.export.graph_signature.InputKind.CUSTOM_OBJ}
    calls = [node for node in graph.nodes if _is_torchbind_call(node)]
    if not calls:
        return program
    for node in calls:
        spec, state = _op_for_call(program, node, obj_inputs, registry)
        _replace_call(graph, node, spec, state)
    _drop_unused_objects(program, obj_inputs)
    program.graph_module.recompile()
    return program
