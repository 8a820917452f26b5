"""Every fenced block of README.md and docs/*.md that a user would paste is run, credited to
.ci/run, or marked illustrative with a reason (``integration/docs/_snippets.py`` has the rules).

The blocks run verbatim: each python block is saved as the file its first line names, in a
temporary directory, and run with this interpreter in a subprocess; shell blocks run with
``bash -euo pipefail``; SQL blocks against PostgreSQL. Consecutive programs of a page run
one after the other in one process (``_run_blocks.py``: each as ``python NAME`` runs it),
so that they share one Spark driver JVM: a JVM start costs 10-15 s of CPU on the CI
machine, the programs' own work a few seconds (:func:`page_plan`; ``RUN_FIRST`` moves an
independent program that needs more jars to the front of its page). They get only what
they visibly read from the environment: ``EOS_POSTGRES_CONNINFO`` (a database created for
the page and dropped after), ``EOS_KAFKA_BOOTSTRAP``, ``EOS_KAFKA_TOPIC`` (new for each
page) and ``EOS_EXAMPLE_DIR`` (an empty directory), and ``PATH`` starts with this
interpreter's directory, as in an activated virtual environment. After each process, the
target of each block it finished is read like a downstream user reads it (the PostgreSQL
table, the Kafka topic with ``read_committed``, the Delta table's log and files) and
compared row by row with what the block wrote: nothing missing, nothing twice. The
PostgreSQL, MariaDB and Kafka quick-starts of the README first run with their driver
SIGKILLed at a crash point of batch 1, then again, as the README says a user may; the kills
are chained, each second run starting the next process (README.md: [delta, postgres
killed], [postgres, datasource killed], [datasource, mariadb killed], [mariadb, kafka
killed], [kafka]: 5 drivers where it took 9).

The three commands that .ci/run runs verbatim (``RUN_BY_CI``) are not run here again: the
test asserts that .ci/run still contains each of them.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from integration.docs import _mariadb_page as mp
from integration.docs import _snippets as sn
from integration.support._pg import fresh_database

pytestmark = pytest.mark.integration

ROOT = sn.REPO_ROOT
CI_SCRIPT = ROOT / ".ci" / "run"

#: Commands of the docs that .ci/run runs verbatim, and where.
RUN_BY_CI: dict[str, str] = {
    "bash scripts/demo": "lane demo: the first run on the fresh clone, timed",
    "bash scripts/test": "lane test: the whole suite",
    'pip install "spark-exactly-once[spark,postgres]"':
        "lane wheel: into a clean virtual environment",
}

#: Seconds one block may take (a Spark program starts a JVM; the CI machine has 2 cores).
BLOCK_TIMEOUT = 600.0


# --------------------------------------------------------------------- what the blocks wrote


@dataclass
class Page:
    """The environment one page's blocks run in, and what they printed."""

    doc: str
    cwd: Path
    env: dict[str, str]
    secrets: list[str]
    outputs: dict[str, sn.Run] = field(default_factory=dict)
    #: What the checks of docs/security.md read with (never given to the blocks): the
    #: PostgreSQL superuser's conninfo and Kafka's PLAINTEXT (super user) bootstrap.
    admin: dict[str, str] = field(default_factory=dict)

    @property
    def work(self) -> Path:
        return Path(self.env["EOS_EXAMPLE_DIR"])

    @property
    def conninfo(self) -> str:
        return self.env["EOS_POSTGRES_CONNINFO"]

    @property
    def bootstrap(self) -> str:
        return self.env["EOS_KAFKA_BOOTSTRAP"]

    @property
    def topic(self) -> str:
        return self.env["EOS_KAFKA_TOPIC"]


def _events() -> list[tuple[int, str]]:
    """The quick-starts' input: ids 0..299 named user-<id>."""
    return [(i, f"user-{i}") for i in range(300)]


def check_postgres_events(page: Page, run: sn.Run) -> None:
    rows = sn.postgres_rows(page.conninfo, "SELECT id, name FROM public.events")
    sn.exact(rows, _events(), "public.events after the PostgreSQL quick-start")


def check_postgres_events_ds(page: Page, run: sn.Run) -> None:
    rows = sn.postgres_rows(page.conninfo, "SELECT id, name FROM public.events_ds")
    sn.exact(rows, _events(), "public.events_ds after the DataSource quick-start")
    # Spark's progress counts the sink's rows: 100 per file, in the batches of this run.
    counts = re.findall(r"^batch (\d+): (-?\d+) rows$", run.stdout, re.MULTILINE)
    assert counts and all(n == "100" for _, n in counts), run.stdout


def check_mariadb_events(page: Page, run: sn.Run) -> None:
    rows = mp.mariadb_rows(page.env[mp.ENV_URL], "SELECT id, name FROM events")
    sn.exact(rows, _events(), "events after the MariaDB quick-start")
    assert mp.mariadb_prepared(page.env[mp.ENV_URL], ["events-mariadb"]) == []


