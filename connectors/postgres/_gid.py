"""Global transaction ids (``gid``) of the sink's prepared transactions: build and parse.

PostgreSQL names a prepared transaction by one string, the ``gid`` of ``PREPARE TRANSACTION
'<gid>'``. The sink writes the XA triple ``(format_id, gtrid, bqual)`` into it the way the
JDBC driver and psycopg's ``Xid`` do (``<format_id>_<base64(gtrid)>_<base64(bqual)>``), so
the gids stay byte-identical to those of earlier releases (which prepared through psycopg's
``tpc_begin``/``tpc_prepare``) and their transactions are still found and settled.

The encoding is written here rather than borrowed from ``psycopg.Xid``: the task side speaks
plain SQL, and the one format the sink depends on should not move with a client library.
:func:`gid_of` and :func:`transaction_id_of` map the library's transaction ids to gids and
back.

Example::

    >>> gid = encode_gid(XID_FORMAT_ID, "eos1|s|r", "0.7")
    >>> gid
    '1162826545_ZW9zMXxzfHI=_MC43'
    >>> decode_gid(gid)
    (1162826545, 'eos1|s|r', '0.7')
    >>> decode_gid("some other application's gid") is None
    True
"""

from __future__ import annotations

import base64
import binascii
import re

from connectors.core.naming import TransactionId

__all__ = ["MAX_PART", "XID_FORMAT_ID", "decode_gid", "encode_gid", "gid_of",
           "transaction_id_of"]

#: The XA format id of every xid this library prepares ("EOS1" in ASCII).
XID_FORMAT_ID = 0x454F5331
#: The XA limit on ``gtrid`` and ``bqual`` (characters), as psycopg checks it.
MAX_PART = 64
_FORMAT_LIMIT = 0x80000000  # format_id is a non-negative 32-bit signed integer
_GID = re.compile(r"([0-9]+)_([A-Za-z0-9+/=]*)_([A-Za-z0-9+/=]*)")


def encode_gid(format_id: int, gtrid: str, bqual: str) -> str:
    """The gid of the XA triple: ``<format_id>_<base64(gtrid)>_<base64(bqual)>`` (UTF-8)."""
    if not isinstance(format_id, int) or not 0 <= format_id < _FORMAT_LIMIT:
        raise ValueError("format_id must be a non-negative 32-bit integer")
    if len(gtrid) > MAX_PART or len(bqual) > MAX_PART:
        raise ValueError(f"gtrid and bqual must be at most {MAX_PART} characters")
    egtrid = base64.b64encode(gtrid.encode()).decode()
    ebqual = base64.b64encode(bqual.encode()).decode()
    return f"{format_id}_{egtrid}_{ebqual}"


def decode_gid(gid: str) -> tuple[int, str, str] | None:
    """``(format_id, gtrid, bqual)`` of a gid built by :func:`encode_gid`; ``None`` for any
    other gid (another application's, or one that does not re-encode to itself)."""
    match = _GID.fullmatch(gid)
    if match is None:
        return None
    try:
        format_id = int(match.group(1))
        gtrid = base64.b64decode(match.group(2), validate=True).decode()
        bqual = base64.b64decode(match.group(3), validate=True).decode()
        canonical = encode_gid(format_id, gtrid, bqual)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (format_id, gtrid, bqual) if canonical == gid else None


def gid_of(tid: TransactionId) -> str:
    """The gid of ``PREPARE TRANSACTION`` for ``tid``: byte-identical to earlier releases'."""
    gtrid, bqual = tid.xid_parts()
    return encode_gid(XID_FORMAT_ID, gtrid, bqual)


def transaction_id_of(gid: str) -> TransactionId | None:
    """The transaction id a gid of this library names; ``None`` for any other gid."""
    xid = decode_gid(gid)
    if xid is None or xid[0] != XID_FORMAT_ID:
        return None
    return TransactionId.from_xid_parts(xid[1], xid[2])
