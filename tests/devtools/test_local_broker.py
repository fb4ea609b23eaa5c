"""The local services: Apache Kafka and Apicurio Registry as real processes that start, serve clients and stop."""

from __future__ import annotations

import os
import socket

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from icefloe_dev.kafka_broker import KafkaBroker
from icefloe_dev.processes import ServiceError
from icefloe_dev.schema_registry import SchemaRegistry

RECORDS = [
    # (key, value, headers)
    (b"k1", b"first", [("source", b"test"), ("n", b"1")]),
    (b"k2", b"second", [("source", b"test")]),
    (b"k1", b"third", []),
    (b"k3", b"", [("kind", b"empty-value")]),
    (b"k2", None, [("kind", b"tombstone")]),
]


def produce(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """Produce RECORDS; returns the (partition, offset) of each, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    positions: list[tuple[int, int] | None] = [None] * len(RECORDS)

    def remember(index: int):
        def on_delivery(error, msg) -> None:
            assert error is None, error
            positions[index] = (msg.partition(), msg.offset())

        return on_delivery

    for index, (key, value, headers) in enumerate(RECORDS):
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=remember(index))
    assert producer.flush(10) == 0
    assert None not in positions
    return positions  # type: ignore[return-value]


def consume_all(bootstrap: str, topic: str, partitions: int) -> list:
    """Every record of every partition, read with assign() from the beginning up to partition EOF."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    messages, at_eof = [], set()
    try:
        while len(at_eof) < partitions:
            msg = consumer.poll(10)
            assert msg is not None, "no message or EOF within 10 s"  # `msg is not None`: tombstones are falsy
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_eof.add(msg.partition())
            else:
                messages.append(msg)
    finally:
        consumer.close()
    return messages


@pytest.mark.process
def test_broker_serves_produce_and_consume_then_stops(tmp_path):
    broker = KafkaBroker(tmp_path / "broker")
    with broker:
        assert broker.running
        pid, port = broker.pid, broker.port
        broker.create_topic("orders", 3)

        positions = produce(broker.bootstrap_servers, "orders")
        messages = consume_all(broker.bootstrap_servers, "orders", 3)

        # Each record comes back at its position with its key, value (None and b"" kept apart) and headers.
        got = {(m.partition(), m.offset()): (m.key(), m.value(), m.headers() or []) for m in messages}
        assert len(messages) == len(RECORDS)
        assert got == dict(zip(positions, RECORDS))
        assert got[positions[4]][1] is None and got[positions[3]][1] == b""
        # The same key always lands in the same partition.
        assert positions[0][0] == positions[2][0] and positions[1][0] == positions[4][0]
        assert (tmp_path / "broker" / "kafka.log").is_file()

    assert not broker.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    broker.stop()  # a second stop is harmless


def test_create_topic_reports_existing_topic(broker):
    broker.create_topic("test_local_broker_once", 2)
    with pytest.raises(ServiceError, match="could not create topic 'test_local_broker_once'.*already exists"):
        broker.create_topic("test_local_broker_once", 2)


@pytest.mark.process
def test_startup_failure_shows_the_log_tail(tmp_path, monkeypatch):
    broker = KafkaBroker(tmp_path, heap="1k")  # the JVM refuses a heap this small
    with pytest.raises(ServiceError, match=r"(?s)kafka exited with code \d+ while starting.*last lines of .*kafka.log"):
        broker.start()
    assert not broker.running


def test_missing_jars_say_to_run_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("ICEFLOE_JVM_LIB", str(tmp_path / "nowhere"))
    with pytest.raises(ServiceError, match=r"nowhere/kafka is missing or empty: run scripts/setup.sh"):
        KafkaBroker(tmp_path).start()
    with pytest.raises(ServiceError, match=r"nowhere/registry is missing or empty: run scripts/setup.sh"):
        SchemaRegistry(tmp_path).start()


def test_registry_enforces_backward_compatibility(registry):
    """The local registry behaves like Confluent's default: an incompatible version is refused with 409."""
    import json

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = SchemaRegistryClient({"url": registry.url})
    v1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
    added_optional = {**v1, "fields": [*v1["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}
    added_required = {**v1, "fields": [*v1["fields"], {"name": "age", "type": "int"}]}
    subject = "test_local_broker_users-value"
    first = client.register_schema(subject, Schema(json.dumps(v1), "AVRO"))
    assert client.register_schema(subject, Schema(json.dumps(added_optional), "AVRO")) != first
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(added_required), "AVRO"))
    assert refused.value.http_status_code == 409
    assert list(client.get_versions(subject)) == [1, 2]
