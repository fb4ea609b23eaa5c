"""Producing records in Confluent wire format (demo, tests, benchmarks): Avro, Protobuf or JSON Schema, with
confluent-kafka's own serializers, with optional progress."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, StringSerializer

from icefloe.errors import IcefloeError

# Large lz4 batches, idempotent: what producing a large topic quickly takes.
BATCHING = {
    "linger.ms": 20,
    "batch.num.messages": 10_000,
    "compression.type": "lz4",
    "enable.idempotence": True,
    "queue.buffering.max.messages": 500_000,
}


class SchemaRefused(IcefloeError):
    """The registry would not register the producer's schema (e.g. 409: incompatible with the subject's versions)."""

    def __init__(self, registry_url: str, subject: str, error: SchemaRegistryError):
        self.status = error.http_status_code
        reason = "incompatible with the subject's compatibility rule" if self.status == 409 else "refused"
        super().__init__(
            f"schema registry {registry_url} refused the schema for subject {subject!r} (HTTP {self.status}, "
            f"{reason}): {error.error_message}"
        )


def value_serializer(registry_url: str, format: str, schema):
    """confluent-kafka's serializer for a format: `schema` is Avro or JSON Schema text, or a Protobuf message class.
    It registers the schema under the topic's value subject on first use."""
    client = SchemaRegistryClient({"url": registry_url})
    if format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        return ProtobufSerializer(schema, client, {})
    if format == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        return JSONSerializer(schema, client)
    return AvroSerializer(client, schema)


def avro_producer(bootstrap: str, registry_url: str, schema_str: str, format: str = "avro"):
    """(producer, value serializer) for one schema, registered under the topic's value subject on first use."""
    producer = Producer({"bootstrap.servers": bootstrap, **BATCHING})
    return producer, value_serializer(registry_url, format, schema_str)


def produce_avro(
    bootstrap: str,
    registry_url: str,
    topic: str,
    schema_str: str,
    records: Iterable[tuple[str | None, dict | None]],
    total: int | None = None,
    progress: bool = False,
    format: str = "avro",
) -> int:
    """Produce (key, value) pairs; a None value is a tombstone. Returns the number of records acknowledged.
    For `format` protobuf, `schema_str` is the message class and values are messages."""
    producer, serializer = avro_producer(bootstrap, registry_url, schema_str, format)
    keys = StringSerializer()
    value_ctx = SerializationContext(topic, MessageField.VALUE)
    key_ctx = SerializationContext(topic, MessageField.KEY)
    failures: list[str] = []
    delivered = 0

    def on_delivery(error, _msg) -> None:
        nonlocal delivered
        if error is not None:
            failures.append(str(error))
        else:
            delivered += 1

    started = time.monotonic()
    step = max(1, (total or 0) // 10)
    for index, (key, value) in enumerate(records, 1):
        try:
            payload = None if value is None else serializer(value, value_ctx)
        except SchemaRegistryError as error:
            raise SchemaRefused(registry_url, f"{topic}-value", error) from None
        while True:
            try:
                producer.produce(topic, key=keys(key, key_ctx), value=payload, on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.1)
        producer.poll(0)
        if progress and total and index % step == 0:
            rate = index / max(time.monotonic() - started, 1e-6)
            print(f"  produced {index:>9,}/{total:,} ({rate:,.0f} records/s)", file=sys.stderr, flush=True)
    producer.flush(60)
    if failures:
        raise RuntimeError(f"{len(failures)} records were not delivered to {topic}: {failures[0]}")
    return delivered


def produce_avro_quickly(
    bootstrap: str, registry_url: str, topic: str, schema: dict, records: Iterable[tuple[bytes, dict | None]]
) -> tuple[int, int]:
    """Benchmarks' producer: (key bytes, value) pairs, a None value a tombstone, serialized with fastavro in Confluent
    framing (the schema registered under the topic's subject) and sent in large lz4 batches: several times the rate
    of `produce_avro`, so producing a benchmark's topic stays short. Returns (records, key and value bytes)."""
    import io
    import json
    import struct

    import fastavro
    from confluent_kafka.schema_registry import Schema

    registered = SchemaRegistryClient({"url": registry_url}).register_schema(
        f"{topic}-value", Schema(json.dumps(schema), "AVRO")
    )
    parsed, header = fastavro.parse_schema(schema), b"\x00" + struct.pack(">I", registered)
    producer = Producer({"bootstrap.servers": bootstrap, **BATCHING})
    count = size = 0
    for key, value in records:
        payload = None
        if value is not None:
            buffer = io.BytesIO()
            buffer.write(header)
            fastavro.schemaless_writer(buffer, parsed, value)
            payload = buffer.getvalue()
        while True:
            try:
                producer.produce(topic, key=key, value=payload)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.1)
        producer.poll(0)
        count, size = count + 1, size + len(key) + len(payload or b"")
    if producer.flush(120) != 0:
        raise RuntimeError(f"records were not delivered to {topic} within 120 s")
    return count, size
