"""The demo's three deployment files through the ONNX tools deployments use, each result run in
onnxruntime against the original file's outputs (docs/toolchain.md has the recipes).

Files (one export each, shared by the module): ``function`` (the default: function bodies with their
check guards), ``native`` (``functions=False``, run with the native library) and ``inline`` (custom
nodes replaced by their bodies, no guards). Every tool result must match the original file's
outputs within 1e-5 (max abs), but quantization: its result must stay within 2% of the output's
range of the float outputs (int8 weights and activations), and the dynamically quantized files of
the three kinds must agree with each other within 1e-5 (the same quantized convolutions around
the same custom op; static QDQ quantization also quantizes inside the inlined body).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime as ort
import pytest
import torch

import bridge
import custom_ops  # noqa: F401
import custom_ops.demo as demo
from ort_kernels.build import library_path

KINDS = ("function", "native", "inline")
TOL = 1e-5


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{kind: path} of the demo exported three ways, the native library, feeds, and reference outputs."""
    folder = tmp_path_factory.mktemp("toolchain")
    case = demo.build()
    paths = {}
    for kind, options in (("function", {}), ("native", {"functions": False}), ("inline", {"inline": True})):
        paths[kind] = folder / f"{kind}.onnx"
        bridge.export(case.model, case.args, paths[kind], dynamic_shapes=case.dynamic_shapes, **options)
    names = [i.name for i in onnx.load(paths["function"]).graph.input]
    feed = {n: a.numpy() for n, a in zip(names, case.args)}
    lib = str(library_path())
    expected = {kind: run(path, feed, lib if kind == "native" else None) for kind, path in paths.items()}
    with torch.no_grad():
        eager = case.model(*case.args)
    eager = [t.numpy() for t in (eager if isinstance(eager, (tuple, list)) else (eager,))]
    return {"paths": paths, "feed": feed, "lib": lib, "expected": expected, "folder": folder, "eager": eager}


def options(lib: str | None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if lib:
        so.register_custom_ops_library(lib)
    return so


def run(model, feed: dict, lib: str | None) -> list[np.ndarray]:
    """Outputs of ``model`` (a path or proto) in plain onnxruntime (with ``lib`` registered)."""
    data = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    sess = ort.InferenceSession(data, options(lib), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feed.items() if k in names})


def assert_same(files, kind: str, model, tol: float = TOL) -> None:
    got = run(model, files["feed"], files["lib"] if kind == "native" else None)
    for a, b in zip(got, files["expected"][kind], strict=True):
        assert a.shape == b.shape and float(np.abs(a.astype(np.float64) - b).max()) <= tol