def check_kafka_events(page: Page, run: sn.Run) -> None:
    from integration.support._kafka import read_all

    got = []
    for m in read_all(page.bootstrap, page.topic):
        value = m.json()
        got.append((int((m.key or b"").decode()), value["id"], value["name"]))
    sn.exact(got, [(i, i, n) for i, n in _events()],
             f"topic {page.topic} (read_committed) after the Kafka quick-start")


def check_delta_events(page: Page, run: sn.Run) -> None:
    rows = sn.delta_rows(page.work / "tables" / "events")
    sn.exact([(r["id"], r["name"]) for r in rows], _events(),
             "the Delta table after the Delta quick-start")


def check_fan_out(page: Page, run: sn.Run) -> None:
    """docs/fan-out.md: every id once in each of the three targets, and nothing left."""
    check_postgres_events(page, run)
    check_kafka_events(page, run)
    check_delta_events(page, run)
    check_nothing_prepared(page, sn.postgres_rows(
        page.conninfo, "SELECT gid, database FROM pg_prepared_xacts"))


def check_readme_cli(page: Page, run: sn.Run) -> None:
    # bash -e: every command exited 0 ("all well"); the sinks of the quick-starts are listed
    for sink in ("events-pg", "events-delta"):
        assert re.search(rf"^{sink}\s", run.stdout, re.M), f"status does not list {sink}"
    assert "no-gaps" in run.stdout and "ERROR" not in run.stdout, "doctor found a problem"


def check_pytest_passed(page: Page, run: sn.Run, sinks: int = 1) -> None:
    """Exactly the conformance kit's tests passed, once for each of ``sinks`` sinks."""
    from connectors.testing import SinkConformanceTests

    tests = sinks * sum(1 for n in dir(SinkConformanceTests) if n.startswith("test_"))
    summary = [ln for ln in run.stdout.splitlines() if ln.strip()][-1:]
    assert summary and re.fullmatch(
        rf"=*\s*{tests} passed(, \d+ warnings?)? in [\d.]+s( \([\d:]+\))?\s*=*", summary[0]), (
        f"expected exactly the {tests} conformance tests to pass:\n{run.stdout[-3000:]}")


def check_each_family_passed(page: Page, run: sn.Run) -> None:
    """docs/connector-guide.md: the kit passes on its sink of each of the three families."""
    check_pytest_passed(page, run, sinks=3)


def check_postgres_users(page: Page, run: sn.Run) -> None:
    rows = sn.postgres_rows(page.conninfo, "SELECT user_id, score FROM public.users")
    # run id 0: users k, k+100, k+200 of one user; the greatest row wins
    sn.exact(rows, [(k, k + 200) for k in range(100)], "public.users after the upsert job")


def check_mariadb_users(page: Page, run: sn.Run) -> None:
    rows = mp.mariadb_rows(page.env[mp.ENV_URL], "SELECT user_id, score FROM users")
    # run id 0: users k, k+100, k+200 of one user; the greatest row wins
    sn.exact(rows, [(k, k + 200) for k in range(100)], "users after the MariaDB upsert job")
    assert mp.mariadb_prepared(page.env[mp.ENV_URL], ["users-mariadb"]) == []


def check_mariadb_accounts(page: Page, run: sn.Run) -> None:
    rows = mp.mariadb_rows(page.env[mp.ENV_URL],
                           "SELECT id, seq, name, score FROM accounts ORDER BY id")
    # 1 updated, 2 deleted, 3 deleted and inserted again, 4 deleted though never seen
    sn.exact(rows, [(1, 4, "ada", 11), (3, 7, "cy", 31)], "accounts after the changes")
    assert mp.mariadb_prepared(page.env[mp.ENV_URL], ["accounts-mariadb-cdc"]) == []


def check_mariadb_status(page: Page, run: sn.Run) -> None:
    """docs/mariadb.md: ``status --json`` lists the upsert job's sink (nothing unfinished,
    nothing lingering: bash -e, every command exited 0), and the address is shown with
    its password masked."""
    statuses, _ = json.JSONDecoder().raw_decode(run.stdout.lstrip())
    mine = [s for s in statuses if s["sink_id"] == "users-mariadb"]
    assert mine and mine[0]["last_committed"] == 0 and not mine[0]["lingering"], statuses
    assert page.env[mp.ENV_URL] not in run.stdout + run.stderr and ":***@" in run.stdout


def check_metrics_postgres(page: Page, run: sn.Run) -> None:
    rows = sn.postgres_rows(page.conninfo, "SELECT id, twice FROM public.metered")
    sn.exact(rows, [(i, 2 * i) for i in range(250)], "public.metered after the metered job")
    doc = (ROOT / "docs" / "metrics.md").read_text()
    printed = doc.split("It prints the two series of the batch:", 1)[1].split("```")[1]
    assert run.stdout.split() == printed.split()[1:], run.stdout  # [1:]: the info string


