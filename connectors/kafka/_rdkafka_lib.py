"""Executor side, prototype (issue 55): librdkafka itself, loaded by documented means and
typed for :mod:`connectors.kafka._rdkafka` (its public C API only; see there).

:func:`find_librdkafka`: ``CONNECTORS_LIBRDKAFKA`` (a path), else the copy listed in
confluent-kafka's installed files (``importlib.metadata.files``: a wheel's RECORD names
``confluent_kafka.libs/librdkafka-<hash>.so.1``, the file its extension loads, so the
process keeps one librdkafka), else the system's (``ctypes.util.find_library``: a
confluent-kafka built from source links that one). :func:`load` checks
``rd_kafka_version()`` against :data:`MIN_VERSION` and that every function used exists.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CHUNK", "MESSAGE", "MIN_VERSION", "VU", "Library", "Metadata", "RdKafkaError",
           "find_librdkafka", "load"]

#: Environment variable naming the librdkafka shared library to load (a path).
LIBRDKAFKA_ENV = "CONNECTORS_LIBRDKAFKA"
#: Oldest librdkafka accepted (``rd_kafka_version()``, 0xMMmmrrxx): 2.0.0. Every function
#: used exists since 1.6; 2.0.2 (Debian 12/13's librdkafka1) passed the integration test.
MIN_VERSION = 0x020000FF
#: Records per ``rd_kafka_produce_batch`` call (72 B each in the message array).
CHUNK = 16_384

PRODUCER, CONF_OK, EVENT_DR, EVENT_ERROR = 0, 0, 0x1, 0x8
MSG_F_COPY, MSG_F_PARTITION = 0x2, 0x8
ERR_QUEUE_FULL, ERR_FATAL, ERR_TIMED_OUT = -184, -150, -185
# rd_kafka_vtype_t
VT_END, VT_RKT, VT_PARTITION, VT_VALUE, VT_KEY, VT_MSGFLAGS, VT_TIMESTAMP = 0, 2, 3, 4, 5, 7, 8
VT_HEADER = 9  # RD_KAFKA_VTYPE_HEADER (6 is OPAQUE)

#: ``rd_kafka_message_t`` (rdkafka.h), field for field, C alignment (x86-64/arm64 LP64).
MESSAGE = np.dtype([
    ("err", "<i4"), ("rkt", "<u8"), ("partition", "<i4"), ("payload", "<u8"), ("len", "<u8"),
    ("key", "<u8"), ("key_len", "<u8"), ("offset", "<i8"), ("_private", "<u8"),
], align=True)
#: ``rd_kafka_vu_t``: the vtype, then a 64-byte union (``mem.ptr``/``i32``/``i64`` at 8,
#: ``mem.size`` at 16; ``header.name``, ``header.val``, ``header.size`` at 8, 16, 24).
VU = np.dtype({"names": ["vtype", "a", "b", "c"], "formats": ["<i4", "<u8", "<u8", "<i8"],
               "offsets": [0, 8, 16, 24], "itemsize": 72})
_VP, _INT, _I32, _SIZE = ctypes.c_void_p, ctypes.c_int, ctypes.c_int32, ctypes.c_size_t
_CP = ctypes.c_char_p

#: name -> (restype, argtypes) of every function used.
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rd_kafka_version": (_INT, []), "rd_kafka_version_str": (_CP, []),
    "rd_kafka_err2str": (_CP, [_INT]), "rd_kafka_conf_new": (_VP, []),
    "rd_kafka_conf_set": (_INT, [_VP, _CP, _CP, _CP, _SIZE]),
    "rd_kafka_conf_set_events": (None, [_VP, _INT]), "rd_kafka_conf_destroy": (None, [_VP]),
    "rd_kafka_new": (_VP, [_INT, _VP, _CP, _SIZE]), "rd_kafka_destroy": (None, [_VP]),
    "rd_kafka_topic_new": (_VP, [_VP, _CP, _VP]), "rd_kafka_topic_destroy": (None, [_VP]),
    "rd_kafka_metadata": (_INT, [_VP, _INT, _VP, _VP, _INT]),
    "rd_kafka_metadata_destroy": (None, [_VP]),
    "rd_kafka_produce_batch": (_INT, [_VP, _I32, _INT, _VP, _INT]),
    "rd_kafka_produceva": (_VP, [_VP, _VP, _SIZE]),
    "rd_kafka_flush": (_INT, [_VP, _INT]), "rd_kafka_outq_len": (_INT, [_VP]),
    "rd_kafka_init_transactions": (_VP, [_VP, _INT]),
    "rd_kafka_begin_transaction": (_VP, [_VP]),
    "rd_kafka_commit_transaction": (_VP, [_VP, _INT]),
    "rd_kafka_abort_transaction": (_VP, [_VP, _INT]),
    "rd_kafka_error_code": (_INT, [_VP]), "rd_kafka_error_string": (_CP, [_VP]),
    "rd_kafka_error_is_fatal": (_INT, [_VP]), "rd_kafka_error_is_retriable": (_INT, [_VP]),
    "rd_kafka_error_txn_requires_abort": (_INT, [_VP]), "rd_kafka_error_destroy": (None, [_VP]),
    "rd_kafka_queue_get_main": (_VP, [_VP]), "rd_kafka_queue_poll": (_VP, [_VP, _INT]),
    "rd_kafka_queue_destroy": (None, [_VP]), "rd_kafka_event_type": (_INT, [_VP]),
    "rd_kafka_event_error": (_INT, [_VP]), "rd_kafka_event_message_count": (_SIZE, [_VP]),
    "rd_kafka_event_error_string": (_CP, [_VP]), "rd_kafka_event_error_is_fatal": (_INT, [_VP]),
    "rd_kafka_fatal_error": (_INT, [_VP, _CP, _SIZE]),
    "rd_kafka_event_destroy": (None, [_VP]),
}


class MetaTopic(ctypes.Structure):
    _fields_ = [("topic", _CP), ("partition_cnt", _INT), ("partitions", _VP), ("err", _INT)]


class Metadata(ctypes.Structure):
    _fields_ = [("broker_cnt", _INT), ("brokers", _VP), ("topic_cnt", _INT),
                ("topics", ctypes.POINTER(MetaTopic)), ("orig_broker_id", _I32),
                ("orig_broker_name", _CP)]


class RdKafkaError(Exception):
    """An error librdkafka returned (``code`` as in ``rd_kafka_resp_err_t``)."""

    def __init__(self, code: int, message: str, *, fatal: bool = False,
                 retriable: bool = False, abortable: bool = False) -> None:
        super().__init__(f"{message} (librdkafka error {code})")
        self.code, self.fatal, self.retriable, self.abortable = code, fatal, retriable, abortable
        self.reason = message


@dataclass(frozen=True)
class Library:
    """A loaded librdkafka, its functions typed (:data:`SIGNATURES`)."""

    path: str
    lib: Any
    version: int

    @property
    def version_str(self) -> str:
        return str(self.lib.rd_kafka_version_str().decode())

    def err2str(self, code: int) -> str:
        return str(self.lib.rd_kafka_err2str(code).decode(errors="replace"))

    def check(self, error: int | None) -> None:
        """Raise :class:`RdKafkaError` for a non-null ``rd_kafka_error_t *`` (destroyed)."""
        if not error:
            return
        lib = self.lib
        try:
            raise RdKafkaError(
                lib.rd_kafka_error_code(error),
                lib.rd_kafka_error_string(error).decode(errors="replace"),
                fatal=bool(lib.rd_kafka_error_is_fatal(error)),
                retriable=bool(lib.rd_kafka_error_is_retriable(error)),
                abortable=bool(lib.rd_kafka_error_txn_requires_abort(error)))
        finally:
            lib.rd_kafka_error_destroy(error)


def find_librdkafka() -> str | None:
    """Where librdkafka is, by documented means only (see the module docstring)."""
    named = os.environ.get(LIBRDKAFKA_ENV)
    if named:
        return named
    try:
        files = importlib.metadata.files("confluent-kafka") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        name = f.name
        if name.startswith(("librdkafka", "rdkafka")) and (
                ".so" in name or name.endswith((".dylib", ".dll"))):
            return str(f.locate())
    return ctypes.util.find_library("rdkafka")


_LOADED: dict[str, Library] = {}
#: ``CONNECTORS_LIBRDKAFKA``'s value -> the library :func:`load` found for it (finding it
#: reads confluent-kafka's file list, ~1 ms: once, not per slot producer).
_DEFAULT: dict[str, Library] = {}


def load(path: str | None = None) -> Library:
    """librdkafka (``path``, else :func:`find_librdkafka`), checked and typed; once per
    path and process. Raises ``OSError`` when none is found, it is older than
    :data:`MIN_VERSION`, or a function is missing."""
    if path is None:
        named = os.environ.get(LIBRDKAFKA_ENV, "")
        found = _DEFAULT.get(named)
        if found is None:
            found = _DEFAULT[named] = load(find_librdkafka() or "")
        return found
    where = path
    if not where:
        raise OSError("librdkafka not found: install confluent-kafka (its wheel carries "
                      f"it) or set {LIBRDKAFKA_ENV} to its path")
    if where in _LOADED:
        return _LOADED[where]
    lib = ctypes.CDLL(where)
    missing = [name for name in SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise OSError(f"{where} lacks {', '.join(missing)}")
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    version = int(lib.rd_kafka_version()) & 0xFFFFFFFF
    if version < MIN_VERSION:
        raise OSError(f"{where} is librdkafka {lib.rd_kafka_version_str().decode()}, "
                      f"older than {MIN_VERSION >> 24}.{(MIN_VERSION >> 16) & 0xFF}")
    if MESSAGE.itemsize != 72 or ctypes.sizeof(_VP) != 8:
        raise OSError("rd_kafka_message_t is laid out here for 64-bit platforms only")
    _LOADED[where] = Library(where, lib, version)
    return _LOADED[where]
