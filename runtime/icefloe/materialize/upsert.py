"""Upsert mode: the latest change per key wins, a tombstone deletes its key's row.

The batch is reduced to one change per key and merged with `MERGE INTO` on the run's branch (merge-on-read: position deletes, cheap to write, folded away by
compaction). The merge's snapshot carries the offsets (`Branch.sql`), so the fast-forward publishes the merge and the
offsets together.

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

Change data (an envelope's batch, with the change columns of `batch_columns`) follows the same rule, generalized:
- a position may start with the change's position in its source database (`cdc_position`, bytes ordered bytewise;
  a Debezium table's rows keep it): where both positions have one, it alone decides, and equal source positions are
  the same change (a connector's replay after a restart): not newer, so a replay never applies again; without
  one, the Kafka position above decides;
- a change is an upsert, a delete (a marker, as a tombstone), a truncate (every row before it goes, and its marker,
  a row of null keys in `<table>_deletes`, keeps older changes out as a delete's does) or nothing;
- columns a change did not send (`icefloe_unchanged`: PostgreSQL's unchanged TOAST values) keep the value the key
  had before it: from the batch's earlier changes of the key, else the table's row (none where a truncate before
  the change removed it, in the batch or earlier); a change that moved the row from another key (a primary-key
  change, `icefloe_moved_from`) takes them from that key as it was before;
- `deletes: soft`: a delete keeps the row, flagged `cdc_deleted` with its time, and the delete's position, with the
  values the key had before the delete (as columns the delete left unchanged).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.batch_columns import (
    CHANGE,
    CHANGE_MOVED_FROM,
    CHANGE_TIME,
    CHANGE_UNCHANGED,
    KAFKA_CLOCK,
    KAFKA_COLUMNS,
    SOFT_DELETED,
    SOFT_DELETED_AT,
    SOURCE_POSITION,
    TOMBSTONE,
)
from icefloe.commit.branch import Branch, drop_stale_branches
from icefloe.commit.checkpoint import Checkpoint, committed_state, sql_with_checkpoint
from icefloe.errors import ConfigError
from icefloe.table.iceberg import IcebergTable, format_properties, quoted

# The running max is taken per block of a partition's offsets (sorting whole partitions would run in one task each);
# the blocks before a record contribute their maxima.
CLOCK_BLOCK = 100_000
NO_CLOCK = -(2**63) + 1  # a position without clock (no timestamp seen yet) is before every clock
# On `<table>_deletes`: whether it may hold a truncate's marker. "none" from its creation on, "kept" from just before
# the first truncate's marker is merged (only change data truncates): a batch looks for the latest truncate (a query
# of the markers) only where one may be. A markers table created before the property has none: looked up as before.
TRUNCATES_PROPERTY = "icefloe.truncate-markers"
_POSITION_FIELDS = [
    T.StructField(KAFKA_CLOCK, T.TimestampType()),
    T.StructField("kafka_partition", T.IntegerType()),
    T.StructField("kafka_offset", T.LongType()),
]


# How a batch's merges join, set for them alone (`_merge_joins`): the table's side (and the markers') is filtered by a
# Bloom filter of the batch's keys before it is shuffled (Spark's runtime filter, its subquery over the kept batch),
# so of a 10M-key table only the rows whose key the batch may hold are shuffled and joined, not every row with its
# file path (docs/benchmarks.md#upsert). Spark builds one only for a join that shuffles both sides (no broadcast: the
# scan of the table never was one, and a join of the few rows left sorts them cheaply), only where the scanned side
# is at least its threshold (none: any table) and the batch's side at most the creation threshold, and only from a
# side with a selective filter over its scan (`_SELECTIVE`).
MERGE_JOINS = {
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.optimizer.runtime.bloomFilter.enabled": "true",
    "spark.sql.optimizer.runtime.bloomFilter.applicationSideScanSizeThreshold": "0",
    "spark.sql.optimizer.runtime.bloomFilter.creationSideThreshold": "1g",
}
# A filter every change passes (Kafka offsets are never negative) that Spark's runtime filter takes for a selective
# one: it builds a Bloom filter only from a side with such a filter over its scan.
_SELECTIVE = "kafka_offset >= 0"


@contextmanager
def _merge_joins(spark: SparkSession) -> Iterator[None]:
    """`MERGE_JOINS` set for the block, the session's own settings back after it."""
    before = {setting: spark.conf.get(setting, None) for setting in MERGE_JOINS}
    for setting, value in MERGE_JOINS.items():
        spark.conf.set(setting, value)
    try:
        yield
    finally:
        for setting, was in before.items():
            if was is None:
                spark.conf.unset(setting)
            else:
                spark.conf.set(setting, was)


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


def clock_block() -> Column:
    """A record's block of its partition's offsets (`CLOCK_BLOCK`)."""
    return F.floor(F.col("kafka_offset") / CLOCK_BLOCK)


