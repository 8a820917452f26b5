"""``python -m integration.services``: the command line of the services (``scripts/services``)."""

from __future__ import annotations

import sys

from integration.services.cli import main

if __name__ == "__main__":
    sys.exit(main())
