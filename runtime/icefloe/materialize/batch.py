"""One batch for one table: plan offsets, read and convert in executors, write, commit data and offsets together.

How a table's records are read and decoded is its read path (data_plane: the JVM's Kafka source and `from_avro`,
or Python per record). An append batch on the JVM path is streamed from Kafka to the table when every record
decodes exactly in the JVM (the common case); otherwise, and on the Python path, executors read every record once
into a kept frame, bad records included as failed rows; then the error mode:
  fail  each partition is cut just before its first bad record, what comes before is committed, and the error of the
        earliest bad record is raised: the table holds everything before it and a fixed rerun resumes at it.
  skip  bad records are counted and logged (partition, offset, error; never the payload); the rest is committed.
  dlq   bad records go to the dead-letter table `<table>_dlq` first (its own offsets watermark keeps a crash and
        rerun from adding them twice), then the rest is committed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Protocol

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from icefloe.batch_columns import CHANGE, ERROR_CLASS, ERROR_MESSAGE, TOMBSTONE
from icefloe.commit.branch import Branch, commit_on_branch, drop_stale_branches
from icefloe.commit.checkpoint import (
    RUN_ID_KEY,
    Checkpoint,
    CommittedState,
    Throughput,
    committed_state,
    lost_as_json,
)
from icefloe.errors import IcefloeError, RecordError
from icefloe.formats.base import BatchColumns, BatchContext, DecoderSpec, Envelope, Format
from icefloe.formats.columns import batch_struct, table_struct
from icefloe.formats.registry import decoder_spec, envelope_of, format_of
from icefloe.materialize import progress
from icefloe.materialize.budget import Deadline, size_batch
from icefloe.materialize.dead_letters import commit_dead_letters
from icefloe.materialize.python_tasks import ReadPlan, read_batches, unmark
from icefloe.materialize.read_paths import JVM, PENDING, PYTHON, JvmBatch, ReadPath, choose_read_path
from icefloe.materialize.upsert import (
    ChangeFacts,
    change_fact_columns,
    change_facts_of,
    clock_block,
    key_columns,
    merge_batch,
    positioned,
)
from icefloe.source.kafka import TRUNCATED, OffsetRange, client_config, plan_ranges, with_known_records
from icefloe.source.spark_kafka import kafka_timestamp_overflow, source_failure
from icefloe.spec import IcefloeConfig, TableSpec
from icefloe.table.iceberg import IcebergTable, conformed, format_properties, quoted
from icefloe.table.refs import new_run_id

log = logging.getLogger(__name__)
# Split long partitions so both cores (or many executors) share the work; each split is one Spark task.
RECORDS_PER_TASK = 500_000
LOGGED_FAILURES = 20
# How long the streamed write's observed counts may take to arrive once the write is done (Spark posts them from its
# listener bus, normally at once; SPARK-54620: never, where the observed operator was optimized away).
OBSERVED_METRICS_TIMEOUT_S = 600.0


@dataclass
class BatchResult:
    identifier: str
    topic: str
    status: str  # committed | up-to-date | yielded (other runs committed first each attempt: nothing committed here)
    rows_written: int = 0
    records_failed: int = 0
    snapshot_id: int | None = None
    metadata_location: str | None = None
    offsets: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    run_id: str = ""
    data_lost: list[dict] = field(default_factory=list)  # ranges deleted before they were read (onDataLoss: warn)
    read_path: str = ""  # jvm | python (data_plane): how the batch was read and decoded
    maintenance: dict | None = None  # maintenance after the batch, when it ran (`MaintenanceResult.as_dict`)
    maintenance_error: str = ""  # why maintenance after the batch failed (the batch stands; tried again when due)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["offsets"] = {str(p): o for p, o in sorted(self.offsets.items())}
        return data

    def describe(self) -> str:
        failed = self.maintenance_error and f"; maintenance failed (tried again when due): {self.maintenance_error}"
        return self._describe_batch() + failed

    def _describe_batch(self) -> str:
        if self.status == "up-to-date":
            return f"{self.identifier}: up to date at offsets {self.as_dict()['offsets']} (nothing committed)"
        if self.status == "yielded":
            return (
                f"{self.identifier}: yielded: other runs committed before each of this run's attempts; nothing "
                "committed by this run, the next run reads on from what they committed"
            )
        failed = f", {self.records_failed} bad records" if self.records_failed else ""
        if self.data_lost:
            lost = sum(r["end"] - r["start"] for r in self.data_lost)
            failed += f", DATA LOSS: {lost} records deleted before they were read ({self.data_lost})"
        return (
            f"{self.identifier}: committed {self.rows_written} rows from {self.topic}{failed} in {self.seconds:.1f}s, "
            f"snapshot {self.snapshot_id}, next offsets {self.as_dict()['offsets']}"
        )


@dataclass
class Batch:
    """What one attempt reads: the ranges, and the offsets main records once they are committed."""

    ranges: list[OffsetRange]
    next_offsets: dict[int, int]

    def tasks(self) -> list[OffsetRange]:
        return [
            OffsetRange(r.topic, r.partition, start, min(start + RECORDS_PER_TASK, r.end))
            for r in self.ranges
            for start in range(r.start, r.end, RECORDS_PER_TASK)
        ]

    def cut_before(self, partition: int, offset: int) -> Batch:
        """The same batch ending just before a bad record."""
        ranges = [r if r.partition != partition else replace(r, end=min(r.end, offset)) for r in self.ranges]
        return Batch([r for r in ranges if r.end > r.start], {**self.next_offsets, partition: offset})


class Writer(Protocol):
    """Writes a batch's good rows to the run's branch; returns the rows written (appended, or changes merged).
    `facts`: an envelope's batch's change facts, where the error mode's pass found them (`upsert.ChangeFacts`)."""

    def __call__(self, frame: DataFrame, branch: Branch, facts: ChangeFacts | None = None) -> int: ...


