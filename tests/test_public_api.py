"""The public API is pinned: what ``__all__`` lists, that it resolves, and is documented."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import connectors
import connectors.core
import connectors.sdk
import connectors.testing

# For people who run queries: sinks, stopping, savepoints, errors, retry policies, metrics.
CONNECTORS_ALL = [
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
    "PrometheusMetrics",
    "PostgresSink",
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

# For connector authors: templates, ledgers, transactions, fingerprints, the batch, the
# protocol's states and crash points, front ends (connectors.sdk only, never in
# connectors: nothing was released before they moved, so no old name is kept).
AUTHOR_NAMES = [
    "BatchContext",
    "BatchInput",
    "BatchState",
    "CrashPoint",
    "DriverCommitSink",
    "EngineCall",
    "Family",
    "FileLedger",
    "Fingerprint",
    "Ledger",
    "LedgerEntry",
    "PreparedTransactionSink",
    "SlotMarker",
    "SlotTransaction",
    "TaskCommit",
    "TaskCommitSink",
    "TaskInfo",
    "TaskTransaction",
    "TransactionId",
    "TwoPhaseCommitSink",
    "fingerprint_batch",
    "register_front_end",
    "validate_sink_id",
]

# Shared: what a sink raises and reports, the same objects in both.
SHARED = [
    "BadInputError",
    "BatchMetrics",
    "ConfigurationError",
    "ConnectorError",
    "DataLossError",
    "DependencyError",
    "FatalError",
    "FencedError",
    "GracefulStop",
    "NonDeterministicReplayError",
    "ProtocolStateError",
    "QueryBindingError",
    "RetriesExhaustedError",
    "TransientError",
]

# New in connectors.sdk only (never in connectors.__all__).
SDK_ONLY = ["Options", "SlotPlan"]
SDK_ALL = AUTHOR_NAMES + SDK_ONLY + SHARED

TESTING_ALL = [
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

PACKAGES = [(connectors, CONNECTORS_ALL), (connectors.sdk, SDK_ALL),
            (connectors.testing, TESTING_ALL)]
REPO_ROOT = Path(__file__).resolve().parent.parent


def _own_docstring(obj: object) -> str | None:
    """The docstring written for ``obj`` itself: not inherited, not made by dataclass."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        if doc and doc.startswith(f"{obj.__name__}("):  # dataclass's generated signature
            return None
        return doc  # type: ignore[no-any-return]
    return getattr(obj, "__doc__", None)


def test_connectors_all_is_pinned() -> None:
    assert sorted(connectors.__all__) == sorted(CONNECTORS_ALL)


def test_connectors_sdk_all_is_pinned() -> None:
    assert sorted(connectors.sdk.__all__) == sorted(SDK_ALL)


def test_the_two_audiences_share_only_the_errors_and_metrics() -> None:
    assert set(connectors.__all__) & set(connectors.sdk.__all__) == set(SHARED)
    for name in SHARED:
        assert getattr(connectors, name) is getattr(connectors.sdk, name)


@pytest.mark.parametrize("name", AUTHOR_NAMES)
def test_an_author_name_is_not_found_in_connectors(name: str) -> None:
    assert not hasattr(connectors, name)
    with pytest.raises(ImportError):
        exec(f"from connectors import {name}", {})


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        connectors.Nope  # type: ignore[attr-defined]  # noqa: B018


def test_connectors_testing_all_is_pinned() -> None:
    assert sorted(connectors.testing.__all__) == sorted(TESTING_ALL)


@pytest.mark.parametrize(("module", "names"), PACKAGES, ids=lambda v: getattr(v, "__name__", ""))
def test_all_has_no_duplicates(module: object, names: list[str]) -> None:
    assert len(set(module.__all__)) == len(module.__all__)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "qualified", [f"connectors.{n}" for n in CONNECTORS_ALL]
    + [f"connectors.sdk.{n}" for n in SDK_ALL]
    + [f"connectors.testing.{n}" for n in TESTING_ALL]
)
def test_every_public_name_resolves_and_is_documented(qualified: str) -> None:
    module_name, _, name = qualified.rpartition(".")
    obj = getattr(importlib.import_module(module_name), name)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        doc = _own_docstring(obj)
        assert doc and doc.strip(), f"{qualified} has no docstring of its own"


@pytest.mark.parametrize(("module", "names"), [("connectors", CONNECTORS_ALL),
                                              ("connectors.sdk", SDK_ALL)])
def test_star_import_gives_exactly_the_public_names(module: str, names: list[str]) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)
    namespace.pop("__builtins__")
    assert sorted(namespace) == sorted(names)


def test_every_core_and_testing_module_all_resolves() -> None:
    for package in (connectors.core, connectors.testing):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for name in getattr(module, "__all__", []):
                assert hasattr(module, name), f"{module.__name__}.__all__ lists {name!r}"


def test_importing_the_public_api_does_not_import_pyspark() -> None:
    # The core runs without Spark (only spark_batch imports it, when a sink is called).
    code = (
        "import sys, connectors, connectors.sdk, connectors.testing; "
        "print(any(m.startswith('pyspark') for m in sys.modules))"
    )
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False"


def test_version_matches_the_project_metadata() -> None:
    # (no tomllib: the project supports Python 3.10)
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert match is not None
    assert connectors.__version__ == match.group(1)


def test_package_modules_are_documented() -> None:
    for module in (connectors, connectors.core, connectors.sdk, connectors.testing):
        assert module.__doc__ and module.__doc__.strip()


@pytest.mark.parametrize(("name", "modules", "extra"), [
    ("PostgresSink", ("psycopg", "pgpq"), "postgres"),
    ("KafkaSink", ("confluent_kafka",), "kafka"),
    ("MariaDBSink", ("pymysql",), "mariadb"),
    ("DeltaSink", ("deltalake",), "delta"),
])
def test_target_sinks_load_lazily_and_a_missing_extra_names_it(
    name: str, modules: tuple[str, ...], extra: str
) -> None:
    """``import connectors`` imports no client library; naming a sink without its extra
    raises an ImportError that says ``pip install 'spark-exactly-once[<extra>]'``."""
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def fake(name, *a, **k):\n"
        f"    if name.split('.')[0] in {modules!r}:\n"
        "        raise ImportError('no ' + name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = fake\n"
        "import connectors\n"
        "assert not {'psycopg', 'confluent_kafka', 'delta', 'deltalake', 'pymysql', "
        "'pyspark'} & set(sys.modules)\n"
        # importlib.import_module does not call __import__: a None entry blocks it too
        f"sys.modules.update(dict.fromkeys({modules!r}))\n"
        "try:\n"
        f"    connectors.{name}\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "DependencyError" in out and f"spark-exactly-once[{extra}]" in out
