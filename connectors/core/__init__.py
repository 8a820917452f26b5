"""The protocol core, written once for every target; no engine, no target library.

Layout (a picture of the protocol):

- :mod:`~connectors.core.coordinator`  every protocol step, in order, recovery included:
  a sans-I/O generator of commands (:mod:`~connectors.core.commands`), each checked by the
  guard in :mod:`~connectors.core.guard` before its side effect
- :mod:`~connectors.core.executor`     performs the commands: ledger, engine, hooks, retries
- :mod:`~connectors.core.tasks`        executor side: what one task does
- :mod:`~connectors.core.template`     ``TwoPhaseCommitSink``; :mod:`~connectors.core.families`
  the three family templates: the one declaration of every hook
- :mod:`~connectors.core.protocol`     families, batch states, crash points
- :mod:`~connectors.core.ledger`       ledger interface, committables, query binding
- :mod:`~connectors.core.engine`       engine front ends (Spark's lives in ``connectors.spark``)
- :mod:`~connectors.core.naming`, :mod:`~connectors.core.transactions`,
  :mod:`~connectors.core.fingerprint`, :mod:`~connectors.core.retry`,
  :mod:`~connectors.core.crash`, :mod:`~connectors.core.metrics`,
  :mod:`~connectors.core.errors`

Nothing in ``core`` imports pyspark or a target package (``tests/test_import_graph.py``).
"""
