"""Kafka semantics a real broker has and users hit: transactions, retention, compaction, recreated topics, new
partitions, `startingOffsets: latest`. Each runs end to end on the local Apache Kafka broker with real Spark, on both
read paths: JSON (Python path), Avro through the registry and `raw` (JVM path)."""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from icefloe.commit.checkpoint import Checkpoint, append_with_checkpoint, committed_state
from icefloe.errors import DataLossError, SourceError
from icefloe.materialize.batch import materialize_once
from icefloe.operate.status import MaxLag, collect_status, render
from icefloe.source import kafka as kafka_source
from icefloe.source import spark_kafka as jvm_source
from icefloe.source.kafka import share_budget
from icefloe.table.iceberg import IcebergTable
from icefloe_dev.kafka_broker import KafkaBroker
from support import avro_serializer, by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
# The float column keeps the JSON table on the Python path (formats.json_jvm leaves floats to Python), so the Kafka
# semantics below are those of both readers: librdkafka in Python tasks (json) and Spark's Kafka source (avro, raw).
SCHEMA = {"fields": [{"name": "n", "type": "long"}, {"name": "score", "type": "float"}]}
AVRO_SCHEMA = json.dumps({"type": "record", "name": "N", "fields": [{"name": "n", "type": "long"}]})


@dataclass
class Format:
    """How one test table is declared and its records written and read back."""

    table: dict
    read_path: str
    encode: Callable[[int], bytes]
    n_of: Callable[[dict], int]


@pytest.fixture(params=["json", "avro", "raw"])
def fmt(request, registry, topic) -> Format:
    as_json = lambda n: json.dumps({"n": n}).encode()  # noqa: E731
    if request.param == "json":
        return Format({"format": "json", "schema": SCHEMA}, "python", as_json, lambda row: row["n"])
    if request.param == "raw":
        return Format({"format": "raw"}, "jvm", as_json, lambda row: json.loads(row["value"])["n"])
    # Registered up front: a table of an empty topic reads its schema from the registry before any record exists.
    SchemaRegistryClient({"url": registry.url}).register_schema(f"{topic}-value", Schema(AVRO_SCHEMA, "AVRO"))
    serialize = avro_serializer(registry.url, topic, AVRO_SCHEMA)
    return Format({}, "jvm", lambda n: serialize({"n": n}), lambda row: row["n"])


def values(fmt: Format, start: int, count: int, partition: int = 0, key: bytes | None = None) -> list[dict]:
    return [{"value": fmt.encode(i), "partition": partition, "key": key} for i in range(start, start + count)]


def table_ns(fmt: Format, state_dir, identifier: str) -> list[int]:
    return sorted(fmt.n_of(row) for row in by_position(read_pyiceberg(state_dir, identifier)).values())


def make_table(fmt: Format, make_config, topic: str, **extra):
    config = make_config({"topic": topic, **fmt.table, **extra})
    return config, config.tables[0]


