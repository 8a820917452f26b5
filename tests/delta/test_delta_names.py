"""Names that bite, Delta side (no Spark session): column names quoted for Spark, the
column-mapping error names the fix, MERGE refuses names Delta's MERGE cannot take (issue 37).
The real writes are in ``integration/delta/test_delta_names.py``."""

from __future__ import annotations

import pytest

from connectors.core.errors import BadInputError
from connectors.delta._errors import translate
from connectors.delta._options import check_batch
from connectors.spark._names import quoted
from tests.delta.test_delta_sink_config import FakePy4JError, _JClass, _JThrowable

pyspark_types = pytest.importorskip("pyspark.sql.types")


@pytest.mark.parametrize(("name", "text"), [
    ("a", "`a`"), ("a.b", "`a.b`"), ("x`y", "`x``y`"), ("``", "``````"), ("a b", "`a b`"),
    ("Größe", "`Größe`"),
])
def test_quoted_names_mean_only_themselves(name: str, text: str) -> None:
    assert quoted(name) == text


def test_invalid_characters_name_column_mapping_and_the_column() -> None:
    exc = FakePy4JError("x", _JThrowable(
        _JClass("org.apache.spark.sql.AnalysisException"),
        "DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES", {"invalidColumnNames": "a b"}))
    err = translate(exc, doing="writing batch 0", sink_id="s", batch_id=0)
    assert isinstance(err, BadInputError)
    for needle in ("column mapping", "'delta.columnMapping.mode' = 'name'",
                   "withColumnRenamed", "invalidColumnNames=a b"):
        assert needle in str(err), (needle, str(err))


def _schema(*names: str) -> object:
    T = pyspark_types
    return T.StructType([T.StructField(n, T.LongType()) for n in names])


def test_merge_refuses_a_backtick_in_the_batch_or_the_table() -> None:
    def check(batch: object, table: object, merge_on: tuple[str, ...]) -> None:
        check_batch(batch, table, refresh=lambda: table, location=lambda: "/t",  # type: ignore[arg-type]
                    merge_schema=False, merge_on=merge_on, sink_id="s")

    check(_schema("k", "x`y"), _schema("k", "x`y"), ())  # an append takes it
    check(_schema("k", "a.b", "Größe"), _schema("k", "a.b", "Größe"), ("a.b",))
    with pytest.raises(BadInputError, match=r"'x`y' of the batch or the table hold a backtick"):
        check(_schema("k", "x`y"), None, ("k",))
    with pytest.raises(BadInputError, match="INVALID_ATTRIBUTE_NAME_SYNTAX"):
        check(_schema("k"), _schema("k", "x`y"), ("k",))
