"""Every file opbridge writes for the op table stays byte-identical: tests/scripts/file_hashes.py exports each op's
float32 samples at ONNX opsets 17..23 as a plain, attached, attached-afterwards and inlined file, and its sha256s
must equal tests/data/file_hashes.json (regenerate that with ``python tests/scripts/file_hashes.py`` only for a
change meant to alter the files, and say so in the commit)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from op_db import F32, OPS

SCRIPT = Path(__file__).resolve().parent / "scripts" / "file_hashes.py"
STORED = Path(__file__).resolve().parent / "data" / "file_hashes.json"


def _differences(stored: dict, now: dict) -> list[str]:
    keys = sorted(stored.keys() | now.keys())
    return [f"{k}: stored {stored.get(k, 'nothing')}, now {now.get(k, 'nothing')}"
            for k in keys if stored.get(k) != now.get(k)]


def test_differences_name_each_file():
    stored = {"a/s/17/plain": "1", "a/s/17/inlined": "2", "a/s/18/plain": "3"}
    now = {"a/s/17/plain": "1", "a/s/17/inlined": "9", "b/s/17/plain": "4"}
    assert _differences(stored, now) == ["a/s/17/inlined: stored 2, now 9", "a/s/18/plain: stored 3, now nothing",
                                         "b/s/17/plain: stored nothing, now 4"]
    assert _differences(stored, dict(stored)) == []


def test_the_stored_table_covers_every_op_sample_opset_and_kind():
    # NOTE: an op or sample added to the table without regenerating tests/data/file_hashes.json fails here
    stored = json.loads(STORED.read_text())
    samples = {(e.qualname, s.name or "-") for e in OPS for s in e.samples(F32)}
    assert set(stored) == {f"{op}/{sample}/{opset}/{kind}" for op, sample in samples for opset in range(17, 24)
                           for kind in ("plain", "attached", "attach", "inlined")}
    # a plain file never equals its attached one: the hashes are of the files, not of something constant
    plain = {k.rpartition("/")[0]: v for k, v in stored.items() if k.endswith("/plain")}
    assert all(stored[f"{site}/attached"] != digest for site, digest in plain.items()
               if not digest.startswith("error"))


@pytest.mark.long
def test_written_files_are_byte_identical(tmp_path):
    out = tmp_path / "hashes.json"
    r = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=3000)
    assert r.returncode == 0, r.stderr[-4000:]
    differences = _differences(json.loads(STORED.read_text()), json.loads(out.read_text()))
    assert not differences, "files that changed:\n" + "\n".join(differences)
