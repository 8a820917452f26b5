"""The chaos soak's streaming jobs: one per sink, each a driver process of the examples'
jobs on the standalone cluster, fed new input while it runs, restarted whenever it ends,
and checked row by row at the end (:mod:`benchmarks.chaos`).

- ``postgres``: JSON files -> ``examples.stream_to_postgres`` (PostgresSink);
- ``kafka``: a Kafka topic -> ``examples.stream_to_kafka`` (KafkaSink);
- ``delta``: JSON files -> ``examples.stream_to_delta`` (DeltaSink).

Every job reads with ``Trigger.AvailableNow``: it ends by itself once it has written what
was there, and the campaign starts it again on the same checkpoint (a "restart" in the
table, beside the failures' restarts).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.support._kafka import KafkaTarget, ledger_batches
from integration.support._pg import PgTarget

__all__ = ["SinkJob", "Verdict", "batches_committed", "delta_batches_committed", "make_jobs"]

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Verdict:
    """One sink's end state, row by row."""

    expected: int
    seen: int
    duplicates: int
    missing: int
    lingering: int

    @property
    def exact(self) -> bool:
        return self.seen == self.expected and not (self.duplicates or self.missing
                                                   or self.lingering)


def _verdict(expected: int, ids: list[int], lingering: int) -> Verdict:
    counts = collections.Counter(ids)
    return Verdict(expected, len(ids), sum(c - 1 for c in counts.values() if c > 1),
                   sum(1 for i in range(expected) if i not in counts), lingering)


def write_json_file(directory: Path, index: int, start: int, rows: int) -> None:
    """Rows ``start..start+rows-1`` as one JSON file (the examples' input columns)."""
    lines = [json.dumps({"id": n, "name": f"name-{n}", "amount": n * 0.25,
                         "ts": f"2026-01-01T00:{(n // 60) % 60:02d}:{n % 60:02d}Z"})
             for n in range(start, start + rows)]
    tmp = directory / f".part-{index:06d}.json.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(directory / f"part-{index:06d}.json")


@dataclass
class SinkJob:
    """One sink's job: its driver process, its input so far, its counters."""

    name: str
    module: str
    args: list[str]
    root: Path
    conf: list[str]
    rows_per_feed: int
    fed: int = 0  # rows fed so far: ids 0..fed-1
    feeds: int = 0
    proc: subprocess.Popen[bytes] | None = None
    exits: collections.Counter[str] = field(default_factory=collections.Counter)
    target: Any = None

    # ---- input ----
    def feed(self) -> None:
        if self.name == "kafka":
            self.target.produce_input(self.target.topic + "-in", self.rows_per_feed,
                                      start=self.fed)
        else:
            write_json_file(self.root / "in", self.feeds, self.fed, self.rows_per_feed)
        self.fed += self.rows_per_feed
        self.feeds += 1

    # ---- the driver process ----
    def start(self, env: dict[str, str]) -> None:
        log = (self.root / "driver.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args, *self.conf], cwd=REPO, env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def poll(self) -> int | None:
        """The exit code if the driver ended since the last poll (counted), else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        self.exits["ok" if code == 0 else "killed" if code == -signal.SIGKILL else "failed"] += 1
        self.proc = None
        return code

    def kill(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return True

    # ---- what the target holds ----
    def committed(self) -> int | None:
        """Batches committed so far (:func:`batches_committed` of the sink's ledger, or
        :func:`delta_batches_committed` of the table's log); None while it cannot tell."""
        try:
            if self.name == "postgres":
                return batches_committed(self.target.ledger_states())
            if self.name == "kafka":
                return batches_committed(
                    ledger_batches(self.target.bootstrap, self.target.ledger_topic))
            return delta_batches_committed(self.root / "table" / "_delta_log")
        except Exception:  # the target is down, or nothing written yet
            return None

    def verdict(self) -> Verdict:
        if self.name == "postgres":
            return _verdict(self.fed, self.target.ids(), len(self.target.prepared()))
        if self.name == "kafka":
            open_txns = 0
            try:
                self.target.assert_no_open_transactions()
            except AssertionError:
                open_txns = 1
            return _verdict(self.fed, self.target.ids(), open_txns)
        from deltalake import DeltaTable

        ids = DeltaTable(str(self.root / "table")).to_pyarrow_table(columns=["id"])
        return _verdict(self.fed, [int(i) for i in ids.column("id").to_pylist()], 0)

    def cleanup(self) -> None:
        if self.name in ("postgres", "kafka"):
            self.target.cleanup()


def batches_committed(states: Mapping[int, str]) -> int:
    """The batches a sink's ledger says are committed: its last COMMITTED batch id + 1.

    Not a count of its COMMITTED entries: a ledger keeps only its last ``keep_batches``
    decisions (100 by default), so a count stops at 100 while the query goes on (the first
    chaos-300 picture showed exactly that). A streaming query's batch ids run 0, 1, 2, ...
    and a batch is committed once, so the last id + 1 is the count."""
    done = [b for b, s in states.items() if s == "COMMITTED"]
    return max(done) + 1 if done else 0


def delta_batches_committed(log_dir: Path) -> int:
    """The batches a DeltaSink committed to a table it created with its first batch: the
    table's commits, i.e. its log's newest version + 1 (the JSON commit files, named by
    version; checkpoints and ``_last_checkpoint`` are not commits)."""
    versions = [int(p.stem) for p in log_dir.glob("*.json") if p.stem.isdigit()]
    return max(versions) + 1 if versions else 0


def make_jobs(root: Path, sinks: list[str], *, conninfo: str, bootstrap: str,
              rows_per_feed: int, conf: list[str]) -> list[SinkJob]:
    """The jobs of ``sinks`` under ``root`` (their targets created, nothing fed yet)."""
    jobs = []
    for name in sinks:
        home = root / name
        (home / "in").mkdir(parents=True, exist_ok=True)
        common = ["--checkpoint", str(home / "checkpoint"), "--sink-id", f"chaos-{name}"]
        if name == "postgres":
            target: Any = PgTarget(conninfo, prefix="chaos")
            target.create_table()
            args = ["--source", "files", "--input", str(home / "in"), "--table", target.table,
                    "--ledger-table", target.ledger, *common[:2], "--sink-id", target.sink_id]
        elif name == "kafka":
            target = KafkaTarget(bootstrap, "chaos")
            target.create()
            target.create(f"{target.topic}-in", partitions=2)
            args = ["--source", "kafka", "--input-topic", f"{target.topic}-in",
                    "--max-offsets-per-trigger", str(rows_per_feed), "--topic", target.topic,
                    "--bootstrap", bootstrap, "--slots", "2", *common[:2],
                    "--sink-id", target.sink_id]
        elif name == "delta":
            target = None
            args = ["--source", "files", "--input", str(home / "in"), "--path",
                    str(home / "table"), *common]
        else:
            raise SystemExit(f"unknown sink {name!r}: postgres, kafka, delta")
        jobs.append(SinkJob(name, f"examples.stream_to_{name}", args, home, conf,
                            rows_per_feed, target=target))
    return jobs
