"""The protocol core, written once for every target; no engine, no target library.

Layout (a picture of the protocol, drawn in docs/architecture.md):

- :mod:`connectors.core.protocol`   the protocol, sans I/O: commands, the guard, one sink's
  coordinator and a fan-out's program, recovery, the replay rule, crash points
- :mod:`connectors.core.driver`     the driver side: ``SinkDriver`` (the only builder of
  programs and executors), the executor and its performers (the only places with a
  protocol step's I/O), a run's state, the DataSource form's split batch
- :mod:`connectors.core.templates`  what connector authors subclass: ``TwoPhaseCommitSink``,
  the three families (the one declaration of every hook), task functions, options, FanOut
- :mod:`connectors.core.ledgers`    the ledger contract, the file and object-store ledgers
- :mod:`connectors.core.policies`   retrying a step, restarting a batch, stopping a query
- on the ground: :mod:`~connectors.core.states` (families, batch states, crash points),
  :mod:`~connectors.core.batch` (what the protocol asks of the engine),
  :mod:`~connectors.core.engine` (engine front ends; Spark's lives in ``connectors.spark``),
  :mod:`~connectors.core.fingerprint`, :mod:`~connectors.core.naming`,
  :mod:`~connectors.core.metrics`, :mod:`~connectors.core.errors`,
  :mod:`~connectors.core.pool`, :mod:`~connectors.core.accelerators`

Nothing in ``core`` imports pyspark or a target package (``tests/test_import_graph.py``).
"""
