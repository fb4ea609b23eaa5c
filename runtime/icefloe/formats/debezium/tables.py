"""The driver side of Debezium tables: the columns, the key, the decoder spec, and JSON topics' per-batch columns.

Columns: a mirror table (`mode: upsert`) has the source table's columns (the `after` image's fields; the key columns
are the Debezium key's fields, by their names), then `cdc_position` (the source position of the change the row
holds) and, with `deletes: soft`, `cdc_deleted` and `cdc_deleted_at`. A changelog (`mode: append`) has the `after`
columns, `cdc_op`, `cdc_position`, `cdc_ts` (when the change happened in the source), `cdc_unavailable` (the columns
the source did not send) and `cdc_before` (the `before` image as a struct). Then the Kafka columns, as every table.

Avro: the value subject's latest version (its registry references resolved: Apicurio's converter registers the
envelope's nested records as subjects of their own) gives the columns, the key subject's the key columns. JSON
(the JsonConverter with or without its `{"schema", "payload"}` wrapper): the columns come from each batch's events,
read once before the batch (their schemas, else their values' types, as schemaless JSON), and the table evolves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial, reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from icefloe.batch_columns import (
    CHANGE,
    CHANGE_MOVED_FROM,
    CHANGE_TIME,
    CHANGE_UNCHANGED,
    KAFKA_COLUMNS,
    SOURCE_POSITION,
    UPSERT_COLUMNS,
)
from icefloe.errors import ConfigError
from icefloe.formats import schemaless_json as json_inference
from icefloe.formats.debezium import types
from icefloe.formats.debezium.envelope import CDC_BEFORE, CDC_OP, CDC_TS, CDC_UNAVAILABLE

DELETED, DELETED_AT = "cdc_deleted", "cdc_deleted_at"
RESERVED = (SOURCE_POSITION, CDC_OP, CDC_TS, CDC_BEFORE, CDC_UNAVAILABLE, DELETED, DELETED_AT)


@dataclass(frozen=True)
class Layout:
    """A Debezium table's columns for one batch: `after` the source's, `keys` the key columns."""

    mode: str
    soft: bool
    after: list[T.StructField]
    keys: list[str]

    def value_fields(self) -> list[T.StructField]:
        """The table's columns before the Kafka columns."""
        position = T.StructField(SOURCE_POSITION, T.BinaryType(), True)
        if self.mode == "upsert":
            soft = [T.StructField(DELETED, T.BooleanType(), True), T.StructField(DELETED_AT, T.TimestampType(), True)]
            return [*self.after, position, *(soft if self.soft else [])]
        return [
            *self.after,
            T.StructField(CDC_OP, T.StringType(), True),
            position,
            T.StructField(CDC_TS, T.TimestampType(), True),
            T.StructField(CDC_UNAVAILABLE, T.ArrayType(T.StringType(), True), True),
            T.StructField(CDC_BEFORE, T.StructType(self.after) if self.after else T.StringType(), True),
        ]

    def change_fields(self) -> list[T.StructField]:
        """The change columns a mirror table's batch carries to the upsert writer (never written)."""
        if self.mode != "upsert":
            return []
        after = {f.name: f for f in self.after}
        moved = T.StructType([after[k] for k in self.keys if k in after]) if self.keys else T.StringType()
        return [
            T.StructField(CHANGE, T.StringType(), True),
            T.StructField(CHANGE_UNCHANGED, T.ArrayType(T.StringType(), True), True),
            T.StructField(CHANGE_MOVED_FROM, moved, True),
            T.StructField(CHANGE_TIME, T.TimestampType(), True),
        ]


def check_columns(after: list[T.StructField], keys: list[str], where: str) -> None:
    names = [f.name for f in after]
    clash = sorted(n for n in names if n.lower() in {*RESERVED, *KAFKA_COLUMNS, *UPSERT_COLUMNS})
    if clash:
        raise ConfigError(f"{where}: source columns {clash} clash with icefloe's cdc_/kafka_ columns")
    missing = [k for k in keys if k not in names]
    if missing:
        raise ConfigError(f"{where}: the Debezium key's fields {missing} are not columns of the after image {names}")


def plan(layout: Layout, placeholder: str, connect: types.Connect | None) -> str:
    """What executors need to decode the table's events (JSON; `envelope.ChangeDecoder`)."""
    return json.dumps(
        {
            "mode": layout.mode,
            "keys": layout.keys,
            "columns": [f.name for f in layout.after],
            "placeholder": placeholder,
            "connect": connect,
        }
    )