@dataclass(frozen=True)
class ErrorModeOutcome:
    """What the table's error mode leaves to commit."""

    good: DataFrame  # the rows to write
    batch: Batch  # the batch as committed: in fail mode, cut before each partition's first bad record
    records_failed: int  # bad records skipped or sent to the DLQ (0 in fail mode, which skips nothing)
    error: RecordError | None  # fail mode: the earliest bad record, raised once what precedes it is committed
    # Upsert: (partition, block, highest timestamp ms) of `good`'s clock blocks, found in the error mode's pass (None:
    # `positioned` finds them, as where fail mode cut the batch)
    clock_tops: list[tuple[int, int, int | None]] | None = None
    # An envelope's upsert: the good rows' change facts, found in the same pass (None: `merge_batch` finds them)
    change_facts: ChangeFacts | None = None


@dataclass(frozen=True)
class CommitOutcome:
    snapshot_id: int | None  # main's new snapshot; None when the error mode left nothing to commit
    rows_written: int
    error_mode: ErrorModeOutcome


def materialize_once(
    spark: SparkSession,
    config: IcefloeConfig,
    table: TableSpec,
    deadline: Deadline | None = None,
    at_most: int | None = None,
) -> BatchResult:
    """One batch, sized to publish well inside `runTimeout` and the job's `deadline` (`budget`); `at_most`: records
    (half of an attempt of this run refused at `runTimeout`)."""
    started, started_ms = time.monotonic(), int(time.time() * 1000)
    run_id = new_run_id()
    identifier = config.identifier(table)
    cluster = config.cluster(table.source_cluster)
    kafka_conf = client_config(cluster)
    decoder = decoder_spec(table, cluster)
    values_format, envelope = format_of(decoder), envelope_of(decoder)
    value_fields = _value_fields(values_format, envelope, decoder, table, identifier)  # None: inferred per batch
    if table.mode == "upsert" and value_fields is not None and envelope is None:  # a key field the schema
        key_columns(table.key, value_fields, f"table {identifier}")  # lacks fails before the table is created

    iceberg = IcebergTable(spark, identifier)
    first = Checkpoint(table.topic).to_summary()  # a first, empty checkpoint: the base of the first commit
    upsert = table.mode == "upsert"
    if iceberg.ensure(
        table_struct(value_fields or [], upsert),
        table.partitions,
        table.maintenance.target_file_size_mb,
        first,
        format_properties(table.format_version),
    ):
        log.info("%s: created table", identifier)
    branches = drop_stale_branches(iceberg, table.run_timeout_seconds)
    state = committed_state(iceberg, table.topic)
    planned = plan_ranges(
        kafka_conf,
        table.topic,
        state.offsets,
        table.starting_offsets,
        None,
        table.on_data_loss,
        state.topic_id,
        state.leader_epochs,
        known_records=state.known_records,
    )
    sized = size_batch(iceberg, kafka_conf, table, state, planned, deadline, branches, at_most)
    planned = sized.plan
    if planned.topic_id is None:  # no topic id to tell a recreated topic by: remember a record this batch reads
        planned = with_known_records(kafka_conf, planned)
    ranges, next_offsets = planned.ranges, planned.next_offsets
    batch = Batch(ranges, next_offsets)
    if next_offsets == state.offsets and not planned.lost:
        return BatchResult(
            identifier,
            table.topic,
            "up-to-date",
            snapshot_id=state.snapshot_id,
            offsets=state.offsets,
            metadata_location=iceberg.metadata_location(),
            run_id=run_id,
            seconds=time.monotonic() - started,
        )
    if (envelope or values_format).registry_schema(decoder):
        # Fetched again now: every record of the planned ranges was written with a version registered before the
        # plan, so the reader schema is at least as new as each writer's (fetched before planning, a version
        # registered meanwhile would lose its new fields and enum symbols).
        decoder = decoder_spec(table, cluster)
        value_fields = _value_fields(values_format, envelope, decoder, table, identifier)
    explains: Callable[[list], bool] | None = None  # set where the columns are assumed (`BatchColumns`)
    if value_fields is None:  # the batch's records give the columns (schemaless JSON)
        # Assumed columns save a read where batches keep their shape, and cost one where a batch adds a column: not
        # right after a batch that changed the columns (keys that keep coming would cost every batch that read).
        assume = not upsert and not iceberg.last_run_evolved(RUN_ID_KEY)
        columns = _columns_from_records(spark, iceberg, decoder, kafka_conf, batch, table, assume)
        decoder, value_fields, explains = columns.spec, columns.fields, columns.explains
    elif envelope is not None and envelope.per_batch(decoder):  # the columns the batch's change events give
        context = BatchContext(
            kafka_conf, batch.tasks(), table.max_record_bytes, list(iceberg.schema().fields), f"table {identifier}"
        )
        decoder, value_fields = envelope.for_batch(spark, decoder, context)
        for change in iceberg.evolve(table_struct(value_fields, upsert)):
            log.info("%s: schema evolved from the change events: %s", identifier, change)
    else:
        for change in iceberg.evolve(table_struct(value_fields, upsert)):
            log.info("%s: schema evolved: %s", identifier, change)
    path = choose_read_path(spark, decoder)
    if explains is not None and path.name != JVM:  # assumed columns are checked as the JVM writes, only there
        columns = _columns_from_records(spark, iceberg, decoder, kafka_conf, batch, table, assume=False)
        decoder, value_fields, explains = columns.spec, columns.fields, None
        path = choose_read_path(spark, decoder)
    log.info(
        "%s: reading %d records from %d partitions, read path %s: %s",
        identifier,
        sum(r.count for r in ranges),
        len(ranges),
        path.name,
        path.reason,
    )
    progress.reading(spark, identifier, sum(r.count for r in ranges))
    plan, write = _read_plan_and_writer(iceberg, table, decoder, value_fields, kafka_conf)

    measured = Throughput(sized.records, int(sized.records * sized.mean_record_bytes), started_ms, sized.cut)
    # Upsert: the partitions' clocks carry over every commit, also one that reads nothing (`upsert.positioned`).
    clocks = dict(state.checkpoint.clocks) if upsert and state.checkpoint is not None else {}
    checkpoint = Checkpoint(
        table.topic,
        next_offsets,
        run_id,
        planned.topic_id,
        tuple(planned.lost),
        throughput=measured,
        leader_epochs=planned.leader_epochs,
        clocks=clocks,
        known_records=planned.known_records,
    )
    while True:  # at most three attempts: assumed columns dropped, then the Python path (each only once)
        try:
            outcome = _commit(spark, iceberg, table, plan, batch, state, checkpoint, write, path, explains)
            break
        except _Unexplained as unexplained:  # nothing was committed
            log.info("%s: %s: the batch's columns are inferred, the batch read again", identifier, unexplained)
            overflow = False
        except _TimestampOverflow:  # nothing was committed: the Python path routes the record per `errors`
            overflow = True
        if explains is not None:  # the columns the batch's records give, checked first
            columns = _columns_from_records(spark, iceberg, decoder, kafka_conf, batch, table, assume=False)
            decoder, value_fields, explains = columns.spec, columns.fields, None
            plan, write = _read_plan_and_writer(iceberg, table, decoder, value_fields, kafka_conf)
        path = choose_read_path(spark, decoder)
        if overflow:
            path = ReadPath(PYTHON, "a Kafka timestamp overflows Spark's Kafka source")
            log.warning("%s: %s: the batch is read on the Python path", identifier, path.reason)
    result = BatchResult(
        identifier=identifier,
        topic=table.topic,
        status="committed",
        rows_written=outcome.rows_written,
        records_failed=outcome.error_mode.records_failed,
        snapshot_id=outcome.snapshot_id,
        metadata_location=iceberg.metadata_location(),
        offsets=outcome.error_mode.batch.next_offsets,
        seconds=time.monotonic() - started,
        run_id=run_id,
        data_lost=lost_as_json(checkpoint.lost),
        read_path=path.name,
    )
    if outcome.error_mode.error is not None:
        log.error("%s: committed up to the bad record: %s", identifier, result.describe())
        raise outcome.error_mode.error
    return result


