"""The Iceberg tests' helpers: the table read back with pyiceberg (never Spark), and
maintenance on it (another writer, compaction, snapshot expiry) through a Spark driver of
its own (``python -m integration.iceberg._support``: one JVM, the statements in order).

A Hadoop catalog's table is read by pyiceberg from its newest metadata file
(``StaticTable.from_metadata``), independent of the sink and of Spark; a table of another
catalog is loaded by pyiceberg's client of that catalog (``test_iceberg_catalogs``) and read
by the same :func:`rows_of` and :func:`tags_of`; :func:`ledger_keys` lists the sink's
ledger beside any table's location, a local directory or an object store.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from integration.support._driver import REPO

__all__ = ["change_rows", "intents", "ledger_batches", "ledger_keys", "maintain", "row_count",
           "rows_of", "snapshot_tags", "table_rows", "tags_of"]


def _table(warehouse: Path, name: str = "events") -> Any:
    from pyiceberg.table import StaticTable

    meta = warehouse.joinpath("db", name, "metadata")
    version = int((meta / "version-hint.text").read_text().strip())
    return StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))


def rows_of(table: Any) -> list[tuple[Any, ...]]:
    """``(id, name, amount, unix micros of ts)`` of every row of a pyiceberg table, sorted."""
    arrow = table.scan().to_arrow()
    cols = [arrow.column(n).to_pylist() for n in ("id", "name", "amount")]
    ts = arrow.column("ts").cast("int64").to_pylist()
    return sorted(zip(*cols, ts, strict=True))


def tags_of(table: Any, app_id: str) -> dict[int, int]:
    """Batch id -> how many retained snapshots of a pyiceberg table carry the sink's tag."""
    out: dict[int, int] = {}
    for snap in table.metadata.snapshots:
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get("connectors.app") == app_id:
            batch = int(props["connectors.batch"])
            out[batch] = out.get(batch, 0) + 1
    return out


def ledger_keys(location: str, sink_id: str, folder: str,
                options: dict[str, str] | None = None) -> list[int]:
    """The batch ids of the ``folder`` (``intents``, ``decisions``) of the sink's ledger
    beside the table at ``location`` (as the catalog gives it: a path, ``file:``, or
    ``s3a://`` read with obstore and ``options``)."""
    root = f"{location.rstrip('/')}/_connectors/{sink_id}"
    if "://" in root and not root.startswith("file:"):
        from connectors.lake.store import ObstoreStore

        keys = ObstoreStore(root, options).keys(f"{folder}/")
        names = [k.rsplit("/", 1)[-1] for k in keys]
    else:
        path = Path(root.removeprefix("file://").removeprefix("file:")) / folder
        names = [p.name for p in path.glob("*")] if path.exists() else []
    return sorted({int(n.split(".")[0]) for n in names if n.endswith(".json")})


def table_rows(warehouse: Path) -> list[tuple[Any, ...]]:
    """``(id, name, amount, unix micros of ts)`` of every row, sorted (pyiceberg)."""
    return rows_of(_table(warehouse))


def row_count(warehouse: Path) -> int:
    """How many rows the table holds, whatever its columns (pyiceberg)."""
    return int(_table(warehouse).scan().to_arrow().num_rows)


def change_rows(warehouse: Path, name: str = "changes") -> list[tuple[Any, ...]]:
    """``(id, seq, name, amount, bucket)`` of every row of ``db.<name>``, sorted (pyiceberg)."""
    arrow = _table(warehouse, name).scan().to_arrow()
    cols = [arrow.column(n).to_pylist() for n in ("id", "seq", "name", "amount", "bucket")]
    return sorted(zip(*cols, strict=True))


def snapshot_tags(warehouse: Path, app_id: str, name: str = "events") -> dict[int, int]:
    """Batch id -> how many retained snapshots of ``db.<name>`` carry the sink's tag for it
    (pyiceberg)."""
    if not warehouse.joinpath("db", name, "metadata", "version-hint.text").exists():
        return {}  # no table yet
    return tags_of(_table(warehouse, name), app_id)


def ledger_root(warehouse: Path, sink_id: str, name: str = "events") -> Path:
    return warehouse.joinpath("db", name, "_connectors", sink_id)


def ledger_batches(warehouse: Path, sink_id: str, name: str = "events") -> list[int]:
    root = ledger_root(warehouse, sink_id, name) / "decisions"
    return sorted(int(p.name.split(".")[0]) for p in root.glob("*.json")) if root.exists() \
        else []


def intents(warehouse: Path, sink_id: str, name: str = "events") -> list[int]:
    root = ledger_root(warehouse, sink_id, name) / "intents"
    return sorted(int(p.name.split(".")[0]) for p in root.glob("*.json")) if root.exists() \
        else []


def maintain(warehouse: Path, *statements: str) -> list[list[Any]]:
    """Run SQL statements against catalog ``lake`` on ``warehouse`` in a driver of its own;
    each statement's rows."""
    proc = subprocess.run([sys.executable, "-m", "integration.iceberg._support",
                           str(warehouse), *statements], cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS ")][-1]
    return list(json.loads(line[5:]))


def _main(argv: list[str]) -> int:
    from connectors.spark import get_session
    from examples.stream_to_iceberg import catalog_conf

    warehouse, *statements = argv
    spark = get_session("iceberg-maintenance", components=["iceberg"],
                        conf=catalog_conf(warehouse))
    out = [[list(r) for r in spark.sql(sql).collect()] for sql in statements]
    print("ROWS " + json.dumps(out, default=str))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
