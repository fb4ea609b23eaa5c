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
