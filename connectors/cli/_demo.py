"""``connectors demo``: a real streaming job, its driver SIGKILLed mid-run, restarted.

The job (:mod:`connectors.cli._job`) streams JSON files, one micro-batch each, into a sink:
DeltaSink on a local path by default (no server needed), or PostgresSink / KafkaSink. The
first run arms a crash point, so the driver SIGKILLs itself at the protocol's worst moment
of batch ``--crash-batch`` (after the decision for PostgreSQL and Delta, after every slot
committed but before the ledger knows for Kafka); the second run restarts from the
checkpoint. Then the target is read like a downstream user would read it and compared
with the input, id by id, and a verdict table is printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from connectors.cli._job import MILESTONE, make_input_files
from connectors.core.errors import ConfigurationError

__all__ = ["add_arguments", "run"]

#: The crash point of the first run, per sink (see connectors.core.states.CRASH_POINTS).
CRASH_POINT = {"delta": "after_decision", "postgres": "after_decision",
               "kafka": "before_decision"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sink", choices=["delta", "postgres", "kafka"], default="delta",
                   help="target (default delta: a local Delta table, no server needed)")
    p.add_argument("--conninfo", default=os.environ.get("EOS_POSTGRES_CONNINFO"),
                   help="PostgreSQL connection string (--sink postgres)")
    p.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"),
                   help="Kafka bootstrap servers (--sink kafka)")
    p.add_argument("--files", type=int, default=8, help="input files = micro-batches (8)")
    p.add_argument("--rows-per-file", type=int, default=5000)
    p.add_argument("--crash-batch", type=int, default=3,
                   help="the batch whose driver is SIGKILLed (3)")
    p.add_argument("--workdir", help="input, checkpoint, Delta table, logs (default: a temp dir)")
    p.add_argument("--table", metavar="URI",
                   help="--sink delta: where the demo creates its table, as "
                        "<URI>/connectors-demo-<run> (e.g. s3a://bucket/demos; default: in the "
                        "work dir). s3a:// takes the s3 jars; give the endpoint and path style "
                        "with --conf, the keys as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark conf of the job (e.g. spark.hadoop.fs.s3a.endpoint=...); "
                        "secrets are refused here (the command line is visible to every "
                        "user): pass them in the environment")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("--connect", action="store_true",
                   help="run the job as a Spark Connect client of a local Connect server: "
                        "the crash point kills the foreachBatch worker next to the server")


def _batches_done(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CONNECTORS_CRASH_AT", None)
    root = str(Path(__file__).resolve().parents[2])
    if not (Path(root) / "connectors" / "__init__.py").is_file():  # pragma: no cover
        root = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def restart_times(log: Path, started: float) -> dict[str, float | None]:
    """Seconds from a run's process start (``started``, unix time) to its Spark session, its
    started query and its first committed batch, from the job's ``MILESTONE`` lines
    (None for one the run never reached)."""
    seen: dict[str, float] = {}
    text = log.read_text(errors="replace") if log.is_file() else ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == MILESTONE:
            try:
                seen.setdefault(parts[1], float(parts[2]))
            except ValueError:
                continue
    return {name: (round(seen[name] - started, 1) if name in seen else None)
            for name in ("session", "query_started", "first_commit")}


def _drive(cmd: list[str], env: dict[str, str], log: Path, label: str, checkpoint: Path,
           rows_per_batch: int, quiet: bool) -> tuple[int, float]:
    # Spark's scratch (the copy of every jar its local executor fetches): one per run, in
    # the work dir, removed after it; a SIGKILLed driver runs no shutdown hook to do it.
    scratch = None
    if not env.get("SPARK_LOCAL_DIRS"):
        scratch = Path(tempfile.mkdtemp(prefix="spark-scratch-", dir=log.parent))
        env = dict(env, SPARK_LOCAL_DIRS=str(scratch))
    try:
        return _watch(cmd, env, log, label, checkpoint, rows_per_batch, quiet)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _watch(cmd: list[str], env: dict[str, str], log: Path, label: str, checkpoint: Path,
           rows_per_batch: int, quiet: bool) -> tuple[int, float]:
    """Run ``cmd`` to its end, printing each batch it commits and its rate."""
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        first = last = _batches_done(checkpoint)
        first_at = start
        while proc.poll() is None:
            done = _batches_done(checkpoint)
            if done != last and not quiet:
                now = time.monotonic()
                if last == first:
                    first_at = now  # the rate counts from this run's first batch
                rate = (done - first - 1) * rows_per_batch / (now - first_at) \
                    if done - first > 1 and now > first_at else None
                shown = f"{rate:10,.0f} rows/s" if rate is not None else " " * 17
                print(f"  [{label}] batches committed: {done:3d}  {shown}  "
                      f"({now - start:5.1f} s)", flush=True)
                last = done
            time.sleep(0.25)
    return proc.returncode, time.monotonic() - start


def _workdir(requested: str | None) -> Path:
    """The demo's work directory: ``requested``, emptied first, or a new temp directory."""
    if not requested:
        return Path(tempfile.mkdtemp(prefix="connectors-demo-"))  # creates it, empty
    root = Path(requested)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return root


