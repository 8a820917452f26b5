"""``python -m connectors``: the demo and the operator tools (see :mod:`connectors.cli`)."""

from connectors.cli import main

raise SystemExit(main())
