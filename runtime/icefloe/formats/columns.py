"""The table's columns around a format's value fields: the value fields, then icefloe's Kafka metadata columns (and
an upsert table's own), every one nullable; a batch executors emit adds the record status columns. Built from
`batch_columns`' names and types."""

from __future__ import annotations

from pyspark.sql import types as T

from icefloe.batch_columns import KAFKA_COLUMNS, STATUS_COLUMNS, UPSERT_COLUMNS, SparkTypeJson, field_json
from icefloe.errors import ConfigError


def spark_field(name: str, type_json: SparkTypeJson) -> T.StructField:
    """A nullable Spark field from a type in Spark's JSON schema form (read by Spark's own parser)."""
    return T.StructField.fromJson(field_json(name, type_json))


METADATA_FIELDS = [spark_field(name, type_json) for name, type_json in KAFKA_COLUMNS.items()]
UPSERT_FIELDS = [spark_field(name, type_json) for name, type_json in UPSERT_COLUMNS.items()]
STATUS_FIELDS = [spark_field(name, type_json) for name, type_json in STATUS_COLUMNS.items()]


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
