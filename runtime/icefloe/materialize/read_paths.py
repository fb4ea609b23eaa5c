"""Which read path a table's batches take, and the frames of the JVM path.

  jvm     Spark's Kafka source reads the planned ranges (jvm_source), `from_avro` decodes the values (avro_jvm); the
          records the JVM cannot decode exactly as Python would go through the Python decoder, which gives their
          value or their exact error (executor_tasks.redecode_rows). No record of the happy path touches Python.
  python  the per-record path: confluent-kafka, the Python decoders, Arrow (executor_tasks.read_batches).

The path is chosen per table by its envelope or else its format (`jvm_codec`: a codec, or why the values stay on
Python) and logged. Debezium Avro mirror tables take the JVM path where formats.debezium.jvm covers their columns;
an envelope's codec builds the change columns too. Avro tables (a Confluent-compatible or AWS Glue registry, or an inline
schema), raw or string tables (formats.raw) and inline JSON tables whose types formats.json_jvm covers take the JVM
path. Schemaless JSON, JSON Schema (validated per record) and Protobuf stay on Python, as does an Avro table whose
schema Avro Java refuses.

Two ways to write a JVM batch:
  - `exact_rows`: every record decoded in the JVM, streamed from Kafka to the writer with nothing held; the number of
    records that need Python is observed while writing. When it is not 0 the caller discards what was written.
  - `kept`: the batch as the error mode wants it (status columns, failed rows with their errors), decoded once and
    kept on disk (not in the heap) while the error mode and the writer read it. Its records the JVM cannot decode
    exactly are marked `PENDING` and decoded by Python only where there are some (`KeptBatch.with_python`): a batch
    of exact records (the common case) starts no Python worker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from icefloe.batch_columns import ERROR_CLASS, ERROR_MESSAGE, KAFKA_COLUMNS, RAW_VALUE, SCHEMA_ID, TOMBSTONE
from icefloe.formats.base import DecoderSpec, JvmCodec
from icefloe.formats.registry import envelope_of, format_of
from icefloe.materialize.python_tasks import KAFKA_TIMESTAMP_MS, ReadPlan, redecode_rows
from icefloe.source.kafka import OffsetRange
from icefloe.source.spark_kafka import read_ranges
from icefloe.table.iceberg import quoted

log = logging.getLogger(__name__)
JVM, PYTHON = "jvm", "python"
# A kept row whose record the JVM could not decode exactly: its values are not set until Python decodes it.
PENDING = "icefloe_pending"
_STRUCT, _EXACT, _RAW = "icefloe_value", "icefloe_exact", "icefloe_raw_value"
_KAFKA = list(KAFKA_COLUMNS)


@dataclass(frozen=True)
class ReadPath:
    name: str  # jvm | python
    reason: str
    avro: JvmCodec | None = None  # how the JVM decodes the values (an Avro or a raw format's codec)


def choose_read_path(spark: SparkSession, decoder: DecoderSpec) -> ReadPath:
    """The JVM path where the table's format has a JVM codec for the table, else Python."""
    codec = (envelope_of(decoder) or format_of(decoder)).jvm_codec(spark, decoder)
    if isinstance(codec, str):
        return ReadPath(PYTHON, codec)
    return ReadPath(JVM, codec.reason, codec)


