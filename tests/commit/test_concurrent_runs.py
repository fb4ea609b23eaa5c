"""Two runs of one table overlapping (as on AWS, where no lock serializes them): every record lands exactly once.

A rival run is started, and runs to its commit, at a forced point inside the first run's write: before the first
run writes its branch, or after it wrote it and before it publishes. The rival reads less than the first run (a
smaller `maxRecordsPerRun`), so a first run that published anyway would show as duplicates (append) or as offsets
covering rows its merge never put in main (upsert).
"""

from __future__ import annotations

import json
import time
import zlib

import pytest

from icefloe.commit import branch as commit_module
from icefloe.commit.branch import drop_stale_branches
from icefloe.commit.checkpoint import committed_state
from icefloe.errors import CommitConflict
from icefloe.materialize.batch import materialize_once
from icefloe.table.iceberg import IcebergTable
from icefloe.table.refs import BRANCH_PREFIX, branch_name, new_run_id
from support import by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
SCHEMA = {"fields": [{"name": "account", "type": "string"}, {"name": "n", "type": "long"}]}


def records(start: int, count: int, tombstones: bool = False) -> list[dict]:
    """Changes to 15 accounts (some tombstones); a key always goes to the same partition, like Kafka's."""
    out = []
    for n in range(start, start + count):
        key = f"acct-{n % 15}"
        value = None if tombstones and n % 7 == 6 else json.dumps({"account": key, "n": n}).encode()
        out.append({"key": key.encode(), "value": value, "partition": zlib.crc32(key.encode()) % 2})
    return out


def last_per_key(sent: list[dict]) -> dict[bytes, int]:
    state: dict[bytes, int | None] = {}
    for record in sent:
        state[record["key"]] = None if record["value"] is None else json.loads(record["value"])["n"]
    return {k: v for k, v in state.items() if v is not None}


@pytest.mark.parametrize("mode", ["append", "upsert"])
@pytest.mark.parametrize("rival_at", ["before-write", "after-write"])
def test_overlapping_runs_never_lose_or_duplicate(
    spark, broker, state_dir, topic, make_config, monkeypatch, mode, rival_at
):
    broker.create_topic(topic, 2)
    sent = records(0, 60, tombstones=mode == "upsert")
    positions = produce(broker.bootstrap_servers, topic, sent)
    spec = {"topic": topic, "format": "json", "schema": SCHEMA, "mode": mode}
    config = make_config(spec)
    rival_config = make_config({**spec, "maxRecordsPerRun": 20})  # the rival reads less than the first run
    table_spec, rival_spec = config.tables[0], rival_config.tables[0]
    identifier = config.identifier(table_spec)
    original = commit_module.commit_on_branch
    rival_offsets = []
    rival_started = []

    def run_rival(branch) -> None:
        rival_started.append(True)
        rival = materialize_once(spark, rival_config, rival_spec)
        assert rival.status == "committed"
        rival_offsets.append(rival.offsets)
        assert branch.name in branch.table.branches(BRANCH_PREFIX), "the rival dropped a live run's branch"

    def first_run_commit(table, base, checkpoint, write, *args):
        if table.identifier != identifier or rival_started:  # the rival's own commit, and any later one
            return original(table, base, checkpoint, write, *args)

        def write_with_rival(branch):
            if rival_at == "before-write":
                run_rival(branch)
            written = write(branch)
            if rival_at == "after-write":
                run_rival(branch)
            return written

        return original(table, base, checkpoint, write_with_rival, *args)

    monkeypatch.setattr("icefloe.materialize.batch.commit_on_branch", first_run_commit)
    with pytest.raises(CommitConflict):
        materialize_once(spark, config, table_spec)
    iceberg = IcebergTable(spark, identifier)
    assert committed_state(iceberg, topic).offsets == rival_offsets[0], "main holds the rival's commit, untouched"
    assert iceberg.branches(BRANCH_PREFIX) == []

    for _ in range(5):  # later runs take the rest
        if materialize_once(spark, config, table_spec).status == "up-to-date":
            break
    rows = read_pyiceberg(state_dir, identifier)
    if mode == "append":
        assert sorted(by_position(rows)) == sorted(positions), "every (partition, offset) exactly once"
    else:
        assert {row["kafka_key"]: row["n"] for row in rows} == last_per_key(sent)
        assert len({row["kafka_key"] for row in rows}) == len(rows)