def _columns_from_records(
    spark: SparkSession,
    iceberg: IcebergTable,
    decoder: DecoderSpec,
    kafka_conf: dict,
    batch: Batch,
    table: TableSpec,
    assume: bool,
) -> BatchColumns:
    """The columns a schemaless batch's records give (`Format.for_batch`), the table evolved to them. `assume`: the
    batch is appended on the JVM path, so the table's columns may be assumed (`BatchContext.assume`)."""
    fields = spark.table(iceberg.full_name).schema.fields
    context = BatchContext(kafka_conf, batch.tasks(), table.max_record_bytes, fields, assume=assume)
    columns = format_of(decoder).for_batch(spark, decoder, context)
    for change in iceberg.evolve(table_struct(columns.fields, table.mode == "upsert")):
        log.info("%s: schema evolved from the records: %s", iceberg.identifier, change)
    return columns


def _read_plan_and_writer(
    iceberg: IcebergTable, table: TableSpec, decoder: DecoderSpec, value_fields: list, kafka_conf: dict
) -> tuple[ReadPlan, Writer]:
    """How the batch's records are read and decoded, and how its rows are written (append, or upsert)."""
    values_format, envelope = format_of(decoder), envelope_of(decoder)
    rules = values_format.rules(decoder, table)
    if envelope is not None:
        rules = envelope.rules(decoder, rules)
    # An envelope's batch carries its change columns after the value fields (the upsert writer consumes them).
    change_fields = envelope.change_fields(decoder) if envelope is not None else []
    plan = ReadPlan(
        kafka_conf=kafka_conf,
        decoder=decoder,
        batch_schema_json=batch_struct(table_struct([*value_fields, *change_fields])).json(),
        value_fields=tuple(f.name for f in [*value_fields, *change_fields]),
        strict=rules.strict,
        required=rules.required,
        framed=rules.framed,
        needs_key=table.mode == "upsert" and not table.key,
        max_record_bytes=table.max_record_bytes,
    )
    if table.mode != "upsert":
        return plan, _append_writer(table_struct(value_fields))
    if envelope is not None:  # the row key is the envelope's (the source's primary key)
        keys = envelope.row_keys(decoder)
    else:
        keys = key_columns(table.key, value_fields, f"table {iceberg.identifier}")
    soft = table.deletes == "soft"
    changes = tuple(f.name for f in change_fields)
    return plan, _upsert_writer(iceberg.schema(), keys, table.run_timeout_seconds, changes, soft)


