"""How this opbridge was installed, and so the pip line that adds one of its extras (``python-tier``,
``openvino``, ``plot``): every install hint in a message comes from here.

opbridge is not on PyPI, so asking an index for ``opbridge`` with an extra fails. What works depends on the
install (PEP 610's ``direct_url.json``): an editable checkout takes ``pip install -e "CHECKOUT[extra]"``,
a wheel file takes ``pip install "WHEEL[extra]"`` (while the file is there), and any install takes
the extra's own packages, read from opbridge's metadata. Imports nothing heavy (no torch, no onnx).

Example:
    >>> editable = {"url": "file:///src/opbridge", "dir_info": {"editable": True}}
    >>> print(install_line("plot", editable, python="python", packages=["matplotlib>=3.8"]))
    python -m pip install -e "/src/opbridge[plot]"
    >>> print(install_line("plot", None, python="python", packages=["matplotlib>=3.8"]))
    python -m pip install "matplotlib>=3.8"
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "opbridge"


def _origin() -> dict | None:
    """PEP 610's record of where opbridge was installed from; None for an index install, or none at all.

    NOTE: a checkout's ``opbridge.egg-info`` (left by ``pip install -e .``) is found first from the
    checkout's folder and holds no record: the installed distribution's is read."""
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        text = dist.read_text("direct_url.json")
        if text:
            try:
                return json.loads(text)
            except ValueError:  # NOTE: a broken record says nothing about the install
                return None
    return None


def entry_points(group: str) -> dict[str, str]:
    """The entry points opbridge's own metadata declares in ``group`` (name -> ``module[:attr]``, as
    pyproject.toml's ``[project.entry-points."<group>"]`` states them); ``{}`` when opbridge is not installed.

    >>> entry_points("no.such.group")
    {}
    """
    try:
        declared = importlib.metadata.distribution(DISTRIBUTION).entry_points
    except importlib.metadata.PackageNotFoundError:
        return {}
    return {e.name: e.value for e in declared if e.group == group}


def _local_path(url: str) -> str | None:
    parsed = urlparse(url)
    return unquote(parsed.path) if parsed.scheme == "file" else None


def extra_packages(extra: str) -> list[str]:
    """The requirements opbridge's metadata gives ``extra`` (``[]`` when opbridge is not installed).

    >>> any(r.startswith("matplotlib") for r in extra_packages("plot"))
    True
    """
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    found = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        if f'extra == "{extra}"' in marker.replace("'", '"'):
            found.append(requirement.strip().replace(" ", ""))
    return found


def _checkout() -> Path | None:
    """The source checkout this opbridge runs from when it is not installed (a ``PYTHONPATH`` run)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def pip_line(extra: str) -> str:
    """The command that installs ``extra`` into this environment, the way this opbridge was installed."""
    record = _origin()
    packages = extra_packages(extra)
    # NOTE: not installed at all (a run from a checkout on PYTHONPATH): the checkout's own line
    checkout = _checkout() if record is None and not packages else None
    if checkout is not None:
        record = {"url": checkout.as_uri(), "dir_info": {"editable": True}}
    return install_line(extra, record, python=sys.executable, packages=packages)


def install_line(extra: str, record: dict | None, *, python: str, packages: Sequence[str]) -> str:
    """``python -m pip install`` of ``extra`` for an install described by ``record`` (PEP 610's
    ``direct_url.json``; None: from an index): ``-e "CHECKOUT[extra]"`` for an editable install,
    ``"WHEEL[extra]"`` for a wheel file still on disk, else the extra's own ``packages``."""
    command = f"{python} -m pip install"
    path = _local_path(record.get("url", "")) if record else None
    if record and path and record.get("dir_info", {}).get("editable"):
        return f'{command} -e "{path}[{extra}]"'
    if path and path.endswith(".whl") and os.path.isfile(path):
        return f'{command} "{path}[{extra}]"'
    return f"{command} {' '.join(json.dumps(p) for p in packages)}"
