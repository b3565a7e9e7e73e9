"""``python -m bridge`` is the ``opbridge`` command."""

import sys

from bridge.cli import main

sys.exit(main())