def _value_fields(
    values_format: Format, envelope: Envelope | None, decoder: DecoderSpec, table: TableSpec, identifier: str
) -> list | None:
    """The table's value columns (None: only a batch knows them). Change events: the envelope's (those known before
    a batch is read)."""
    if envelope is not None:
        return envelope.value_fields(decoder, table, identifier)
    return values_format.value_fields(decoder, table, identifier)


def _commit(
    spark: SparkSession,
    iceberg: IcebergTable,
    table: TableSpec,
    plan: ReadPlan,
    batch: Batch,
    state: CommittedState,
    checkpoint: Checkpoint,
    write: Writer,
    path: ReadPath,
    explains: Callable[[list], bool] | None = None,
) -> CommitOutcome:
    """Read the batch, apply the error mode, commit what it leaves on the run's branch with `checkpoint` (its
    offsets are the batch's as the error mode leaves it). On the JVM path an append batch is first committed as the
    JVM decodes it, streamed; only if some record needs Python is it read again with status columns. `explains`:
    the columns were assumed (`BatchColumns`); _Unexplained where they do not explain a record left to Python."""
    if not batch.ranges:  # only positions to record (`latest`, an empty or new partition, every unread record lost)
        snapshot_id, _ = commit_on_branch(
            iceberg,
            state.snapshot_id,  # type: ignore[arg-type]  # ensure() gives the table its first snapshot
            checkpoint,
            lambda branch: 0,
            table.run_timeout_seconds,
        )
        return CommitOutcome(snapshot_id, 0, ErrorModeOutcome(None, batch, 0, None))  # type: ignore[arg-type]  # an empty batch writes no rows
    jvm = JvmBatch(spark, plan, path.avro, batch.ranges, len(batch.tasks())) if path.name == JVM else None  # type: ignore[arg-type]  # the JVM path has its plan (choose_path)
    try:
        if jvm is not None and table.mode == "append":
            committed = _commit_exact(iceberg, jvm, table, batch, state, checkpoint, write, explains)
            if committed is not None:
                return committed
        kept = jvm.kept() if jvm is not None else None
        frame, release = (kept.rows, kept.release) if kept is not None else _read(spark, plan, batch)
        try:
            found = _apply_error_mode(spark, iceberg.identifier, table, frame, batch, checkpoint)
            if found is None and kept is not None:  # some records need the Python decoder: the pass again with them
                log.info("%s: records need the Python decoder: decoding them", iceberg.identifier)
                found = _apply_error_mode(spark, iceberg.identifier, table, kept.with_python(), batch, checkpoint)
            applied: ErrorModeOutcome = found  # type: ignore[assignment]  # a frame without pending rows has its outcome
            if applied.batch.next_offsets == state.offsets:  # fail mode, a bad record first in every partition read
                return CommitOutcome(None, 0, applied)
            checkpoint, good = replace(checkpoint, offsets=applied.batch.next_offsets), applied.good
            if table.mode == "upsert":  # each change's clock (its position); the checkpoint carries the clocks on
                good, clocks = positioned(good, checkpoint.clocks, applied.clock_tops)
                checkpoint = replace(checkpoint, clocks=clocks)
            snapshot_id, rows = commit_on_branch(
                iceberg,
                state.snapshot_id,  # type: ignore[arg-type]  # ensure() gives the table its first snapshot
                checkpoint,
                partial(write, good, facts=applied.change_facts),
                table.run_timeout_seconds,
            )
            return CommitOutcome(snapshot_id, rows, applied)
        finally:
            release()
    except (IcefloeError, _Unexplained):
        raise
    except Exception as failure:  # a source failure carried by a Python task's or the Kafka client's error
        if jvm is not None and kafka_timestamp_overflow(failure):
            raise _TimestampOverflow() from None
        raise (unmark(str(failure)) or source_failure(failure, table.topic, table.source_cluster) or failure) from None


