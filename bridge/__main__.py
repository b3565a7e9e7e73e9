"""``python -m bridge`` is the ``opbridge`` command."""

import sys

from bridge.tools.cli import main

sys.exit(main())