class JvmBatch:
    """One batch read by the JVM: Spark's Kafka source and `from_avro`, Python only for what the JVM cannot decode."""

    def __init__(
        self,
        spark: SparkSession,
        plan: ReadPlan,
        avro: JvmCodec,
        ranges: list[OffsetRange],
        tasks: int,
    ):
        self.spark, self.plan, self.avro, self.ranges, self.tasks = spark, plan, avro, ranges, tasks

    def _decoded(self) -> DataFrame:
        """Kafka columns, the raw value, the decoded struct and whether the JVM's result is exact."""
        raw = read_ranges(self.spark, self.plan.kafka_conf, self.ranges, self.tasks)
        frame = raw.select("*", self.avro.decoded(F.col("value")).alias(_STRUCT))
        return frame.select("*", self._exact(frame).alias(_EXACT))

    def _exact(self, frame: DataFrame) -> Column:
        """The record rules of `executor_tasks._value` the JVM can check, and the JVM's decoding being exact."""
        value, key, plan = F.col("value"), F.col("kafka_key"), self.plan
        key_fields = plan.decoder.key_fields
        fields = [F.col(_STRUCT)[name].isNotNull() for name in key_fields]
        decoded_ok = (F.length(value) <= plan.max_record_bytes) & self.avro.exact(value, _STRUCT)
        low, high = (F.expr(f"timestamp_millis({ms})") for ms in KAFKA_TIMESTAMP_MS)  # else Python names it bad
        decoded_ok = decoded_ok & (F.col("kafka_timestamp").isNull() | F.col("kafka_timestamp").between(low, high))
        for present in fields:  # a key field of the value must not be null
            decoded_ok = decoded_ok & present
        # A tombstone is exact unless its key must be decoded (upsert keyed by value fields).
        condition = F.when(value.isNull(), F.lit(not key_fields)).otherwise(decoded_ok)
        if plan.needs_key:
            condition = condition & key.isNotNull() & (F.length(key) > 0)
        return F.coalesce(condition, F.lit(False))

    def _values(self) -> list[Column]:
        batch_schema = StructType.fromJson(json.loads(self.plan.batch_schema_json))
        columns = self.avro.value_columns(_STRUCT)
        return [columns[name].cast(batch_schema[name].dataType).alias(name) for name in self.plan.value_fields]

    def exact_rows(self, run_id: str) -> tuple[DataFrame, Observation]:
        """The table's columns of every record whose row is exact, and an observation counting the records (`rows`)
        and those whose row is not exact (`for_python`), with, per partition, the first and last offset of those
        (`first_<p>`, `last_<p>`: `python_ranges`), known once the frame has been written."""
        observation = Observation(f"icefloe_{run_id}")
        needs_python = ~F.col(_EXACT)
        bounds = []
        for partition in sorted({r.partition for r in self.ranges}):
            offset = F.when(needs_python & (F.col("kafka_partition") == partition), F.col("kafka_offset"))
            bounds += [F.min(offset).alias(f"first_{partition}"), F.max(offset).alias(f"last_{partition}")]
        frame = self._decoded().observe(
            observation, F.count(F.lit(1)).alias("rows"), F.count(F.when(needs_python, 1)).alias("for_python"), *bounds
        )
        return frame.where(F.col(_EXACT)).select(*self._values(), *_KAFKA), observation

    def python_ranges(self, observed: dict) -> list[OffsetRange] | None:
        """The ranges holding every record `exact_rows` left out (from its observation), or None if it does not say."""
        topic, found = self.ranges[0].topic, []
        for partition in sorted({r.partition for r in self.ranges}):
            if f"first_{partition}" not in observed or f"last_{partition}" not in observed:
                return None
            if observed[f"first_{partition}"] is not None:
                found.append(
                    OffsetRange(topic, partition, observed[f"first_{partition}"], observed[f"last_{partition}"] + 1)
                )
        return found

    def python_rows(self) -> tuple[DataFrame, Callable[[], None]]:
        """The records of these ranges whose JVM row is not exact, decoded by Python with the status columns (as
        `KeptBatch.with_python` gives them), and the function that releases what it keeps on disk."""
        rows = self.decoded_by_python(self._decoded().where(~F.col(_EXACT)))

        def release() -> None:
            rows.unpersist()

        return rows, release

    def decoded_by_python(self, records: DataFrame) -> DataFrame:
        """`records` (their Kafka columns and value bytes) decoded by Python with the status columns, kept on disk."""
        batch_schema = StructType.fromJson(json.loads(self.plan.batch_schema_json))
        return (
            records.select(
                *[F.unix_millis(c).alias(f"{c}_ms") if c == "kafka_timestamp" else F.col(c) for c in _KAFKA], "value"
            )
            .mapInArrow(partial(redecode_rows, self.plan), batch_schema)
            .persist(StorageLevel.DISK_ONLY)
        )

    def kept(self) -> KeptBatch:
        """Every record decoded once and kept on disk, with the status columns (`KeptBatch`)."""
        return KeptBatch(self)


class KeptBatch:
    """A JVM batch decoded once and kept on disk (not in the heap) while the error mode and the writer read it.

    `rows`: every record with the status columns, those the JVM could not decode exactly marked `PENDING` (their
    values unset, their errors not known yet); where none is, these are the batch's rows as `with_python` gives them,
    without a Python worker started. `with_python()`: every record, those decoded by Python (their values, or their
    exact error as a failed row)."""

    def __init__(self, jvm: JvmBatch):
        self.jvm = jvm
        self.batch_schema = StructType.fromJson(json.loads(jvm.plan.batch_schema_json))
        self._columns = [F.col(quoted(name)) for name in self.batch_schema.fieldNames()]  # any character in a name
        frame = jvm._decoded()
        # The table's values are kept, not the decoded struct: an envelope's (before, after, source, the key) is
        # several times the row, and every read of the batch (the error mode's pass, the writer's) would deserialize
        # it and build the values again.
        self.kept = frame.select(
            *jvm._values(),
            *_KAFKA,
            F.col("value").isNull().alias(TOMBSTONE),
            F.when(~F.col(_EXACT), F.col("value")).alias(_RAW),  # only what Python decodes keeps its bytes
            _EXACT,
        ).persist(StorageLevel.DISK_ONLY)
        self.status = [F.col(TOMBSTONE)] + [
            F.lit(None).cast(self.batch_schema[name].dataType).alias(name)
            for name in (ERROR_CLASS, ERROR_MESSAGE, RAW_VALUE, SCHEMA_ID)
        ]
        values = [F.col(quoted(name)) for name in jvm.plan.value_fields]
        self.rows = self.kept.select(*values, *_KAFKA, *self.status, (~F.col(_EXACT)).alias(PENDING)).select(
            *self._columns, PENDING
        )
        self.values = values
        self.for_python: DataFrame | None = None

    def with_python(self) -> DataFrame:
        """Every record with the status columns: the exact ones as the JVM decoded them, the others by Python."""
        exact_rows = self.kept.where(F.col(_EXACT)).select(*self.values, *_KAFKA, *self.status)
        records = self.kept.where(~F.col(_EXACT)).select(*_KAFKA, F.col(_RAW).alias("value"))
        self.for_python = self.jvm.decoded_by_python(records)
        return exact_rows.select(*self._columns).unionByName(self.for_python)

    def release(self) -> None:
        if self.for_python is not None:
            self.for_python.unpersist()
        self.kept.unpersist()
