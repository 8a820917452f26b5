"""connectors: exactly-once sinks for Spark Structured Streaming.

Sinks are callables for ``df.writeStream.foreachBatch(sink)`` (and for batch jobs:
``sink(df, run_id)``). With a replayable source and a deterministic query they give
end-to-end exactly-once output through two-phase commit, modelled on Apache Flink's
``TwoPhaseCommitSinkFunction``: tasks pre-commit, the driver records a decision and
commits; a restarted driver commits what was decided and aborts the rest.

This module is the API for people who run queries: the sinks, stopping, errors, retry
policies and :class:`BatchMetrics` (``sink.last_metrics``); its ``__all__`` lists it. The
API for people who write a sink for a new target (the templates, ledgers, transactions,
fingerprints) is :mod:`connectors.sdk`; the author's test kit is :mod:`connectors.testing`.
Everything else is private.

Example::

    from connectors import DeltaSink, KafkaSink, PostgresSink
    sink = PostgresSink("postgresql://user@host:5432/db", "public.events", sink_id="events-pg")
    sink = KafkaSink("events", {"bootstrap.servers": "localhost:9092"}, sink_id="events-kafka")
    sink = DeltaSink(f"{path}/events", sink_id="events-delta", create_table=True)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

The DataSource form of a prepared-transaction sink (``docs/datasource.md``):
``connectors.register(spark)``, then ``df.writeStream.format("connectors.postgres")``
with the sink's arguments as options.
One query into several targets, a batch in all or in none: ``FanOut(pg, (kafka,
to_records), delta, sink_id="events-fan")`` (``docs/fan-out.md``).

Stopping (``stop_gracefully``, ``stop_on_sigterm``, ``await_termination``; see
``docs/stopping.md``) finishes the batch in flight and refuses the next one, so nothing is
left prepared or open. ``stop_with_savepoint`` (or ``take_savepoint`` after any stop) gives
the last decided batch and the option that starts a changed query right after it
(``docs/savepoints.md``). The sinks of each target load lazily: ``PostgresSink`` needs the
``postgres`` extra, ``MariaDBSink`` the ``mariadb`` extra, ``KafkaSink`` the ``kafka``
extra, ``DeltaSink`` the ``delta`` extra, ``IcebergSink`` pyspark and Iceberg's runtime jar
(``docs/iceberg.md``); naming one without its extra raises an ImportError that says
which extra to install.

Metrics: every batch logs one ``key=value`` line on the ``connectors.metrics`` logger;
``export_metrics(PrometheusMetrics(port=9464))`` or
``export_metrics(OpenTelemetryMetrics())`` exports them (``docs/metrics.md``).
"""

import logging
from typing import TYPE_CHECKING, Any

from connectors.core.engine import register_front_end as _register_front_end
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    DataLossError,
    DecisionUnknown,
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
from connectors.core.metrics import BatchMetrics
from connectors.core.policies.binding import (
    register_savepoint_loader as _register_savepoint_loader,
)
from connectors.core.policies.retry import (
    DEFAULT_COMMIT_RETRY,
    ExponentialBackoff,
    FailureRate,
    FixedDelay,
    NoRetry,
    RetryPolicy,
)
from connectors.observe import OpenTelemetryMetrics, PrometheusMetrics, export_metrics

if TYPE_CHECKING:
    from connectors.core.batch import BatchInput
    from connectors.core.engine import EngineCall
    from connectors.core.policies.binding import ResumePoint
    from connectors.core.templates.fanout import FanOut
    from connectors.delta import DeltaSink, DeltaSinks
    from connectors.iceberg import IcebergSink
    from connectors.kafka import KafkaSink
    from connectors.mariadb import MariaDBSink
    from connectors.postgres import PostgresSink
    from connectors.savepoints import Savepoint, load_savepoint, take_savepoint
    from connectors.spark import (
        SavepointStop,
        StopReport,
        await_termination,
        register,
        stop_gracefully,
        stop_on_sigterm,
        stop_with_savepoint,
    )

__version__ = "0.1.0.dev0"


def _spark_front_end(
    data: Any, call: "EngineCall"
) -> "tuple[BatchInput, str | None] | None":
    """Spark's front end (classic and Connect), loaded (with pyspark) on the first object
    that comes from pyspark; the core itself knows no engine (:mod:`connectors.core.engine`)."""
    if not type(data).__module__.startswith("pyspark."):
        return None
    from connectors.spark.frames import front_end

    return front_end(data, call)


_register_front_end(_spark_front_end)


def _load_savepoint(text: str) -> "ResumePoint":
    """``resume_from`` given as a path (or JSON): :func:`connectors.savepoints.load_savepoint`,
    imported on first use (the core imports no other package)."""
    from connectors.savepoints import load_savepoint

    return load_savepoint(text)


_register_savepoint_loader(_load_savepoint)

# Every module logs through ``logging.getLogger(__name__)``, below this package's logger
# (as does the "connectors.metrics" channel). As the logging HOWTO advises libraries, the
# only handler we add is a NullHandler: the application decides what is shown and where
# (``logging.basicConfig(level=logging.INFO)`` shows our lines, metrics included).
logging.getLogger(__name__).addHandler(logging.NullHandler())

# Target sinks: public name -> module (imported on first use, so that the core works
# without every client library installed).
_LAZY = {
    "DeltaSink": "connectors.delta",
    "DeltaSinks": "connectors.delta",
    "FanOut": "connectors.core.templates.fanout",
    "IcebergSink": "connectors.iceberg",
    "KafkaSink": "connectors.kafka",
    "MariaDBSink": "connectors.mariadb",
    "PostgresSink": "connectors.postgres",
    "StopReport": "connectors.spark",
    "register": "connectors.spark",
    "await_termination": "connectors.spark",
    "stop_gracefully": "connectors.spark",
    "stop_on_sigterm": "connectors.spark",
    "stop_with_savepoint": "connectors.spark",
    "SavepointStop": "connectors.spark",
    "Savepoint": "connectors.savepoints",
    "load_savepoint": "connectors.savepoints",
    "take_savepoint": "connectors.savepoints",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_COMMIT_RETRY",
    "BadInputError",
    "BatchMetrics",
    "ConfigurationError",
    "ConnectorError",
    "DataLossError",
    "DecisionUnknown",
    "DeltaSink",
    "DeltaSinks",
    "DependencyError",
    "ExponentialBackoff",
    "FailureRate",
    "FanOut",
    "FatalError",
    "FencedError",
    "FixedDelay",
    "GracefulStop",
    "IcebergSink",
    "KafkaSink",
    "MariaDBSink",
    "NoRetry",
    "NonDeterministicReplayError",
    "OpenTelemetryMetrics",
    "PostgresSink",
    "PrometheusMetrics",
    "ProtocolStateError",
    "QueryBindingError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "Savepoint",
    "SavepointStop",
    "StopReport",
    "TransientError",
    "await_termination",
    "export_metrics",
    "load_savepoint",
    "register",
    "stop_gracefully",
    "stop_on_sigterm",
    "stop_with_savepoint",
    "take_savepoint",
]
