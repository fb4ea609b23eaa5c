"""Table maintenance: compaction, delete-file folding, retention TTL, snapshot expiry, orphan cleanup, manifests.

An upsert table's delete markers (`<table>_deletes`) are maintained likewise, each kept `deleteMarkerRetention`.
Locally it runs between the table's own commits (the runner serializes them per table); on AWS a batch of another
run may commit while it runs. Its rewrites carry no offsets; after them it commits a copy of the checkpoint on
main's head (`commit_state.carry_checkpoint`), so the checkpoint stays reachable from the head whatever expiry
removes below; a batch committing meanwhile cannot move offsets backwards (the walk takes the furthest checkpoint).
Snapshot expiry keeps the snapshot the walk finds.
In an S3 table bucket (`catalog.type: s3tables`) S3 Tables compact, expire snapshots and remove unreferenced files
themselves; icefloe then runs only retention TTL, delete-file and manifest rewrites (see `maintain`).

Runs of one table overlap on AWS, so maintenance is claimed before it runs: a table property (`LEASE_PROPERTY`, the
claimant and until when) committed against the metadata just read, with `LAST_MAINTENANCE_PROPERTY`; a run that
loses that commit, or finds a live claim of another, skips maintenance. A step that loses a race with a batch
committing meanwhile (Iceberg's validation refuses the rewrite) is skipped and tried again at the next maintenance.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from icefloe.commit.checkpoint import carry_checkpoint, committed_state
from icefloe.errors import COMMIT_FAILED, VALIDATION_FAILED, java_classes
from icefloe.jvm_gateway import jvm_gateway
from icefloe.materialize.dead_letters import dead_letter_identifier
from icefloe.materialize.upsert import delete_markers_identifier
from icefloe.spec import TableSpec, duration_seconds
from icefloe.table.catalog import CATALOG
from icefloe.table.iceberg import IcebergTable
from icefloe.table.refs import new_run_id

log = logging.getLogger(__name__)
LAST_MAINTENANCE_PROPERTY = "icefloe.last-maintenance-ms"  # when maintenance was last claimed (epoch ms)
# Continuous mode keeps at most twice this many snapshots between maintenance runs (`bound_snapshots`): each
# micro-batch adds one or two, and every commit rewrites the metadata file that lists them all.
CONTINUOUS_SNAPSHOTS_KEPT = 200
LEASE_PROPERTY = "icefloe.maintenance-lease"  # "<claimant>;<expiry, epoch ms>" while a run maintains the table
# A claim lasts the table's maintenance interval, at least this long; a claimant that dies blocks no longer.
LEASE_MIN_S = 3600
CLAIM_ATTEMPTS = 5
# How far back main's history is walked through the Java API before compaction asks Spark (`_small_files_...`).
HISTORY_WALKED = 50
# Compaction commits at most this many times (partial progress): file groups that lose a race fail alone.
COMPACTION_MAX_COMMITS = 10
# Iceberg's refusals of a commit that lost a race: a rewrite whose files another commit replaced or deleted from.
_LOST_RACE = {COMMIT_FAILED, VALIDATION_FAILED}
# Where those refusals say why, in the error's text (only to pick the line the log names; classified by type).
_LOST_RACE_MARKS = (
    "CommitFailedException",
    "ValidationException",
    "Missing required files to delete",
    "could not be found in the latest snapshot",
    "found new position delete",
)


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
    dead_letters: MaintenanceResult | None = None  # the `<table>_dlq` table's, when there is one
    skipped: str = ""  # why nothing was done: another run holds the table's maintenance, or it was not due
    lost_races: list[str] = field(default_factory=list)  # steps refused because a batch committed meanwhile
    compaction_failed_files: int = 0  # data files in compaction groups whose commit was refused (partial progress)
    delete_markers: MaintenanceResult | None = None  # an upsert table's `<table>_deletes`, when there is one

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.identifier}: maintenance skipped: {self.skipped}"
        lost = f", lost to other writers' commits: {', '.join(self.lost_races)}" if self.lost_races else ""
        return (
            f"{self.identifier}: data files {self.data_files_before} -> {self.data_files_after}, delete files "
            f"{self.delete_files_before} -> {self.delete_files_after}, expired {self.expired_snapshots} snapshots, "
            f"removed {self.orphan_files_removed} orphan files, TTL deleted {self.rows_expired_by_ttl} rows "
            f"({self.seconds:.1f}s){lost}"
            + (f"; {self.dead_letters}" if self.dead_letters else "")
            + (f"; {self.delete_markers}" if self.delete_markers else "")
        )


def _millis(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _file_counts(table: IcebergTable) -> tuple[int, int]:
    """(data files, delete files) of main's head: the totals its snapshot's summary keeps, as Iceberg counts every
    commit's added and removed files (two Spark jobs less each time, four per maintenance); the files metadata table
    where a summary lacks them (a snapshot of a writer that did not keep them)."""
    head = table.java().currentSnapshot()
    if head is None:
        return 0, 0
    summary = head.summary()
    data, deletes = summary.get("total-data-files"), summary.get("total-delete-files")
    if data is not None and deletes is not None:
        return int(data), int(deletes)
    rows = table.spark.sql(f"SELECT content, count(*) AS n FROM {table.full_name}.files GROUP BY content").collect()
    counts = {row.content: row.n for row in rows}
    return counts.get(0, 0), counts.get(1, 0) + counts.get(2, 0)


def is_due(table: IcebergTable, spec: TableSpec, loaded=None) -> bool:
    """`loaded`: the table as `IcebergTable.java()` gave it, if the caller has it."""
    last = (table.java() if loaded is None else loaded).properties().get(LAST_MAINTENANCE_PROPERTY)
    if last is None or not str(last).isdigit():
        return True
    return time.time() * 1000 - int(last) >= duration_seconds(spec.maintenance.interval) * 1000


def bound_snapshots(table: IcebergTable, spec: TableSpec, loaded=None) -> int:
    """Continuous mode: once the table holds more than twice CONTINUOUS_SNAPSHOTS_KEPT snapshots, expire all but the
    newest CONTINUOUS_SNAPSHOTS_KEPT of main's history, whatever `snapshotRetention` says; never the snapshot carrying
    the checkpoint (older than it only), nor the history of a run's branch (a branch keeps as many); returns how many
    were expired. Otherwise a micro-batch every few seconds piles hours of snapshots into every metadata file
    between two maintenance runs, and every commit of every batch rewrites that file. Also for the tables a batch
    commits to beside it (`<table>_deletes`, `<table>_dlq`)."""
    loaded = table.java() if loaded is None else loaded
    count = loaded.operations().current().snapshots().size()
    if count <= 2 * CONTINUOUS_SNAPSHOTS_KEPT:
        return 0
    offsets_at = committed_state(table, spec.topic).checkpoint_committed_at
    older_than = offsets_at.timestamp() if offsets_at is not None else time.time()
    loaded.expireSnapshots().expireOlderThan(int(older_than * 1000)).retainLast(CONTINUOUS_SNAPSHOTS_KEPT).commit()
    expired = count - table.java().operations().current().snapshots().size()
    log.info(
        "%s: expired %d snapshots (continuous mode keeps the newest %d between maintenance runs)",
        table.identifier,
        expired,
        CONTINUOUS_SNAPSHOTS_KEPT,
    )
    return expired


def maintain(
    table: IcebergTable, spec: TableSpec, managed: bool = False, only_if_due: bool = False
) -> MaintenanceResult:
    """Claim the table's maintenance (`claim`), then maintain the table and its dead-letter table if it has one (same
    settings, but the DLQ's own `deadLetterRetention`), then release the claim. A live claim of another run (or with
    `only_if_due`, maintenance no longer due) makes this a logged no-op (`skipped`). `managed`: the catalog maintains
    the tables' files itself (S3 Tables: compaction, snapshot expiry, unreferenced file removal), so only the steps
    it does not do run here (retention TTL, delete files, manifests); a second compactor and expirer would only race
    it."""
    claimant = new_run_id()
    interval_ms = duration_seconds(spec.maintenance.interval) * 1000 if only_if_due else None
    why_not = claim(table, claimant, max(duration_seconds(spec.maintenance.interval), LEASE_MIN_S), interval_ms)
    if why_not:
        log.info("%s: maintenance skipped: %s", table.identifier, why_not)
        return MaintenanceResult(table.identifier, skipped=why_not)
    try:
        result = _maintain_one(table, spec, managed, spec.retention, "kafka_timestamp")
        dead_letters = IcebergTable(table.spark, dead_letter_identifier(table.identifier))
        if dead_letters.exists():  # its rows age from when they were dead-lettered, not from when they were produced
            result.dead_letters = _maintain_one(dead_letters, spec, managed, spec.dead_letter_retention, "failed_at")
        markers = IcebergTable(table.spark, delete_markers_identifier(table.identifier))
        if markers.exists():  # a marker older than deleteMarkerRetention (on its clock) goes the way of an old row
            result.delete_markers = _maintain_one(markers, spec, managed, spec.delete_marker_retention, "kafka_clock")
        return result
    finally:
        release(table, claimant)


def _java_properties(table: IcebergTable):
    """(the table's operations, its metadata as read now, and that metadata's properties)."""
    operations = table.java().operations()
    base = operations.current()
    return operations, base, base.properties()


def _lease(value: str | None) -> tuple[str, int] | None:
    """(claimant, expiry in epoch ms) of a lease property, or None for none (or one not of ours)."""
    claimant, _, expiry = (value or "").rpartition(";")
    return (claimant, int(expiry)) if claimant and expiry.isdigit() else None


def claim(table: IcebergTable, claimant: str, lease_s: float, interval_ms: float | None = None) -> str:
    """Take the table's maintenance for `lease_s`: commit `LEASE_PROPERTY` and `LAST_MAINTENANCE_PROPERTY` against
    the metadata just read (the catalog's compare-and-swap: on Glue, the `VersionId`; a lost race is
    `CommitFailedException`, and the table is read again). Returns "" when claimed, else why not: another run's
    claim is live, or (`interval_ms`) maintenance was claimed less than that long ago."""
    jvm = jvm_gateway(table.spark)
    for attempt in range(1, CLAIM_ATTEMPTS + 1):
        operations, base, properties = _java_properties(table)
        now = int(time.time() * 1000)
        held = _lease(properties.get(LEASE_PROPERTY))
        if held is not None and held[0] != claimant and held[1] > now:
            until = dt.datetime.fromtimestamp(held[1] / 1000, dt.UTC).isoformat(timespec="seconds")
            return f"claimed by run {held[0]} until {until}"
        last = str(properties.get(LAST_MAINTENANCE_PROPERTY) or "")
        if interval_ms is not None and last.isdigit() and now - int(last) < interval_ms:
            return f"not due: another run claimed it {(now - int(last)) / 1000:.0f}s ago"
        updated = {LEASE_PROPERTY: f"{claimant};{now + int(lease_s * 1000)}", LAST_MAINTENANCE_PROPERTY: str(now)}
        try:
            operations.commit(base, jvm.org.apache.iceberg.TableMetadata.buildFrom(base).setProperties(updated).build())
        except Exception as error:
            if COMMIT_FAILED not in java_classes(error):
                raise
            log.info(
                "%s: claiming maintenance lost a race with another commit (attempt %d of %d); reading the table again",
                table.identifier,
                attempt,
                CLAIM_ATTEMPTS,
            )
            continue
        # A catalog whose commit checks less than the metadata's version (REST checks only the table's uuid for a
        # property change) lets the last of two claims win: read back who holds the claim.
        held = _lease(_java_properties(table)[2].get(LEASE_PROPERTY))
        if held is not None and held[0] != claimant:
            return f"claimed by run {held[0]}"
        log.info("%s: maintenance claimed by run %s for %.0fs", table.identifier, claimant, lease_s)
        return ""
    return f"its claim lost {CLAIM_ATTEMPTS} races with other writers' commits"


def release(table: IcebergTable, claimant: str) -> None:
    """Remove `claimant`'s lease (compare-and-swap like `claim`); best effort: an unreleased lease expires."""
    try:
        for _ in range(CLAIM_ATTEMPTS):
            operations, base, properties = _java_properties(table)
            held = _lease(properties.get(LEASE_PROPERTY))
            if held is None or held[0] != claimant:
                return
            removed = jvm_gateway(table.spark).java.util.HashSet()
            removed.add(LEASE_PROPERTY)
            try:
                operations.commit(
                    base,
                    jvm_gateway(table.spark)
                    .org.apache.iceberg.TableMetadata.buildFrom(base)
                    .removeProperties(removed)
                    .build(),
                )
                return
            except Exception as error:
                if COMMIT_FAILED not in java_classes(error):
                    raise
    except Exception as error:
        cause = str(error).splitlines()[0] if str(error) else type(error).__name__
        log.warning(
            "%s: could not release the maintenance claim of run %s (it expires by itself): %s",
            table.identifier,
            claimant,
            cause,
        )


