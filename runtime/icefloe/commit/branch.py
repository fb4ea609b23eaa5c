"""The exactly-once commit protocol: data and offsets land in main together, or not at all.

A batch is written to a private branch created at the snapshot whose offsets it started from; main is then
fast-forwarded to the branch. Iceberg refuses the fast-forward when main has moved since (another writer
committed), so two runs can never both commit the same offsets: the loser gets `CommitConflict`, its data never
becomes visible, and the next run re-plans from what main holds. The catalog's atomic metadata swap makes the
fast-forward the single commit point; a crash before it leaves main untouched.

Runs of one table may overlap (a scheduler fires while a long batch still runs), so a run only drops branches that
are provably dead: a run id carries its start, and a run older than `runTimeout` never publishes (it checks before
its fast-forward), so a branch whose run started longer ago than that can be dropped. And because a branch may be
dropped under a run all the same (another host's clock ahead; Spark then refuses to write to it, Iceberg's Java API
would recreate it from main's head), the publish step verifies the branch's lineage: main is still the base the
offsets were planned from, and every snapshot the run wrote is on the branch above that base.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession

from icefloe.commit.checkpoint import Checkpoint, append_with_checkpoint
from icefloe.errors import CommitConflict, RunTimedOut
from icefloe.table.iceberg import IcebergTable, NotAnAncestor, conformed, sql_with_properties

# Run ids and branch names live with the table (its creation stages on a run branch); re-exported for the callers.
from icefloe.table.refs import BRANCH_PREFIX, branch_name, run_started

log = logging.getLogger(__name__)
Written = TypeVar("Written")
# How long a run may take before other runs may drop its branch (the table's `runTimeout`, spec's default).
DEFAULT_RUN_TIMEOUT_S = 12 * 3600


@dataclass
class Branch:
    """A run's private branch: all a writer is given. Appends through it carry the run's checkpoint."""

    table: IcebergTable
    name: str
    checkpoint: Checkpoint
    checkpointed: bool = False  # a snapshot on the branch carries the checkpoint
    written: list[int] = field(default_factory=list)  # the branch's head after each write: all must be published
    added: int = 0  # rows the last write added (its snapshot's `added-records`)

    @property
    def spark(self) -> SparkSession:
        return self.table.spark

    @property
    def identifier(self) -> str:
        """What Spark writes to: `catalog.database.table.branch_<name>`."""
        return f"{self.table.full_name}.branch_{self.name}"

    def append(self, frame: DataFrame) -> None:
        """Append `frame`, as the table's columns, in one snapshot that carries the checkpoint."""
        try:
            append_with_checkpoint(conformed(frame, self.table.schema()), self.identifier, self.checkpoint)
        except Exception:
            if self.table.ref_snapshot_id(self.name) is None:  # Spark refuses to write to a dropped branch
                raise CommitConflict(
                    f"table {self.table.identifier}: branch {self.name} was dropped while being "
                    "written; nothing was committed, the batch will be re-planned"
                ) from None
            raise
        self.checkpointed = True
        self.wrote()

    def sql(self, statement: str) -> None:
        """Run a SQL write on the branch (a MERGE, UPDATE or DELETE naming `identifier`) in one snapshot that carries
        the checkpoint, as `append` does: the publish then needs no empty append to carry it."""
        sql_with_properties(self.spark, statement, self.checkpoint.to_summary())
        summary = self.wrote()
        # A write whose snapshot could not carry it (`sql_with_properties`) leaves it to the empty append.
        self.checkpointed |= self.checkpoint.carried_by(summary)

    def wrote(self) -> Mapping[str, str]:
        """Note the branch's head after a write (every writer calls this after each statement that commits);
        returns the head's summary."""
        loaded = self.table.java()  # one load for the head and what it added
        head = self.table.ref_snapshot_id(self.name, loaded)
        if head is None:
            raise CommitConflict(f"table {self.table.identifier}: branch {self.name} was dropped while being written")
        self.written.append(head)
        summary = loaded.snapshot(head).summary()
        self.added = int(summary.get("added-records") or 0)
        return summary

    def rows_appended(self) -> int:
        """The rows the last `append` added."""
        return self.added