class _TimestampOverflow(Exception):
    """Spark's Kafka source failed on a record's timestamp (nanoseconds?); nothing was committed."""


class _NeedsPython(Exception):
    """Some records of the batch need the Python decoder: what the streamed attempt wrote is discarded."""


class _Unexplained(Exception):
    """Records the assumed columns do not explain (a new key, a wider type): the streamed attempt is discarded."""


def _commit_exact(
    iceberg: IcebergTable,
    jvm: JvmBatch,
    table: TableSpec,
    batch: Batch,
    state: CommittedState,
    checkpoint: Checkpoint,
    write: Writer,
    explains: Callable[[list], bool] | None = None,
) -> CommitOutcome | None:
    """Commit every record as the JVM decodes it, streamed from Kafka to the table (nothing held). The few records
    whose row is not exact are then read again alone (per partition, from the first to the last of them), decoded
    by Python and routed by the error mode, on the same branch. None when the batch must be read again whole (a
    `fail` table commits only up to its first bad record): that attempt's branch is dropped unpublished (its files
    are orphans for maintenance). `explains`: the columns were assumed (`BatchColumns`); _Unexplained, the attempt
    dropped as well, where they do not explain the records left to Python."""
    rows, observation = jvm.exact_rows(checkpoint.run_id)  # type: ignore[arg-type]  # a batch's checkpoint has its run id; the table's columns
    applied: list[ErrorModeOutcome] = []

    def write_all(branch: Branch) -> int:
        branch.append(rows)
        counts = _observed(observation, iceberg.identifier, checkpoint.topic, batch)
        written = counts["rows"] - counts["for_python"]
        if not counts["for_python"]:
            return written
        ranges = jvm.python_ranges(counts)
        if explains is not None and (ranges is None or not explains(ranges)):
            raise _Unexplained(f"of {counts['for_python']} records left to Python, some add or widen a column")
        if table.errors == "fail" or ranges is None:
            raise _NeedsPython(counts["for_python"])
        where = ", ".join(f"partition {r.partition} offsets [{r.start}, {r.end})" for r in ranges)
        log.info(
            "%s: %s records need the Python decoder: reading them again (%s)",
            iceberg.identifier,
            counts["for_python"],
            where,
        )
        frame, release = JvmBatch(jvm.spark, jvm.plan, jvm.avro, ranges, len(ranges)).python_rows()
        try:
            applied.append(_apply_error_mode(jvm.spark, iceberg.identifier, table, frame, batch, checkpoint))  # type: ignore[arg-type]  # Python's rows: none pending
            return written + write(applied[-1].good, branch)
        finally:
            release()

    try:
        base: int = state.snapshot_id  # type: ignore[assignment]  # ensure() gives the table its first snapshot
        snapshot_id, written = commit_on_branch(iceberg, base, checkpoint, write_all, table.run_timeout_seconds)
    except _NeedsPython as needed:
        log.info(
            "%s: %s records need the Python decoder: reading the batch again with them",
            iceberg.identifier,
            needed.args[0],
        )
        return None
    return CommitOutcome(snapshot_id, written, applied[-1] if applied else ErrorModeOutcome(rows, batch, 0, None))


