"""The checkpoint stays findable: expiry keeps the snapshot main's history resumes from, and a broken history stops
the table instead of re-reading from the start or skipping to the end."""

from __future__ import annotations

import json
import time

import pytest

from icefloe.commit.checkpoint import Checkpoint, append_with_checkpoint
from icefloe.errors import CheckpointLost
from icefloe.materialize.batch import materialize_once
from icefloe.operate.maintenance import maintain
from icefloe.table.catalog import CATALOG
from icefloe.table.iceberg import IcebergTable
from icefloe.table.refs import branch_name, new_run_id
from support import by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
SCHEMA = {"fields": [{"name": "n", "type": "long"}]}


def records(start: int, count: int) -> list[dict]:
    return [{"value": json.dumps({"n": i}).encode(), "partition": i % 2} for i in range(start, start + count)]


def a_maintenance_commit(table: IcebergTable) -> None:
    """A commit without offsets on main, as compaction makes."""
    table.spark.sql(
        f"CALL {CATALOG}.system.rewrite_data_files(table => '{table.identifier}', options => map('rewrite-all', 'true'))"
    ).collect()


def test_expiry_keeps_mains_checkpoint_though_an_abandoned_branch_holds_a_newer_one(
    spark, broker, state_dir, topic, make_config
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 10))
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "maintenance": {"enabled": False, "snapshotRetention": "1s", "minSnapshotsToKeep": 1},
        }
    )
    table_spec = config.tables[0]
    first = materialize_once(spark, config, table_spec)
    table = IcebergTable(spark, first.identifier)
    time.sleep(1.5)
    # A run that wrote its branch (with a newer checkpoint) and died before publishing; its branch is still young.
    abandoned = branch_name(new_run_id())
    spark.sql(f"ALTER TABLE {table.full_name} CREATE BRANCH `{abandoned}`")
    empty = spark.createDataFrame([], spark.table(table.full_name).schema)
    append_with_checkpoint(empty, f"{table.full_name}.branch_{abandoned}", Checkpoint(topic, {0: 99, 1: 99}, abandoned))
    a_maintenance_commit(table)
    time.sleep(1.5)

    maintain(table, table_spec)

    produce(broker.bootstrap_servers, topic, records(10, 4))
    after = materialize_once(spark, config, table_spec)
    assert after.rows_written == 4, "the next run resumes from main's checkpoint"
    assert sorted(by_position(read_pyiceberg(state_dir, table.identifier))) == sorted(
        (i % 2, i // 2) for i in range(14)
    )


def test_an_expired_snapshot_between_head_and_checkpoint_stops_the_table(spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 10))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    table_spec = config.tables[0]
    first = materialize_once(spark, config, table_spec)
    table = IcebergTable(spark, first.identifier)
    a_maintenance_commit(table)
    # Expire the checkpoint's snapshot (what Athena's VACUUM or a Glue optimizer may do): main's head is kept.
    spark.sql(
        f"CALL {CATALOG}.system.expire_snapshots(table => '{table.identifier}', snapshot_ids => array({first.snapshot_id}))"
    ).collect()
    produce(broker.bootstrap_servers, topic, records(10, 4))

    with pytest.raises(CheckpointLost, match=f"table {table.identifier}: snapshot {first.snapshot_id} .*expired"):
        materialize_once(spark, config, table_spec)
    assert sorted(by_position(read_pyiceberg(state_dir, table.identifier))) == sorted(
        (i % 2, i // 2) for i in range(10)
    )


def test_a_table_whose_first_commit_failed_recovers(spark, broker, state_dir, topic, make_config, monkeypatch):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 6))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    table_spec = config.tables[0]

    class Crash(Exception):
        pass

    def crash(*args, **kwargs):
        raise Crash()  # the run dies after CREATE TABLE, its first snapshot written but not yet main's

    monkeypatch.setattr(IcebergTable, "_change_refs", crash)
    with pytest.raises(Crash):
        materialize_once(spark, config, table_spec)
    monkeypatch.undo()
    table = IcebergTable(spark, config.identifier(table_spec))
    assert table.exists() and table.main_snapshot_id() is None

    result = materialize_once(spark, config, table_spec)
    assert result.rows_written == 6
    assert len(by_position(read_pyiceberg(state_dir, table.identifier))) == 6


def test_maintenance_carries_the_checkpoint_and_a_batch_committing_meanwhile_never_moves_offsets_back(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    """Maintenance copies the checkpoint it read onto main's head; a batch commits between that read and the copy's
    commit (on AWS nothing serializes them). The copy must not land on top of the newer checkpoint: offsets must not
    go back, and once everything below the head is expired (an external expirer, before any further maintenance) the
    table still resumes exactly where it was."""
    from icefloe.commit import checkpoint as commit_state
    from icefloe.commit.checkpoint import CARRIED_KEY, OFFSETS_KEY, committed_state

    broker.create_topic(topic, 2)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "maintenance": {"enabled": False}})
    table_spec = config.tables[0]
    # Two batches: compaction (after which maintenance carries the checkpoint) leaves the files of one batch alone.
    for start, count in ((0, 6), (6, 4)):
        produce(broker.bootstrap_servers, topic, records(start, count))
        first = materialize_once(spark, config, table_spec)
    table = IcebergTable(spark, first.identifier)
    produce(broker.bootstrap_servers, topic, records(10, 6))
    original = commit_state.append_with_properties
    batches = []

    def batch_then_append(frame, target, properties):
        if target.startswith(table.full_name) and CARRIED_KEY in properties and not batches:
            batches.append(materialize_once(spark, config, table_spec))  # commits while maintenance runs
        original(frame, target, properties)

    monkeypatch.setattr(commit_state, "append_with_properties", batch_then_append)
    maintain(table, table_spec)
    monkeypatch.undo()

    assert batches and batches[0].rows_written == 6
    head = spark.sql(
        f"SELECT summary FROM {table.full_name}.snapshots WHERE snapshot_id = {table.main_snapshot_id()}"
    ).collect()
    assert json.loads(head[0].summary[OFFSETS_KEY]) == {"0": 8, "1": 8}, "main's head carries the newest checkpoint"
    assert committed_state(table, topic).offsets == batches[0].offsets == {0: 8, 1: 8}, "offsets never move back"

    # Expire everything below the head at once (a Glue optimizer or VACUUM may, before icefloe maintains again): the
    # head's checkpoint still says where to resume.
    below = [
        row.snapshot_id
        for row in spark.sql(f"SELECT snapshot_id FROM {table.full_name}.snapshots").collect()
        if row.snapshot_id != table.main_snapshot_id()
    ]
    ids = ", ".join(str(i) for i in below)
    spark.sql(
        f"CALL {CATALOG}.system.expire_snapshots(table => '{table.identifier}', snapshot_ids => array({ids}))"
    ).collect()
    produce(broker.bootstrap_servers, topic, records(16, 4))
    assert materialize_once(spark, config, table_spec).rows_written == 4
    assert sorted(by_position(read_pyiceberg(state_dir, table.identifier))) == sorted(
        (i % 2, i // 2) for i in range(20)
    )
