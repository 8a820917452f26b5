"""Stopping a streaming query without leaving anything behind: the Spark side.

Spark has no "stop after this batch": ``query.stop()`` interrupts the batch in flight.
:func:`stop_gracefully` asks the query's sinks to refuse their *next* batch
(:class:`~connectors.core.errors.GracefulStop`, raised before any side effect), lets the
batch in flight finish (in the target and in Spark's commit log), and then:

- the query ends by itself when its next batch is refused (``refused_next_batch``): that
  batch has no commit-log entry and is replayed at the next start;
- a query with no batch running is stopped with ``query.stop()`` (``stopped_idle``);
- a query that ended while the helper waited (an ``availableNow`` query out of input, or
  someone else's stop) is ``ended``;
- past ``timeout``, ``query.stop()`` interrupts the batch (``timed_out``): in classic
  PySpark the sink rolls back what is undecided before the query ends and finishes what is
  decided; under Spark Connect the foreachBatch worker ends with the query, which leaves
  what a hard kill leaves, settled by the next start.

The request reaches the sinks through process memory (:mod:`connectors.core.policies.stopping`) in
classic PySpark, and through the session's configuration under Spark Connect, whose
foreachBatch worker shares the client's session (:func:`connectors.spark._binding.stop_flag`).
The DataSource form's planning worker, a process of its own on the driver's host, reads
a file (:func:`host_stop_flag`) and refuses the next batch before it writes anything.
:func:`stop_on_sigterm` installs the stop as a SIGTERM handler (what a deploy sends), and
:func:`await_termination` waits for the query and takes a graceful stop as a normal end.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from connectors.core.errors import GRACEFUL_STOP_TAG
from connectors.core.policies.stopping import busy, request_stop, withdraw_stop
from connectors.spark._binding import is_connect, set_stop_flag

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame

__all__ = ["StopReport", "await_termination", "stop_gracefully", "stop_on_sigterm"]

logger = logging.getLogger(__name__)

StopOutcome = Literal["refused_next_batch", "stopped_idle", "ended", "timed_out",
                      "already_stopped", "failed"]
_CLEAN: frozenset[str] = frozenset({"refused_next_batch", "stopped_idle", "ended",
                                    "already_stopped"})
#: How long a cancelled job's tasks may take to end: Spark kills a Python worker whose task
#: was cancelled after ``spark.python.task.killTimeout`` (2 s by default).
TASKS_END_TIMEOUT = 10.0
#: Under Spark Connect (no status tracker): wait this long instead.
CONNECT_TASKS_END_WAIT = 3.0


@dataclass(frozen=True)
class StopReport:
    """What :func:`stop_gracefully` did.

    ``outcome``: ``refused_next_batch`` (the batch in flight finished, the next one was
    refused and is replayed at the next start), ``stopped_idle`` (no batch was running:
    ``query.stop()``), ``ended`` (the query ended by itself meanwhile), ``timed_out`` (the
    batch in flight did not finish in time and was interrupted), ``already_stopped``, or
    ``failed`` (the query ended with an error of its own, in ``message``).
    ``last_batch``: the last batch Spark reported done, if any; ``seconds``: the stop's
    time.
    """

    outcome: StopOutcome
    seconds: float
    last_batch: int | None
    message: str

    @property
    def clean(self) -> bool:
        """Whether nothing was interrupted: every batch Spark started was written and
        committed, or is replayed at the next start without anything left behind."""
        return self.outcome in _CLEAN


def _graceful(error: BaseException | None) -> bool:
    return error is not None and GRACEFUL_STOP_TAG in str(error)


def _last_batch(query: Any) -> int | None:
    try:
        progress = query.lastProgress
    except Exception:  # a stopped Connect query may not answer: the figure is optional
        return None
    return int(progress["batchId"]) if progress else None


def _ended(query: Any, started: float) -> StopReport:
    error = query.exception()
    seconds = time.monotonic() - started
    if error is None:
        return StopReport("ended", seconds, _last_batch(query),
                          "the query ended by itself while the stop waited")
    if _graceful(error):
        return StopReport("refused_next_batch", seconds, _last_batch(query),
                          "the batch in flight finished; the next batch was refused and is "
                          "replayed when the query starts again")
    return StopReport("failed", seconds, _last_batch(query),
                      f"the query failed: {str(error).splitlines()[0][:500]}")


def host_stop_flag(query_id: str) -> Path:
    """The file that asks the processes Spark starts on this host for the query (the
    DataSource form's planning worker) to refuse the query's next batch: they share no
    memory with the program that asks for the stop."""
    return Path(tempfile.gettempdir()) / "connectors-stops" / query_id


def _flag_host(query_id: str, on: bool) -> None:
    flag = host_stop_flag(query_id)
    try:
        if on:
            flag.parent.mkdir(parents=True, exist_ok=True)
            flag.touch()
        else:
            flag.unlink(missing_ok=True)
    except OSError as exc:  # the in-process request still stands
        logger.warning("graceful stop of query %s: the host's stop flag %s: %s", query_id,
                       "could not be written" if on else "could not be removed",
                       type(exc).__name__)


def _idle(query: Any, query_id: str) -> bool:
    """No batch running: Spark's trigger is not active and (classic) no sink of the query
    is in a batch in this process. Spark writes a batch's commit-log entry before its
    trigger ends, so an idle query has every started batch recorded."""
    return not busy(query_id) and not query.status["isTriggerActive"]


def _session_of(query: Any, spark: Any) -> Any:
    """The session a Connect query's stop request goes to: ``spark``, or the process's
    active (else default) Connect session. A StreamingQuery does not name its session."""
    if spark is not None:
        return spark
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.active()


def stop_gracefully(query: Any, timeout: float = 120.0, *, poll: float = 0.1,
                    spark: Any = None) -> StopReport:
    """Stop ``query`` after the batch in flight: nothing undecided left behind.

    The batch in flight finishes and commits, in the target and in Spark's commit log; the
    next batch is refused before any side effect (Spark replays it at the next start);
    then the query ends. Past ``timeout`` seconds the batch in flight is interrupted
    (``query.stop()``; see the module's documentation for what remains). Works for
    classic PySpark and Spark Connect queries alike; for the sinks of this library (any
    :class:`~connectors.sdk.TwoPhaseCommitSink`) given to ``foreachBatch``.

    Returns a :class:`StopReport`; ``report.clean`` says whether nothing was interrupted.
    ``spark``: under Spark Connect, the session that started the query (default: the
    active session), through which the request reaches the sinks.

    Example::

        from connectors import DeltaSink, stop_gracefully

        sink = DeltaSink(f"{path}/events", sink_id=sink_id, create_table=True)
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
        query.processAllAvailable()
        report = stop_gracefully(query, timeout=60)
        assert report.clean and report.outcome == "stopped_idle", report
    """
    started = time.monotonic()
    if not query.isActive:
        report = _ended(query, started)
        if report.outcome == "ended":
            return StopReport("already_stopped", report.seconds, report.last_batch,
                              "the query was not running")
        return report
    query_id = str(query.id)
    session = _session_of(query, spark) if is_connect(query) else None
    request_stop(query_id)
    _flag_host(query_id, True)
    if session is not None:
        set_stop_flag(session, query_id, True)
    logger.info("graceful stop of query %s: the batch in flight finishes, the next one is "
                "refused (timeout %.0f s)", query_id, timeout)
    try:
        deadline = started + timeout
        while True:
            if not query.isActive:
                report = _ended(query, started)
                break
            if _idle(query, query_id):
                query.stop()
                if _graceful(query.exception()):
                    report = _ended(query, started)
                else:
                    report = StopReport("stopped_idle", time.monotonic() - started,
                                        _last_batch(query),
                                        "no batch was running: the query was stopped")
                break
            if time.monotonic() > deadline:
                logger.warning("graceful stop of query %s: the batch in flight did not finish "
                               "in %.0f s; interrupting it", query_id, timeout)
                query.stop()
                report = StopReport(
                    "timed_out", time.monotonic() - started, _last_batch(query),
                    f"the batch in flight did not finish in {timeout:.0f} s and was "
                    "interrupted: what was undecided is rolled back (classic PySpark) or "
                    "settled by the next start (Spark Connect)")
                break
            time.sleep(poll)
    finally:
        withdraw_stop(query_id)
        _flag_host(query_id, False)
        if session is not None:
            try:
                set_stop_flag(session, query_id, False)
            except Exception as exc:  # the session may be gone; the request dies with it
                logger.debug("clearing the stop request of %s failed: %s", query_id, exc)
    log = logger.info if report.clean else logger.warning
    log("graceful stop of query %s: %s in %.1f s (%s)", query_id, report.outcome,
        report.seconds, report.message)
    return report


_stops: dict[str, threading.Thread] = {}
_stops_lock = threading.Lock()


def stop_on_sigterm(query: Any, timeout: float = 120.0, *, spark: Any = None) -> Any:
    """On SIGTERM (what a deploy or ``kill`` sends), stop ``query`` gracefully.

    Call it from the main thread after ``start()``. The handler only starts the stop in a
    thread (a signal handler must not call the JVM); :func:`await_termination` then returns
    once the query has ended, and the program exits normally. A second SIGTERM while the
    stop runs is ignored. Returns the SIGTERM handler it replaced. ``spark``: as for
    :func:`stop_gracefully` (resolved now, in the calling thread).

    Example (the SIGTERM a deploy would send, sent here by the program itself)::

        import os
        import signal

        from connectors import DeltaSink, await_termination, stop_on_sigterm

        sink = DeltaSink(f"{path}/events", sink_id=sink_id, create_table=True)
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
        previous = stop_on_sigterm(query)
        os.kill(os.getpid(), signal.SIGTERM)
        assert await_termination(query)  # the query ended without an error
        signal.signal(signal.SIGTERM, previous)
    """
    query_id = str(query.id)
    session = _session_of(query, spark) if is_connect(query) else None

    def handler(signum: int, frame: FrameType | None) -> None:
        with _stops_lock:
            if query_id in _stops:
                return
            request_stop(query_id)  # memory only: the thread does what needs the JVM
            thread = threading.Thread(target=_stop_in_thread, args=(query, timeout, session),
                                      name=f"connectors-stop-{query_id}", daemon=True)
            _stops[query_id] = thread
        thread.start()

    return signal.signal(signal.SIGTERM, handler)


def _stop_in_thread(query: Any, timeout: float, session: Any) -> None:
    try:
        stop_gracefully(query, timeout, spark=session)
    except Exception:
        logger.exception("graceful stop of query %s failed", query.id)


def await_termination(query: Any, timeout: float | None = None) -> bool:
    """``query.awaitTermination(timeout)``, where a graceful stop is a normal end.

    Returns whether the query has ended (always ``True`` without ``timeout``). Raises the
    query's error when it failed for any other reason. Waits for a stop that
    :func:`stop_on_sigterm` started to finish its work.

    A query that Spark refuses to start because its offset log holds only what a killed
    driver's first offset write left (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``) raises
    its error with a note (logged too) naming ``connectors doctor`` and the safe fix.
    """
    try:
        ended = query.awaitTermination(timeout) if timeout is not None \
            else (query.awaitTermination() or True)
    except Exception as exc:
        if not _graceful(exc):
            _explain_refused_start(exc)
            raise
        ended = True
    if ended:
        with _stops_lock:
            thread = _stops.pop(str(query.id), None)
        if thread is not None:
            thread.join(timeout=30)
    return bool(ended)


#: Spark >= 4.1's refusal to start a query whose offset log is not empty at batch 0.
REFUSED_START = "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"


def refused_start_hint(error: BaseException) -> str | None:
    """What to do when ``error`` is Spark's refusal to start a query over an offset log that
    holds only a killed driver's temporary files (``None`` for any other error)."""
    text = str(error)
    if REFUSED_START not in text or "offsets" not in text:
        return None
    return ("Spark refused to start this query: its checkpoint's offsets/ directory is not "
            "empty, though no batch was planned. A driver killed while Spark wrote the first "
            "offset log entry leaves that write's temporary files (offsets/.0.<uuid>.tmp) and "
            "nothing else; the sink then wrote nothing for this query. Run `connectors doctor "
            "--checkpoint <checkpoint> ...`: it lists those files and the safe fix (remove "
            "only them, then restart; every row is delivered once)")


def _explain_refused_start(error: BaseException) -> None:
    hint = refused_start_hint(error)
    if hint is None:
        return
    logger.error("%s", hint)
    add_note = getattr(error, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(hint)


def await_batch_tasks(df: DataFrame, connect: bool) -> None:
    """Classic: until the status tracker shows no running task in the batch's job group
    (at most 10 s). Connect has no status tracker: a fixed 3 s, longer than
    ``spark.python.task.killTimeout``."""
    if connect:
        time.sleep(CONNECT_TASKS_END_WAIT)
    else:
        await_tasks_ended(df.sparkSession.sparkContext)


def batch_tasks_ended(df: DataFrame, connect: bool) -> bool:
    """Classic: the status tracker shows no running task in the batch's job group, asked
    without waiting. Connect has no status tracker: ``False`` (cannot tell)."""
    return not connect and running_tasks(df.sparkSession.sparkContext) == 0


def running_tasks(sc: SparkContext) -> int | None:
    """How many tasks of the calling thread's job group (the batch's jobs) still run, by
    the status tracker; ``None`` when the thread has no job group (no way to tell)."""
    group = sc.getLocalProperty("spark.jobGroup.id")
    if not group:
        return None
    tracker = sc.statusTracker()
    active = 0
    for job_id in sorted(tracker.getJobIdsForGroup(group))[-8:]:  # this batch's jobs
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info is not None else ():
            stage = tracker.getStageInfo(stage_id)
            active += stage.numActiveTasks if stage is not None else 0
    return active


def await_tasks_ended(sc: SparkContext, timeout: float = TASKS_END_TIMEOUT) -> None:
    """Wait (up to ``timeout`` s) until no task of the calling thread's job group runs:
    after a job of the batch was cancelled (a stopped query), its tasks may still run."""
    deadline = time.monotonic() + timeout
    while True:
        active = running_tasks(sc)
        if active is None:
            time.sleep(CONNECT_TASKS_END_WAIT)
            return
        if active == 0:
            return
        if time.monotonic() > deadline:
            logger.warning("%d task(s) of job group %s still run %.0f s after the batch was "
                           "interrupted; the next start settles what they leave", active,
                           sc.getLocalProperty("spark.jobGroup.id"), timeout)
            return
        time.sleep(0.2)
