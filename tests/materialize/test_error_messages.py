"""Error messages name the field and the problem, never the value: the docs promise logs carry no payloads."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from icefloe.materialize.conversion import BatchBuilder, ValueConverter

MARKER = "PAYLOAD-MARKER-7c1e"
NUMBER = 98765432109876543210  # a value no message may quote either
STRUCT = T.StructType(
    [
        T.StructField("small", T.IntegerType()),
        T.StructField("n", T.LongType()),
        T.StructField("f", T.FloatType()),
        T.StructField("price", T.DecimalType(9, 2)),
        T.StructField("at", T.TimestampType()),
        T.StructField("local", T.TimestampNTZType()),
        T.StructField("day", T.DateType()),
        T.StructField("d", T.DoubleType()),
        T.StructField("s", T.StringType()),
    ]
)


@pytest.mark.parametrize(
    "value",
    [
        {"small": NUMBER},
        {"n": NUMBER},
        {"f": float(NUMBER) ** 2},
        {"price": f"{MARKER}"},
        {"price": NUMBER},
        {"at": f"{MARKER}"},
        {"at": NUMBER},
        {"local": f"{MARKER}"},
        {"day": f"{MARKER}"},
        {"d": NUMBER**20},  # an integer past a double's range (JSON has no limit): was an OverflowError
        # instants before year 1 or after 9999 once their offset is applied: were an OverflowError, or a year-0 row
        {"at": "0001-01-01T00:30:00+01:00"},
        {"at": "9999-12-31T23:30:00-01:00"},
        {"local": "0001-01-01T00:30:00+01:00"},
        {"local": "9999-12-31T23:30:00-01:00"},
    ],
)
def test_conversion_errors_name_the_field_not_the_value(value):
    ((field, item),) = value.items()
    with pytest.raises(ValueError) as raised:
        ValueConverter(STRUCT, strict=True)(value)
    message = str(raised.value)
    assert message.startswith(f"{field}: ")
    assert MARKER not in message and str(NUMBER)[:8] not in message and str(item)[:8] not in message


def test_a_value_arrow_refuses_is_named_by_its_field_not_its_value():
    builder = BatchBuilder(T.StructType(STRUCT.fields), [f.name for f in STRUCT.fields])
    builder.add({"small": NUMBER}, "t", 0, 0, 0, None, None, None)  # past the checks, as a lenient decoder hands it
    reason = builder.row_error(0)
    assert reason is not None and reason.startswith("small: ")
    assert str(NUMBER)[:8] not in reason


def test_a_string_utf8_cannot_hold_is_a_bad_record_named_by_its_field():
    """A JSON string may escape a lone surrogate (`"\\ud800"`): Python keeps it, UTF-8 (Arrow) cannot hold it. The row
    fails alone (it was a UnicodeEncodeError that failed the whole task)."""
    from icefloe.batch_columns import ERROR_CLASS, KAFKA_COLUMNS, STATUS_COLUMNS, field_json
    from icefloe.materialize.python_tasks import _build

    columns = [field_json(name, kind) for name, kind in {**KAFKA_COLUMNS, **STATUS_COLUMNS}.items()]
    batch = T.StructType([*STRUCT.fields, *(T.StructField.fromJson(c) for c in columns)])
    builder = BatchBuilder(batch, [f.name for f in STRUCT.fields])
    builder.add({"s": "ok"}, "t", 0, 0, 0, None, None, None)
    builder.add({"s": "\ud800"}, "t", 0, 1, 0, None, None, None)
    reason = builder.row_error(1)
    assert reason is not None and reason.startswith("s: ")
    built = _build(builder).to_pydict()
    assert built["s"] == ["ok", None]
    assert built[ERROR_CLASS] == [None, "ConversionError"]
