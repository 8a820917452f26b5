"""The XA ids of the sink's branches: their SQL literal, and ``XA RECOVER``'s rows read back.

An xid is the XA triple ``(formatID, gtrid, bqual)`` of
:meth:`~connectors.core.naming.TransactionId.xid_parts`: gtrid ``eos1|<sink_id>|<run_id>``
(at most 54 bytes, MariaDB allows 64), bqual ``<batch>.<task attempt>``, and the library's
format id ("EOS1", the one PostgresSink writes into its gids). In SQL it is written as hex
literals, so no text of it is ever quoted into a statement.

``XA RECOVER`` answers ``(formatID, gtrid_length, bqual_length, data)``, ``data`` being
gtrid and bqual concatenated; :func:`transaction_id_of_row` turns a row back into the
library's transaction id, or ``None`` for another application's branch.

Example::

    >>> from connectors.core.naming import TransactionId
    >>> tid = TransactionId("events", "0a1b2c3d", 7, 42)
    >>> xid_sql(tid)
    "X'656f73317c6576656e74737c3061316232633364',X'372e3432',1162826545"
    >>> row = (XID_FORMAT_ID, 20, 4, b"eos1|events|0a1b2c3d7.42")
    >>> transaction_id_of_row(row) == tid
    True
    >>> transaction_id_of_row((1, 3, 0, b"abc")) is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from connectors.core.naming import TransactionId

__all__ = ["XID_FORMAT_ID", "transaction_id_of_row", "xid_sql"]

#: The XA format id of every xid this library prepares ("EOS1" in ASCII).
XID_FORMAT_ID = 0x454F5331


def xid_sql(tid: TransactionId) -> str:
    """The xid of ``tid`` as ``XA START``/``PREPARE``/``COMMIT``/``ROLLBACK`` take it."""
    gtrid, bqual = tid.xid_parts()
    return f"X'{gtrid.encode().hex()}',X'{bqual.encode().hex()}',{XID_FORMAT_ID}"


def transaction_id_of_row(row: Sequence[Any]) -> TransactionId | None:
    """The transaction id of one ``XA RECOVER`` row; ``None`` for a foreign branch."""
    try:
        format_id, gtrid_length, bqual_length, data = row[:4]
        if int(format_id) != XID_FORMAT_ID:
            return None
        raw = data.encode() if isinstance(data, str) else bytes(data)
        g, b = int(gtrid_length), int(bqual_length)
        if len(raw) != g + b:
            return None
        return TransactionId.from_xid_parts(raw[:g].decode(), raw[g:].decode())
    except (ValueError, TypeError, UnicodeDecodeError):
        return None
