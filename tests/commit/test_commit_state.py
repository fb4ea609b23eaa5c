"""What a commit records in its snapshot summary, and reading it back (no Spark: the summary is plain strings)."""

from __future__ import annotations

import json

import pytest

from icefloe.commit.checkpoint import Checkpoint, CommittedState
from icefloe.source.kafka import LostRange


def test_checkpoint_round_trips_through_a_snapshot_summary():
    checkpoint = Checkpoint("orders", {0: 12, 2: 7}, "run1")
    summary = checkpoint.to_summary()
    assert summary == {"icefloe.offsets": '{"0": 12, "2": 7}', "icefloe.topic": "orders", "icefloe.run-id": "run1"}
    # Iceberg's own keys sit beside icefloe's in the same summary.
    assert Checkpoint.from_summary({**summary, "added-records": "19"}) == checkpoint


def test_a_tables_first_snapshot_records_its_topic_and_no_offsets():
    assert Checkpoint("orders").to_summary() == {"icefloe.offsets": "{}", "icefloe.topic": "orders"}
    assert Checkpoint.from_summary({"icefloe.offsets": "{}", "icefloe.topic": "orders"}) == Checkpoint("orders", {})


def test_a_summary_without_offsets_carries_no_checkpoint():
    """Maintenance commits (compaction, TTL deletes) record no offsets: reading walks past them."""
    assert Checkpoint.from_summary({"added-records": "0", "icefloe.run-id": None}) is None
    assert CommittedState(5).offsets == {}
    assert CommittedState(5, Checkpoint("t", {1: 3})).offsets == {1: 3}


def test_topic_id_and_lost_ranges_round_trip():
    checkpoint = Checkpoint("orders", {0: 15}, "run2", "q7Zb3d1AQ5i2w1n0mJ8Xkg", (LostRange(0, 10, 15),))
    summary = checkpoint.to_summary()
    assert summary["icefloe.topic-id"] == "q7Zb3d1AQ5i2w1n0mJ8Xkg"
    assert json.loads(summary["icefloe.data-loss"]) == [{"partition": 0, "start": 10, "end": 15}]
    assert Checkpoint.from_summary(summary) == checkpoint
    assert CommittedState(9, checkpoint).topic_id == "q7Zb3d1AQ5i2w1n0mJ8Xkg"
    # Nothing lost, no topic id reported: neither key is written.
    assert set(Checkpoint("orders", {0: 15}, "run3").to_summary()) == {
        "icefloe.offsets",
        "icefloe.topic",
        "icefloe.run-id",
    }


def test_partition_clocks_round_trip_and_maintenance_copies_keep_them():
    """An upsert table's clocks must survive the summary and a carried copy, or the next batch's clocks would
    depend on where the previous batch ended."""
    checkpoint = Checkpoint("orders", {0: 15, 1: 3}, "run4", clocks={0: 1_795_000_000_123, 1: 1_795_000_000_000})
    summary = checkpoint.to_summary()
    assert json.loads(summary["icefloe.partition-clocks"]) == {"0": 1_795_000_000_123, "1": 1_795_000_000_000}
    assert Checkpoint.from_summary(summary) == checkpoint
    assert Checkpoint.from_summary(checkpoint.carried(42).to_summary()).clocks == checkpoint.clocks


def test_the_walk_resumes_from_the_furthest_checkpoint_down_to_the_first_a_batch_wrote():
    """resume_point is the one walk (commit and status): maintenance commits are walked past, carried copies above
    the batch's checkpoint count (the furthest wins), and nothing below the batch's checkpoint is read."""
    from icefloe.commit.checkpoint import resume_point
    from icefloe.errors import CheckpointLost
    from icefloe.table.iceberg import SnapshotRecord

    batch = Checkpoint("t", {0: 10}, "run1")
    behind = Checkpoint("t", {0: 7}, "run0").carried(3)  # maintenance carried an older checkpoint above it
    history = [
        SnapshotRecord(9, {"added-records": "0"}),  # a maintenance commit carrying nothing
        SnapshotRecord(8, behind.to_summary()),
        SnapshotRecord(7, batch.to_summary(), 1_000),
        SnapshotRecord(6, None),  # expired below the batch's checkpoint: never reached
    ]
    assert resume_point(history, "db.t") == (batch, history[2])
    assert resume_point(history[:2] + [SnapshotRecord(6, None)], "db.t") == (behind, history[1])
    assert resume_point([SnapshotRecord(9, {})], "db.t") is None
    with pytest.raises(CheckpointLost, match="table db.t: snapshot 8 in main's history was expired"):
        resume_point([SnapshotRecord(9, {}), SnapshotRecord(8, None)], "db.t")
