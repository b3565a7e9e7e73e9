"""Which onnxruntime releases run opbridge's files: one venv per release, files exported once here.

    python benchmarks/ort_matrix.py [--versions 1.17.3 1.18.1 1.20.1 1.22.1 newest] [--opsets 17 ... 23]
                                    [--json benchmarks/results/ort_matrix.json] [--venvs DIR]

1. In this venv (opbridge, torch): export the demo and one sample of each seed op at each opset,
   twice: with static shapes and with dynamic dimensions (the demo's own dynamic shapes, every
   dimension of a seed op's inputs ``Dim.AUTO`` but those its attributes fix, ``free_dims``), as users
   export; constant folding of a static file hides what the guards compute on sizes. Save inputs and
   eager-torch outputs, and build the native library with `opbridge build -o DIR`.
2. For each onnxruntime release: a venv (under $OPBRIDGE_CACHE_DIR or ~/.cache/opbridge,
   ort-matrix/, reused) with only onnxruntime and numpy (numpy<2 where that release needs it);
   ``ort_matrix_runner.py`` runs every file in the function tier (the file as exported) and the
   native tier (the library registered, served bodies removed) and compares with the eager outputs.
3. Print the table and write the JSON; ``ort_matrix_table.py --readme`` puts the
   table into the page holding its markers (docs/evidence.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from torch.utils import _pytree as pytree

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ort_matrix_table import DEFAULT_JSON, cache_folder, render  # noqa: E402

import bridge  # noqa: E402
import custom_ops.demo as demo  # noqa: E402
from bridge import cli  # noqa: E402
from bridge.tools.testing import OpModule, cases, free_dims  # noqa: E402
from ort_kernels.build import LIBRARY_NAME, served_ops  # noqa: E402

HERE = Path(__file__).resolve().parent
VERSIONS = ("1.17.3", "1.18.1", "1.20.1", "1.22.1", "newest")
OPSETS = (17, 18, 19, 20, 21, 22, 23)
SHAPES = ("static", "dynamic")


def venv_root() -> Path:
    return cache_folder("ort-matrix")


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True, timeout=900)


def _imports(python: Path) -> bool:
    probe = "import numpy, onnxruntime; onnxruntime.InferenceSession"
    return subprocess.run([str(python), "-c", probe], capture_output=True, timeout=300).returncode == 0


def ensure_venv(version: str, root: Path) -> Path:
    """The python of a venv with only onnxruntime ``version`` (``newest``: the newest) and numpy."""
    folder = root / f"ort-{version}"
    python = folder / "bin" / "python"
    ready = folder / ".ready"
    if ready.exists() and version != "newest" and _imports(python):
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    spec = "onnxruntime" if version == "newest" else f"onnxruntime=={version}"
    _pip(python, "--upgrade", spec, "numpy")
    if not _imports(python):  # NOTE: releases before numpy 2 support fail to import under numpy 2
        _pip(python, "numpy<2")
    if not _imports(python):
        raise RuntimeError(f"onnxruntime {version} does not import in {folder}")
    ready.write_text(version)
    return python


def _leaves(value) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _write_case(work: Path, name: str, opset: int, mc, shapes: str, served) -> dict:
    model, args = mc.model, mc.args
    # NOTE: a seed op's OpModule.forward takes *tensors: one parameter, the tuple of every input
    dynamic_shapes = None if shapes == "static" else mc.dynamic_shapes
    stem = work / f"{name}-{opset}-{shapes}"
    path = stem.with_suffix(".onnx")
    proto = bridge.export(model, args, path, dynamic_shapes=dynamic_shapes, opset_version=opset)
    native = onnx.ModelProto()
    native.CopyFrom(proto)
    keep = [f for f in native.functions if (f.domain, f.name) not in served]
    del native.functions[:]
    native.functions.extend(keep)
    native_path = stem.with_suffix(".native.onnx")
    onnx.save(native, native_path)
    inputs = [i.name for i in proto.graph.input]
    np.savez(stem.with_suffix(".inputs.npz"), **{n: t.detach().numpy() for n, t in zip(inputs, _leaves(args))})
    with torch.no_grad():
        expected = _leaves(model(*args))
    np.savez(stem.with_suffix(".expected.npz"), **{f"out{i}": t.numpy() for i, t in enumerate(expected)})
    return {"name": name, "opset": opset, "shapes": shapes, "ir_version": proto.ir_version,
            "dynamic_inputs": sum(not d.HasField("dim_value") for i in proto.graph.input
                                  for d in i.type.tensor_type.shape.dim),
            "files": {"function": str(path), "native": str(native_path)},
            "inputs": str(stem.with_suffix(".inputs.npz")), "expected": str(stem.with_suffix(".expected.npz")),
            "outputs": len(expected), "tolerances": [bridge.parity.tolerance(t.dtype) for t in expected]}


def _export_or_why(work: Path, name: str, opset: int, mc, shapes: str, served) -> dict:
    """The manifest entry of one file, or why opbridge could not export it (a cell of the table)."""
    try:
        return _write_case(work, name, opset, mc, shapes, served)
    except Exception as e:  # noqa: BLE001  an export failure is a result, not the end of the matrix
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"name": name, "opset": opset, "shapes": shapes, "export_error": f"{type(e).__name__}: {first}"[:1500]}


def export_cases(work: Path, opsets, shapes=SHAPES) -> dict:
    """The manifest: the demo and the first float32 sample of each seed op, at each opset, once per
    kind of ``shapes``."""
    library_dir = work / "native"
    cli.main(["-q", "build", "-o", str(library_dir)])
    served = served_ops(bridge.REGISTRY)
    models = [("demo", demo.build())]
    for case in cases(bridge.REGISTRY, dtypes=(torch.float32,)):
        if case.spec.name not in {n for n, _ in models} and case.spec.function is not None:
            module, tensors = OpModule.from_sample(case.spec, case.sample)
            models.append((case.spec.name, bridge.ModelCase(module, tensors, (free_dims(case.spec, tensors),))))
    entries = [_export_or_why(work, name, opset, mc, kind, served)
               for opset in opsets for kind in shapes for name, mc in models]
    return {"library": str(library_dir / LIBRARY_NAME), "cases": entries}


def run_version(version: str, root: Path, manifest_path: Path, n_cases: int) -> dict:
    try:
        python = ensure_venv(version, root)
    except Exception as e:  # noqa: BLE001  a release pip cannot install is a row of the table
        return {"requested": version, "onnxruntime": None, "numpy": None, "rows": [], "error": str(e)[:300]}
    r = subprocess.run([str(python), str(HERE / "ort_matrix_runner.py"), str(manifest_path)],
                       capture_output=True, text=True, timeout=1800)
    try:
        result = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        result = {"onnxruntime": version, "numpy": "?", "rows": [],
                  "error": f"runner crashed (rc {r.returncode}): {r.stderr[-300:]}"}
    result["requested"] = version
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS),
                        help="onnxruntime releases ('newest' = the newest pip finds)")
    parser.add_argument("--opsets", nargs="+", type=int, default=list(OPSETS))
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES),
                        help="export with static shapes, dynamic dimensions, or both")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the result")
    parser.add_argument("--venvs", default=None, help="folder for the per-release venvs (default: cache)")
    args = parser.parse_args(argv)
    root = Path(args.venvs) if args.venvs else venv_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ort-matrix-") as tmp:
        work = Path(tmp)
        manifest = export_cases(work, args.opsets, args.shapes)
        manifest_path = work / "manifest.json"
        manifest_path.write_text(json.dumps(manifest))
        versions = [run_version(v, root, manifest_path, len(manifest["cases"])) for v in args.versions]
    for version in versions:  # NOTE: the temp folder's name is noise in the committed JSON
        for row in version["rows"]:
            if "error" in row:
                row["error"] = row["error"].replace(str(work) + os.sep, "")
    result = {
        "date": datetime.date.today().isoformat(), "opsets": args.opsets, "shapes": args.shapes, "c_api": 17,
        "cases": sorted({c["name"] for c in manifest["cases"]}, key=lambda n: (n != "demo", n)),
        "ir_versions": {str(c["opset"]): c["ir_version"] for c in manifest["cases"] if "ir_version" in c},
        "dynamic_dims": {c["name"]: c["dynamic_inputs"] for c in manifest["cases"]
                         if c["shapes"] == "dynamic" and "dynamic_inputs" in c},
        "export_errors": sorted({f"{c['name']} ({c['shapes']}): {c['export_error']}" for c in manifest["cases"]
                                 if "export_error" in c}),
        "exported_with": {"torch": torch.__version__, "onnx": onnx.__version__,
                          "onnxruntime": onnxruntime.__version__},
        "versions": versions,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
