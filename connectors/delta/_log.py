"""Reading what a Delta table's transaction log says about the sink's app ids.

Two readers of the same facts (the table's ``txn`` actions: last committed version per app
id, and the table's configuration):

- :func:`jvm_log_state`: Delta's own ``DeltaLog.forTableWithSnapshot(...)`` snapshot over
  the py4j gateway. Authoritative (it is what Delta consults when it skips a write), works
  for every file system Spark can reach; one snapshot load per call (~1-3 s on a small
  machine), so the sink calls it once per driver run, not per batch.
- :class:`LocalDeltaLog`: pure Python over a local ``_delta_log`` directory (JSON commits
  and classic or multi-part Parquet checkpoints). It applies
  ``delta.setTransactionRetentionDuration`` the way Delta does (ids whose ``lastUpdated``
  is older than now minus the retention are gone). V2 checkpoints
  (``<v>.checkpoint.<uuid>.json``) are refused with an error that says so.

Without a JVM gateway (Spark Connect) the sink, and the operator CLI always, read the log
through delta-rs instead (:class:`~connectors.delta._rs_log.DeltaRsLog`), on any store:
it covers everything :class:`LocalDeltaLog` checks (the retention, classic and multi-part
checkpoints) and V2 checkpoints too.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.core.errors import ConfigurationError

__all__ = [
    "RETENTION_KEY",
    "LocalDeltaLog",
    "LogState",
    "jvm_log_state",
    "parse_interval_ms",
]

#: The table property after which Delta forgets a transaction id.
RETENTION_KEY = "delta.setTransactionRetentionDuration"

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CLASSIC_CP = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTI_CP = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_V2_CP = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")
_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+)\s*([a-z]+)\s*$", re.IGNORECASE)
_UNIT_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
}


@dataclass(frozen=True)
class LogState:
    """What the log says: does the table exist, txn versions, configuration."""

    exists: bool
    versions: dict[str, int] = field(default_factory=dict)
    configuration: dict[str, str] = field(default_factory=dict)
    table_version: int = -1

    def version(self, app_id: str) -> int | None:
        return self.versions.get(app_id)

    @property
    def retention(self) -> str | None:
        """``delta.setTransactionRetentionDuration`` if the table sets it."""
        return self.configuration.get(RETENTION_KEY)


def parse_interval_ms(text: str) -> int:
    """``"interval 7 days"`` -> milliseconds (the units Delta accepts for this property)."""
    match = _INTERVAL.match(text)
    if match:
        unit = match.group(2).lower().rstrip("s")
        if unit in _UNIT_MS:
            return int(match.group(1)) * _UNIT_MS[unit]
    raise ConfigurationError(
        f"cannot read the interval {text!r} of {RETENTION_KEY}: write it as "
        "'interval <n> <milliseconds|seconds|minutes|hours|days|weeks>'"
    )


def jvm_log_state(session: Any, location: str, app_ids: Iterable[str]) -> LogState:
    """The table's snapshot through Delta's JVM ``DeltaLog`` (fresh, not cached).

    Raises ``AttributeError`` when ``session`` has no JVM gateway (Spark Connect).
    """
    jvm = session._jvm
    if jvm is None:
        raise AttributeError("no JVM gateway")
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog
    snapshot = delta_log.forTableWithSnapshot(session._jsparkSession, location)._2()
    table_version = int(snapshot.version())
    if table_version < 0:
        return LogState(exists=False)
    txns = snapshot.transactions()
    versions = {}
    for app_id in app_ids:
        found = txns.get(app_id)
        if found.isDefined():
            versions[app_id] = int(found.get())
    configuration = {}
    retention = snapshot.metadata().configuration().get(RETENTION_KEY)
    if retention.isDefined():
        configuration[RETENTION_KEY] = str(retention.get())
    return LogState(True, versions, configuration, table_version)


class LocalDeltaLog:
    """The state of a Delta table's log on a local file system, in pure Python.

    Kept only where delta-rs falls short: where ``deltalake`` is not installed (it comes
    with the ``[delta]`` extra; the operator CLI then reads a local table with this), and
    as public API (tests read hand-made logs with it). Everything else reads the log with
    delta-rs (:class:`~connectors.delta._rs_log.DeltaRsLog`), which covers what this
    checks (``delta.setTransactionRetentionDuration``, classic and multi-part checkpoints)
    and reads V2 checkpoints, which this refuses.

    Example::

        state = LocalDeltaLog("/data/events").read()
        state.version("events-delta")        # last committed batch of that app id, or None
    """

    def __init__(self, root: str | Path, *, clock_ms: Any = None) -> None:
        self.root = Path(root)
        self.log_dir = self.root / "_delta_log"
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    def __repr__(self) -> str:
        return f"LocalDeltaLog({str(self.root)!r})"

    def read(self) -> LogState:
        """Replay the newest complete checkpoint and the JSON commits after it."""
        if not self.log_dir.is_dir():
            return LogState(exists=False)
        names = [p.name for p in self.log_dir.iterdir()]
        commits = sorted(int(m.group(1)) for n in names if (m := _COMMIT.match(n)))
        checkpoint, parts = self._checkpoint(names)
        txns: dict[str, tuple[int, int | None]] = {}
        configuration: dict[str, str] = {}
        start = 0
        if checkpoint is not None:
            self._read_checkpoint(parts, txns, configuration)
            start = checkpoint + 1
        later = [v for v in commits if v >= start]
        if checkpoint is None and (not later or later[0] != 0):
            return LogState(exists=False)
        expected = start
        for version in later:
            if version != expected:
                raise ConfigurationError(
                    f"the Delta log of {self.root} misses commit {expected} (found {version})"
                    ": read the table with Spark instead"
                )
            expected += 1
            self._read_commit(version, txns, configuration)
        table_version = expected - 1
        if table_version < 0:
            return LogState(exists=False)
        versions = {app: v for app, (v, _) in txns.items()}
        retention = configuration.get(RETENTION_KEY)
        if retention:
            oldest = self._clock_ms() - parse_interval_ms(retention)
            versions = {
                app: v for app, (v, updated) in txns.items() if updated is None or updated > oldest
            }
        return LogState(True, versions, configuration, table_version)

    def commit_infos(self, since: int = 0) -> list[tuple[int, dict[str, Any]]]:
        """``(version, commitInfo)`` of the JSON commits from ``since`` on (those kept)."""
        if not self.log_dir.is_dir():
            return []
        out = []
        for name in sorted(p.name for p in self.log_dir.iterdir()):
            match = _COMMIT.match(name)
            if not match or int(match.group(1)) < since:
                continue
            for action in self._actions(self.log_dir / name):
                if "commitInfo" in action:
                    out.append((int(match.group(1)), dict(action["commitInfo"])))
        return out

    # ---- internals ----
    def _checkpoint(self, names: list[str]) -> tuple[int | None, list[Path]]:
        if any(_V2_CP.match(n) for n in names):
            raise ConfigurationError(
                f"the Delta log of {self.root} has V2 checkpoints, which this pure-Python "
                "reader does not read: run the sink on classic Spark (a JVM gateway)"
            )
        candidates: dict[int, list[Path]] = {}
        for name in names:
            if m := _CLASSIC_CP.match(name):
                candidates[int(m.group(1))] = [self.log_dir / name]
        multi: dict[tuple[int, int], list[Path]] = {}
        for name in names:
            if m := _MULTI_CP.match(name):
                multi.setdefault((int(m.group(1)), int(m.group(3))), []).append(self.log_dir / name)
        for (version, total), paths in multi.items():
            if len(paths) == total and version not in candidates:
                candidates[version] = sorted(paths)
        if not candidates:
            return None, []
        best = max(candidates)
        return best, candidates[best]

    @staticmethod
    def _read_checkpoint(
        parts: list[Path], txns: dict[str, tuple[int, int | None]], configuration: dict[str, str]
    ) -> None:
        import pyarrow.parquet as pq

        for part in parts:
            schema_names = pq.read_schema(part).names
            columns = [c for c in ("txn", "metaData") if c in schema_names]
            table = pq.read_table(part, columns=columns)
            for row in table.to_pylist():
                txn = row.get("txn")
                if txn and txn.get("appId") is not None:
                    txns[str(txn["appId"])] = (int(txn["version"]), txn.get("lastUpdated"))
                meta = row.get("metaData")
                if meta and meta.get("configuration") is not None:
                    configuration.clear()
                    configuration.update(_as_dict(meta["configuration"]))

    def _read_commit(
        self, version: int, txns: dict[str, tuple[int, int | None]], configuration: dict[str, str]
    ) -> None:
        for action in self._actions(self.log_dir / f"{version:020d}.json"):
            if "txn" in action:
                txn = action["txn"]
                txns[str(txn["appId"])] = (int(txn["version"]), txn.get("lastUpdated"))
            elif "metaData" in action:
                configuration.clear()
                configuration.update(_as_dict(action["metaData"].get("configuration") or {}))

    @staticmethod
    def _actions(path: Path) -> list[dict[str, Any]]:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]


def _as_dict(value: Any) -> dict[str, str]:
    """A configuration map as JSON gives it (dict) or Arrow gives it (list of pairs)."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return {str(k): str(v) for k, v in value}