def _step(table: IcebergTable, result: MaintenanceResult, name: str, action: Callable[[], object]) -> bool:
    """Run one maintenance step; a step refused because another writer committed meanwhile (Iceberg's validation of
    a rewrite, or a commit that lost its race) is skipped, logged, and tried again at the next maintenance."""
    try:
        action()
    except Exception as error:
        if not java_classes(error) & _LOST_RACE:
            raise
        text = str(error)
        cause = next((line.strip() for line in text.splitlines() if any(m in line for m in _LOST_RACE_MARKS)), "")
        log.warning(
            "%s: maintenance step %s lost a race with another writer's commit and was skipped (tried again at "
            "the next maintenance): %s",
            table.identifier,
            name,
            cause[:300],
        )
        result.lost_races.append(name)
        return False
    result.steps.append(name)
    return True


def _maintain_one(
    table: IcebergTable, spec: TableSpec, managed: bool, retention: str | None, ttl_column: str
) -> MaintenanceResult:
    started = time.monotonic()
    spark, name, settings = table.spark, table.full_name, spec.maintenance
    result = MaintenanceResult(table.identifier)
    result.data_files_before, result.delete_files_before = _file_counts(table)
    now = dt.datetime.now(dt.UTC)

    if retention:
        cutoff = now - dt.timedelta(seconds=duration_seconds(retention))
        expired = f"{ttl_column} < TIMESTAMP '{_millis(cutoff)}+00:00'"
        # Counted before the DELETE, not as the difference of two counts: batches may commit rows meanwhile.
        rows = spark.table(name).where(expired).count()
        if _step(table, result, "retention", lambda: spark.sql(f"DELETE FROM {name} WHERE {expired}")):
            result.rows_expired_by_ttl = rows

    if not managed:
        target = settings.target_file_size_mb * 1024 * 1024
        small = target * 3 // 4  # Iceberg's default: a file this large is near the target and left alone
        compacted: list = []

        def compact() -> None:
            # Small files that one batch wrote are as large as that batch could make them (one per task): rewriting
            # them right after a table's first batch would write the whole batch again for nothing.
            if not result.delete_files_before and _small_files_of_one_batch_at_most(table, small):
                return
            # Partial progress: file groups commit on their own, so a batch publishing deletes against some files
            # (an overlapping upsert run) makes only those groups fail, not the whole compaction every time.
            compacted.extend(
                spark.sql(
                    f"CALL {CATALOG}.system.rewrite_data_files(table => '{table.identifier}', options => map("
                    f"'target-file-size-bytes', '{target}', 'min-file-size-bytes', '{small}', 'min-input-files', "
                    "'2', 'delete-file-threshold', '1', 'remove-dangling-deletes', 'true', 'rewrite-all', 'false', "
                    f"'partial-progress.enabled', 'true', 'partial-progress.max-commits', '{COMPACTION_MAX_COMMITS}'))"
                ).collect()
            )

        _step(table, result, "compaction", compact)
        if compacted:
            result.rewritten_files = compacted[0].rewritten_data_files_count
            result.compaction_failed_files = compacted[0].asDict().get("failed_data_files_count") or 0
    if result.delete_files_before:
        _step(
            table,
            result,
            "delete-files",
            lambda: spark.sql(
                f"CALL {CATALOG}.system.rewrite_position_delete_files(table => '{table.identifier}')"
            ).collect(),
        )
    _step(
        table,
        result,
        "manifests",
        lambda: spark.sql(f"CALL {CATALOG}.system.rewrite_manifests(table => '{table.identifier}')").collect(),
    )
    # The checkpoint on main's head: expiry below may remove where it was written.
    _step(table, result, "carry-checkpoint", lambda: carry_checkpoint(table, spec.topic))
    if managed:
        result.steps.append("managed-by-catalog")
        return _finish(table, result, started)

    # Expire old snapshots, but never the one carrying the offsets the next run resumes from (the one main's history
    # leads to, not the newest on any branch: an abandoned run's branch may hold a newer one).
    keep_from = now - dt.timedelta(seconds=duration_seconds(settings.snapshot_retention))
    offsets_at = committed_state(table, spec.topic).checkpoint_committed_at
    if offsets_at is not None:
        keep_from = min(keep_from, offsets_at)
    # Counted as the snapshots that went, not as a difference of counts: batches may commit snapshots meanwhile.
    before = _snapshot_ids(table)
    if not _any_older(table, keep_from):  # nothing to expire (a young table): no Spark action planned for nothing
        result.steps.append("expire-snapshots")
    elif _step(
        table,
        result,
        "expire-snapshots",
        lambda: spark.sql(
            f"CALL {CATALOG}.system.expire_snapshots(table => '{table.identifier}', "
            f"older_than => TIMESTAMP '{_millis(keep_from.astimezone(dt.UTC))}+00:00', "
            f"retain_last => {settings.min_snapshots_to_keep})"
        ).collect(),
    ):
        result.expired_snapshots = len(before - _snapshot_ids(table))

    result.orphan_files_removed = _remove_orphans(
        table, now - dt.timedelta(seconds=duration_seconds(settings.orphan_file_age))
    )
    result.steps.append("orphans")
    return _finish(table, result, started)


