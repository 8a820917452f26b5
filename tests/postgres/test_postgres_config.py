"""PostgresSink configuration and type planning (no server needed; errors: test_postgres_errors)."""

from __future__ import annotations

import pickle
from typing import ClassVar

import pyarrow as pa
import pytest

from connectors import (
    BadInputError,
    ConfigurationError,
    DependencyError,
)
from connectors._deps import require
from connectors.postgres import Conninfo, PostgresSink
from connectors.postgres._config import TableName, redact
from connectors.postgres._pgtypes import PgType
from connectors.postgres._types import Column, ddl_type, plan_write

SECRET = "S3cr3t-pa55"


def col(name: str, typname: str, formatted: str | None = None, *, not_null: bool = False,
        default: bool = False) -> Column:
    return Column(name, typname, formatted or typname, not_null, default)


class TestConninfo:
    @pytest.mark.parametrize("raw", [
        f"postgresql://app:{SECRET}@db:5432/prod",
        f"host=db user=app password={SECRET} dbname=prod",
        f"host=db user=app password='{SECRET}' dbname=prod",
    ])
    def test_password_never_in_str_or_repr(self, raw: str) -> None:
        info = Conninfo(raw)
        assert SECRET not in str(info) and SECRET not in repr(info)
        assert info.password == SECRET and info.secret == raw

    def test_invalid_conninfo_message_does_not_echo_it(self) -> None:
        with pytest.raises(ConfigurationError) as err:
            Conninfo(f"host=db password={SECRET} nonsense")
        assert SECRET not in str(err.value)

    def test_redact_masks_password_everywhere(self) -> None:
        text = f"failed for postgresql://u:{SECRET}@h/db (password={SECRET})"
        assert SECRET not in redact(text, [SECRET])


class TestSinkConstruction:
    def test_repr_and_pickle_hide_the_password(self) -> None:
        sink = PostgresSink(f"postgresql://app:{SECRET}@db/prod", "public.events", sink_id="ev")
        assert SECRET not in repr(sink)
        clone = pickle.loads(pickle.dumps(sink))
        assert clone.conninfo.password == SECRET  # executors need it to connect
        assert clone._db is None

    def test_upsert_needs_key_columns(self) -> None:
        with pytest.raises(ConfigurationError, match="key_columns"):
            PostgresSink("postgresql://db/x", "t", sink_id="s", mode="upsert")

    def test_key_columns_only_for_upsert(self) -> None:
        with pytest.raises(ConfigurationError, match="upsert"):
            PostgresSink("postgresql://db/x", "t", sink_id="s", key_columns=["id"])

    def test_bad_lock_timeout_is_refused(self) -> None:
        with pytest.raises(ConfigurationError, match="lock_timeout"):
            PostgresSink("postgresql://db/x", "t", sink_id="s", lock_timeout="1; drop")

    def test_sink_id_is_required_and_validated(self) -> None:
        with pytest.raises(ConfigurationError, match="sink_id"):
            PostgresSink("postgresql://db/x", "t", sink_id="bad id")


class TestTableName:
    def test_defaults_to_public(self) -> None:
        assert TableName.parse("events") == TableName("public", "events")

    def test_injection_is_just_a_name(self) -> None:
        name = TableName.parse('x"; drop table y; --')
        assert name.schema == "public" and name.name == 'x"; drop table y; --'
        assert name.sql().as_string(None) == '"public"."x""; drop table y; --"'


class TestWritePlan:
    columns: ClassVar[list[Column]] = [
        col("id", "int8", "bigint", not_null=True),
        col("n", "int4", "integer"),
        col("name", "text"),
        col("doc", "jsonb"),
        col("ts", "timestamptz", "timestamp with time zone"),
        col("created", "timestamptz", "timestamp with time zone", not_null=True, default=True),
    ]

    def test_compatible_columns_are_cast_to_the_wire_types(self) -> None:
        schema = pa.schema([("id", pa.int32()), ("n", pa.int64()), ("name", pa.string()),
                            ("doc", pa.string()), ("ts", pa.timestamp("us", tz="Etc/UTC"))])
        plan = plan_write("public.t", schema, self.columns)
        assert plan.schema.field("id").type == pa.int64()
        assert plan.schema.field("n").type == pa.int32()
        assert plan.schema.field("ts").type == pa.timestamp("us", tz="UTC")
        assert plan.jsonb == ("doc",)

    def test_missing_column_names_the_column_and_the_fix(self) -> None:
        with pytest.raises(BadInputError, match=r"'extra' .* does not exist"):
            plan_write("public.t", pa.schema([("id", pa.int64()), ("extra", pa.int64())]),
                       self.columns)

    def test_incompatible_type_names_both_types(self) -> None:
        with pytest.raises(BadInputError, match=r"string.*integer|integer.*string"):
            plan_write("public.t", pa.schema([("id", pa.int64()), ("n", pa.string())]),
                       self.columns)

    def test_not_null_column_without_default_must_be_in_the_batch(self) -> None:
        with pytest.raises(BadInputError, match=r"NOT NULL column.*id"):
            plan_write("public.t", pa.schema([("name", pa.string())]), self.columns)

    def test_unsupported_column_type_is_a_configuration_error(self) -> None:
        point = Column("p", "point", "point", False, False, PgType(600, "point", "b"))
        with pytest.raises(ConfigurationError, match=r"point.*uuid"):
            plan_write("public.t", pa.schema([("p", pa.string())]), [point])

    def test_ddl_types(self) -> None:
        assert ddl_type(pa.timestamp("us", tz="UTC")) == "timestamp with time zone"
        assert ddl_type(pa.decimal128(10, 2)) == "numeric(10,2)"
        assert ddl_type(pa.list_(pa.int64())) == "bigint[]"
        assert ddl_type(pa.duration("us")) == "interval"
        assert ddl_type(pa.map_(pa.string(), pa.string())) == "jsonb"
        with pytest.raises(ConfigurationError):
            ddl_type(pa.list_(pa.list_(pa.int64())))


def test_missing_extra_names_it() -> None:
    with pytest.raises(DependencyError, match=r"spark-exactly-once\[postgres\]"):
        require("no_such_module_xyz", extra="postgres", feature="PostgresSink")
