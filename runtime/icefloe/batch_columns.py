"""The columns a batch carries beside the value fields, one definition with their types.

`KAFKA_COLUMNS` are written to every table, after the value fields, in this order (docs/table-modes.md, "Table layout");
`UPSERT_COLUMNS` follow them in upsert tables only (their names are reserved in every table).
`STATUS_COLUMNS` travel with a batch but never reach the table: whether the record was a tombstone, and for a
record that failed, its error and raw bytes (for the dead-letter table).

Types are written in Spark's JSON schema form, so this module imports neither pyspark nor pydantic: the spec model
(which the Pulumi program imports) reads the names, `formats.columns` builds the Spark fields, `conversion` the
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
# A change-data table's rows keep the position of their change in the source database (bytes that compare bytewise
# in the source's order; null: none, Kafka order decides): the upsert order's first component (`upsert`).
SOURCE_POSITION = "cdc_position"
# Columns an envelope (a change-data format) gives a batch beside the value fields, consumed by the upsert writer and
# never written: what the record changes ("upsert", "delete", "truncate", or "none": consumed without effect; a
# batch without the column: every record is an upsert or, as a tombstone, a delete), the columns the source did not
# send (the row keeps their value), the key a row moved from (a primary-key change), and when the change happened.
CHANGE = "icefloe_change"
CHANGE_UNCHANGED = "icefloe_unchanged"
CHANGE_MOVED_FROM = "icefloe_moved_from"
CHANGE_TIME = "icefloe_change_time"
# `deletes: soft`: a deleted row stays, flagged, with its delete's time (table columns).
SOFT_DELETED, SOFT_DELETED_AT = "cdc_deleted", "cdc_deleted_at"
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
