"""The one switch for every accelerator that rests on private internals.

``CONNECTORS_ACCELERATORS=off`` (also ``0``, ``false``, ``no``) in a process's environment
turns them all off there: Kafka's ctypes batch produce (:mod:`connectors.kafka._native`) and
Delta's reflection txn seed (:mod:`connectors.delta._txn_seed`). Executors need it in their
own environment (``spark.executorEnv.CONNECTORS_ACCELERATORS=off``; local-mode workers
inherit the driver's). CI runs the kill tests that way.
"""

from __future__ import annotations

import os

__all__ = ["ACCELERATORS_ENV", "accelerators_off"]

ACCELERATORS_ENV = "CONNECTORS_ACCELERATORS"


def accelerators_off() -> bool:
    """``CONNECTORS_ACCELERATORS=off`` (also ``0``, ``false``, ``no``) is set."""
    return os.environ.get(ACCELERATORS_ENV, "").strip().lower() in ("off", "0", "false", "no")
