"""connectors.sdk: the API for connector authors (people who write a sink for a new target).

``connectors`` is the API for people who run queries (the sinks, stopping, errors, retry
policies, metrics); this module is the other audience's: the templates a sink subclasses
(one per protocol family), the ledger it keeps its decisions in, the transactions and ids
the template hands to its hooks, fingerprints, the batch the engine passes, the protocol's
states and crash points, and the engine front-end registry. The errors are shared: a sink
raises the same classes its users catch, so they are here too (the same objects as
``connectors.X``). docs/connector-guide.md walks through writing a sink.

Example (a driver-commit sink into a dict; a complete prepared-transaction one is
``examples/fs_sink.py``, and each hook's docstring says who calls it and what it must do)::

    import pyarrow as pa
    from connectors.sdk import DriverCommitSink, FileLedger
    from connectors.testing import LocalBatch

    class DictSink(DriverCommitSink):
        def __init__(self, store, *, sink_id):
            super().__init__(sink_id=sink_id)
            self.store = store
        def create_ledger(self):
            return FileLedger(f"{path}/ledger", sink_id=self.sink_id)
        def is_committed(self, ctx):
            return (ctx.app_id, ctx.batch_id) in self.store
        def commit_batch(self, batch, ctx):  # idempotent by (app id, batch id)
            self.store[(ctx.app_id, ctx.batch_id)] = batch.to_arrow().num_rows
            return None

    store = {}
    DictSink(store, sink_id="dict").write_batch(LocalBatch(pa.table({"x": [1, 2]})), 0)
    assert list(store.values()) == [2]

The test kit is :mod:`connectors.testing`, documented here and not re-exported: it is what
an author's *tests* import (``LocalBatch``, in-memory participants, the conformance suite
``run_conformance``/``SinkConformanceTests`` over a ``SinkHarness``, crash points
``arm``/``CONNECTORS_CRASH_AT``, the real-kill harness :mod:`connectors.testing.kill`, the
pytest plugin), never what a sink's own code needs; keeping it in its own namespace keeps
test doubles (``InMemoryLedger``, deliberately broken sinks) out of the API a sink is
written against, and keeps ``import connectors.sdk`` from loading the kit.
"""

from connectors.core.batch import BatchContext, BatchInput, TaskInfo
from connectors.core.engine import EngineCall, register_front_end
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    DataLossError,
    DependencyError,
    FatalError,
    FencedError,
    GracefulStop,
    NonDeterministicReplayError,
    ProtocolStateError,
    QueryBindingError,
    RetriesExhaustedError,
    TransientError,
)
from connectors.core.fingerprint import Fingerprint, fingerprint_batch
from connectors.core.ledgers.file_ledger import FileLedger
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, TaskCommit
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import TransactionId, validate_sink_id
from connectors.core.protocol.transactions import (
    SlotMarker,
    SlotPlan,
    SlotTransaction,
    TaskTransaction,
)
from connectors.core.states import BatchState, CrashPoint, Family
from connectors.core.templates.families import (
    DriverCommitSink,
    PreparedTransactionSink,
    TaskCommitSink,
)
from connectors.core.templates.options import Options
from connectors.core.templates.template import TwoPhaseCommitSink

__all__ = [
    "BadInputError",
    "BatchContext",
    "BatchInput",
    "BatchMetrics",
    "BatchState",
    "ConfigurationError",
    "ConnectorError",
    "CrashPoint",
    "DataLossError",
    "DependencyError",
    "DriverCommitSink",
    "EngineCall",
    "Family",
    "FatalError",
    "FencedError",
    "FileLedger",
    "Fingerprint",
    "GracefulStop",
    "Ledger",
    "LedgerEntry",
    "NonDeterministicReplayError",
    "Options",
    "PreparedTransactionSink",
    "ProtocolStateError",
    "QueryBindingError",
    "RetriesExhaustedError",
    "SlotMarker",
    "SlotPlan",
    "SlotTransaction",
    "TaskCommit",
    "TaskCommitSink",
    "TaskInfo",
    "TaskTransaction",
    "TransactionId",
    "TransientError",
    "TwoPhaseCommitSink",
    "fingerprint_batch",
    "register_front_end",
    "validate_sink_id",
]
