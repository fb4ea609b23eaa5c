"""Where a table has read its topic up to: the checkpoint a snapshot's summary carries, written and read here only.

A commit's snapshot summary records the topic and its Kafka topic id, the next offset per partition, the run that
wrote it, any ranges deleted from the topic before they were read (like the Iceberg Kafka Connect sink's commit
state) and, in an upsert table, each partition's clock (`upsert`). The newest snapshot in main's ancestry that
carries a checkpoint is where the next run resumes; maintenance commits carry none and are walked past. A walk that runs into an expired snapshot before it finds a checkpoint
stops the table (`CheckpointLost`) rather than start over; maintenance keeps the snapshot the walk finds. Writers never see these keys: they write through their run's branch
(`commit.Branch`), which attaches the checkpoint.

To record something more per commit, add a field to `Checkpoint` and its key to `to_summary`/`from_summary`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import TypeVar

from pyspark.sql import DataFrame

from icefloe.errors import COMMIT_FAILED, VALIDATION_FAILED, CheckpointLost, CommitConflict, ConfigError, java_classes
from icefloe.source.kafka import TRUNCATED, LostRange
from icefloe.table.iceberg import (
    IcebergTable,
    NotAnAncestor,
    SnapshotRecord,
    append_with_properties,
    sql_with_properties,
)
from icefloe.table.refs import BRANCH_PREFIX, new_run_id

OFFSETS_KEY = "icefloe.offsets"
TOPIC_KEY = "icefloe.topic"
RUN_ID_KEY = "icefloe.run-id"
TOPIC_ID_KEY = "icefloe.topic-id"  # the Kafka topic id the offsets belong to (a recreated topic has a new one)
DATA_LOSS_KEY = "icefloe.data-loss"  # ranges deleted before they were read (onDataLoss: warn), as JSON
CARRIED_KEY = "icefloe.carried-from"  # on a maintenance commit: the snapshot whose checkpoint it carries forward
THROUGHPUT_KEY = "icefloe.throughput"  # the batch's size and start, as JSON (see `Throughput`)
LEADER_EPOCHS_KEY = (
    "icefloe.leader-epochs"  # per partition, a leader epoch whose log held the offsets (truncation check)
)
CLOCKS_KEY = "icefloe.partition-clocks"  # upsert: each partition's clock at its next offset (epoch ms), as JSON
# Where the broker reports no topic id: per partition, [offset, timestamp ms] of a record read (truncation check)
KNOWN_RECORDS_KEY = "icefloe.known-records"
Found = TypeVar("Found")
SUMMARY_KEYS = (
    OFFSETS_KEY,
    TOPIC_KEY,
    RUN_ID_KEY,
    TOPIC_ID_KEY,
    DATA_LOSS_KEY,
    CARRIED_KEY,
    THROUGHPUT_KEY,
    LEADER_EPOCHS_KEY,
    CLOCKS_KEY,
    KNOWN_RECORDS_KEY,
)
CARRY_ATTEMPTS = 3
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Throughput:
    """What a batch read (records; bytes of keys and values, from the mean of a sample), when it started (epoch ms)
    and whether its budget cut it (more was pending): its snapshot's commit time ends the measurement, the rate the
    next batch is sized by (`budget`)."""

    records: int
    bytes: int
    started_ms: int
    cut: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {"records": self.records, "bytes": self.bytes, "started_ms": self.started_ms, "cut": self.cut}
        )

    @classmethod
    def from_json(cls, text: str) -> Throughput:
        found = json.loads(text)
        return cls(int(found["records"]), int(found["bytes"]), int(found["started_ms"]), bool(found.get("cut")))


@dataclass(frozen=True)
class Checkpoint:
    """What a commit records: the topic, the next offset per partition once committed, the run, the topic's id and
    the ranges lost to retention before they were read."""

    topic: str | None
    offsets: dict[int, int] = field(default_factory=dict)
    run_id: str | None = None  # None on the table's first, empty snapshot
    topic_id: str | None = None  # None where the broker reports none
    lost: tuple[LostRange, ...] = ()
    carried_from: int | None = None  # a copy carried forward by maintenance: the snapshot a batch wrote it in
    throughput: Throughput | None = None  # the batch's measurement (None on maintenance copies and older commits)
    leader_epochs: dict[int, int] = field(default_factory=dict)  # per partition, when the broker reports them
    clocks: dict[int, int] = field(default_factory=dict)  # upsert: the highest timestamp (ms) read per partition
    known_records: dict[int, tuple[int, int]] = field(default_factory=dict)  # `kafka_source.Plan.known_records`

    def to_summary(self) -> dict[str, str]:
        summary = {OFFSETS_KEY: json.dumps({str(p): o for p, o in self.offsets.items()})}
        if self.topic is not None:
            summary[TOPIC_KEY] = self.topic
        if self.run_id is not None:
            summary[RUN_ID_KEY] = self.run_id
        if self.topic_id:
            summary[TOPIC_ID_KEY] = self.topic_id
        if self.lost:
            summary[DATA_LOSS_KEY] = json.dumps(lost_as_json(self.lost))
        if self.carried_from is not None:
            summary[CARRIED_KEY] = str(self.carried_from)
        if self.throughput is not None:
            summary[THROUGHPUT_KEY] = self.throughput.to_json()
        if self.leader_epochs:
            summary[LEADER_EPOCHS_KEY] = json.dumps({str(p): e for p, e in self.leader_epochs.items()})
        if self.clocks:
            summary[CLOCKS_KEY] = json.dumps({str(p): c for p, c in self.clocks.items()})
        if self.known_records:
            summary[KNOWN_RECORDS_KEY] = json.dumps({str(p): list(r) for p, r in self.known_records.items()})
        return summary

    def carried_by(self, summary: Mapping[str, str]) -> bool:
        """Whether a snapshot's summary carries this checkpoint (a SQL write's may not: `sql_with_properties`)."""
        return all(summary.get(key) == value for key, value in self.to_summary().items())

    @classmethod
    def from_summary(cls, summary: Mapping[str, str | None]) -> Checkpoint | None:
        """The checkpoint a snapshot summary carries, or None (a maintenance commit carries none)."""
        offsets = summary.get(OFFSETS_KEY)
        if offsets is None:
            return None
        return cls(
            topic=summary.get(TOPIC_KEY),
            offsets={int(p): int(o) for p, o in json.loads(offsets).items()},
            run_id=summary.get(RUN_ID_KEY),
            topic_id=summary.get(TOPIC_ID_KEY),
            lost=tuple(LostRange(**r) for r in json.loads(summary.get(DATA_LOSS_KEY) or "[]")),
            carried_from=int(copied_from) if (copied_from := summary.get(CARRIED_KEY)) else None,
            throughput=Throughput.from_json(measured) if (measured := summary.get(THROUGHPUT_KEY)) else None,
            leader_epochs={int(p): int(e) for p, e in json.loads(summary.get(LEADER_EPOCHS_KEY) or "{}").items()},
            clocks={int(p): int(c) for p, c in json.loads(summary.get(CLOCKS_KEY) or "{}").items()},
            known_records={
                int(p): (int(o), int(t)) for p, (o, t) in json.loads(summary.get(KNOWN_RECORDS_KEY) or "{}").items()
            },
        )

    def carried(self, snapshot_id: int) -> Checkpoint:
        """This checkpoint (found in `snapshot_id`) as a maintenance commit carries it: the same position, without
        the run, the lost ranges and the measurement, which belong to the batch that wrote it."""
        carried_from = snapshot_id if self.carried_from is None else self.carried_from
        return replace(self, run_id=None, lost=(), throughput=None, carried_from=carried_from)


def furthest(found: list[tuple[Checkpoint, Found]]) -> tuple[Checkpoint, Found]:
    """Of the checkpoints a walk of main's history met, from the head down to the first one a batch wrote (copies
    carried by maintenance above it), the one furthest into the topic. Offsets only grow along main's history, and
    a copy may be older than its parent: maintenance read the checkpoint, then a batch committed, then maintenance
    committed on top. The batch's own checkpoint wins a tie."""
    return max(reversed(found), key=lambda item: sum(item[0].offsets.values()))


