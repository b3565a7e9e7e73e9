"""``python -m bridge`` is the ``opbridge`` command."""

from bridge.tools.cli import console

console()