# --- Avro ---------------------------------------------------------------------------------------------------------


def avro_layout(client: Any, topic: str, mode: str, soft: bool, where: str) -> tuple[Layout, types.Connect]:
    """The columns from the value subject's latest version (references resolved) and the key from the key subject's."""
    value = _resolved(client, f"{topic}-value", where)
    envelope = value.get("fields") if isinstance(value, dict) else None
    after = next((c for name, c in envelope or [] if name == "after"), None)
    if after is None or after.get("type") != "struct":
        raise ConfigError(f"{where}: subject {topic}-value is not a Debezium envelope (no after record)")
    keys: list[str] = []
    try:
        key = _resolved(client, f"{topic}-key", where)
        keys = [name for name, _ in key.get("fields", [])]
    except ConfigError:
        if mode == "upsert":
            raise ConfigError(
                f"{where}: a mirror table needs the Debezium key in the registry (subject {topic}-key): set the "
                "connector's key.converter like its value.converter"
            ) from None
    columns = types.fields(after, where)
    check_columns(columns, keys, where)
    return Layout(mode, soft, columns, keys), after


def _resolved(client: Any, subject: str, where: str) -> types.Connect:
    """A subject's latest Avro schema, normalized, with the named types of its references (recursively)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        latest = client.get_latest_version(subject)
    except SchemaRegistryError as error:
        if error.http_status_code == 404:
            raise ConfigError(f"{where}: no schema registered under subject {subject!r}") from None
        raise
    named: dict[str, Any] = {}

    def collect(schema: Any) -> None:
        for reference in schema.references or []:
            referenced = client.get_version(reference.subject, reference.version)
            collect(referenced.schema)
            parsed = json.loads(referenced.schema.schema_str)
            types.from_avro(parsed, named)  # registers its named types
            named.setdefault(reference.name, parsed)

    collect(latest.schema)
    return types.from_avro(json.loads(latest.schema.schema_str), named)


# --- JSON -----------------------------------------------------------------------------------------------------------


def parse_json(data: bytes) -> tuple[Any, Any]:
    """A JsonConverter message: (payload, schema or None)."""
    from icefloe.formats.json import parse_json as strict_json

    value = strict_json(data)
    if isinstance(value, dict) and set(value) == {"schema", "payload"}:
        return value["payload"], value["schema"]
    return value, None


def infer_ranges(kafka_conf: dict, max_record_bytes: int, tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow`: per planned range, the `after` columns its events' schemas give (Spark JSON), the types their
    schemaless values have (`json_inference`), and the key's fields."""
    from icefloe.source.kafka import OffsetRange, read_range

    out = pa.schema([("fields", pa.string()), ("inferred", pa.string()), ("keys", pa.string())])
    for task_batch in tasks:
        for task in task_batch.to_pylist():
            fields: dict[str, Any] = {}
            seen: list = []
            inferred: Any = "null"
            keys: list[str] | None = None
            for msg in read_range(
                kafka_conf, OffsetRange(task["topic"], task["partition"], task["start"], task["end"])
            ):
                value = msg.value()
                if value is not None and len(value) > max_record_bytes:
                    continue
                try:
                    if keys is None and msg.key():  # tombstones name the key columns too
                        key, _ = parse_json(msg.key())  # type: ignore[arg-type]  # checked above
                        keys = list(key) if isinstance(key, dict) else None
                    if value is None:
                        continue
                    payload, schema = parse_json(value)
                except ValueError:
                    continue  # the read makes it a bad record
                if not isinstance(payload, dict):
                    continue
                if schema is not None:
                    if schema not in seen:
                        seen.append(schema)
                        after = next((f for f in schema.get("fields", []) if f.get("field") == "after"), None)
                        if after is not None:
                            try:
                                for field in types.fields(types.from_json(after), "after"):
                                    fields.setdefault(field.name, field.jsonValue())
                            except (ConfigError, KeyError):
                                continue
                    continue
                for image in ("after", "before"):
                    if isinstance(payload.get(image), dict):
                        inferred = json_inference.unify(inferred, json_inference.infer(payload[image]))
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "fields": json.dumps(list(fields.values())),
                        "inferred": json.dumps(inferred),
                        "keys": json.dumps(keys),
                    }
                ],
                schema=out,
            )