def test_aborted_records_are_skipped_and_an_open_transaction_does_not_stall(
    spark, broker, state_dir, topic, make_config, monkeypatch, fmt
):
    broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)

    def transaction(start: int, count: int, commit: bool) -> None:
        producer.begin_transaction()
        for record in values(fmt, start, count):
            producer.produce(topic, value=record["value"], partition=0)
        producer.flush(30)  # abort_transaction() purges unsent records: flush first, so the aborted ones are in the log
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    transaction(0, 5, commit=True)
    transaction(100, 5, commit=False)
    transaction(5, 5, commit=True)
    # An open transaction: its records are in the log, but above the last stable offset.
    producer.begin_transaction()
    for record in values(fmt, 200, 3):
        producer.produce(topic, value=record["value"], partition=0)
    producer.flush(30)

    config, spec = make_table(fmt, make_config, topic)
    # A reader of the planned range must end at the last stable offset, not wait for the open transaction
    # (a stalled reader raises after READ_STALL_TIMEOUT_S; shortened here so a stall fails fast).
    monkeypatch.setattr(kafka_source, "READ_STALL_TIMEOUT_S", 5.0)
    monkeypatch.setitem(jvm_source.FETCH_TUNING, "kafkaConsumer.pollTimeoutMs", "5000")  # Spark's, 120 s by default
    conf = kafka_source.client_config(config.cluster("local"))
    plan = kafka_source.plan_ranges(conf, topic, {}, "earliest", None)
    assert [(r.start, r.end) for r in plan.ranges] == [(0, 18)]
    assert [m.offset() for m in kafka_source.read_range(conf, plan.ranges[0])] == [*range(5), *range(12, 17)]

    result = materialize_once(spark, config, spec)
    assert result.status == "committed" and result.read_path == fmt.read_path
    assert table_ns(fmt, state_dir, result.identifier) == list(range(10))
    # 5 + 1 marker + 5 aborted + 1 marker + 5 + 1 marker: the next offset is the last stable offset, past the gaps.
    assert result.offsets == {0: 18}

    producer.commit_transaction(30)
    after = materialize_once(spark, config, spec)
    assert table_ns(fmt, state_dir, result.identifier) == [*range(10), 200, 201, 202]
    assert after.offsets == {0: 22}
    assert materialize_once(spark, config, spec).status == "up-to-date"


def test_records_deleted_before_they_were_read_fail_the_run_or_are_recorded(
    spark, broker, state_dir, topic, make_config, fmt
):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 10, partition=0) + values(fmt, 0, 4, partition=1))
    config, spec = make_table(fmt, make_config, topic)
    first = materialize_once(spark, config, spec)
    assert first.offsets == {0: 10, 1: 4}

    produce(broker.bootstrap_servers, topic, values(fmt, 10, 10, partition=0) + values(fmt, 4, 2, partition=1))
    deleted = broker.admin.delete_records([TopicPartition(topic, 0, 15)])
    for future in deleted.values():
        future.result(30)
    before = IcebergTable(spark, first.identifier).main_snapshot_id()

    with pytest.raises(DataLossError, match=rf"{topic}\[0\] offsets 10\.\.14 \(5 records\).*onDataLoss: warn"):
        materialize_once(spark, config, spec)
    assert IcebergTable(spark, first.identifier).main_snapshot_id() == before, "nothing is committed on data loss"

    warn_config, warn_spec = make_table(fmt, make_config, topic, onDataLoss="warn")
    result = materialize_once(spark, warn_config, warn_spec)
    assert result.data_lost == [{"partition": 0, "start": 10, "end": 15}]
    assert "DATA LOSS: 5 records" in result.describe()
    assert result.offsets == {0: 20, 1: 6}
    summary = IcebergTable(spark, result.identifier).snapshot_summary(result.snapshot_id)
    assert json.loads(summary["icefloe.data-loss"]) == [{"partition": 0, "start": 10, "end": 15}]
    rows = by_position(read_pyiceberg(state_dir, result.identifier))
    assert sorted(o for p, o in rows if p == 0) == [*range(10), *range(15, 20)]
    assert sorted(o for p, o in rows if p == 1) == list(range(6))


