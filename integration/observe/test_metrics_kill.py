"""The driver's gauges across a real kill (issue 40, item 1): the driver SIGKILLed after
every task of batch 1 pre-committed (crash point ``before_decision``: its tasks' PREPAREs
done, no decision yet) leaves their prepared transactions, which no decision lists. The
restart's first batch settles them: the lingering gauge shows how many it found and the
aborted counter their rollback; the batches after it show 0. The dead driver recorded
nothing for batch 1 (it could not): ``connectors status --watch`` is the figure from
outside (integration/cli/test_cli_watch.py). Read from the Prometheus textfile the driver
program writes (``--prometheus-textfile``), polled while it runs; checked row by row.
(A task killed at ``after_precommit`` leaves nothing to show: the surviving driver rolls
its batch back before the query ends, see test_postgres_kill.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connectors.core.states import CrashPoint
from integration.postgres.test_postgres_kill import PgJob, pg  # noqa: F401 - the fixture
from integration.support._pg import PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Sample = dict[str, float]


class TextfileWatcher(threading.Thread):
    """Every 50 ms, the sink's gauges in the textfile, each change kept in order."""

    def __init__(self, path: Path, sink_id: str) -> None:
        super().__init__(daemon=True)
        self.path, self.sink_id = path, sink_id
        self.seen: list[Sample] = []
        self.done = threading.Event()

    def read(self) -> Sample | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        got: Sample = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("sink_id") == self.sink_id and "outcome" not in s.labels:
                    got[s.name] = s.value
        return got or None

    def run(self) -> None:
        while not self.done.wait(0.05):
            try:
                now = self.read()
            except ValueError:  # caught half-written: the next read sees it whole
                continue
            if now is not None and (not self.seen or now != self.seen[-1]):
                self.seen.append(now)

    def stop(self) -> list[Sample]:
        self.done.set()
        self.join()
        final = self.read()
        if final is not None and (not self.seen or final != self.seen[-1]):
            self.seen.append(final)
        return self.seen


def test_lingering_gauge_rises_after_a_driver_sigkilled_with_prepared_transactions(
    tmp_path: Path, pg: PgTarget  # noqa: F811
) -> None:
    job = PgJob(tmp_path, pg, files=4)
    crashed_file, restart_file = tmp_path / "crashed.prom", tmp_path / "restart.prom"
    watch = TextfileWatcher(crashed_file, pg.sink_id)
    watch.start()
    first = job.run("--prometheus-textfile", str(crashed_file),
                    crash=f"{CrashPoint.BEFORE_DECISION.value}:batch=1")
    crashed = watch.stop()
    assert first.returncode == -9, first.tail()
    assert job.reached(CrashPoint.BEFORE_DECISION, 1), first.tail()
    left = pg.prepared()
    assert left, "batch 1's tasks should have left prepared transactions"
    # The killed run's last word is batch 0's: committed, nothing lingering, no lag.
    assert crashed[-1]["connectors_last_committed_batch_id"] == 0, crashed
    assert crashed[-1]["connectors_lag_batches"] == 0, crashed
    assert crashed[-1]["connectors_lingering_transactions"] == 0, crashed

    watch = TextfileWatcher(restart_file, pg.sink_id)
    watch.start()
    second = job.run("--prometheus-textfile", str(restart_file))
    seen = watch.stop()
    assert second.returncode == 0, second.tail()
    lingering = [s.get("connectors_lingering_transactions") for s in seen]
    # Batch 1 again: the run's start found the dead run's prepared transactions (and
    # rolled them back: undecided); the batches after it find none.
    rose = [i for i, v in enumerate(lingering) if v == len(left)]
    assert rose, seen
    assert lingering[-1] == 0, seen
    assert any(v == 0 for v in lingering[rose[0]:]), seen
    assert seen[-1]["connectors_aborted_transactions_total"] == len(left), seen
    assert seen[-1]["connectors_lag_batches"] == 0, seen
    assert seen[-1]["connectors_last_committed_batch_id"] == 3, seen
    print("crashed run:", [(s.get("connectors_last_committed_batch_id"),
                            s.get("connectors_lag_batches")) for s in crashed])
    print("restart:", [(s.get("connectors_last_committed_batch_id"),
                        s.get("connectors_lingering_transactions"),
                        s.get("connectors_lag_batches")) for s in seen])
    job.assert_exact()
    assert pg.prepared() == []
