"""Executor side, private internals: the gate of the ctypes batch produce accelerator.

The one place where the sink reads another library's object layout. It is an accelerator,
never a requirement: the public path (``Producer.produce_batch``,
:class:`~connectors.kafka._produce.BatchProducer`) writes the same records to the same
partitions in the same order, and every slot falls back to it, loudly, unless all of this
holds (:func:`verify_accelerator`, once per process, before any pointer is read):

1. ``CONNECTORS_ACCELERATORS`` is not ``off`` (CI runs the kill tests that way) and the
   sink's ``batch_produce`` option allows it;
2. CPython, 64-bit, little-endian, with the GIL;
3. ``(confluent_kafka.version(), confluent_kafka.libversion(), Producer.__basicsize__)`` is
   one of the :data:`VERIFIED` layouts: a confluent-kafka or librdkafka release that this
   module was not checked against, or a handle of another size, never gets a pointer read;
4. a throwaway child process (the same Python, the same confluent-kafka) builds a
   ``Producer``, reads its ``rd_kafka_t *`` at the verified offset and checks it with
   ``rd_kafka_opaque()`` (confluent-kafka sets the opaque to the handle itself): if the
   layout were wrong after all, the child crashes, not the Spark worker (~0.15 s, once per
   worker process).

Then every producer's pointer is still checked with ``rd_kafka_opaque`` before use.

Why bother: ``produce_batch`` builds a dict per record and parses it in C; here numpy builds
the ``rd_kafka_message_t`` array straight from the Arrow buffers (pointer = data buffer +
offset, length = offset difference), no Python object per record, and
``RD_KAFKA_MSG_F_COPY`` lets librdkafka copy each payload before the call returns. Measured
numbers are in docs/kafka.md ("Batch produce"). The producer itself is
:mod:`connectors.kafka._native_produce`.

Delivery reports: records enqueued here carry no per-record state, so ``on_delivery`` never
sees them. A failed delivery still fails the transaction (``commit_transaction`` raises an
abortable error) and the slot's redo produces record by record, whose reports name it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, Producer

from connectors.core.accelerators import ACCELERATORS_ENV, accelerators_off
from connectors.kafka._placement import (
    MURMUR2_PARTITIONERS,
    PARTITION_UA,
    murmur2,
)

__all__ = [
    "MURMUR2_PARTITIONERS",
    "VERIFIED",
    "Decision",
    "accelerators_off",
    "murmur2",
    "verify_accelerator",
]

logger = logging.getLogger(__name__)

RD_KAFKA_PARTITION_UA = PARTITION_UA
RD_KAFKA_MSG_F_COPY = 0x2
RD_KAFKA_MSG_F_PARTITION = 0x8
ERR_QUEUE_FULL = KafkaError._QUEUE_FULL
ERR_FATAL = KafkaError._FATAL

#: The environment switch that forces every private-internals accelerator off.

#: ``(confluent_kafka.version(), confluent_kafka.libversion(), Producer.__basicsize__)``
#: -> offset of ``rd_kafka_t *rk`` in the ``Producer`` object. Each entry was verified on
#: its release: ``Handle`` in ``confluent_kafka.h`` starts with ``PyObject_HEAD`` then
#: ``rd_kafka_t *rk`` (16 bytes in on 64-bit CPython), and the child check passed. Add an
#: entry only after running tests/kafka/test_kafka_native.py and
#: integration/kafka/test_kafka_native.py on that release.
VERIFIED: dict[tuple[str, str, int], int] = {
    ("2.16.1", "2.16.0", 176): 16,
}

#: ``rd_kafka_message_t`` (rdkafka.h), field for field, C alignment.
MESSAGE = np.dtype([
    ("err", "<i4"), ("rkt", "<u8"), ("partition", "<i4"), ("payload", "<u8"), ("len", "<u8"),
    ("key", "<u8"), ("key_len", "<u8"), ("offset", "<i8"), ("_private", "<u8"),
], align=True)

#: Records per ``rd_kafka_produce_batch`` call: bounds the array (72 B a record) and lets
#: delivery reports be served between calls.
CHUNK = 16_384
#: Seconds the child check may take (importing confluent-kafka: ~0.1 s).
CHILD_TIMEOUT_S = 30.0

#: What the throwaway child runs: argv[1] is the offset to read. It prints the triple it
#: saw and whether ``rd_kafka_opaque(rk)`` is the handle. A wrong layout crashes it here.
CHILD_CODE = """
import ctypes, sys
import confluent_kafka
from confluent_kafka import Producer, cimpl
lib = ctypes.CDLL(cimpl.__file__)
lib.rd_kafka_opaque.restype = ctypes.c_void_p
lib.rd_kafka_opaque.argtypes = [ctypes.c_void_p]
p = Producer({"log_level": 0})
rk = ctypes.c_void_p.from_address(id(p) + int(sys.argv[1])).value
ok = bool(rk) and lib.rd_kafka_opaque(rk) == id(p)
text = [v[0] if isinstance(v, tuple) else v
        for v in (confluent_kafka.version(), confluent_kafka.libversion())]