def positioned(
    frame: DataFrame, carried: dict[int, int], tops: list[tuple[int, int, int | None]] | None = None
) -> tuple[DataFrame, dict[int, int]]:
    """`frame` (a batch's changes) with each change's clock in `kafka_clock`, and each partition's clock at the end
    of the batch (to carry in the checkpoint); `carried`: the clocks the committed checkpoint carries (epoch ms).
    `tops`: (partition, block, highest timestamp in ms) of `frame`'s blocks (`clock_block`), when the caller found
    them in a pass of its own over the batch (the error mode's); else a pass over `frame` finds them."""
    spark = frame.sparkSession
    stamped = frame.withColumn("icefloe_block", clock_block()).withColumn(
        "icefloe_ms", F.unix_millis("kafka_timestamp")
    )
    if tops is None:
        found = stamped.groupBy("kafka_partition", "icefloe_block").agg(F.max("icefloe_ms").alias("top")).collect()
        tops = [(row.kafka_partition, row.icefloe_block, row.top) for row in found]
    blocks: dict[int, list[tuple[int, int | None]]] = {}
    for partition, block, top in tops:
        blocks.setdefault(partition, []).append((block, top))
    clocks, before = dict(carried), []
    for partition, in_order in blocks.items():
        clock = carried.get(partition)
        for block, top in sorted(in_order):
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
    """SQL: the clock (epoch ms) of the position `alias` holds (""; the frame's own columns); `fallback`: a column
    standing in for a null clock."""
    at = f"{alias}." if alias else ""
    columns = [f"unix_millis({at}{KAFKA_CLOCK})", *([f"unix_millis({at}{fallback})"] if fallback else [])]
    return f"coalesce({', '.join(columns)}, {NO_CLOCK}L)"


Position = tuple[str, ...]  # SQL: (clock, partition, offset) or (source position, clock, partition, offset)


def _after(a: Position, b: Position) -> str:
    """SQL: position `a` is after position `b`: by their source positions where both have one (equal ones are the
    same change: not after), else by (clock, partition, offset)."""
    (ac, ap, ao), (bc, bp, bo) = a[-3:], b[-3:]
    kafka = f"({ac} > {bc} OR ({ac} = {bc} AND ({ap} > {bp} OR ({ap} = {bp} AND {ao} > {bo}))))"
    if len(a) == 3 or len(b) == 3:
        return kafka
    return f"(CASE WHEN {a[0]} IS NOT NULL AND {b[0]} IS NOT NULL THEN {a[0]} > {b[0]} ELSE {kafka} END)"


