"""The dead-letter table `<table>_dlq`: records that could not be materialized, with their raw bytes and error.

Exactly once like the main table: each DLQ snapshot records how far it has taken the topic's partitions, and a
batch only adds bad records at or past that mark. So a crash after the DLQ commit and before the main commit, then
a rerun, adds nothing twice.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .commit import commit_on_branch, drop_stale_branches
from .commit_state import Checkpoint, committed_state
from .iceberg_table import IcebergTable
from .schema_mapping import METADATA_FIELDS

DLQ_STRUCT = T.StructType(
    [
        *METADATA_FIELDS,
        T.StructField("raw_value", T.BinaryType()),
        T.StructField("schema_id", T.IntegerType()),
        T.StructField("error_class", T.StringType()),
        T.StructField("error_message", T.StringType()),
        T.StructField("run_id", T.StringType()),
        T.StructField("failed_at", T.TimestampType()),
    ]
)


def dead_letter_identifier(identifier: str) -> str:
    return f"{identifier}_dlq"


def commit_dead_letters(
    spark: SparkSession, identifier: str, topic: str, bad: DataFrame, next_offsets: dict[int, int], run_id: str
) -> int:
    """Append the batch's bad records not yet in the DLQ table; returns the snapshot id published."""
    dlq = IcebergTable(spark, dead_letter_identifier(identifier))
    dlq.ensure(DLQ_STRUCT, (), 128, Checkpoint(topic).to_summary())
    drop_stale_branches(dlq)
    state = committed_state(dlq, topic)
    fresh = bad
    for partition, mark in state.offsets.items():
        fresh = fresh.where(~((F.col("kafka_partition") == partition) & (F.col("kafka_offset") < mark)))
    rows = fresh.select(
        *[F.col(f.name) for f in METADATA_FIELDS],
        F.col("icefloe_raw_value").alias("raw_value"),
        F.col("icefloe_schema_id").alias("schema_id"),
        F.col("icefloe_error_class").alias("error_class"),
        F.col("icefloe_error_message").alias("error_message"),
        F.lit(run_id).alias("run_id"),
        F.current_timestamp().alias("failed_at"),
    )
    marks = {p: max(o, state.offsets.get(p, 0)) for p, o in next_offsets.items()}
    checkpoint = Checkpoint(topic, marks, run_id)
    snapshot_id, _ = commit_on_branch(dlq, state.snapshot_id, checkpoint, lambda branch: branch.append(rows))
    return snapshot_id
