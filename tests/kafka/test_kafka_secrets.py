"""No secret of a Kafka client config anywhere: every secret key x every form x every output.

Keys: librdkafka's sensitive properties, the Java client's as Spark takes them
(``kafka.``-prefixed), and keys the rule catches by name. Forms: a dict (the sink's
``config``), the CLI's ``--kafka-config-file`` and ``--kafka-config-env`` as properties
lines and as JSON; ``--kafka-config KEY=VALUE`` is refused. Outputs: repr/str of the config
and the sink, a translated client error quoting the value, log records, the CLI's human and
``--json`` runs (no broker: the target's first call fails as an authentication failure).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.cli import main
from connectors.cli._kafka_target import KafkaTarget
from connectors.core.errors import ConfigurationError
from connectors.kafka import KafkaConfig, KafkaSink
from connectors.kafka._errors import translate
from connectors.kafka._redact import SECRET_KEYS, is_secret_key, redact_text

ONE, TWO = "Alpha9Zq", "Beta7Wk"
VALUE = f'{ONE} {TWO}"x'
JAVA = ["sasl.jaas.config", "ssl.truststore.password", "ssl.keystore.password",
        "ssl.key.password", "ssl.keystore.key"]
KEYS = sorted({*SECRET_KEYS, *(f"kafka.{k}" for k in JAVA), "ssl.certificate.pem",
               "ssl.ca.pem", "sasl.oauthbearer.assertion.private.key.passphrase",
               "my.plugin.token", "SASL.PASSWORD"})
NOT_SECRET = ["bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username",
              "ssl.key.location", "ssl.keystore.location", "ssl.certificate.location",
              "sasl.kerberos.keytab", "sasl.oauthbearer.client.id",
              "sasl.oauthbearer.client.credentials.client.id", "kafka.bootstrap.servers",
              "sasl.oauthbearer.token.endpoint.url", "linger.ms"]
BASE = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL"}


def assert_clean(text: str) -> None:
    assert ONE not in text and TWO not in text, text


@pytest.mark.parametrize("key", KEYS)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", NOT_SECRET)
def test_keys_that_show(key: str) -> None:
    assert not is_secret_key(key)
    assert KafkaConfig({**BASE, key: "shown-value"}).redacted()[key] == "shown-value"


def _client_error(config: KafkaConfig, key: str) -> Exception:
    err = KafkaError(KafkaError._AUTHENTICATION,
                     f"failed: {key}={VALUE} (also {json.dumps({key: VALUE})}, bare {VALUE})")
    return translate(KafkaException(err), doing="listing topics", secrets=config.secrets,
                     bootstrap=config.bootstrap)


@pytest.mark.parametrize("key", KEYS)
class TestEveryOutput:
    def test_dict_config_and_sink(self, key: str, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG)
        config = KafkaConfig({**BASE, key: VALUE})
        sink = KafkaSink("t", {**BASE, key: VALUE}, sink_id="s")
        assert config[key] == VALUE and VALUE in config.secrets
        for text in (repr(config), str(config), repr(config.redacted()), repr(sink),
                     str(sink), repr(sink.options)):
            assert_clean(text)
        logging.getLogger("connectors.kafka").info("sink %r config %s", sink, config)
        assert_clean(caplog.text)

    def test_translated_error_and_redact(self, key: str) -> None:
        config = KafkaConfig({**BASE, key: VALUE})
        assert_clean(str(_client_error(config, key)))
        assert_clean(config.redact(f"{key}: {VALUE}"))
        # Without the value, its key=value (up to a space) and "key": "value" forms go.
        assert_clean(redact_text(f"{key}={ONE}-{TWO}; {json.dumps({key: VALUE})}", []))

    def test_kafka_config_argument_refuses_it(self, key: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["status", "--kafka", "127.0.0.1:1", "--kafka-config",
                     f"{key}={VALUE}"]) == 2
        err = capsys.readouterr().err
        assert f"--kafka-config {key}=... would put a secret" in err
        assert "--kafka-config-file" in err and "--kafka-config-env" in err
        assert_clean(err)

    @pytest.mark.parametrize("form", ["properties", "json"])
    @pytest.mark.parametrize("how", ["file", "env"])
    @pytest.mark.parametrize("as_json", [False, True])
    def test_cli(self, key: str, form: str, how: str, as_json: bool, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                 caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG)
        settings = {**BASE, key: VALUE}
        text = (json.dumps(settings) if form == "json" else
                "# client.properties\n" + "".join(f"{k}={v}\n" for k, v in settings.items()))
        if how == "file":
            (tmp_path / "client").write_text(text)
            flags = ["--kafka-config-file", str(tmp_path / "client")]
        else:
            monkeypatch.setenv("EOS_TEST_KAFKA", text)
            flags = ["--kafka-config-env", "EOS_TEST_KAFKA"]
        seen: list[KafkaConfig] = []

        def refuse(target: KafkaTarget) -> list[str]:
            seen.append(target.admin.config)
            raise _client_error(target.admin.config, key)

        monkeypatch.setattr(KafkaTarget, "sink_ids", refuse)
        code = main(["-v", "status", *flags, *(["--json"] if as_json else [])])
        out, err = capsys.readouterr()
        assert code == 2 and "refused authentication" in err, err
        assert seen and seen[0][key] == VALUE and seen[0].bootstrap == "127.0.0.1:1"
        assert_clean(out + err)
        assert_clean(caplog.text)
        assert_clean(KafkaTarget(seen[0].bootstrap, dict(seen[0])).describe())


def test_later_sources_win_and_bootstrap_may_come_from_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors.cli._inputs import kafka_settings

    (tmp_path / "f").write_text("linger.ms=1\n! comment\n\nacks.x = 2\n")
    monkeypatch.setenv("EOS_TEST_KAFKA", json.dumps({"linger.ms": 3, "batch.size": 9}))
    got: dict[str, Any] = kafka_settings(["batch.size=7"], env="EOS_TEST_KAFKA",
                                         file=str(tmp_path / "f"))
    assert got == {"linger.ms": 3, "acks.x": "2", "batch.size": "7"}


def test_errors_name_the_flag_and_variable_or_file_never_the_content(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("EOS_TEST_NOPE", raising=False)
    assert main(["status", "--kafka-config-env", "EOS_TEST_NOPE"]) == 2
    assert "--kafka-config-env EOS_TEST_NOPE: the environment variable EOS_TEST_NOPE" in (
        capsys.readouterr().err)
    missing = tmp_path / "missing"
    assert main(["status", "--kafka-config-file", str(missing)]) == 2
    assert f"--kafka-config-file {missing}: cannot read" in capsys.readouterr().err
    for name, text in (("props", f"sasl.password={VALUE}\n{ONE}{TWO}\n"),
                       ("json", f'{{"sasl.password": "{VALUE}", {ONE}}}')):
        (tmp_path / name).write_text(text)
        assert main(["status", "--kafka-config-file", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert f"--kafka-config-file {tmp_path / name}" in err
        assert_clean(err)
    (tmp_path / "nobootstrap").write_text("linger.ms=5\n")
    assert main(["status", "--kafka-config-file", str(tmp_path / "nobootstrap")]) == 2
    assert "--kafka BOOTSTRAP is missing" in capsys.readouterr().err


def test_metrics_carry_numbers_and_names_only() -> None:
    """A batch's metrics (logged, kept on the sink) have no field a config value could
    reach: ids and a family, counts and timings, and numeric extras (the tasks' figures
    too)."""
    from dataclasses import fields

    from connectors.core.metrics import BatchMetrics

    kinds = {f.name: f.type for f in fields(BatchMetrics)}
    # path: the name of a write path from the sink's own fixed set (native, batch, record)
    assert {n for n, t in kinds.items() if t == "str"} == {"sink_id", "family", "outcome",
                                                             "path"}
    assert kinds["extra"] == "dict[str, float]"
    assert kinds["task_figures"] == "list[Mapping[str, float]]"
    assert all(t in ("int", "float", "str", "dict[str, float]", "list[Mapping[str, float]]")
               for t in kinds.values())


def test_short_values_go_where_they_have_a_key() -> None:
    config = KafkaConfig({**BASE, "sasl.password": "pw1"})
    assert config.redacted()["sasl.password"] == "***"
    assert config.redact("sasl.password=pw1") == "sasl.password=***"
    with pytest.raises(ConfigurationError):
        KafkaConfig({"sasl.password": "pw1"})  # no bootstrap: the message names no value
