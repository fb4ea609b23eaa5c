"""`format: raw` and `format: string`: the record value kept whole in one column `value`, beside the Kafka columns.

raw     value -> binary, the bytes as they are (an empty value is an empty binary; a tombstone a null).
string  value -> string, the bytes as UTF-8; a value that is not valid UTF-8 is a bad record (`DecodeError`).

Both read on the JVM path (data_plane): Spark's Kafka source already gives the value bytes, so `decoded` is the
value itself, or cast to a string; a string whose bytes do not survive a round trip through a Java String (invalid
UTF-8: Java replaces it) is not exact and goes to the Python decoder, which names the problem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.errors import ConfigError
from icefloe.formats.base import NONE, Decoder, DecoderSpec, ValueRules
from icefloe.formats.decoding import confluent_conf
from icefloe.formats.json import utf8
from icefloe.spec import SourceCluster, TableSpec

COLUMN = "value"


def value_fields(format: str) -> list[T.StructField]:
    """The table's value column for a raw or string topic."""
    return [T.StructField(COLUMN, T.BinaryType() if format == "raw" else T.StringType(), True)]


def decoder(format: str) -> Callable[[bytes], Any]:
    """The Python decoder: the value as the table's one column."""
    if format == "raw":
        return lambda data: {COLUMN: data}
    return lambda data: {COLUMN: utf8(data)}


@dataclass(frozen=True)
class RawJvmPlan:
    """How the JVM path reads a raw or string table's values (the counterpart of avro_jvm.AvroJvmPlan)."""

    format: str

    @property
    def reason(self) -> str:
        return f"Kafka source, values kept as {self.format}"

    # The JVM codec (formats.base.JvmCodec)
    def decoded(self, value: Column) -> Column:
        kept = value if self.format == "raw" else value.cast("string")
        return F.when(value.isNotNull(), F.struct(kept.alias(COLUMN)))

    def exact(self, value: Column, struct: str) -> Column:
        """Raw bytes are always exact; a string only when its bytes are valid UTF-8 (they survive a Java String)."""
        if self.format == "raw":
            return F.lit(True)
        return F.expr(f"encode({struct}.{COLUMN}, 'UTF-8')") == value

    def value_columns(self, struct: str) -> dict[str, Column]:
        return {COLUMN: F.col(f"{struct}.{COLUMN}")}


class Raw:
    """`format: raw` or `format: string` (`name`), read on the JVM path."""

    def __init__(self, name: str):
        self.name = name

    def resolve(self, table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
        return DecoderSpec(self.name, NONE, table.topic, registry_conf=confluent_conf(cluster), **keys)

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[T.StructField] | None:
        return value_fields(self.name)

    def for_batch(self, spark, spec, batch):
        raise NotImplementedError

    def registry_schema(self, spec: DecoderSpec) -> bool:
        return False

    def rules(self, spec: DecoderSpec, table: TableSpec) -> ValueRules:
        return ValueRules()

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> RawJvmPlan:
        return RawJvmPlan(self.name)

    def decoder(self, spec: DecoderSpec) -> Decoder:
        return decoder(self.name)

    def key_decoder(self, spec: DecoderSpec) -> Decoder:
        """The key as the one key field: bytes (raw) or text (string)."""
        if len(spec.key_fields) != 1:
            raise ConfigError(f"{spec.topic}: keyFormat {self.name} can only give one key field, not {spec.key_fields}")
        field_name, as_text = spec.key_fields[0], self.name == "string"
        return lambda data: {field_name: utf8(data, "key") if as_text else data}


RAW, STRING = Raw("raw"), Raw("string")