def lost_as_json(lost: tuple[LostRange, ...]) -> list[dict]:
    """Lost ranges as the summary and the run's report give them (`kind` only on a truncation: a range without it
    was deleted before it was read)."""
    return [
        {"partition": r.partition, "start": r.start, "end": r.end} | ({"kind": r.kind} if r.kind == TRUNCATED else {})
        for r in lost
    ]


@dataclass(frozen=True)
class CommittedState:
    """Main's current snapshot (the next commit's base) and the newest checkpoint in its ancestry."""

    snapshot_id: int | None
    checkpoint: Checkpoint | None = None
    checkpoint_snapshot_id: int | None = None  # the snapshot in main's ancestry that carries `checkpoint`
    checkpoint_committed_at: dt.datetime | None = None  # when it was committed (UTC)

    @property
    def offsets(self) -> dict[int, int]:
        """The next Kafka offset per partition; empty when nothing was committed yet."""
        return dict(self.checkpoint.offsets) if self.checkpoint is not None else {}

    @property
    def topic_id(self) -> str | None:
        """The Kafka topic id the offsets belong to, if recorded."""
        return self.checkpoint.topic_id if self.checkpoint is not None else None

    @property
    def leader_epochs(self) -> dict[int, int]:
        """Per partition, a leader epoch whose log held the committed offsets (empty if none was recorded)."""
        return dict(self.checkpoint.leader_epochs) if self.checkpoint is not None else {}

    @property
    def known_records(self) -> dict[int, tuple[int, int]]:
        """Per partition, a record the table read, where the broker reports no topic id (`kafka_source.rewritten`)."""
        return dict(self.checkpoint.known_records) if self.checkpoint is not None else {}