def merge_batch(
    frame: DataFrame,
    branch: Branch,
    struct: T.StructType,
    key_columns: list[str],
    run_timeout_s: float,
    soft_deletes: bool = False,
    facts: ChangeFacts | None = None,
) -> int:
    """Merge one batch (with `kafka_clock`, see `positioned`) into the run's branch; returns the number of changes
    the batch holds after its reduction to one per key (a change older than the row it meets counts, though it
    changes nothing). A batch with change columns (an envelope's) may also truncate, leave columns unchanged and
    move rows between keys (module doc): `facts` say which, when the caller found them in a pass of its own over
    the batch (`change_fact_columns`); else a pass over `frame` finds them."""
    spark = branch.spark
    columns = [f.name for f in struct.fields]
    sourced = SOURCE_POSITION in columns
    truncate = None
    carried: list[str] = []  # unchanged columns the reduction carries from the key's chain, else MERGE from its row
    resolved = False  # the changes hold every column's value (unchanged ones filled, or carried)
    if CHANGE in frame.columns:
        frame = frame.where(F.col(CHANGE).isin("upsert", "delete", "truncate")).withColumn(
            TOMBSTONE, F.col(CHANGE) == "delete"
        )
        if facts is None:  # one pass over the batch for them
            facts = change_facts_of(frame.agg(*change_fact_columns(frame)).collect())
        unchanged, moved = list(facts.unchanged), facts.moved
        if soft_deletes and CHANGE_UNCHANGED in frame.columns:  # a deleted row keeps the values the key had
            meta = {*key_columns, *KAFKA_COLUMNS, KAFKA_CLOCK, SOURCE_POSITION, SOFT_DELETED, SOFT_DELETED_AT}
            kept = [c for c in columns if c not in meta]
            frame = frame.withColumn(
                CHANGE_UNCHANGED,
                F.when(F.col(TOMBSTONE), F.array(*[F.lit(c) for c in kept])).otherwise(F.col(CHANGE_UNCHANGED)),
            )
            if facts.deletes:
                unchanged = sorted({*unchanged, *kept})
        truncate = _latest_truncate(frame, sourced) if facts.truncates else None
        frame = frame.where(F.col(CHANGE) != "truncate")
        if truncate is not None:  # the batch's changes before its truncate are gone with it
            frame = frame.where(F.expr(_after(_position("", sourced), _literal(truncate, sourced))))
        resolved = CHANGE_UNCHANGED in frame.columns
        if resolved and unchanged and key_columns:
            if moved:  # rows a hard truncate removes hold no value for the changes after it
                gone = None if soft_deletes else truncate
                touched, untouched = _by_moves(frame.localCheckpoint(), key_columns)
                filled, held = _resolve_moved_unchanged(touched, branch, key_columns, sourced, unchanged, gone)
                with _merge_joins(spark):  # the lookup's table side filtered by the batch's keys
                    frame = filled.localCheckpoint().unionByName(untouched)
                held.unpersist()
            carried = [name for name in unchanged if name in columns]
    if soft_deletes:
        frame = frame.withColumn(SOFT_DELETED, F.col(TOMBSTONE)).withColumn(
            SOFT_DELETED_AT, F.when(F.col(TOMBSTONE), F.col(CHANGE_TIME))
        )
    if not key_columns:  # the batch knows no key (a JSON topic's batch of truncates only): nothing but the truncate,
        if truncate is not None:  # whose marker keeps older changes out of later batches as any truncate's does
            _commit_delete_markers(None, branch, struct, key_columns, run_timeout_s, truncate, has_deletes=False)
            _truncate(branch, truncate, sourced, soft_deletes)
        return 0
    latest = Window.partitionBy(*[F.col(quoted(k)) for k in key_columns]).orderBy(*_latest_first(sourced))
    known, carried_values, missing = _carry_unchanged(latest, carried)
    ranked = frame.select("*", F.row_number().over(latest).alias("icefloe_rank"), *known)  # one window: one sort
    # The joins as the merges want them from here on: the reduced batch's plan is made when it is cached.
    with _merge_joins(spark):
        changes = (
            ranked.where("icefloe_rank = 1")
            .select(*[carried_values.get(c, F.col(quoted(c))) for c in columns], TOMBSTONE, *missing)
            .persist()
        )
        try:
            # One pass over the reduced batch counts it and its deletes (it is kept from here on for the merges).
            counted = changes.agg(F.count(F.lit(1)).alias("n"), F.count(F.when(F.col(TOMBSTONE), 1)).alias("deletes"))
            total, deleting = counted.first()  # type: ignore[misc]  # an aggregate has its row
            markers = _commit_delete_markers(
                changes, branch, struct, key_columns, run_timeout_s, truncate, has_deletes=deleting > 0
            )
            view = f"icefloe_changes_{branch.name}"
            changes.createOrReplaceTempView(view)
            # soft deletes: a delete of a key the table lacks (inserted and deleted in one batch) is a flagged row too
            batch = f"(SELECT * FROM {view} WHERE {_SELECTIVE})"
            source, insert_when = batch, "true" if soft_deletes else f"NOT s.{TOMBSTONE}"
            if markers is not None:  # the key's marker, if any, beside each change; the latest truncate's
                on = " AND ".join(f"c.{quoted(k)} = m.{quoted(k)}" for k in key_columns)
                marker_source = f", m.{SOURCE_POSITION} AS icefloe_marker_source" if sourced else ""
                source = (
                    f"(SELECT c.*, {_clock('m')} AS icefloe_marker_clock, m.kafka_partition AS icefloe_marker_partition, "
                    f"m.kafka_offset AS icefloe_marker_offset{marker_source} FROM {batch} c LEFT JOIN {markers} m ON {on})"
                )
                marker: Position = ("s.icefloe_marker_clock", "s.icefloe_marker_partition", "s.icefloe_marker_offset")
                marker = ("s.icefloe_marker_source", *marker) if sourced else marker
                after_marker = _after(_position("s", sourced), marker)
                if soft_deletes:  # the delete itself is the key's marker (committed first): at it is enough
                    after_marker = f"NOT {_after(marker, _position('s', sourced))}"
                insert_when += f" AND (s.icefloe_marker_partition IS NULL OR {after_marker})"
                truncated = _truncate_marker(spark, branch.table, key_columns, sourced)
                if truncated is not None:  # changes older than the last truncate stay out
                    insert_when += f" AND {_after(_position('s', sourced), _literal(truncated, sourced))}"
            if truncate is not None:
                _truncate(branch, truncate, sourced, soft_deletes)
            row = (_clock("t", fallback="kafka_timestamp"), "t.kafka_partition", "t.kafka_offset")
            newer = _after(_position("s", sourced), (f"t.{SOURCE_POSITION}", *row) if sourced else row)
            matches = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in key_columns)
            updates = ", ".join(f"t.{quoted(c)} = {_updated(c, carried)}" for c in columns)
            names = ", ".join(quoted(c) for c in columns)
            values = ", ".join(f"s.{quoted(c)}" for c in columns)
            on_delete = "DELETE"
            if soft_deletes and resolved:  # the row stays, flagged, with the values the key had before the delete
                on_delete = f"UPDATE SET {updates}"
            elif soft_deletes:  # the row stays, flagged, and holds the delete's position
                kept = [
                    c
                    for c in columns
                    if c in (*KAFKA_COLUMNS, KAFKA_CLOCK, SOURCE_POSITION, SOFT_DELETED, SOFT_DELETED_AT)
                ]
                on_delete = "UPDATE SET " + ", ".join(f"t.{quoted(c)} = s.{quoted(c)}" for c in kept)
            if key_columns:
                branch.sql(  # its snapshot carries the offsets: no empty append for them
                    f"MERGE INTO {branch.identifier} t USING {source} s ON {matches} "
                    f"WHEN MATCHED AND s.{TOMBSTONE} AND {newer} THEN {on_delete} "
                    f"WHEN MATCHED AND {newer} THEN UPDATE SET {updates} "
                    f"WHEN NOT MATCHED AND {insert_when} THEN INSERT ({names}) VALUES ({values})"
                )
            spark.catalog.dropTempView(view)
            return total
        finally:
            changes.unpersist()