def check_postgres_accounts(page: Page, run: sn.Run) -> None:
    rows = sn.postgres_rows(page.conninfo,
                            "SELECT id, seq, name, score FROM public.accounts ORDER BY id")
    # 1 updated, 2 deleted, 3 deleted and inserted again, 4 deleted though never seen
    sn.exact(rows, [(1, 4, "ada", 11), (3, 7, "cy", 31)], "public.accounts after the changes")


def check_postgres_profiles(page: Page, run: sn.Run) -> None:
    from datetime import timedelta

    rows = sn.postgres_rows(page.conninfo, "SELECT id, token::text, scores, tags, session, "
                            "mood::text FROM public.profiles")
    rows = [tuple(tuple(v) if isinstance(v, list) else v for v in r) for r in rows]
    sn.exact(rows, [(i, f"00000000-0000-4000-8000-{i:012d}", (i, None, 7), ("a", str(i)),
                     timedelta(days=i, seconds=90), ["sad", "ok", "happy"][i])
                    for i in range(3)], "public.profiles after the column types example")


def check_postgres_orders_savepoint(page: Page, run: sn.Run) -> None:
    rows = sn.postgres_rows(page.conninfo, "SELECT id, item FROM public.orders_sp")
    sn.exact(rows, [(i, f"item-{i}") for i in range(1000)],
             "public.orders_sp after the old query, its savepoint and the changed query")
    assert "savepoint of sink orders-sp" in run.stdout and "resumable: yes" in run.stdout, (
        run.stdout[-2000:])
    saved = json.loads((page.work / "orders-savepoint.json").read_text())
    assert saved["sink_id"] == "orders-sp" and saved["resumable"] is True, saved
    check_nothing_prepared(page, sn.postgres_rows(
        page.conninfo, "SELECT gid, database FROM pg_prepared_xacts"))


def check_postgres_status_json(page: Page, run: sn.Run) -> None:
    assert '"users-pg"' in run.stdout, f"status --json does not list users-pg:\n{run.stdout}"


def check_nothing_prepared(page: Page, rows: list[tuple[object, ...]]) -> None:
    """Nothing prepared in the page's database (``pg_prepared_xacts`` lists the whole
    server's, and other tests' drivers are killed beside this one)."""
    from psycopg.conninfo import conninfo_to_dict

    database = conninfo_to_dict(page.conninfo).get("dbname")
    assert database, "the page's conninfo names no database"
    mine = [row for row in rows if row[1] == database]
    assert mine == [], f"the monitoring query found prepared transactions: {mine}"


def check_kafka_orders(page: Page, run: sn.Run) -> None:
    from integration.support._kafka import read_all

    got = [(int((m.key or b"").decode()), int((m.value or b"").decode()))
           for m in read_all(page.bootstrap, page.topic)]
    sn.exact(got, [(i, i * 10) for i in range(1000)], f"topic {page.topic} after the job")


def check_consumer_output(page: Page, run: sn.Run) -> None:
    assert re.search(r"^1000 records$", run.stdout, re.M), run.stdout


def check_delta_merge(page: Page, run: sn.Run) -> None:
    changes = sn.delta_rows(page.work / "tables" / "changes")
    sn.exact([(r["user_id"], r["score"]) for r in changes],
             [(i % 100, i) for i in range(300)], "the appended Delta table")
    users = sn.delta_rows(page.work / "tables" / "users")
    sn.exact([(r["user_id"], r["score"]) for r in users],
             [(k, k + 200) for k in range(100)], "the merged Delta table")


def check_delta_cdc(page: Page, run: sn.Run) -> None:
    want = [(1, 3, "anna"), (2, 7, "bobby")]
    for name in ("customers", "mirror"):
        rows = sn.delta_rows(page.work / "tables" / name)
        assert all("op" not in r for r in rows), f"{name} stores op: {rows}"
        sn.exact([(r["id"], r["seq"], r["name"]) for r in rows], want, f"the {name} table")


def check_delta_overwrite(page: Page, run: sn.Run) -> None:
    recent = sn.delta_rows(page.work / "tables" / "recent")
    sn.exact([(r["day"], r["n"]) for r in recent],
             [("2026-01-01", n) for n in range(3)] + [("2026-01-02", 0)], "the recent table")
    daily = sn.delta_rows(page.work / "tables" / "daily")
    sn.exact([(r["day"], r["n"]) for r in daily],
             [("2026-01-01", n) for n in range(2)] + [("2026-01-02", n) for n in range(5)]
             + [("2026-01-03", 0)], "the daily table")


def _no_secret(page: Page, run: sn.Run) -> None:
    leaks = [n for n, s in enumerate(page.secrets) if s and s in run.stdout + run.stderr]
    assert not leaks, f"secrets #{leaks} of the page's services in the block's output"


