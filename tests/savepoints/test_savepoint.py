"""Taking a savepoint from a sink's ledger and its query's checkpoint (no Spark): the last
decided batch, the offset log entry of that batch, and every refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connectors.core.errors import ConfigurationError, ProtocolStateError
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID, LedgerEntry
from connectors.core.states import BatchState
from connectors.savepoints import Savepoint, load_savepoint, take_savepoint
from connectors.savepoints._offset_log import local_reader, parse_offset_log
from connectors.testing import InMemoryTarget

META = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'


def _checkpoint(root: Path, query_id: str, offsets: dict[int, list[str]]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    (root / "offsets").mkdir(exist_ok=True)
    for batch, lines in offsets.items():
        (root / "offsets" / str(batch)).write_text("\n".join(["v1", META, *lines]))
    return str(root)


def _ledger(query_id: str | None, decided: dict[int, BatchState]):  # type: ignore[no-untyped-def]
    ledger = InMemoryTarget().ledger("orders")
    if query_id is not None:
        ledger.bind_query(query_id)
    for batch, state in decided.items():
        ledger.decide(LedgerEntry("orders", batch, "run-1", state, query_id=query_id))
    return ledger


def test_the_last_decided_batch_and_its_offsets(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "ck", "q-1", {
        4: ['{"orders":{"0":40}}', "-"], 5: ['{"orders":{"0":50}}', "7"],
        6: ['{"orders":{"0":60}}', "8"]})  # 6 planned, not decided: not in the savepoint
    ledger = _ledger("q-1", {4: BatchState.COMMITTED, 5: BatchState.DECIDED})
    sp = take_savepoint(ledger, ckpt)
    assert (sp.sink_id, sp.query_id, sp.batch_id, sp.committed) == ("orders", "q-1", 5, False)
    assert sp.options(0) == {"startingOffsets": '{"orders":{"0":50}}'}
    assert [s.kind for s in sp.sources] == ["kafka", "rate"] and not sp.resumable
    with pytest.raises(ConfigurationError, match=r"source 1 cannot be resumed.*rate source"):
        sp.options(1)
    with pytest.raises(ConfigurationError, match="has 2 source"):
        sp.options(2)
    text = sp.describe()
    assert "last batch 5, decided (its next run commits the rest)" in text
    assert "start a new query with .option('startingOffsets'" in text
    assert "not resumable: a rate source" in text and text.endswith("resumable: no")


def test_a_file_uri_and_a_json_round_trip(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "ck", "q-1", {0: ['{"t":{"0":3,"1":4}}']})
    sp = take_savepoint(_ledger("q-1", {0: BatchState.COMMITTED}), f"file://{ckpt}")
    assert sp.committed and sp.resumable and sp.checkpoint == f"file://{ckpt}"
    assert load_savepoint(sp.dumps()) == sp
    path = tmp_path / "sp.json"
    path.write_text(sp.dumps())
    assert load_savepoint(path) == sp == load_savepoint(str(path))
    with pytest.raises(ProtocolStateError, match="savepoint format 9"):
        Savepoint.from_json({**sp.to_json(), "format": 9})


@pytest.mark.parametrize(("bound", "decided", "ckpt_query", "reason"), [
    (None, {}, "q-1", "bound to no query yet"),
    (BATCH_JOB_QUERY_ID, {0: BatchState.COMMITTED}, "q-1", "bound to a batch job"),
    ("q-1", {0: BatchState.COMMITTED}, "q-2", "belongs to query q-2, and the sink is bound "
                                              "to query q-1"),
    ("q-1", {}, "q-1", "decided no batch of query q-1 yet"),
    ("q-1", {3: BatchState.COMMITTED}, "q-1", "has no offsets/3"),
])
def test_refusals_name_the_reason(tmp_path: Path, bound: str | None,
                                  decided: dict[int, BatchState], ckpt_query: str,
                                  reason: str) -> None:
    ckpt = _checkpoint(tmp_path / "ck", ckpt_query, {0: ['{"t":{"0":3}}']})
    with pytest.raises(ConfigurationError, match=reason) as exc:
        take_savepoint(_ledger(bound, decided), ckpt)
    assert exc.value.sink_id == "orders"


def test_checkpoints_that_cannot_be_read_are_refused_clearly(tmp_path: Path) -> None:
    ledger = _ledger("q-1", {0: BatchState.COMMITTED})
    with pytest.raises(ConfigurationError, match=r"not a local directory.*spark=spark"):
        take_savepoint(ledger, "s3a://bucket/ck")
    with pytest.raises(ConfigurationError, match="is not a directory"):
        take_savepoint(ledger, str(tmp_path / "missing"))
    (tmp_path / "nometa").mkdir()
    with pytest.raises(ConfigurationError, match="no metadata file"):
        take_savepoint(ledger, str(tmp_path / "nometa"))
    ckpt = _checkpoint(tmp_path / "v2", "q-1", {})
    (Path(ckpt) / "offsets" / "0").write_text("v2\n{}\n1\n")
    with pytest.raises(ConfigurationError, match=r"first line is 'v2'.*upgrade connectors"):
        take_savepoint(ledger, ckpt)


def test_the_offset_log_format_as_spark_writes_it() -> None:
    entry = parse_offset_log(7, "v1\n" + META + '\n{"t":{"0":1}}\n-\n9\n')
    assert entry.batch_id == 7 and entry.metadata["batchTimestampMs"] == 1
    assert entry.sources == ('{"t":{"0":1}}', None, "9")
    assert local_reader.__name__ == "local_reader"


def test_a_spark_session_reads_a_checkpoint_that_is_not_local() -> None:
    files = {"s3a://b/ck/metadata": '{"id":"q-1"}\n',
             "s3a://b/ck/offsets/0": "v1\n{}\n" + '{"t":{"0":3}}\n'}

    class Frame:
        def __init__(self, path: str) -> None:
            if path not in files:
                raise RuntimeError(f"[PATH_NOT_FOUND] Path does not exist: {path}")
            self.text = files[path]

        def collect(self) -> list[tuple[str]]:
            return [(self.text,)]

    class Reader:
        def text(self, path: str, wholetext: bool = False) -> Frame:
            assert wholetext
            return Frame(path)

    class Session:
        read = Reader()

    sp = take_savepoint(_ledger("q-1", {0: BatchState.COMMITTED}), "s3a://b/ck/",
                        spark=Session())
    assert sp.options(0) == {"startingOffsets": '{"t":{"0":3}}'}
    with pytest.raises(ConfigurationError, match="has no offsets/1"):
        take_savepoint(_ledger("q-1", {1: BatchState.COMMITTED}), "s3a://b/ck",
                       spark=Session())
