"""Helpers for the DeltaSink integration tests: what the tables, their logs and the sinks'
ledgers hold, read independently of the sink (the log with the pure-Python reader, the
rows with Spark).

Run as a program (``python -m integration.support._delta --delta-path PATH <stream_to_delta
args>``) it is ``examples.stream_to_delta`` with every ``DeltaSink`` on one commit path:

- ``tag``: the default (no Delta txn id);
- ``txn_seed``: ``delta_txn_id=True`` with the accelerator left on auto (it runs where the
  Delta classes are the verified ones and ``CONNECTORS_ACCELERATORS`` is not ``off``);
- ``txn_mismatch``: ``delta_txn_id=True`` with the accelerator's allow-list made wrong for
  this process, so the real digest check refuses the classes and the sink falls back to
  Delta's own lookup (with its WARNING).
"""

from __future__ import annotations

import collections
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.delta import LocalDeltaLog, parse_user_metadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

UTC = dt.timezone.utc


def tagged_commits(path: Path, app_id: str) -> dict[int, list[int]]:
    """batch id -> table versions of the commits the sink tagged with ``app_id``."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for version, info in LocalDeltaLog(path).commit_infos():
        tag = parse_user_metadata(info.get("userMetadata"))
        if tag is not None and tag.app_id == app_id:
            out[tag.batch_id].append(version)
    return dict(out)


def operations(path: Path) -> list[str]:
    """Every commit's operation, in version order."""
    return [str(info.get("operation")) for _, info in LocalDeltaLog(path).commit_infos()]


def txn_version(path: Path, app_id: str) -> int | None:
    """The version Delta records for ``app_id`` (pure-Python read of the log)."""
    return LocalDeltaLog(path).read().version(app_id)


def ledger_batches(path: Path, sink_id: str) -> dict[int, bool]:
    """Batches in the sink's ledger (next to the table) -> recorded COMMITTED."""
    decisions = path / "_connectors" / sink_id / "decisions"
    out = {}
    for p in sorted(decisions.glob("*.json")):
        entry = json.loads(p.read_text())
        out[int(p.stem)] = entry["state"] == "COMMITTED" or p.with_suffix(".committed").exists()
    return out


def intent_batches(path: Path, sink_id: str) -> list[int]:
    """Batches with an intent record in the sink's ledger (attempted, not yet pruned)."""
    intents = path / "_connectors" / sink_id / "intents"
    return sorted(int(p.stem) for p in intents.glob("*.json"))


def ledger_fingerprint(path: Path, sink_id: str, batch_id: int) -> dict[str, Any] | None:
    p = path / "_connectors" / sink_id / "decisions" / f"{batch_id:020d}.json"
    fp = json.loads(p.read_text()).get("fp")
    return dict(fp) if fp else None


def table_rows(spark: SparkSession, path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    """Every row of the table (the given SQL expressions, e.g. ``unix_micros(ts)``), sorted."""
    df = spark.read.format("delta").load(str(path)).selectExpr(*columns)
    return sorted(tuple(r) for r in df.collect())


def input_rows(total: int) -> list[tuple[Any, ...]]:
    """``(id, name, amount, unix_micros(ts))`` exactly as ``make_input_files`` wrote them."""
    rows = []
    for n in range(total):
        ts = dt.datetime(2026, 1, 1, 0, (n // 60) % 60, n % 60, tzinfo=UTC)
        rows.append((n, f"name-{n}-é", n * 0.25, int(ts.timestamp()) * 1_000_000))
    return rows


def rate_rows(total: int) -> list[tuple[Any, ...]]:
    """``(id, name, amount)`` as ``stream_to_delta``'s rate source makes them."""
    return [(n, f"rate-{n}", n * 0.25) for n in range(total)]


def latest_per_key(
    rows: list[tuple[Any, ...]], key_mod: int, batch_of: Callable[[int], int]
) -> list[tuple[Any, ...]]:
    """What MERGE on ``key = id % key_mod`` leaves: per key, the row of the latest batch
    holding the key, and within that batch the greatest row (the sink's dedup rule; the
    id comes first in every row), with the key appended."""
    best: dict[int, tuple[Any, ...]] = {}
    for row in rows:
        key = row[0] % key_mod
        if key not in best or (batch_of(row[0]), row) > (batch_of(best[key][0]), best[key]):
            best[key] = row
    return sorted((*r, r[0] % key_mod) for r in best.values())


#: The commit paths the program can force (see the module docstring).
DELTA_PATHS = ("tag", "txn_seed", "txn_mismatch")


def main(argv: list[str] | None = None) -> int:
    import functools
    import sys

    import examples.stream_to_delta as job
    from connectors.delta import DeltaSink, _txn_seed

    args = list(sys.argv[1:] if argv is None else argv)
    path = "tag"
    if "--delta-path" in args:
        i = args.index("--delta-path")
        path = args[i + 1]
        del args[i:i + 2]
    if path not in DELTA_PATHS:
        raise SystemExit(f"--delta-path must be one of {DELTA_PATHS}, not {path!r}")
    if path == "txn_mismatch":
        # One digest of the allow-list no longer matches the class: the real check fails.
        name = next(iter(_txn_seed.VERIFIED_CLASSES))
        _txn_seed.VERIFIED_CLASSES[name] = "0" * 64
    if path != "tag":
        # make_sinks looks DeltaSink up in the example's module globals.
        setattr(job, "DeltaSink", functools.partial(DeltaSink, delta_txn_id=True))  # noqa: B010
    return job.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
