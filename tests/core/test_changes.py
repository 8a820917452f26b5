"""The database-independent part of ``mode="changes"`` (:mod:`connectors.core.changes`):
the options check, the driver's schema checks, the task side's staging (op and sequence
validation) and the last change of each key. PostgresSink's and MariaDBSink's SQL runs in
integration/postgres/test_postgres_changes.py and integration/mariadb/test_mariadb_changes.py."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from connectors import BadInputError, ConfigurationError
from connectors.core.changes import (
    DELETE_OPS,
    UPSERT_OPS,
    check_change_input,
    check_change_options,
    deleted_flags,
    latest_changes,
    stage,
    written_schema,
)
from connectors.core.fingerprint import fingerprint_batch

SCHEMA = pa.schema([("id", pa.int64()), ("op", pa.string()), ("seq", pa.int64()),
                    ("name", pa.string())])


@dataclass(frozen=True)
class Opts:
    op_column: str | None = "op"
    sequence_column: str | None = "seq"


def options(**kw: Any) -> Opts:
    kw.pop("key_columns", None)  # the staging reads the op and sequence columns only
    return Opts(**kw)


def _name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} must be a non-empty string")
    return name


@pytest.mark.parametrize("mode,keys,op,seq,needle", [
    ("changes", ("id",), None, "seq", "needs op_column"),
    ("changes", ("id",), "op", None, "and sequence_column"),
    ("changes", ("id",), "op", "op", "both 'op'"),
    ("changes", ("id",), "id", "seq", "op_column 'id' is one of key_columns"),
    ("changes", ("id",), "op", "id", "sequence_column 'id' is one of key_columns"),
    ("changes", ("id",), "", "seq", "op_column must be a non-empty string"),
    ("upsert", ("id",), "op", None, "op_column only apply to mode='changes'"),
    ("append", (), None, "seq", "sequence_column only apply to mode='changes'"),
    ("append", (), "op", "seq", "op_column and sequence_column only apply"),
])
def test_change_options_name_the_fix(mode: str, keys: tuple[str, ...], op: str | None,
                                     seq: str | None, needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        check_change_options(mode, keys, op, seq, _name)


def test_change_options_pass() -> None:
    check_change_options("changes", ("id",), "op", "seq", _name)
    check_change_options("upsert", ("id",), None, None, _name)


class TestDriverChecks:
    def test_missing_columns_are_named(self) -> None:
        with pytest.raises(BadInputError, match="'seq'"):
            check_change_input(pa.schema([("id", pa.int64()), ("op", pa.string())]),
                               options(), "public.t")

    @pytest.mark.parametrize("field,needle", [
        (pa.field("op", pa.int32()), "op_column 'op' is int32"),
        (pa.field("seq", pa.float64()), "sequence_column 'seq' is double"),
        (pa.field("seq", pa.list_(pa.int64())), "sequence_column 'seq'"),
    ])
    def test_unreadable_types_are_refused(self, field: pa.Field, needle: str) -> None:
        schema = SCHEMA.set(SCHEMA.get_field_index(field.name), field)
        with pytest.raises(BadInputError, match=needle):
            check_change_input(schema, options(), "public.t")

    @pytest.mark.parametrize("op_type,seq_type", [
        (pa.bool_(), pa.timestamp("us", tz="UTC")), (pa.large_string(), pa.string()),
        (pa.dictionary(pa.int32(), pa.string()), pa.int32()), (pa.string(), pa.date32()),
        (pa.string(), pa.decimal128(20, 0)),
    ])
    def test_readable_types_pass(self, op_type: pa.DataType, seq_type: pa.DataType) -> None:
        schema = pa.schema([("id", pa.int64()), ("op", op_type), ("seq", seq_type)])
        check_change_input(schema, options(), "public.t")

    def test_op_and_seq_written_only_when_the_table_has_them(self) -> None:
        o = options()
        assert written_schema(SCHEMA, o, ["id", "name"]).names == ["id", "name"]
        assert written_schema(SCHEMA, o, ["id", "seq", "name"]).names == ["id", "seq", "name"]
        assert written_schema(SCHEMA, o, ["id", "op", "seq", "name"]).names == SCHEMA.names
        # create_table: the sequence column is created, the op column is not
        assert written_schema(SCHEMA, o, None).names == ["id", "seq", "name"]


def ops(values: list[Any], t: pa.DataType | None = None, **kw: Any) -> list[bool]:
    return deleted_flags(pa.array(values, t or pa.string()), "op", **kw).to_pylist()


class TestOps:
    def test_debezium_codes_and_words_any_case(self) -> None:
        values = ["c", "r", "u", "d", "C", "U", "D", "insert", "UPDATE", "Upsert", "delete",
                  "DELETE"]
        assert ops(values) == [False] * 3 + [True] + [False] * 2 + [True] + [False] * 3 + [
            True, True]
        assert ops(values, pa.large_string()) == ops(values)
        assert ops(values, pa.dictionary(pa.int8(), pa.string())) == ops(values)
        assert ops(values, pa.string_view()) == ops(values)

    def test_boolean_is_a_deleted_flag(self) -> None:
        assert ops([True, False], pa.bool_()) == [True, False]

    @pytest.mark.parametrize("values,t", [
        (["c", "x"], pa.string()), (["c", None], pa.string()), (["c", " d"], pa.string()),
        ([True, None], pa.bool_()), (["", "u"], pa.string()),
    ])
    def test_other_values_are_bad_input_naming_column_and_allowed(
        self, values: list[Any], t: pa.DataType
    ) -> None:
        with pytest.raises(BadInputError) as err:
            ops(values, t, sink_id="s", batch_id=3)
        text = str(err.value)
        assert "op_column 'op'" in text and "'d'" in text and "true (deleted)" in text
        assert "1 value(s)" in text and err.value.batch_id == 3

    def test_the_value_is_quoted_only_with_values_in_errors(self) -> None:
        with pytest.raises(BadInputError) as err:
            ops(["c", "secret-op"])
        assert "secret-op" not in str(err.value)
        with pytest.raises(BadInputError) as err:
            ops(["c", "secret-op"], values_in_errors=True)
        assert "'secret-op'" in str(err.value)


def batch(rows: list[tuple[Any, ...]], schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows],
                                      schema=schema)


def staged(rows: list[tuple[Any, ...]], written: tuple[str, ...] = ("id", "name")
           ) -> pa.RecordBatch:
    raw = batch(rows)
    return stage(raw, raw.select(list(written)), options())


class TestStage:
    def test_null_sequence_is_bad_input(self) -> None:
        with pytest.raises(BadInputError, match="sequence_column 'seq' is NULL in 1 row"):
            staged([(1, "c", 1, "a"), (2, "c", None, "b")])

    def test_bad_op_fails_the_whole_batch(self) -> None:
        with pytest.raises(BadInputError, match="op_column"):
            staged([(1, "c", 1, "a"), (2, "merge", 2, "b")])


def reference(rows: list[tuple[Any, ...]]) -> dict[int, tuple[Any, ...]]:
    """Apply every change one by one in sequence order (ties: the other columns, the
    greatest last): what the table would be."""
    table: dict[int, tuple[Any, ...]] = {}
    for r in sorted(rows, key=lambda r: (r[2], r[0], r[3], r[1] in ("d", "D"))):
        if r[1] in ("d", "D"):
            table.pop(r[0], None)
        else:
            table[r[0]] = (r[0], r[3])
    return table


def split(rows: list[tuple[Any, ...]], parts: int = 1) -> tuple[list[Any], list[Any]]:
    chunks = [rows[i::parts] for i in range(parts)]
    upserts, deletes = latest_changes([staged(c) for c in chunks if c], ("id",), ("id", "name"))
    return sorted(upserts.to_pylist(), key=lambda r: r["id"]), sorted(
        deletes.column("id").to_pylist())


class TestLatestChanges:
    def test_last_change_per_key_by_sequence(self) -> None:
        rows = [(1, "c", 1, "a"), (1, "u", 3, "c"), (1, "u", 2, "b"),   # upsert, last is seq 3
                (2, "c", 1, "x"), (2, "d", 2, "x"),                      # deleted
                (3, "d", 5, "y"), (3, "c", 6, "z"),                      # delete then re-insert
                (4, "d", 1, "never seen")]                               # delete of absent key
        upserts, deletes = split(rows)
        assert upserts == [{"id": 1, "name": "c"}, {"id": 3, "name": "z"}]
        assert deletes == [2, 4]

    def test_ties_the_greatest_row_wins_and_delete_beats_upsert(self) -> None:
        upserts, deletes = split([(1, "u", 7, "b"), (1, "u", 7, "a"), (2, "u", 7, "q"),
                                  (2, "d", 7, "q")])
        assert upserts == [{"id": 1, "name": "b"}] and deletes == [2]

    def test_string_and_timestamp_sequences(self) -> None:
        for t, values in [(pa.string(), ["2026-01-02", "2026-01-10"]),
                          (pa.string_view(), ["b", "c"]),
                          (pa.timestamp("us"), [1, 2])]:
            schema = SCHEMA.set(2, pa.field("seq", t))
            raw = batch([(1, "u", values[1], "new"), (1, "u", values[0], "old")], schema)
            up, _ = latest_changes([stage(raw, raw.select(["id", "name"]), options())],
                                   ("id",), ("id", "name"))
            assert up.to_pylist() == [{"id": 1, "name": "new"}]

    def test_a_list_column_breaks_ties_by_its_json_text(self) -> None:
        """Arrow cannot sort lists: a tie on the sequence is broken by their JSON text."""
        schema = pa.schema([("id", pa.int64()), ("op", pa.string()), ("seq", pa.int64()),
                            ("tags", pa.list_(pa.string()))])
        raw = pa.RecordBatch.from_pylist(
            [{"id": 1, "op": "u", "seq": 7, "tags": ["b"]},
             {"id": 1, "op": "u", "seq": 7, "tags": ["a", "z"]}], schema=schema)
        up, _ = latest_changes([stage(raw, raw.select(["id", "tags"]), options())],
                               ("id",), ("id", "tags"))
        assert up.to_pylist() == [{"id": 1, "tags": ["b"]}]

    def test_sequence_column_written_too(self) -> None:
        raw = batch([(1, "u", 2, "b"), (1, "u", 1, "a")])
        up, _ = latest_changes([stage(raw, raw.select(["id", "seq", "name"]), options())],
                               ("id",), ("id", "seq", "name"))
        assert up.to_pylist() == [{"id": 1, "seq": 2, "name": "b"}]

    @pytest.mark.parametrize("seed", range(20))
    def test_random_streams_match_one_by_one_application_in_any_split(self, seed: int) -> None:
        rng = random.Random(seed)
        rows = [(rng.randrange(8), rng.choice("cudrD"), rng.randrange(12),
                 rng.choice("abc")) for _ in range(60)]
        expected = reference(rows)
        for parts in (1, 3):
            shuffled = rows[:]
            rng.shuffle(shuffled)
            upserts, deletes = split(shuffled, parts)
            assert {r["id"]: (r["id"], r["name"]) for r in upserts} == expected
            # every key of the stream is either upserted or deleted, never both
            assert set(deletes) | {r["id"] for r in upserts} == {r[0] for r in rows}
            assert not set(deletes) & {r["id"] for r in upserts}

    def test_composite_keys(self) -> None:
        schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("op", pa.bool_()),
                            ("seq", pa.int64()), ("v", pa.int64())])
        raw = batch([(1, "x", False, 1, 10), (1, "y", False, 1, 20), (1, "x", True, 2, 10),
                     (2, "x", False, 3, 30)], schema)
        o = options(key_columns=("a", "b"))
        up, dele = latest_changes([stage(raw, raw.select(["a", "b", "v"]), o)],
                                  ("a", "b"), ("a", "b", "v"))
        assert sorted(map(tuple, (r.values() for r in up.to_pylist()))) == [
            (1, "y", 20), (2, "x", 30)]
        assert dele.to_pylist() == [{"a": 1, "b": "x"}]


def test_the_fingerprint_covers_op_and_sequence() -> None:
    """The template fingerprints the whole input row: a replay whose op or sequence
    differs is told apart (and refused), one with the same changes is not."""
    rows = [(1, "c", 1, "a"), (2, "u", 2, "b")]
    same = fingerprint_batch(batch(rows))
    assert fingerprint_batch(batch(list(reversed(rows)))) == same
    for changed in ([(1, "d", 1, "a"), (2, "u", 2, "b")], [(1, "c", 5, "a"), (2, "u", 2, "b")]):
        assert fingerprint_batch(batch(changed)) != same


def test_every_op_spelling_is_covered() -> None:
    """The documented values and these tests agree."""
    assert set(UPSERT_OPS) == {"c", "r", "u", "insert", "update", "upsert"}
    assert set(DELETE_OPS) == {"d", "delete"}
    assert not set(itertools.chain(UPSERT_OPS)) & set(DELETE_OPS)