def wait_for_compaction(bootstrap: str, topic: str, timeout: float = 90.0) -> list[int]:
    """Offsets left in partition 0 once the cleaner has removed some (compaction leaves gaps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "probe",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        offsets = []
        while True:
            msg = consumer.poll(5)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                break
            offsets.append(msg.offset())
        consumer.close()
        if offsets and len(offsets) < offsets[-1] + 1:
            return offsets
        time.sleep(1)
    raise AssertionError(f"the cleaner did not compact {topic} within {timeout:g}s")


def test_compacted_topic_gaps_are_read_without_stall_or_miscount(spark, broker, state_dir, topic, make_config, fmt):
    broker.create_topic(
        topic,
        1,
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0",
            "delete.retention.ms": "100",
        },
    )
    for round_ in range(4):  # each round rolls a segment, so older rounds become cleanable
        produce(
            broker.bootstrap_servers,
            topic,
            [{"key": f"k{k}".encode(), "value": fmt.encode(round_ * 100 + k), "partition": 0} for k in range(10)],
        )
        time.sleep(0.3)
    survivors = wait_for_compaction(broker.bootstrap_servers, topic)

    config, spec = make_table(fmt, make_config, topic)
    result = materialize_once(spark, config, spec)
    rows = by_position(read_pyiceberg(state_dir, result.identifier))  # each (partition, offset) at most once
    # The cleaner may go on removing records after the probe, never adding any: the table holds at most what
    # the probe saw, with gaps, and every key's newest value (which compaction keeps).
    assert len(rows) <= len(survivors) < 40
    assert {fmt.n_of(r) for r in rows.values()} >= set(range(300, 310))
    assert result.offsets == {0: 40}
    assert materialize_once(spark, config, spec).status == "up-to-date"


def test_topic_deleted_and_recreated_is_refused_with_what_to_do(spark, broker, state_dir, topic, make_config, fmt):
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 5))
    config, spec = make_table(fmt, make_config, topic)
    materialize_once(spark, config, spec)

    # Recreated with more records than the table had read: offsets alone cannot tell; the topic id does.
    broker.delete_topic(topic)
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 8))
    with pytest.raises(SourceError, match=rf"topic '{topic}' was deleted and recreated.*new table"):
        materialize_once(spark, config, spec)


def test_a_log_ending_below_the_committed_offset_is_truncation_for_on_data_loss(
    spark, broker, state_dir, topic, make_config, fmt
):
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 5))
    config, spec = make_table(fmt, make_config, topic)
    first = materialize_once(spark, config, spec)
    # The table read up to 10, the log now ends at 5 (the same topic: its id is unchanged): modelled by hand.
    table = IcebergTable(spark, first.identifier)
    empty = spark.createDataFrame([], spark.table(table.full_name).schema)
    append_with_checkpoint(
        empty, table.full_name, Checkpoint(topic, {0: 10}, "0_model", first_topic_id(spark, table, topic))
    )

    with pytest.raises(
        DataLossError, match=rf"log truncation: {topic}\[0\] offsets 5\.\.9 \(5 records\).*onDataLoss: warn"
    ) as refused:
        materialize_once(spark, config, spec)
    assert "recreated" not in str(refused.value)
    warn_config, warn_spec = make_table(fmt, make_config, topic, onDataLoss="warn")
    cut = materialize_once(spark, warn_config, warn_spec)
    assert cut.offsets == {0: 5}, "reads on from the log's end"
    assert cut.data_lost == [{"partition": 0, "start": 5, "end": 10, "kind": "truncated"}], "recorded, not only logged"
    produce(broker.bootstrap_servers, topic, values(fmt, 200, 3))
    assert materialize_once(spark, warn_config, warn_spec).offsets == {0: 8}
    assert table_ns(fmt, state_dir, first.identifier) == [0, 1, 2, 3, 4, 200, 201, 202]


def first_topic_id(spark, table: IcebergTable, topic: str) -> str | None:
    return committed_state(table, topic).topic_id


def test_a_log_truncated_by_a_lost_disk_is_caught_past_the_offset(spark, state_dir, topic, make_config, fmt, tmp_path):
    # A broker of the test's own: its log is cut while it is down (RF=1 disk loss), and it comes back with a new
    # leader epoch; producers then write past the table's offset before icefloe runs again.
    own = KafkaBroker(tmp_path / "kafka", heap="256m")
    own.start()
    try:
        own.create_topic(topic, 1)
        produce(own.bootstrap_servers, topic, values(fmt, 0, 5))
        config = make_config({"topic": topic, **fmt.table}, bootstrap=own.bootstrap_servers)
        first = materialize_once(spark, config, config.tables[0])
        assert first.offsets == {0: 5}
        summary = IcebergTable(spark, first.identifier).snapshot_summary(first.snapshot_id)
        assert json.loads(summary["icefloe.leader-epochs"]) == {"0": 0}
        (segment,) = glob.glob(f"{own.state_dir}/data-*/{topic}-0/*.log")
        kept = os.path.getsize(segment)
        produce(own.bootstrap_servers, topic, values(fmt, 5, 5))
        assert materialize_once(spark, config, config.tables[0]).offsets == {0: 10}

        own.stop()
        with open(segment, "r+b") as log_file:
            log_file.truncate(kept)  # offsets 5-9 are gone
        for marker in glob.glob(f"{own.state_dir}/data-*/.kafka_cleanshutdown"):
            os.remove(marker)  # so the broker recovers the segment
        own.start()
        produce(own.bootstrap_servers, topic, values(fmt, 100, 10))  # offsets 5-14 now: past the table's 10

        with pytest.raises(DataLossError, match=rf"log truncation: {topic}\[0\] offsets 5\.\.9 \(5 records\)"):
            materialize_once(spark, config, config.tables[0])
        warn = make_config({"topic": topic, **fmt.table, "onDataLoss": "warn"}, bootstrap=own.bootstrap_servers)
        result = materialize_once(spark, warn, warn.tables[0])
        assert result.offsets == {0: 15} and result.rows_written == 10 and result.read_path == fmt.read_path
        rows = read_pyiceberg(state_dir, result.identifier)  # offsets 5-9 twice: the lost records and the new ones
        assert sorted(fmt.n_of(r) for r in rows) == [*range(10), *range(100, 110)]
        assert materialize_once(spark, warn, warn.tables[0]).status == "up-to-date"
    finally:
        own.stop()
        kafka_source._forget_admin(kafka_source.client_config(config.cluster("local")))  # it would reconnect for ever


def no_topic_ids(monkeypatch) -> None:
    """A broker before Kafka 2.8 reports no topic id: a topic deleted and recreated under its name starts again at
    leader epoch 0, so neither the id nor the epoch tells the two logs apart."""
    monkeypatch.setattr(kafka_source, "topic_id", lambda conf, topic: None)


def test_a_recreated_topic_without_topic_ids_is_truncation(
    spark, broker, state_dir, topic, make_config, fmt, monkeypatch
):
    no_topic_ids(monkeypatch)
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 5))
    config, spec = make_table(fmt, make_config, topic)
    assert materialize_once(spark, config, spec).offsets == {0: 5}

    # The same epoch (0), and the new log already past the table's offset 5: only a record the table read tells.
    broker.delete_topic(topic)
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 100, 8))
    with pytest.raises(DataLossError, match=rf"log truncation: {topic}\[0\] offsets 0\.\.4 \(5 records\).*recreated"):
        materialize_once(spark, config, spec)

    # status runs the same check: the 8 new records are behind, the 5 read ones gone
    (seen,) = collect_status(config, [], state_dir, MaxLag())
    assert seen.lag is not None and seen.lag.records == 8, seen.as_dict()
    assert [(p["partition"], p["lag_records"], p["truncated"]) for p in seen.as_dict()["partitions"]] == [(0, 8, 5)]
    assert "log truncated" in render([seen])

    warn_config, warn_spec = make_table(fmt, make_config, topic, onDataLoss="warn")
    result = materialize_once(spark, warn_config, warn_spec)
    assert result.offsets == {0: 8} and result.read_path == fmt.read_path
    truncated = [{"partition": 0, "start": 0, "end": 5, "kind": "truncated"}]
    assert result.data_lost == truncated, "recorded with the commit, not only logged"
    summary = IcebergTable(spark, result.identifier).snapshot_summary(result.snapshot_id)
    assert json.loads(summary["icefloe.data-loss"]) == truncated
    rows = read_pyiceberg(state_dir, result.identifier)  # offsets 0-4 twice: the old log's records and the new ones
    assert sorted(fmt.n_of(r) for r in rows) == [*range(5), *range(100, 108)]
    (after,) = collect_status(warn_config, [], state_dir, MaxLag())
    assert after.as_dict()["data_lost"] == truncated and after.lag is not None and after.lag.records == 0
    assert materialize_once(spark, warn_config, warn_spec).status == "up-to-date"


@pytest.mark.parametrize("fmt", ["json", "avro"], indirect=True)  # raw has no bad records
def test_bad_records_a_truncation_gave_old_offsets_reach_the_dlq(
    spark, broker, state_dir, topic, make_config, fmt, monkeypatch
):
    no_topic_ids(monkeypatch)
    bad = {"value": b"\x07 not a record", "partition": 0}
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 3) + [bad, bad])  # bad at offsets 3 and 4
    config, spec = make_table(fmt, make_config, topic, errors="dlq", onDataLoss="warn")
    first = materialize_once(spark, config, spec)
    assert first.offsets == {0: 5} and first.records_failed == 2
    dlq = f"{first.identifier}_dlq"
    assert sorted(r["kafka_offset"] for r in read_pyiceberg(state_dir, dlq)) == [3, 4]

    broker.delete_topic(topic)
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [bad] + values(fmt, 100, 2) + [bad] + values(fmt, 103, 2))  # bad: 0, 3
    result = materialize_once(spark, config, spec)
    assert result.offsets == {0: 6} and result.records_failed == 2
    # The new log's bad records at 0 and 3 sit below the dead-letter table's old mark (5): they must be there too.
    assert sorted(r["kafka_offset"] for r in read_pyiceberg(state_dir, dlq)) == [0, 3, 3, 4]
    assert sorted(fmt.n_of(r) for r in read_pyiceberg(state_dir, result.identifier)) == [0, 1, 2, 100, 101, 103, 104]
    produce(broker.bootstrap_servers, topic, [bad] + values(fmt, 200, 1))  # and the mark goes on from the new log's
    assert materialize_once(spark, config, spec).offsets == {0: 8}
    assert sorted(r["kafka_offset"] for r in read_pyiceberg(state_dir, dlq)) == [0, 3, 3, 4, 6]


def test_partitions_added_between_runs_are_read_from_their_start(spark, broker, state_dir, topic, make_config, fmt):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 3, partition=0) + values(fmt, 3, 3, partition=1))
    config, spec = make_table(fmt, make_config, topic, startingOffsets="latest")
    first = materialize_once(spark, config, spec)
    assert first.offsets == {0: 3, 1: 3} and first.rows_written == 0, "latest: the first run records where it starts"
    assert first.status == "committed" and first.read_path == fmt.read_path

    produce(broker.bootstrap_servers, topic, values(fmt, 10, 2, partition=1))
    broker.add_partitions(topic, 3)
    produce(broker.bootstrap_servers, topic, values(fmt, 20, 4, partition=2))
    second = materialize_once(spark, config, spec)
    assert second.offsets == {0: 3, 1: 5, 2: 4}
    assert table_ns(fmt, state_dir, second.identifier) == [10, 11, 20, 21, 22, 23]


def test_latest_on_an_empty_topic_skips_nothing_produced_after_the_first_run(
    spark, broker, state_dir, topic, make_config, fmt
):
    broker.create_topic(topic, 2)
    config, spec = make_table(fmt, make_config, topic, startingOffsets="latest")
    first = materialize_once(spark, config, spec)
    assert first.status == "committed" and first.read_path == fmt.read_path
    assert first.offsets == {0: 0, 1: 0} and first.rows_written == 0
    assert materialize_once(spark, config, spec).status == "up-to-date"
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 2, partition=0) + values(fmt, 2, 2, partition=1))
    second = materialize_once(spark, config, spec)
    assert second.offsets == {0: 2, 1: 2} and second.read_path == fmt.read_path
    assert table_ns(fmt, state_dir, first.identifier) == [0, 1, 2, 3]


def test_earliest_on_an_empty_topic_records_its_start(spark, broker, state_dir, topic, make_config, fmt):
    broker.create_topic(topic, 2)
    config, spec = make_table(fmt, make_config, topic)
    first = materialize_once(spark, config, spec)
    assert first.status == "committed" and first.read_path == fmt.read_path
    assert first.offsets == {0: 0, 1: 0} and first.rows_written == 0
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 3, partition=1))
    assert materialize_once(spark, config, spec).offsets == {0: 0, 1: 3}
    assert table_ns(fmt, state_dir, first.identifier) == [0, 1, 2]


def test_a_partition_added_to_an_idle_topic_is_recorded_with_nothing_to_read(
    spark, broker, state_dir, topic, make_config, fmt
):
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 3))
    config, spec = make_table(fmt, make_config, topic)
    assert materialize_once(spark, config, spec).offsets == {0: 3}
    broker.add_partitions(topic, 2)
    added = materialize_once(spark, config, spec)
    assert added.status == "committed" and added.read_path == fmt.read_path
    assert added.offsets == {0: 3, 1: 0} and added.rows_written == 0
    produce(broker.bootstrap_servers, topic, values(fmt, 10, 2, partition=1))
    assert materialize_once(spark, config, spec).offsets == {0: 3, 1: 2}
    assert table_ns(fmt, state_dir, added.identifier) == [0, 1, 2, 10, 11]


def test_on_data_loss_warn_with_every_unread_record_deleted_commits_the_loss(
    spark, broker, state_dir, topic, make_config, fmt
):
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 5))
    config, spec = make_table(fmt, make_config, topic, onDataLoss="warn")
    assert materialize_once(spark, config, spec).offsets == {0: 5}
    produce(broker.bootstrap_servers, topic, values(fmt, 5, 5))
    for future in broker.admin.delete_records([TopicPartition(topic, 0, 10)]).values():
        future.result(30)
    result = materialize_once(spark, config, spec)
    assert result.status == "committed" and result.read_path == fmt.read_path
    assert result.data_lost == [{"partition": 0, "start": 5, "end": 10}] and result.offsets == {0: 10}
    assert materialize_once(spark, config, spec).status == "up-to-date"
    assert table_ns(fmt, state_dir, result.identifier) == list(range(5))


def test_record_budget_is_shared_fairly_across_partitions():
    assert share_budget({0: 1000, 1: 10, 2: 1000}, 100) == {0: 45, 1: 10, 2: 45}
    assert share_budget({0: 5, 1: 5}, None) == {0: 5, 1: 5}
    assert share_budget({0: 3, 1: 3, 2: 3}, 7) == {0: 2, 1: 2, 2: 3}
    assert sum(share_budget(dict.fromkeys(range(7), 1000), 999).values()) == 999


def test_a_partition_missing_from_the_metadata_keeps_its_committed_offset(monkeypatch):
    # A broker with stale metadata (just after partitions were added) lists fewer partitions than the table has read.
    monkeypatch.setattr(kafka_source, "list_partitions", lambda conf, topic: [0])
    monkeypatch.setattr(kafka_source, "topic_id", lambda conf, topic: None)
    monkeypatch.setattr(kafka_source, "log_bounds", lambda conf, topic, partitions: {0: (0, 8, 0)})
    plan = kafka_source.plan_ranges({"bootstrap.servers": "b:9092"}, "t", {0: 5, 1: 5}, "earliest", None)
    assert plan.next_offsets == {0: 8, 1: 5}, "a commit must not forget partition 1"
    assert [(r.partition, r.start, r.end) for r in plan.ranges] == [(0, 5, 8)]


def test_a_run_that_sees_fewer_partitions_commits_the_others_unchanged(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    fmt = Format(
        {"format": "json", "schema": SCHEMA}, "python", lambda n: json.dumps({"n": n}).encode(), lambda r: r["n"]
    )
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, values(fmt, 0, 3, partition=0) + values(fmt, 3, 2, partition=1))
    config, spec = make_table(fmt, make_config, topic)
    assert materialize_once(spark, config, spec).offsets == {0: 3, 1: 2}
    produce(broker.bootstrap_servers, topic, values(fmt, 10, 2, partition=0))
    listed = kafka_source.list_partitions
    monkeypatch.setattr(kafka_source, "list_partitions", lambda conf, t: [p for p in listed(conf, t) if p != 1])
    stale = materialize_once(spark, config, spec)
    assert stale.offsets == {0: 5, 1: 2}
    monkeypatch.undo()
    assert materialize_once(spark, config, spec).status == "up-to-date"
    assert table_ns(fmt, state_dir, stale.identifier) == [0, 1, 2, 3, 4, 10, 11]
