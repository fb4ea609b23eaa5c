"""An icefloe-managed Iceberg table as Spark sees it: creation, properties, schema evolution, snapshots and branches.

What icefloe records in a snapshot's summary (the offsets) is `commit_state`'s business, not this module's.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.errors import COMMIT_FAILED, ConfigError, java_classes
from icefloe.jvm_gateway import jvm_gateway
from icefloe.partitioning import PartitionField
from icefloe.table.catalog import CATALOG
from icefloe.table.refs import branch_name, new_run_id

log = logging.getLogger(__name__)
# Attempts of a refs change (create, drop or fast-forward a branch) that lost a commit race, each on the table
# reloaded; the delay before the next grows from REF_RETRY_DELAY_S, jittered so that racing runs spread out.
REF_COMMIT_ATTEMPTS = 6
REF_RETRY_DELAY_S = 0.2

# Managed-table defaults: format v2, zstd Parquet, ~128 MiB files,
# row-level changes as merge-on-read deletes (cheap upserts; compaction folds them away).
DEFAULT_PROPERTIES = {
    "format-version": "2",
    "write.format.default": "parquet",
    "write.parquet.compression-codec": "zstd",
    # A column's dictionary stops at 128 KiB (Iceberg's default 2 MiB); past it the column is written plain. Looking
    # values up in dictionaries of 100k entries took a third of a nested batch's CPU (measured with
    # bench/throughput.py's orders: -30% CPU at 128 KiB, files +17%; 256 KiB saved less for the same size, 64 KiB
    # little more for +26%); flat trades: no change in size.
    "write.parquet.dict-size-bytes": str(128 * 1024),
    "write.target-file-size-bytes": str(128 * 1024 * 1024),
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


def format_properties(version: int) -> dict[str, str]:
    """A table's format version at creation (`formatVersion`). At 3 a row-level MERGE (upsert) writes deletion vectors,
    one per data file that a write merges with the file's earlier one, so deletes never pile up in front of readers as
    v2's position-delete files do (bench/results/upsert.md); Spark (Iceberg >= 1.8), pyiceberg >= 0.10 and DuckDB >= 1.4
    read them."""
    return {"format-version": str(version)}


# Table loads from the catalog by kind (`exists`, `java`, `schema`): each reads the table's current metadata file.
# Counted for the per-batch cost (tests/operate/test_continuous.py, bench/continuous_cost.py); Spark's own loads for a
# write or a SQL statement are not counted here.
LOADS: Counter[str] = Counter()


def append_with_properties(frame: DataFrame, target: str, properties: Mapping[str, str]) -> None:
    """Append `frame` to `target` (a table or branch) in one snapshot whose summary carries `properties`."""
    writer = frame.writeTo(target)
    for key, value in properties.items():
        writer = writer.option(f"snapshot-property.{key}", value)
    writer.append()


# Iceberg's Spark class holding, per JVM thread, the properties the next commit of a SQL write puts in its summary.
COMMIT_METADATA = "org.apache.iceberg.spark.CommitMetadata"


def sql_with_properties(spark: SparkSession, statement: str, properties: Mapping[str, str]) -> None:
    """Run a SQL write (MERGE, UPDATE, DELETE) whose snapshot summary carries `properties`, as an append's does
    through its `snapshot-property.` options: Iceberg takes a SQL write's from `CommitMetadata`, one map per JVM
    thread, and Spark commits a SQL write on the thread that runs the statement, the JVM thread PySpark pins to this
    Python thread. (Iceberg's `CommitMetadata.withCommitProperties` would run the statement as a Java Callable, a Py4J
    callback into Python: the map is set here directly, and cleared whatever happens.) Where that map cannot be set
    (`_commit_properties`) the statement runs without `properties`: callers check the snapshot they got."""
    local = _commit_properties(spark)
    if local is None:
        spark.sql(statement)
        return
    extra = jvm_gateway(spark).java.util.HashMap()
    for key, value in properties.items():
        extra.put(key, value)
    local.set(extra)
    try:
        spark.sql(statement)
    finally:
        local.remove()


def _commit_properties(spark: SparkSession) -> Any:
    """Iceberg's per-thread map of a SQL write's commit properties; None where the gateway does not pin threads
    (PYSPARK_PIN_THREAD=false: the map could reach another thread's commit) or Iceberg's class is not as expected."""
    from py4j.clientserver import ClientServer  # type: ignore[import-untyped]  # py4j ships no types

    if not isinstance(spark.sparkContext._gateway, ClientServer):
        return None
    try:
        field = jvm_gateway(spark).py4j.reflection.ReflectionUtil.classForName(COMMIT_METADATA)
        field = field.getDeclaredField("COMMIT_PROPERTIES")
        field.setAccessible(True)
        return field.get(None)
    except Exception as error:  # another Iceberg: the write still happens, without the properties
        log.warning("%s is not as expected (%s): SQL writes commit without properties", COMMIT_METADATA, error)
        return None


@dataclass(frozen=True)
class SnapshotRecord:
    """One snapshot of a ref's history as a walk sees it, whichever API read it (Spark's Java table, pyiceberg)."""

    snapshot_id: int
    summary: Mapping[str, str | None] | None  # None: the snapshot was expired (the history breaks here)
    timestamp_ms: int = 0


class NotAnAncestor(Exception):
    """A fast-forward Iceberg refused: the target branch moved (another writer committed) since the source left it."""


class IcebergTable:
    def __init__(self, spark: SparkSession, identifier: str):
        self.spark = spark
        self.identifier = identifier  # database.table
        self.database, self.name = identifier.split(".")
        self.full_name = f"{CATALOG}.{identifier}"

    def exists(self) -> bool:
        LOADS["exists"] += 1
        catalog = self.spark._jsparkSession.sessionState().catalogManager().catalog(CATALOG).icebergCatalog()
        return catalog.tableExists(
            jvm_gateway(self.spark).org.apache.iceberg.catalog.TableIdentifier.parse(self.identifier)
        )

    def java(self):
        """The table through Iceberg's Java API, loaded from the catalog now (other writers commit: never cached).
        Reading refs, snapshots and their summaries here is a few calls, where a query of a metadata table would be
        a Spark job."""
        LOADS["java"] += 1
        return jvm_gateway(self.spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, self.full_name
        )

    def format_version(self) -> int:
        return int(self.java().operations().current().formatVersion())

    def table_property(self, name: str) -> str | None:
        found = self.java().properties().get(name)
        return None if found is None else str(found)

    def set_table_property(self, name: str, value: str) -> None:
        """Commit one table property (Iceberg retries it over other writers' commits)."""
        self.java().updateProperties().set(name, value).commit()

    def ensure(
        self,
        struct: T.StructType,
        partitions: tuple[PartitionField, ...],
        target_file_size_mb: int,
        first_summary: Mapping[str, str],
        properties: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
    ) -> bool:
        """Create the table (and its database) on first use, with a first, empty snapshot whose summary carries
        `first_summary`; True if it was created now. A table created by a run that died before that first snapshot
        gets it now. `properties`: over `DEFAULT_PROPERTIES`, at creation only (a callable is called then only: what
        costs a catalog call is not paid by every batch)."""
        if self.exists():
            if self.main_snapshot_id() is None:
                self._first_snapshot(first_summary)
            return False
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.`{self.database}`")
        jvm_type = jvm_gateway(self.spark).org.apache.spark.sql.types.DataType.fromJson(struct.json())
        properties = (
            DEFAULT_PROPERTIES
            | {"write.target-file-size-bytes": str(target_file_size_mb * 1024 * 1024)}
            | dict((properties() if callable(properties) else properties) or {})
        )
        props = ", ".join(f"'{k}'='{v}'" for k, v in properties.items())
        partitioned = f"PARTITIONED BY ({', '.join(p.spark_ddl() for p in partitions)})" if partitions else ""
        self.spark.sql(
            f"CREATE TABLE IF NOT EXISTS {self.full_name} ({jvm_type.toDDL()}) USING iceberg {partitioned} "
            f"TBLPROPERTIES ({props})"
        )
        self._first_snapshot(first_summary)  # gives every later commit a base to branch from
        return True

    def _first_snapshot(self, summary: Mapping[str, str]) -> None:
        """Give main its first, empty snapshot carrying `summary`, unless main has one by then. Another run may have
        created the table meanwhile and committed a batch: a plain append would land on that batch and hide its
        checkpoint. So the snapshot is written to a branch of its own, and main is created at it only where main
        still does not exist (Iceberg refuses to create a ref that exists; a lost commit race is re-checked)."""
        staging = branch_name(new_run_id())  # a leftover (a crash right here) is dropped as any dead run's branch
        append = self.java().newFastAppend()
        for key, value in summary.items():
            append = append.set(key, value)
        append.toBranch(staging).commit()

        def publish(table):
            refs = table.manageSnapshots()
            if not table.refs().containsKey("main"):
                refs = refs.createBranch("main", table.refs().get(staging).snapshotId())
            return refs.removeBranch(staging)

        self._change_refs(publish)

    def evolve(self, struct: T.StructType) -> list[str]:
        """Bring the table's schema up to `struct` (new fields, widened types); returns the ALTER clauses made. The
        new fields are added by one statement, one metadata commit (a new schemaless table gets all its columns at
        once). Another run may make the same change between this run's reading the schema and its ALTER, which then
        fails ("already exists"): the schema is read again and only what is still missing is changed."""
        made: list[str] = []
        statements = _alter_statements(schema_changes(self.schema(), struct))
        while statements:
            statement = statements.pop(0)
            try:
                self.spark.sql(f"ALTER TABLE {self.full_name} {statement}")
                made.append(statement)
            except Exception:
                statements = _alter_statements(schema_changes(self.schema(), struct))
                if statement in statements:  # not another run's doing
                    raise
                log.info("%s: schema change made meanwhile by another run: %s", self.identifier, statement)
        return made

    def last_run_evolved(self, run_key: str, walked: int = 20) -> bool:
        """Whether the last run's snapshots on main (the latest ones whose summary `run_key` is the head's) were
        written with another schema than the snapshot before them (that run changed the table's columns); True where
        no such snapshot is found within `walked` snapshots."""
        table = self.java()
        snapshot = table.currentSnapshot()
        if snapshot is None:
            return True
        run, schema = snapshot.summary().get(run_key), snapshot.schemaId()
        for _ in range(walked):
            parent = snapshot.parentId()
            snapshot = table.snapshot(parent) if parent is not None else None
            if snapshot is None:
                return True
            if snapshot.summary().get(run_key) != run:
                return snapshot.schemaId() != schema
        return True

    def schema(self) -> T.StructType:
        """The table's current columns."""
        LOADS["schema"] += 1
        return self.spark.table(self.full_name).schema

    def main_snapshot_id(self) -> int | None:
        return self.ref_snapshot_id("main")

    def ref_snapshot_id(self, ref: str, loaded=None) -> int | None:
        """The snapshot a branch or tag points at; None if there is no such ref. `loaded`: the table as `java()`
        gave it, to read several things from one load."""
        return _ref_snapshot_id(self.java() if loaded is None else loaded, ref)

    def lineage(self, ref: str, base_snapshot_id: int, loaded=None) -> list[int] | None:
        """The snapshots from `ref`'s head down to `base_snapshot_id` (both included), or None when `ref` is gone
        or does not descend from that base."""
        table = self.java() if loaded is None else loaded
        snapshot, chain = _ref_snapshot_id(table, ref), []
        while snapshot is not None:
            chain.append(snapshot)
            if snapshot == base_snapshot_id:
                return chain
            found = table.snapshot(snapshot)
            snapshot = found.parentId() if found is not None else None
        return None

    def ancestry(self, ref: str, keys: Iterable[str]) -> Iterator[SnapshotRecord]:
        """`ref`'s history, head first, each snapshot with the summary `keys` (absent ones None); an expired
        snapshot ends it (its record has no summary). Lazy: one Py4J look-up per snapshot walked."""
        table = self.java()
        snapshot = _ref_snapshot_id(table, ref)
        while snapshot is not None:
            row = table.snapshot(snapshot)
            if row is None:
                yield SnapshotRecord(snapshot, None)
                return
            summary = row.summary()
            yield SnapshotRecord(snapshot, {key: summary.get(key) for key in keys}, row.timestampMillis())
            snapshot = row.parentId()

    def snapshot_summary(self, snapshot_id: int) -> dict[str, str]:
        snapshot = self.java().snapshot(int(snapshot_id))
        return dict(snapshot.summary()) if snapshot is not None else {}

    def metadata_location(self) -> str:
        return self.java().operations().current().metadataFileLocation()

    def branches(self, prefix: str) -> list[str]:
        refs = self.java().refs()
        return [name for name in refs.keySet() if name.startswith(prefix) and refs.get(name).isBranch()]

    def create_branch(self, name: str, snapshot_id: int) -> None:
        self._change_refs(lambda table: table.manageSnapshots().createBranch(name, int(snapshot_id)))

    def drop_branch(self, name: str) -> None:
        """Drop the branch if it exists (another run may have dropped it already)."""

        def remove(table):
            return table.manageSnapshots().removeBranch(name) if table.refs().containsKey(name) else None

        try:
            self._change_refs(remove)
        except Exception as error:  # dropped meanwhile
            if "does not exist" not in str(error):
                raise

    def fast_forward(self, target: str, source: str) -> int:
        """Move branch `target` to `source`'s head, which must descend from it: Iceberg refuses otherwise ("not an
        ancestor"), also when another writer moved `target` meanwhile; returns `target`'s new head."""
        try:
            table = self._change_refs(lambda table: table.manageSnapshots().fastForwardBranch(target, source))
        except Exception as error:
            # Iceberg says "not an ancestor" only as a Preconditions IllegalArgumentException, one type for every
            # refused argument: its text is the one thing that tells, read here only.
            if "java.lang.IllegalArgumentException" in java_classes(error) and "not an ancestor" in str(error):
                raise NotAnAncestor(f"{self.identifier}: {target} is not an ancestor of {source}") from None
            raise
        return _ref_snapshot_id(table, target)  # type: ignore[return-value]  # the branch was just moved, so it exists

    def _change_refs(self, change: Callable[[Any], Any]) -> Any:
        """Commit `change(table)` (a `ManageSnapshots`, or None for nothing to do) on the table loaded now; returns
        that table. Iceberg retries a refs commit that lost a race against the metadata it first read, which fails
        every time ("Table metadata refresh is required"): on Glue, any other writer's commit in between (another
        run's branch append, create or drop) failed the run. So a lost race (`CommitFailedException`: nothing was
        committed) is retried here on the table reloaded, where the change is checked again (a fast-forward whose
        target moved is refused)."""
        attempt = 1
        while True:
            table = self.java()
            update = change(table)
            if update is None:
                return table
            try:
                update.commit()
                return table
            except Exception as error:
                if COMMIT_FAILED not in java_classes(error) or attempt == REF_COMMIT_ATTEMPTS:
                    raise
            delay = REF_RETRY_DELAY_S * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
            log.info(
                "%s: a refs commit lost a race with another writer (attempt %d of %d), retried in %.1fs on the "
                "table as it is then",
                self.identifier,
                attempt,
                REF_COMMIT_ATTEMPTS,
                delay,
            )
            time.sleep(delay)
            attempt += 1


def _ref_snapshot_id(table, ref: str) -> int | None:
    found = table.refs().get(ref)
    return found.snapshotId() if found is not None else None


_WIDENINGS = {("int", "bigint"), ("float", "double")}
_ADD = "ADD COLUMN "  # `schema_changes`' clause for a new field


def schema_changes(current: T.StructType, desired: T.StructType, path: str = "") -> list[str]:
    """ALTER TABLE clauses that evolve `current` toward `desired`: new columns, nested fields (in structs, and in
    structs inside lists and maps) and the type promotions Iceberg allows. Columns the new schema lacks stay
    (`conformed` fills them with nulls)."""
    changes = []
    have = {f.name.lower(): f for f in current.fields}
    for field in desired.fields:
        name = f"{path}{quoted(field.name)}"
        old = have.get(field.name.lower())
        if old is None:
            changes.append(f"{_ADD}{name} {sql_type(field.dataType)}")
        else:
            changes.extend(_type_changes(old.dataType, field.dataType, name))
    return changes


def _alter_statements(changes: list[str]) -> list[str]:
    """`schema_changes`' clauses as ALTER TABLE statements: every new field in one `ADD COLUMNS` (Iceberg commits a
    statement's changes together), each type change alone (Spark alters one column per statement)."""
    added = [change.removeprefix(_ADD) for change in changes if change.startswith(_ADD)]
    altered = [change for change in changes if not change.startswith(_ADD)]
    return ([f"ADD COLUMNS ({', '.join(added)})"] if added else []) + altered


def _type_changes(old: T.DataType, new: T.DataType, name: str) -> list[str]:
    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        return schema_changes(old, new, f"{name}.")
    if isinstance(old, T.ArrayType) and isinstance(new, T.ArrayType):  # Iceberg names a list's element `element`
        return _type_changes(old.elementType, new.elementType, f"{name}.element")
    if isinstance(old, T.MapType) and isinstance(new, T.MapType) and old.keyType == new.keyType:
        return _type_changes(old.valueType, new.valueType, f"{name}.value")
    pair = (old.simpleString(), new.simpleString())
    if pair[0] == pair[1]:
        return []
    widening = pair in _WIDENINGS or (
        isinstance(old, T.DecimalType)
        and isinstance(new, T.DecimalType)
        and old.scale == new.scale
        and new.precision > old.precision
    )
    if not widening:
        raise ConfigError(f"column {name.replace('`', '')} changed from {pair[0]} to {pair[1]}: not a safe evolution")
    return [f"ALTER COLUMN {name} TYPE {pair[1]}"]


def conformed(frame: DataFrame, table: T.StructType, keep: tuple[str, ...] = ()) -> DataFrame:
    """`frame` as the table's columns, in the table's order (then the `keep` columns): a column or nested field the
    batch lacks (a field a newer value schema removed; the table keeps it) is null, narrower types are widened."""
    have = {f.name.lower(): f for f in frame.schema.fields}
    columns = []
    for field in table.fields:
        source = have.get(field.name.lower())
        column = F.lit(None) if source is None else _fit(F.col(quoted(source.name)), source.dataType, field.dataType)
        columns.append(column.cast(field.dataType).alias(field.name))
    return frame.select(*columns, *keep)


def _fit(column: Column, source: T.DataType, target: T.DataType) -> Column:
    if source.simpleString() == target.simpleString():  # the same but for nullability: the writer takes it
        return column
    if isinstance(source, T.StructType) and isinstance(target, T.StructType):
        have = {f.name.lower(): f for f in source.fields}
        fields = []
        for field in target.fields:
            found = have.get(field.name.lower())
            value = F.lit(None) if found is None else _fit(column[found.name], found.dataType, field.dataType)
            fields.append(value.cast(field.dataType).alias(field.name))
        return F.when(column.isNotNull(), F.struct(*fields))
    if isinstance(source, T.ArrayType) and isinstance(target, T.ArrayType):
        return F.transform(column, lambda item: _fit(item, source.elementType, target.elementType))
    if isinstance(source, T.MapType) and isinstance(target, T.MapType):
        return F.transform_values(column, lambda _, item: _fit(item, source.valueType, target.valueType))
    return column.cast(target)


def quoted(name: str) -> str:
    """A column or nested field name as Spark SQL reads it, whatever characters it holds."""
    return "`" + name.replace("`", "``") + "`"


def sql_type(dtype: T.DataType) -> str:
    """`dtype` in Spark SQL with every nested field name quoted (`simpleString` leaves them bare)."""
    if isinstance(dtype, T.StructType):
        return "struct<" + ", ".join(f"{quoted(f.name)}: {sql_type(f.dataType)}" for f in dtype.fields) + ">"
    if isinstance(dtype, T.ArrayType):
        return f"array<{sql_type(dtype.elementType)}>"
    if isinstance(dtype, T.MapType):
        return f"map<{sql_type(dtype.keyType)}, {sql_type(dtype.valueType)}>"
    return dtype.simpleString()
