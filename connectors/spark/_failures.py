"""A Spark job that failed because a task raised a target's transient error, seen as one.

A task's exception reaches the driver as Spark's (``PythonException``, or a Py4J error
around a ``SparkException``) holding only the Python worker's traceback text. When its
final exception is the library's :class:`~connectors.core.errors.TransientError` (or a
subclass: a target that did not answer, a connection lost mid-transaction), the driver
raises a ``TransientError`` for it, so a batch whose tasks met a restarting target runs
again (:mod:`connectors.core.policies.restarts`) instead of ending the query.
"""

from __future__ import annotations

import re

from connectors.core.errors import TransientError

__all__ = ["transient_task_error"]

#: A traceback's closing line: ``package.module.ErrorClass: message`` (or a builtin's:
#: ``KeyError: 'x'``).
_CLOSING = re.compile(r"^\s*((?:\w+\.)+\w+|[A-Z]\w*): (.*)$", re.MULTILINE)
#: Packages of the JVM's exceptions in the same text.
_JVM = ("org.", "java.", "javax.", "scala.", "py4j.", "io.netty.")


def _transient_names() -> set[str]:
    names: set[str] = set()
    todo: list[type[BaseException]] = [TransientError]
    while todo:
        cls = todo.pop()
        names.add(f"{cls.__module__}.{cls.__qualname__}")
        todo.extend(cls.__subclasses__())
    return names


def transient_task_error(error: BaseException) -> TransientError | None:
    """``error`` (a failed Spark job) as a :class:`TransientError` when the last exception
    of its tasks' traceback is one; else ``None``.

    Example::

        >>> job = RuntimeError("Traceback (most recent call last):\\n  ...\\n"
        ...     "connectors.core.errors.TransientError: connecting failed: refused\\n")
        >>> str(transient_task_error(job))
        'a task failed: TransientError: connecting failed: refused'
        >>> transient_task_error(RuntimeError("ValueError: bad")) is None
        True
    """
    if isinstance(error, TransientError):
        return error
    # The worker's last Python exception (Spark's JVM lines, before or after it, aside).
    found = [(name, message) for name, message in _CLOSING.findall(str(error))
             if not name.startswith(_JVM)]
    if not found or found[-1][0] not in _transient_names():
        return None
    name, message = found[-1]
    if len(message) > 500:
        message = message[:500] + "..."
    return TransientError(f"a task failed: {name.rpartition('.')[2]}: {message}")
