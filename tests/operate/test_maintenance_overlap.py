"""Maintenance beside writers (local catalog): reported apart from the batch, claimed before it runs, counts that
stay true under overlap, a run that yields to other runs' progress, and the dead-letter table's own retention."""

from __future__ import annotations

import json
import logging
import time

import pytest

from icefloe.materialize.batch import materialize_once
from icefloe.operate import maintenance, runner
from icefloe.operate.heartbeat import read_heartbeat
from icefloe.operate.maintenance import LAST_MAINTENANCE_PROPERTY, maintain
from icefloe.operate.runner import _attempt, run_table
from icefloe.table.iceberg import IcebergTable, append_with_properties
from support import ANY_CATALOG, by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
SCHEMA = {"fields": [{"name": "n", "type": "long"}]}
LEASE_PROPERTY = "icefloe.maintenance-lease"  # maintenance.LEASE_PROPERTY: who maintains the table, until when


def records(start: int, count: int) -> list[dict]:
    return [{"value": json.dumps({"n": i}).encode(), "partition": i % 2} for i in range(start, start + count)]


def properties(table: IcebergTable) -> dict[str, str]:
    return dict(table.java().properties())


def test_a_maintenance_failure_after_a_committed_batch_does_not_fail_the_run(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 10))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})  # a new table: maintenance is due

    def fail(*args, **kwargs):
        raise RuntimeError("S3 listing failed")

    monkeypatch.setattr("icefloe.operate.maintenance._remove_orphans", fail)
    reported = []
    outcome, why, result = _attempt(spark, config, config.tables[0], state_dir, reported.append, metrics=False)

    assert outcome == "ok" and why == "", why
    assert [r.status for r in reported] == ["committed"] and reported[0].rows_written == 10
    assert "S3 listing failed" in reported[0].maintenance_error and reported[0].as_dict()["maintenance_error"]
    beat = read_heartbeat(state_dir, result.identifier)
    assert beat.outcome == "committed" and "maintenance failed" in beat.detail, beat
    table = IcebergTable(spark, result.identifier)
    assert LEASE_PROPERTY not in properties(table), "the failed maintenance released its claim"
    assert LAST_MAINTENANCE_PROPERTY in properties(table), "retried at the next due time, not after every batch"
    monkeypatch.undo()
    assert not maintain(table, config.tables[0]).skipped, "nothing holds the table's maintenance any more"
    assert len(by_position(read_pyiceberg(state_dir, result.identifier))) == 10


@ANY_CATALOG
def test_a_live_claim_of_another_run_skips_maintenance_and_an_expired_one_does_not(
    catalog, spark, broker, topic, make_config
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 4))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "maintenance": {"enabled": False}})
    first = materialize_once(spark, config, config.tables[0])
    table = IcebergTable(spark, first.identifier)
    live = f"another-run;{int(time.time() * 1000) + 600_000}"
    spark.sql(f"ALTER TABLE {table.full_name} SET TBLPROPERTIES ('{LEASE_PROPERTY}' = '{live}')")

    skipped = maintain(table, config.tables[0])
    assert "claimed by run another-run" in skipped.skipped and skipped.steps == []
    assert properties(table)[LEASE_PROPERTY] == live

    # A run that found maintenance due, but another run claimed (and finished) it since: not due any more.
    claimed_just_now = int(time.time() * 1000)
    spark.sql(f"ALTER TABLE {table.full_name} UNSET TBLPROPERTIES ('{LEASE_PROPERTY}')")
    spark.sql(f"ALTER TABLE {table.full_name} SET TBLPROPERTIES ('{LAST_MAINTENANCE_PROPERTY}' = '{claimed_just_now}')")
    assert "not due" in maintain(table, config.tables[0], only_if_due=True).skipped

    expired = f"another-run;{int(time.time() * 1000) - 1}"
    spark.sql(f"ALTER TABLE {table.full_name} SET TBLPROPERTIES ('{LEASE_PROPERTY}' = '{expired}')")
    done = maintain(table, config.tables[0])
    assert not done.skipped and "compaction" in done.steps
    assert LEASE_PROPERTY not in properties(table)


