"""``DeltaSinks``: several Delta sinks fed by one ``foreachBatch`` under one decision per
batch: a :class:`~connectors.core.templates.fanout.FanOut` of Delta sinks (docs/fan-out.md)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from connectors.core.errors import ConfigurationError
from connectors.core.templates.fanout import FanOut
from connectors.delta._sink import DeltaSink

__all__ = ["DeltaSinks"]


def fan_out_id(sinks: list[DeltaSink]) -> str:
    """A stable id for the decisions of these sinks (whatever their order)."""
    digest = hashlib.blake2b("|".join(sorted(s.sink_id for s in sinks)).encode(),
                             digest_size=6).hexdigest()
    return f"delta-sinks-{digest}"


class DeltaSinks(FanOut):
    """Several Delta sinks fed by one ``foreachBatch``: a batch in all their tables or in
    none (a :class:`~connectors.core.templates.fanout.FanOut`; its decisions beside the first
    table's ledger, under ``sink_id``, by default ``delta-sinks-<digest of the ids>``).

    Each sink commits with its own sink id (Delta's txn app id), so two of them may write
    the same table in one batch. The batch is persisted once and unpersisted after.

    Example::

        sinks = DeltaSinks([
            DeltaSink(f"{path}/events", sink_id="events", create_table=True),
            DeltaSink(f"{path}/users", sink_id="users", merge_on=["user_id"],
                      create_table=True),
        ])
        query = df.writeStream.foreachBatch(sinks).option("checkpointLocation", ckpt).start()
    """

    min_targets = 1

    def __init__(self, sinks: Iterable[DeltaSink], *, persist: bool = True,
                 sink_id: str | None = None, **options: Any) -> None:
        listed = list(sinks)
        if not listed or not all(isinstance(s, DeltaSink) for s in listed):
            raise ConfigurationError("DeltaSinks needs a non-empty list of DeltaSink")
        ids = [s.sink_id for s in listed]
        if dup := sorted({i for i in ids if ids.count(i) > 1}):
            raise ConfigurationError(
                f"sink id(s) {', '.join(dup)} repeat: each sink needs its own sink_id (its "
                "Delta txn app id), or Delta skips the second write to a table")
        super().__init__(*listed, sink_id=sink_id or fan_out_id(listed), persist=persist,
                         **options)

    def __repr__(self) -> str:
        return f"DeltaSinks({self.sinks!r}, sink_id={self.sink_id!r})"