def _carry_unchanged(latest: WindowSpec, names: list[str]) -> tuple[list[Column], dict[str, Column], list[Column]]:
    """The reduction's side of the unchanged columns `names` (a batch without moved rows): over the reduction's own
    window (`latest`: a key's changes, latest first), each column's value from the latest change of the key that
    sent it. For a key's latest change that is its own value, else its earlier changes' latest; where none of them
    sent it, the MERGE keeps the row's value (`_updated`), and an insert has none (null). Returns the window's
    columns, then the columns' values to select on the latest change and whether each is still missing."""
    whole = latest.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)  # linear: one pass per key
    unchanged = F.coalesce(F.col(CHANGE_UNCHANGED), F.array().cast("array<string>"))
    known, values, missing = [], {}, []
    for i, name in enumerate(names):
        sent = F.when(~F.array_contains(unchanged, name), F.struct(F.col(quoted(name)).alias("v")))
        known.append(F.first(sent, ignorenulls=True).over(whole).alias(f"icefloe_known_{i}"))
        values[name] = F.col(f"icefloe_known_{i}.v").alias(name)
        missing.append(F.col(f"icefloe_known_{i}").isNull().alias(_missing(i)))
    return known, values, missing


def _missing(index: int) -> str:
    """The reduced batch's column saying the `index`th carried unchanged column is still missing."""
    return f"icefloe_missing_{index}"


def _updated(column: str, carried: list[str]) -> str:
    """SQL: a matched row's new value of `column`: the change's, or the row's own where the change and the key's
    earlier changes in the batch left it unchanged."""
    if column not in carried:
        return f"s.{quoted(column)}"
    return f"CASE WHEN s.{_missing(carried.index(column))} THEN t.{quoted(column)} ELSE s.{quoted(column)} END"


def _literal(position: tuple, sourced: bool) -> Position:
    """A position read on the driver (source bytes, clock ms, partition, offset) as SQL literals."""
    source, clock, partition, offset = position[:4]
    kafka = (f"{NO_CLOCK if clock is None else clock}L", str(partition), f"{offset}L")
    if not sourced:
        return kafka
    return ("NULL" if source is None else f"X'{bytes(source).hex()}'", *kafka)


def _latest_position(frame: DataFrame, sourced: bool, *extra: Column) -> tuple | None:
    """The position of the frame's latest row: (source position, clock ms, partition, offset, *extra), or None."""
    latest = (
        frame.orderBy(*_latest_first(sourced))
        .select(
            (F.col(SOURCE_POSITION) if sourced else F.lit(None).cast("binary")).alias("source"),
            F.unix_millis(KAFKA_CLOCK).alias("clock"),
            "kafka_partition",
            "kafka_offset",
            *extra,
        )
        .first()
    )
    return None if latest is None else tuple(latest)


@dataclass(frozen=True)
class ChangeFacts:
    """What an envelope's batch holds that decides how it is merged: its truncates and deletes (counts), the columns
    its changes left unchanged (may include some of changes a truncate removes: a column no change leaves unchanged
    is left as it is) and whether a change moved a row from another key."""

    truncates: int
    deletes: int
    unchanged: tuple[str, ...]
    moved: bool


def change_fact_columns(frame: DataFrame, counted: Column | None = None) -> list[Column]:
    """Aggregates of `frame`'s changes (those where `counted`, if given) whose rows, per group or one for the whole
    frame, `change_facts_of` adds up: the error mode's pass over the batch takes them beside its own, so the merge
    needs no job of its own for them."""
    has = set(frame.columns)
    applied = F.col(CHANGE).isin("upsert", "delete", "truncate")  # what `merge_batch` keeps of the batch
    if counted is not None:
        applied = applied & counted
    unchanged = (
        F.flatten(F.collect_set(F.when(applied, F.col(CHANGE_UNCHANGED))))
        if CHANGE_UNCHANGED in has
        else F.array().cast("array<string>")
    )
    moved = F.count(F.when(applied, F.col(CHANGE_MOVED_FROM))) if CHANGE_MOVED_FROM in has else F.lit(0)
    return [
        F.count(F.when(applied & (F.col(CHANGE) == "truncate"), 1)).alias("icefloe_truncates"),
        F.count(F.when(applied & (F.col(CHANGE) == "delete"), 1)).alias("icefloe_deletes"),
        F.array_distinct(unchanged).alias("icefloe_unchanged"),
        moved.alias("icefloe_moved"),
    ]