def run(args: argparse.Namespace) -> int:
    if args.sink == "postgres" and not args.conninfo:
        raise ConfigurationError("--sink postgres needs --conninfo (or $EOS_POSTGRES_CONNINFO)")
    if args.sink == "kafka" and not args.bootstrap:
        raise ConfigurationError("--sink kafka needs --bootstrap (or $EOS_KAFKA_BOOTSTRAP)")
    if not 0 <= args.crash_batch < args.files - 1:
        raise ConfigurationError("--crash-batch must be below --files - 1")
    if args.table and args.sink != "delta":
        raise ConfigurationError("--table is for --sink delta")
    confs = _confs(args.conf)
    root = _workdir(args.workdir)
    tag = f"{int(time.time())}-{os.getpid()}"
    inp, ckpt = root / "input", root / "checkpoint"
    table = (f"{args.table.rstrip('/')}/connectors-demo-{tag}" if args.table
             else str(root / "delta-table"))
    target = {"delta": table,
              "postgres": f"public.connectors_demo_{tag.replace('-', '_')}",
              "kafka": f"connectors-demo-{tag}"}[args.sink]
    rows_in = make_input_files(inp, args.files, args.rows_per_file)
    quiet = bool(args.json)
    if not quiet:
        print(f"connectors demo: {rows_in:,} rows in {args.files} files (one micro-batch each) "
              f"-> {args.sink} {target}\n  work dir {root}")
    sink_id = f"demo-{tag}"[:40]
    base = [sys.executable, "-m", "connectors.cli._job", "--sink", args.sink, "--target", target,
            "--sink-id", sink_id]
    if args.conninfo:
        base += ["--conninfo", args.conninfo]
    if args.bootstrap:
        base += ["--bootstrap", args.bootstrap]
    base += [x for conf in confs for x in ("--conf", conf)]
    if args.sink == "kafka":
        _create_topic(args.bootstrap, target)
    job = [*base[:3], "run", *base[3:], "--input", str(inp), "--checkpoint", str(ckpt),
           *(["--connect"] if args.connect else [])]
    env = _env()
    started = time.monotonic()

    point = CRASH_POINT[args.sink]
    # Under Spark Connect the protocol's driver side runs in the foreachBatch worker next to
    # the server: that process SIGKILLs itself, the query fails and the client exits.
    victim = "the foreachBatch worker" if args.connect else "the driver"
    if not quiet:
        print(f"run 1: {victim} SIGKILLs itself at {point} of batch {args.crash_batch}")
    crash_log = root / "crash.log"
    crash_env = dict(env, CONNECTORS_TEST_MODE="1", CONNECTORS_CRASH_LOG=str(crash_log),
                     CONNECTORS_CRASH_AT=f"{point}:batch={args.crash_batch}")
    code1, t1 = _drive(job, crash_env, root / "run-1.log", "run 1", ckpt, args.rows_per_file,
                       quiet)
    mark = f"{point} sink={sink_id} batch={args.crash_batch} "
    reached = crash_log.is_file() and mark in crash_log.read_text()
    killed = reached and (code1 == -signal.SIGKILL or (args.connect and code1 != 0))
    if not quiet:
        ended = ("SIGKILLed" if code1 == -signal.SIGKILL else f"exit code {code1}")
        print(f"  run 1 ended: {ended} after {t1:.1f} s"
              + (f" ({victim} SIGKILLed at {point})" if args.connect and killed else ""))
        print("run 2: restart from the checkpoint (recovers, then finishes the stream)")
    run2_started = time.time()
    code2, t2 = _drive(job, env, root / "run-2.log", "run 2", ckpt, args.rows_per_file, quiet)
    restart = restart_times(root / "run-2.log", run2_started)
    if not quiet:
        print(f"  run 2 ended: exit code {code2} after {t2:.1f} s")

    read = subprocess.run([*base[:3], "ids", *base[3:]], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    lines = [ln for ln in read.stdout.splitlines() if ln.startswith("IDS ")]
    ids: list[int] = json.loads(lines[-1][4:]) if lines else []
    counts = collections.Counter(ids)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    missing = sum(1 for i in range(rows_in) if counts[i] == 0)
    ok = killed and code2 == 0 and bool(lines) and not duplicates and not missing
    verdict = {
        "sink": args.sink, "target": target, "sink id": sink_id, "work dir": str(root),
        "rows in": rows_in, "rows out": len(ids),
        "duplicates": duplicates, "missing": missing, "batches": _batches_done(ckpt),
        "restarts": 1, "driver SIGKILLed": killed,
        # the restart, from its process's start: a Spark session, a started query, the
        # first batch committed (the sink's recovery of the killed run's batch included)
        "restart: session s": restart["session"],
        "restart: query s": restart["query_started"],
        "restart: commit s": restart["first_commit"],
        "time s": round(time.monotonic() - started, 1),
        "verdict": "EXACTLY ONCE" if ok else "FAILED",
    }
    if args.connect:  # the sink's driver side runs in the foreachBatch worker, killed there
        verdict = {("worker SIGKILLed" if k == "driver SIGKILLed" else k): v
                   for k, v in verdict.items()}
    if quiet:
        print(json.dumps(verdict))
    else:
        width = max(len(k) for k in verdict)
        print("\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in verdict.items()))
    if not ok:
        print(f"driver logs: {root}/run-1.log, run-2.log" +
              ("" if lines else f"; reading the target failed:\n{read.stderr[-3000:]}"),
              file=sys.stderr)
    return 0 if ok else 1


def _confs(items: list[str]) -> list[str]:
    """``--conf`` items, checked: ``KEY=VALUE`` and no secret (they are on a command line)."""
    from connectors.spark.jars import is_secret_conf

    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"--conf takes KEY=VALUE, not {item.split('=')[0]!r}")
        if is_secret_conf(key):
            raise ConfigurationError(
                f"--conf {key}=... holds a secret, and a command line is visible to every "
                "user of the machine: pass it in the environment instead (object store "
                "keys: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, which S3A's default "
                "credential chain and the sink's ledger client read), or a Spark conf in "
                "$SPARK_CONF_DIR/spark-defaults.conf, readable by you only")
    return items


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    for future in futures.values():
        future.result(timeout=60)
