"""``resume_from``: a new query takes a sink over where its savepoint ended (no Spark: the
in-memory prepared-transaction sink, checkpoints written as Spark writes them). Every
refusal comes before anything of the new query is written."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from connectors.core.errors import ConfigurationError, QueryBindingError
from connectors.savepoints import Savepoint, take_savepoint
from connectors.testing import InMemoryPreparedSink, InMemoryTarget, LocalBatch

ENDS = {"orders": {"0": 30, "1": 25}}
DELTA = ('{"sourceVersion":1,"reservoirId":"tbl-1","reservoirVersion":7,"index":-1,'
         '"isStartingVersion":false}')


def _ckpt(root: Path, query_id: str, offsets: dict[int, list[str]] | None = None,
          kafka_start: dict[str, dict[str, int]] | None = None, index: int = 0) -> str:
    (root / "offsets").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for batch, lines in (offsets or {}).items():
        (root / "offsets" / str(batch)).write_text("\n".join(["v1", "{}", *lines]) + "\n")
    if kafka_start is not None:  # the Kafka source's initial offsets, as Spark writes them
        (root / "sources" / str(index)).mkdir(parents=True)
        (root / "sources" / str(index) / "0").write_text("\x00v1\n" + json.dumps(kafka_start))
    return str(root)


def _rows(n: int, start: int = 0) -> LocalBatch:
    return LocalBatch(pa.table({"x": list(range(start, start + n))}), partitions=2)


@pytest.fixture
def old(tmp_path: Path) -> tuple[InMemoryTarget, Savepoint]:
    """Query q-1 wrote batches 0-2 into sink 'orders', then was stopped: its savepoint."""
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="orders")
    for batch in range(3):
        sink.write_batch(_rows(10, 10 * batch), batch, query_id="q-1")
    ckpt = _ckpt(tmp_path / "ck1", "q-1", {2: [json.dumps(ENDS)], 3: ['{"orders":{"0":40}}']})
    return target, take_savepoint(sink, ckpt)


def _new(target: InMemoryTarget, sp: Savepoint, ckpt: str) -> InMemoryPreparedSink:
    return InMemoryPreparedSink(target, sink_id="orders", resume_from=sp,
                                checkpoint_location=ckpt)


def test_the_new_query_takes_over_where_the_savepoint_ended(
        old: tuple[InMemoryTarget, Savepoint], tmp_path: Path) -> None:
    target, sp = old
    ckpt = _ckpt(tmp_path / "ck2", "q-2", kafka_start=ENDS, index=1)  # a source added first
    sink = _new(target, sp, ckpt)
    sink.write_batch(_rows(10, 30), 0, query_id="q-2")  # batch ids start at 0 again
    assert sorted(r[0] for r in target.committed_rows()) == list(range(40))
    ledger = target.ledger("orders")
    assert ledger.bound_query() == "q-2" and [e.batch_id for e in ledger.entries()] == [0]
    # A restart of the resumed query: bound to it already, nothing to check or resume.
    (Path(ckpt) / "sources" / "1" / "0").unlink()
    again = _new(target, sp, ckpt)
    again.write_batch(_rows(10, 40), 1, query_id="q-2")
    assert len(target.committed_rows()) == 50


@pytest.mark.parametrize(("start", "found"), [
    ({"orders": {"0": 29, "1": 25}}, "partition 0: the new query starts at offset 29, the "
                                     "savepoint ends at 30: records 29..29 would be written "
                                     "twice (an overlap)"),
    ({"orders": {"0": 30, "1": 26}}, "partition 1: the new query starts at offset 26, the "
                                     "savepoint ends at 25: records 25..25 would never be "
                                     "written (a gap)"),
    ({"orders": {"0": 30}}, "partition 1: the savepoint ends at offset 25, and the new query "
                            "does not read that partition"),
    ({"other": {"0": 30, "1": 25}}, "the new query has no Kafka source that reads them"),
])
def test_a_gap_or_an_overlap_is_refused_and_nothing_is_written(
        old: tuple[InMemoryTarget, Savepoint], tmp_path: Path,
        start: dict[str, dict[str, int]], found: str) -> None:
    target, sp = old
    ckpt = _ckpt(tmp_path / "ck2", "q-2", kafka_start=start)
    with pytest.raises(QueryBindingError) as exc:
        _new(target, sp, ckpt).write_batch(_rows(10, 30), 0, query_id="q-2")
    assert found in str(exc.value) and "nothing was written" in str(exc.value)
    assert f"{ckpt}/sources/" in str(exc.value)  # where Spark keeps the wrong start
    assert len(target.committed_rows()) == 30 and not target.prepared
    assert target.ledger("orders").bound_query() == "q-1"  # still the old query's


def test_a_savepoint_the_old_query_ran_past_is_refused(
        old: tuple[InMemoryTarget, Savepoint], tmp_path: Path) -> None:
    target, sp = old
    InMemoryPreparedSink(target, sink_id="orders").write_batch(_rows(5, 30), 3, query_id="q-1")
    ckpt = _ckpt(tmp_path / "ck2", "q-2", kafka_start=ENDS)
    with pytest.raises(QueryBindingError, match="the savepoint ends at batch 2 of query q-1, "
                                                "but the sink's last decision is batch 3"):
        _new(target, sp, ckpt).write_batch(_rows(10, 30), 0, query_id="q-2")
    assert len(target.committed_rows()) == 35


def test_another_querys_ledger_or_checkpoint_is_refused(
        old: tuple[InMemoryTarget, Savepoint], tmp_path: Path) -> None:
    target, sp = old
    ckpt = _ckpt(tmp_path / "ck2", "q-9", kafka_start=ENDS)  # not the running query's
    with pytest.raises(ConfigurationError, match="is the checkpoint of query q-9, and the "
                                                 "query that runs the sink is q-2"):
        _new(target, sp, ckpt).write_batch(_rows(10, 30), 0, query_id="q-2")
    other = InMemoryTarget()  # a ledger bound to no query
    ckpt = _ckpt(tmp_path / "ck3", "q-2", kafka_start=ENDS)
    with pytest.raises(QueryBindingError, match="the sink is bound to no query"):
        _new(other, sp, ckpt).write_batch(_rows(10, 30), 0, query_id="q-2")
    assert other.committed_rows() == []


def test_a_delta_source_is_resumed_with_a_note_that_its_start_is_not_checked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = InMemoryTarget()
    InMemoryPreparedSink(target, sink_id="orders").write_batch(_rows(5), 0, query_id="q-1")
    sp = take_savepoint(target.ledger("orders"), _ckpt(tmp_path / "ck1", "q-1", {0: [DELTA]}))
    ckpt = _ckpt(tmp_path / "ck2", "q-2")
    with caplog.at_level(logging.WARNING, logger="connectors.core.policies.binding"):
        _new(target, sp, ckpt).write_batch(_rows(5, 5), 0, query_id="q-2")
    assert "Spark records a Delta source's start nowhere" in caplog.text
    assert "{'startingVersion': '7'}" in caplog.text
    assert len(target.committed_rows()) == 10


def test_a_savepoint_that_cannot_be_resumed_is_refused(tmp_path: Path) -> None:
    target = InMemoryTarget()
    InMemoryPreparedSink(target, sink_id="orders").write_batch(_rows(5), 0, query_id="q-1")
    sp = take_savepoint(target.ledger("orders"), _ckpt(tmp_path / "ck1", "q-1", {0: ["12"]}))
    with pytest.raises(ConfigurationError, match=r"cannot be resumed: source 0 \(rate\)"):
        _new(target, sp, _ckpt(tmp_path / "ck2", "q-2")).write_batch(_rows(5, 5), 0,
                                                                     query_id="q-2")
    assert len(target.committed_rows()) == 5


def test_the_options_are_checked_when_the_sink_is_built(
        old: tuple[InMemoryTarget, Savepoint]) -> None:
    target, sp = old
    with pytest.raises(ConfigurationError, match="exclude each other"):
        InMemoryPreparedSink(target, sink_id="orders", resume_from=sp,
                             checkpoint_location="/ck", reset_binding=True)
    with pytest.raises(ConfigurationError, match="resume_from needs checkpoint_location"):
        InMemoryPreparedSink(target, sink_id="orders", resume_from=sp)
    with pytest.raises(ConfigurationError, match="read by resume_from only"):
        InMemoryPreparedSink(target, sink_id="orders", checkpoint_location="/ck")
    with pytest.raises(ConfigurationError, match="a savepoint of sink 'orders', not of this"):
        InMemoryPreparedSink(target, sink_id="other", resume_from=sp, checkpoint_location="/c")
    with pytest.raises(ConfigurationError, match="must be a savepoint"):
        InMemoryPreparedSink(target, sink_id="orders", resume_from=42,  # type: ignore[arg-type]
                             checkpoint_location="/c")


def test_a_fan_out_resumes_its_ledger_and_every_targets(tmp_path: Path) -> None:
    from connectors import FanOut
    from connectors.testing import InMemoryDriverCommitSink

    pg, delta = InMemoryTarget(), InMemoryTarget()

    def fan(**resume: object) -> FanOut:
        return FanOut(InMemoryPreparedSink(pg, sink_id="orders-pg"),
                      InMemoryDriverCommitSink(delta, sink_id="orders-delta"),
                      sink_id="orders", **resume)  # type: ignore[arg-type]

    def write(f: FanOut, batch: int, start: int, query: str) -> None:
        f.write_batches({"orders-pg": _rows(10, start), "orders-delta": _rows(10, start)},
                        batch, query_id=query)

    old = fan()
    for batch in range(3):
        write(old, batch, 10 * batch, "q-1")
    sp = take_savepoint(old, _ckpt(tmp_path / "ck1", "q-1", {2: [json.dumps(ENDS)]}))
    assert sp.sink_id == "orders" and sp.batch_id == 2
    wrong = _ckpt(tmp_path / "ck-wrong", "q-2", kafka_start={"orders": {"0": 31, "1": 25}})
    with pytest.raises(QueryBindingError, match="a gap"):
        write(fan(resume_from=sp, checkpoint_location=wrong), 0, 30, "q-2")
    assert len(pg.committed_rows()) == len(delta.committed_rows()) == 30
    ckpt = _ckpt(tmp_path / "ck2", "q-3", kafka_start=ENDS)
    write(fan(resume_from=sp, checkpoint_location=ckpt), 0, 30, "q-3")
    for store, sink_id in ((pg, "orders"), (pg, "orders-pg"), (delta, "orders-delta")):
        ledger = store.ledger(sink_id)
        assert ledger.bound_query() == "q-3", sink_id
        assert [(x.from_query_id, x.batch_id) for x in ledger.lineage()] == [("q-1", 2)]
    assert sorted(r[0] for r in pg.committed_rows()) == list(range(40))
    assert sorted(r[0] for r in delta.committed_rows()) == list(range(40))
    with pytest.raises(ConfigurationError, match="give the fan-out's savepoint to the FanOut"):
        FanOut(_new(pg, sp, "/ck"), InMemoryPreparedSink(delta, sink_id="x"), sink_id="f")


def test_resume_from_a_savepoint_file_and_as_the_data_source_forms_option(
        old: tuple[InMemoryTarget, Savepoint], tmp_path: Path) -> None:
    from connectors.core.templates.options import Options
    from connectors.postgres import PostgresSink

    target, sp = old
    path = tmp_path / "sp.json"
    path.write_text(sp.dumps())
    ckpt = _ckpt(tmp_path / "ck2", "q-2", kafka_start=ENDS)
    sink = InMemoryPreparedSink(target, sink_id="orders", resume_from=str(path),
                                checkpoint_location=ckpt)
    assert sink.resume is not None and sink.resume.point == sp
    sink.write_batch(_rows(10, 30), 0, query_id="q-2")
    assert len(target.committed_rows()) == 40
    built = PostgresSink.from_options(Options({
        "conninfo": "host=db dbname=app", "table": "public.orders", "sink_id": "orders",
        "resume_from": str(path), "checkpoint_location": ckpt}))
    assert built.resume is not None and built.resume.point == sp
    assert built.resume.checkpoint == ckpt
    with pytest.raises(ConfigurationError, match=r"resume_from: the savepoint '.*nope.json' "
                                                 "cannot be read"):
        InMemoryPreparedSink(target, sink_id="orders", resume_from=str(tmp_path / "nope.json"),
                             checkpoint_location=ckpt)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="holds no savepoint"):
        InMemoryPreparedSink(target, sink_id="orders", resume_from=str(tmp_path / "bad.json"),
                             checkpoint_location=ckpt)


def test_a_fan_outs_savepoint_waits_for_its_last_batch_in_every_target(tmp_path: Path) -> None:
    from connectors import FanOut
    from connectors.core.states import CrashPoint
    from connectors.testing import InMemoryDriverCommitSink, SimulatedCrash, armed

    pg, delta = InMemoryTarget(), InMemoryTarget()
    fan = FanOut(InMemoryPreparedSink(pg, sink_id="orders-pg"),
                 InMemoryDriverCommitSink(delta, sink_id="orders-delta"), sink_id="orders")
    inputs = {"orders-pg": _rows(10), "orders-delta": _rows(10)}
    with armed(CrashPoint.AFTER_DECISION, sink_id="orders"), pytest.raises(SimulatedCrash):
        fan.write_batches(inputs, 0, query_id="q-1")
    ckpt = _ckpt(tmp_path / "ck1", "q-1", {0: [json.dumps(ENDS)]})
    with pytest.raises(ConfigurationError, match=r"batch 0 of this fan-out is decided but not "
                                                 r"yet in every target.*Run the old query"):
        take_savepoint(pg.ledger("orders"), ckpt)
    fan.write_batches(inputs, 0, query_id="q-1")  # the old query replays batch 0
    assert take_savepoint(pg.ledger("orders"), ckpt).committed
