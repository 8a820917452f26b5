"""Record checks name a bad record's key and value only with ``values_in_errors=True``
(integration/kafka/test_kafka_values_in_errors.py runs the same through a real query)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from connectors.core.errors import BadInputError
from connectors.kafka._records import QUOTED_BYTES, RecordLimits, quote, scan_batch

KEY, VALUE = "key-71b3-distinctive", "value-0c9e-distinctive"


def _error(message: str) -> BadInputError:
    return BadInputError(message, sink_id="s", batch_id=1)


def _batch(large: bool) -> pa.RecordBatch:
    value = VALUE + ("x" * 5000 if large else "")
    return pa.record_batch({"key": pa.array(["a", KEY]), "value": pa.array(["b", value]),
                            "partition": pa.array([0, 0 if large else -3], pa.int32())})


@pytest.mark.parametrize("large", [True, False])
@pytest.mark.parametrize("values_in_errors", [False, True])
def test_a_bad_record_is_quoted_only_when_opted_in(large: bool, values_in_errors: bool) -> None:
    with pytest.raises(BadInputError) as info:
        scan_batch(_batch(large), RecordLimits(1000), "t", _error,
                   values_in_errors=values_in_errors)
    text = str(info.value)
    assert ("about" in text) if large else ("holds -3" in text)
    assert (KEY in text) is values_in_errors
    assert (VALUE in text) is values_in_errors


def test_a_quoted_value_is_cut_and_sized() -> None:
    assert quote(None) == "null"
    assert quote(b"abc") == "'abc'"
    long = quote("y" * 500)
    assert long.startswith("'" + "y" * QUOTED_BYTES + "'") and long.endswith("(500 bytes)")
