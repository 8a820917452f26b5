"""The docstring examples of ``connectors/`` that need no service and no JVM (issue 19).

The collector and its conventions (fixtures, ``.. example-skip:``, ``.. example-needs:``)
are in ``tests/_examples.py``; the examples that need Spark, PostgreSQL or Kafka run in
``integration/docs/test_docstring_examples.py``. The session's terminal summary prints
``docstring examples: N run, M skipped`` and the reason of every skip.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tests import _examples  # noqa: E402

_COLLECTION = _examples.collection()


def _no_services(need: str) -> Any:
    raise AssertionError(f"an example of tests/ asked for {need!r}: it belongs in integration/")


@pytest.mark.parametrize("example", _examples.params(_COLLECTION.fast))
def test_example(example: _examples.Example, request: pytest.FixtureRequest,
                 tmp_path: Path) -> None:
    _examples.run_recorded(example, request.config, _no_services, tmp_path)


def test_collector_finds_no_problem() -> None:
    """Every example parses, uses only known names, and every skip carries a reason; no
    ``# doctest: +SKIP`` and no example line outside a docstring the collector reads."""
    if _COLLECTION.problems:
        pytest.fail("\n".join(_COLLECTION.problems), pytrace=False)


def test_fixture_names_are_documented() -> None:
    doc = _examples.__doc__ or ""
    for name, need in _examples.FIXTURES.items():
        assert f"\n{name} " in doc, f"fixture {name!r} is missing from the collector's docstring"
        assert need in (None, *_examples.NEEDS)


def _collect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             source: str) -> _examples.Collection:
    """Collect a synthetic package ``exampkg`` written under ``tmp_path``."""
    package = tmp_path / "exampkg"
    package.mkdir()
    (package / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_examples, "REPO", tmp_path)
    monkeypatch.delitem(sys.modules, "exampkg", raising=False)
    coll = _examples.collect(package)
    monkeypatch.delitem(sys.modules, "exampkg", raising=False)
    return coll


def test_collector_reads_blocks_doctests_and_directives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coll = _collect(tmp_path, monkeypatch, '''"""Module.

Example::

    x = 1 + 1
    assert x == 2
"""


def f():
    """Loose doctest.

    Example:
        >>> 1 + 1
        2
    """


class C:
    """Two examples.

    .. example-skip: needs an S3 bucket,
       which CI has not

    Example::

        DeltaSink("s3://bucket/t", sink_id="s").__call__(df, 0)

    .. example-needs: spark

    Example::

        spark.range(1).count()
    """

    def m(self):
        """Example::

            >>> C().m() is None
            True
        """
''')
    assert coll.problems == []
    by_id = {e.id: e for e in coll.examples}
    assert sorted(by_id) == ["exampkg:C", "exampkg:C-2", "exampkg:C.m", "exampkg:__doc__",
                             "exampkg:f"]
    assert by_id["exampkg:__doc__"].kind == "code"
    assert by_id["exampkg:__doc__"].source == "x = 1 + 1\nassert x == 2"
    assert by_id["exampkg:__doc__"].lineno == 5
    assert by_id["exampkg:f"].kind == "doctest"
    assert by_id["exampkg:f"].lineno == 14
    assert by_id["exampkg:C"].skip == "needs an S3 bucket, which CI has not"
    assert by_id["exampkg:C-2"].needs == frozenset({"spark"})
    assert by_id["exampkg:C-2"].fixtures == frozenset({"spark"})
    assert by_id["exampkg:C-2"].integration
    assert by_id["exampkg:C.m"].kind == "doctest"
    assert not by_id["exampkg:C.m"].integration


def test_collector_refuses_reasonless_skips_and_unknown_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coll = _collect(tmp_path, monkeypatch, '''"""Module.

Example::

    undefined_thing(1)

.. example-skip:

Example::

    pass

.. example-needs: gpu

Example::

    pass
"""

NOT_A_DOCSTRING = """
>>> 1 + 1
2
"""

def f():
    """
    >>> f()  # doctest: +SKIP
    """
''')
    text = "\n".join(coll.problems)
    assert "uses undefined_thing" in text
    assert "'.. example-skip:' needs a reason" in text
    assert "'.. example-needs: gpu'" in text
    assert "'# doctest: +SKIP' has no reason" in text
    assert "outside any docstring the collector reads" in text
    assert len(coll.problems) == 5, text


def test_a_failing_example_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coll = _collect(tmp_path, monkeypatch, '''"""Module.

Example::

    assert 1 + 1 == 3

Example::

    >>> 1 + 1
    3
"""
''')
    assert coll.problems == []
    code, doc = coll.examples
    with pytest.raises(AssertionError):
        _examples.run(code, _no_services, tmp_path)
    with pytest.raises(pytest.fail.Exception, match="Expected:\n    3\nGot:\n    2"):
        _examples.run(doc, _no_services, tmp_path)