def test_the_three_files_agree(files):
    """The three originals give one answer (each tool result is then held to its own original)."""
    first = files["expected"]["function"]
    for kind in KINDS[1:]:
        for a, b in zip(files["expected"][kind], first, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_onnxsim(files, kind):
    import onnxsim
    path = files["paths"][kind]
    model, ok = onnxsim.simplify(onnx.load(path), custom_lib=files["lib"] if kind == "native" else None)
    assert ok
    assert_same(files, kind, model)


@pytest.mark.parametrize("kind", KINDS)
def test_onnxslim(files, kind):
    import onnxslim

    assert_same(files, kind, onnxslim.slim(onnx.load(files["paths"][kind])))


@pytest.mark.parametrize("kind", KINDS)
def test_symbolic_shape_infer(files, kind, tmp_path, monkeypatch):
    """onnxruntime's symbolic shape inference types every output with its full shape (a native
    file's custom node needs --guess_output_rank). It writes temp files into the current folder."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    monkeypatch.chdir(tmp_path)
    model = SymbolicShapeInference.infer_shapes(onnx.load(files["paths"][kind]), auto_merge=True,
                                                guess_output_rank=kind == "native")
    assert model is not None
    for out, value in zip(model.graph.output, files["expected"][kind]):
        dims = out.type.tensor_type.shape.dim
        assert [d.dim_value for d in dims] == list(value.shape), out
    assert_same(files, kind, model)
    assert os.listdir(tmp_path) == []  # NOTE: nothing left behind when it succeeds


@pytest.mark.parametrize("kind", KINDS)
def test_graphsurgeon_fold_constants(files, kind):
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(onnx.load(files["paths"][kind]))
    graph.fold_constants().cleanup()
    assert_same(files, kind, gs.export_onnx(graph))


@pytest.mark.parametrize("kind", KINDS)
def test_polygraphy_fold_constants(files, kind):
    """What ``polygraphy surgeon sanitize --fold-constants`` runs, through its Python API."""
    from polygraphy.backend.onnx import fold_constants

    assert_same(files, kind, fold_constants(onnx.load(files["paths"][kind]), error_ok=False))


def _quantized(files, kind, tmp_path, static: bool):
    from onnxruntime.quantization import CalibrationDataReader, quantize_dynamic, quantize_static

    out = tmp_path / f"{kind}.quant.onnx"
    if not static:
        quantize_dynamic(files["paths"][kind], out)
        return out

    class Frames(CalibrationDataReader):
        def __init__(self):
            self.frames = iter([files["feed"]])

        def get_next(self):
            return next(self.frames, None)

    quantize_static(files["paths"][kind], out, Frames())
    return out


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_quantize(files, tmp_path, static):
    """Quantized files stay within 2% of the output range of the float outputs, and the three kinds
    quantize dynamically alike (their quantized outputs agree within 1e-5). quantize_static calibrates in an
    onnxruntime session it opens itself, with no way to register a custom-op library: the native
    file is quantized dynamically only (docs/toolchain.md)."""
    kinds = ("function", "inline") if static else KINDS
    paths = {kind: _quantized(files, kind, tmp_path, static) for kind in kinds}
    for kind, path in paths.items():  # NOTE: something was quantized: every convolution of the demo
        nodes = onnx.load(path).graph.node
        ops = [n.op_type for n in nodes]
        if static:  # QDQ: each Conv reads its input and weights through DequantizeLinear
            dequantized = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
            convs = [n for n in nodes if n.op_type == "Conv"]
            assert convs and all(set(c.input[:2]) <= dequantized for c in convs), (kind, ops)
        else:  # integer ops: no float Conv left
            assert "ConvInteger" in ops and "Conv" not in ops, (kind, ops)
    got = {kind: run(paths[kind], files["feed"], files["lib"] if kind == "native" else None) for kind in kinds}
    for kind in kinds:
        for q, f in zip(got[kind], files["expected"][kind], strict=True):
            assert float(np.abs(q - f).max()) <= 0.02 * float(np.ptp(f)), kind
        for q, first in zip(got[kind], got[kinds[0]], strict=True):
            if not static:  # NOTE: static QDQ also quantizes inside the inlined body (its MatMul)
                np.testing.assert_allclose(q, first, rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_ort_format(files, kind, tmp_path):
    """ORT-format conversion (the native file with its library); bridge.session refuses the result
    with a message saying what opens it."""
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    src = tmp_path / f"{kind}.onnx"
    src.write_bytes(files["paths"][kind].read_bytes())
    convert_onnx_models_to_ort(src, tmp_path, [OptimizationStyle.Fixed],
                               Path(files["lib"]) if kind == "native" else None)
    converted = tmp_path / f"{kind}.ort"
    assert_same(files, kind, converted)
    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: .* is an ORT-format model \(\.ort\), not an ONNX "
                                                   r"model.*Got the ORT format's identifier 'ORTM'\. Open it with "
                                                   r"onnxruntime\.InferenceSession"):
        bridge.session(converted)


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """``model`` that also outputs ``names`` (typed by shape inference)."""
    typed = onnx.shape_inference.infer_shapes(model)
    info = {v.name: v for v in typed.graph.value_info}
    typed.graph.output.extend(info[n] for n in names if n not in {o.name for o in typed.graph.output})
    return typed


@pytest.mark.parametrize("kind", KINDS)
def test_extract_model_around_bev_pool_v2(files, kind, tmp_path):
    """onnx.utils.extract_model cuts out bev_pool_v2 (the inlined file: its body) between the values
    around the op; the piece matches those values in the original."""
    node = next(n for n in onnx.load(files["paths"]["function"]).graph.node if n.op_type == "bev_pool_v2")
    inputs, outputs = [i for i in node.input if i], list(node.output)
    piece = tmp_path / "piece.onnx"
    onnx.utils.extract_model(str(files["paths"][kind]), str(piece), inputs, outputs)
    lib = files["lib"] if kind == "native" else None
    computed = [n for n in inputs + outputs if n not in files["feed"]]
    whole = _with_outputs(onnx.load(files["paths"][kind]), computed)
    by_name = {**files["feed"], **dict(zip([o.name for o in whole.graph.output], run(whole, files["feed"], lib)))}
    got = run(piece, {n: by_name[n] for n in inputs}, lib)
    np.testing.assert_allclose(got[0], by_name[outputs[0]], rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_version_converter_then_attach(files, kind):
    """onnx.version_converter to opset 18 drops model-local functions; attach_functions gives them back."""
    model = onnx.version_converter.convert_version(onnx.load(files["paths"][kind]), 18)
    bridge.attach_functions(model) if kind == "function" else None
    assert (len(model.functions) > 0) == (kind == "function")
    assert_same(files, kind, model)


def test_inline_and_native_files_carry_no_guards(files):
    """Files written for deployment carry no check machinery; the default file keeps its guards."""
    def guards(path):
        model = onnx.load(path)
        nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
        return [n.name for n in nodes if n.name.startswith("opbridge_check/")]

    assert guards(files["paths"]["native"]) == [] and guards(files["paths"]["inline"]) == []
    assert guards(files["paths"]["function"])


def test_every_constant_is_a_tensor(files):
    """No Constant with value_float/value_int(s) anywhere: graph, subgraphs and function bodies."""
    from bridge.core.basics.graphs import model_nodes

    for kind, path in files["paths"].items():
        literal = [(n.op_type, a.name) for n in model_nodes(onnx.load(path), functions=True)
                   if n.op_type == "Constant" for a in n.attribute if a.name != "value" and not a.ref_attr_name]
        assert literal == [], kind


def test_files_have_no_dtype_probe(files):
    """bev_pool_v2's body takes the branch its (float32) input types decide: no If left, in the
    function file's body as in the inlined file."""
    from bridge.core.basics.graphs import model_nodes

    for kind in ("function", "inline"):
        assert not [n for n in model_nodes(onnx.load(files["paths"][kind]), functions=True) if n.op_type == "If"]


def test_no_noop_cast(files):
    """No Cast to the type its input already has in a graph (onnxconverter-common's float16
    converters retype such a Cast's output but not the Cast, and onnxruntime then refuses the file).
    A function body keeps its Cast to the float32 accumulator: the converters retype the calls, not
    the body, and the Cast is what makes the body serve float16 (test_float16_keep_io_types)."""
    from bridge.core.basics.graphs import model_value_types

    model = onnx.shape_inference.infer_shapes(onnx.load(files["paths"]["inline"]))
    types = model_value_types(model)
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert casts and all(n.input[0] in types for n in casts)
    assert [n.name for n in casts if types[n.input[0]].tensor_type.elem_type == n.attribute[0].i] == []


@pytest.mark.parametrize("kind", KINDS)
def test_float16_keep_io_types(files, kind):
    """onnxconverter-common's convert_float_to_float16(keep_io_types=True): within 1% of the output's range."""
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(files["paths"][kind]), keep_io_types=True)
    got = run(model, files["feed"], files["lib"] if kind == "native" else None)
    for a, b in zip(got, files["expected"][kind], strict=True):
        assert a.dtype == b.dtype and float(np.abs(a.astype(np.float64) - b).max()) <= 0.01 * float(np.ptp(b))


