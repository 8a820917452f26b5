"""Test kit for connector authors: test your sink the way we test ours.

- :class:`LocalBatch`: runs a sink's tasks in-process, with task retries and speculative
  attempts on demand (Spark's local mode does neither).
- In-memory participants for each protocol family (:class:`InMemoryTarget`,
  :class:`InMemoryPreparedSink`, :class:`InMemoryTaskCommitSink`,
  :class:`InMemoryDriverCommitSink`), and one broken sink per family that the suite must
  reject: :class:`CommitBeforeDecisionSink`, :class:`IgnoresMarkerSink`,
  :class:`ForgetsCommitSink`. :class:`InMemoryObjectStore`: an object store with S3's
  conditional writes, for ledgers kept as objects
  (:class:`~connectors.core.ledgers.object_ledger.ObjectLedger`).
- The conformance suite (:class:`SinkConformanceTests`, :func:`run_conformance`) over a
  :class:`SinkHarness` you write for your target.
- Crash points: :func:`connectors.core.protocol.crash.arm` in-process, ``CONNECTORS_CRASH_AT`` for
  real processes; the pytest plugin (:mod:`connectors.testing.plugin`) adds fixtures.
- The real-kill harness (:mod:`connectors.testing.kill`): your driver run as a child
  process, SIGKILLed at each crash point of a plan and restarted, every kill proved;
  :mod:`connectors.testing.checkpoint` reads what Spark's checkpoint says of the batches.

Depends on :mod:`connectors.core` only.
"""

from connectors.core.protocol.crash import SimulatedCrash, arm, armed, disarm_all
from connectors.testing.conformance import (
    SCENARIOS,
    DataSourceFormHarness,
    SinkConformanceTests,
    SinkHarness,
    batch_rows,
    run_conformance,
)
from connectors.testing.local import Attempt, LocalBatch, SimulatedTaskFailure
from connectors.testing.memory import (
    CommitBeforeDecisionSink,
    ForgetsCommitSink,
    IgnoresMarkerSink,
    InMemoryDriverCommitSink,
    InMemoryLedger,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
)
from connectors.testing.objects import InMemoryObjectStore

__all__ = [
    "SCENARIOS",
    "Attempt",
    "CommitBeforeDecisionSink",
    "DataSourceFormHarness",
    "ForgetsCommitSink",
    "IgnoresMarkerSink",
    "InMemoryDriverCommitSink",
    "InMemoryLedger",
    "InMemoryObjectStore",
    "InMemoryPreparedSink",
    "InMemoryTarget",
    "InMemoryTaskCommitSink",
    "LocalBatch",
    "SimulatedCrash",
    "SimulatedTaskFailure",
    "SinkConformanceTests",
    "SinkHarness",
    "arm",
    "armed",
    "batch_rows",
    "disarm_all",
    "run_conformance",
]
