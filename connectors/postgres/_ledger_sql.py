"""The PostgreSQL ledger's schema and its larger statements (no I/O here).

- :func:`ledger_ddl`: the CREATE statements of the four ledger tables, by table suffix;
- :data:`ENTRY_COLUMNS` and :func:`entry_of`: a decision's row and its
  :class:`~connectors.core.ledgers.ledger.LedgerEntry`;
- :func:`decide_statement` and :func:`prune_statement`: the single statements that record a
  decision (epoch check, abort check, first insert wins) and prune old batches.

:mod:`connectors.postgres._ledger` runs them (see its docstring for the tables' roles).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.states import BatchState
from connectors.postgres._config import TableName

__all__ = ["ENTRY_COLUMNS", "LEDGER_NAME_RESERVE", "decide_statement", "entry_of", "ledger_ddl",
           "lineage_ddl", "prune_statement"]

#: The longest name the ledger derives from its table's (an index), and the bytes that
#: leaves for ``ledger_table``'s name: PostgreSQL would truncate a longer one.
_RECEIPTS_INDEX = "_receipts_batch"
LEDGER_NAME_RESERVE = len(_RECEIPTS_INDEX)


def ledger_ddl(ledger: TableName) -> dict[str, list[sql.Composed]]:
    """CREATE statements of the ledger tables (idempotent), by table suffix."""
    return {
        "": [sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, batch_id bigint NOT NULL, "
            "run_id text NOT NULL, state text NOT NULL CHECK (state IN ('DECIDED','COMMITTED')),"
            " commits jsonb NOT NULL, fp_rows bigint, fp_digest text, query_id text, "
            "decided_at timestamptz NOT NULL DEFAULT now(), committed_at timestamptz, "
            "PRIMARY KEY (sink_id, batch_id))"
        ).format(ledger.sql())],
        "_aborts": [sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, batch_id bigint NOT NULL, "
            "run_id text NOT NULL, aborted_at timestamptz NOT NULL DEFAULT now(), "
            "PRIMARY KEY (sink_id, batch_id, run_id))"
        ).format(ledger.sql("_aborts"))],
        "_bindings": [sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (sink_id text PRIMARY KEY, query_id text, "
            "generation integer NOT NULL DEFAULT 0, epoch bigint NOT NULL DEFAULT 0, "
            "updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(ledger.sql("_bindings"))],
        "_receipts": [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (xid text PRIMARY KEY, sink_id text NOT NULL, "
                "batch_id bigint NOT NULL, rows bigint NOT NULL, digest text NOT NULL, "
                "committed_at timestamptz NOT NULL DEFAULT now())"
            ).format(ledger.sql("_receipts")),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (sink_id, batch_id)").format(
                sql.Identifier(ledger.name + _RECEIPTS_INDEX), ledger.sql("_receipts")),
        ],
    }


def lineage_ddl(ledger: TableName) -> sql.Composed:
    """``<ledger>_lineage``: which query took the sink over from which savepoint (made on
    the first ``resume_from`` only, not with the other ledger tables)."""
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, query_id text NOT NULL, "
        "link jsonb NOT NULL, recorded_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (sink_id, query_id))"
    ).format(ledger.sql("_lineage"))


#: The columns of a decision, in the order :func:`entry_of` reads them.
ENTRY_COLUMNS = sql.SQL(
    "sink_id, batch_id, run_id, state, commits, fp_rows, fp_digest, query_id, "
    "extract(epoch from decided_at)"
)


def entry_of(row: Sequence[Any]) -> LedgerEntry:
    """The ledger entry of one row selected with :data:`ENTRY_COLUMNS`."""
    sink_id, batch_id, run_id, state, commits, fp_rows, fp_digest, query_id, decided = row
    fp = Fingerprint(int(fp_rows), int(fp_digest, 16)) if fp_rows is not None else None
    return LedgerEntry(
        sink_id=sink_id,
        batch_id=int(batch_id),
        run_id=run_id,
        state=BatchState(state),
        commits=tuple(TaskCommit.from_json(c) for c in commits),
        fingerprint=fp,
        query_id=query_id,
        decided_at=float(decided),
    )


def decide_statement(table: TableName) -> sql.Composed:
    """Epoch check, abort check and the first-insert-wins insert of a decision, in one
    statement; it answers ``(epoch, aborted, inserted)``.

    Parameters: ``s`` sink, ``b`` batch, ``r`` run, ``st`` state, ``c`` commits (jsonb),
    ``fr``/``fd`` fingerprint rows and digest, ``q`` query id, ``e`` the driver's epoch
    (``NULL``: no epoch check), ``done`` (committed already).
    """
    return sql.SQL(
        "WITH ep AS (SELECT epoch FROM {bindings} WHERE sink_id = %(s)s), "
        "ab AS (SELECT 1 FROM {aborts} WHERE sink_id = %(s)s AND batch_id = %(b)s "
        "AND run_id = %(r)s), "
        "ins AS (INSERT INTO {ledger} (sink_id, batch_id, run_id, state, commits, fp_rows, "
        "fp_digest, query_id, committed_at) SELECT %(s)s, %(b)s, %(r)s, %(st)s, %(c)s, "
        "%(fr)s, %(fd)s, %(q)s, CASE WHEN %(done)s THEN now() END "
        "WHERE (%(e)s::bigint IS NULL OR (SELECT epoch FROM ep) = %(e)s::bigint) "
        "AND NOT EXISTS (SELECT 1 FROM ab) "
        "ON CONFLICT (sink_id, batch_id) DO NOTHING RETURNING 1) "
        "SELECT (SELECT epoch FROM ep), EXISTS (SELECT 1 FROM ab), "
        "EXISTS (SELECT 1 FROM ins)"
    ).format(bindings=table.sql("_bindings"), aborts=table.sql("_aborts"), ledger=table.sql())


def prune_statement(table: TableName) -> sql.Composed:
    """Delete a sink's committed decisions, aborts and receipts up to the batch that
    leaves ``k`` newer ones (parameters ``s`` sink, ``k`` batches to keep)."""
    return sql.SQL(
        "WITH cutoff AS (SELECT batch_id FROM {l} WHERE sink_id = %(s)s "
        "ORDER BY batch_id DESC OFFSET %(k)s LIMIT 1), "
        "d1 AS (DELETE FROM {l} WHERE sink_id = %(s)s AND state = 'COMMITTED' "
        "AND batch_id <= (SELECT batch_id FROM cutoff)), "
        "d2 AS (DELETE FROM {a} WHERE sink_id = %(s)s "
        "AND batch_id <= (SELECT batch_id FROM cutoff)) "
        "DELETE FROM {r} WHERE sink_id = %(s)s "
        "AND batch_id <= (SELECT batch_id FROM cutoff)"
    ).format(l=table.sql(), a=table.sql("_aborts"), r=table.sql("_receipts"))
