"""The columns a batch carries beside the value fields, one definition with their types.

`KAFKA_COLUMNS` are written to every table, after the value fields, in this order (docs/table-modes.md, "Table layout");
`UPSERT_COLUMNS` follow them in upsert tables only (their names are reserved in every table).
`STATUS_COLUMNS` travel with a batch but never reach the table: whether the record was a tombstone, and for a
record that failed, its error and raw bytes (for the dead-letter table).

Types are written in Spark's JSON schema form, so this module imports neither pyspark nor pydantic: the spec model
(which the Pulumi program imports) reads the names, `schema_mapping` builds the Spark fields, `conversion` the
Arrow columns.
"""

from __future__ import annotations

from typing import Any

SparkTypeJson = str | dict[str, Any]  # a Spark type as `DataType.jsonValue()` gives it: "long", {"type": "array", ...}


def field_json(name: str, type_json: SparkTypeJson) -> dict[str, Any]:
    """A nullable field in Spark's JSON schema form (`StructField.fromJson` reads it)."""
    return {"name": name, "type": type_json, "nullable": True, "metadata": {}}


HEADERS_TYPE: SparkTypeJson = {
    "type": "array",
    "elementType": {"type": "struct", "fields": [field_json("key", "string"), field_json("value", "binary")]},
    "containsNull": True,
}
KAFKA_COLUMNS: dict[str, SparkTypeJson] = {
    "kafka_topic": "string",
    "kafka_partition": "integer",
    "kafka_offset": "long",
    "kafka_timestamp": "timestamp",  # with zone (Iceberg timestamptz)
    "kafka_timestamp_type": "string",
    "kafka_key": "binary",  # the raw key bytes
    "kafka_headers": HEADERS_TYPE,
}
KAFKA_CLOCK = "kafka_clock"
# The clock of the change a row holds (the running max of its partition's timestamps, `upsert`): its position.
UPSERT_COLUMNS: dict[str, SparkTypeJson] = {KAFKA_CLOCK: "timestamp"}
TOMBSTONE = "icefloe_tombstone"
ERROR_CLASS = "icefloe_error_class"
ERROR_MESSAGE = "icefloe_error_message"
RAW_VALUE = "icefloe_raw_value"
SCHEMA_ID = "icefloe_schema_id"
STATUS_COLUMNS: dict[str, SparkTypeJson] = {
    TOMBSTONE: "boolean",
    ERROR_CLASS: "string",  # null for a good record
    ERROR_MESSAGE: "string",
    RAW_VALUE: "binary",  # the value bytes of a failed record
    SCHEMA_ID: "integer",  # its Schema Registry id, when the payload is framed
}
