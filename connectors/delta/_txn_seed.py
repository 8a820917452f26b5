"""The one private-internals accelerator of the Delta sink: Delta 4.4.0's txn lookup answered
from the commit's checksum. Used only on the ``delta_txn_id=True`` path; the default path
(:mod:`connectors.delta._sink`, "tag") writes no txn id, so Delta does no lookup at all.

Delta 4.4.0 answers ``txnVersion(appId)`` (called by every write that carries ``txnAppId``)
from ``Snapshot.transactions``, a lazy val computed from ``computedState``: a full
state-reconstruction job over the log, on every commit, although the snapshot that the commit
itself installs carries a checksum (``checksumOpt``, the content of the ``.crc`` file) whose
``setTransactions`` are exactly the table's txn ids. Delta 4.4.0 has no configuration that
reads them from there (checked in the jar: ``setTransactionsInCrc.writeOnCommit`` and
``.maxAllowed`` exist, no reading switch), nor has the open-source line since. So after each
commit :func:`seed_txn_lookup` fills that one lazy val of the post-commit snapshot from its
checksum; the next batch's transaction starts from the same snapshot object and skips the
job. Delta still makes the decision (skip a replay, record the app id for its conflict
check); only where the set of txn ids comes from changes.

Guards, all checked before anything is touched:

1. ``CONNECTORS_ACCELERATORS=off`` (also ``0``/``false``/``no``) turns it off everywhere;
   the sink's ``txn_seed=False`` turns it off for one sink.
2. The Delta classes are byte-for-byte the verified 4.4.0 ones: the SHA-256 of
   ``Snapshot.class`` and ``SnapshotStateManager.class`` must equal :data:`VERIFIED_CLASSES`
   (an allow-list; another build, even another Scala or Spark line of 4.4.0, is refused).
3. Per commit: a checksum with ``setTransactions`` that holds this commit's app id at this
   batch or later, no txn retention configured, the value not already computed; the bit is
   published with a CAS on the lazy-val bitmap.

:func:`seed_problem` says once per JVM why the accelerator cannot run (``None`` when it
can); the sink logs one WARNING naming the cost then. Any error while seeding is swallowed
(logged at DEBUG): Delta falls back to its own lookup.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

from connectors.core.accelerators import ACCELERATORS_ENV, accelerators_off

__all__ = [
    "ACCELERATORS_ENV",
    "VERIFIED_CLASSES",
    "accelerators_off",
    "delta_log_class",
    "seed_problem",
    "seed_txn_lookup",
]

logger = logging.getLogger(__name__)

#: The one environment switch of every private-internals accelerator of the library.
_SNAPSHOT_CLASS = "org.apache.spark.sql.delta.Snapshot"
#: The allow-list: class file -> SHA-256, Delta 4.4.0 (delta-spark_4.2_2.13-4.4.0.jar).
VERIFIED_CLASSES = {
    "org/apache/spark/sql/delta/Snapshot.class":
        "45b7de65a78da74785908dba3c35de97d8724757f5e6f2fe479d2a00d0ab75f7",
    "org/apache/spark/sql/delta/SnapshotStateManager.class":
        "3429b92d8be569fd14a1b040461dcd517c7aae1df08270e6512134673d7ef882",
}
#: In those classes: ``transactions`` is initialized iff this bit of ``bitmap$0`` is set
#: (``Snapshot.transactions$lzycompute``), and ``SnapshotStateManager.$anonfun$transactions$1``
#: is the ``t => t.appId -> t.version`` of ``transactions`` (the Long boxed as Delta boxes it).
_TRANSACTIONS_BIT = 1 << 19
_RETENTION_KEY = "delta.setTransactionRetentionDuration"
_LOCK = threading.Lock()
# id(JVM view) -> (view, _SeedTools or the reason it is unavailable); the view is kept so
# that its id is never reused by another one.
_tools: dict[int, tuple[Any, Any]] = {}
_delta_log_classes: dict[int, tuple[Any, Any]] = {}


class _SeedTools:
    """Reflection handles for one driver JVM whose Delta classes are the verified ones.

    Every handle is looked up once: each lookup is a py4j round trip, and the seed runs
    after every commit. The constructor raises ``LookupError`` naming the first class that
    is not the verified one.
    """

    def __init__(self, jvm: Any, snapshot_class: Any) -> None:
        loader = snapshot_class.getClassLoader()
        for resource, digest in VERIFIED_CLASSES.items():
            stream = loader.getResourceAsStream(resource)
            if stream is None:
                raise LookupError(f"{resource} is missing")
            try:
                data = bytes(stream.readAllBytes())
            finally:
                stream.close()
            if hashlib.sha256(data).hexdigest() != digest:
                raise LookupError(f"{resource} is not the verified Delta 4.4.0 class "
                                  "(SHA-256 differs)")
        self.field = snapshot_class.getDeclaredField("transactions")
        self.field.setAccessible(True)
        unsafe_field = jvm.java.lang.Class.forName("sun.misc.Unsafe").getDeclaredField(
            "theUnsafe")
        unsafe_field.setAccessible(True)
        self.unsafe = unsafe_field.get(None)
        self.bitmap = self.unsafe.objectFieldOffset(snapshot_class.getDeclaredField("bitmap$0"))
        self.pair = getattr(jvm.org.apache.spark.sql.delta.SnapshotStateManager,
                            "$anonfun$transactions$1")
        self.empty_map = getattr(
            getattr(jvm.scala.collection.immutable, "Map$"), "MODULE$").empty()


def delta_log_class(jvm: Any) -> Any:
    """``DeltaLog``'s py4j class handle, looked up once per JVM (six round trips)."""
    known = _delta_log_classes.get(id(jvm))
    if known is None or known[0] is not jvm:
        known = _delta_log_classes[id(jvm)] = (jvm, jvm.org.apache.spark.sql.delta.DeltaLog)
    return known[1]


