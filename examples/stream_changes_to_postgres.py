"""A change stream into PostgreSQL, exactly once, with ``PostgresSink(mode="changes")``.

The source: JSON files in ``--input``, one file per micro-batch (``Trigger.AvailableNow``:
the query ends by itself when every file is processed), columns
``id LONG, op STRING, seq LONG, name STRING, amount DOUBLE``: each row one change of key
``id`` (``op``: Debezium's ``c``/``r``/``u``/``d`` or ``insert``/``update``/``delete``, in
any case) carrying the full row image; ``seq`` orders the changes of a key.
:func:`make_change_files` writes a deterministic stream of them (several changes per key
within and across files, deletes of present keys, deletes then re-inserts, deletes of keys
never seen).

The target table needs ``id`` as its primary key (or a unique index) and the columns
``name``, ``amount`` (``seq`` and ``op`` are written only if it has them);
``--create-table`` creates ``id bigint PRIMARY KEY, seq bigint, name text, amount double
precision``. Run it, kill it (``CONNECTORS_TEST_MODE=1`` with ``CONNECTORS_CRASH_AT`` arms a
crash point), run it again with the same ``--checkpoint``: the table is what applying every
change one by one in ``seq`` order gives. ``python -m examples.stream_changes_to_postgres -h``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

from connectors.postgres import PostgresSink
from examples._runner import add_metrics_flag, build_session, run_available_now, run_timed

__all__ = ["CHANGE_SCHEMA", "Change", "main", "make_change_files", "run"]

ENV_CONNINFO = "EOS_POSTGRES_CONNINFO"
CHANGE_SCHEMA = "id LONG, op STRING, seq LONG, name STRING, amount DOUBLE"
#: One change: (id, op, seq, name, amount), as in the files.
Change = tuple[int, str, int, str, float]
logger = logging.getLogger("examples.stream_changes_to_postgres")  # not __name__ under -m

#: Operation spellings the stream uses (weights): every form the sink accepts shows up.
_OPS = [("c", 20), ("u", 30), ("U", 5), ("update", 5), ("r", 5), ("insert", 5), ("d", 20),
        ("D", 3), ("delete", 7)]
#: Files' modification times: one second apart from this base (Spark's file source takes
#: files in modification-time order, so file f is always the f-th micro-batch).
_MTIME_BASE = 1_780_000_000


def make_change_files(directory: str | os.PathLike[str], first: int, files: int,
                      rows_per_file: int, keys: int = 120, seed: int = 38) -> list[Change]:
    """Write files ``first .. first+files-1`` of the stream (``part-NNNNN.json``); return
    their changes. File ``f`` is the same whatever ``first`` is; ``seq`` grows from file to
    file, and two neighbouring rows of a file share it (a tie, broken by the other
    columns), at times for the same key. About one delete in five is of a key outside
    ``range(keys)``, never inserted."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    spellings, weights = zip(*_OPS, strict=True)
    changes: list[Change] = []
    for f in range(first, first + files):
        rng = random.Random(seed * 100_003 + f)
        lines, key = [], 0
        for i in range(rows_per_file):
            n = f * rows_per_file + i
            op = rng.choices(spellings, weights)[0]
            if not (i % 2 and rng.random() < 0.3):  # else the same key as the row before
                key = rng.randrange(keys)
                if op.lower() in ("d", "delete") and rng.random() < 0.2:
                    key = keys + rng.randrange(keys)
            change: Change = (key, op, n // 2, f"n{n:07d}", n * 0.5)
            changes.append(change)
            lines.append(json.dumps(dict(zip(("id", "op", "seq", "name", "amount"), change,
                                             strict=True))))
        tmp = path / f".part-{f:05d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.utime(tmp, (_MTIME_BASE + f, _MTIME_BASE + f))
        tmp.rename(path / f"part-{f:05d}.json")
    return changes


def make_sink(args: argparse.Namespace) -> PostgresSink:
    return PostgresSink(
        args.conninfo, args.table, sink_id=args.sink_id, mode="changes", key_columns=["id"],
        op_column="op", sequence_column="seq", create_table=args.create_table,
        ledger_table=args.ledger_table, query_name=args.query_name or None,
    )


def run(args: argparse.Namespace) -> int:
    sink = make_sink(args)  # validates the options before Spark starts
    logger.info("applying changes to %s of %s as sink %s", args.table, sink.conninfo,
                args.sink_id)
    spark = build_session(args.master, ["spark.app.name=connectors-changes-to-postgres",
                                        *args.conf])
    try:
        df: Any = (spark.readStream.schema(CHANGE_SCHEMA).option("maxFilesPerTrigger", 1)
                   .json(args.input))
        return run_available_now(df, sink, args.checkpoint, args.query_name or None)
    finally:
        sink.close()
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="directory of JSON change files")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--conninfo", default=None,
                        help=f"libpq connection string (default ${ENV_CONNINFO})")
    parser.add_argument("--table", default="public.users")
    parser.add_argument("--sink-id", default="users-changes")
    parser.add_argument("--create-table", action="store_true")
    parser.add_argument("--ledger-table", default="public.eos_ledger")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf k=v")
    parser.add_argument("--query-name", default="connectors-changes")
    add_metrics_flag(parser)
    args = parser.parse_args(argv)
    args.conninfo = args.conninfo or os.environ.get(ENV_CONNINFO)
    if not args.conninfo:
        parser.error(f"pass --conninfo or set ${ENV_CONNINFO}")
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
