"""A complete custom sink with no external service: Parquet files in a directory.

Built only on the public template (``connectors.sdk.PreparedTransactionSink``):

- each task writes its rows to a Parquet file in ``_staging/<txn>.inprogress/``;
- pre-commit = close and fsync the file, then rename the directory to ``<txn>.prepared``
  (the prepared transaction survives the task);
- commit = atomic rename of the prepared file to ``data/<txn>.parquet`` (the committed
  file is its own receipt: a commit is proven by the file, never presumed);
- abort = delete the prepared directory;
- the ledger is a :class:`connectors.sdk.FileLedger` in ``_ledger/``.

Usage::

    from examples.fs_sink import FileSystemSink
    sink = FileSystemSink("/tmp/out", sink_id="files")
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

Read the output with ``spark.read.parquet("/tmp/out/data")`` or pyarrow. The output
directory must be on a file system with atomic rename (a local disk, HDFS, NFS).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.sdk import (
    DataLossError,
    FileLedger,
    Fingerprint,
    Ledger,
    Options,
    PreparedTransactionSink,
    TaskCommit,
    TaskTransaction,
    TransactionId,
    TransientError,
)

__all__ = ["FileSystemSink", "read_output"]

_PREPARED = ".prepared"
_IN_PROGRESS = ".inprogress"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _FileTxn:
    transaction_id: str
    directory: Path
    schema: pa.Schema
    writer: pq.ParquetWriter | None = None


class FileSystemSink(PreparedTransactionSink[_FileTxn]):
    """Exactly-once Parquet files: temp file = pre-commit, rename = commit.

    Args:
        path: output directory (``data/``, ``_staging/``, ``_ledger/`` live below it).
        sink_id: the sink's stable name.
        **options: the template's options (``retry``, ``reset_binding``, ...).
    """

    #: Its DataSource form: ``connectors.register(spark, FileSystemSink)``, then
    #: ``df.writeStream.format("example.files").option("sink_id", ...).start(path)``.
    data_source_name: ClassVar[str | None] = "example.files"

    def __init__(self, path: str | os.PathLike[str], *, sink_id: str, **options: Any) -> None:
        super().__init__(sink_id=sink_id, **options)
        self.path = Path(path)

    @classmethod
    def from_options(cls, options: Options) -> FileSystemSink:
        """The DataSource form's sink: options ``path`` (or ``start(path)``), ``sink_id``
        and the template's own (``keep_batches``, ...)."""
        return cls(options.text("path"), sink_id=options.text("sink_id"),
                   **cls.template_options(options))

    @property
    def data_dir(self) -> Path:
        return self.path / "data"

    @property
    def staging_dir(self) -> Path:
        return self.path / "_staging"

    def _name(self, transaction_id: str) -> str:
        return quote(transaction_id, safe="")

    # ---- driver: ledger ----
    def create_ledger(self) -> Ledger:
        return FileLedger(self.path / "_ledger" / self.sink_id, sink_id=self.sink_id)

    # ---- executor side ----
    def begin_transaction(self, txn: TaskTransaction) -> _FileTxn:
        directory = self.staging_dir / (self._name(str(txn.transaction_id)) + _IN_PROGRESS)
        directory.mkdir(parents=True, exist_ok=True)
        return _FileTxn(str(txn.transaction_id), directory, txn.schema)

    def write(self, handle: _FileTxn, batch: pa.RecordBatch) -> None:
        if handle.writer is None:
            handle.writer = pq.ParquetWriter(handle.directory / "part.parquet", batch.schema)
        handle.writer.write_batch(batch)

    def pre_commit(self, handle: _FileTxn, fingerprint: Fingerprint) -> None:
        file = handle.directory / "part.parquet"
        if handle.writer is None:  # an empty partition still commits (an empty file)
            handle.writer = pq.ParquetWriter(file, handle.schema)
        handle.writer.close()
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        prepared = handle.directory.with_name(self._name(handle.transaction_id) + _PREPARED)
        os.rename(handle.directory, prepared)
        _fsync_dir(self.staging_dir)

    def abort_transaction(self, handle: _FileTxn) -> None:
        if handle.writer is not None:
            handle.writer.close()
        shutil.rmtree(handle.directory, ignore_errors=True)

    # ---- driver side ----
    def commit(self, commit: TaskCommit) -> None:
        name = self._name(commit.transaction_id)
        target = self.data_dir / f"{name}.parquet"
        prepared = self.staging_dir / (name + _PREPARED)
        if target.exists():
            shutil.rmtree(prepared, ignore_errors=True)
            return  # committed before: the file is the receipt
        if not (prepared / "part.parquet").exists():
            raise DataLossError(
                "a decided transaction is neither prepared nor committed: its staging "
                f"directory {prepared} is gone",
                sink_id=self.sink_id,
                transaction_id=commit.transaction_id,
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(prepared / "part.parquet", target)
        except OSError as exc:
            raise TransientError(
                f"rename into {self.data_dir} failed: {exc.strerror}",
                sink_id=self.sink_id,
                transaction_id=commit.transaction_id,
            ) from exc
        _fsync_dir(self.data_dir)
        shutil.rmtree(prepared, ignore_errors=True)

    def abort(self, transaction_id: str) -> None:
        shutil.rmtree(self.staging_dir / (self._name(transaction_id) + _PREPARED),
                      ignore_errors=True)

    def list_prepared(self) -> Iterable[str]:
        if not self.staging_dir.exists():
            return []
        # An unprepared staging directory is garbage of a task that died before its
        # pre-commit (no decision can list it): remove this sink's.
        for p in self.staging_dir.iterdir():
            if p.name.endswith(_IN_PROGRESS):
                tid = TransactionId.parse(unquote(p.name[: -len(_IN_PROGRESS)]))
                if tid is not None and tid.belongs_to(self.sink_id):
                    shutil.rmtree(p, ignore_errors=True)
        return [
            unquote(p.name[: -len(_PREPARED)])
            for p in self.staging_dir.iterdir()
            if p.name.endswith(_PREPARED)
        ]


def read_output(path: str | os.PathLike[str]) -> pa.Table | None:
    """Every committed row under ``path`` (``None`` if nothing was committed yet)."""
    files = sorted((Path(path) / "data").glob("*.parquet"))
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f) for f in files])