def resume_point(history: Iterable[SnapshotRecord], identifier: str) -> tuple[Checkpoint, SnapshotRecord] | None:
    """The one walk of a ref's `history` (head first): the checkpoint to resume from, the furthest met down to the
    first one a batch wrote (`furthest`), with the snapshot carrying it; None when the history carries none. Raises
    `CheckpointLost` when the history breaks at an expired snapshot before any checkpoint (a carried copy met
    before the break stands for the history below it)."""
    found: list[tuple[Checkpoint, SnapshotRecord]] = []
    for snapshot in history:
        if snapshot.summary is None:
            if found:
                break
            raise CheckpointLost(
                f"table {identifier}: snapshot {snapshot.snapshot_id} in main's history was expired before a "
                "snapshot carrying icefloe's offsets was found; where to resume reading is unknown, so nothing is "
                "read (restore the table's history, or recreate the table)"
            )
        checkpoint = Checkpoint.from_summary(snapshot.summary)
        if checkpoint is not None:
            found.append((checkpoint, snapshot))
            if checkpoint.carried_from is None:
                break
    return furthest(found) if found else None


def committed_state(table: IcebergTable, topic: str) -> CommittedState:
    """Walk main's ancestry to the newest snapshot carrying a checkpoint, which must be for `topic`. Raises
    `CheckpointLost` when the walk breaks at an expired snapshot, or ends without a checkpoint on a table with data."""
    history = table.ancestry("main", (*SUMMARY_KEYS, "total-records"))
    head = next(history, None)
    if head is None:
        return CommittedState(None)
    resume = resume_point(chain([head], history), table.identifier)
    if resume is not None:
        checkpoint, carrier = resume
        committed_at = dt.datetime.fromtimestamp(carrier.timestamp_ms / 1000, dt.UTC)
        return CommittedState(
            head.snapshot_id, for_topic(checkpoint, table.identifier, topic), carrier.snapshot_id, committed_at
        )
    if int((head.summary or {}).get("total-records") or 0) > 0:
        raise CheckpointLost(
            f"table {table.identifier} holds rows but no snapshot in main's history carries icefloe's offsets; "
            "where to resume reading is unknown, so nothing is read"
        )
    return CommittedState(head.snapshot_id)