def json_layout(
    spark: Any,
    kafka_conf: dict,
    tasks: list,
    max_record_bytes: int,
    current: list[T.StructField],
    mode: str,
    soft: bool,
    where: str,
) -> Layout:
    """The batch's columns: the table's (`current`, without the Kafka and cdc_ columns), evolved with its events'."""
    rows = [(t.topic, t.partition, t.start, t.end) for t in tasks]
    frame = spark.createDataFrame(
        spark.sparkContext.parallelize(rows, max(1, len(rows))), "topic string, partition int, start long, end long"
    )
    found = frame.mapInArrow(
        partial(infer_ranges, kafka_conf, max_record_bytes), "fields string, inferred string, keys string"
    ).collect()
    columns = [
        f for f in current if f.name not in RESERVED and f.name not in KAFKA_COLUMNS and f.name not in UPSERT_COLUMNS
    ]
    by_name = {f.name: i for i, f in enumerate(columns)}
    keys: list[str] = []
    for row in found:
        for field_json in json.loads(row.fields):
            field = T.StructField.fromJson(field_json)
            if field.name not in by_name:
                by_name[field.name] = len(columns)
                columns.append(field)
            elif isinstance(columns[by_name[field.name]].dataType, T.IntegerType) and isinstance(
                field.dataType, T.LongType
            ):
                columns[by_name[field.name]] = field  # int -> long, an Iceberg promotion
        keys = keys or json.loads(row.keys) or []
    inferred = reduce(json_inference.unify, (json.loads(row.inferred) for row in found), "null")
    columns = list(json_inference.value_struct(columns, inferred).fields)
    check_columns(columns, keys, where)
    return Layout(mode, soft, columns, keys)


# --- the decoder spec ---------------------------------------------------------------------------------------------


def decoder_spec(table: Any, registry: dict[str, str] | None, where: str) -> Any:
    """The table's DecoderSpec: Avro's columns from the registry now, JSON's from each batch (`with_layout`)."""
    from icefloe.formats.base import CONFLUENT, NONE, DecoderSpec
    from icefloe.registries.confluent import registry_client, registry_errors

    if table.format == "avro":
        if registry is None:
            raise ConfigError(f"{where}: envelope debezium with format avro needs the cluster's schemaRegistry")
        with registry_errors(registry, f"{table.topic}-value"):
            layout, after = avro_layout(
                registry_client(registry), table.topic, table.mode, table.deletes == "soft", where
            )
        spec = DecoderSpec("avro", CONFLUENT, table.topic, registry_conf=registry, envelope=table.envelope)
        return with_layout(spec, layout, table.unavailable_value_placeholder, after)
    spec = DecoderSpec("json", NONE, table.topic, registry_conf=registry, envelope=table.envelope)
    return with_layout(spec, Layout(table.mode, table.deletes == "soft", [], []), table.unavailable_value_placeholder)


def with_layout(spec: Any, layout: Layout, placeholder: str, connect: types.Connect | None = None) -> Any:
    from dataclasses import replace

    envelope = json.loads(plan(layout, placeholder, connect))
    envelope.update(after=T.StructType(layout.after).json(), soft=layout.soft)
    return replace(spec, envelope_plan=json.dumps(envelope))


def layout_of(spec: Any) -> Layout:
    envelope = json.loads(spec.envelope_plan)
    after = T.StructType.fromJson(json.loads(envelope["after"]))
    return Layout(envelope["mode"], envelope["soft"], list(after.fields), envelope["keys"])


def placeholder_of(spec: Any) -> str:
    return json.loads(spec.envelope_plan)["placeholder"]


def change_decoder(spec: Any) -> Any:
    """The executor's decoder of the table's events: (value, key, headers) -> row (`envelope.ChangeDecoder`)."""
    from icefloe.formats.avro.reader import registry_avro_decoder
    from icefloe.formats.debezium.envelope import ChangeDecoder

    envelope = json.loads(spec.envelope_plan)
    if spec.data_format == "avro":
        value = registry_avro_decoder(spec, None, False)
        key = registry_avro_decoder(spec, None, True)
        return ChangeDecoder(envelope, lambda data: (value(data), None), key)
    return ChangeDecoder(envelope, parse_json, lambda data: parse_json(data)[0])
