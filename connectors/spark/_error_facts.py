"""What a Spark error says about itself, read without its message text.

:func:`error_facts` collects an exception's *error conditions* (``PySparkException.
getCondition()`` for errors PySpark converted; ``SparkThrowable.getCondition()`` on every Java
throwable of a ``Py4JJavaError``'s cause chain: a failed task's exception sits a few levels
below the ``SparkException`` that aborted the job), their message parameters, and the Java
classes of the chain with their superclasses. The table-format sinks classify Spark's,
Delta's and Iceberg's failures by these facts (``connectors.delta._errors``,
``connectors.iceberg._writer``), never by parsing ``str(exc)``, whose text may quote rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ErrorFacts", "error_facts"]

_LOST_CONDITION = re.compile(r"Cannot find main error class '([A-Z0-9_]+)'")

#: Causes followed along a Java exception chain (a job failure nests 3-5 deep).
_MAX_CHAIN = 12


@dataclass
class ErrorFacts:
    """What an exception says about itself, read without its message text."""

    #: error conditions along the chain, outermost first
    conditions: list[str] = field(default_factory=list)
    #: Java (or Python) class names of the chain, outermost first
    classes: list[str] = field(default_factory=list)
    #: the chain's classes with their superclasses (for matching)
    lineage: set[str] = field(default_factory=set)
    #: message parameters of each condition
    params: dict[str, dict[str, str]] = field(default_factory=dict)
    #: message of each condition (quoted only with values_in_errors)
    messages: dict[str, str] = field(default_factory=dict)


def _java_facts(throwable: Any, facts: ErrorFacts) -> None:
    """Walk a py4j Java throwable and its causes (class, superclasses, condition)."""
    seen = 0
    current = throwable
    while current is not None and seen < _MAX_CHAIN:
        seen += 1
        try:
            cls = current.getClass()
            facts.classes.append(str(cls.getName()))
            while cls is not None:
                facts.lineage.add(str(cls.getName()))
                cls = cls.getSuperclass()
        except Exception:  # not a Java object after all
            return
        condition = _call(current, "getCondition") or _call(current, "getErrorClass")
        if condition:
            facts.conditions.append(str(condition))
            raw = _call(current, "getMessageParameters")
            params: dict[str, str] = {}
            if raw is not None:
                try:
                    params = {str(k): str(v) for k, v in dict(raw).items()}
                except Exception:
                    params = {}
            facts.params.setdefault(str(condition), params)
            facts.messages.setdefault(str(condition), str(_call(current, "getMessage") or ""))
        current = _call(current, "getCause")


def _call(obj: Any, method: str) -> Any:
    fn = getattr(obj, method, None)
    if fn is None:
        return None
    try:
        return fn()
    except Exception:
        return None


def error_facts(exc: BaseException) -> ErrorFacts:
    """Conditions, classes and message parameters of ``exc`` (Python side, then the Java
    throwable behind it and its causes). Never reads ``str(exc)``."""
    facts = ErrorFacts()
    for cls in type(exc).__mro__:
        facts.lineage.add(f"{cls.__module__}.{cls.__qualname__}")
    facts.classes.append(f"{type(exc).__module__}.{type(exc).__qualname__}")
    try:
        from pyspark.errors import PySparkException
    except ImportError:  # pragma: no cover - pyspark is a dependency of the delta extra
        PySparkException = ()  # type: ignore[assignment,misc]  # noqa: N806
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    if isinstance(exc, PySparkException):
        # getErrorClass: pyspark 3.5's name (4.0 added getCondition and deprecated it)
        condition = _call(exc, "getCondition") or _call(exc, "getErrorClass")
        if condition:
            facts.conditions.append(str(condition))
            facts.params[str(condition)] = dict(_call(exc, "getMessageParameters") or {})
            facts.messages[str(condition)] = str(_call(exc, "getMessage") or "")
    if java is not None:
        _java_facts(java, facts)
    for params in list(facts.params.values()):
        # Delta 4.4 on Spark 4.2 raises some of its conditions (DELTA_MERGE_UNRESOLVED_
        # EXPRESSION) as INTERNAL_ERROR "Cannot find main error class 'X'": X is the one.
        lost = _LOST_CONDITION.match(params.get("message", ""))
        if lost and lost.group(1) not in facts.conditions:
            facts.conditions.append(lost.group(1))
            facts.params.setdefault(lost.group(1), {})
    return facts
