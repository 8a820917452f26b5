"""A tiny streaming driver without Spark, for the kill harness's own tests.

It keeps a checkpoint the way Spark does (``offsets/<b>`` before a batch runs,
``commits/<b>`` after), skips the batches its commit log has, and writes ``--batches``
batches of ``--rows`` rows (values ``[b*R, (b+1)*R)``) into the example file-system sink
through the in-process engine (:class:`~connectors.testing.LocalBatch`): the sink's crash
points fire in this process, as they would in a Spark driver.
``python -m tests.testing._tiny_driver -h``.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import pyarrow as pa

from connectors.testing import LocalBatch
from examples.fs_sink import FileSystemSink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds each batch waits after its offsets are logged")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    offsets, commits = Path(args.checkpoint) / "offsets", Path(args.checkpoint) / "commits"
    offsets.mkdir(parents=True, exist_ok=True)
    commits.mkdir(parents=True, exist_ok=True)
    sink = FileSystemSink(args.out, sink_id="tiny")
    try:
        for b in range(args.batches):
            if (commits / str(b)).exists():
                continue
            (offsets / str(b)).touch()
            time.sleep(args.pause)
            values = list(range(b * args.rows, (b + 1) * args.rows))
            sink.write_batch(LocalBatch(pa.table({"value": values}), partitions=2), b,
                             query_id="tiny-query")
            (commits / str(b)).touch()
    finally:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
