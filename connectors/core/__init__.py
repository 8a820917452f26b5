"""The protocol core, written once for every target.

Layout (a picture of the protocol):

- :mod:`~connectors.core.protocol`  pure per-batch state machine, families, crash points
- :mod:`~connectors.core.template`  ``TwoPhaseCommitSink`` and the three family templates
- :mod:`~connectors.core.tasks`     executor side: what one task does
- :mod:`~connectors.core.driver`    driver side: decide, commit, record
- :mod:`~connectors.core.recovery`  reconcile and sweep what earlier runs left
- :mod:`~connectors.core.ledger`    ledger interface, committables, query binding
- :mod:`~connectors.core.naming`    sink ids, transaction ids
- :mod:`~connectors.core.fingerprint`, :mod:`~connectors.core.retry`,
  :mod:`~connectors.core.crash`, :mod:`~connectors.core.metrics`,
  :mod:`~connectors.core.errors`

Nothing in ``core`` imports a target package; only ``spark_batch`` imports pyspark.
"""
