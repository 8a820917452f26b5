"""A real Structured Streaming job into the example file-system sink.

Two replayable sources:

- ``files``: JSON files in ``--input`` (one file per micro-batch, ``Trigger.AvailableNow``:
  the query ends by itself when every file is processed);
- ``rate``: Spark's ``rate-micro-batch`` source, ``--rows-per-batch`` rows per batch with
  values ``[b*R, (b+1)*R)`` in batch ``b``; batches from ``--batches`` on are not written
  (the program then stops the query), so the expected output is values ``0 .. N*R-1``.

Run it, kill it (``CONNECTORS_TEST_MODE=1`` with ``CONNECTORS_CRASH_AT`` arms a crash
point), run it again with the same ``--checkpoint``: the output in ``--out`` is exact.
``python -m examples.stream_to_files -h``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

# The job loop (common flags, logging, session, sources, query); this file adds its sink.
from examples._runner import (
    INPUT_SCHEMA,
    add_run_flags,
    build_session,
    job_parser,
    run_timed,
    stream,
)
from examples.fs_sink import FileSystemSink

__all__ = ["INPUT_SCHEMA", "build_session", "main", "make_input_files", "run"]

logger = logging.getLogger("examples")  # not __name__ ("__main__" under python -m)


def make_input_files(directory: str | os.PathLike[str], files: int, rows_per_file: int) -> int:
    """Write ``files`` JSON files of ``rows_per_file`` rows with unique ids; return rows."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in range(files):
        lines = []
        for _ in range(rows_per_file):
            lines.append(json.dumps({
                "id": n, "name": f"name-{n}-é", "amount": n * 0.25,
                "ts": f"2026-01-01T00:{(n // 60) % 60:02d}:{n % 60:02d}Z",
            }))
            n += 1
        tmp = path / f".part-{f:05d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(path / f"part-{f:05d}.json")
    return n


def run(args: argparse.Namespace) -> int:
    spark = build_session(args.master, args.conf, connect=args.connect)
    sink = FileSystemSink(args.out, sink_id=args.sink_id, query_name=args.query_name or None)
    return stream(spark, args, sink)  # the rate source's (timestamp, value) rows as they are


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink-id", default="files")
    add_run_flags(parser)
    return run_timed(run, parser.parse_args(argv), logger)


if __name__ == "__main__":
    raise SystemExit(main())