def test_only_branches_older_than_the_run_timeout_are_dropped(spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 3))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "runTimeout": "1h"})
    result = materialize_once(spark, config, config.tables[0])
    table = IcebergTable(spark, result.identifier)
    live, dead = branch_name(new_run_id(time.time() - 3000)), branch_name(new_run_id(time.time() - 4000))
    for name in (live, dead, "icefloe_run_from_an_older_icefloe"):
        spark.sql(f"ALTER TABLE {table.full_name} CREATE BRANCH `{name}`")
    drop_stale_branches(table, config.tables[0].run_timeout_seconds)
    assert sorted(table.branches(BRANCH_PREFIX)) == sorted([live, "icefloe_run_from_an_older_icefloe"])


def test_a_run_that_found_no_table_never_puts_a_first_snapshot_above_a_batch(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    """Two runs of a new table: B finds it missing, and before B writes the table's first, empty snapshot, run A
    creates the table and commits its first batch. B's first snapshot must not land on A's batch (the next run would
    read from the log start again)."""
    broker.create_topic(topic, 2)
    positions = produce(broker.bootstrap_servers, topic, records(0, 20))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    table_spec = config.tables[0]
    identifier = config.identifier(table_spec)
    real_exists = IcebergTable.exists
    rival: list = []

    def exists_then_rival_runs(self):
        if self.identifier != identifier or rival:
            return real_exists(self)
        assert not real_exists(self)
        rival.append("started")
        rival.append(materialize_once(spark, config, table_spec))  # run A, start to finish
        return False  # what run B saw before A created the table

    monkeypatch.setattr(IcebergTable, "exists", exists_then_rival_runs)
    materialize_once(spark, config, table_spec)  # run B
    monkeypatch.undo()
    assert rival[1].status == "committed" and rival[1].rows_written == 20

    assert materialize_once(spark, config, table_spec).status == "up-to-date"  # run C
    assert sorted(by_position(read_pyiceberg(state_dir, identifier))) == sorted(positions)


def test_schema_evolution_goes_on_when_another_run_made_the_same_change_first(spark, topic, monkeypatch):
    """Run B computes its schema changes, run A commits the same ADD COLUMN, then B alters: B re-reads the schema
    and makes only what is still missing."""
    from pyspark.sql import types as T

    from icefloe.table import iceberg as iceberg_table

    table = IcebergTable(spark, f"local.{topic}")
    table.ensure(T.StructType([T.StructField("a", T.LongType())]), (), 128, {"icefloe.offsets": "{}"})
    wanted = T.StructType(
        [T.StructField(n, t) for n, t in (("a", T.LongType()), ("c", T.StringType()), ("d", T.LongType()))]
    )
    real_changes = iceberg_table.schema_changes
    rival = []

    def computed_before_the_rivals_alter(current, desired, path=""):
        changes = real_changes(current, desired, path)
        if not rival:
            rival.append(True)
            spark.sql(f"ALTER TABLE {table.full_name} ADD COLUMN c string")  # run A's identical change commits
        return changes

    monkeypatch.setattr(iceberg_table, "schema_changes", computed_before_the_rivals_alter)
    assert table.evolve(wanted) == ["ADD COLUMNS (`d` bigint)"]
    assert [(f.name, f.dataType) for f in table.schema().fields] == [(f.name, f.dataType) for f in wanted.fields]


def run_to_the_end(spark, config, table_spec) -> None:
    for _ in range(5):
        if materialize_once(spark, config, table_spec).status == "up-to-date":
            return
    raise AssertionError("the table did not catch up")


def assert_exactly_once(state_dir, identifier: str, mode: str, sent: list[dict], positions: list) -> None:
    rows = read_pyiceberg(state_dir, identifier)
    if mode == "append":
        assert sorted(by_position(rows)) == sorted(positions), "every (partition, offset) exactly once"
    else:
        assert {row["kafka_key"]: row["n"] for row in rows} == last_per_key(sent)
        assert len({row["kafka_key"] for row in rows}) == len(rows)


@pytest.mark.parametrize(
    ("mode", "dropped"), [("append", "before-publish"), ("upsert", "before-publish"), ("upsert", "after-merge")]
)
def test_a_run_whose_branch_a_rival_dropped_does_not_publish(
    spark, broker, state_dir, topic, make_config, monkeypatch, mode, dropped
):
    """A rival whose clock is a day ahead takes the run's branch for a dead run's and drops it: after the run wrote
    it, just before the run publishes; or, in upsert mode, right after the MERGE (whose snapshot carries the offsets).
    The run must not publish (in upsert mode that would put the offsets in main without the merged rows)."""
    broker.create_topic(topic, 2)
    sent = records(0, 40, tombstones=mode == "upsert")
    positions = produce(broker.bootstrap_servers, topic, sent)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": mode})
    table_spec = config.tables[0]
    identifier = config.identifier(table_spec)
    lost = []

    def rival_drops(branch) -> None:
        if not lost:
            drop_stale_branches(branch.table, table_spec.run_timeout_seconds, now=time.time() + 86_400)
            lost.append(branch.name)
            assert branch.name not in branch.table.branches(BRANCH_PREFIX)

    if dropped == "before-publish":
        original_verify = commit_module.verify_publishable

        def verify_after_the_drop(branch, *args):
            rival_drops(branch)
            return original_verify(branch, *args)

        monkeypatch.setattr(commit_module, "verify_publishable", verify_after_the_drop)
    else:
        after_the_write(monkeypatch, rival_drops)
    with pytest.raises(CommitConflict, match="dropped"):
        materialize_once(spark, config, table_spec)
    monkeypatch.undo()
    assert lost and committed_state(IcebergTable(spark, identifier), topic).offsets == {}, "nothing was published"

    run_to_the_end(spark, config, table_spec)
    assert_exactly_once(state_dir, identifier, mode, sent, positions)


def after_the_write(monkeypatch, action) -> None:
    """Make a run's commit call `action(branch)` once the batch's writer has written, before the run publishes."""
    original = commit_module.commit_on_branch

    def commit(table, base, checkpoint, write, *args):
        def write_then_act(branch):
            written = write(branch)
            action(branch)
            return written

        return original(table, base, checkpoint, write_then_act, *args)

    monkeypatch.setattr("icefloe.materialize.batch.commit_on_branch", commit)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_run_older_than_its_run_timeout_does_not_publish(
    spark, broker, state_dir, topic, make_config, monkeypatch, mode
):
    """Other runs may drop the branch of a run older than `runTimeout`: such a run must not publish, even though its
    branch is still there."""
    broker.create_topic(topic, 2)
    sent = records(0, 30, tombstones=mode == "upsert")
    positions = produce(broker.bootstrap_servers, topic, sent)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": mode, "runTimeout": "1h"})
    table_spec = config.tables[0]
    identifier = config.identifier(table_spec)
    real_time = time.time
    late = type("Clock", (), {"time": staticmethod(lambda: real_time() + 3601)})
    after_the_write(monkeypatch, lambda branch: monkeypatch.setattr(commit_module, "time", late))  # wrote for too long
    with pytest.raises(CommitConflict, match="older than runTimeout"):
        materialize_once(spark, config, table_spec)
    monkeypatch.undo()
    assert committed_state(IcebergTable(spark, identifier), topic).offsets == {}, "nothing was published"

    run_to_the_end(spark, config, table_spec)
    assert_exactly_once(state_dir, identifier, mode, sent, positions)


def test_a_run_that_found_no_dead_letter_table_never_puts_a_first_snapshot_above_its_batch(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    """The same race on the DLQ table: B finds `<table>_dlq` missing, A creates it and commits its bad records
    (and its batch) before B writes the DLQ's first snapshot. B must neither hide A's DLQ checkpoint nor add the
    bad records again."""
    broker.create_topic(topic, 2)
    sent = [*records(0, 10), {"value": b"not json", "partition": 0}, {"value": b"nor this", "partition": 1}]
    positions = produce(broker.bootstrap_servers, topic, sent)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "errors": "dlq"})
    table_spec = config.tables[0]
    identifier = config.identifier(table_spec)
    real_exists = IcebergTable.exists
    rival: list = []

    def exists_then_rival_runs(self):
        if self.identifier != f"{identifier}_dlq" or rival:
            return real_exists(self)
        rival.append("started")
        rival.append(materialize_once(spark, config, table_spec))  # run A, start to finish
        return False

    monkeypatch.setattr(IcebergTable, "exists", exists_then_rival_runs)
    with pytest.raises(CommitConflict):  # run B: A committed the main table meanwhile
        materialize_once(spark, config, table_spec)
    monkeypatch.undo()
    assert rival[1].status == "committed" and rival[1].records_failed == 2

    assert materialize_once(spark, config, table_spec).status == "up-to-date"  # run C
    assert sorted(by_position(read_pyiceberg(state_dir, identifier))) == sorted(positions[:10])
    assert sorted(by_position(read_pyiceberg(state_dir, f"{identifier}_dlq"))) == sorted(positions[10:])
