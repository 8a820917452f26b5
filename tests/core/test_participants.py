"""The executor's view of a sink (the typing protocols of ``core/participants.py``) and the
family templates authors subclass (``core/families.py``, ``core/template.py``) name the
same hooks with the same parameters.

The protocols exist so that the executor and the tasks need not import the templates (which
run them: an import cycle); the hooks' documentation is the templates'. This test keeps the
two from drifting: a hook the executor calls is a hook of the template, with the same
parameters, and every abstract hook of a template is one the executor knows.
"""

from __future__ import annotations

import inspect

import pytest

from connectors.core import families, participants
from connectors.core.template import TwoPhaseCommitSink

PAIRS = [
    (participants.Participant, TwoPhaseCommitSink),
    (participants.PreparedParticipant, families.PreparedTransactionSink),
    (participants.SlotParticipant, families.TaskCommitSink),
    (participants.DriverParticipant, families.DriverCommitSink),
]


def _hooks(protocol: type) -> dict[str, object]:
    names = {}
    for klass in protocol.__mro__:
        if klass in (object,) or klass.__name__ in ("Protocol", "Generic"):
            continue
        for name, member in vars(klass).items():
            if not name.startswith("_") and callable(member) and name not in names:
                names[name] = member
    return names


def _parameters(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize(("protocol", "template"), PAIRS, ids=lambda x: x.__name__)
def test_every_hook_the_executor_calls_is_the_template_s(protocol: type, template: type) -> None:
    for name, member in _hooks(protocol).items():
        implemented = getattr(template, name, None)
        assert implemented is not None, f"{template.__name__} has no hook {name}"
        assert _parameters(member) == _parameters(implemented), name
        assert (getattr(implemented, "__doc__", None) or "").strip(), \
            f"{template.__name__}.{name} is undocumented"


@pytest.mark.parametrize(("protocol", "template"), PAIRS, ids=lambda x: x.__name__)
def test_every_abstract_hook_is_one_the_executor_knows(protocol: type, template: type) -> None:
    known = set(_hooks(protocol)) | {"create_ledger"}  # the ledger: the template's own
    missing = sorted(set(template.__abstractmethods__) - known)
    assert not missing, f"abstract hooks the executor's protocol lacks: {missing}"


def test_the_check_sees_a_drift() -> None:
    class Drifted(participants.PreparedParticipant):  # type: ignore[misc]
        def write(self, handle: object, batch: object, extra: int) -> None: ...

    hooks = _hooks(Drifted)
    assert _parameters(hooks["write"]) != _parameters(families.PreparedTransactionSink.write)
