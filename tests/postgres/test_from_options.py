"""PostgresSink from the DataSource form's text options (no server needed)."""

from __future__ import annotations

import pytest

from connectors.core.errors import ConfigurationError
from connectors.core.templates.options import Options
from connectors.postgres import PostgresSink

BASE = {"conninfo": "postgresql://app@db:5432/prod", "table": "public.events",
        "sink_id": "events"}


def test_the_options_are_the_keyword_arguments_as_text() -> None:
    sink = PostgresSink.from_options(Options({
        **BASE, "password": "s3cret-pw", "create_table": "true", "keep_batches": "50",
        "connect_timeout": "3", "ledger_table": "ops.ledger"}))
    assert sink.conninfo.password == "s3cret-pw"
    assert sink.options.create_table and sink.options.connect_timeout == 3
    assert sink.keep_batches == 50 and str(sink.options.ledger_table) == "ops.ledger"
    assert "s3cret-pw" not in repr(sink) and "s3cret-pw" not in str(sink.conninfo)


def test_key_columns_are_comma_separated() -> None:
    sink = PostgresSink.from_options(Options({**BASE, "mode": "upsert",
                                              "key_columns": "id, region"}))
    assert list(sink.options.key_columns) == ["id", "region"]


def test_a_bad_value_is_refused_without_quoting_a_secret() -> None:
    with pytest.raises(ConfigurationError) as bad:
        PostgresSink.from_options(Options({**BASE, "conninfo": "host=db password=s3cret-pw x",
                                           "password": "other-pw"}))
    assert "s3cret-pw" not in str(bad.value) and "other-pw" not in str(bad.value)
    with pytest.raises(ConfigurationError, match="mode"):
        PostgresSink.from_options(Options({**BASE, "mode": "merge"}))
