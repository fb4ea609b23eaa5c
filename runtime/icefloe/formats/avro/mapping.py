"""Avro schemas to the table's Spark/Iceberg types.

Every column is nullable: a later schema version may drop a field, and a tombstone in append mode has no value at
all. Mapping choices (Spark is the writer, so only types Spark can write to Iceberg appear):
  Avro record -> struct, array -> list, map -> map<string, _>, enum -> string, fixed/bytes -> binary,
  decimal -> decimal(p, s) (p at most 38, Iceberg's limit), date -> date, timestamp-millis/micros/nanos -> timestamp
  (Iceberg timestamptz; nanoseconds truncated to the microsecond, Iceberg v2's unit), local-timestamp-* ->
  timestamp_ntz, time-* -> long microseconds, uuid (string or fixed(16)) -> string in canonical form,
  duration -> struct<months, days, milliseconds: long> (Avro's three unsigned 32-bit counts), [null, T] -> nullable T,
  other unions -> struct<member0, member1, ...> (avro_unions).
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import types as T

from icefloe.errors import ConfigError
from icefloe.formats.avro import names
from icefloe.formats.avro.unions import branches as union_branches
from icefloe.formats.avro.unions import collapsed as collapsed_union
from icefloe.formats.avro.unions import member_name, needs_record_names

_AVRO_PRIMITIVES: dict[str, T.DataType] = {
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "string": T.StringType(),
    "bytes": T.BinaryType(),
}
_AVRO_LOGICAL: dict[str, T.DataType] = {
    "date": T.DateType(),
    "timestamp-millis": T.TimestampType(),
    "timestamp-micros": T.TimestampType(),
    "timestamp-nanos": T.TimestampType(),
    "local-timestamp-millis": T.TimestampNTZType(),
    "local-timestamp-micros": T.TimestampNTZType(),
    "local-timestamp-nanos": T.TimestampNTZType(),
    "time-millis": T.LongType(),
    "time-micros": T.LongType(),
    "uuid": T.StringType(),
    "duration": T.StructType([T.StructField(name, T.LongType(), True) for name in ("months", "days", "milliseconds")]),
}
MAX_DECIMAL_PRECISION = 38  # Iceberg's decimal (and Spark's)


class _AvroMapper:
    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.in_progress: set[str] = set()

    def map(self, schema: Any, namespace: str, path: str) -> T.DataType:
        if isinstance(schema, str):
            if schema in _AVRO_PRIMITIVES:
                return _AVRO_PRIMITIVES[schema]
            for name in names.candidates(schema, namespace):
                if name in self.in_progress:
                    raise ConfigError(f"{path}: recursive Avro type {name!r} cannot be a table column")
                if name in self.named:
                    return self.named[name]
            raise ConfigError(f"{path}: unknown Avro type {schema!r}")
        if isinstance(schema, list):
            members = union_branches(schema)
            if len(members) == 1:
                return self.map(members[0], namespace, path)
            collapse = collapsed_union(members)  # Spark's rule; "ambiguous" is refused by avro_unions
            if collapse in _AVRO_PRIMITIVES:
                return _AVRO_PRIMITIVES[collapse]
            return T.StructType(
                [
                    T.StructField(member_name(i), self.map(m, namespace, f"{path}.{member_name(i)}"), True)
                    for i, m in enumerate(members)
                ]
            )
        kind = schema.get("type")
        logical = schema.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision = int(schema["precision"])
            if precision > MAX_DECIMAL_PRECISION:
                raise ConfigError(
                    f"{path}: decimal precision {precision} is too wide: Iceberg decimals have at most "
                    f"{MAX_DECIMAL_PRECISION} digits"
                )
            return self._named(schema, namespace, T.DecimalType(precision, int(schema.get("scale", 0))))
        if logical in _AVRO_LOGICAL and kind in ("int", "long", "string", "fixed"):
            return self._named(schema, namespace, _AVRO_LOGICAL[logical])
        if kind == "record":
            name = names.defined_name(schema, namespace)
            self.in_progress.add(name)
            inner_ns = names.namespace_of(name)
            fields = [
                T.StructField(f["name"], self.map(f["type"], inner_ns, f"{path}.{f['name']}"), True)
                for f in schema["fields"]
            ]
            self.in_progress.discard(name)
            struct = T.StructType(fields)
            self.named[name] = struct
            return struct
        if kind == "enum":
            return self._named(schema, namespace, T.StringType())
        if kind == "fixed":
            return self._named(schema, namespace, T.BinaryType())
        if kind == "array":
            return T.ArrayType(self.map(schema["items"], namespace, f"{path}[]"), True)
        if kind == "map":
            return T.MapType(T.StringType(), self.map(schema["values"], namespace, f"{path}{{}}"), True)
        return self.map(kind, namespace, path)

    def _named(self, schema: dict, namespace: str, mapped: T.DataType) -> T.DataType:
        """`mapped`, remembered under the schema's name when it is a named type (fixed, enum), so a later
        reference by name maps the same way."""
        if schema.get("type") in ("fixed", "enum"):
            self.named[names.defined_name(schema, namespace)] = mapped
        return mapped


def avro_value_fields(schema_str: str, subject: str) -> list[T.StructField]:
    """The table columns for an Avro value schema (a record)."""
    schema = json.loads(schema_str)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError(f"{subject}: the value schema must be an Avro record, got {str(schema)[:80]}")
    struct = _AvroMapper().map(schema, "", subject)
    needs_record_names(schema_str)  # refuses unions whose branches Python cannot tell apart
    return list(struct.fields)  # type: ignore[attr-defined]  # a record maps to a StructType
