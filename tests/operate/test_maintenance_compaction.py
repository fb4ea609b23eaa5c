"""What compaction rewrites: files a batch just wrote are as large as that batch could make them, so maintenance
right after a table's first batch leaves them alone; files from several batches are still combined."""

from __future__ import annotations

import json

import pytest

from icefloe.materialize.batch import materialize_once
from icefloe.operate.maintenance import maintain
from icefloe.table.iceberg import IcebergTable
from support import by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
SCHEMA = {"fields": [{"name": "n", "type": "long"}]}


def records(start: int, count: int, partitions: int) -> list[dict]:
    return [{"value": json.dumps({"n": i}).encode(), "partition": i % partitions} for i in range(start, start + count)]


def test_maintenance_after_a_tables_first_batch_leaves_the_files_that_batch_wrote(
    spark, broker, state_dir, topic, make_config
):
    broker.create_topic(topic, 4)
    produce(broker.bootstrap_servers, topic, records(0, 40, 4))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "maintenance": {"enabled": False}})
    table_spec = config.tables[0]
    first = materialize_once(spark, config, table_spec)
    table = IcebergTable(spark, first.identifier)

    result = maintain(table, table_spec)

    assert result.data_files_before >= 2, result  # one file per Kafka partition the batch read
    assert "compaction" in result.steps and result.rewritten_files == 0, result
    assert result.data_files_after == result.data_files_before, result

    # A second batch's small files and the first's: now compaction combines them.
    produce(broker.bootstrap_servers, topic, records(40, 40, 4))
    materialize_once(spark, config, table_spec)
    again = maintain(table, table_spec)
    assert again.rewritten_files >= 2 and again.data_files_after < again.data_files_before, again
    assert sorted(r["n"] for r in by_position(read_pyiceberg(state_dir, table.identifier)).values()) == list(range(80))