def check_secure_payments(page: Page, run: sn.Run) -> None:
    _no_secret(page, run)
    assert "sslpassword=***" in run.stdout, run.stdout  # print(sink) masks the key's password
    rows = sn.postgres_rows(page.admin["postgres"], "SELECT id, name FROM secure.payments")
    sn.exact(rows, [(i, f"user-{i}") for i in range(300)], "secure.payments")
    left = sn.postgres_rows(page.admin["postgres"],
                            "SELECT gid FROM pg_prepared_xacts WHERE owner = 'eos_cert'")
    assert left == [], f"prepared transactions left: {left}"


def check_secure_status(page: Page, run: sn.Run) -> None:
    _no_secret(page, run)
    assert re.search(r"^secure-payments\s", run.stdout, re.M), run.stdout


def check_secure_orders(page: Page, run: sn.Run) -> None:
    from integration.support._kafka import read_all

    _no_secret(page, run)
    got = [json.loads(m.value or b"{}")["id"]
           for m in read_all(page.admin["kafka"], page.env["EOS_SECURE_TOPIC"])]
    sn.exact([(i,) for i in got], [(i,) for i in range(300)],
             "the secured topic after the Kafka source over SASL_SSL")


def check_submit_args(page: Page, run: sn.Run) -> None:
    """docs/spark-jars.md: the --packages line (Delta's coordinate, its two settings, no
    master) and the --jars list as JSON."""
    import shlex

    line, listed = [ln for ln in run.stdout.splitlines() if ln.strip()]
    args = shlex.split(line)
    assert args[0] == "--packages" and "--master" not in args, line
    coords = args[1].split(",")
    artifacts = [c.split(":")[1].split("_")[0] for c in coords]
    assert artifacts == ["delta-spark", "spark-sql-kafka-0-10"], coords
    assert "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension" in args
    jars = json.loads(listed)
    assert jars[0] == "--jars" and all(Path(j).is_file() for j in jars[1].split(","))


def no_target(page: Page, run: sn.Run) -> None:
    """A block that only defines code a later block of the page uses."""


@dataclass(frozen=True)
class Expect:
    """What the test checks after an executed block, and whether it first crashes it."""

    check: Callable[..., None]
    # CONNECTORS_CRASH_AT for a first run that must die by SIGKILL at that point; the block
    # then runs again and must finish.
    crash_first: str | None = None
    crash_sink: str | None = None


#: Every executed block, by (page, label): python blocks by the file name on their first
#: line, the others as <lang>#<n>. A block missing here fails the test.
EXPECT: dict[tuple[str, str], Expect] = {
    ("README.md", "quickstart_postgres.py"):
        Expect(check_postgres_events, "after_decision:batch=1", "events-pg"),
    ("README.md", "quickstart_postgres_datasource.py"):
        Expect(check_postgres_events_ds, "after_decision:batch=1", "events-pg-ds"),
    ("README.md", "quickstart_mariadb.py"):
        Expect(check_mariadb_events, "after_decision:batch=1", "events-mariadb"),
    ("README.md", "quickstart_kafka.py"):
        Expect(check_kafka_events, "before_decision:batch=1", "{topic}-kafka"),
    ("README.md", "quickstart_delta.py"): Expect(check_delta_events),
    ("README.md", "bash#0"): Expect(check_readme_cli),
    ("README.md", "my_sink.py"): Expect(no_target),
    ("README.md", "test_my_sink.py"): Expect(check_pytest_passed),
    ("docs/postgres.md", "upsert_postgres.py"): Expect(check_postgres_users),
    ("docs/postgres.md", "changes_postgres.py"):
        Expect(check_postgres_accounts, "after_decision:batch=0", "accounts-cdc"),
    ("docs/postgres.md", "column_types_postgres.py"): Expect(check_postgres_profiles),
    ("docs/postgres.md", "bash#0"): Expect(check_postgres_status_json),
    ("docs/postgres.md", "sql#0"): Expect(check_nothing_prepared),
    ("docs/mariadb.md", "upsert_mariadb.py"): Expect(check_mariadb_users),
    ("docs/mariadb.md", "changes_mariadb.py"):
        Expect(check_mariadb_accounts, "after_decision:batch=0", "accounts-mariadb-cdc"),
    ("docs/mariadb.md", "bash#0"): Expect(check_mariadb_status),
    ("docs/kafka.md", "kafka_batch_job.py"): Expect(check_kafka_orders),
    ("docs/kafka.md", "consume_orders.py"): Expect(check_consumer_output),
    ("docs/delta.md", "delta_merge.py"): Expect(check_delta_merge),
    ("docs/delta.md", "delta_cdc.py"): Expect(check_delta_cdc),
    ("docs/delta.md", "delta_overwrite.py"): Expect(check_delta_overwrite),
    ("docs/stopping.md", "graceful_stop.py"): Expect(check_delta_events),
    ("docs/savepoints.md", "savepoint_kafka_postgres.py"):
        Expect(check_postgres_orders_savepoint),
    ("docs/spark-jars.md", "bash#0"): Expect(check_submit_args),
    ("docs/fan-out.md", "fan_out.py"):
        Expect(check_fan_out, "after_decision:batch=1", "events-fan"),
    ("docs/connector-guide.md", "staged_files_sink.py"): Expect(no_target),
    ("docs/connector-guide.md", "slot_files_sink.py"): Expect(no_target),
    ("docs/connector-guide.md", "batch_file_sink.py"): Expect(no_target),
    ("docs/connector-guide.md", "test_guide_sinks.py"): Expect(check_each_family_passed),
    ("docs/metrics.md", "metrics_postgres.py"): Expect(check_metrics_postgres),
    ("docs/security.md", "secure_postgres.py"): Expect(check_secure_payments),
    ("docs/security.md", "bash#0"): Expect(check_secure_status),
    ("docs/security.md", "secure_kafka.py"): Expect(check_secure_orders),
}


