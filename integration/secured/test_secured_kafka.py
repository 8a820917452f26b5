"""KafkaSink over SASL_SSL (SCRAM-SHA-512) with ACLs: killed drivers, refused access, secrets.

The sink's user ``eos_sink`` holds exactly the ACLs docs/kafka.md section 7 lists (for
sink ids ``secure*`` and topics ``secure.*``); Spark's Kafka source reads as
``eos_reader`` (READ and DESCRIBE on ``secure-in.*``). The drivers
(``examples/stream_to_kafka.py``) take both configs from environment variables, never
from arguments. The refused-access cases each use a user of their own lacking one ACL (or
unknown to the broker): a clear error naming what to grant, nothing visible to a
``read_committed`` consumer, and the same batch exact once the ACL is added. Every output
is searched for every secret of the secured services.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors import ConfigurationError
from connectors.kafka import KafkaSink
from connectors.sdk import CrashPoint
from integration.services import secured as _secured
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    kill_at_random,
    reached,
    run_cli,
)
from integration.support._fixtures_secured import KafkaSasl, grep_secrets
from integration.support._kafka import KafkaTarget, _admin, ledger_batches, open_transactions

pytestmark = [pytest.mark.integration]

ROWS = 300
SLOTS = 2


def _target(kafka_sasl: KafkaSasl, name: str) -> KafkaTarget:
    """A target whose names fall under the least-privilege user's ACLs; checks and
    clean-up run over PLAINTEXT (a super user)."""
    target = KafkaTarget(kafka_sasl.plain_bootstrap, prefix=name, partitions=SLOTS)
    target.topic = kafka_sasl.topic(name)
    target.sink_id = kafka_sasl.sink_id(name)
    return target


class SaslJob(KillJob):
    """Spark's Kafka source over SASL_SSL (reader) into KafkaSink over SASL_SSL (sink)."""

    module = "examples.stream_to_kafka"

    def __init__(self, root: Path, target: KafkaTarget, kafka_sasl: KafkaSasl,
                 total: int = 1200) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.target = target
        self.kafka_sasl = kafka_sasl
        self.total = total
        self.input_topic = target.create(kafka_sasl.input_topic("src"), partitions=2)
        target.produce_input(self.input_topic, total)
        self.outputs: list[str] = []

    def args(self) -> list[str]:
        return ["--source", "kafka", "--input-topic", self.input_topic,
                "--max-offsets-per-trigger", "300",
                "--input-kafka-config-env", _secured.ENV_KAFKA_SASL_READER_CONFIG,
                "--checkpoint", str(self.checkpoint), "--topic", self.target.topic,
                "--sink-id", self.target.sink_id, "--bootstrap", self.kafka_sasl.bootstrap,
                "--kafka-config-env", _secured.ENV_KAFKA_SASL_CONFIG,
                "--slots", str(SLOTS), "--small-batch-rows", "0"]

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        result = super().run(*extra, **kwargs)
        self.outputs.append(result.output)
        return result

    def ledger(self) -> dict[int, str]:
        return ledger_batches(self.target.bootstrap, self.target.ledger_topic)


def _ok(run: DriverRun) -> None:
    assert run.returncode == 0, run.tail()


def test_sasl_ssl_source_and_sink_killed_at_crash_point_and_at_random_are_exact(
    tmp_path: Path, kafka_sasl: KafkaSasl, secrets_env: dict[str, Any]
) -> None:
    """Kafka source to KafkaSink, both over SASL_SSL as least-privilege users: SIGKILL at
    before_decision (batch 1: every slot committed, the ledger not told), then at a
    random moment; the topic ends exact."""
    target = _target(kafka_sasl, "kill")
    target.create()
    try:
        job = SaslJob(tmp_path, target, kafka_sasl)
        first = job.run(crash=f"{CrashPoint.BEFORE_DECISION.value}:batch=1")
        assert first.returncode == -9, first.tail()
        assert job.reached(CrashPoint.BEFORE_DECISION, 1), reached(job.crash_log)
        kill_at_random(job, progress=lambda: len(job.ledger()), runs=1, max_delay=1.5,
                       seed=SEED, check=_ok)
        target.assert_exact(job.total)
        assert set(job.ledger().values()) == {"COMMITTED"}, job.ledger()
        # The operator CLI over SASL_SSL as the sink's user, its config from the variable.
        code, status, err = run_cli("status", "--kafka-config-env",
                                    _secured.ENV_KAFKA_SASL_CONFIG, "--sink-id", target.sink_id)
        assert code == 0, (status, err)
        assert target.sink_id in json.dumps(status), status
        leaks = grep_secrets(*job.outputs, json.dumps(status), err, paths=(job.root,))
        assert not leaks, f"secrets in the output: {leaks}"
    finally:
        target.cleanup()


# ------------------------------------------------------------------- refused access


def _rows(spark: Any, n: int = ROWS) -> Any:
    from pyspark.sql import functions as sf

    return spark.range(n).select(sf.col("id").cast("string").alias("key"),
                                 sf.to_json(sf.struct(sf.col("id"))).alias("value"))


def _nothing_visible(target: KafkaTarget) -> None:
    existing = set(_admin(target.bootstrap).list_topics(timeout=30).topics)
    if target.topic in existing:
        assert target.messages() == [], "a read_committed consumer sees a refused batch"
        assert not open_transactions(target.bootstrap, [target.topic])
    if target.ledger_topic in existing:
        assert ledger_batches(target.bootstrap, target.ledger_topic) == {}


@pytest.fixture
def refused(kafka_sasl: KafkaSasl) -> Iterator[KafkaTarget]:
    target = _target(kafka_sasl, "acl")
    target.create()
    yield target
    target.cleanup()


