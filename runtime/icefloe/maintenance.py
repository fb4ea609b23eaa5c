"""Table maintenance: compaction, delete-file folding, retention TTL, snapshot expiry, orphan cleanup, manifests.

An upsert table's delete markers (`<table>_deletes`) are maintained likewise, each kept `deleteMarkerRetention`.
Locally it runs between the table's own commits (the runner serializes them per table); on AWS a batch of another
run may commit while it runs. Its rewrites carry no offsets; after them it commits a copy of the checkpoint on
main's head (`commit_state.carry_checkpoint`), so the checkpoint stays reachable from the head whatever expiry
removes below; a batch committing meanwhile cannot move offsets backwards (the walk takes the furthest checkpoint).
Snapshot expiry keeps the snapshot the walk finds.
In an S3 table bucket (`catalog.type: s3tables`) S3 Tables compact, expire snapshots and remove unreferenced files
themselves; icefloe then runs only retention TTL, delete-file and manifest rewrites (see `maintain`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict, dataclass, field

from .catalog import CATALOG
from .commit_state import carry_checkpoint, committed_state
from .dead_letter import dead_letter_identifier
from .iceberg_table import IcebergTable
from .spec import TableSpec, duration_seconds
from .upsert import delete_markers_identifier

log = logging.getLogger(__name__)
LAST_MAINTENANCE_PROPERTY = "icefloe.last-maintenance-ms"


@dataclass
class MaintenanceResult:
    identifier: str
    data_files_before: int = 0
    data_files_after: int = 0
    delete_files_before: int = 0
    delete_files_after: int = 0
    rewritten_files: int = 0
    expired_snapshots: int = 0
    orphan_files_removed: int = 0
    rows_expired_by_ttl: int = 0
    snapshots_after: int = 0
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)
    dead_letters: "MaintenanceResult | None" = None  # the `<table>_dlq` table's, when there is one
    delete_markers: "MaintenanceResult | None" = None  # an upsert table's `<table>_deletes`, when there is one

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"{self.identifier}: data files {self.data_files_before} -> {self.data_files_after}, delete files "
            f"{self.delete_files_before} -> {self.delete_files_after}, expired {self.expired_snapshots} snapshots, "
            f"removed {self.orphan_files_removed} orphan files, TTL deleted {self.rows_expired_by_ttl} rows "
            f"({self.seconds:.1f}s)" + (f"; {self.dead_letters}" if self.dead_letters else "")
            + (f"; {self.delete_markers}" if self.delete_markers else "")
        )


def _millis(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _file_counts(table: IcebergTable) -> tuple[int, int]:
    rows = table.spark.sql(f"SELECT content, count(*) AS n FROM {table.full_name}.files GROUP BY content").collect()
    counts = {row.content: row.n for row in rows}
    return counts.get(0, 0), counts.get(1, 0) + counts.get(2, 0)


def is_due(table: IcebergTable, spec: TableSpec) -> bool:
    last = table.java().properties().get(LAST_MAINTENANCE_PROPERTY)
    if last is None or not str(last).isdigit():
        return True
    return time.time() * 1000 - int(last) >= duration_seconds(spec.maintenance.interval) * 1000


def maintain(table: IcebergTable, spec: TableSpec, managed: bool = False) -> MaintenanceResult:
    """Maintain the table, then its dead-letter table if it has one (same settings: retention, compaction,
    expiry, orphans), and record when. `managed`: the catalog maintains the tables' files itself (S3 Tables:
    compaction, snapshot expiry, unreferenced file removal), so only the steps it does not do run here (retention
    TTL, delete files, manifests); a second compactor and expirer would only race it."""
    result = _maintain_one(table, spec, managed)
    dead_letters = IcebergTable(table.spark, dead_letter_identifier(table.identifier))
    if dead_letters.exists():
        result.dead_letters = _maintain_one(dead_letters, spec, managed)
    markers = IcebergTable(table.spark, delete_markers_identifier(table.identifier))
    if markers.exists():  # a marker older than deleteMarkerRetention (on its clock) goes the way of an old row
        by_clock = spec.model_copy(update={"retention": spec.delete_marker_retention})
        result.delete_markers = _maintain_one(markers, by_clock, managed, retention_column="kafka_clock")
    table.spark.sql(
        f"ALTER TABLE {table.full_name} SET TBLPROPERTIES ('{LAST_MAINTENANCE_PROPERTY}' = '{int(time.time() * 1000)}')"
    )
    return result


def _maintain_one(
    table: IcebergTable, spec: TableSpec, managed: bool, retention_column: str = "kafka_timestamp"
) -> MaintenanceResult:
    started = time.monotonic()
    spark, name, settings = table.spark, table.full_name, spec.maintenance
    result = MaintenanceResult(table.identifier)
    result.data_files_before, result.delete_files_before = _file_counts(table)
    now = dt.datetime.now(dt.timezone.utc)

    if spec.retention:
        cutoff = now - dt.timedelta(seconds=duration_seconds(spec.retention))
        before = spark.table(name).count()
        spark.sql(f"DELETE FROM {name} WHERE {retention_column} < TIMESTAMP '{_millis(cutoff)}+00:00'")
        result.rows_expired_by_ttl = before - spark.table(name).count()
        result.steps.append("retention")

    if not managed:
        target = settings.target_file_size_mb * 1024 * 1024
        rewritten = spark.sql(
            f"CALL {CATALOG}.system.rewrite_data_files(table => '{table.identifier}', options => map("
            f"'target-file-size-bytes', '{target}', 'min-input-files', '2', 'delete-file-threshold', '1', "
            "'remove-dangling-deletes', 'true', 'rewrite-all', 'false'))"
        ).collect()
        result.rewritten_files = rewritten[0].rewritten_data_files_count if rewritten else 0
        result.steps.append("compaction")
    if result.delete_files_before:
        spark.sql(f"CALL {CATALOG}.system.rewrite_position_delete_files(table => '{table.identifier}')").collect()
    spark.sql(f"CALL {CATALOG}.system.rewrite_manifests(table => '{table.identifier}')").collect()
    result.steps.append("manifests")
    carry_checkpoint(table, spec.topic)  # the checkpoint on main's head: expiry below may remove where it was written
    if managed:
        result.steps.append("managed-by-catalog")
        return _finish(table, result, started)

    # Expire old snapshots, but never the one carrying the offsets the next run resumes from (the one main's history
    # leads to, not the newest on any branch: an abandoned run's branch may hold a newer one).
    keep_from = now - dt.timedelta(seconds=duration_seconds(settings.snapshot_retention))
    offsets_at = committed_state(table, spec.topic).checkpoint_committed_at
    if offsets_at is not None:
        keep_from = min(keep_from, offsets_at)
    snapshots_before = spark.sql(f"SELECT count(*) AS n FROM {name}.snapshots").collect()[0].n
    spark.sql(
        f"CALL {CATALOG}.system.expire_snapshots(table => '{table.identifier}', "
        f"older_than => TIMESTAMP '{_millis(keep_from.astimezone(dt.timezone.utc))}+00:00', "
        f"retain_last => {settings.min_snapshots_to_keep})"
    ).collect()
    result.steps.append("expire-snapshots")

    result.orphan_files_removed = _remove_orphans(table, now - dt.timedelta(seconds=duration_seconds(settings.orphan_file_age)))
    result.steps.append("orphans")
    return _finish(table, result, started, snapshots_before)



def _finish(table: IcebergTable, result: MaintenanceResult, started: float,
            snapshots_before: int | None = None) -> MaintenanceResult:
    spark, name = table.spark, table.full_name
    result.data_files_after, result.delete_files_after = _file_counts(table)
    result.snapshots_after = spark.sql(f"SELECT count(*) AS n FROM {name}.snapshots").collect()[0].n
    if snapshots_before is not None:
        result.expired_snapshots = snapshots_before - result.snapshots_after
    result.seconds = time.monotonic() - started
    log.info("%s", result)
    return result


def _remove_orphans(table: IcebergTable, older_than: dt.datetime) -> int:
    """Iceberg's action API (the SQL procedure refuses ages under 24 h). Safe without that check: the spec holds
    `orphanFileAge` at or above `runTimeout`, and a run older than that never publishes, so no unreferenced file
    this old can still become part of the table, even where runs and maintenance overlap (Glue)."""
    spark = table.spark
    jvm = spark._jvm
    java_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table.full_name)
    action = jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession).deleteOrphanFiles(java_table)
    # List through the table's FileIO (S3FileIO on Glue), not Hadoop's FileSystem: off EMR there is no
    # FileSystem for s3:// (EMR has EMRFS), so the default listing would fail against a moto server.
    action = action.usePrefixListing(True)
    outcome = action.olderThan(int(older_than.timestamp() * 1000)).execute()
    return sum(1 for _ in outcome.orphanFileLocations())
