"""The gid encoder is byte-identical to psycopg's ``Xid`` (what earlier releases prepared
with ``tpc_begin``/``tpc_prepare``), and parses exactly what it builds."""

from __future__ import annotations

import psycopg
import pytest

from connectors.core.naming import TransactionId
from connectors.postgres import XID_FORMAT_ID
from connectors.postgres._gid import MAX_PART, decode_gid, encode_gid

#: (format_id, gtrid, bqual): the sink's own ids, limits, padding lengths, non-ASCII.
TRIPLES = [
    (XID_FORMAT_ID, *TransactionId("events-pg", "01a2b3c4", 0, 0).xid_parts()),
    (XID_FORMAT_ID, *TransactionId("a" * 40, "ffffffff", 2**62, 2**40).xid_parts()),
    (XID_FORMAT_ID, "eos1|s|r", "0.7"),
    (0, "", ""),
    (1, "x", "y"),
    (0x7FFFFFFF, "g" * MAX_PART, "b" * MAX_PART),
    (42, "ab", "abc"),  # base64 with '==' and '=' padding and none
    (42, "abcd", "abcde"),
    (7, "über|ß", "½.☃"),  # UTF-8, multi-byte
    (7, "a_b", "c_d"),  # underscores inside the parts (encoded away by base64)
    (7, "?>?>", "~~~"),  # base64 with '+' and '/'
]


@pytest.mark.parametrize(("format_id", "gtrid", "bqual"), TRIPLES)
def test_encoding_is_byte_identical_to_psycopg(format_id: int, gtrid: str, bqual: str) -> None:
    ours = encode_gid(format_id, gtrid, bqual)
    theirs = str(psycopg.Xid.from_parts(format_id, gtrid, bqual))
    assert ours.encode() == theirs.encode()
    assert decode_gid(ours) == (format_id, gtrid, bqual)
    parsed = psycopg.Xid.from_string(ours)  # and psycopg reads ours back the same
    assert (parsed.format_id, parsed.gtrid, parsed.bqual) == (format_id, gtrid, bqual)


def test_the_sinks_gid_is_unchanged() -> None:
    """Pinned: the gid of a known transaction id as psycopg 3.3.9's Xid wrote it."""
    tid = TransactionId("events-pg", "01a2b3c4", 12, 345)
    assert tid.xid_parts() == ("eos1|events-pg|01a2b3c4", "12.345")
    assert encode_gid(XID_FORMAT_ID, *tid.xid_parts()) == (
        "1162826545_ZW9zMXxldmVudHMtcGd8MDFhMmIzYzQ=_MTIuMzQ1")


@pytest.mark.parametrize(("format_id", "gtrid", "bqual"), [
    (-1, "a", "b"), (0x80000000, "a", "b"), (1, "g" * (MAX_PART + 1), "b"),
    (1, "a", "b" * (MAX_PART + 1)),
])
def test_invalid_triples_are_refused_like_psycopg(format_id: int, gtrid: str, bqual: str) -> None:
    with pytest.raises(ValueError):
        encode_gid(format_id, gtrid, bqual)
    with pytest.raises(ValueError):
        psycopg.Xid.from_parts(format_id, gtrid, bqual)


@pytest.mark.parametrize("gid", [
    "", "plain-gid", "1_a_b_c", "x_YQ==_Yg==", "1_YQ==", "1_Y!Q=_Yg==",
    "1_YQ_Yg==",  # not valid base64 (padding missing)
    "1_/w==_Yg==",  # base64 of a byte that is not UTF-8
    "01_YQ==_Yg==",  # does not re-encode to itself
    "\u0661_YQ==_Yg==",  # a non-ASCII digit (ARABIC-INDIC ONE)
    "2147483648_YQ==_Yg==",  # format id out of range
])
def test_foreign_gids_are_not_ours(gid: str) -> None:
    assert decode_gid(gid) is None