def change_facts_of(rows: list[Row]) -> ChangeFacts:
    """The facts of a batch from the rows of its `change_fact_columns` aggregates."""
    unchanged = {name for row in rows for name in row["icefloe_unchanged"] or []}
    return ChangeFacts(
        sum(row["icefloe_truncates"] for row in rows),
        sum(row["icefloe_deletes"] for row in rows),
        tuple(sorted(unchanged)),
        any(row["icefloe_moved"] for row in rows),
    )


def _latest_truncate(frame: DataFrame, sourced: bool) -> tuple | None:
    """The batch's latest truncate: (source position, clock ms, partition, offset, change time), or None."""
    at = F.col(CHANGE_TIME) if CHANGE_TIME in frame.columns else F.lit(None).cast("timestamp")
    return _latest_position(frame.where(F.col(CHANGE) == "truncate"), sourced, at)


def _truncate(branch: Branch, truncate: tuple, sourced: bool, soft_deletes: bool) -> None:
    """Every row whose change is before the truncate goes (soft: is flagged deleted at the truncate's time)."""
    older = _truncated(truncate, sourced)
    if soft_deletes:
        at = "NULL" if truncate[4] is None else f"TIMESTAMP '{truncate[4].isoformat()}'"
        branch.spark.sql(
            f"UPDATE {branch.identifier} t SET {SOFT_DELETED} = true, {SOFT_DELETED_AT} = {at} "
            f"WHERE {older} AND NOT coalesce({SOFT_DELETED}, false)"
        )
    else:
        branch.spark.sql(f"DELETE FROM {branch.identifier} t WHERE {older}")
    branch.wrote()


def _truncated(truncate: tuple, sourced: bool) -> str:
    """SQL: the row `t` is older than the truncate (it goes with it)."""
    row = (_clock("t", fallback="kafka_timestamp"), "t.kafka_partition", "t.kafka_offset")
    return _after(_literal(truncate[:4], sourced), (f"t.{SOURCE_POSITION}", *row) if sourced else row)


def _truncate_marker(spark: SparkSession, table: IcebergTable, key_columns: list[str], sourced: bool) -> tuple | None:
    """The latest truncate recorded in `<table>_deletes` (its row of null keys); not looked for where the markers
    never held one (`TRUNCATES_PROPERTY`)."""
    markers = IcebergTable(spark, delete_markers_identifier(table.identifier))
    if not key_columns or markers.table_property(TRUNCATES_PROPERTY) == "none":
        return None
    nulls = " AND ".join(f"{quoted(k)} IS NULL" for k in key_columns)
    return _latest_position(spark.table(markers.full_name).where(nulls), sourced)


def _by_moves(frame: DataFrame, key_columns: list[str]) -> tuple[DataFrame, DataFrame]:
    """The changes of the keys a move touched (a row moved into or out of them in the batch), and the others: only
    the first need the moved rows' resolution (`_resolve_moved_unchanged`); the others' unchanged columns are carried
    as in a batch without moves (a key's changes are resolved from its own chain, and from a key a row moved from,
    which is touched too). The caller computes `frame` and the resolved changes once (local checkpoints): the split
    reads the batch three times, and the merges' plans then hold no lookup of the table (a plan that reads a table is
    also recomputed after each write to it)."""
    moves = frame.where(F.col(CHANGE_MOVED_FROM).isNotNull())
    names = [f"icefloe_touched_{i}" for i in range(len(key_columns))]
    keys = (
        moves.select(*[F.col(quoted(k)).alias(n) for k, n in zip(key_columns, names)])
        .union(moves.select(*[F.col(f"{CHANGE_MOVED_FROM}.{quoted(k)}").alias(n) for k, n in zip(key_columns, names)]))
        .distinct()
    )
    on = [frame[quoted(k)] == keys[n] for k, n in zip(key_columns, names)]
    return frame.join(keys, on, "left_semi"), frame.join(keys, on, "left_anti")


