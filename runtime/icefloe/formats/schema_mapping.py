"""Type mapping: Avro schemas and inline (Iceberg-style) schemas to the table's Spark/Iceberg types.

The table schema is the value schema's top-level fields followed by icefloe's Kafka metadata columns. Every column
is nullable: a later schema version may drop a field, and a tombstone in append mode has no value at all.

Mapping choices (Spark is the writer, so only types Spark can write to Iceberg appear):
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

from icefloe.batch_columns import KAFKA_COLUMNS, STATUS_COLUMNS, UPSERT_COLUMNS, SparkTypeJson, field_json
from icefloe.errors import ConfigError
from icefloe.formats.avro import names
from icefloe.formats.avro.unions import branches as union_branches
from icefloe.formats.avro.unions import collapsed as collapsed_union
from icefloe.formats.avro.unions import member_name, needs_record_names
from icefloe.inline_types import DECIMAL_TYPE, FIXED_TYPE, PRIMITIVES
from icefloe.spec import InlineSchema, InlineType


def spark_field(name: str, type_json: SparkTypeJson) -> T.StructField:
    """A nullable Spark field from a type in Spark's JSON schema form (read by Spark's own parser)."""
    return T.StructField.fromJson(field_json(name, type_json))


METADATA_FIELDS = [spark_field(name, type_json) for name, type_json in KAFKA_COLUMNS.items()]
UPSERT_FIELDS = [spark_field(name, type_json) for name, type_json in UPSERT_COLUMNS.items()]
STATUS_FIELDS = [spark_field(name, type_json) for name, type_json in STATUS_COLUMNS.items()]

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
_INLINE_PRIMITIVES: dict[str, T.DataType] = {
    name: spark_field(name, primitive.spark).dataType for name, primitive in PRIMITIVES.items()
}


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


def inline_type(spec: InlineType, path: str) -> T.DataType:
    kind = spec.type
    if kind in _INLINE_PRIMITIVES:
        return _INLINE_PRIMITIVES[kind]
    if match := DECIMAL_TYPE.match(kind):
        return T.DecimalType(int(match.group(1)), int(match.group(2)))
    if FIXED_TYPE.match(kind):
        return T.BinaryType()
    if kind == "struct":
        return T.StructType([T.StructField(f.name, inline_type(f, f"{path}.{f.name}"), True) for f in spec.fields])  # type: ignore[union-attr]  # required for its kind (InlineType)
    if kind == "list":
        return T.ArrayType(inline_type(spec.element, f"{path}[]"), True)  # type: ignore[arg-type]  # required for its kind (InlineType)
    if kind == "map":
        key = inline_type(spec.key, f"{path}.key")  # type: ignore[arg-type]  # required for its kind (InlineType)
        return T.MapType(key, inline_type(spec.value, f"{path}.value"), True)  # type: ignore[arg-type]  # required for its kind (InlineType)
    raise ConfigError(f"{path}: unknown type {kind!r}")


def inline_value_fields(schema: InlineSchema) -> list[T.StructField]:
    return [T.StructField(f.name, inline_type(f, f.name), True) for f in schema.fields]


def required_paths(schema: InlineSchema | None) -> frozenset[str]:
    """Dotted paths of inline fields declared `optional: false` (checked per record, not by the table)."""
    paths: set[str] = set()

    def walk(fields, prefix: str) -> None:
        for f in fields:
            path = f"{prefix}{f.name}"
            if not f.optional:
                paths.add(path)
            if f.type == "struct":
                walk(f.fields, path + ".")

    if schema is not None:
        walk(schema.fields, "")
    return frozenset(paths)


def inline_to_avro(schema: InlineSchema, name: str = "Value") -> dict[str, Any]:
    """An Avro record schema equivalent to an inline schema, for Avro topics decoded without a registry."""
    counter = iter(range(1_000_000))

    def avro(spec: InlineType) -> Any:
        kind = spec.type
        if kind == "struct":
            base: Any = {
                "type": "record",
                "name": f"{name}_{next(counter)}",
                "fields": [{"name": f.name, "type": avro(f)} for f in spec.fields],  # type: ignore[union-attr]  # required for its kind (InlineType)
            }
        elif kind == "list":
            base = {"type": "array", "items": avro(spec.element)}  # type: ignore[arg-type]  # required for its kind (InlineType)
        elif kind == "map":
            base = {"type": "map", "values": avro(spec.value)}  # type: ignore[arg-type]  # required for its kind (InlineType)
        elif match := DECIMAL_TYPE.match(kind):
            precision, scale = map(int, match.groups())
            base = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
        elif match := FIXED_TYPE.match(kind):
            base = {"type": "fixed", "name": f"{name}_{next(counter)}", "size": int(match.group(1))}
        else:
            base = PRIMITIVES[kind].avro
        return ["null", base] if spec.optional else base

    return {"type": "record", "name": name, "fields": [{"name": f.name, "type": avro(f)} for f in schema.fields]}


def table_struct(value_fields: list[T.StructField], upsert: bool = False) -> T.StructType:
    """The table's columns; `upsert`: with the upsert columns (the batches executors read never carry them). Names
    Spark cannot tell apart (it resolves them ignoring case) are a config error, before any table is created."""
    reserved = {name.lower() for name in (*KAFKA_COLUMNS, *UPSERT_COLUMNS)}
    clash = sorted(f.name for f in value_fields if f.name.lower() in reserved)
    if clash:
        raise ConfigError(
            f"value fields {clash} clash with icefloe's Kafka metadata columns (Spark compares names ignoring case)"
        )
    same = _same_but_for_case(value_fields, "")
    if same:
        raise ConfigError(
            f"value fields {', '.join(map(str, same))} differ only in case: Spark resolves names ignoring case and "
            "cannot tell them apart; rename them in the schema"
        )
    return T.StructType([*value_fields, *METADATA_FIELDS, *(UPSERT_FIELDS if upsert else [])])


def _same_but_for_case(fields: list[T.StructField], path: str) -> list[list[str]]:
    """Groups of field names (dotted paths, nested fields too) that are equal ignoring case."""
    groups: dict[str, list[str]] = {}
    for f in fields:
        groups.setdefault(f.name.lower(), []).append(f"{path}{f.name}")
    same = [names for names in groups.values() if len(names) > 1]
    for f in fields:
        inner = f.dataType
        while isinstance(inner, (T.ArrayType, T.MapType)):
            inner = inner.elementType if isinstance(inner, T.ArrayType) else inner.valueType
        if isinstance(inner, T.StructType):
            same += _same_but_for_case(list(inner.fields), f"{path}{f.name}.")
    return same


def batch_struct(table: T.StructType) -> T.StructType:
    """What executors emit: the table's columns plus the record status columns."""
    return T.StructType([*table.fields, *STATUS_FIELDS])
