"""What a data format is to the rest of the runtime (`Format`), what an envelope around one is (`Envelope`), and the
picklable `DecoderSpec` an executor decodes a table's records with. `formats.registry` holds one of each by name;
materialize asks it, and never names a format.

A format answers, per table: where its schema comes from and the table's value columns (driver), the Python
decoder and the key decoder (executors), an optional JVM codec for the JVM read path, and the rules the converter
applies to its values. A decoder raises `errors.BadRecord` for what makes a record bad; anything else it raises is a
bug (`errors.DecoderFailure`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.types import StructField

    from icefloe.spec import SourceCluster, TableSpec

Decoder = Callable[[bytes], Any]

# Where the table's schema comes from (DecoderSpec.schema_from).
CONFLUENT, GLUE, INLINE, BATCH, NONE = "confluent", "glue", "inline", "batch", "none"


@dataclass(frozen=True)
class DecoderSpec:
    """Everything an executor needs to decode one table's values (picklable, holds no secret in its repr)."""

    data_format: str  # what the bytes are: the table's `format` (formats.registry.FORMATS' key)
    schema_from: str  # confluent | glue (registry_conf says which) | inline | batch (schemaless JSON) | none
    topic: str
    schema_str: str | None = None  # the table's (reader) schema, as its format writes it
    registry_conf: dict[str, str] | None = None  # a Confluent client's settings, or the Glue conf (`schema_from`)
    key_fields: tuple[str, ...] = ()  # upsert keyed by value fields: a tombstone's key gives their values
    key_format: str | None = None  # a FORMATS key too
    message_type: str | None = None  # protobuf: the full name of the message type the table reads
    schema_id: int | None = None  # json-schema, protobuf (Confluent): the schema id whose records read on the JVM
    key_conf: dict[str, str] | None = None  # keys framed for the AWS Glue Schema Registry (glue_framed)
    envelope: str | None = None  # the table's envelope (registry.ENVELOPES' key); None: plain values
    # An envelope's decoding plan (JSON; `formats.debezium.tables`): its decoder reads the key and headers too.
    envelope_plan: str | None = None

    def __repr__(self) -> str:
        return f"DecoderSpec(data_format={self.data_format!r}, schema_from={self.schema_from!r}, topic={self.topic!r})"

    # The fields a format reads are set for it by its resolve(); these read them as set.
    @property
    def registry(self) -> dict[str, str]:
        return cast(dict[str, str], self.registry_conf)

    @property
    def schema(self) -> str:
        return cast(str, self.schema_str)


@dataclass(frozen=True)
class ValueRules:
    """How the converter checks a format's decoded values."""

    strict: bool = False  # JSON kinds: values checked field by field (Avro and Protobuf values are typed already)
    required: frozenset[str] = frozenset()  # inline fields declared `optional: false`
    framed: bool = False  # values in Confluent wire format: a failed row carries its schema id


@dataclass(frozen=True)
class BatchContext:
    """What a format whose columns come from each batch (schemaless JSON) reads them from."""

    kafka_conf: dict
    tasks: list  # the batch's OffsetRanges, one Spark task each
    max_record_bytes: int
    table_fields: list  # the Iceberg table's current value columns (StructFields)
    where: str = ""  # "table <identifier>", for the errors it raises
    # The batch is streamed to the table on the JVM path, each record checked against the columns (an append): the
    # columns the table already has may be assumed (`Format.for_batch`).
    assume: bool = False


@dataclass(frozen=True)
class BatchColumns:
    """A batch's value columns (`Format.for_batch`) and the spec its records decode with."""

    spec: DecoderSpec
    fields: list[StructField]
    # Columns assumed (`BatchContext.assume`), not checked against every record first: whether they also explain the
    # records of the given ranges (OffsetRanges), those the JVM's write left to Python. None: checked already.
    explains: Callable[[list], bool] | None = None


class JvmCodec(Protocol):
    """How the JVM read path decodes a table's values (`materialize.read_paths.JvmBatch`)."""

    @property
    def reason(self) -> str: ...  # what the read path log line says

    def decoded(self, value: Column) -> Column: ...  # the decoded struct of a Kafka `value` column

    def exact(self, value: Column, struct: str) -> Column: ...  # whether the JVM's decoding equals Python's

    def value_columns(self, struct: str) -> dict[str, Column]: ...  # the table's columns from the struct


class Format(Protocol):
    """One data format (the table's `format`)."""

    name: str

    # driver
    def resolve(self, table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
        """Where the table's schema comes from (a registry's latest version, inline, none); ConfigError if none."""
        ...

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[StructField] | None:
        """The table's value columns; None when only a batch knows them (`for_batch`)."""
        ...

    def for_batch(self, spark: SparkSession, spec: DecoderSpec, batch: BatchContext) -> BatchColumns:
        """The batch's value columns and the spec its records decode with (only when `value_fields` is None)."""
        ...

    def registry_schema(self, spec: DecoderSpec) -> bool:
        """The table's schema is a registry's latest version: resolved again once the batch is planned."""
        ...

    def rules(self, spec: DecoderSpec, table: TableSpec) -> ValueRules: ...

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> JvmCodec | str:
        """The JVM path's codec, or why the table's values are read on the Python path."""
        ...

    # executors
    def decoder(self, spec: DecoderSpec) -> Decoder:
        """Bytes to the value's fields; raises BadRecord for a bad record."""
        ...

    def key_decoder(self, spec: DecoderSpec) -> Decoder:
        """This format as the table's `keyFormat`: a Kafka key to its fields (or one value for one key field)."""
        ...


# An envelope's executor decoder: (value, key, headers) -> the row and its change columns.
ChangeDecoder = Callable[[bytes | None, bytes | None, list | None], dict]


class Envelope(Protocol):
    """A wrapper around a format's values (change events: the table's `envelope`), read on the JVM path where its
    `jvm_codec` covers the table, else on the Python path. Where a
    table has one (`DecoderSpec.envelope`), materialize asks it what it would ask the format, and gives its change
    columns and row keys to the writer. Registered in `registry.ENVELOPES`."""

    name: str

    # driver
    def resolve(self, table: TableSpec, cluster: SourceCluster) -> DecoderSpec:
        """The table's spec, `envelope` and `envelope_plan` set (the envelope resolves its columns and key)."""
        ...

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[StructField]:
        """The table's columns as known before a batch is read."""
        ...

    def per_batch(self, spec: DecoderSpec) -> bool:
        """The batch's events give columns too (then `for_batch`)."""
        ...

    def for_batch(
        self, spark: SparkSession, spec: DecoderSpec, batch: BatchContext
    ) -> tuple[DecoderSpec, list[StructField]]: ...

    def registry_schema(self, spec: DecoderSpec) -> bool:
        """As `Format.registry_schema`: resolved again once the batch is planned."""
        ...

    def rules(self, spec: DecoderSpec, inner: ValueRules) -> ValueRules:
        """The converter's rules, from the wrapped format's (`inner`)."""
        ...

    def change_fields(self, spec: DecoderSpec) -> list[StructField]:
        """Columns after the value fields that the writer consumes (position, operation...)."""
        ...

    def row_keys(self, spec: DecoderSpec) -> list[str]:
        """The upsert key (the source's primary key)."""
        ...

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> JvmCodec | str:
        """As `Format.jvm_codec`: the events' JVM codec (its rows carry the change columns too), or why they stay
        on Python."""
        ...

    # executors
    def decoder(self, spec: DecoderSpec) -> ChangeDecoder:
        """(value, key, headers) to the row and its change columns. Raises BadRecord (a subclass with its own
        `kind` for its own bad events)."""
        ...
