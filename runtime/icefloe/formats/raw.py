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

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.formats.json import utf8

COLUMN = "value"
FORMATS = ("raw", "string")


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


def decoded(value: Column, plan: RawJvmPlan) -> Column:
    kept = value if plan.format == "raw" else value.cast("string")
    return F.when(value.isNotNull(), F.struct(kept.alias(COLUMN)))


def exact(value: Column, struct: str, plan: RawJvmPlan) -> Column:
    """Raw bytes are always exact; a string only when its bytes are valid UTF-8 (they survive a Java String)."""
    if plan.format == "raw":
        return F.lit(True)
    return F.expr(f"encode({struct}.{COLUMN}, 'UTF-8')") == value


def value_columns(struct: str, plan: RawJvmPlan) -> dict[str, Column]:
    return {COLUMN: F.col(f"{struct}.{COLUMN}")}
