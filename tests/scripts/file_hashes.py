"""The sha256 of every file opbridge writes for the op table: each op of tests/op_db.py (its float32 samples,
as ``OpModule``s) x ONNX opsets 17..23 x file kind:

- ``plain``: ``bridge.export(..., functions=False)``, the custom nodes alone;
- ``attached``: ``bridge.export(...)``, the custom nodes with their bodies as model-local functions;
- ``attach``: the plain file given its bodies afterwards (``bridge.attach_functions``, as ``opbridge attach``);
- ``inlined``: ``bridge.export(..., inline=True)``, standard ONNX only.

A file that cannot be written is recorded as ``error: <exception class>``. Keys are ``op/sample/opset/kind``.

    python tests/scripts/file_hashes.py             # (re)write tests/data/file_hashes.json
    python tests/scripts/file_hashes.py OUT.json    # write the hashes to OUT.json

tests/test_file_hashes.py runs it and compares with tests/data/file_hashes.json, naming each file that
differs: a refactor must leave every written file byte-identical.
"""

import hashlib
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: op_db

import onnx  # noqa: E402
from op_db import F32, OPS  # noqa: E402

import bridge  # noqa: E402
from bridge.tools.testing import OpModule  # noqa: E402

OPSETS = range(17, 24)
KINDS = ("plain", "attached", "attach", "inlined")
STORED = Path(__file__).resolve().parents[1] / "data" / "file_hashes.json"


def _sha(proto: onnx.ModelProto) -> str:
    return hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()


def _files(module, args, opset: int) -> dict[str, str]:
    """kind -> sha256 (or the error) of each file of one module at one opset."""
    out: dict[str, str] = {}
    plain = None
    for kind, options in (("plain", {"functions": False}), ("attached", {}), ("inlined", {"inline": True})):
        try:
            proto = bridge.export(module, args, opset_version=opset, **options)
        except Exception as e:  # noqa: BLE001 (a file that cannot be written is recorded as such)
            out[kind] = f"error: {type(e).__name__}"
            continue
        out[kind] = _sha(proto)
        if kind == "plain":
            plain = proto
    if plain is None:
        out["attach"] = "error: no plain file"
    else:
        attached = onnx.ModelProto()
        attached.CopyFrom(plain)
        try:
            bridge.attach_functions(attached)
            out["attach"] = _sha(attached)
        except Exception as e:  # noqa: BLE001
            out["attach"] = f"error: {type(e).__name__}"
    return {k: out[k] for k in KINDS}


def hashes() -> dict[str, str]:
    table: dict[str, str] = {}
    for entry in OPS:
        for sample in entry.samples(F32):
            module, args = OpModule.from_sample(entry.spec, sample)
            for opset in OPSETS:
                for kind, digest in _files(module, args, opset).items():
                    table[f"{entry.qualname}/{sample.name or '-'}/{opset}/{kind}"] = digest
    return table


def main() -> None:
    warnings.simplefilter("ignore")
    table = hashes()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else STORED
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
