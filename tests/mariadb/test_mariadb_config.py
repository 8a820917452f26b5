"""The MariaDB sink's settings without a server: the address (its password in no string,
not even after pickling to a task), table names, xids as XA RECOVER lists them, the ledger's
rows, the DDL types and the error translation by MariaDB's error number."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pymysql
import pytest

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    TransientError,
)
from connectors.core.naming import TransactionId
from connectors.mariadb._client import raise_translated, translate
from connectors.mariadb._config import Address, MariaDBOptions, TableName, quote
from connectors.mariadb._ledger_sql import ledger_ddl
from connectors.mariadb._tables import ddl_type
from connectors.mariadb._xid import XID_FORMAT_ID, transaction_id_of_row, xid_sql

SECRET = "pa:ss@w/rd"
URL = "mariadb://app:pa%3Ass%40w%2Frd@db.example:3307/shop?ssl_ca=/etc/ca.pem"


def test_the_address_parses_and_never_shows_its_password() -> None:
    address = Address(URL)
    assert (address.host, address.port, address.user, address.database) == (
        "db.example", 3307, "app", "shop")
    assert address.password == SECRET
    for text in (repr(address), str(address), address.where()):
        assert SECRET not in text and "pa%3A" not in text
    assert address.connect_kwargs()["password"] == SECRET
    assert address.connect_kwargs()["ssl_ca"] == "/etc/ca.pem"
    assert address.redact(f"denied for {SECRET}") == "denied for ***"
    copy = pickle.loads(pickle.dumps(address))
    assert copy.password == SECRET and repr(copy) == repr(address)


@pytest.mark.parametrize("bad", ["", "postgresql://a@h/db", "mariadb://h/db",
                                 "mariadb://u@h", "mariadb://u@h:99999/db",
                                 "mariadb://u:p@h/db?sslmode=require"])
def test_a_bad_address_is_refused_without_quoting_it(bad: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        Address(bad)
    assert ":p@" not in str(err.value)


def test_table_names_are_quoted_and_bounded() -> None:
    assert TableName.parse("events", "shop") == TableName("shop", "events")
    assert TableName.parse("`my.db`.`Ev``ents`").sql() == "`my.db`.`Ev``ents`"
    assert str(TableName("my.db", "x")) == "`my.db`.x"
    assert quote("a`b") == "`a``b`"
    for bad in ("", "a.b.c", "events", ".x", "x."):
        with pytest.raises(ConfigurationError):
            TableName.parse(bad)
    with pytest.raises(ConfigurationError, match="appends up to 9"):
        TableName.parse("d." + "x" * 60, reserve=9)
    with pytest.raises(ConfigurationError, match="mode"):
        MariaDBOptions(TableName("d", "t"), TableName("d", "l"), mode="upsert")  # type: ignore[arg-type]


def test_xids_round_trip_through_xa_recover_rows_and_foreign_ones_are_ignored() -> None:
    tid = TransactionId("events-1", "00ff00ff", 123456789, 987654321)
    gtrid, bqual = tid.xid_parts()
    assert len(gtrid) <= 64 and len(bqual) <= 64
    literal = xid_sql(tid)
    assert literal.startswith("X'") and literal.endswith(f",{XID_FORMAT_ID}")
    row = (XID_FORMAT_ID, len(gtrid), len(bqual), (gtrid + bqual).encode())
    assert transaction_id_of_row(row) == tid
    assert transaction_id_of_row((XID_FORMAT_ID, len(gtrid), len(bqual),
                                  (gtrid + bqual)))  == tid  # str data too
    assert transaction_id_of_row((1, len(gtrid), len(bqual), (gtrid + bqual).encode())) is None
    assert transaction_id_of_row((XID_FORMAT_ID, 2, 2, b"abc")) is None
    assert transaction_id_of_row((XID_FORMAT_ID, 3, 1, b"\xff\xfe\xfd1")) is None


def test_ledger_ddl_names_every_table_quoted() -> None:
    ddl = ledger_ddl(TableName("shop", "eos`ledger"))
    assert set(ddl) == {"", "_aborts", "_bindings", "_receipts"}
    assert "`shop`.`eos``ledger_receipts`" in ddl["_receipts"]
    assert all("ENGINE=InnoDB" in s for s in ddl.values())


def test_ddl_types_of_arrow_fields() -> None:
    cases = {pa.int64(): "BIGINT", pa.uint32(): "INT UNSIGNED", pa.float64(): "DOUBLE",
             pa.bool_(): "BOOLEAN", pa.string(): "LONGTEXT", pa.binary(): "LONGBLOB",
             pa.decimal128(20, 4): "DECIMAL(20,4)", pa.date32(): "DATE",
             pa.timestamp("us", "UTC"): "DATETIME(6)", pa.list_(pa.int32()): "JSON",
             pa.map_(pa.string(), pa.int64()): "JSON"}
    for t, want in cases.items():
        assert ddl_type(pa.field("c", t)) == want
    with pytest.raises(BadInputError, match="65 digits"):
        ddl_type(pa.field("big", pa.decimal256(70, 2)))
    with pytest.raises(BadInputError, match="cannot write"):
        ddl_type(pa.field("d", pa.duration("s")))


def test_errors_are_classified_by_number_and_quote_no_value_by_default() -> None:
    address = Address(URL)

    def tr(code: int, text: str, **kw: object) -> ConnectorError:
        return translate(pymysql.err.OperationalError(code, text), doing="loading",
                         address=address, sink_id="s", **kw)  # type: ignore[arg-type]

    bad = tr(1366, "Incorrect integer value: 'secret-abc' for column `shop`.`t`.`n` at row 3")
    assert isinstance(bad, BadInputError) and "'n'" in str(bad) and "secret-abc" not in str(bad)
    quoted = tr(1062, "Duplicate entry 'secret-17' for key 'PRIMARY'", values=True)
    assert "secret-17" in str(quoted)
    assert isinstance(tr(1205, "Lock wait timeout exceeded"), TransientError)
    assert isinstance(tr(2013, "Lost connection to server during query"), TransientError)
    denied = tr(1045, f"Access denied for user 'app' (using password: {SECRET})")
    assert isinstance(denied, ConfigurationError) and SECRET not in str(denied)
    other = tr(1064, "You have an error in your SQL syntax near 'secret-x'")
    assert type(other) is ConnectorError and "secret-x" not in str(other)


def test_raise_translated_keeps_no_trace_of_the_driver_error() -> None:
    def fail() -> None:
        raise pymysql.err.IntegrityError(1062, "Duplicate entry 'secret-9'")

    with pytest.raises(ConnectorError) as err:
        raise_translated(fail, lambda exc: ConnectorError("translated"))
    assert err.value.__cause__ is None and err.value.__context__ is None


def test_upsert_needs_its_keys_and_append_takes_none() -> None:
    from connectors.mariadb._sink import MariaDBSink

    with pytest.raises(ConfigurationError, match="needs key_columns"):
        MariaDBSink(URL, "t", sink_id="s", mode="upsert")
    with pytest.raises(ConfigurationError, match="for mode='upsert'"):
        MariaDBSink(URL, "t", sink_id="s", key_columns="id")
    with pytest.raises(ConfigurationError, match="distinct"):
        MariaDBSink(URL, "t", sink_id="s", mode="upsert", key_columns=["id", "id"])
    sink = MariaDBSink(URL, "t", sink_id="s", mode="upsert", key_columns="user id")
    assert sink.options.key_columns == ("user id",)  # one string is one column
    assert SECRET not in repr(sink) and "upsert" in repr(sink)