def _resolve_moved_unchanged(
    frame: DataFrame,
    branch: Branch,
    key_columns: list[str],
    sourced: bool,
    names: list[str],
    truncate: tuple | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Fill the columns changes did not send (`names`, from `ChangeFacts`) in the changes of keys a move touched,
    with the value the key had before each change: from the batch's earlier changes of the key since the row moved
    in, if it did; else, for a row that moved in, from the key it moved from (the batch's latest change of it before
    the move, else its row in the table as it was before). What is still missing in a key's changes before any move
    into it is left as in a batch without moves: the reduction carries it and the MERGE takes it from the key's
    own row (`_carry_unchanged`), so only the moved rows' old keys are looked up in the table (module doc).
    `truncate`: the batch's truncate, whose rows are gone (a hard one's): they hold no value, as in a later batch.
    Returns the changes so resolved, and the frame it keeps cached for the caller to release once they are
    computed."""
    keys = [F.col(quoted(k)) for k in key_columns]
    earliest_first = [c.asc_nulls_first() if i == 0 and sourced else c for i, c in enumerate(_earliest_first(sourced))]
    start = ("icefloe_s_src", "icefloe_s_clock", "icefloe_s_part", "icefloe_s_off")[0 if sourced else 1 :]
    running = Window.partitionBy(*keys).orderBy(*earliest_first).rowsBetween(Window.unboundedPreceding, 0)
    # A change that moved the row in starts a chain of its own: the key's earlier changes (a former row) do not count.
    chained = frame.withColumn(
        "icefloe_chain", F.sum(F.when(F.col(CHANGE_MOVED_FROM).isNotNull(), 1).otherwise(0)).over(running)
    )
    chain = Window.partitionBy(*keys, "icefloe_chain").orderBy(*earliest_first)
    from_start = chain.rowsBetween(Window.unboundedPreceding, 0)
    chained = chained.withColumn("icefloe_from", F.first(CHANGE_MOVED_FROM).over(from_start))
    for column, value in zip(start, _position_columns(sourced)):  # where the chain starts
        chained = chained.withColumn(column, F.first(value).over(from_start))
    unchanged = F.coalesce(F.col(CHANGE_UNCHANGED), F.array().cast("array<string>"))
    for name in names:
        missing = F.array_contains(unchanged, name)
        known = F.last(F.when(~missing, F.struct(F.col(quoted(name)).alias("v"))), ignorenulls=True).over(
            chain.rowsBetween(Window.unboundedPreceding, 0)
        )
        chained = chained.withColumn("icefloe_known", known)
        chained = chained.withColumn(
            name,
            F.when(missing & F.col("icefloe_known").isNotNull(), F.col("icefloe_known.v")).otherwise(
                F.col(quoted(name))
            ),
        ).withColumn(
            CHANGE_UNCHANGED,
            F.when(missing & F.col("icefloe_known").isNotNull(), F.array_remove(unchanged, name)).otherwise(
                F.col(CHANGE_UNCHANGED)
            ),
        )
    # The key whose row in the table holds what a moved row lacks: the key it moved from (plain columns, null for
    # the changes of a row that did not move in: the table's side of the join below is filtered by their Bloom
    # filter, see `MERGE_JOINS`).
    moved_in = F.col("icefloe_from").isNotNull()
    lookup = [f"icefloe_lookup_{i}" for i in range(len(key_columns))]
    for name, key in zip(lookup, key_columns):
        chained = chained.withColumn(name, F.when(moved_in, F.col(f"icefloe_from.{quoted(key)}")))
    held = chained.drop("icefloe_known").withColumn("icefloe_row", F.monotonically_increasing_id()).persist()
    left = held.where((F.size(unchanged) > 0) & moved_in)
    if left.isEmpty():
        return held.drop("icefloe_chain", "icefloe_from", "icefloe_row", *start, *lookup), held
    chained = _from_moved_keys(held, left, key_columns, sourced, names, start)
    # What the moved rows still lack from the table as it was before the batch: the row of the key they moved from.
    current = branch.spark.table(branch.identifier).alias("t")
    if truncate is not None:
        current = current.where(f"NOT coalesce({_truncated(truncate, sourced)}, false)")  # what `_truncate` keeps
    current = current.select(
        *[F.col(quoted(k)).alias(f"icefloe_k_{i}") for i, k in enumerate(key_columns)],
        *[F.col(quoted(n)).alias(f"icefloe_v_{i}") for i, n in enumerate(names)],
    )
    # Under `_SELECTIVE` the batch's side builds the Bloom filter (Spark's optimizer pushes it down to the kept rows).
    batch = chained.where(_SELECTIVE)
    joined = batch.join(current, [batch[name] == current[f"icefloe_k_{i}"] for i, name in enumerate(lookup)], "left")
    for i, name in enumerate(names):
        missing = F.array_contains(unchanged, name) & moved_in
        joined = joined.withColumn(name, F.when(missing, F.col(f"icefloe_v_{i}")).otherwise(F.col(quoted(name))))
    joined = joined.withColumn(CHANGE_UNCHANGED, F.when(~moved_in, F.col(CHANGE_UNCHANGED)))  # a moved row: resolved
    drop = [
        "icefloe_chain",
        "icefloe_from",
        *lookup,
        *[f"icefloe_k_{i}" for i in range(len(key_columns))],
        *[f"icefloe_v_{i}" for i in range(len(names))],
    ]
    return joined.drop(*drop), held


def _from_moved_keys(
    chained: DataFrame, left: DataFrame, key_columns: list[str], sourced: bool, names: list[str], start: tuple
) -> DataFrame:
    """A row that moved in takes what it still lacks from the batch's latest change of the key it moved from,
    before the move."""
    unchanged = F.coalesce(F.col(CHANGE_UNCHANGED), F.array().cast("array<string>"))
    old = chained.where(F.col(CHANGE) == "upsert").select(
        *[F.col(quoted(k)).alias(f"icefloe_ok_{i}") for i, k in enumerate(key_columns)],
        *[
            c.alias(n)
            for c, n in zip(
                _position_columns(sourced),
                ("icefloe_o_src", "icefloe_o_clock", "icefloe_o_part", "icefloe_o_off")[0 if sourced else 1 :],
            )
        ],
        *[F.col(quoted(n)).alias(f"icefloe_ov_{i}") for i, n in enumerate(names)],
        F.coalesce(F.col(CHANGE_UNCHANGED), F.array().cast("array<string>")).alias("icefloe_ou"),
    )
    moved = left.where(F.col("icefloe_from").isNotNull()).select(
        "icefloe_row",
        *[F.col(f"icefloe_from.{quoted(k)}").alias(f"icefloe_mk_{i}") for i, k in enumerate(key_columns)],
        *start,
    )
    before = ("icefloe_o_src", "icefloe_o_clock", "icefloe_o_part", "icefloe_o_off")[0 if sourced else 1 :]
    on = [moved[f"icefloe_mk_{i}"] == old[f"icefloe_ok_{i}"] for i in range(len(key_columns))]
    latest = Window.partitionBy("icefloe_row").orderBy(*[F.col(c).desc() for c in before])
    found = (
        moved.join(old, on + [F.expr(_after(start, before))])
        .withColumn("icefloe_rank", F.row_number().over(latest))
        .where("icefloe_rank = 1")
        .select(
            "icefloe_row",
            *[f"icefloe_ov_{i}" for i in range(len(names))],
            "icefloe_ou",
            F.lit(True).alias("icefloe_found"),
        )
    )
    chained = chained.join(found, "icefloe_row", "left")
    for i, name in enumerate(names):
        missing = F.array_contains(unchanged, name)
        taken = missing & F.col("icefloe_found").isNotNull() & ~F.array_contains(F.col("icefloe_ou"), name)
        chained = chained.withColumn(name, F.when(taken, F.col(f"icefloe_ov_{i}")).otherwise(F.col(quoted(name))))
        chained = chained.withColumn(
            CHANGE_UNCHANGED, F.when(taken, F.array_remove(unchanged, name)).otherwise(F.col(CHANGE_UNCHANGED))
        )
    return chained.drop(
        "icefloe_found", "icefloe_ou", "icefloe_row", *start, *[f"icefloe_ov_{i}" for i in range(len(names))]
    )


def _position_columns(sourced: bool) -> list:
    """A position's columns, comparable in SQL: (source position,) clock ms (never null), partition, offset."""
    kafka = [F.coalesce(F.unix_millis(KAFKA_CLOCK), F.lit(NO_CLOCK)), F.col("kafka_partition"), F.col("kafka_offset")]
    return [F.col(SOURCE_POSITION), *kafka] if sourced else kafka


