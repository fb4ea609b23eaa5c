"""The commit protocol: data and offsets land together, a concurrent writer cannot make a batch land twice."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from icefloe.commit import branch as commit_module
from icefloe.errors import CommitConflict
from icefloe.materialize.batch import materialize_once
from icefloe.operate.runner import run_table
from icefloe.table.iceberg import IcebergTable
from icefloe.table.refs import branch_name, new_run_id
from support import avro_serializer, by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
SCHEMA = {"fields": [{"name": "n", "type": "long"}]}


def rows_in_main(table: IcebergTable) -> int:
    return int(table.snapshot_summary(table.main_snapshot_id()).get("total-records") or 0)


def json_records(start: int, count: int) -> list[dict]:
    return [{"value": json.dumps({"n": i}).encode(), "partition": i % 2} for i in range(start, start + count)]


def test_offsets_are_in_the_same_snapshot_as_the_data(spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, json_records(0, 10))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    result = run_table(spark, config, config.tables[0], state_dir)
    summary = IcebergTable(spark, result.identifier).snapshot_summary(result.snapshot_id)
    assert json.loads(summary["icefloe.offsets"]) == {"0": 5, "1": 5}
    assert summary["added-records"] == "10" and summary["icefloe.topic"] == topic


def test_concurrent_commit_makes_the_batch_replan_not_duplicate(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, json_records(0, 20))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    table_spec = config.tables[0]
    original = commit_module.commit_on_branch
    intrusions = []

    def racing_commit(table, base, checkpoint, write, *args):
        def write_after_a_rival(branch):
            if not intrusions:
                # A rival run commits the same offsets to main while this batch is being written.
                intrusions.append(original(table, base, replace(checkpoint, run_id="rival"), write))
            return write(branch)

        return original(table, base, checkpoint, write_after_a_rival, *args)

    monkeypatch.setattr("icefloe.materialize.batch.commit_on_branch", racing_commit)
    with pytest.raises(CommitConflict, match="another writer committed"):
        materialize_once(spark, config, table_spec)
    monkeypatch.setattr("icefloe.materialize.batch.commit_on_branch", original)

    rows = read_pyiceberg(state_dir, config.identifier(table_spec))
    assert len(by_position(rows)) == 20, "only the rival's commit is visible; the loser added nothing"
    again = run_table(spark, config, table_spec, state_dir)
    assert again.status == "up-to-date"


def test_crash_before_publish_leaves_main_untouched_and_rerun_completes(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, json_records(0, 8))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    first = run_table(spark, config, config.tables[0], state_dir)
    produce(broker.bootstrap_servers, topic, json_records(8, 6))
    table = IcebergTable(spark, first.identifier)

    class Crash(BaseException):
        pass

    def crash_at_publish(*args, **kwargs):
        raise Crash()  # the process dies between writing the branch and publishing it

    monkeypatch.setattr(IcebergTable, "fast_forward", crash_at_publish)
    with pytest.raises(Crash):
        # the `finally` that drops the branch is what a SIGKILL would skip: restore a leftover branch below
        materialize_once(spark, config, config.tables[0])
    monkeypatch.undo()
    assert table.main_snapshot_id() == first.snapshot_id
    # a leftover of a run older than the run timeout (12h by default): provably dead
    leftover = branch_name(new_run_id(time.time() - 13 * 3600))
    spark.sql(f"ALTER TABLE {table.full_name} CREATE BRANCH `{leftover}`")

    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.rows_written == 6
    assert table.branches("icefloe_run_") == []
    assert len(by_position(read_pyiceberg(state_dir, first.identifier))) == 14


def test_a_branch_whose_drop_failed_does_not_stop_the_batch_read_again(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    """An Avro batch with a record the JVM cannot decode is written twice (streamed, then read again with status
    columns). If the first attempt's branch cannot be dropped, the second attempt must still commit."""
    broker.create_topic(topic, 1)
    serialize = avro_serializer(
        registry.url, topic, json.dumps({"type": "record", "name": "N", "fields": [{"name": "n", "type": "long"}]})
    )
    positions = produce(
        broker.bootstrap_servers,
        topic,
        [*({"value": serialize({"n": i})} for i in range(5)), {"value": b"\x07unframed"}],
    )
    config = make_config({"topic": topic, "errors": "skip"})
    real_drop = IcebergTable.drop_branch
    refused = []

    def drop_refused_once(self, name):
        if not refused:
            refused.append(name)
            raise RuntimeError(f"could not drop {name}")
        real_drop(self, name)

    monkeypatch.setattr(IcebergTable, "drop_branch", drop_refused_once)
    result = materialize_once(spark, config, config.tables[0])
    monkeypatch.undo()

    assert refused and result.read_path == "jvm" and result.status == "committed"
    assert result.rows_written == 5 and result.records_failed == 1
    assert sorted(by_position(read_pyiceberg(state_dir, result.identifier))) == positions[:5]


class _Observed:
    """An observation of the streamed write whose metrics never come (`blocked`) or come without the counts."""

    def __init__(self, blocked: bool):
        self.blocked, self.released = blocked, threading.Event()

    @property
    def get(self) -> dict:
        if self.blocked:
            self.released.wait()  # Spark's `Observation.get` when the observed operator was optimized away
        return {}


@pytest.mark.parametrize("blocked", [False, True])
def test_metrics_the_streamed_write_never_gets_are_an_error_naming_the_batch(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch, blocked
):
    from icefloe.errors import IcefloeError
    from icefloe.materialize import batch as materializer
    from icefloe.materialize.read_paths import JvmBatch

    broker.create_topic(topic, 1)
    serialize = avro_serializer(
        registry.url, topic, json.dumps({"type": "record", "name": "N", "fields": [{"name": "n", "type": "long"}]})
    )
    produce(broker.bootstrap_servers, topic, [{"value": serialize({"n": i})} for i in range(3)])
    config = make_config({"topic": topic})
    observed = _Observed(blocked)
    real_rows = JvmBatch.exact_rows
    monkeypatch.setattr(JvmBatch, "exact_rows", lambda self, run_id: (real_rows(self, run_id)[0], observed))
    monkeypatch.setattr(materializer, "OBSERVED_METRICS_TIMEOUT_S", 1.0, raising=False)
    try:
        with pytest.raises(IcefloeError, match=rf"table local\.{topic}: .*partition 0 offsets \[0, 3\)"):
            materialize_once(spark, config, config.tables[0])
    finally:
        observed.released.set()
    table = IcebergTable(spark, config.identifier(config.tables[0]))
    assert rows_in_main(table) == 0, "nothing was committed"