def _observed(observation: Observation, identifier: str, topic: str | None, batch: Batch) -> dict:
    """The streamed write's counts (`rows`, `for_python`): waited for in a thread of their own, so that metrics
    that never come fail the batch (nothing committed) instead of blocking it for ever."""
    found: dict = {}
    done = threading.Event()

    def fetch() -> None:
        try:
            found["counts"] = observation.get
        except Exception as error:
            found["error"] = error
        finally:
            done.set()

    threading.Thread(target=fetch, name=f"observe-{identifier}", daemon=True).start()
    counts = found.get("counts") if done.wait(OBSERVED_METRICS_TIMEOUT_S) else None
    if counts is None or not {"rows", "for_python"} <= set(counts):
        ranges = ", ".join(f"partition {r.partition} offsets [{r.start}, {r.end})" for r in batch.ranges)
        got = type(found["error"]).__name__ if "error" in found else sorted(counts or {})
        why = (
            f"observed without them: {got}"
            if done.is_set()
            else f"not observed within {OBSERVED_METRICS_TIMEOUT_S:.0f}s"
        )
        raise IcefloeError(
            f"table {identifier}: topic {topic}, {ranges}: Spark gave no record counts for the streamed write "
            f"({why}); nothing was committed"
        )
    return counts


def _read(spark: SparkSession, plan: ReadPlan, batch: Batch) -> tuple[DataFrame, Callable[[], object]]:
    """The batch as executors read it on the Python path, bad records included as failed rows; cached, so Kafka is
    read once: the error accounting, the dead letters and the write all use this frame. Returns the frame and the
    function that releases it."""
    rows = [(t.topic, t.partition, t.start, t.end) for t in batch.tasks()]
    task_rdd = spark.sparkContext.parallelize(rows, max(1, len(rows)))
    batch_schema = StructType.fromJson(json.loads(plan.batch_schema_json))
    frame = (
        spark.createDataFrame(task_rdd, "topic string, partition int, start long, end long")
        .mapInArrow(partial(read_batches, plan), batch_schema)
        .persist()
    )
    return frame, frame.unpersist


