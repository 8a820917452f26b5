"""The exception tree: picklable with its ids, str with context, no secrets."""

from __future__ import annotations

import pickle

import pytest
from pyspark import cloudpickle

from connectors.core import errors as E

ALL_ERRORS = [
    E.ConnectorError,
    E.ConfigurationError,
    E.DependencyError,
    E.TransientError,
    E.RetriesExhaustedError,
    E.DecisionUnknown,
    E.FatalError,
    E.FencedError,
    E.DataLossError,
    E.ProtocolStateError,
    E.QueryBindingError,
    E.NonDeterministicReplayError,
    E.BadInputError,
    E.GracefulStop,
]

CONTEXT = {"sink_id": "events", "batch_id": 7, "transaction_id": "eos1|events|0123abcd|7|42"}


def test_every_error_class_of_the_module_is_covered() -> None:
    assert sorted(set(E.__all__) - {"GRACEFUL_STOP_TAG"}) == sorted(
        cls.__name__ for cls in ALL_ERRORS)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_error_pickles_with_ids_preserved(cls: type[E.ConnectorError], dumps: object) -> None:
    err = cls("commit failed", **CONTEXT)  # type: ignore[arg-type]
    back = pickle.loads(dumps(err))  # type: ignore[operator]
    assert type(back) is cls
    assert back.message == "commit failed"
    assert back.sink_id == "events"
    assert back.batch_id == 7
    assert back.transaction_id == CONTEXT["transaction_id"]
    assert str(back) == str(err)
    assert back.args == err.args


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_error_without_context_pickles(cls: type[E.ConnectorError]) -> None:
    back = pickle.loads(pickle.dumps(cls("plain")))
    assert type(back) is cls
    assert str(back).removeprefix(f"{E.GRACEFUL_STOP_TAG} ") == "plain"
    assert (back.sink_id, back.batch_id, back.transaction_id) == (None, None, None)


def test_graceful_stop_is_tagged_in_its_text() -> None:
    # Only the text of the error reaches the program that stopped the query.
    err = E.GracefulStop(sink_id="events", batch_id=4)
    assert str(err).startswith(E.GRACEFUL_STOP_TAG)
    assert "batch_id=4" in str(err)


def test_retries_exhausted_keeps_attempts_through_pickle() -> None:
    err = E.RetriesExhaustedError("gave up", attempts=18, **CONTEXT)  # type: ignore[arg-type]
    back = pickle.loads(pickle.dumps(err))
    assert back.attempts == 18
    assert back.sink_id == "events"
    assert back.batch_id == 7


def test_ids_set_after_construction_survive_pickle() -> None:
    # Tasks fill in the ids of an error raised by a connector's hook before returning it.
    err = E.BadInputError("column x is too wide")
    err.sink_id, err.batch_id, err.transaction_id = "events", 3, "t-1"
    back = pickle.loads(pickle.dumps(err))
    assert (back.sink_id, back.batch_id, back.transaction_id) == ("events", 3, "t-1")
    assert "batch_id=3" in str(back)


def test_str_includes_every_known_id() -> None:
    err = E.FencedError("another driver took over", **CONTEXT)  # type: ignore[arg-type]
    assert str(err) == (
        "another driver took over [sink_id='events', batch_id=7, "
        "transaction_id='eos1|events|0123abcd|7|42']"
    )


def test_str_includes_only_the_ids_given() -> None:
    assert str(E.DataLossError("gone", batch_id=0)) == "gone [batch_id=0]"
    assert str(E.DataLossError("gone", sink_id="s")) == "gone [sink_id='s']"
    assert str(E.DataLossError("gone")) == "gone"


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (E.ConfigurationError, (E.ConnectorError, ValueError)),
        (E.DependencyError, (E.ConnectorError, ImportError)),
        (E.TransientError, (E.ConnectorError,)),
        (E.RetriesExhaustedError, (E.TransientError, E.ConnectorError)),
        (E.FatalError, (E.ConnectorError,)),
        (E.FencedError, (E.FatalError, E.ConnectorError)),
        (E.DataLossError, (E.FatalError, E.ConnectorError)),
        (E.ProtocolStateError, (E.ConnectorError,)),
        (E.QueryBindingError, (E.ConnectorError,)),
        (E.NonDeterministicReplayError, (E.ConnectorError,)),
        (E.BadInputError, (E.ConnectorError, ValueError)),
    ],
)
def test_error_tree(cls: type[E.ConnectorError], bases: tuple[type, ...]) -> None:
    err = cls("x")
    for base in bases:
        assert isinstance(err, base)


def test_fatal_and_transient_branches_do_not_overlap() -> None:
    fatal = [E.FatalError, E.FencedError, E.DataLossError]
    for cls in fatal:
        assert not issubclass(cls, E.TransientError)
    for cls in (E.TransientError, E.RetriesExhaustedError):
        assert not issubclass(cls, E.FatalError)
    for cls in (E.ProtocolStateError, E.QueryBindingError, E.NonDeterministicReplayError,
                E.BadInputError, E.ConfigurationError, E.DependencyError):
        assert not issubclass(cls, (E.TransientError, E.FatalError))


def test_every_error_is_caught_as_connector_error() -> None:
    for cls in ALL_ERRORS:
        with pytest.raises(E.ConnectorError):
            raise cls("x")


def test_dependency_error_is_caught_by_import_error_handlers() -> None:
    try:
        raise E.DependencyError("pip install 'spark-exactly-once[kafka]'")
    except ImportError as exc:
        assert "spark-exactly-once[kafka]" in str(exc)


def test_no_secret_in_str_or_pickle_when_built_from_redacted_text() -> None:
    secret = "hunter2-s3cr3t"
    dsn = f"postgresql://app:{secret}@db:5432/prod"
    redacted = dsn.replace(secret, "***")
    err = E.TransientError(f"could not connect to {redacted}", sink_id="events", batch_id=1)
    for text in (str(err), repr(err), repr(pickle.loads(pickle.dumps(err)))):
        assert secret not in text
        assert "***" in text
    assert secret.encode() not in pickle.dumps(err)
