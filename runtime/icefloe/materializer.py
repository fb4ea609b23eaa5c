"""One batch for one table: plan offsets, read and convert in executors, write, commit data and offsets together."""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from functools import partial

from .commit import commit_on_branch, drop_stale_branches
from .decoding import decoder_spec
from .errors import IcefloeError, RecordError
from .iceberg_table import OFFSETS_PROPERTY, RUN_PROPERTY, TOPIC_PROPERTY, IcebergTable
from .kafka_source import OffsetRange, client_config, plan_ranges
from .reader import ReadPlan, read_batches, unmark
from .schema_mapping import avro_value_fields, inline_value_fields, table_struct
from .spec import IcefloeConfig, TableSpec

log = logging.getLogger(__name__)
# Split long partitions so both cores (or many executors) share the work; each split is one Spark task.
RECORDS_PER_TASK = 500_000


@dataclass
class BatchResult:
    identifier: str
    topic: str
    status: str  # committed | up-to-date
    rows_written: int = 0
    snapshot_id: int | None = None
    metadata_location: str | None = None
    offsets: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    run_id: str = ""

    def as_dict(self) -> dict:
        data = asdict(self)
        data["offsets"] = {str(p): o for p, o in sorted(self.offsets.items())}
        return data

    def describe(self) -> str:
        if self.status == "up-to-date":
            return f"{self.identifier}: up to date at offsets {self.as_dict()['offsets']} (nothing committed)"
        return (
            f"{self.identifier}: committed {self.rows_written} rows from {self.topic} in {self.seconds:.1f}s, "
            f"snapshot {self.snapshot_id}, next offsets {self.as_dict()['offsets']}"
        )


def _split(ranges: list[OffsetRange], size: int) -> list[OffsetRange]:
    return [
        OffsetRange(r.topic, r.partition, start, min(start + size, r.end))
        for r in ranges
        for start in range(r.start, r.end, size)
    ]


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
    drop_stale_branches(iceberg)
    state = iceberg.committed_state(table.topic)
    ranges, next_offsets = plan_ranges(
        kafka_conf, table.topic, state.offsets, table.starting_offsets, table.max_records_per_run
    )
    if next_offsets == state.offsets:
        return BatchResult(identifier, table.topic, "up-to-date", offsets=state.offsets, run_id=run_id,
                           seconds=time.monotonic() - started)  # fmt: skip
    log.info("%s: reading %d records from %d partitions", identifier, sum(r.count for r in ranges), len(ranges))

    plan = ReadPlan(
        kafka_conf=kafka_conf,
        decoder=decoder,
        table_schema_json=struct.json(),
        value_fields=tuple(f.name for f in value_fields),
        strict=decoder.format == "json",
    )
    tasks = _split(ranges, RECORDS_PER_TASK)

    def write(target: str) -> None:
        rows = [(t.topic, t.partition, t.start, t.end) for t in tasks]
        task_schema = "topic string, partition int, start long, end long"
        task_rdd = spark.sparkContext.parallelize(rows, max(1, len(rows)))
        frame = spark.createDataFrame(task_rdd, task_schema).mapInArrow(partial(read_batches, plan), struct)
        (
            frame.writeTo(target)
            .option("mergeSchema", "true")
            .option(f"snapshot-property.{OFFSETS_PROPERTY}", json.dumps({str(p): o for p, o in next_offsets.items()}))
            .option(f"snapshot-property.{TOPIC_PROPERTY}", table.topic)
            .option(f"snapshot-property.{RUN_PROPERTY}", run_id)
            .append()
        )

    try:
        snapshot_id = commit_on_branch(iceberg, state.snapshot_id, run_id, write)
    except IcefloeError:
        raise
    except Exception as error:
        carried = unmark(str(error))
        if isinstance(carried, RecordError):
            raise RecordError(carried.partition, carried.offset, f"{carried.cause}", carried.kind) from None
        if carried is not None:
            raise carried from None
        raise
    summary = iceberg.snapshot_summary(snapshot_id)
    return BatchResult(
        identifier=identifier,
        topic=table.topic,
        status="committed",
        rows_written=int(summary.get("added-records", 0)),
        snapshot_id=snapshot_id,
        metadata_location=iceberg.metadata_location(),
        offsets=next_offsets,
        seconds=time.monotonic() - started,
        run_id=run_id,
    )