# ------------------------------------------------------------------------ the inventory

BLOCKS = sn.parse_docs(ROOT)
CLASSIFIED = sn.classify(BLOCKS, RUN_BY_CI)
PAGES = sorted({b.doc for b in CLASSIFIED.of_kind(sn.EXECUTED)})


def test_every_block_is_run_credited_to_ci_or_illustrative() -> None:
    problems = list(CLASSIFIED.problems)
    labelled = {(b.doc, label) for b, label in sn.executed_labels(BLOCKS, CLASSIFIED.kinds)}
    for doc, label in sorted(labelled - EXPECT.keys()):
        problems.append(f"{doc}: executed block {label!r} has no entry in EXPECT (say what "
                        "the test reads back after it)")
    for doc, label in sorted(EXPECT.keys() - labelled):
        problems.append(f"EXPECT names {doc} {label!r}, which is no executed block")
    counts = CLASSIFIED.counts()
    print(f"\ndocs blocks: {counts}")
    for b in CLASSIFIED.of_kind(sn.ILLUSTRATIVE):
        print(f"  illustrative {b.where}: {b.illustrative}")
    assert not problems, "\n".join(problems)
    assert counts.get(sn.EXECUTED, 0) >= len(EXPECT)


def test_ci_runs_each_command_credited_to_it_verbatim() -> None:
    script = CI_SCRIPT.read_text(encoding="utf-8")
    credited = [(b, c) for b in CLASSIFIED.of_kind(sn.RUN_BY_CI) for c in sn.shell_commands(b.code)]
    missing = [f"{b.where}: {c!r} ({RUN_BY_CI[c]})" for b, c in credited
               if not sn.ci_script_runs(c, script)]
    assert not missing, ".ci/run does not run these lines of the docs verbatim:\n" + "\n".join(
        missing)
    unused = set(RUN_BY_CI) - {c for _, c in credited}
    assert not unused, f"RUN_BY_CI lists commands no page shows: {sorted(unused)}"
    # the README shows the two commands and the install line
    readme = {c for b, c in credited if b.doc == "README.md"}
    assert readme == set(RUN_BY_CI), f"the README shows {sorted(readme)}"