@pytest.mark.parametrize("kind", ("function", "inline"))
def test_float16_auto_mixed_precision(files, kind):
    """onnxconverter-common's auto_convert_mixed_precision (it runs the file in its own onnxruntime
    sessions, with no way to register a library: not the native file)."""
    from onnxconverter_common import auto_mixed_precision

    model = auto_mixed_precision.auto_convert_mixed_precision(onnx.load(files["paths"][kind]), files["feed"],
                                                              rtol=0.01, atol=0.01, keep_io_types=True)
    got = run(model, files["feed"], None)
    for a, b in zip(got, files["expected"][kind], strict=True):
        assert float(np.abs(a.astype(np.float64) - b).max()) <= 0.01 * float(np.ptp(b))


@pytest.mark.parametrize("kind", KINDS)
def test_quant_pre_process(files, kind, tmp_path, monkeypatch):
    """onnxruntime's quant_pre_process (symbolic shape inference without auto_merge, then its
    optimizer): the index arithmetic in bev_pool_v2's body is what that inference follows."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    monkeypatch.chdir(tmp_path)
    out = tmp_path / f"{kind}.pre.onnx"
    quant_pre_process(str(files["paths"][kind]), str(out), skip_optimization=kind == "native",
                      guess_output_rank=kind == "native")
    assert_same(files, kind, out)


def _onnxscript_optimized(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxscript

    return onnxscript.optimizer.optimize(model)


def _onnxscript_rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxscript

    return onnxscript.rewriter.rewrite(model)


def _onnxoptimizer(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxoptimizer

    return onnxoptimizer.optimize(model)


def _onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxslim

    return onnxslim.slim(model)


def _onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxsim

    return onnxsim.simplify(model)[0]


def _polygraphy(model: onnx.ModelProto) -> onnx.ModelProto:
    from polygraphy.backend.onnx import fold_constants

    return fold_constants(model, error_ok=False)


OPTIMIZERS = {"onnxscript_optimizer": _onnxscript_optimized, "onnxscript_rewriter": _onnxscript_rewritten,
              "onnxoptimizer": _onnxoptimizer, "onnxslim": _onnxslim, "onnxsim": _onnxsim, "polygraphy": _polygraphy}


def assert_refused_naming(files, model, name: str) -> None:
    """``model`` (the function file, or a tool's result) run in plain onnxruntime with ``name``'s
    first entry -1 fails at the guard node of bev_pool_v2's input ``name``: the node onnxruntime's
    message names states that input's checks only, and its ``idx=`` is the check eager reports
    (``name``'s first check reading values; every check before it holds)."""
    checks = list(bridge.REGISTRY.get("bev::bev_pool_v2").checks)
    index = next(i for i, c in enumerate(checks) if c.input == name and c.reads_values)
    bad = dict(files["feed"])
    bad[name] = bad[name].copy()
    bad[name][0] = -1
    with pytest.raises(Exception) as info:
        run(model, bad, None)
    message = str(info.value)
    (node,) = re.findall(r"Name:'([^']*)'", message)
    prefix = "opbridge_check/bev::bev_pool_v2/"
    assert prefix in node, message
    parts = node.split(prefix, 1)[1].split("+")
    assert {part.split("/")[0] for part in parts} == {name}, message
    assert f"{name}/{index}.{checks[index].kind}" in parts and f"idx={index + 1} " in message, message


@pytest.mark.parametrize("name", ["ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths"])
def test_plain_onnxruntime_names_the_op_and_input_of_a_failed_check(files, name):
    """Not only an index error: the failing node is the guard of bev_pool_v2's input ``name``."""
    assert_refused_naming(files, files["paths"]["function"], name)


@pytest.mark.parametrize("tool", OPTIMIZERS)
def test_checks_survive_optimizers(files, tool):
    """The function file through each optimizer: the same outputs, and bad input (a ranks_depth
    entry of -1) still refused in plain onnxruntime, at the guard named after the op and the input."""
    model = OPTIMIZERS[tool](onnx.load(files["paths"]["function"]))
    assert_same(files, "function", model)
    assert_refused_naming(files, model, "ranks_depth")


@pytest.mark.parametrize("tool", ["onnxslim", "onnxsim"])
def test_sessions_open_a_simplified_function_file_in_every_tier(files, tool):
    """The function file through onnxslim (which orders each body's nodes its own way, body nodes before the
    guard) and onnxsim: bridge.session opens it in every tier with eager's outputs, and the function tier
    still refuses a ranks_depth out of range with bev_pool_v2's own message."""
    pytest.importorskip(tool)
    model = OPTIMIZERS[tool](onnx.load(files["paths"]["function"]))
    for tier in bridge.TIERS:
        got = bridge.session(model, tier=tier).run(None, files["feed"])
        for a, b in zip(got, files["eager"], strict=True):
            assert a.shape == b.shape and float(np.abs(a.astype(np.float64) - b).max()) <= TOL, tier
    bad = dict(files["feed"], ranks_depth=files["feed"]["ranks_depth"].copy())
    bad["ranks_depth"][0] = np.iinfo(bad["ranks_depth"].dtype).max
    with pytest.raises(bridge.OpBridgeError, match=r"^opbridge: bev::bev_pool_v2: input 'ranks_depth' values must "
                                                   rf"lie in \[0, \d+\)\. Got min \d+, max {bad['ranks_depth'][0]}\."):
        bridge.session(model, tier="function").run(None, bad)


# -- bev_pool_v2's body: buffers sized from shapes, any interval order ---------------------

# NOTE: the inputs that give a node's output its size, by op type (every op the body uses that has one)
SIZE_INPUTS = {"Tile": (1,), "ConstantOfShape": (0,), "Expand": (1,), "Reshape": (1,), "Range": (0, 1, 2),
               "Slice": (1, 2, 3, 4), "Pad": (1,), "TopK": (1,), "Split": (1,)}
DATA_SIZED = {"NonZero", "Compress", "Unique"}  # NOTE: the output's size is the count of its input's values
SAME_SIZE = {"ScatterND", "ScatterElements"}  # NOTE: the output has input 0's shape, whatever else it reads


def value_dependence(function: onnx.FunctionProto) -> tuple[set[str], set[str]]:
    """(valued, sized) of ``function``'s values: ``valued`` values whose values depend on the
    function's input values (a Shape or Size reads its input's size only), ``sized`` values whose
    size does (a size input that is valued, a NonZero's count, a sized input)."""
    valued, sized = set(function.input), set()
    for node in function.node:
        reads = [i for i in node.input if i]
        if node.op_type in ("Shape", "Size"):
            is_valued, is_sized = reads[0] in sized, False
        else:
            is_valued = any(i in valued or i in sized for i in reads)
            size_inputs = [node.input[k] for k in SIZE_INPUTS.get(node.op_type, ()) if k < len(node.input)]
            shaped = reads[:1] if node.op_type in SAME_SIZE else reads
            is_sized = (node.op_type in DATA_SIZED or any(i in valued for i in size_inputs if i)
                        or any(i in sized for i in shaped))
        valued |= set(node.output) if is_valued else set()
        sized |= set(node.output) if is_sized else set()
    return valued, sized


def _bev_body(files) -> onnx.FunctionProto:
    return next(f for f in onnx.load(files["paths"]["function"]).functions if f.name == "bev_pool_v2")


def test_bev_pool_v2_buffers_are_sized_from_shapes(files):
    """The buffer bev_pool_v2's body scatters its sums into (the output grid) is sized from the attribute
    and input shapes; the one buffer that is not is the chunk rows' marker: rows are sum(ceil(length / 16))
    over the intervals, which no input shape bounds (intervals may overlap). No ConstantOfShape, and the
    one Tile sized from values is that marker."""
    body = _bev_body(files)
    valued, sized = value_dependence(body)
    assert "interval_lengths" in valued and body.output[0] in valued  # NOTE: the walk follows the values
    producer = {o: n for n in body.node for o in n.output}
    scatters = [n for n in body.node if n.op_type in SAME_SIZE]
    from_values = [n for n in scatters if n.input[0] in sized]
    assert len(scatters) >= 2 and len(from_values) == 1, [(n.op_type, list(n.input)) for n in scatters]
    buffers = [n for n in body.node if n.op_type in ("Tile", "ConstantOfShape")
               and n.input[SIZE_INPUTS[n.op_type][0]] in valued]
    assert [n.op_type for n in buffers] == ["Tile"] and producer[from_values[0].input[0]] is buffers[0]


@pytest.mark.parametrize("kind", ("function", "inline"))
def test_bev_pool_v2_any_interval_order_gives_the_same_bits(files, kind):
    """Intervals need no sort: each of the demo's intervals (one per cell) cut in two, then every
    first half in a random order followed by every second half in the same order (a cell's two
    intervals apart, in their order), give the output of the halves in place bit for bit; both within
    TOL of the file's output on the intervals as prepared."""
    feed = dict(files["feed"])
    starts, lengths, ranks_bev = feed["interval_starts"], feed["interval_lengths"], feed["ranks_bev"]
    half = lengths // 2
    cut_starts = np.stack([starts, starts + half], 1).reshape(-1).astype(np.int32)
    cut_lengths = np.stack([half, lengths - half], 1).reshape(-1).astype(np.int32)
    perm = np.random.default_rng(0).permutation(len(starts))
    order = np.r_[2 * perm, 2 * perm + 1]
    cell = np.r_[ranks_bev, 0][starts]
    assert len(np.unique(cell)) == len(cell) > 2 and not np.all(np.diff(cell[perm]) >= 0)
    cut = run(files["paths"][kind], {**feed, "interval_starts": cut_starts, "interval_lengths": cut_lengths}, None)
    shuffled = run(files["paths"][kind], {**feed, "interval_starts": cut_starts[order],
                                          "interval_lengths": cut_lengths[order]}, None)
    for a, b, expected in zip(cut, shuffled, files["expected"][kind], strict=True):
        assert a.tobytes() == b.tobytes()
        np.testing.assert_allclose(a, expected, rtol=0, atol=TOL)
