"""A LOAD DATA LOCAL's warnings turned into a refusal that names no value
(connectors/mariadb/_strict.py). The messages are MariaDB 10.11.19's, as
``benchmarks/mariadb_load.py --smoke`` saw them under the strict sql_mode."""

from __future__ import annotations

import pytest

from connectors.mariadb._strict import LoadWarning, parse_warnings, refusal

COLUMNS = ["id", "name", "d", "ts"]
#: (SHOW WARNINGS row, what must be read from it)
SEEN = [
    (("Warning", 1366, "Incorrect integer value: 'abc' for column `eos`.`t1`.`id` at row 1"),
     LoadWarning("Warning", 1366, "id", 1)),
    (("Warning", 1265, "Data truncated for column 'name' at row 2"),
     LoadWarning("Warning", 1265, "name", 2)),
    (("Warning", 1264, "Out of range value for column 'd' at row 1"),
     LoadWarning("Warning", 1264, "d", 1)),
    (("Note", 1265, "Data truncated for column 'd' at row 3"),
     LoadWarning("Note", 1265, "d", 3)),
    (("Warning", 1263,
      "Column set to default value; NULL supplied to NOT NULL column 'name' at row 1"),
     LoadWarning("Warning", 1263, "name", 1)),
    (("Warning", 1062, "Duplicate entry '1' for key 'PRIMARY'"),
     LoadWarning("Warning", 1062, None, None, "PRIMARY")),
    (("Warning", 1261, "Row 4 doesn't contain data for all columns"),
     LoadWarning("Warning", 1261, None, 4)),
]


@pytest.mark.parametrize(("row", "want"), SEEN)
def test_each_warning_mariadb_gave_is_read_without_its_message(
        row: tuple[str, int, str], want: LoadWarning) -> None:
    assert parse_warnings([row], COLUMNS) == [want]


def test_the_refusal_quotes_no_value() -> None:
    secret = "s3cr3t-token"
    rows = [("Warning", 1366, f"Incorrect integer value: '{secret}' for column "
                              "`db`.`t`.`id` at row 12"),
            ("Warning", 1062, f"Duplicate entry '{secret}' for key 'uq_name'"),
            ("Warning", 1265, "Data truncated for column 'name' at row 13")]
    text = refusal(rows, COLUMNS, total=3)
    assert secret not in text
    assert "3 warnings" in text
    assert "Warning 1366 in column 'id', row 12" in text
    assert "Warning 1062 in key 'uq_name'" in text
    assert "cast the column" in text and "deduplicate" in text


def test_a_value_that_looks_like_a_column_or_a_row_does_not_fool_the_parser() -> None:
    value = "x' for column 'name' at row 99"
    row = ("Warning", 1366, f"Incorrect integer value: '{value}' for column "
                            "`db`.`t`.`id` at row 5")
    assert parse_warnings([row], COLUMNS) == [LoadWarning("Warning", 1366, "id", 5)]


def test_columns_with_backticks_dots_and_shared_suffixes() -> None:
    columns = ["a`b", "name", "full name", "x.y"]
    rows = [("Warning", 1366, "Incorrect integer value: 'q' for column `db`.`t`.`a``b` "
                              "at row 1"),
            ("Warning", 1265, "Data truncated for column 'full name' at row 2"),
            ("Warning", 1265, "Data truncated for column 'x.y' at row 3")]
    assert [w.column for w in parse_warnings(rows, columns)] == ["a`b", "full name", "x.y"]


def test_an_unknown_column_or_code_is_still_described() -> None:
    warning = parse_warnings([("Warning", 4242, "Something about column 'zz' at row 8")],
                             COLUMNS)[0]
    assert warning == LoadWarning("Warning", 4242, None, 8)
    assert "MariaDB's warning 4242" in warning.describe()
    assert "row 8" in warning.describe()


def test_more_warnings_than_show_warnings_holds_are_counted() -> None:
    rows = [("Warning", 1265, f"Data truncated for column 'name' at row {i}")
            for i in range(1, 65)]
    text = refusal(rows, COLUMNS, total=5000)
    assert text.startswith("the load left 5000 warnings")
    assert text.endswith("... and 4936 more (SHOW WARNINGS keeps @@max_error_count)")


def test_driver_rows_of_other_shapes_are_read() -> None:
    # mysql-connector gives tuples, mariadb may give lists; codes may come as strings
    rows = [["Note", "1265", "Data truncated for column 'd' at row 1"]]
    assert parse_warnings(rows, COLUMNS) == [LoadWarning("Note", 1265, "d", 1)]


def test_text_that_is_no_json_names_the_json_column_by_its_constraint() -> None:
    """Measured on MariaDB 10.11.19: a JSON column's CHECK (json_valid) refuses text that
    is no JSON with Note 4038 (no column) and Warning 4025 naming the constraint
    ``<table>.<column>``; another CHECK is named as a constraint."""
    rows = [("Note", 4038, "Syntax error in JSON text in argument 1 to function "
             "'json_valid' at position 2"),
            ("Warning", 4025, "CONSTRAINT `ev_1.j` failed for `eos`.`ev_1`"),
            ("Warning", 4025, "CONSTRAINT `positive` failed for `eos`.`ev_1`")]
    found = parse_warnings(rows, ["id", "j"])
    assert [(w.code, w.column, w.constraint) for w in found] == [
        (4038, None, None), (4025, "j", None), (4025, None, "positive")]
    text = refusal(rows, ["id", "j"])
    assert "column 'j'" in text and "no JSON document" in text
    assert "constraint 'positive'" in text