def test_counts_stay_non_negative_when_batches_commit_during_maintenance(
    spark, broker, topic, make_config, monkeypatch
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 6))
    config = make_config(
        {"topic": topic, "format": "json", "schema": SCHEMA, "retention": "3650d", "maintenance": {"enabled": False}}
    )
    table_spec = config.tables[0]
    first = materialize_once(spark, config, table_spec)
    table = IcebergTable(spark, first.identifier)
    original = maintenance._remove_orphans
    batches = []

    def batches_meanwhile(*args, **kwargs):  # other runs publish while this maintenance expires and cleans up
        for start in (6, 10):
            produce(broker.bootstrap_servers, topic, records(start, 4))
            batches.append(materialize_once(spark, config, table_spec))
        return original(*args, **kwargs)

    monkeypatch.setattr("icefloe.operate.maintenance._remove_orphans", batches_meanwhile)
    result = maintain(table, table_spec)

    assert [b.rows_written for b in batches] == [4, 4]
    assert result.expired_snapshots == 0, result  # snapshotRetention 1d: nothing was old enough
    assert result.rows_expired_by_ttl == 0 and result.orphan_files_removed >= 0


def test_a_run_that_loses_every_re_plan_to_other_writers_yields(
    spark, broker, topic, make_config, monkeypatch, caplog, tmp_path
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 4))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "maintenance": {"enabled": False}})
    table_spec = config.tables[0]
    materialize_once(spark, config, table_spec)
    produce(broker.bootstrap_servers, topic, records(4, 4))
    from icefloe.commit import branch as commit

    original = commit.verify_publishable

    def another_writer_first(branch, base, timeout):  # another run publishes just before each attempt's publish
        empty = spark.createDataFrame([], branch.table.schema())
        append_with_properties(empty, branch.table.full_name, {})
        return original(branch, base, timeout)

    monkeypatch.setattr(commit, "verify_publishable", another_writer_first)
    reported = []
    with caplog.at_level(logging.INFO, logger="icefloe"):
        outcome, why, result = _attempt(spark, config, table_spec, tmp_path, reported.append, metrics=False)

    assert outcome == "yielded", (outcome, why)
    assert [r.status for r in reported] == ["yielded"] and "yielded" in reported[0].describe()
    assert read_heartbeat(tmp_path, result.identifier).outcome == "yielded"
    last = [r for r in caplog.records if r.name.startswith("icefloe")][-1]
    assert last.levelno < logging.ERROR and "yielded" in last.getMessage() and "re-planned" not in last.getMessage()
    monkeypatch.undo()
    assert materialize_once(spark, config, table_spec).rows_written == 4, "the next run takes the batch"


@ANY_CATALOG
def test_the_dead_letter_table_has_a_retention_of_its_own(catalog, spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 1)
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "errors": "dlq",
            "deadLetterRetention": "1s",
            "maintenance": {"enabled": False},
        }
    )
    table_spec = config.tables[0]
    produce(broker.bootstrap_servers, topic, [{"value": json.dumps({"n": 0}).encode()}, {"value": b"not json"}])
    run_table(spark, config, table_spec, state_dir)
    table = IcebergTable(spark, config.identifier(table_spec))
    assert len(read_pyiceberg(state_dir, table.identifier + "_dlq")) == 1
    time.sleep(1.5)

    result = maintain(table, table_spec)

    assert result.rows_expired_by_ttl == 0, "the table has no retention: its rows stay"
    assert result.dead_letters is not None and result.dead_letters.rows_expired_by_ttl == 1
    assert read_pyiceberg(state_dir, table.identifier + "_dlq") == []
    assert len(read_pyiceberg(state_dir, table.identifier)) == 1
    # The DLQ's checkpoint survives: a later bad record is added once, the expired one is not read again.
    produce(broker.bootstrap_servers, topic, [{"value": b"not json either"}])
    run_table(spark, config, table_spec, state_dir)
    assert [r["kafka_offset"] for r in read_pyiceberg(state_dir, table.identifier + "_dlq")] == [2]


def test_icefloe_maintain_goes_on_with_the_other_tables_after_an_unexpected_failure(
    spark, broker, state_dir, topic, monkeypatch, tmp_path
):
    import yaml

    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 4))
    tables = [
        {"sourceCluster": "local", "topic": topic, "table": f"{topic[:50]}_{n}", "format": "json", "schema": SCHEMA}
        for n in ("a", "b")
    ]
    stack = tmp_path / "Pulumi.maint.yaml"
    stack.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers}],
                    "icefloe:tables": tables,
                }
            }
        )
    )
    from icefloe.spec import load_config

    config = load_config(str(stack))
    for table_spec in config.tables:
        materialize_once(spark, config, table_spec)
    original = runner.maintain

    def fail_the_first(table, spec, managed=False, **kwargs):
        if table.identifier.endswith("_a"):
            raise RuntimeError("Py4JJavaError: the catalog went away")
        return original(table, spec, managed, **kwargs)

    monkeypatch.setattr(runner, "maintain", fail_the_first)
    reported = []
    failures = runner.maintain_tables(str(stack), [], state_dir, reported.append)

    assert failures == 1
    assert [r["identifier"] for r in reported] == [config.identifier(config.tables[1])]
