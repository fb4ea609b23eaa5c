"""The types an inline schema may name (Iceberg-style), one definition: what each becomes in the table and in Avro.

The spec model validates names against it; `formats.inline` maps inline schemas to table columns and, for Avro
topics decoded without a registry, to an equivalent Avro schema. Spark types are written in Spark's JSON schema
form, so the spec model (which the Pulumi program imports) needs no pyspark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The instants a table's timestamp column holds (Spark's and Iceberg's range, years 1 to 9999), in microseconds:
# 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z
TIMESTAMP_MICROS = (-62135596800000000, 253402300799999999)


@dataclass(frozen=True)
class Primitive:
    spark: str  # the table column's Spark type, as `DataType.jsonValue()` names it
    avro: Any  # the Avro type an equivalent Avro schema uses


_LOCAL_TIMESTAMP = {"type": "long", "logicalType": "local-timestamp-micros"}
PRIMITIVES: dict[str, Primitive] = {
    "boolean": Primitive("boolean", "boolean"),
    "int": Primitive("integer", "int"),
    "long": Primitive("long", "long"),
    "float": Primitive("float", "float"),
    "double": Primitive("double", "double"),
    "date": Primitive("date", {"type": "int", "logicalType": "date"}),
    "time": Primitive("long", {"type": "long", "logicalType": "time-micros"}),  # microseconds of the day
    "timestamp": Primitive("timestamp_ntz", _LOCAL_TIMESTAMP),
    "timestamp_ntz": Primitive("timestamp_ntz", _LOCAL_TIMESTAMP),
    "timestamptz": Primitive("timestamp", {"type": "long", "logicalType": "timestamp-micros"}),  # Spark's has a zone
    "string": Primitive("string", "string"),
    "uuid": Primitive("string", {"type": "string", "logicalType": "uuid"}),
    "binary": Primitive("binary", "bytes"),
}
DECIMAL_TYPE = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
FIXED_TYPE = re.compile(r"^fixed\[(\d+)\]$")