def _earliest_first(sourced: bool) -> list:
    kafka = [F.coalesce(F.unix_millis(KAFKA_CLOCK), F.lit(NO_CLOCK)), F.col("kafka_partition"), F.col("kafka_offset")]
    return [F.col(SOURCE_POSITION), *kafka] if sourced else kafka


def _position(alias: str, sourced: bool = False) -> Position:
    at = f"{alias}." if alias else ""
    kafka = (_clock(alias), f"{at}kafka_partition", f"{at}kafka_offset")
    return (f"{at}{SOURCE_POSITION}", *kafka) if sourced else kafka


def _latest_first(sourced: bool) -> list:
    """The order of positions, latest first (a source position first where the table keeps them)."""
    kafka = [
        F.coalesce(F.unix_millis(KAFKA_CLOCK), F.lit(NO_CLOCK)).desc(),
        F.col("kafka_partition").desc(),
        F.col("kafka_offset").desc(),
    ]
    return [F.col(SOURCE_POSITION).desc_nulls_last(), *kafka] if sourced else kafka


def _commit_delete_markers(
    changes: DataFrame | None,
    branch: Branch,
    struct: T.StructType,
    key_columns: list[str],
    run_timeout_s: float,
    truncate: tuple | None = None,
    has_deletes: bool = True,
) -> str | None:
    """Record the batch's deletes (key and position) in `<table>_deletes`, each key's marker moving only forward;
    returns that table's name, or None while the table has none (never had a delete). `has_deletes`: `changes`
    holds a delete (the caller counted them). `changes` None, `key_columns` empty: a batch that knows no key (a JSON
    topic's batch of truncates only) records its truncate under the key columns the markers table has, if any (a
    key column added later is null in it, as a truncate's row has them).

    This commit comes before the main table's publish, and a crash between the two is harmless: the rerun reads the
    same records from the same checkpoint, so they get the same positions and merging their markers again changes
    nothing. Until then the markers are ahead of the table; a marker only keeps out changes older than a delete that
    the table will apply anyway when it reads it, so the table ends as it would have. So the markers need no branch
    of their own: one MERGE on their main carries their checkpoint (`sql_with_checkpoint`), and two runs merging at
    once are kept apart by Iceberg's validation of the later one (refused: `CommitConflict`, the batch re-plans)."""
    spark, table = branch.spark, branch.table
    markers = IcebergTable(spark, delete_markers_identifier(table.identifier))
    sourced = SOURCE_POSITION in struct.fieldNames()
    position_fields = [*([T.StructField(SOURCE_POSITION, T.BinaryType())] if sourced else []), *_POSITION_FIELDS]
    if key_columns:
        key_fields = [f for f in struct.fields if f.name in key_columns]
    else:
        positions = {f.name for f in position_fields}
        key_fields = [f for f in markers.schema().fields if f.name not in positions] if markers.exists() else []
        key_columns = [f.name for f in key_fields]
    deletes: DataFrame | None = None
    if changes is not None:
        deletes = changes.where(F.col(TOMBSTONE)).select(
            *[F.col(quoted(k)) for k in key_columns], *[f.name for f in position_fields]
        )
    if truncate is not None:  # a row of null keys: the table's truncate
        source, clock, partition, offset = truncate[:4]
        marker = branch.spark.range(1).select(
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in key_fields],
            *(
                [F.lit(None if source is None else bytearray(source)).cast("binary").alias(SOURCE_POSITION)]
                if sourced
                else []
            ),
            F.timestamp_millis(F.lit(clock).cast("long")).alias(KAFKA_CLOCK),
            F.lit(partition).cast("int").alias("kafka_partition"),
            F.lit(offset).cast("long").alias("kafka_offset"),
        )
        deletes = marker if deletes is None else deletes.unionByName(marker)
    marker_struct = T.StructType([*key_fields, *position_fields])
    if deletes is None or (not has_deletes and truncate is None):
        if not markers.exists():
            return None
        if sourced:  # a truncate recorded before the key columns were known: they join it now, null
            markers.evolve(marker_struct)
        return markers.full_name
    recorded = deletes
    topic, marks = branch.checkpoint.topic, branch.checkpoint.offsets

    # The markers are merged like the table: the same format (deletion vectors at v3).
    def table_format() -> dict[str, str]:  # loads the table: called only when the markers are created
        return format_properties(table.format_version()) | {TRUNCATES_PROPERTY: "none"}

    markers.ensure(marker_struct, (), 128, Checkpoint(topic).to_summary(), table_format)
    markers.evolve(marker_struct)
    if truncate is not None and markers.table_property(TRUNCATES_PROPERTY) == "none":
        markers.set_table_property(TRUNCATES_PROPERTY, "kept")  # before the marker: a lookup then never misses it
    drop_stale_branches(markers, run_timeout_s)  # left by runs that still wrote the markers on a branch
    state = committed_state(markers, topic)  # type: ignore[arg-type]  # a batch's checkpoint names its topic
    # Like the dead-letter table's: how far the topic's deletes are recorded (maintenance carries it forward).
    checkpoint = Checkpoint(
        topic, {p: max(o, state.offsets.get(p, 0)) for p, o in marks.items()}, branch.checkpoint.run_id
    )
    view = f"icefloe_deletes_{branch.name}"
    recorded.createOrReplaceTempView(view)
    # <=>: a truncate's row; no key columns at all: every marker is a truncate's
    matches = " AND ".join(f"t.{quoted(k)} <=> s.{quoted(k)}" for k in key_columns) or "true"
    position = ", ".join(f"t.{f.name} = s.{f.name}" for f in position_fields)
    names = ", ".join(quoted(f.name) for f in marker_struct.fields)
    values = ", ".join(f"s.{quoted(f.name)}" for f in marker_struct.fields)
    # Straight on main, in one commit with the checkpoint: merging the same markers again changes nothing (above),
    # and Iceberg refuses a merge that another run's marker commit overtook (`sql_with_checkpoint`). The markers
    # grow with the deletes of their retention: their side is filtered by the batch's keys, as the table's is.
    sql_with_checkpoint(
        markers,
        f"MERGE INTO {markers.full_name} t USING (SELECT * FROM {view} WHERE {_SELECTIVE}) s ON {matches} "
        f"WHEN MATCHED AND {_after(_position('s', sourced), _position('t', sourced))} THEN UPDATE SET {position} "
        f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})",
        checkpoint,
    )
    spark.catalog.dropTempView(view)
    return markers.full_name
