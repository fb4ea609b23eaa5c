"""One batch for one table: plan offsets, read and convert in executors, write, commit data and offsets together.

Executors read every record once into a cached frame, bad records included as failed rows; then the error mode:
  fail  each partition is cut just before its first bad record, what comes before is committed, and the error of the
        earliest bad record is raised: the table holds everything before it and a fixed rerun resumes at it.
  skip  bad records are counted and logged (partition, offset, error; never the payload); the rest is committed.
  dlq   bad records go to the dead-letter table `<table>_dlq` first (its own offsets watermark keeps a crash and
        rerun from adding them twice), then the rest is committed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from functools import partial

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from . import progress
from .commit import commit_on_branch, drop_stale_branches
from .dead_letter import commit_dead_letters
from .decoding import decoder_spec
from .errors import IcefloeError, RecordError
from .iceberg_table import (
    DATA_LOSS_PROPERTY,
    OFFSETS_PROPERTY,
    RUN_PROPERTY,
    TOPIC_ID_PROPERTY,
    TOPIC_PROPERTY,
    IcebergTable,
    append_with_properties,
)
from .kafka_source import OffsetRange, client_config, plan_ranges
from .reader import ReadPlan, read_batches, unmark
from .schema_mapping import avro_value_fields, batch_struct, inline_value_fields, required_paths, table_struct
from .spec import IcefloeConfig, TableSpec
from .upsert import merge_batch

log = logging.getLogger(__name__)
# Split long partitions so both cores (or many executors) share the work; each split is one Spark task.
RECORDS_PER_TASK = 500_000
LOGGED_FAILURES = 20


@dataclass
class BatchResult:
    identifier: str
    topic: str
    status: str  # committed | up-to-date
    rows_written: int = 0
    records_failed: int = 0
    snapshot_id: int | None = None
    metadata_location: str | None = None
    offsets: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    run_id: str = ""
    data_lost: list[dict] = field(default_factory=list)  # ranges deleted before they were read (onDataLoss: warn)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["offsets"] = {str(p): o for p, o in sorted(self.offsets.items())}
        return data

    def describe(self) -> str:
        if self.status == "up-to-date":
            return f"{self.identifier}: up to date at offsets {self.as_dict()['offsets']} (nothing committed)"
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

    def cut_before(self, partition: int, offset: int) -> "Batch":
        """The same batch ending just before a bad record."""
        ranges = [r if r.partition != partition else replace(r, end=min(r.end, offset)) for r in self.ranges]
        return Batch([r for r in ranges if r.end > r.start], {**self.next_offsets, partition: offset})


def materialize_once(spark, config: IcefloeConfig, table: TableSpec) -> BatchResult:
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:16]
    identifier = config.identifier(table)
    cluster = config.cluster(table.source_cluster)
    kafka_conf = client_config(cluster)
    decoder = decoder_spec(table, cluster)
    if decoder.format == "avro-registry":
        value_fields = avro_value_fields(decoder.schema_str, f"{identifier} (subject {table.topic}-value)")
    else:
        value_fields = inline_value_fields(table.inline_schema)
    struct = table_struct(value_fields)

    iceberg = IcebergTable(spark, identifier)
    if iceberg.ensure(struct, table.partitions, table.maintenance.target_file_size_mb, table.topic):
        log.info("%s: created table", identifier)
    for change in iceberg.evolve(struct):
        log.info("%s: schema evolved: %s", identifier, change)
    drop_stale_branches(iceberg)
    state = iceberg.committed_state(table.topic)
    planned = plan_ranges(
        kafka_conf, table.topic, state.offsets, table.starting_offsets, table.max_records_per_run,
        table.on_data_loss, state.topic_id,
    )  # fmt: skip
    ranges, next_offsets = planned.ranges, planned.next_offsets
    batch = Batch(ranges, next_offsets)
    if next_offsets == state.offsets and not planned.lost:
        return BatchResult(
            identifier, table.topic, "up-to-date", snapshot_id=state.snapshot_id, offsets=state.offsets,
            metadata_location=iceberg.metadata_location(), run_id=run_id, seconds=time.monotonic() - started,
        )  # fmt: skip
    log.info("%s: reading %d records from %d partitions", identifier, sum(r.count for r in ranges), len(ranges))
    progress.reading(spark, identifier, sum(r.count for r in ranges))

    plan = ReadPlan(
        kafka_conf=kafka_conf,
        decoder=decoder,
        batch_schema_json=batch_struct(struct).json(),
        value_fields=tuple(f.name for f in value_fields),
        strict=decoder.format == "json",
        required=required_paths(table.inline_schema) if decoder.format == "json" else frozenset(),
        needs_key=table.mode == "upsert" and not table.key,
        max_record_bytes=table.max_record_bytes,
    )
    write = _upsert_writer(table, struct) if table.mode == "upsert" else _append_writer(struct)

    recorded = {TOPIC_ID_PROPERTY: planned.topic_id} if planned.topic_id else {}
    data_lost = [{"partition": r.partition, "start": r.start, "end": r.end} for r in planned.lost]
    if data_lost:
        recorded[DATA_LOSS_PROPERTY] = json.dumps(data_lost)
    snapshot_id, rows, failed, batch, first_error = _commit(
        spark, iceberg, table, plan, batch, state, run_id, write, recorded
    )
    result = BatchResult(
        identifier=identifier,
        topic=table.topic,
        status="committed",
        rows_written=rows,
        records_failed=failed,
        snapshot_id=snapshot_id,
        metadata_location=iceberg.metadata_location(),
        offsets=batch.next_offsets,
        seconds=time.monotonic() - started,
        run_id=run_id,
        data_lost=data_lost,
    )
    if first_error is not None:
        log.error("%s: committed up to the bad record: %s", identifier, result.describe())
        raise first_error
    return result


def _commit(spark, iceberg, table, plan, batch: Batch, state, run_id, write, recorded: dict[str, str]):
    """Read the batch in executors, apply the error mode, commit; returns
    (main's snapshot or None, rows written, bad records, the batch as committed, the error to raise in fail mode)."""
    rows = [(t.topic, t.partition, t.start, t.end) for t in batch.tasks()]
    task_rdd = spark.sparkContext.parallelize(rows, max(1, len(rows)))
    batch_schema = StructType.fromJson(json.loads(plan.batch_schema_json))
    # Kafka is read once: the error accounting, the dead letters and the write all use this cached frame.
    frame = (
        spark.createDataFrame(task_rdd, "topic string, partition int, start long, end long")
        .mapInArrow(partial(read_batches, plan), batch_schema)
        .persist()
    )
    try:
        bad = frame.where("icefloe_error_class IS NOT NULL")
        first_bad = {
            row.kafka_partition: (row.first, row.failed)
            for row in bad.groupBy("kafka_partition").agg(
                F.min("kafka_offset").alias("first"), F.count("*").alias("failed")
            ).collect()
        }
        good = frame.where("icefloe_error_class IS NULL")
        failed, error = sum(n for _, n in first_bad.values()), None
        if failed:
            _log_failures(iceberg.identifier, bad)
            if table.errors == "fail":
                error = _first_error(bad, first_bad)
                for partition, (offset, _) in first_bad.items():
                    batch = batch.cut_before(partition, offset)
                    good = good.where((F.col("kafka_partition") != partition) | (F.col("kafka_offset") < offset))
                failed = 0
                if batch.next_offsets == state.offsets:
                    return None, 0, 0, batch, error
            elif table.errors == "dlq":
                commit_dead_letters(spark, iceberg.identifier, table.topic, bad, batch.next_offsets, run_id)
        properties = {
            OFFSETS_PROPERTY: json.dumps({str(p): o for p, o in batch.next_offsets.items()}),
            TOPIC_PROPERTY: table.topic,
            RUN_PROPERTY: run_id,
            **recorded,
        }
        written = {}

        def write_branch(target: str) -> None:
            written["rows"] = write(spark, good, target, properties)

        snapshot_id = commit_on_branch(iceberg, state.snapshot_id, run_id, write_branch)
        return snapshot_id, written["rows"], failed, batch, error
    except IcefloeError:
        raise
    except Exception as failure:
        carried = unmark(str(failure))
        if carried is not None:
            raise carried from None
        raise
    finally:
        frame.unpersist()


def _first_error(bad, first_bad: dict[int, tuple[int, int]]) -> RecordError:
    """The bad record that stops a `fail` table: the earliest offset, lowest partition first on ties."""
    partition = min(first_bad, key=lambda p: (first_bad[p][0], p))
    row = bad.where((F.col("kafka_partition") == partition) & (F.col("kafka_offset") == first_bad[partition][0]))
    detail = row.select("icefloe_error_class", "icefloe_error_message").first()
    return RecordError(partition, first_bad[partition][0], detail.icefloe_error_message, detail.icefloe_error_class)


def _log_failures(identifier: str, bad) -> None:
    sample = bad.select("kafka_partition", "kafka_offset", "icefloe_error_class", "icefloe_error_message")
    for row in sample.orderBy("kafka_partition", "kafka_offset").limit(LOGGED_FAILURES).collect():
        log.warning("%s: bad record at partition %d offset %d: %s: %s", identifier, *row)


def _append_writer(struct):
    columns = [f.name for f in struct.fields]

    def append(spark, frame, target: str, properties: dict[str, str]) -> int:
        append_with_properties(frame.select(*columns), target, properties)
        table = target.rsplit(".branch_", 1)[0]
        added = spark.sql(
            f"SELECT summary['added-records'] AS added FROM {table}.snapshots "
            f"WHERE summary['{RUN_PROPERTY}'] = '{properties[RUN_PROPERTY]}'"
        ).collect()
        return int(added[0].added or 0) if added else 0

    return append


def _upsert_writer(table: TableSpec, struct):
    key_columns = list(table.key) if table.key else ["kafka_key"]

    def upsert(spark, frame, target: str, properties: dict[str, str]) -> int:
        return merge_batch(spark, frame, target, struct, key_columns, properties)

    return upsert
