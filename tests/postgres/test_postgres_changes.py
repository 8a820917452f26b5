"""``PostgresSink(mode="changes")`` without a server: its options (the generic checks
are :func:`connectors.core.changes.check_change_options`, tested with the rest of the core
module in tests/core/test_changes.py). The SQL runs in
integration/postgres/test_postgres_changes.py."""

from __future__ import annotations

from typing import Any

import pytest

from connectors import ConfigurationError
from connectors.postgres import PostgresSink
from connectors.postgres._config import PostgresOptions, TableName


def options(**kw: Any) -> PostgresOptions:
    base: dict[str, Any] = {"table": TableName("public", "t"), "mode": "changes",
                            "key_columns": ("id",), "op_column": "op",
                            "sequence_column": "seq"}
    base.update(kw)
    return PostgresOptions(**base)


class TestOptions:
    def test_changes_mode_is_accepted(self) -> None:
        sink = PostgresSink("postgresql://db/x", "t", sink_id="s", mode="changes",
                            key_columns=["id"], op_column="op", sequence_column="seq")
        assert sink.options.op_column == "op" and sink.options.sequence_column == "seq"

    @pytest.mark.parametrize("kw,needle", [
        ({"key_columns": ()}, "needs key_columns"),
        ({"op_column": None}, "needs op_column"),
        ({"sequence_column": None}, "sequence_column"),
        ({"sequence_column": "op"}, "both 'op'"),
        ({"op_column": "id"}, "op_column 'id' is one of key_columns"),
        ({"sequence_column": "id"}, "sequence_column 'id' is one of key_columns"),
        ({"op_column": ""}, "op_column must be a non-empty string"),
        ({"sequence_column": "a\x00b"}, "NUL"),
    ])
    def test_bad_changes_options_name_the_fix(self, kw: dict[str, Any], needle: str) -> None:
        with pytest.raises(ConfigurationError, match=needle):
            options(**kw)

    @pytest.mark.parametrize("mode", ["append", "upsert"])
    def test_op_and_sequence_only_with_changes(self, mode: str) -> None:
        keys = ["id"] if mode == "upsert" else None
        with pytest.raises(ConfigurationError, match="only apply to mode='changes'"):
            PostgresSink("postgresql://db/x", "t", sink_id="s", mode=mode,  # type: ignore[arg-type]
                         key_columns=keys, op_column="op")
        with pytest.raises(ConfigurationError, match="sequence_column only apply"):
            PostgresSink("postgresql://db/x", "t", sink_id="s", mode=mode,  # type: ignore[arg-type]
                         key_columns=keys, sequence_column="seq")

    def test_unknown_mode_lists_the_modes(self) -> None:
        with pytest.raises(ConfigurationError, match="'changes'"):
            PostgresSink("postgresql://db/x", "t", sink_id="s", mode="cdc")  # type: ignore[arg-type]
