"""Tiny-batch overhead of Spark Connect against classic PySpark, per sink, side by side.

For each sink (``--sinks``, default every one whose service answers) its example streaming
job writes ``--batches`` micro-batches of ``--rows`` rows (10) from Spark's
``rate-micro-batch`` source, once as a classic driver and once as a Connect client of a
local Connect server (``--connect``), alternating which mode goes first, ``--runs`` times
each:

=============  ===============================  ===========================================
sink           runner                           what one run creates (and the bench drops)
=============  ===============================  ===========================================
``files``      ``examples.stream_to_files``     a temporary directory (output, checkpoint)
               (the example file-system sink:
               the template's tasks, decision,
               commit and ledger)
``postgres``   ``examples.stream_to_postgres``  ``public.eos_cbench_<token>_<mode>`` and its
               (``PostgresSink``, append)       ledger tables ``public.eos_cbench_<token>_l*``
``kafka``      ``examples.stream_to_kafka``     topic ``eos-cbench-<token>-<mode>`` and the
               (``KafkaSink``, one partition)   sink's ledger topic (every topic with the
                                                run's token)
``delta``      ``examples.stream_to_delta``     a temporary directory (table, checkpoint)
               (``DeltaSink``, default path)
=============  ===============================  ===========================================

Per run the time per batch is measured from Spark's own commit log (the modification times
of ``<checkpoint>/commits/<b>``), over the batches from ``--warmup`` on (JVM start, first
imports, the sink's first driver run and the first jobs' planning are excluded); the trigger
(every 100 ms) is shorter than either mode's batch, so batches run back to back. After each
run the output is checked: every id of the rate source's batches exactly once (files and
Delta read with pyarrow, PostgreSQL with a query, Kafka with a ``read_committed``
consumer); a run that fails or loses or duplicates a row ends the benchmark with a non-zero
exit status. Nothing timed is asserted.

Printed: each run's ms per batch, then one table: sink | classic ms/batch (median, range) |
Connect ms/batch | Connect / classic (of the medians) | Connect - classic in ms.

PostgreSQL and Kafka come from ``$EOS_POSTGRES_CONNINFO`` / ``$EOS_KAFKA_BOOTSTRAP`` or
``.services.env`` (``scripts/services``). A sink whose service does not answer is skipped
with a note, unless ``CI=true`` or the sink is named in ``--sinks``: then it is an error.
The conninfo reaches the runner through its environment, never its command line, and is
never printed (its password is masked in any output shown). A local Connect server always
listens on port 15002: a Connect run waits while another process's server holds it. Each
runner runs in a process group of its own, killed (with whatever it left) when the run
ends or the bench is interrupted (SIGTERM too), and the run's tables and topics dropped.

``python -m benchmarks.connect_overhead`` (40 batches, 5 warm-up, 3 runs per mode and sink:
~20 min on 2 cores); ``--runs 2`` ~13 min; ``--quick`` (15 batches, 3 warm-up, 1 run: a
short run, ~4 min for the four sinks).

``--smoke`` (CI's smoke test) is for correctness only: every sink in both modes, every
run's output checked, the table and the chart, 2 batches per run (none untimed: one interval
to divide) and no verdict. Each run is one driver start (a classic run's JVM, or a Connect
run's local server JVM): 8 for the four sinks, in every mode; the time of a smoke run is
mostly theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from benchmarks._chart import Panel, default_chart_path, draw_chart
from benchmarks._common import SMOKE_NOTE, format_table, load_service_env

REPO = Path(__file__).resolve().parents[1]
SINKS = ("files", "postgres", "kafka", "delta")
ENV_CONNINFO, ENV_BOOTSTRAP = "EOS_POSTGRES_CONNINFO", "EOS_KAFKA_BOOTSTRAP"
CONNECT_PORT = 15002  # where a local Spark Connect server listens


@dataclass
class Services:
    conninfo: str | None
    bootstrap: str | None

    def mask(self, text: str) -> str:
        """``text`` with the conninfo and its password (as ``:pw@`` or ``password=pw``)
        replaced by ``***``: never printed."""
        if not self.conninfo:
            return text
        import psycopg.conninfo

        text = text.replace(self.conninfo, "***")
        try:
            password = psycopg.conninfo.conninfo_to_dict(self.conninfo).get("password")
        except Exception:
            password = None
        if password:
            pw = re.escape(str(password))
            text = re.sub(rf"(?<=:){pw}(?=@)|(?<=password=){pw}|(?<=password=')" + pw,
                          "***", text)
        return text


# ---- services: are they there, and cleaning up after a run ----------------------------


def postgres_problem(conninfo: str | None) -> str | None:
    if not conninfo:
        return f"no ${ENV_CONNINFO} (nor .services.env)"
    import psycopg

    try:
        with psycopg.connect(conninfo, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL does not answer ({type(exc).__name__})"
    return None


def kafka_problem(bootstrap: str | None) -> str | None:
    if not bootstrap:
        return f"no ${ENV_BOOTSTRAP} (nor .services.env)"
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    except Exception as exc:
        return f"Kafka does not answer at {bootstrap} ({type(exc).__name__})"
    return None


def drop_postgres(conninfo: str, prefix: str) -> None:
    """Drop every table of ``public`` whose name starts with ``prefix`` (this run's)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(conninfo, autocommit=True) as conn:
        names = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE %s",
            (prefix.replace("_", r"\_") + "%",)).fetchall()
        for (name,) in names:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                sql.Identifier("public", name)))


