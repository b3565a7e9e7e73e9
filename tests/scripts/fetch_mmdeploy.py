"""Fetch mmdeploy 1.3.1's wheel from PyPI (never installed) and extract its onnxruntime custom-op
library, for tests/test_kernel_libraries.py and docs/kernel_libraries.md.

    .venv/bin/python tests/scripts/fetch_mmdeploy.py [FOLDER]

FOLDER defaults to build/mmdeploy-1.3.1 in the repository (ignored by git). It then holds the
wheel (wheels/) and, extracted from it, ``libmmdeploy_onnxruntime_ops.so`` with the one library it
links against, ``libonnxruntime.so.1.15.1`` (found beside it through its RPATH $ORIGIN: the .so
alone does not load). Nothing is fetched when both are there. Prints the library's path.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bridge.core.basics.files import write_bytes  # noqa: E402  (the repository on sys.path first)

VERSION = "1.3.1"
FOLDER = ROOT / "build" / f"mmdeploy-{VERSION}"
LIBRARY = "libmmdeploy_onnxruntime_ops.so"
MEMBERS = (f"mmdeploy/lib/{LIBRARY}", "mmdeploy/lib/libonnxruntime.so.1.15.1")


def fetch(folder: Path = FOLDER) -> Path:
    """The extracted library's path, downloading the wheel first when it is not in ``folder/wheels``."""
    targets = [folder / Path(m).name for m in MEMBERS]
    if all(t.is_file() for t in targets):
        return targets[0]
    wheels = folder / "wheels"
    found = glob.glob(str(wheels / f"mmdeploy-{VERSION}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", f"mmdeploy=={VERSION}",
                        "--only-binary", ":all:", "-d", str(wheels)], check=True, timeout=600)
        found = glob.glob(str(wheels / f"mmdeploy-{VERSION}-*.whl"))
    with zipfile.ZipFile(found[0]) as wheel:
        for member, target in zip(MEMBERS, targets):
            write_bytes(target, wheel.read(member), executable=True)
    return targets[0]


if __name__ == "__main__":
    print(fetch(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else FOLDER))