def _small_files_of_one_batch_at_most(table: IcebergTable, small: int) -> bool:
    """Whether at most one commit added the live data files smaller than `small`. A young table's whole history
    tells, read through the Java API: fewer than two commits in it added data files at all (no Spark job); else the
    entries metadata table does (`_batches_with_small_files`)."""
    loaded = table.java()
    snapshot, adding = loaded.currentSnapshot(), 0
    for _ in range(HISTORY_WALKED):
        if snapshot is None:  # an expired snapshot: what it added is not known here
            break
        adding += int(snapshot.summary().get("added-data-files") or 0) > 0
        if adding >= 2:
            break
        if snapshot.parentId() is None:  # the table's first snapshot: the whole history was seen
            return True
        snapshot = loaded.snapshot(snapshot.parentId())
    return _batches_with_small_files(table, small) < 2


def _batches_with_small_files(table: IcebergTable, small: int) -> int:
    """How many commits added the live data files smaller than `small` bytes (compaction's candidates)."""
    rows = table.spark.sql(
        f"SELECT count(DISTINCT snapshot_id) AS n FROM {table.full_name}.entries "
        f"WHERE status < 2 AND data_file.content = 0 AND data_file.file_size_in_bytes < {small}"
    ).collect()
    return rows[0].n


def _any_older(table: IcebergTable, moment: dt.datetime) -> bool:
    """Whether the table holds a snapshot older than `moment`, which only expiry `older_than` it could remove, or an
    age limit on refs (`history.expire.max-ref-age-ms`), under which expiry also removes old refs."""
    loaded = table.java()
    if loaded.properties().get("history.expire.max-ref-age-ms") is not None:
        return True
    cutoff_ms = moment.timestamp() * 1000
    return any(snapshot.timestampMillis() < cutoff_ms for snapshot in loaded.snapshots())