def _apply_error_mode(
    spark: SparkSession, identifier: str, table: TableSpec, frame: DataFrame, batch: Batch, checkpoint: Checkpoint
) -> ErrorModeOutcome | None:
    """Split the read batch into what to commit and what failed, as the table's `errors` mode says. An upsert
    batch's pass also finds the good rows' clock blocks (`upsert.positioned`) and, for an envelope's, their change
    facts (`upsert.ChangeFacts`): passes over the batch less. None where `frame` (a `KeptBatch`'s rows) holds
    records still to be decoded by Python (`PENDING`): the caller passes them decoded."""
    pending = PENDING in frame.columns
    failing = F.col(ERROR_CLASS).isNotNull()
    bad, good = frame.where(failing), frame.where(~failing)
    if pending:  # used only where none is pending: then every row is the record's as Python would give it
        good = good.drop(PENDING)
    upsert = table.mode == "upsert"
    changes = upsert and CHANGE in frame.columns
    found = (
        frame.groupBy("kafka_partition", *([clock_block().alias("block")] if upsert else []))
        .agg(
            F.min(F.when(failing, F.col("kafka_offset"))).alias("first"),
            F.count(F.when(failing, 1)).alias("failed"),
            *([F.max(F.when(~failing, F.unix_millis("kafka_timestamp"))).alias("top")] if upsert else []),
            *(change_fact_columns(frame, ~failing) if changes else []),
            *([F.count(F.when(F.col(PENDING), 1)).alias("pending")] if pending else []),
        )
        .collect()
    )
    if pending and any(row.pending for row in found):
        return None
    first_bad: dict[int, tuple[int, int]] = {}
    for row in found:
        if row.failed:
            first, failed_before = first_bad.get(row.kafka_partition, (row.first, 0))
            first_bad[row.kafka_partition] = (min(first, row.first), failed_before + row.failed)
    failed = sum(n for _, n in first_bad.values())
    tops = [(row.kafka_partition, row.block, row.top) for row in found] if upsert else None
    facts = change_facts_of(found) if changes else None
    if not failed:
        return ErrorModeOutcome(good, batch, 0, None, tops, facts)
    _log_failures(identifier, bad)
    if table.errors == "fail":
        error = _first_error(bad, first_bad)
        for partition, (offset, _) in first_bad.items():
            batch = batch.cut_before(partition, offset)
            good = good.where((F.col("kafka_partition") != partition) | (F.col("kafka_offset") < offset))
        return ErrorModeOutcome(good, batch, 0, error)  # cut: its clock blocks and change facts are found again
    if table.errors == "dlq":
        truncated = tuple(r for r in checkpoint.lost if r.kind == TRUNCATED)
        commit_dead_letters(
            spark,
            identifier,
            table.topic,
            bad,
            batch.next_offsets,
            checkpoint.run_id,  # type: ignore[arg-type]  # a batch's checkpoint has its run id
            table.run_timeout_seconds,
            truncated,
        )
    return ErrorModeOutcome(good, batch, failed, None, tops, facts)


def _first_error(bad: DataFrame, first_bad: dict[int, tuple[int, int]]) -> RecordError:
    """The bad record that stops a `fail` table: the earliest offset, lowest partition first on ties."""
    partition = min(first_bad, key=lambda p: (first_bad[p][0], p))
    row = bad.where((F.col("kafka_partition") == partition) & (F.col("kafka_offset") == first_bad[partition][0]))
    detail = row.select(ERROR_CLASS, ERROR_MESSAGE).first()
    return RecordError(partition, first_bad[partition][0], detail[ERROR_MESSAGE], detail[ERROR_CLASS])  # type: ignore[index]  # the partition's first bad record is there


def _log_failures(identifier: str, bad: DataFrame) -> None:
    sample = bad.select("kafka_partition", "kafka_offset", ERROR_CLASS, ERROR_MESSAGE)
    for row in sample.orderBy("kafka_partition", "kafka_offset").limit(LOGGED_FAILURES).collect():
        log.warning("%s: bad record at partition %d offset %d: %s: %s", identifier, *row)


def _append_writer(struct: StructType) -> Writer:
    columns = [F.col(quoted(f.name)) for f in struct.fields]  # a name may hold dots or backticks

    def append(frame: DataFrame, branch: Branch, facts: ChangeFacts | None = None) -> int:
        branch.append(frame.select(*columns))
        return branch.rows_appended()

    return append


def _upsert_writer(
    columns: StructType,
    keys: list[str],
    run_timeout_s: float,
    changes: tuple[str, ...] = (),
    soft: bool = False,
) -> Writer:
    """`columns`: the table's, which may hold fields the batch's schema removed (they are set to null); `changes`:
    an envelope's change columns, which the writer consumes (`upsert`)."""

    def upsert(frame: DataFrame, branch: Branch, facts: ChangeFacts | None = None) -> int:
        kept = conformed(frame, columns, keep=(TOMBSTONE, *changes))
        return merge_batch(kept, branch, columns, keys, run_timeout_s, soft, facts)

    return upsert
