"""The ``connectors`` command: the demo and the operator tools.

::

    connectors demo [--sink delta|postgres|kafka]       # a killed-and-restarted streaming job
    connectors status  --postgres CONNINFO [--sink-id ID]    # ledgers and lingering transactions
    connectors status  --postgres-env PGCONN                 # the conninfo from $PGCONN
    connectors recover --postgres-file conn.txt --commit-decided --abort-undecided
    connectors doctor  --checkpoint PATH --sink-id ID --postgres CONNINFO
    connectors status  --mariadb-env MARIADB_URL            # MariaDB's XA branches (no age)
    connectors recover --mariadb-file url.txt --commit-decided --abort-undecided --min-age 0
    connectors status  --kafka b:9092 --kafka-config-file client.properties
    connectors status  --delta s3a://bucket/table     # store settings from AWS_* variables
    connectors status  --iceberg /warehouse/db/events # an Iceberg table's location
    connectors status  --postgres-env PGCONN --watch --interval 5 --prometheus-port 9464
    connectors submit-args --components delta,kafka     # --packages/--conf for spark-submit
    connectors savepoint --checkpoint PATH --sink-id ID --postgres-env PGCONN [--stop-pid PID]

Every command prints human-readable tables, or JSON with ``--json``. Exit codes: 0 all is
well, 1 something needs an operator (lingering transactions, unfinished batches, a broken
invariant), 2 bad arguments, 3 a target could not be reached or read.

No secret needs to be an argument (every user of a machine sees every command line):
``--postgres-env VAR`` and ``--postgres-file FILE`` read the connection string (so do
``--mariadb-env VAR`` and ``--mariadb-file FILE`` MariaDB's address; a password in
``--postgres`` or ``--mariadb`` is warned about),
``--kafka-config-env VAR`` and ``--kafka-config-file FILE`` the librdkafka settings (a JSON
object or ``KEY=VALUE`` lines), and ``--kafka-config``/``--storage-option`` refuse secrets
(:mod:`connectors.cli._inputs`). Secrets are never printed: not in tables, JSON, errors
or log lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence

from connectors.cli._inputs import storage_options
from connectors.cli._model import (
    EXIT_ATTENTION,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Finding,
    RecoverReport,
    SinkStatus,
    render_table,
    to_json,
)
from connectors.cli._target_args import add_target_args, rebuilt, targets
from connectors.cli._targets import Target
from connectors.core.errors import ConfigurationError, ConnectorError
from connectors.core.naming import validate_sink_id

#: The components ``submit-args`` names by default: ``connectors.spark.DEFAULT_COMPONENTS``
#: (kept literal here: building the parser must not import the resolver).
DEFAULT_SPARK_COMPONENTS = ("delta", "kafka")

__all__ = ["main", "storage_options"]

logger = logging.getLogger(__name__)


def _sinks(target: Target, args: argparse.Namespace) -> list[str]:
    """The sinks named with ``--sink-id`` (each a valid sink id, else a clear error before
    any query: a sink id is only ever a query parameter, never SQL), or every sink the
    target knows."""
    return [validate_sink_id(s) for s in args.sink_ids] or target.sink_ids()


# ------------------------------------------------------------------------------ status

def _print_status(statuses: list[SinkStatus]) -> None:
    if not statuses:
        print("no sinks found")
        return
    for target in dict.fromkeys(s.target for s in statuses):
        group = [s for s in statuses if s.target == target]
        print(f"{target}\n")
        print(render_table(
            ["sink", "query", "last committed", "unfinished", "lingering"],
            [[s.sink_id, s.query_id, s.last_committed, ",".join(map(str, s.unfinished)) or
              "none", len(s.lingering)] for s in group]))
        rows = [[s.sink_id, item.transaction, item.batch_id, item.age_s,
                 {True: "yes", False: "no", None: "-"}[item.decided], item.detail]
                for s in group for item in s.lingering]
        if rows:
            print()
            print(render_table(["sink", "transaction", "batch", "age s", "decided", "state"],
                               rows))
        notes = [f"{s.sink_id}: {n}" for s in group for n in s.notes]
        for note in notes:
            print(f"note: {note}")
        print()


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch:
        from connectors.cli._watch_loop import run_watch

        return run_watch(args, targets(args), lambda kind: rebuilt(kind, args))
    if args.checkpoints or args.prometheus_port is not None or args.prometheus_textfile:
        raise ConfigurationError("--checkpoint, --prometheus-port and --prometheus-textfile "
                                 "go with --watch")
    statuses: list[SinkStatus] = []
    for target in targets(args):
        try:
            statuses += [target.status(sid) for sid in _sinks(target, args)]
        finally:
            target.close()
    if args.json:
        print(to_json(statuses))
    else:
        _print_status(statuses)
    return EXIT_ATTENTION if any(s.needs_attention for s in statuses) else EXIT_OK


# ----------------------------------------------------------------------------- recover

def cmd_recover(args: argparse.Namespace) -> int:
    if not (args.commit_decided or args.abort_undecided):
        raise ConfigurationError("say what to settle: --commit-decided and/or --abort-undecided")
    reports: list[RecoverReport] = []
    for target in targets(args):
        try:
            for sid in _sinks(target, args):
                reports.append(target.recover(
                    sid, commit_decided=args.commit_decided,
                    abort_undecided=args.abort_undecided, min_age_s=args.min_age))
        finally:
            target.close()
    if args.json:
        print(to_json(reports))
    else:
        if not reports:
            print("no sinks found")
        else:
            print(render_table(["sink", "target", "committed", "aborted", "left"],
                               [[r.sink_id, r.target, len(r.committed), len(r.aborted),
                                 len(r.left)] for r in reports]))
        for r in reports:
            for t in r.committed:
                print(f"committed  {r.sink_id}  {t}")
            for t in r.aborted:
                print(f"aborted    {r.sink_id}  {t}")
            for item in r.left:
                print(f"left       {r.sink_id}  {item.transaction}")
            for note in r.notes:
                print(f"note       {r.sink_id}  {note}")
    return EXIT_ATTENTION if any(r.left for r in reports) else EXIT_OK


# ------------------------------------------------------------------------------ doctor

def cmd_doctor(args: argparse.Namespace) -> int:
    from connectors.cli._doctor import check, jar_findings, offset_log_findings, read_checkpoint

    if len(args.sink_ids) != 1:
        raise ConfigurationError("doctor checks one sink: pass exactly one --sink-id")
    try:
        ckpt = read_checkpoint(args.checkpoint)
    except FileNotFoundError as exc:
        raise ConfigurationError(str(exc)) from None
    findings: list[Finding] = offset_log_findings(ckpt)
    for target in targets(args):
        ledger = target.ledger(args.sink_ids[0])
        try:
            findings += check(ckpt, list(ledger.entries()), ledger.bound_query())
        finally:
            ledger.close()
            target.close()
    findings += jar_findings()
    if args.json:
        print(to_json(findings))
    else:
        print(f"checkpoint {ckpt.path}: query {ckpt.query_id}, planned batches "
              f"{_span(ckpt.offsets)}, committed {_span(ckpt.commits)}")
        print(render_table(["check", "result", "detail"],
                           [[f.check, "ok" if f.ok else f.severity.upper(), f.detail]
                            for f in findings]))
    broken = [f for f in findings if not f.ok and f.severity == "error"]
    return EXIT_ATTENTION if broken else EXIT_OK


def _span(ids: list[int]) -> str:
    return f"{ids[0]}..{ids[-1]}" if ids else "none"


# -------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="connectors", description="Exactly-once sinks for Spark: demo and operator tools.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a streaming job, SIGKILL its driver, restart, "
                          "verify exactly-once")
    from connectors.cli._demo import add_arguments as add_demo_arguments

    add_demo_arguments(demo)

    status = sub.add_parser("status", help="per sink: last committed batch, unfinished "
                            "batches, lingering transactions (--watch: refreshed until "
                            "Ctrl-C, and as Prometheus gauges)")
    add_target_args(status)
    from connectors.cli._watch_loop import add_watch_arguments

    add_watch_arguments(status)

    recover = sub.add_parser("recover", help="settle what dead drivers left")
    add_target_args(recover)
    recover.add_argument("--commit-decided", action="store_true",
                         help="commit the transactions of decided batches")
    recover.add_argument("--abort-undecided", action="store_true",
                         help="roll back transactions no decision lists")
    recover.add_argument("--min-age", type=float, default=60.0, metavar="SECONDS",
                         help="leave undecided transactions younger than this alone: a live "
                         "driver may be about to decide them (default 60); one of unknown "
                         "age (MariaDB) is left unless the ledger decided its batch or a "
                         "later one, or this is 0 (no driver of the sink runs)")

    doctor = sub.add_parser("doctor", help="compare a Spark checkpoint with the sink's ledger; "
                            "show the jars a Spark session would get")
    doctor.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    add_target_args(doctor)

    savepoint = sub.add_parser("savepoint", help="the sink's last decided batch and, per "
                               "source, the option a new query starts right after it "
                               "(--stop-pid: stop the driver first)")
    from connectors.cli._savepoint import add_arguments as add_savepoint_arguments

    add_savepoint_arguments(savepoint)
    add_target_args(savepoint)

    submit = sub.add_parser("submit-args", help="the spark-submit arguments the components "
                            "need (--packages and --conf) for this Spark version; your "
                            "master and settings stay yours")
    submit.add_argument("--components", default=",".join(DEFAULT_SPARK_COMPONENTS),
                        help="comma-separated: delta, kafka, s3 (default: %(default)s)")
    submit.add_argument("--jars", action="store_true",
                        help="--jars with the resolved jars' local paths instead of --packages")
    submit.add_argument("--json", action="store_true", help="the arguments as a JSON list")
    return parser


def cmd_submit_args(args: argparse.Namespace) -> int:
    from connectors.spark.jars import submit_args, submit_line

    components = [c.strip() for c in args.components.split(",") if c.strip()]
    if args.json:
        print(json.dumps(submit_args(components, packages=not args.jars)))
    else:
        print(submit_line(components, packages=not args.jars))
    return EXIT_OK


def cmd_savepoint(args: argparse.Namespace) -> int:
    from connectors.cli._savepoint import run

    return run(args, targets(args))


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "status": cmd_status,
    "recover": cmd_recover,
    "doctor": cmd_doctor,
    "submit-args": cmd_submit_args,
    "savepoint": cmd_savepoint,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.command == "demo":
            from connectors.cli._demo import run as run_demo

            return run_demo(args)
        return COMMANDS[args.command](args)
    except ConfigurationError as exc:
        print(f"connectors {args.command}: {exc}", file=sys.stderr)
        # A target that cannot be connected to (PostgreSQL's CannotConnectError) is
        # "unreachable", not a usage error.
        return EXIT_UNREACHABLE if getattr(exc, "cannot_connect", False) else EXIT_USAGE
    except ConnectorError as exc:
        print(f"connectors {args.command}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return 130
