"""Inline schemas (the table's `schema`, Iceberg-style types) to the table's Spark types, the fields declared
`optional: false` (checked per record), and the equivalent Avro schema for Avro topics read without a registry."""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from icefloe.errors import ConfigError
from icefloe.formats.columns import spark_field
from icefloe.inline_types import DECIMAL_TYPE, FIXED_TYPE, PRIMITIVES
from icefloe.spec import InlineSchema, InlineType

_INLINE_PRIMITIVES: dict[str, T.DataType] = {
    name: spark_field(name, primitive.spark).dataType for name, primitive in PRIMITIVES.items()
}


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