def _demo_verdict_keys() -> list[str]:
    """The keys of the verdict dict that ``connectors demo`` prints, in order."""
    tree = ast.parse((ROOT / "connectors" / "cli" / "_demo.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "verdict" for t in node.targets)):
            keys = [k.value for k in node.value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            assert len(keys) == len(node.value.keys), "a verdict key is not a string literal"
            return keys
    raise AssertionError("connectors/cli/_demo.py: no `verdict = {...}` found")


def test_readme_demo_output_has_the_demos_labels_and_layout() -> None:
    keys = _demo_verdict_keys()
    shown = [b for b in CLASSIFIED.of_kind(sn.NOT_RUN)
             if b.doc == "README.md" and re.search(r"^\s+verdict\s", b.code, re.M)]
    assert len(shown) == 1, f"expected one verdict block in the README, found {len(shown)}"
    lines = [ln for ln in shown[0].code.splitlines() if ln.strip()]
    width = max(len(k) for k in keys)
    labels, values = [], []
    for ln in lines:
        m = re.match(rf"^  (.{{{width}}})  (.*)$", ln)
        assert m is not None, f"README verdict line {ln!r} is not laid out as the demo prints"
        labels.append(m.group(1).rstrip())
        values.append(m.group(2))
    assert labels == keys, f"README verdict labels {labels} != the demo's {keys}"
    rendered = [f"  {k:<{width}}  {v}" for k, v in zip(keys, values, strict=True)]
    assert rendered == lines
    assert values[keys.index("verdict")] == "EXACTLY ONCE"
    # .ci/run's check of the demo's output accepts the README's last line
    assert re.match(r"^  verdict +EXACTLY ONCE$", lines[-1])


def test_classifier_refuses_what_is_not_accounted_for() -> None:
    """The rules above can fail: a page with each kind of unaccounted block."""
    page = "\n".join([
        "```", "no info string", "```",
        "```ruby", "puts 1", "```",
        "```bash", "bash scripts/test", "rm -rf build", "```",
        "Needs a cluster.", "<!-- illustrative: needs an S3 bucket -->", "```python",
        "# s3.py", "pass", "```",
        "```python", "print('no file name')", "```",
        *[f"Not run: needs host {i}.\n<!-- illustrative: needs host {i} -->\n```bash\n"
          f"ssh host{i}\n```" for i in range(4)],
    ])
    found = sn.classify(sn.parse_markdown(page, "README.md"), RUN_BY_CI)
    text = "\n".join(found.problems)
    for expected in ("info string ''", "info string 'ruby'", "mixes commands",
                     "must give the reason", "'# NAME.py", "5 illustrative blocks"):
        assert expected in text, f"no problem {expected!r} in:\n{text}"
    ok = sn.classify(sn.parse_markdown(
        "Not run: needs an S3 bucket.\n<!-- illustrative: needs an S3 bucket -->\n"
        "```bash\naws s3 ls\n```\n```bash\nbash scripts/demo  # the demo\n```\n"
        "```mermaid\nflowchart TD\n    a --> b\n```\n", "README.md"),
        RUN_BY_CI)
    assert not ok.problems and ok.counts() == {sn.ILLUSTRATIVE: 1, sn.RUN_BY_CI: 1,
                                               sn.NOT_RUN: 1}


# --------------------------------------------------------------------------- running pages


def _password(conninfo: str) -> str:
    if "://" in conninfo:
        return urlsplit(conninfo).password or ""
    m = re.search(r"password\s*=\s*(\S+)", conninfo)
    return m.group(1).strip("'") if m else ""


@pytest.fixture
def page_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Page]:
    doc = request.param
    codes = "".join(b.code for b in BLOCKS if b.doc == doc)
    cwd, work = tmp_path / "cwd", tmp_path / "work"
    cwd.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONNECTORS_CRASH", "EOS_POSTGRES", "EOS_KAFKA", "EOS_MARIADB",
                                "PYTEST_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["EOS_EXAMPLE_DIR"] = str(work)
    env["EOS_KAFKA_TOPIC"] = f"docs-{uuid.uuid4().hex[:10]}"
    env["PYTHONUNBUFFERED"] = "1"
    secrets: list[str] = []
    tag = uuid.uuid4().hex[:10]
    if "EOS_POSTGRES_TLS_CONNINFO" in codes or "EOS_KAFKA_SASL_CONFIG" in codes:
        yield from _secured_page(request, Page(doc, cwd, env, secrets), tag)
        return
    if "EOS_KAFKA_BOOTSTRAP" in codes:
        env["EOS_KAFKA_BOOTSTRAP"] = request.getfixturevalue("kafka_bootstrap")
    with contextlib.ExitStack() as databases:
        if mp.ENV_URL in codes:
            server = request.getfixturevalue("mariadb_url")
            secrets.append(mp.password_of(server))
            env[mp.ENV_URL] = databases.enter_context(
                mp.mariadb_database(server, f"eos_docs_{tag}"))
        if "EOS_POSTGRES_CONNINFO" in codes or any(b.lang == "sql" for b in BLOCKS
                                                   if b.doc == doc):
            server = request.getfixturevalue("postgres_conninfo")
            secrets.append(_password(server))
            env["EOS_POSTGRES_CONNINFO"] = databases.enter_context(
                fresh_database(server, f"eos_docs_{tag}"))
        yield Page(doc, cwd, env, secrets)


def _drop_secure_tables(admin: str) -> None:
    import psycopg

    from integration.support._pg import LEDGER_SUFFIXES

    names = ["payments", *(f"eos_ledger{s}" for s in LEDGER_SUFFIXES)]
    with psycopg.connect(admin, autocommit=True) as conn:
        for gid, in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE owner = 'eos_cert' "
                                 "AND gid LIKE '%secure-payments%'").fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
        for name in names:
            conn.execute(f"DROP TABLE IF EXISTS secure.{name}")


def _secured_page(request: pytest.FixtureRequest, page: Page, tag: str) -> Iterator[Page]:
    """docs/security.md: the secured listeners' settings in the variables the page reads,
    its topics made (and 300 input records), its tables dropped before and after."""
    from integration.services import secured as _secured
    from integration.support._kafka import KafkaTarget

    pg = request.getfixturevalue("pg_tls")
    kafka = request.getfixturevalue("kafka_sasl")
    page.env[_secured.ENV_POSTGRES_TLS_CONNINFO] = pg.cert_conninfo
    page.env[_secured.ENV_KAFKA_SASL_CONFIG] = json.dumps(kafka.config)
    page.env[_secured.ENV_KAFKA_SASL_READER_CONFIG] = json.dumps(kafka.reader_config)
    page.secrets.extend(_secured.SECRETS)
    page.admin.update(postgres=pg.admin_conninfo, kafka=kafka.plain_bootstrap)
    target = KafkaTarget(kafka.plain_bootstrap, "docs", partitions=2)
    target.topic = f"{_secured.SECURE_TOPIC_PREFIX}docs-{tag}"
    target.sink_id = f"{_secured.SECURE_PREFIX}-docs-{tag}"
    target.create()
    source = target.create(f"{_secured.SECURE_INPUT_PREFIX}docs-{tag}", partitions=2)
    target.produce_input(source, 300)
    page.env.update(EOS_SECURE_TOPIC=target.topic, EOS_SECURE_INPUT=source,
                    EOS_SECURE_SINK_ID=target.sink_id)
    _drop_secure_tables(pg.admin_conninfo)
    try:
        yield page
    finally:
        target.cleanup()
        _drop_secure_tables(pg.admin_conninfo)


def _crash_reached(log: Path, spec: str, sink: str) -> bool:
    point, batch = spec.split(":")[0], spec.split("batch=")[1].split(":")[0]
    lines = log.read_text().splitlines() if log.exists() else []
    return any(ln.startswith(f"{point} ") and f"sink={sink}" in ln.split()
               and f"batch={batch}" in ln.split() for ln in lines)


# ------------------------------------------------------------- one process for many blocks

#: The program that runs first on its page, before the blocks printed above it: it needs
#: jars the page's other programs do not (PySpark keeps the first session's JVM and class
#: path for the whole process), and it reads and writes nothing they touch.
RUN_FIRST: dict[str, str] = {
    "README.md": "quickstart_delta.py",  # Delta's jars; the others: components=[]
    "docs/security.md": "secure_kafka.py",  # Spark's Kafka source; secure_postgres: []
}

RUNNER = Path(__file__).with_name("_run_blocks.py")

Labelled = tuple[sn.Block, str]


@dataclass(frozen=True)
class Step:
    """One process of a page's run: python programs run one after the other in one
    interpreter (``_run_blocks.py``), or a single shell, SQL or pytest block. With
    ``crash``, the last program's first run: the process must die at its crash point, and
    that program runs again first in the next step."""

    blocks: tuple[Labelled, ...]
    crash: bool = False

    @property
    def programs(self) -> bool:
        return _is_program(*self.blocks[0])


def _is_program(block: sn.Block, label: str) -> bool:
    return block.lang == "python" and not (block.python_name or label).startswith("test_")


def spark_components(code: str) -> frozenset[str] | None:
    """The jars a program's Spark session asks for (``components=[...]``), or None when it
    starts no Spark."""
    from connectors.spark.jars._components import DEFAULT_COMPONENTS

    if "get_session(" not in code:
        return None
    m = re.search(r"get_session\([^)]*components=\[([^\]]*)\]", code)
    return frozenset(re.findall(r"[\"'](\w+)[\"']", m.group(1)) if m else DEFAULT_COMPONENTS)


def page_plan(doc: str) -> list[Step]:
    """The processes that run a page's executed blocks, in order. Consecutive programs
    share a process (one Spark driver JVM) unless a program needs jars that the JVM's first
    session did not ask for; a shell, SQL or pytest block runs alone, after every block above
    it; a program to be SIGKILLed first ends its process, and its second run starts the
    next one."""
    labelled = sn.executed_labels([b for b in BLOCKS if b.doc == doc], CLASSIFIED.kinds)
    if doc in RUN_FIRST:
        first = [x for x in labelled if x[1] == RUN_FIRST[doc]]
        assert len(first) == 1, f"RUN_FIRST names {RUN_FIRST[doc]!r}: no such block of {doc}"
        labelled = first + [x for x in labelled if x not in first]
    steps: list[Step] = []
    group: list[Labelled] = []
    jvm: frozenset[str] | None = None  # what the group's JVM was started with

    def close() -> None:
        nonlocal group, jvm
        if group:
            steps.append(Step(tuple(group)))
        group, jvm = [], None

    for block, label in labelled:
        if not _is_program(block, label):
            close()
            steps.append(Step(((block, label),)))
            continue
        need = spark_components(block.code)
        if need is not None and jvm is not None and not need <= jvm:
            close()
        if need is not None and jvm is None:
            jvm = need
        group.append((block, label))
        if EXPECT[(doc, label)].crash_first is not None:
            steps.append(Step(tuple(group), crash=True))
            group, jvm = [(block, label)], need
    close()
    return steps


def _crash_env(page: Page, expect: Expect, label: str) -> tuple[dict[str, str], Path, str]:
    sink = (expect.crash_sink or "").format(topic=page.topic)
    log = page.cwd / f"{label}.crash-log"
    env = {"CONNECTORS_CRASH_AT": f"{expect.crash_first}:sink={sink}",
           "CONNECTORS_TEST_MODE": "1", "CONNECTORS_CRASH_LOG": str(log)}
    return env, log, sink


def _split_output(run: sn.Run, names: list[str]) -> dict[str, tuple[str, float | None]]:
    """What each block printed on stdout, and its seconds when it finished."""
    from integration.docs._run_blocks import END, START

    out: dict[str, tuple[str, float | None]] = {}
    current: str | None = None
    lines: list[str] = []
    for line in run.stdout.splitlines(keepends=True):
        if line.startswith(START + " "):
            current, lines = line.split()[1], []
            out[current] = ("", None)
        elif line.startswith(END + " ") and current is not None:
            out[current] = ("".join(lines), float(line.split()[2]))
            current = None
        elif current is not None:
            lines.append(line)
            out[current] = ("".join(lines), None)
    assert list(out) == names[:len(out)], f"the runner ran {list(out)}, not {names}"
    return out


def _run_programs(page: Page, step: Step) -> None:
    names = [block.python_name or label for block, label in step.blocks]
    env = dict(page.env)
    crash: tuple[str, Path, str] | None = None
    for (block, _), name in zip(step.blocks, names, strict=True):
        (page.cwd / name).write_text(block.code, encoding="utf-8")
    if step.crash:  # armed for the whole process, for the last program's sink only
        label = step.blocks[-1][1]
        expect = EXPECT[(page.doc, label)]
        assert expect.crash_first is not None
        crash_env, log, sink = _crash_env(page, expect, label)
        env.update(crash_env)
        crash = (expect.crash_first, log, sink)
    args = [sys.executable, str(RUNNER), *names]
    run = sn.run(args, cwd=page.cwd, env=env, timeout=BLOCK_TIMEOUT * len(names))
    parts = _split_output(run, names)
    where = ", ".join(f"{b.where} ({label})" for b, label in step.blocks)
    finished = [n for n in names if n in parts and parts[n][1] is not None]
    if crash is not None:
        spec, log, sink = crash
        assert run.returncode == -9 and finished == names[:-1], (
            f"{where}: the last was to be SIGKILLed at {spec} after the others finished; "
            f"finished: {finished}\n" + run.tail(page.secrets))
        assert _crash_reached(log, spec, sink), log.read_text()
    else:
        assert run.returncode == 0 and finished == names, (
            f"{where}: failed (finished: {finished}):\n" + run.tail(page.secrets))
    for (block, label), name in zip(step.blocks, names, strict=True):
        stdout, seconds = parts.get(name, ("", None))
        if seconds is None:
            print(f"{block.where} {label}: SIGKILLed at {crash[0] if crash else '?'} "
                  f"(process of {len(names)} programs, {run.seconds:.1f} s)")
            continue
        print(f"{block.where} {label}: finished after {seconds:.1f} s "
              f"(process of {len(names)} programs)")
        EXPECT[(page.doc, label)].check(
            page, sn.Run(args, 0, stdout, run.stderr, seconds))


def _run_single(page: Page, block: sn.Block, label: str) -> None:
    expect = EXPECT[(page.doc, label)]
    if block.lang == "sql":
        expect.check(page, sn.postgres_rows(page.conninfo, block.code))
        return
    if block.lang == "python":
        name = block.python_name or label
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name]
    else:
        name = label.replace("#", "_") + ".sh"
        args = ["bash", "-euo", "pipefail", name]
    (page.cwd / name).write_text(block.code, encoding="utf-8")
    result = sn.run(args, cwd=page.cwd, env=page.env, timeout=BLOCK_TIMEOUT)
    print(f"{block.where} {label}: exit {result.returncode} after {result.seconds:.1f} s")
    assert result.returncode == 0, f"{block.where} ({label}) failed:\n" + result.tail(
        page.secrets)
    expect.check(page, result)


