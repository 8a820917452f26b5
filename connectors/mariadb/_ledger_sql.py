"""The MariaDB ledger's tables and the reading of its rows (no I/O here).

Five InnoDB tables in the ledger's database (``<ledger>`` defaults to ``eos_ledger`` in
the address's database), binary-collated so that ids compare byte by byte:

- ``<ledger>``: one decision per (sink, batch), the commit point;
- ``<ledger>_aborts``: "run R may never decide batch B" (written before a roll-back);
- ``<ledger>_bindings``: sink -> query id, generation, and the driver **epoch**; its row is
  also the sink's lock (``SELECT ... FOR UPDATE``);
- ``<ledger>_receipts``: one row per committed branch, inserted *inside* the branch by the
  task: a receipt that is visible proves the commit;
- ``<ledger>_lineage``: which query took the sink over from which savepoint (made on the
  first ``resume_from`` only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.states import BatchState
from connectors.mariadb._config import TableName

__all__ = ["ENTRY_COLUMNS", "LEDGER_NAME_RESERVE", "LEDGER_SUFFIXES", "entry_of", "ledger_ddl",
           "lineage_ddl"]

#: The longest suffix the ledger appends to its table's name.
LEDGER_NAME_RESERVE = len("_receipts")
#: The tables made with the ledger (``_lineage`` is made on its first use).
LEDGER_SUFFIXES = ("", "_aborts", "_bindings", "_receipts")
_TABLE = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"


def ledger_ddl(ledger: TableName) -> dict[str, str]:
    """CREATE statements of the ledger tables (idempotent), by table suffix."""
    return {
        "": f"CREATE TABLE IF NOT EXISTS {ledger.sql()} (sink_id VARCHAR(64) NOT NULL, "
            "batch_id BIGINT NOT NULL, run_id VARCHAR(64) NOT NULL, state VARCHAR(16) NOT NULL "
            "CHECK (state IN ('DECIDED','COMMITTED')), commits LONGTEXT NOT NULL "
            "CHECK (JSON_VALID(commits)), fp_rows BIGINT NULL, fp_digest VARCHAR(64) NULL, "
            "query_id VARCHAR(128) NULL, decided_at DATETIME(6) NOT NULL "
            "DEFAULT CURRENT_TIMESTAMP(6), committed_at DATETIME(6) NULL, "
            f"PRIMARY KEY (sink_id, batch_id)) {_TABLE}",
        "_aborts": f"CREATE TABLE IF NOT EXISTS {ledger.sql('_aborts')} (sink_id VARCHAR(64) "
                   "NOT NULL, batch_id BIGINT NOT NULL, run_id VARCHAR(64) NOT NULL, "
                   "aborted_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
                   f"PRIMARY KEY (sink_id, batch_id, run_id)) {_TABLE}",
        "_bindings": f"CREATE TABLE IF NOT EXISTS {ledger.sql('_bindings')} (sink_id "
                     "VARCHAR(64) NOT NULL PRIMARY KEY, query_id VARCHAR(128) NULL, "
                     "generation INT NOT NULL DEFAULT 0, epoch BIGINT NOT NULL DEFAULT 0, "
                     "updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) "
                     f"{_TABLE}",
        "_receipts": f"CREATE TABLE IF NOT EXISTS {ledger.sql('_receipts')} (xid VARCHAR(160) "
                     "NOT NULL PRIMARY KEY, sink_id VARCHAR(64) NOT NULL, batch_id BIGINT "
                     "NOT NULL, `rows` BIGINT NOT NULL, digest VARCHAR(64) NOT NULL, "
                     "committed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
                     f"KEY sink_batch (sink_id, batch_id)) {_TABLE}",
    }


def lineage_ddl(ledger: TableName) -> str:
    """``<ledger>_lineage`` (made on the first ``resume_from`` only)."""
    return (f"CREATE TABLE IF NOT EXISTS {ledger.sql('_lineage')} (sink_id VARCHAR(64) NOT "
            "NULL, query_id VARCHAR(128) NOT NULL, link LONGTEXT NOT NULL CHECK "
            "(JSON_VALID(link)), recorded_at DATETIME(6) NOT NULL DEFAULT "
            f"CURRENT_TIMESTAMP(6), PRIMARY KEY (sink_id, query_id)) {_TABLE}")


#: The columns of a decision, in the order :func:`entry_of` reads them.
ENTRY_COLUMNS = ("sink_id, batch_id, run_id, state, commits, fp_rows, fp_digest, query_id, "
                 "UNIX_TIMESTAMP(decided_at)")


def entry_of(row: Sequence[Any]) -> LedgerEntry:
    """The ledger entry of one row selected with :data:`ENTRY_COLUMNS`."""
    sink_id, batch_id, run_id, state, commits, fp_rows, fp_digest, query_id, decided = row
    fp = Fingerprint(int(fp_rows), int(fp_digest, 16)) if fp_rows is not None else None
    return LedgerEntry(
        sink_id=sink_id,
        batch_id=int(batch_id),
        run_id=run_id,
        state=BatchState(state),
        commits=tuple(TaskCommit.from_json(c) for c in json.loads(commits)),
        fingerprint=fp,
        query_id=query_id,
        decided_at=float(decided),
    )
