"""Produce paths into one Kafka transaction, no Spark (issue 55's design measurement).

Run from the repository root, with Kafka up (``scripts/services start --only kafka``)::

    python -m benchmarks.kafka_produce_bench            # 500,000 records, 100 B and 1 KB, 5 rounds
    python -m benchmarks.kafka_produce_bench --smoke    # 5,000 records, 1 round, no verdict

Every contender enqueues the same Arrow batch (``key`` = the id as a string, ``value`` = the
id padded to the size, ``partition`` = Kafka's murmur2 of the key modulo the topic's
partitions, computed before timing) into a transaction of its own transactional producer
(created and ``init_transactions`` before timing), then commits; a run is
``begin_transaction`` .. ``commit_transaction`` (the flush included), checked by the topic's
``read_committed`` end offsets. Producer settings are the sink's slot defaults
(``linger.ms`` 20, ``batch.size`` 1 MB, a 1 GB / 500,000-record queue). Contenders:

``owned``        :class:`connectors.kafka._rdkafka.ArrowProducer`: a handle created through
                 librdkafka's public C API, ``rd_kafka_produce_batch`` from numpy-built
                 message arrays (the prototype)
``accelerator``  the sink's ctypes accelerator on a confluent-kafka ``Producer``'s handle
                 (private object layout; :mod:`connectors.kafka._native_produce`)
``public-batch`` the sink's public path, ``Producer.produce_batch`` with a dict per record
                 (:class:`connectors.kafka._produce.BatchProducer`)
``produce-loop`` ``Producer.produce(topic, value, key, partition=p)`` per record over
                 Python bytes built before timing
``c-loop``       the ceiling: ``rd_kafka_produce`` per record (``RD_KAFKA_MSG_F_COPY``) in a
                 C program (``benchmarks/rdkafka_loop.c``, compiled with ``gcc -O2`` at the
                 start against the same librdkafka the others load), its own process
                 driven round by round over a pipe; its CPU is that process's

Rounds are interleaved (round ``r`` starts with contender ``r``), after one untimed round.
Reported per contender: the median wall time and records/s, the per-round ratio of the
public path's time over the contender's (median, and a bootstrap interval over the rounds),
the same against the accelerator, the share of the C loop's speed it reaches (the C loop's
time over its own, median over the rounds), and the process CPU seconds per million records
(``time.process_time``: the Python thread and librdkafka's threads; the broker is another
process). The load is printed before and after: on a shared machine the ratios move less
than the times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from benchmarks._common import SMOKE_NOTE, format_table, load_service_env, median, ratio_interval
from benchmarks.kafka_bench import create_topic, end_offsets
from connectors.kafka._native_produce import attach
from connectors.kafka._placement import murmur2
from connectors.kafka._produce import BatchProducer
from connectors.kafka._rdkafka import ArrowProducer
from connectors.kafka._rdkafka_lib import find_librdkafka

CONTENDERS = ("owned", "accelerator", "public-batch", "produce-loop", "c-loop")
C_SOURCE = Path(__file__).with_name("rdkafka_loop.c")
BASELINE = "public-batch"
SETTINGS: dict[str, Any] = {"linger.ms": 20, "batch.size": 1_000_000,
                            "queue.buffering.max.messages": 500_000,
                            "queue.buffering.max.kbytes": 1_048_576, "log_level": 3}
Batch = tuple[pa.Array, pa.Array, pa.Array]


def make_batch(rows: int, size: int, partitions: int) -> Batch:
    ids = [str(i).encode() for i in range(rows)]
    keys = pa.array(ids, pa.binary())
    values = pa.array([i.ljust(size, b"x") for i in ids], pa.binary())
    place = (murmur2(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)
    return keys, values, pa.array(place.astype(np.int32))


def build_c_loop(workdir: Path) -> Path:
    """``benchmarks/rdkafka_loop.c`` compiled against the librdkafka the others load."""
    lib, cc = find_librdkafka(), shutil.which("gcc") or shutil.which("cc")
    if lib is None or cc is None:
        raise SystemExit(f"c-loop needs a C compiler and librdkafka (found {cc}, {lib}): "
                         "leave it out with --contenders")
    exe = workdir / "rdkafka_loop"
    subprocess.run([cc, "-O2", "-o", str(exe), str(C_SOURCE), lib,
                    f"-Wl,-rpath,{os.path.dirname(lib)}"], check=True)
    return exe


class CLoop:
    """The C loop's process: the records in a file, one transaction per ``run``."""

    def __init__(self, exe: Path, workdir: Path, config: dict[str, Any], topic: str,
                 batch: Batch) -> None:
        keys, values, parts = batch
        records = workdir / f"{topic}.records"
        with records.open("wb") as out:
            for k, v, p in zip(keys.to_pylist(), values.to_pylist(), parts.to_pylist(),
                               strict=True):
                out.write(struct.pack("=iii", p, len(k), len(v)) + k + v)
        self.proc = subprocess.Popen(
            [str(exe), str(records), topic, *(f"{k}={v}" for k, v in config.items())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._out, self._in = self.proc.stdout, self.proc.stdin
        if self._out.readline().strip() != "ready":
            raise SystemExit(f"c-loop did not start (exit {self.proc.wait()})")

    def run(self) -> tuple[float, float]:
        self._in.write("run\n")
        self._in.flush()
        line = self._out.readline().split()
        if len(line) != 2:
            raise SystemExit(f"c-loop failed (exit {self.proc.wait()})")
        return float(line[0]), float(line[1])

    def close(self) -> None:
        self._in.write("quit\n")
        self._in.flush()
        self.proc.wait(60)


class Contender:
    """One producer, kept across rounds: ``run`` is one transaction of the whole batch."""

    def __init__(self, name: str, bootstrap: str, topic: str, batch: Batch,
                 c_loop: Path | None = None) -> None:
        self.name, self.topic = name, topic
        config = {**SETTINGS, "bootstrap.servers": bootstrap,
                  "transactional.id": f"bench-{name}-{uuid.uuid4().hex[:8]}"}
        keys, values, parts = batch
        self.rows = len(values)
        self._run: Callable[[], None]
        self._c: CLoop | None = None
        if name == "c-loop":
            assert c_loop is not None
            self._c = CLoop(c_loop, c_loop.parent, config, topic, batch)
            self.closer: Callable[[], None] = self._c.close
            return
        if name == "owned":
            owned = ArrowProducer(config)
            owned.init_transactions()
            self.closer = owned.close

            def run_owned() -> None:
                owned.begin_transaction()
                owned.produce(topic, values, keys, parts)
                owned.commit_transaction(120)
            self._run = run_owned
            return
        producer = Producer(config)
        producer.init_transactions(60)
        self.closer = lambda: None
        fast: Any = None
        if name == "accelerator":
            fast = attach(producer, 60)
            if fast is None:
                raise SystemExit("the accelerator is not verified here (see its warning)")
        elif name == "public-batch":
            fast = BatchProducer(producer, 60, queue_limit=SETTINGS[
                "queue.buffering.max.messages"])
        if fast is not None:
            def run_fast() -> None:
                producer.begin_transaction()
                fast.produce(topic, values, keys, parts)
                producer.commit_transaction(120)
            self._run = run_fast
            return
        pk, pv, pp = keys.to_pylist(), values.to_pylist(), parts.to_pylist()

        def run_loop() -> None:
            producer.begin_transaction()
            produce, poll = producer.produce, producer.poll
            for i in range(len(pv)):
                while True:
                    try:
                        produce(topic, pv[i], pk[i], partition=pp[i])
                        break
                    except BufferError:
                        poll(0.05)
            producer.commit_transaction(120)
        self._run = run_loop

    def run(self) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one transaction."""
        if self._c is not None:
            return self._c.run()
        wall, cpu = time.perf_counter(), time.process_time()
        self._run()
        return time.perf_counter() - wall, time.process_time() - cpu


def check(bootstrap: str, c: Contender, before: int, wait_s: float = 15.0) -> None:
    """The topic's read_committed end offsets grew by the records (the commit markers
    are written after ``commit_transaction`` returns: the last stable offset may lag)."""
    deadline = time.monotonic() + wait_s
    while end_offsets(bootstrap, c.topic) - before < c.rows:
        assert time.monotonic() < deadline, f"{c.name}: records missing"
        time.sleep(0.1)


def bench_size(bootstrap: str, admin: AdminClient, size: int, args: argparse.Namespace,
               c_loop: Path | None) -> list[list[str]]:
    batch = make_batch(args.rows, size, args.topic_partitions)
    tag = uuid.uuid4().hex[:6]
    contenders = []
    for name in args.contenders:
        topic = f"bench-produce-{name}-{size}-{tag}"
        create_topic(admin, topic, args.topic_partitions)
        contenders.append(Contender(name, bootstrap, topic, batch, c_loop))
    wall: dict[str, list[float]] = {c.name: [] for c in contenders}
    cpu: dict[str, list[float]] = {c.name: [] for c in contenders}
    for r in range(-1 if not args.smoke else 0, args.rounds):
        k = max(r, 0) % len(contenders)
        for c in contenders[k:] + contenders[:k]:
            before = end_offsets(bootstrap, c.topic)
            w, u = c.run()
            check(bootstrap, c, before)
            if r >= 0:
                wall[c.name].append(w)
                cpu[c.name].append(u)
        print(f"  {size} B round {r + 1}: " + ", ".join(
            f"{n} {wall[n][-1]:.2f}s" for n in wall if r >= 0), flush=True)
    for c in contenders:
        c.closer()
    # Deleted at once: a full run writes ~12 GB at 1 KB, and retention (kafka_bench's
    # 256 MB a partition) would still keep 1 GB per topic and run on the broker's disk.
    for future in admin.delete_topics([c.topic for c in contenders],
                                      operation_timeout=60).values():
        future.result(60)
    rows = []
    base, accel, ceiling = wall.get(BASELINE), wall.get("accelerator"), wall.get("c-loop")
    for name, times in wall.items():
        per = [b / t for b, t in zip(base, times, strict=True)] if base else []
        low, high = ratio_interval(base, times) if base else (float("nan"),) * 2
        vs = [a / t for a, t in zip(accel, times, strict=True)] if accel else []
        alow, ahigh = ratio_interval(accel, times) if accel else (float("nan"),) * 2
        rows.append([f"{size} B", name, f"{median(times):.2f}",
                     f"{args.rows / median(times):,.0f}",
                     f"{median(per):.2f}x" if per else "-",
                     f"{low:.2f}x-{high:.2f}x" if per else "-",
                     f"{min(per):.2f}x-{max(per):.2f}x" if per else "-",
                     f"{median(vs):.2f}x [{alow:.2f}-{ahigh:.2f}]" if vs else "-",
                     (f"{median([c / t for c, t in zip(ceiling, times, strict=True)]):.2f}x"
                      if ceiling else "-"),
                     f"{median(cpu[name]) / args.rows * 1e6:.2f}"])
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--topic-partitions", type=int, default=4)
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--bootstrap", default=None)
    p.add_argument("--smoke", action="store_true", help="5,000 records, 1 round, 100 B")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.rounds, args.sizes = 5_000, 1, [100]
    bootstrap = load_service_env("EOS_KAFKA_BOOTSTRAP", args.bootstrap)
    if not bootstrap:
        raise SystemExit("no Kafka: run scripts/services start --only kafka")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kafka-produce-bench-") as tmp:
        c_loop = build_c_loop(Path(tmp)) if "c-loop" in args.contenders else None
        for size in args.sizes:
            rows += bench_size(bootstrap, admin, size, args, c_loop)
    load_after = os.getloadavg()
    print(f"\n{args.rows:,} records per transaction, {args.rounds} rounds, "
          f"{args.topic_partitions} partitions; load (1/5/15 min) before "
          f"{' '.join(f'{v:.1f}' for v in load_before)}, after "
          f"{' '.join(f'{v:.1f}' for v in load_after)}; {os.cpu_count()} CPUs\n")
    print(format_table(
        ["size", "contender", "median s", "records/s", f"{BASELINE} / it (median)",
         "interval", "rounds min-max", "accelerator / it [interval]",
         "of the C loop's speed", "CPU s / M records"],
        rows, align="llrrrrrrrr"))
    if args.smoke:
        print(f"\n{SMOKE_NOTE}")


if __name__ == "__main__":
    main()