def test_page_plans_share_drivers_and_run_every_block() -> None:
    """The plan runs every executed block to its end once (a crashed program twice), each
    program SIGKILLed first is the last of its process, and no process starts Spark with
    fewer jars than one of its programs asks for."""
    for doc in PAGES:
        plan = page_plan(doc)
        ran = [label for step in plan for k, (_, label) in enumerate(step.blocks)
               if not (step.crash and k == len(step.blocks) - 1)]
        labels = [label for _, label in sn.executed_labels(
            [b for b in BLOCKS if b.doc == doc], CLASSIFIED.kinds)]
        assert sorted(ran) == sorted(labels), f"{doc}: {ran} != {labels}"
        for step in plan:
            needs = [n for b, _ in step.blocks if (n := spark_components(b.code)) is not None]
            assert all(n <= needs[0] for n in needs), f"{doc}: {step}"
            assert step.programs or len(step.blocks) == 1
    drivers = [s for s in page_plan("README.md")
               if any(spark_components(b.code) is not None for b, _ in s.blocks)]
    assert len(drivers) == 5, drivers  # 4 kills, then the last program's second run


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("page_env", PAGES, indirect=True)
def test_page_blocks_run_and_write_exactly_once(page_env: Page) -> None:
    page = page_env
    for step in page_plan(page.doc):
        if step.programs:
            _run_programs(page, step)
        else:
            _run_single(page, *step.blocks[0])
