"""``DeltaSinks``: several Delta sinks fed by one ``foreachBatch`` (the batch persisted
once), each exactly once with its own txn app id."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from connectors.core.errors import ConfigurationError
from connectors.delta._sink import DeltaSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DeltaSinks"]


class DeltaSinks:
    """Several Delta sinks fed by one ``foreachBatch``, each exactly once.

    Each sink commits its own Delta commit with its own txn app id (its sink id), so two
    of them may write the same table in one batch: Delta would silently skip the second
    write if both used one app id. The batch is persisted once and unpersisted after.

    Example::

        sinks = DeltaSinks([
            DeltaSink(f"{path}/events", sink_id="events", create_table=True),
            DeltaSink(f"{path}/users", sink_id="users", merge_on=["user_id"],
                      create_table=True),
        ])
        query = df.writeStream.foreachBatch(sinks).option("checkpointLocation", ckpt).start()
    """

    def __init__(self, sinks: Iterable[DeltaSink], *, persist: bool = True) -> None:
        self.sinks = list(sinks)
        if not self.sinks or not all(isinstance(s, DeltaSink) for s in self.sinks):
            raise ConfigurationError("DeltaSinks needs a non-empty list of DeltaSink")
        ids = [s.sink_id for s in self.sinks]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ConfigurationError(
                f"sink id(s) {', '.join(dup)} repeat: each sink needs its own sink_id (its "
                "Delta txn app id), or Delta skips the second write to a table"
            )
        self.persist = bool(persist)

    def __repr__(self) -> str:
        return f"DeltaSinks({self.sinks!r})"

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        data = df.persist() if self.persist else df
        try:
            for sink in self.sinks:
                sink(data, batch_id)
        finally:
            if self.persist:
                data.unpersist()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
