"""Upsert mode: the latest change per key wins, a tombstone deletes its key's row.

The batch is reduced to one change per key and merged with `MERGE INTO` on the run's branch (merge-on-read: position deletes, cheap to write, folded away by
compaction). The commit protocol then puts the offsets on the same branch (an empty append carrying them), so the
fast-forward publishes the merge and the offsets together.

Which change is the latest: every change has a position `(clock, partition, offset)`. The clock is its partition's
clock at that record: the highest Kafka timestamp the partition has shown up to and including it (a running max over
offsets; a record without a timestamp takes the clock as it stands; bad records, which change nothing, do not move
it). Positions compare by clock, then partition, then offset. Inside one partition that is Kafka's offset order (the
clock never goes back; ties fall to the offset) whatever producers put in the timestamps, as log compaction and
Kafka's tables see it. Across partitions (a key's
records span partitions with `key:` value fields, or after partitions are added) the clock decides, so that order is
only as good as the producers' clocks; topics with `LogAppendTime` are safe (the broker sets the timestamps).

The rule does not depend on where batches end:
- the clock carries over batches: the checkpoint records each partition's clock at its next offset
  (`Checkpoint.clocks`), and a batch computes clock = max(carried clock, running max of the partition's timestamps);
- within a batch the change with the greatest position per key is the one applied;
- across batches a change applies to a row only if its position is after the row's (a row keeps its change's clock
  in `kafka_clock`; a row written before that column existed compares with its `kafka_timestamp`);
- a delete keeps its key and position as a marker in `<table>_deletes`, so an older change of the key read later
  (from a lagging partition) does not bring the row back: an insert is dropped when the key's marker is at or after
  it. Markers are kept `deleteMarkerRetention` (default 7d, on the marker's clock; maintenance expires them).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.batch_columns import KAFKA_CLOCK, TOMBSTONE
from icefloe.commit.branch import Branch, commit_on_branch, drop_stale_branches
from icefloe.commit.checkpoint import Checkpoint, committed_state
from icefloe.errors import ConfigError
from icefloe.table.iceberg import IcebergTable, quoted

# The running max is taken per block of a partition's offsets (sorting whole partitions would run in one task each);
# the blocks before a record contribute their maxima.
CLOCK_BLOCK = 100_000
NO_CLOCK = -(2**63) + 1  # a position without clock (no timestamp seen yet) is before every clock
_POSITION_FIELDS = [
    T.StructField(KAFKA_CLOCK, T.TimestampType()),
    T.StructField("kafka_partition", T.IntegerType()),
    T.StructField("kafka_offset", T.LongType()),
]


def key_columns(key: tuple[str, ...] | None, value_fields: list[T.StructField], where: str) -> list[str]:
    """The columns an upsert matches rows on: the `key:` value fields, else the raw Kafka key. A key field the
    value schema lacks (a registry schema is only known at run time) is a config error."""
    if not key:
        return ["kafka_key"]
    names = [f.name for f in value_fields]
    missing = [name for name in key if name not in names]
    if missing:
        raise ConfigError(
            f"{where}: key names field(s) {missing} that the value schema does not have (fields: {names})"
        )
    return list(key)


def delete_markers_identifier(identifier: str) -> str:
    return f"{identifier}_deletes"


def positioned(frame: DataFrame, carried: dict[int, int]) -> tuple[DataFrame, dict[int, int]]:
    """`frame` (a batch's changes) with each change's clock in `kafka_clock`, and each partition's clock at the end
    of the batch (to carry in the checkpoint); `carried`: the clocks the committed checkpoint carries (epoch ms)."""
    spark = frame.sparkSession
    stamped = frame.withColumn("icefloe_block", F.floor(F.col("kafka_offset") / CLOCK_BLOCK)).withColumn(
        "icefloe_ms", F.unix_millis("kafka_timestamp")
    )
    blocks: dict[int, list[tuple[int, int | None]]] = {}
    for row in stamped.groupBy("kafka_partition", "icefloe_block").agg(F.max("icefloe_ms").alias("top")).collect():
        blocks.setdefault(row.kafka_partition, []).append((row.icefloe_block, row.top))
    clocks, before = dict(carried), []
    for partition, tops in blocks.items():
        clock = carried.get(partition)
        for block, top in sorted(tops):
            before.append((partition, block, clock))
            clock = top if clock is None else clock if top is None else max(clock, top)
        if clock is not None:
            clocks[partition] = clock
    start = spark.createDataFrame(before, "kafka_partition int, icefloe_block long, icefloe_before long")
    running = (
        Window.partitionBy("kafka_partition", "icefloe_block")
        .orderBy("kafka_offset")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    running_clock = F.greatest(F.col("icefloe_before"), F.max("icefloe_ms").over(running))  # greatest skips nulls
    with_clock = (
        stamped.join(F.broadcast(start), ["kafka_partition", "icefloe_block"])
        .withColumn(KAFKA_CLOCK, F.timestamp_millis(running_clock))
        .drop("icefloe_block", "icefloe_ms", "icefloe_before")
    )
    return with_clock, clocks


def _clock(alias: str, fallback: str | None = None) -> str:
    """SQL: the clock (epoch ms) of the position `alias` holds; `fallback`: a column standing in for a null clock."""
    columns = [f"unix_millis({alias}.{KAFKA_CLOCK})", *([f"unix_millis({alias}.{fallback})"] if fallback else [])]
    return f"coalesce({', '.join(columns)}, {NO_CLOCK}L)"


def _after(a: tuple[str, str, str], b: tuple[str, str, str]) -> str:
    """SQL: position `a` (clock, partition, offset) is after position `b`."""
    (ac, ap, ao), (bc, bp, bo) = a, b
    return f"({ac} > {bc} OR ({ac} = {bc} AND ({ap} > {bp} OR ({ap} = {bp} AND {ao} > {bo}))))"


def merge_batch(
    frame: DataFrame, branch: Branch, struct: T.StructType, key_columns: list[str], run_timeout_s: float
) -> int:
    """Merge one batch (with `kafka_clock`, see `positioned`) into the run's branch; returns the number of changes
    the batch holds after its reduction to one per key (a change older than the row it meets counts, though it
    changes nothing)."""
    spark = branch.spark
    columns = [f.name for f in struct.fields]
    keys = [F.col(quoted(k)) for k in key_columns]
    latest_first = Window.partitionBy(*keys).orderBy(
        F.coalesce(F.unix_millis(KAFKA_CLOCK), F.lit(NO_CLOCK)).desc(),
        F.col("kafka_partition").desc(),
        F.col("kafka_offset").desc(),
    )
    changes = (
        frame.withColumn("icefloe_rank", F.row_number().over(latest_first))
        .where("icefloe_rank = 1")
        .select(*[F.col(quoted(c)) for c in columns], TOMBSTONE)
        .persist()
    )
    try:
        markers = _commit_delete_markers(changes, branch, struct, key_columns, run_timeout_s)
        view = f"icefloe_changes_{branch.name}"
        changes.createOrReplaceTempView(view)
        source, insert_when = view, f"NOT s.{TOMBSTONE}"
        if markers is not None:  # the key's marker, if any, beside each change
            on = " AND ".join(f"c.{quoted(k)} = m.{quoted(k)}" for k in key_columns)
            source = (
                f"(SELECT c.*, {_clock('m')} AS icefloe_marker_clock, m.kafka_partition AS icefloe_marker_partition, "
                f"m.kafka_offset AS icefloe_marker_offset FROM {view} c LEFT JOIN {markers} m ON {on})"
            )
            marker = ("s.icefloe_marker_clock", "s.icefloe_marker_partition", "s.icefloe_marker_offset")
            insert_when += f" AND (s.icefloe_marker_partition IS NULL OR {_after(_position('s'), marker)})"
        newer = _after(_position("s"), (_clock("t", fallback="kafka_timestamp"), "t.kafka_partition", "t.kafka_offset"))
        matches = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in key_columns)
        updates = ", ".join(f"t.{quoted(c)} = s.{quoted(c)}" for c in columns)
        names = ", ".join(quoted(c) for c in columns)
        values = ", ".join(f"s.{quoted(c)}" for c in columns)
        spark.sql(
            f"MERGE INTO {branch.identifier} t USING {source} s ON {matches} "
            f"WHEN MATCHED AND s.{TOMBSTONE} AND {newer} THEN DELETE "
            f"WHEN MATCHED AND {newer} THEN UPDATE SET {updates} "
            f"WHEN NOT MATCHED AND {insert_when} THEN INSERT ({names}) VALUES ({values})"
        )
        branch.wrote()
        spark.catalog.dropTempView(view)
        return changes.count()
    finally:
        changes.unpersist()


def _position(alias: str) -> tuple[str, str, str]:
    return _clock(alias), f"{alias}.kafka_partition", f"{alias}.kafka_offset"


def _commit_delete_markers(
    changes: DataFrame, branch: Branch, struct: T.StructType, key_columns: list[str], run_timeout_s: float
) -> str | None:
    """Record the batch's deletes (key and position) in `<table>_deletes`, each key's marker moving only forward;
    returns that table's name, or None while the table has none (never had a delete).

    This commit comes before the main table's publish, and a crash between the two is harmless: the rerun reads the
    same records from the same checkpoint, so they get the same positions and merging their markers again changes
    nothing. Until then the markers are ahead of the table; a marker only keeps out changes older than a delete that
    the table will apply anyway when it reads it, so the table ends as it would have."""
    spark, table = branch.spark, branch.table
    markers = IcebergTable(spark, delete_markers_identifier(table.identifier))
    deletes = changes.where(F.col(TOMBSTONE)).select(
        *[F.col(quoted(k)) for k in key_columns], *[f.name for f in _POSITION_FIELDS]
    )
    if deletes.isEmpty():
        return markers.full_name if markers.exists() else None
    topic, marks = branch.checkpoint.topic, branch.checkpoint.offsets
    marker_struct = T.StructType([*[f for f in struct.fields if f.name in key_columns], *_POSITION_FIELDS])
    markers.ensure(marker_struct, (), 128, Checkpoint(topic).to_summary())
    markers.evolve(marker_struct)
    drop_stale_branches(markers, run_timeout_s)
    state = committed_state(markers, topic)  # type: ignore[arg-type]  # a batch's checkpoint names its topic
    # Like the dead-letter table's: how far the topic's deletes are recorded (maintenance carries it forward).
    checkpoint = Checkpoint(
        topic, {p: max(o, state.offsets.get(p, 0)) for p, o in marks.items()}, branch.checkpoint.run_id
    )

    def write(marker_branch: Branch) -> None:
        view = f"icefloe_deletes_{marker_branch.name}"
        deletes.createOrReplaceTempView(view)
        matches = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in key_columns)
        position = ", ".join(f"t.{f.name} = s.{f.name}" for f in _POSITION_FIELDS)
        names = ", ".join(quoted(f.name) for f in marker_struct.fields)
        values = ", ".join(f"s.{quoted(f.name)}" for f in marker_struct.fields)
        spark.sql(
            f"MERGE INTO {marker_branch.identifier} t USING {view} s ON {matches} "
            f"WHEN MATCHED AND {_after(_position('s'), _position('t'))} THEN UPDATE SET {position} "
            f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})"
        )
        marker_branch.wrote()
        spark.catalog.dropTempView(view)

    commit_on_branch(markers, state.snapshot_id, checkpoint, write, run_timeout_s)  # type: ignore[arg-type]  # ensure() gives the table its first snapshot
    return markers.full_name
