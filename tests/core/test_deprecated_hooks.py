"""Renamed hooks keep working for one release: ``Ledger.abort`` -> ``forbid_decision``,
``recover`` -> ``list_prepared``, ``prepare_input`` -> ``plan_input``.

A subclass that still overrides the old name works (its method is the hook), with one
DeprecationWarning per class, when the class is made; a caller of the old name is warned
and reaches the new hook; an old-named override calling ``super()`` reaches its parent's
implementation, not itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pytest

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.file_ledger import FileLedger
from connectors.core.ledger import Ledger, LedgerEntry
from connectors.core.protocol import BatchState
from connectors.testing import InMemoryPreparedSink, InMemoryTarget, LocalBatch

RUN_A, RUN_B = "aaaaaaaa", "bbbbbbbb"


def entry(batch_id: int, run_id: str) -> LedgerEntry:
    return LedgerEntry("s", batch_id, run_id, BatchState.DECIDED)


def _legacy_file_ledger() -> type[FileLedger]:
    class LegacyFileLedger(FileLedger):
        calls: ClassVar[list[int]] = []

        def abort(self, batch_id: int, run_id: str) -> LedgerEntry | None:
            self.calls.append(batch_id)
            return super().abort(batch_id, run_id)  # the parent's forbid_decision

    return LegacyFileLedger


def test_a_ledger_overriding_abort_warns_once_when_made_and_is_the_hook(
        tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"LegacyFileLedger overrides Ledger\.abort\(\)"
                      r", which is renamed forbid_decision\(\)") as made:
        cls = _legacy_file_ledger()
    assert len([w for w in made if w.category is DeprecationWarning]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # nothing more: once per class
        ledger = cls(str(tmp_path), sink_id="s")
        other = cls(str(tmp_path), sink_id="s")
        assert ledger.forbid_decision(0, RUN_A) is None  # the template's call
    assert other is not ledger and cls.calls == [0]
    with pytest.raises(Exception, match="abort"):
        ledger.decide(entry(0, RUN_A))  # the override's parent recorded the abort
    decided = ledger.decide(entry(1, RUN_B))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # super().abort: not again
        assert ledger.forbid_decision(1, RUN_B) == decided
    assert cls.calls == [0, 1]


def test_a_ledger_implementing_only_abort_is_not_abstract(tmp_path: Path) -> None:
    inner = FileLedger(str(tmp_path), sink_id="s")
    with pytest.warns(DeprecationWarning, match="renamed forbid_decision"):
        class OwnLedger(Ledger):
            sink_id = "s"

            def bound_query(self) -> str | None:
                return inner.bound_query()

            def bind_query(self, query_id: str, *, reset: bool = False) -> int:
                return inner.bind_query(query_id, reset=reset)

            def get(self, batch_id: int) -> LedgerEntry | None:
                return inner.get(batch_id)

            def decide(self, entry: LedgerEntry) -> LedgerEntry:
                return inner.decide(entry)

            def abort(self, batch_id: int, run_id: str) -> LedgerEntry | None:
                return inner.forbid_decision(batch_id, run_id)

            def mark_committed(self, batch_id: int) -> None:
                inner.mark_committed(batch_id)

            def entries(self) -> Sequence[LedgerEntry]:
                return inner.entries()

            def prune(self, keep: int) -> None:
                inner.prune(keep)

    own = OwnLedger()  # type: ignore[abstract]  # mypy sees only the new abstract name
    assert own.forbid_decision(0, RUN_A) is None
    assert inner.forbid_decision(0, RUN_A) is None  # recorded through the old name


def test_calling_ledger_abort_warns_and_forbids(tmp_path: Path) -> None:
    ledger = FileLedger(str(tmp_path), sink_id="s")
    with pytest.warns(DeprecationWarning, match=r"Ledger\.abort\(\) is deprecated.*"
                      r"forbid_decision\(\)"):
        assert ledger.abort(0, RUN_A) is None
    with pytest.raises(Exception, match="abort"):
        ledger.decide(entry(0, RUN_A))


def _legacy_sink() -> type[InMemoryPreparedSink]:
    class LegacySink(InMemoryPreparedSink):
        seen: ClassVar[list[str]] = []

        def prepare_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
            self.seen.append(f"prepare_input {ctx.batch_id}")
            return super().prepare_input(batch, ctx)  # the parent's plan_input

        def recover(self) -> Iterable[str]:
            self.seen.append("recover")
            return super().recover()  # the parent's list_prepared

    return LegacySink


def test_a_sink_overriding_recover_and_prepare_input_still_works() -> None:
    with pytest.warns(DeprecationWarning) as made:
        cls = _legacy_sink()
    messages = sorted(str(w.message) for w in made if w.category is DeprecationWarning)
    assert len(messages) == 2  # one per renamed hook, once for the class
    assert "PreparedTransactionSink.recover(), which is renamed list_prepared()" in messages[0]
    assert "TwoPhaseCommitSink.prepare_input(), which is renamed plan_input()" in messages[1]
    target = InMemoryTarget()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # warned once: when made
        sink = cls(target, sink_id="legacy")
        sink.write_batch(LocalBatch(pa.table({"x": [1, 2]})), 0)
        sink.write_batch(LocalBatch(pa.table({"x": [3]})), 1)
    assert sorted(target.committed_rows()) == [(1,), (2,), (3,)]
    assert cls.seen[0] == "recover"  # reconciling, at the run's first batch
    assert [s for s in cls.seen if s != "recover"] == ["prepare_input 0", "prepare_input 1"]


def test_calling_the_old_sink_hooks_warns_and_reaches_the_new_ones() -> None:
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="mem")
    with pytest.warns(DeprecationWarning, match=r"recover\(\) is deprecated.*list_prepared"):
        assert list(sink.recover()) == []
    batch = LocalBatch(pa.table({"x": [1]}))
    ctx = BatchContext(sink_id="mem", batch_id=0, run_id=RUN_A)
    with pytest.warns(DeprecationWarning, match=r"prepare_input\(\) is deprecated.*plan_inp"):
        assert sink.prepare_input(batch, ctx) is batch  # the default plan: Spark's split
