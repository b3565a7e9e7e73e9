"""Run the files of an ORT-matrix manifest in THIS interpreter's onnxruntime; print one JSON line.

Runs in a venv that holds only onnxruntime and numpy (no torch, no onnx, no opbridge), as a
deployment host would: the function tier is a plain InferenceSession on the file with its
model-local bodies, the native tier registers the prebuilt custom-op library and opens the copy
of the file without the bodies the library serves. Outputs are compared with the ones computed
in opbridge's own venv (eager torch) under the same tolerances as ``bridge.check_parity``.

    python ort_matrix_runner.py manifest.json
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import onnxruntime as ort


def compare(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> dict:
    if expected.shape != actual.shape:
        return {"passed": False, "note": f"shape {list(actual.shape)} != {list(expected.shape)}"}
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore"):
        same = (e == a) | (np.isnan(e) & np.isnan(a))
        diff = np.where(same, 0.0, np.abs(a - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    max_abs = float(diff.max()) if diff.size else 0.0
    return {"passed": bool(np.all(diff <= atol + rtol * np.abs(e))), "max_abs": max_abs}


def run_case(case: dict, tier: str, library: str) -> dict:
    row = {"case": case["name"], "opset": case["opset"], "shapes": case.get("shapes", "static"), "tier": tier}
    if "export_error" in case:  # NOTE: opbridge made no file for this case; nothing to load
        return {**row, "status": "error", "error": f"not exported: {case['export_error']}"}
    try:
        options = ort.SessionOptions()
        if tier == "native":
            options.register_custom_ops_library(library)
        sess = ort.InferenceSession(case["files"][tier], options, providers=["CPUExecutionProvider"])
        with np.load(case["inputs"]) as data:
            feeds = {k: data[k] for k in data.files}
        start = time.perf_counter()
        outputs = sess.run(None, feeds)
        row["ms"] = round((time.perf_counter() - start) * 1e3, 3)
        with np.load(case["expected"]) as data:
            checks = [compare(data[f"out{i}"], out, *case["tolerances"][i]) for i, out in enumerate(outputs)]
        row["status"] = "pass" if len(checks) == case["outputs"] and all(c["passed"] for c in checks) else "mismatch"
        row["max_abs"] = max((c.get("max_abs", float("inf")) for c in checks), default=0.0)
    except Exception as e:  # noqa: BLE001  every failure is a cell of the table
        row["status"] = "error"
        row["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
    return row


def main(argv: list[str]) -> int:
    with open(argv[0]) as fh:
        manifest = json.load(fh)
    rows = [run_case(case, tier, manifest["library"]) for case in manifest["cases"] for tier in ("function", "native")]
    print(json.dumps({"onnxruntime": ort.__version__, "numpy": np.__version__,
                      "python": sys.version.split()[0], "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
