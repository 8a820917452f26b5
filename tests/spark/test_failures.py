"""A failed Spark job whose task met an unavailable target is a TransientError on the
driver (so the batch may run again); any other failure stays what it is."""

from __future__ import annotations

import pytest

from connectors.core.errors import RetriesExhaustedError, TransientError
from connectors.spark._failures import transient_task_error

WORKER = """  An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/opt/pyspark/worker.py", line 1, in main
psycopg.OperationalError: connection failed: Connection refused

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/connectors/core/templates/tasks.py", line 70, in prepare_task
{last}
"""
CLASSIC = ("An error occurred while calling o123.collectToPython.\n"
           ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in "
           "stage 3.0 failed 1 times, most recent failure: Lost task 0.0 (TID 7): "
           "org.apache.spark.api.python.PythonException: {worker}\n"
           "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handle(x.scala:1)\n"
           "Caused by: org.apache.spark.api.python.PythonException: Traceback ...\n")


@pytest.mark.parametrize("wrap", [lambda w: w, lambda w: CLASSIC.format(worker=w)],
                         ids=["connect", "classic"])
@pytest.mark.parametrize("last", [
    "connectors.core.errors.TransientError: connecting to db:5432 failed [sink_id='x']",
    "connectors.core.errors.RetriesExhaustedError: begin failed after 3 attempt(s)",
])
def test_a_task_s_transient_error_is_one_on_the_driver(wrap: object, last: str) -> None:
    job = RuntimeError(wrap(WORKER.format(last=last)))  # type: ignore[operator]
    found = transient_task_error(job)
    assert isinstance(found, TransientError)
    assert not isinstance(found, RetriesExhaustedError)  # a new attempt may mend it
    assert str(found).startswith("a task failed: ")
    assert last.split(": ", 1)[1][:20] in str(found)


@pytest.mark.parametrize("last", [
    "connectors.core.errors.BadInputError: column x: NULL in a NOT NULL column",
    "ValueError: something else",
    "connectors.core.errors.FencedError: another owner",
])
def test_other_failures_stay_what_they_are(last: str) -> None:
    assert transient_task_error(RuntimeError(CLASSIC.format(worker=WORKER.format(last=last)))) \
        is None


def test_a_transient_error_after_which_the_task_failed_otherwise_is_not_one() -> None:
    text = WORKER.format(last="connectors.core.errors.TransientError: lost\n\nDuring handling "
                         "of the above exception, another exception occurred:\n\n"
                         "KeyError: 'x'")
    assert transient_task_error(RuntimeError(text)) is None
    assert transient_task_error(RuntimeError("no traceback at all")) is None
