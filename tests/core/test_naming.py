"""Sink ids and transaction ids: validation, exact parsing, XA-sized parts."""

from __future__ import annotations

import pytest

from connectors.core.errors import ConfigurationError
from connectors.core.naming import (
    MAX_SINK_ID_LENGTH,
    TransactionId,
    new_run_id,
    slot_name,
    validate_sink_id,
)

RUN = "0123abcd"
MAX_LONG = 2**63 - 1  # Spark's batch ids and task attempt ids are longs


# --- sink ids ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sink_id",
    ["a", "Z", "7", "events", "events-pg", "events_pg", "A-b_C-9", "0lead-digit", "x" * 40],
)
def test_valid_sink_ids_are_returned_unchanged(sink_id: str) -> None:
    assert validate_sink_id(sink_id) == sink_id


@pytest.mark.parametrize(
    "sink_id",
    [
        "-leading-dash",
        "_leading_underscore",
        "has space",
        "pipe|inside",
        "dot.inside",
        "slash/inside",
        "colon:inside",
        "trailing-newline\n",
        "caf\u00e9",  # letters outside ASCII
        "\uff41",  # fullwidth "a"
        "x" * 41,
    ],
)
def test_invalid_sink_ids_raise_configuration_error_naming_the_rule(sink_id: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_sink_id(sink_id)
    message = str(info.value)
    assert "invalid sink_id" in message
    assert f"1 to {MAX_SINK_ID_LENGTH} characters" in message
    assert "A-Z, a-z, 0-9, '-' and '_'" in message


@pytest.mark.parametrize("sink_id", ["", None, 42, b"events"])
def test_missing_or_non_string_sink_id_says_it_is_required_with_an_example(
    sink_id: object,
) -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_sink_id(sink_id)
    assert "sink_id is required" in str(info.value)
    assert "sink_id='events-pg'" in str(info.value)


def test_sink_id_length_limit_is_40() -> None:
    assert MAX_SINK_ID_LENGTH == 40
    validate_sink_id("a" * 40)
    with pytest.raises(ConfigurationError):
        validate_sink_id("a" * 41)


def test_invalid_sink_id_message_truncates_a_huge_value() -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_sink_id("!" * 10_000)
    assert len(str(info.value)) < 400


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate_sink_id("bad id")


# --- run ids and slot names --------------------------------------------------------------


def test_run_ids_are_8_hex_digits_and_fresh() -> None:
    runs = {new_run_id() for _ in range(50)}
    assert len(runs) == 50
    for run in runs:
        assert len(run) == 8
        int(run, 16)
        TransactionId("s", run, 0, 0)  # accepted as a run id


def test_slot_name_is_stable_and_validates_the_sink_id() -> None:
    assert slot_name("events", 3) == "eos1|events|slot|3"
    assert slot_name("events", 3) == slot_name("events", 3)
    with pytest.raises(ConfigurationError):
        slot_name("bad id", 0)


# --- transaction ids ---------------------------------------------------------------------


def test_transaction_id_str_has_the_documented_layout() -> None:
    tid = TransactionId("events", RUN, 7, 42)
    assert str(tid) == f"eos1|events|{RUN}|7|42"


@pytest.mark.parametrize(
    "tid",
    [
        TransactionId("a", RUN, 0, 0),
        TransactionId("events-pg", RUN, 7, 42),
        TransactionId("x" * 40, "ffffffff", MAX_LONG, MAX_LONG),
    ],
)
def test_transaction_id_str_parse_round_trip(tid: TransactionId) -> None:
    assert TransactionId.parse(str(tid)) == tid


@pytest.mark.parametrize(
    "text",
    [
        "",
        "eos1",
        "some-other-app-gid",
        f"eos2|events|{RUN}|7|42",  # another format version
        f"EOS1|events|{RUN}|7|42",
        f"eos1|events|{RUN}|7",  # a part missing
        f"eos1|events|{RUN}|7|42|extra",
        f"eos1||{RUN}|7|42",  # empty sink id
        f"eos1|-events|{RUN}|7|42",  # invalid sink id
        f"eos1|{'x' * 41}|{RUN}|7|42",  # sink id too long
        "eos1|events|0123abc|7|42",  # run id too short
        "eos1|events|0123ABCD|7|42",  # run id not lowercase hex
        "eos1|events|0123abcg|7|42",
        f"eos1|events|{RUN}|-7|42",
        f"eos1|events|{RUN}|7|-1",
        f"eos1|events|{RUN}|seven|42",
        f"eos1|events|{RUN}|7|",
        f"eos1|events|{RUN}| 7|42",
        "eos1|events|slot|3",  # a slot name is no transaction id
    ],
)
def test_parse_returns_none_for_foreign_ids(text: str) -> None:
    assert TransactionId.parse(text) is None


@pytest.mark.parametrize(
    "text",
    [
        f"eos1|events|{RUN}|007|42",  # leading zeros: not built by this library
        f"eos1|events|{RUN}|7|042",
        f"eos1|events|{RUN}|\u0663|42",  # ARABIC-INDIC DIGIT THREE
        f"eos1|events|{RUN}|\u00b2|42",  # SUPERSCRIPT TWO: int() refuses it
        f"eos1|events|{RUN}|7|\uff14",  # FULLWIDTH DIGIT FOUR
    ],
)
def test_parse_returns_none_for_non_canonical_numbers(text: str) -> None:
    # A sweep parses every prepared transaction the target lists: an id this library
    # could not have built must be left alone (None), never claimed or crash the sweep.
    assert TransactionId.parse(text) is None


def test_parse_never_matches_by_prefix() -> None:
    short = TransactionId.parse(f"eos1|events|{RUN}|1|1")
    longer = TransactionId.parse(f"eos1|events-2|{RUN}|1|1")
    shorter = TransactionId.parse(f"eos1|event|{RUN}|1|1")
    assert short is not None and longer is not None and shorter is not None
    assert short.belongs_to("events")
    assert not longer.belongs_to("events")
    assert not shorter.belongs_to("events")
    assert longer.belongs_to("events-2")
    assert not short.belongs_to("events-2")
    assert not short.belongs_to("event")


@pytest.mark.parametrize(
    ("sink_id", "run_id", "batch_id", "attempt"),
    [
        ("bad id", RUN, 0, 0),
        ("events", "xyz", 0, 0),
        ("events", RUN, -1, 0),
        ("events", RUN, 0, -1),
    ],
)
def test_transaction_id_constructor_validates(
    sink_id: str, run_id: str, batch_id: int, attempt: int
) -> None:
    with pytest.raises(ConfigurationError):
        TransactionId(sink_id, run_id, batch_id, attempt)


def test_transaction_ids_are_hashable_and_ordered() -> None:
    a = TransactionId("s", RUN, 1, 5)
    b = TransactionId("s", RUN, 2, 0)
    assert a < b
    assert {a, TransactionId("s", RUN, 1, 5)} == {a}


# --- XA parts ----------------------------------------------------------------------------


def test_xid_parts_fit_64_characters_and_the_id_fits_200_bytes_at_max_lengths() -> None:
    tid = TransactionId("x" * MAX_SINK_ID_LENGTH, "ffffffff", MAX_LONG, MAX_LONG)
    gtrid, bqual = tid.xid_parts()
    assert len(gtrid) <= 64
    assert len(bqual) <= 64
    assert len(str(tid).encode()) < 200
    assert len(str(tid)) == 94  # the documented longest id


def test_xid_parts_layout() -> None:
    assert TransactionId("events", RUN, 7, 42).xid_parts() == (f"eos1|events|{RUN}", "7.42")


@pytest.mark.parametrize(
    "tid",
    [
        TransactionId("events", RUN, 0, 0),
        TransactionId("events-2", RUN, 7, 42),
        TransactionId("x" * 40, "ffffffff", MAX_LONG, MAX_LONG),
    ],
)
def test_from_xid_parts_round_trip(tid: TransactionId) -> None:
    assert TransactionId.from_xid_parts(*tid.xid_parts()) == tid


@pytest.mark.parametrize(
    ("gtrid", "bqual"),
    [
        (f"eos1|events|{RUN}", "742"),  # no dot
        (f"eos1|events|{RUN}", "7.4.2"),
        (f"eos1|events|{RUN}", ".42"),
        (f"eos1|events|{RUN}", "7."),
        ("some-other-gtrid", "7.42"),
        (f"eos1|events|{RUN}|7", "7.42"),
        (f"eos2|events|{RUN}", "7.42"),
    ],
)
def test_from_xid_parts_returns_none_for_foreign_parts(gtrid: str, bqual: str) -> None:
    assert TransactionId.from_xid_parts(gtrid, bqual) is None