def drop_stale_branches(table: IcebergTable, run_timeout_s: float, now: float | None = None) -> list[str]:
    """Drop branches of runs that started more than `run_timeout_s` ago: such a run can no longer publish (see
    `commit_on_branch`), so its branch holds nothing that will ever be visible. Younger runs may still be writing;
    a branch whose name does not say when its run started is kept (it cannot be proven dead). Returns the runs'
    branches kept."""
    now = time.time() if now is None else now
    kept = []
    for branch in table.branches(BRANCH_PREFIX):
        started = run_started(branch[len(BRANCH_PREFIX) :])
        if started is None or now - started <= run_timeout_s:
            kept.append(branch)
            continue
        log.info("%s: dropping branch %s left by a run that started %.0fs ago", table.identifier, branch, now - started)
        table.drop_branch(branch)
    return kept


def verify_publishable(branch: Branch, base_snapshot_id: int, run_timeout_s: float) -> None:
    """Refuse to publish unless the run is younger than its timeout (older runs' branches may be dropped by
    others), main is still `base_snapshot_id` (the snapshot the offsets were planned from), and the branch descends
    from that base through every snapshot the run wrote (a dropped and recreated branch would not)."""
    table = branch.table
    started = run_started(branch.checkpoint.run_id or "")
    if started is not None and time.time() - started > run_timeout_s:
        raise RunTimedOut(
            f"table {table.identifier}: run {branch.checkpoint.run_id} is older than runTimeout "
            f"({run_timeout_s:.0f}s); its branch may have been dropped, nothing was committed, the batch will be re-planned",
            branch.checkpoint.throughput.records if branch.checkpoint.throughput is not None else 0,
        )
    loaded = table.java()  # main and the branch as of one load
    main = table.ref_snapshot_id("main", loaded)
    if main != base_snapshot_id:
        raise CommitConflict(
            f"table {table.identifier}: another writer committed (main is at snapshot {main}, this batch was planned "
            f"from {base_snapshot_id}); nothing was committed, the batch will be re-planned"
        )
    lineage = table.lineage(branch.name, base_snapshot_id, loaded)
    if lineage is None or any(snapshot not in lineage for snapshot in branch.written):
        raise CommitConflict(
            f"table {table.identifier}: branch {branch.name} no longer holds this run's writes above snapshot "
            f"{base_snapshot_id} (dropped by another run?); nothing was committed, the batch will be re-planned"
        )


def commit_on_branch(
    table: IcebergTable,
    base_snapshot_id: int,
    checkpoint: Checkpoint,
    write: Callable[[Branch], Written],
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
) -> tuple[int, Written]:
    """Run `write(branch)` on the run's branch at `base_snapshot_id`, make sure the branch carries `checkpoint`,
    verify the branch may be published (`verify_publishable`), then publish it; returns main's new snapshot and
    what `write` returned."""
    if checkpoint.run_id is None:
        raise ValueError("a commit's checkpoint names the run that writes it")
    # A branch per attempt: a run writes again after an attempt it discarded (the JVM path's re-read, the DLQ), and
    # that attempt's branch may not have been dropped. The name still begins with the run's start (the age rule).
    branch = Branch(table, branch_name(f"{checkpoint.run_id}_{uuid.uuid4().hex[:8]}"), checkpoint)
    table.create_branch(branch.name, base_snapshot_id)
    # Each step logs as it starts: an operator (and the crash tests) can tell where a run stopped.
    log.info("%s: writing the batch on branch %s (from snapshot %d)", table.identifier, branch.name, base_snapshot_id)
    try:
        written = write(branch)
        if not branch.checkpointed:  # a write that carried none (or none at all): it rides on an empty append
            branch.append(table.spark.createDataFrame([], table.schema()))
        log.info("%s: publishing branch %s (snapshot %d) to main", table.identifier, branch.name, branch.written[-1])
        verify_publishable(branch, base_snapshot_id, run_timeout_s)
        try:
            published = table.fast_forward("main", branch.name)
            log.info("%s: published branch %s: main is at snapshot %d", table.identifier, branch.name, published)
            return published, written
        except NotAnAncestor:
            raise CommitConflict(
                f"table {table.identifier}: another writer committed while this batch was written; "
                "nothing was committed, the batch will be re-planned"
            ) from None
    finally:
        try:
            table.drop_branch(branch.name)
        except Exception as error:  # best effort: a leftover branch is dropped by the next run
            log.warning("%s: could not drop branch %s: %s", table.identifier, branch.name, error)
