"""The exactly-once commit protocol: data and offsets land in main together, or not at all.

A batch is written to a private branch created at the snapshot whose offsets it started from; main is then
fast-forwarded to the branch. Iceberg refuses the fast-forward when main has moved since (another writer
committed), so two runs can never both commit the same offsets: the loser gets `CommitConflict`, its data never
becomes visible, and the next run re-plans from what main holds. The catalog's atomic metadata swap makes the
fast-forward the single commit point; a crash before it leaves main untouched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, TypeVar

from pyspark.sql import DataFrame, SparkSession

from .catalog import CATALOG
from .commit_state import Checkpoint, append_with_checkpoint, rows_added_by_run
from .errors import CommitConflict
from .iceberg_table import IcebergTable

log = logging.getLogger(__name__)
BRANCH_PREFIX = "icefloe_run_"
Written = TypeVar("Written")


def branch_name(run_id: str) -> str:
    """The private branch of one run (and what `drop_stale_branches` recognizes)."""
    return f"{BRANCH_PREFIX}{run_id}"


@dataclass
class Branch:
    """A run's private branch: all a writer is given. Appends through it carry the run's checkpoint."""

    table: IcebergTable
    name: str
    checkpoint: Checkpoint
    checkpointed: bool = False  # a snapshot on the branch carries the checkpoint

    @property
    def spark(self) -> SparkSession:
        return self.table.spark

    @property
    def identifier(self) -> str:
        """What Spark writes to: `catalog.database.table.branch_<name>`."""
        return f"{self.table.full_name}.branch_{self.name}"

    def append(self, frame: DataFrame) -> None:
        """Append `frame` in one snapshot that carries the checkpoint."""
        append_with_checkpoint(frame, self.identifier, self.checkpoint)
        self.checkpointed = True

    def rows_appended(self) -> int:
        """The rows `append` added."""
        return rows_added_by_run(self.table, self.checkpoint.run_id)


def drop_stale_branches(table: IcebergTable) -> None:
    """Branches left by runs that crashed before their fast-forward hold nothing visible: drop them."""
    for branch in table.branches(BRANCH_PREFIX):
        log.info("%s: dropping branch %s left by an interrupted run", table.identifier, branch)
        table.spark.sql(f"ALTER TABLE {table.full_name} DROP BRANCH IF EXISTS `{branch}`")


def commit_on_branch(
    table: IcebergTable, base_snapshot_id: int, checkpoint: Checkpoint, write: Callable[[Branch], Written]
) -> tuple[int, Written]:
    """Run `write(branch)` on the run's branch at `base_snapshot_id`, make sure the branch carries `checkpoint`,
    then publish it; returns main's new snapshot and what `write` returned."""
    if checkpoint.run_id is None:
        raise ValueError("a commit's checkpoint names the run that writes it")
    branch = Branch(table, branch_name(checkpoint.run_id), checkpoint)
    spark = table.spark
    spark.sql(f"ALTER TABLE {table.full_name} CREATE BRANCH `{branch.name}` AS OF VERSION {int(base_snapshot_id)}")
    try:
        written = write(branch)
        if not branch.checkpointed:  # e.g. after a MERGE: the checkpoint rides on an empty append
            branch.append(spark.createDataFrame([], spark.table(table.full_name).schema))
        try:
            result = spark.sql(
                f"CALL {CATALOG}.system.fast_forward('{table.identifier}', 'main', '{branch.name}')"
            ).collect()
        except Exception as error:
            if "not an ancestor" in str(error):
                raise CommitConflict(
                    f"table {table.identifier}: another writer committed while this batch was written; "
                    "nothing was committed, the batch will be re-planned"
                ) from None
            raise
        return result[0].updated_ref, written
    finally:
        try:
            spark.sql(f"ALTER TABLE {table.full_name} DROP BRANCH IF EXISTS `{branch.name}`")
        except Exception as error:  # best effort: a leftover branch is dropped by the next run
            log.warning("%s: could not drop branch %s: %s", table.identifier, branch.name, error)