print(*text, Producer.__basicsize__, "verified" if ok else "mismatch")
"""

#: Where empty (not null) values and keys point: librdkafka reads no byte of them.
_EMPTY = ctypes.create_string_buffer(1)


def layout_triple() -> tuple[str, str, int]:
    """What :data:`VERIFIED` is keyed by, for the installed confluent-kafka (reads no
    pointer: versions and the type's size)."""
    import confluent_kafka

    return (_text(confluent_kafka.version()), _text(confluent_kafka.libversion()),
            int(Producer.__basicsize__))


def _text(version: Any) -> str:
    """A version string from ``version()`` (a string in 2.16) or ``libversion()`` (a
    ``(string, int)`` tuple)."""
    return str(version[0] if isinstance(version, tuple) else version)


@dataclass(frozen=True)
class Decision:
    """Whether this process may use the accelerator: ``offset`` of ``rk`` (``None``: no)
    and why not."""

    offset: int | None
    why: str = ""


class RdKafka:
    """The librdkafka functions used here, typed once per process."""

    def __init__(self) -> None:
        from confluent_kafka import cimpl

        lib = ctypes.CDLL(cimpl.__file__)
        vp, c_int, i32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int32
        lib.rd_kafka_opaque.restype = vp
        lib.rd_kafka_opaque.argtypes = [vp]
        lib.rd_kafka_topic_new.restype = vp
        lib.rd_kafka_topic_new.argtypes = [vp, ctypes.c_char_p, vp]
        lib.rd_kafka_topic_destroy.restype = None
        lib.rd_kafka_topic_destroy.argtypes = [vp]
        lib.rd_kafka_produce_batch.restype = c_int
        lib.rd_kafka_produce_batch.argtypes = [vp, i32, c_int, vp, c_int]
        lib.rd_kafka_fatal_error.restype = c_int
        lib.rd_kafka_fatal_error.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t]
        if MESSAGE.itemsize != 8 * 9:
            raise OSError(f"rd_kafka_message_t would be {MESSAGE.itemsize} bytes, not 72")
        self.lib = lib


class _State:
    """This process's decision (made once, under ``lock``) and the typed library."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decided: Decision | None = None
        self.lib: RdKafka | None = None
        self.warned_handle = False


STATE = _State()


def _platform_problem() -> str | None:
    if platform.python_implementation() != "CPython":
        return platform.python_implementation()
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return f"{ctypes.sizeof(ctypes.c_void_p) * 8}-bit Python"
    if sys.byteorder != "little":
        return "a big-endian machine"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "a free-threaded Python"
    return None


def _child_check(offset: int, triple: tuple[str, str, int]) -> str | None:
    """Run :data:`CHILD_CODE` in a new interpreter; ``None`` if it verified the layout,
    else why not (a crash, a timeout, another triple, a mismatch)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD_CODE, str(offset)], env=env, capture_output=True,
            timeout=CHILD_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the layout check could not run ({type(exc).__name__})"
    if done.returncode != 0:
        how = (f"signal {-done.returncode}" if done.returncode < 0
               else f"exit code {done.returncode}")
        return f"the layout check crashed in a throwaway process ({how})"
    words = done.stdout.decode(errors="replace").split()
    expected = [*map(str, triple), "verified"]
    if words[-4:] != expected:
        return f"the layout check in a throwaway process answered {' '.join(words[-4:])!r}"
    return None


def verify_accelerator() -> Decision:
    """Once per process: may the accelerator run here? (See the module docstring.)

    The first call logs one WARNING when the accelerator is unavailable (naming why and
    what it costs), or one INFO when ``CONNECTORS_ACCELERATORS=off`` turned it off.
    """
    state = STATE
    with state.lock:
        if state.decided is not None:
            return state.decided
        cost = ("slots produce through the public Producer.produce_batch instead, about "
                "2-3x the Python CPU per record of the accelerator (docs/kafka.md, "
                "'Batch produce')")
        if accelerators_off():
            state.decided = Decision(None, f"{ACCELERATORS_ENV}=off")
            logger.info("batch produce accelerator off (%s): %s", state.decided.why, cost)
            return state.decided
        why = _platform_problem()
        triple = layout_triple()
        offset = VERIFIED.get(triple)
        if why is None and offset is None:
            why = (f"confluent-kafka {triple[0]} with librdkafka {triple[1]} "
                   f"(Producer.__basicsize__ {triple[2]}) is not a verified layout")
        if why is None and offset is not None:
            try:
                state.lib = RdKafka()
            except (OSError, AttributeError) as exc:
                why = f"librdkafka not loadable ({type(exc).__name__})"
        if why is None and offset is not None:
            why = _child_check(offset, triple)
        if why is not None or offset is None:
            state.decided = Decision(None, why or "unverified")
            logger.warning("batch produce accelerator unavailable (%s): %s",
                           state.decided.why, cost)
            return state.decided
        state.decided = Decision(offset)
        return state.decided


def _reset_for_tests() -> None:
    """Forget the decision (tests only)."""
    with STATE.lock:
        STATE.decided = None
        STATE.lib = None
        STATE.warned_handle = False