def _snapshot_ids(table: IcebergTable) -> set[int]:
    return {snapshot.snapshotId() for snapshot in table.java().snapshots()}


def _finish(table: IcebergTable, result: MaintenanceResult, started: float) -> MaintenanceResult:
    result.data_files_after, result.delete_files_after = _file_counts(table)
    result.snapshots_after = len(_snapshot_ids(table))
    result.seconds = time.monotonic() - started
    log.info("%s", result)
    return result


def _remove_orphans(table: IcebergTable, older_than: dt.datetime) -> int:
    """Iceberg's action API (the SQL procedure refuses ages under 24 h). Safe without that check: the spec holds
    `orphanFileAge` at or above `runTimeout`, and a run older than that never publishes, so no unreferenced file
    this old can still become part of the table, even where runs and maintenance overlap (Glue)."""
    spark = table.spark
    jvm = jvm_gateway(spark)
    java_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table.full_name)
    action = jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession).deleteOrphanFiles(java_table)
    # List through the table's FileIO (S3FileIO on Glue), not Hadoop's FileSystem: off EMR there is no
    # FileSystem for s3:// (EMR has EMRFS), so the default listing would fail against a moto server.
    action = action.usePrefixListing(True)
    outcome = action.olderThan(int(older_than.timestamp() * 1000)).execute()
    return sum(1 for _ in outcome.orphanFileLocations())