def _tools_for(session: Any) -> Any:
    """The JVM's :class:`_SeedTools`, or a string saying why there are none."""
    jvm = getattr(session, "_jvm", None)
    if jvm is None:
        return "no JVM gateway (Spark Connect)"
    with _LOCK:
        known = _tools.get(id(jvm))
        if known is not None and known[0] is jvm:
            return known[1]
        try:
            cls = jvm.py4j.reflection.ReflectionUtil.classForName(_SNAPSHOT_CLASS)
            found: Any = _SeedTools(jvm, cls)
        except Exception as exc:  # LookupError, or a py4j error: another Delta
            found = f"Delta's classes are not the verified 4.4.0 ones: {exc}"
        _tools[id(jvm)] = (jvm, found)
        return found


def seed_problem(session: Any) -> str | None:
    """Why the accelerator cannot run in this driver (``None``: it can). Checks the
    environment switch, then (once per JVM) the class digests."""
    if accelerators_off():
        return f"{ACCELERATORS_ENV}=off"
    tools = _tools_for(session)
    return tools if isinstance(tools, str) else None


def seed_txn_lookup(session: Any, location: str, app_id: str, batch_id: int) -> bool:
    """Fill ``transactions`` of the table's post-commit snapshot from its checksum.

    Called right after the commit of ``(app_id, batch_id)``. Returns whether it did; any
    doubt (the switch off, other Delta classes, no checksum, the checksum without txn ids
    or without this commit's, a txn retention configured, the state already computed)
    leaves the snapshot alone. Never raises. About 20 py4j round trips (3 ms).
    """
    if accelerators_off():
        return False
    tools = _tools_for(session)
    if isinstance(tools, str):
        return False
    from py4j.protocol import Py4JError

    try:
        log = delta_log_class(session._jvm).forTable(session._jsparkSession, location)
        snapshot = log.unsafeVolatileSnapshot()
        if snapshot.getClass().getName() != _SNAPSHOT_CLASS:
            return False
        unsafe, offset = tools.unsafe, tools.bitmap
        if unsafe.getIntVolatile(snapshot, offset) & _TRANSACTIONS_BIT:
            return False  # already known
        if snapshot._computedStateTriggered():
            return False  # the state is computed anyway: transactions costs no job
        # With a retention, the reconstruction drops expired ids by the time it runs:
        # keep Delta's own answer there.
        if snapshot.metadata().configuration().contains(_RETENTION_KEY):
            return False
        # No checksum, or one without txn ids (None.get throws): leave it to Delta.
        try:
            txns = snapshot.checksumOpt().get().setTransactions().get()
        except Py4JError:
            return False
        table_txns = tools.empty_map
        it = txns.iterator()
        while it.hasNext():
            table_txns = getattr(table_txns, "$plus")(tools.pair(it.next()))
        try:
            ours = int(table_txns.apply(app_id))
        except Py4JError:  # not in the checksum
            return False
        if ours < batch_id:
            return False  # not the checksum of (or after) this commit
        # Publish: the value first, then the bit with a CAS on the volatile bitmap (a bit of
        # another lazy val set meanwhile is never lost; if ours is, Delta recomputes).
        tools.field.set(snapshot, table_txns)
        for _ in range(8):
            old = unsafe.getIntVolatile(snapshot, offset)
            if old & _TRANSACTIONS_BIT or unsafe.compareAndSwapInt(
                snapshot, offset, old, old | _TRANSACTIONS_BIT
            ):
                return True
        return False
    except Exception as exc:  # an optimisation only: Delta falls back to its own lookup
        logger.debug("DeltaSink: txn lookup not seeded: %s", type(exc).__name__)
        return False
