"""mmdeploy 1.3.1's onnxruntime kernel library for the tests that run it (tests/test_kernel_libraries.py,
tests/test_upstream_functions.py): where it is, and what a test does without it.

tests/scripts/fetch_mmdeploy.py fetches it (.ci/run runs it, and fails when it cannot). Every test that
needs it is marked ``long`` (out of the README's default command, in CI's ``-m long`` run;
tests/test_kernel_libraries.py checks the marks). Without the library such a test fails, naming the
command, unless ``OPBRIDGE_TEST_NO_MMDEPLOY=1`` says the run is offline on purpose: then it skips, saying
what it left unchecked.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FETCH = ".venv/bin/python tests/scripts/fetch_mmdeploy.py"
LIBRARY = Path(os.environ.get("OPBRIDGE_TEST_MMDEPLOY_LIB")
               or ROOT / "build" / "mmdeploy-1.3.1" / "libmmdeploy_onnxruntime_ops.so")
# NOTE: the explicit opt-out of an offline run: without it a missing library fails the tests that need it
OFFLINE = "OPBRIDGE_TEST_NO_MMDEPLOY"


def missing(what: str) -> None:
    """A test's evidence is missing: fail, or skip saying what is left unchecked when $OPBRIDGE_TEST_NO_MMDEPLOY=1."""
    if os.environ.get(OFFLINE) == "1":
        pytest.skip(f"{OFFLINE}=1: left unchecked: a user's kernel library in the native tier (mmdeploy's {what} "
                    "missing): its parity against eager, opbridge's library beside it, docs/kernel_libraries.md's "
                    "blocks, its missing dependency's message, a domain both libraries serve, mmcv's MDCN node")
    pytest.fail(f"mmdeploy's {what} is not fetched: run `{FETCH}` (downloads the 11 MB wheel from PyPI), or point "
                "$OPBRIDGE_TEST_MMDEPLOY_LIB at libmmdeploy_onnxruntime_ops.so; offline, set "
                f"{OFFLINE}=1 to leave these tests unchecked", pytrace=False)


def library() -> str:
    """The library's path; a missing library is :func:`missing`."""
    if not LIBRARY.is_file():
        missing(f"library ({LIBRARY})")
    return str(LIBRARY)