def for_topic(checkpoint: Checkpoint, identifier: str, topic: str) -> Checkpoint:
    """`checkpoint`, if it is for `topic`: a table holds one topic for life."""
    if checkpoint.topic not in (None, topic):
        raise ConfigError(
            f"table {identifier} holds topic {checkpoint.topic!r}, but the config now names {topic!r}; "
            "declare a new table for a different topic"
        )
    return checkpoint


def carry_checkpoint(table: IcebergTable, topic: str) -> None:
    """Put a copy of the table's checkpoint on main's head (an empty commit), so that it stays reachable from the head
    whatever maintenance expires below. The copy is written on a branch at the head it was read from and published
    by fast-forward, like a batch: a batch that publishes meanwhile makes Iceberg refuse the fast-forward (main is no
    longer an ancestor), so an older checkpoint never lands above a newer one (an expirer that removed the batch's
    snapshot would then leave the older one to resume from); the copy is planned again from the new head."""
    for _ in range(CARRY_ATTEMPTS):
        state = committed_state(table, topic)
        if state.checkpoint is None or state.checkpoint_snapshot_id == state.snapshot_id:
            return
        branch = f"{BRANCH_PREFIX}{new_run_id()}"  # a run branch's name: dropped by other runs if left behind
        table.create_branch(branch, state.snapshot_id)  # type: ignore[arg-type]  # a table with a checkpoint has a main snapshot
        try:
            empty = table.spark.createDataFrame([], table.spark.table(table.full_name).schema)
            append_with_checkpoint(
                empty,
                f"{table.full_name}.branch_{branch}",
                state.checkpoint.carried(state.checkpoint_snapshot_id),  # type: ignore[arg-type]  # set with the checkpoint
            )
            try:
                table.fast_forward("main", branch)
                return
            except NotAnAncestor:
                log.info("%s: a batch committed while the checkpoint was carried; carrying it again", table.identifier)
        finally:
            try:
                table.drop_branch(branch)
            except Exception as error:  # best effort: a leftover branch is dropped by a later run
                log.warning("%s: could not drop branch %s: %s", table.identifier, branch, error)
    log.info("%s: batches kept committing; the checkpoint was not carried this time", table.identifier)


def sql_with_checkpoint(table: IcebergTable, statement: str, checkpoint: Checkpoint) -> None:
    """Run a SQL write straight on `table`'s main (`statement` names `table.full_name`), in one snapshot that carries
    `checkpoint`: one commit, no branch. Only for a write that a rerun may repeat (a crash after it, or another run's
    write of the same rows, changes nothing: the delete markers), since nothing publishes it with other tables'
    commits. Iceberg validates the write against the commits that landed after it read the table (a MERGE's is
    serializable: a row another run inserted meanwhile is refused, not doubled); one it refused, or lost to another
    writer, is `CommitConflict`, nothing committed. Where the snapshot could not carry the checkpoint
    (`sql_with_properties`), an empty append on top carries it."""
    try:
        sql_with_properties(table.spark, statement, checkpoint.to_summary())
    except Exception as error:
        if not java_classes(error) & {COMMIT_FAILED, VALIDATION_FAILED}:
            raise
        raise CommitConflict(
            f"table {table.identifier}: another writer committed while this batch wrote to it; nothing was "
            "committed, the batch will be re-planned"
        ) from None
    head = table.java().currentSnapshot()
    summary = head.summary() if head is not None else {}
    if not checkpoint.carried_by(summary):
        append_with_checkpoint(table.spark.createDataFrame([], table.schema()), table.full_name, checkpoint)


def append_with_checkpoint(frame: DataFrame, target: str, checkpoint: Checkpoint) -> None:
    """Append `frame` to `target` (a table or branch) in one snapshot that carries `checkpoint`."""
    append_with_properties(frame, target, checkpoint.to_summary())


def rows_added(table: IcebergTable, snapshot_id: int) -> int:
    """Rows the snapshot added (0 if it added none or does not exist)."""
    return int(table.snapshot_summary(snapshot_id).get("added-records") or 0)
