"""The dead-letter table `<table>_dlq`: records that could not be materialized, with their raw bytes and error.

Exactly once like the main table: each DLQ snapshot records how far it has taken the topic's partitions, and a
batch only adds bad records at or past that mark. So a crash after the DLQ commit and before the main commit, then
a rerun, adds nothing twice. A log truncated below that mark (`onDataLoss: warn`) gives its offsets to new records:
the batch that reads them on from the truncation takes the mark back to where it reads (and records the truncation
in the dead-letter table's snapshot, so a rerun of that batch knows the mark is already the new log's).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.batch_columns import ERROR_CLASS, ERROR_MESSAGE, RAW_VALUE, SCHEMA_ID, STATUS_COLUMNS
from icefloe.commit.branch import commit_on_branch, drop_stale_branches
from icefloe.commit.checkpoint import Checkpoint, committed_state
from icefloe.formats.columns import METADATA_FIELDS, spark_field
from icefloe.source.kafka import LostRange
from icefloe.table.iceberg import IcebergTable

# Dead-letter columns taken from the batch's status columns (same types).
_FROM_STATUS = {
    "raw_value": RAW_VALUE,
    "schema_id": SCHEMA_ID,
    "error_class": ERROR_CLASS,
    "error_message": ERROR_MESSAGE,
}
DLQ_STRUCT = T.StructType(
    [
        *METADATA_FIELDS,
        *(spark_field(name, STATUS_COLUMNS[status]) for name, status in _FROM_STATUS.items()),
        T.StructField("run_id", T.StringType()),
        T.StructField("failed_at", T.TimestampType()),
    ]
)


def dead_letter_identifier(identifier: str) -> str:
    return f"{identifier}_dlq"


def commit_dead_letters(
    spark: SparkSession,
    identifier: str,
    topic: str,
    bad: DataFrame,
    next_offsets: dict[int, int],
    run_id: str,
    run_timeout_s: float,
    truncated: tuple[LostRange, ...] = (),
) -> int:
    """Append the batch's bad records not yet in the DLQ table; returns the snapshot id published. `truncated`: the
    truncations the batch reads on from (`kafka_source.Plan.truncated`)."""
    dlq = IcebergTable(spark, dead_letter_identifier(identifier))
    dlq.ensure(DLQ_STRUCT, (), 128, Checkpoint(topic).to_summary())
    drop_stale_branches(dlq, run_timeout_s)
    state = committed_state(dlq, topic)
    # A truncation not yet recorded here: the marks above it count records of the old log; the batch's are new.
    applied = set(state.checkpoint.lost) if state.checkpoint is not None else set()
    rewound = {r.partition for r in truncated if r not in applied}
    fresh = bad
    for partition, mark in state.offsets.items():
        if partition in rewound:
            continue
        fresh = fresh.where(~((F.col("kafka_partition") == partition) & (F.col("kafka_offset") < mark)))
    rows = fresh.select(
        *[F.col(f.name) for f in METADATA_FIELDS],
        *[F.col(status).alias(name) for name, status in _FROM_STATUS.items()],
        F.lit(run_id).alias("run_id"),
        F.current_timestamp().alias("failed_at"),
    )
    marks = {p: o if p in rewound else max(o, state.offsets.get(p, 0)) for p, o in next_offsets.items()}
    checkpoint = Checkpoint(topic, marks, run_id, lost=tuple(truncated))
    snapshot_id, _ = commit_on_branch(
        dlq,
        state.snapshot_id,  # type: ignore[arg-type]  # ensure() gives the table its first snapshot
        checkpoint,
        lambda branch: branch.append(rows),
        run_timeout_s,
    )
    return snapshot_id