def drop_topics(bootstrap: str, token: str) -> None:
    """Delete every topic whose name holds ``token`` (the output and the ledger topic)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for t in admin.list_topics(timeout=30).topics if token in t]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result()


# ---- what a run wrote: every id exactly once --------------------------------------------


def ids_files(out: Path) -> list[int]:
    from examples.fs_sink import read_output

    table = read_output(out)
    return [] if table is None else [int(v) for v in table.column("value").to_pylist()]


def ids_delta(table: Path) -> list[int]:
    """The ids of the Delta table's current files, from its JSON log (no Spark)."""
    import pyarrow.parquet as pq

    live: dict[str, None] = {}
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text(encoding="utf-8").splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    ids: list[int] = []
    for name in live:
        ids.extend(int(v) for v in pq.read_table(table / unquote(name),
                                                 columns=["id"]).column("id").to_pylist())
    return ids


def ids_postgres(conninfo: str, table: str) -> list[int]:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        return [int(r[0]) for r in conn.execute(f"SELECT id FROM {table}").fetchall()]


def ids_kafka(bootstrap: str, topic: str, expected: int) -> list[int]:
    """The keys of the topic's committed records (``read_committed``), read until
    ``expected`` came and nothing more for 2 s, or 60 s passed."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cbench-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    keys: list[int] = []
    try:
        consumer.subscribe([topic])
        deadline, idle_since = time.monotonic() + 60, time.monotonic()
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                if len(keys) >= expected and time.monotonic() - idle_since > 2:
                    break
                continue
            idle_since = time.monotonic()
            key = msg.key()
            if msg.error() is None and key is not None:
                keys.append(int(key))
    finally:
        consumer.close()
    return keys


# ---- one run -------------------------------------------------------------------------


@dataclass
class Run:
    args: list[str]  # the runner's module and its own flags
    ids: Callable[[], list[int]]  # what the run wrote
    cleanup: Callable[[], None]


def plan(sink: str, root: Path, connect: bool, services: Services, want: int) -> Run:
    mode = "connect" if connect else "classic"
    token = secrets.token_hex(4)
    if sink == "files":
        out = root / "out"
        return Run(["examples.stream_to_files", "--out", str(out)],
                   lambda: ids_files(out), lambda: None)
    if sink == "delta":
        table = root / "table"
        return Run(["examples.stream_to_delta", "--path", str(table),
                    "--sink-id", "cbench"], lambda: ids_delta(table), lambda: None)
    if sink == "postgres":
        assert services.conninfo is not None
        conninfo = services.conninfo
        prefix = f"eos_cbench_{token}_"
        name = f"public.{prefix}{mode}"
        return Run(["examples.stream_to_postgres", "--table", name, "--create-table",
                    "--ledger-table", f"public.{prefix}ledger", "--sink-id", f"cbench-{token}"],
                   lambda: ids_postgres(conninfo, name),
                   lambda: drop_postgres(conninfo, prefix))
    assert sink == "kafka" and services.bootstrap is not None
    bootstrap = services.bootstrap
    topic = f"eos-cbench-{token}-{mode}"
    return Run(["examples.stream_to_kafka", "--topic", topic, "--create-topic",
                "--sink-id", f"cbench-{token}"],
               lambda: ids_kafka(bootstrap, topic, want),
               lambda: drop_topics(bootstrap, token))


def wait_connect_port(timeout: float = 300.0) -> None:
    """A local Connect server always listens on port 15002 (PySpark's client of a
    ``local[...]`` server goes to ``sc://localhost``): wait while another process's server
    holds it (a test suite running at the same time), or exit saying so."""
    import socket

    deadline, noted = time.monotonic() + timeout, False
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", CONNECT_PORT)) != 0:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"port {CONNECT_PORT} stayed taken for {timeout:.0f} s by another "
                             "process's Spark Connect server: a local server cannot start")
        if not noted:
            print(f"(waiting: another process's Connect server holds port {CONNECT_PORT})",
                  flush=True)
            noted = True
        time.sleep(2)


def run_alone(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``cmd`` in a process group of its own (its JVM, a local Connect server and their
    Python workers); whatever of the group is left when it ends, fails or is interrupted
    is killed. Its exit code and output (stdout, then stderr)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, out + err


def one_run(sink: str, connect: bool, args: argparse.Namespace,
            services: Services) -> tuple[float, float]:
    """ms per batch of one driver run (from the checkpoint's commit log), and the run's
    wall time in s. Exits non-zero if the run fails or its output is not exact."""
    label = f"{sink} {'Connect' if connect else 'classic'}"
    with tempfile.TemporaryDirectory(prefix="eos-connect-bench-") as tmp:
        root = Path(tmp)
        ckpt = root / "ckpt"
        run = plan(sink, root, connect, services, args.batches * args.rows)
        cmd = [sys.executable, "-m", *run.args, "--source", "rate",
               "--batches", str(args.batches), "--rows-per-batch", str(args.rows),
               "--checkpoint", str(ckpt), *(["--connect"] if connect else [])]
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])))
        env.pop("CONNECTORS_CRASH_AT", None)
        if services.conninfo:
            env[ENV_CONNINFO] = services.conninfo  # never on the command line
        if services.bootstrap:
            env[ENV_BOOTSTRAP] = services.bootstrap
        try:
            if connect:
                wait_connect_port()
            t0 = time.monotonic()
            code, output = run_alone(cmd, env)
            wall = time.monotonic() - t0
            if code != 0:
                raise SystemExit(f"the {label} run failed (exit {code}):\n"
                                 + services.mask(output[-6000:]))
            want = args.batches * args.rows
            ids = run.ids()
            if len(ids) != want or set(ids) != set(range(want)):
                raise SystemExit(f"the {label} run wrote {len(ids)} rows, "
                                 f"{len(set(ids))} distinct ids; expected ids 0..{want - 1} "
                                 "exactly once: rows lost or duplicated")
        finally:
            try:
                run.cleanup()
            except Exception as exc:
                print(f"! {label}: clean-up failed: {services.mask(repr(exc))}", file=sys.stderr)
        times = sorted((int(p.name), p.stat().st_mtime) for p in (ckpt / "commits").iterdir()
                       if p.name.isdigit())
        timed = [t for b, t in times if args.warmup <= b < args.batches]
        return (timed[-1] - timed[0]) / (len(timed) - 1) * 1000, wall


def choose_sinks(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 services: Services) -> list[str]:
    named = args.sinks is not None
    wanted = [s.strip() for s in (args.sinks or ",".join(SINKS)).split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SINKS]
    if unknown:
        parser.error(f"--sinks: unknown {unknown}; choose from {','.join(SINKS)}")
    strict = named or os.environ.get("CI", "").lower() == "true"
    chosen = []
    for sink in wanted:
        problem = (postgres_problem(services.conninfo) if sink == "postgres"
                   else kafka_problem(services.bootstrap) if sink == "kafka" else None)
        if problem is None:
            chosen.append(sink)
        elif strict:
            raise SystemExit(f"{sink}: {services.mask(problem)} "
                             f"({'named in --sinks' if named else 'CI=true'}: not skipped)")
        else:
            print(f"skipped {sink}: {services.mask(problem)}", flush=True)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sinks", default=None,
                        help=f"comma-separated, of {','.join(SINKS)} (default: every one "
                             "whose service answers)")
    parser.add_argument("--batches", type=int, default=None, help="per run (default 40)")
    parser.add_argument("--rows", type=int, default=10, help="rows per batch")
    parser.add_argument("--warmup", type=int, default=None,
                        help="batches not timed (default 5)")
    parser.add_argument("--runs", type=int, default=None, help="per mode and sink (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="15 batches, 3 warm-up, 1 run: a short run")
    parser.add_argument("--smoke", action="store_true",
                        help="correctness only (CI): 2 batches, none untimed, 1 run; "
                             "no verdict")
    parser.add_argument("--chart", default=str(default_chart_path("connect_overhead")),
                        help="the table as a PNG chart (benchmarks/charts/connect_overhead.png)")
    args = parser.parse_args(argv)
    # A SIGTERM (CI's timeout) unwinds like an error: the running runner's process group is
    # killed and its tables and topics dropped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.quick and args.smoke:
        parser.error("--quick or --smoke, not both")
    quick = {"batches": 15, "warmup": 3, "runs": 1}
    smoke = {"batches": 2, "warmup": 0, "runs": 1}
    full = {"batches": 40, "warmup": 5, "runs": 3}
    for key, value in (smoke if args.smoke else quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    least = 2 if args.smoke else 3  # a smoke run divides one interval, and judges nothing
    if args.batches - args.warmup < least:
        parser.error(f"--batches must leave at least {least} timed batches after --warmup")
    services = Services(load_service_env(ENV_CONNINFO), load_service_env(ENV_BOOTSTRAP))
    sinks = choose_sinks(parser, args, services)
    if not sinks:
        raise SystemExit("no sink to measure")
    results: dict[str, dict[str, list[float]]] = {s: {"classic": [], "connect": []}
                                                   for s in sinks}
    walls: dict[str, float] = dict.fromkeys(sinks, 0.0)
    started = time.monotonic()
    load_before = os.getloadavg()
    for i in range(args.runs):
        for j, sink in enumerate(sinks):
            order = ("classic", "connect") if (i + j) % 2 == 0 else ("connect", "classic")
            for mode in order:
                ms, wall = one_run(sink, mode == "connect", args, services)
                results[sink][mode].append(ms)
                walls[sink] += wall
                print(f"run {i + 1} {sink:8s} {mode:8s} {ms:7.1f} ms/batch "
                      f"(the run: {wall:.0f} s)", flush=True)
    rows = []
    for sink in sinks:
        med = {m: statistics.median(v) for m, v in results[sink].items()}
        cells = [f"{med[m]:.1f} ({min(v):.1f}-{max(v):.1f})"
                 for m, v in results[sink].items()]
        rows.append([sink, *cells, f"{med['connect'] / med['classic']:.2f}x",
                     f"{med['connect'] - med['classic']:+.1f}", f"{walls[sink]:.0f}"])
    print()
    print(f"# {args.rows} rows per batch, {args.batches - args.warmup - 1} batch intervals "
          f"timed per run (after {args.warmup} warm-up), {args.runs} run(s) per mode and sink, "
          "alternating")
    print()
    print(format_table(["sink", "classic ms/batch (median, range)",
                        "Connect ms/batch (median, range)", "Connect / classic",
                        "Connect - classic (ms)", "runs' wall time (s)"], rows))
    print()
    if args.chart:
        panel = Panel(f"{args.rows} rows per batch", {
            sink: [c / k for c, k in zip(results[sink]["connect"], results[sink]["classic"],
                                         strict=True)] for sink in sinks},
            "Spark Connect's ms per batch / classic PySpark's (per run)", better="lower")
        chart = draw_chart(args.chart, "connect_overhead: the sinks over Spark Connect",
                           [panel])
        print(f"chart: {chart}")
        print()
    load_after = os.getloadavg()
    print(f"* every run's output checked: each id exactly once; wall time "
          f"{time.monotonic() - started:.0f} s; 1-min load average {load_before[0]:.1f} "
          f"before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs")
    if args.smoke:
        print(f"* {SMOKE_NOTE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
