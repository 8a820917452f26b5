"""``PreparedAdmin.settle``: the one settle of PostgreSQL's and MariaDB's admins, in memory.

A decided batch's prepared transaction is committed, an undecided one rolled back after
its run's decision is forbidden in the ledger (a live driver of that run could then no
longer decide it), a kept one left; another sink's transactions are never touched; the
operator's sink and ledger are closed. The real databases' runs are
``integration/cli/test_cli_postgres.py`` and ``integration/mariadb/test_mariadb_operator.py``.
"""

from __future__ import annotations

from connectors.core.driver.operator import PreparedAdmin, PreparedTransaction
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.states import BatchState
from connectors.testing import InMemoryPreparedSink, InMemoryTarget

RUN = "0a1b2c3d"


class MemoryAdmin(PreparedAdmin):
    """An admin over an :class:`InMemoryTarget` (its prepared transactions have no age)."""

    def __init__(self, target: InMemoryTarget) -> None:
        self.target = target
        self.closed_sinks = 0

    def describe(self) -> str:
        return "memory"

    def prepared(self, sink_id: str | None = None) -> list[PreparedTransaction]:
        found = [TransactionId.parse(t) for t in self.target.prepared]
        return [PreparedTransaction(t, None) for t in found
                if t is not None and (sink_id is None or t.sink_id == sink_id)]

    def sink_ids(self) -> list[str]:
        return sorted(self.target.ledgers)

    def ledger(self, sink_id: str) -> Ledger:
        return self.target.ledger(sink_id)

    def operator_sink(self, sink_id: str) -> InMemoryPreparedSink:
        admin = self

        class Closing(InMemoryPreparedSink):
            def close(self) -> None:
                admin.closed_sinks += 1
                super().close()

        return Closing(self.target, sink_id=sink_id)

    def close(self) -> None:
        pass


def test_settle_commits_the_decided_rolls_back_the_undecided_and_keeps_what_it_is_told() -> None:
    target = InMemoryTarget()
    decided, undecided, kept = (str(TransactionId("s1", RUN, b, 0)) for b in (1, 2, 3))
    other = str(TransactionId("s2", RUN, 2, 0))
    for tid in (decided, undecided, kept, other):
        target.prepared[tid] = [(tid,)]
    target.ledger("s1").decide(LedgerEntry("s1", 1, RUN, BatchState.DECIDED,
                                           (TaskCommit(decided, 0, 7, Fingerprint()),)))

    with MemoryAdmin(target) as admin:
        left = [str(p.transaction_id) for p in admin.prepared("s1")]
        done = admin.settle("s1", [*left, other], commit_decided=True, abort_undecided=True,
                            keep=frozenset({kept}))

    assert done.committed == [decided] and done.aborted == [undecided] and done.left == [kept]
    assert target.committed_rows() == [(decided,)]
    assert sorted(target.prepared) == sorted([kept, other]), "another sink's is untouched"
    assert (2, RUN) in target.ledgers["s1"].aborts, "the roll-back is recorded first"
    entry = target.ledger("s1").get(1)
    assert entry is not None and entry.state is BatchState.COMMITTED
    assert admin.closed_sinks == 1


def test_commit_decided_alone_never_rolls_back() -> None:
    target = InMemoryTarget()
    undecided = str(TransactionId("s1", RUN, 4, 0))
    target.prepared[undecided] = [(1,)]
    done = MemoryAdmin(target).settle("s1", [undecided], commit_decided=True,
                                      abort_undecided=False)
    assert done.left == [undecided] and not done.aborted and undecided in target.prepared