def _user(kafka_sasl: KafkaSasl, target: KafkaTarget, missing: set[tuple[str, str, str]]
          ) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """A new SCRAM user with the sink's ACLs for ``target`` except the ``missing``
    (resource type, name, operation) ones; its config and the ACLs it lacks."""
    user, password = f"u{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
    acls = _secured.sink_acls(user, target.sink_id, target.topic)
    assert missing <= set(acls), (missing, acls)
    kept = [a for a in acls if a not in missing]
    kafka_sasl.add_user(user, password, kept)
    lacking = [a for a in acls if a in missing]
    return kafka_sasl.user_config(user, password), lacking


def _grant(kafka_sasl: KafkaSasl, config: dict[str, str],
           acls: list[tuple[str, str, str]]) -> None:
    kafka_sasl.add_user(config["sasl.username"], config["sasl.password"], acls)


def _run_refused(spark: Any, target: KafkaTarget, config: dict[str, str],
                 capfd: pytest.CaptureFixture[str], *expected: str) -> str:
    sink = KafkaSink(target.topic, config, sink_id=target.sink_id, slots=SLOTS,
                     operation_timeout=10, small_batch_rows=0)
    with pytest.raises(ConfigurationError) as info:
        sink(_rows(spark), 0)
    text = str(info.value)
    for words in expected:
        assert words in text, text
    _nothing_visible(target)
    out, err = capfd.readouterr()
    leaks = grep_secrets(text, repr(sink), out, err) + (
        [f"the user's password in {text!r}"] if config["sasl.password"] in text + out + err
        else [])
    assert not leaks, leaks
    return text


def _exact_after_fix(spark: Any, target: KafkaTarget, config: dict[str, str]) -> None:
    sink = KafkaSink(target.topic, config, sink_id=target.sink_id, slots=SLOTS,
                     small_batch_rows=0)
    sink(_rows(spark), 0)
    target.assert_exact(ROWS)
    # Over SASL_SSL too, the slots ran on the producer CONNECTORS_KAFKA_PRODUCER picks
    # (auto: the owned librdkafka handle).
    metrics = sink.last_metrics
    assert metrics is not None
    owned = os.environ.get("CONNECTORS_KAFKA_PRODUCER", "auto") != "confluent"
    assert (metrics.extra["produce_owned_rows"] == ROWS) is owned, metrics.extra


def test_unknown_scram_user_names_the_credentials(
    spark: Any, refused: KafkaTarget, kafka_sasl: KafkaSasl, capfd: pytest.CaptureFixture[str]
) -> None:
    stranger = kafka_sasl.user_config("nobody-" + uuid.uuid4().hex[:6], "Unknown-Pass-33z")
    _run_refused(spark, refused, stranger, capfd, "refused authentication", "sasl.username",
                 "sasl.password")
    _exact_after_fix(spark, refused, kafka_sasl.config)


def test_acl_denying_the_transactional_id_names_the_acl(
    spark: Any, refused: KafkaTarget, kafka_sasl: KafkaSasl, capfd: pytest.CaptureFixture[str]
) -> None:
    txn = f"eos1|{refused.sink_id}"
    config, lacking = _user(kafka_sasl, refused, {("TRANSACTIONAL_ID", txn, "WRITE"),
                                                  ("TRANSACTIONAL_ID", txn, "DESCRIBE")})
    _run_refused(spark, refused, config, capfd, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
                 f"eos1|{refused.sink_id}|")
    _grant(kafka_sasl, config, lacking)
    _exact_after_fix(spark, refused, config)


def test_acl_denying_write_to_the_output_topic_names_the_acl(
    spark: Any, refused: KafkaTarget, kafka_sasl: KafkaSasl, capfd: pytest.CaptureFixture[str]
) -> None:
    config, lacking = _user(kafka_sasl, refused, {("TOPIC", refused.topic, "WRITE")})
    _run_refused(spark, refused, config, capfd, "TOPIC_AUTHORIZATION_FAILED", "WRITE",
                 refused.topic)
    _grant(kafka_sasl, config, lacking)
    _exact_after_fix(spark, refused, config)


def test_acl_denying_creation_of_the_internal_topics_names_the_acl_or_precreation(
    spark: Any, refused: KafkaTarget, kafka_sasl: KafkaSasl, capfd: pytest.CaptureFixture[str]
) -> None:
    internal = f"_connectors.{refused.sink_id}"
    config, lacking = _user(kafka_sasl, refused, {("TOPIC", internal, "CREATE")})
    _run_refused(spark, refused, config, capfd, "CREATE on topic",
                 f"_connectors.{refused.sink_id}.", "pre-create it")
    _grant(kafka_sasl, config, lacking)
    _exact_after_fix(spark, refused, config)


def test_the_sasl_config_of_the_services_is_a_json_object(kafka_sasl: KafkaSasl) -> None:
    assert kafka_sasl.config["security.protocol"] == "SASL_SSL"
    assert json.loads(json.dumps(kafka_sasl.config)) == kafka_sasl.config


def test_without_describe_configs_a_too_long_transaction_timeout_is_still_named(
    spark: Any, refused: KafkaTarget, kafka_sasl: KafkaSasl, capfd: pytest.CaptureFixture[str]
) -> None:
    """The sink's ACLs hold no DESCRIBE_CONFIGS: the driver cannot read the broker's
    transaction.max.timeout.ms (a warning names the ACL), so the producers' start refuses
    a longer transaction.timeout.ms, in a ConfigurationError naming both settings."""
    config, _ = _user(kafka_sasl, refused, set())
    long = {**config, "transaction.timeout.ms": "3600000"}
    _run_refused(spark, refused, long, capfd, "transaction.max.timeout.ms")
    _exact_after_fix(spark, refused, config)
