"""Debezium change events (`envelope: debezium`) through the real broker and registry: mirror tables equal the
source table, whatever the encoding (Avro with referenced or self-contained schemas, JSON with or without the
JsonConverter's wrapper), and never regress (replays, truncates, deletes), read back with pyiceberg and DuckDB."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icefloe.errors import RecordError
from icefloe.runner import run_table
from support import produce, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
PLACEHOLDER = "__debezium_unavailable_value"


def value_record(topic: str) -> dict:
    return {"type": "record", "name": "Value", "namespace": topic, "connect.name": f"{topic}.Value", "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "notes", "type": ["null", "string"], "default": None},
        {"name": "born", "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}], "default": None},
    ]}  # fmt: skip


def source_record() -> dict:
    return {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
        {"name": "connector", "type": "string"}, {"name": "ts_ms", "type": "long"},
        {"name": "lsn", "type": ["null", "long"], "default": None}, {"name": "sequence", "type": ["null", "string"], "default": None},
        {"name": "txId", "type": ["null", "long"], "default": None},
    ]}  # fmt: skip


def envelope(topic: str, value: object, source: object) -> dict:
    return {"type": "record", "name": "Envelope", "namespace": topic, "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", f"{topic}.Value" if value == f"{topic}.Value" else "Value"], "default": None},
        {"name": "source", "type": source}, {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ]}  # fmt: skip


class Events:
    """Debezium-shaped events of a PostgreSQL table `(id int primary key, name, notes, born date)`."""

    def __init__(self, topic: str, encoding: str, registry_url: str | None = None):
        self.topic, self.encoding, self.lsn = topic, encoding, 1000
        self.last_commit = 0
        if encoding.startswith("avro"):
            client = SchemaRegistryClient({"url": registry_url})
            value = value_record(topic)
            if encoding == "avro-referenced":  # as Apicurio's converter registers them: nested records as subjects
                client.register_schema(f"{topic}.Value", Schema(json.dumps(value), "AVRO"))
                client.register_schema("io.debezium.connector.postgresql.Source", Schema(json.dumps(source_record()), "AVRO"))
                refs = [SchemaReference(f"{topic}.Value", f"{topic}.Value", 1),
                        SchemaReference("io.debezium.connector.postgresql.Source", "io.debezium.connector.postgresql.Source", 1)]  # fmt: skip
                schema = Schema(json.dumps(envelope(topic, f"{topic}.Value", "io.debezium.connector.postgresql.Source")), "AVRO", refs)
            else:
                schema = Schema(json.dumps(envelope(topic, value, source_record())), "AVRO")
            key_schema = {"type": "record", "name": "Key", "namespace": topic, "fields": [{"name": "id", "type": "int"}]}
            conf = {"auto.register.schemas": True}
            self.value = AvroSerializer(client, schema, conf=conf)
            self.key = AvroSerializer(client, json.dumps(key_schema), conf=conf)

    def source(self, lsn: int) -> dict:
        return {"connector": "postgresql", "ts_ms": 1_700_000_000_000 + lsn, "lsn": lsn,
                "sequence": json.dumps([str(self.last_commit), str(lsn)]), "txId": 7}  # fmt: skip

    def encode_key(self, key: dict | None) -> bytes | None:
        if key is None:
            return None
        if self.encoding.startswith("avro"):
            return self.key(key, SerializationContext(self.topic, MessageField.KEY))
        if self.encoding == "json-schema":
            schema = {"type": "struct", "optional": False, "fields": [{"type": "int32", "optional": False, "field": "id"}]}
            return json.dumps({"schema": schema, "payload": key}).encode()
        return json.dumps(key).encode()

    def encode_value(self, value: dict | None) -> bytes | None:
        if value is None:
            return None
        if self.encoding.startswith("avro"):
            return self.value(value, SerializationContext(self.topic, MessageField.VALUE))
        if self.encoding == "json-schema":
            row = {"type": "struct", "optional": True, "fields": [
                {"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "name"},
                {"type": "string", "optional": True, "field": "notes"},
                {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "born"}]}  # fmt: skip
            schema = {"type": "struct", "name": f"{self.topic}.Envelope", "optional": False, "fields": [
                {**row, "field": "before"}, {**row, "field": "after"},
                {"type": "struct", "optional": False, "field": "source", "fields": [
                    {"type": "string", "optional": False, "field": "connector"}, {"type": "int64", "optional": False, "field": "ts_ms"},
                    {"type": "int64", "optional": True, "field": "lsn"}, {"type": "string", "optional": True, "field": "sequence"},
                    {"type": "int64", "optional": True, "field": "txId"}]},
                {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}  # fmt: skip
            return json.dumps({"schema": schema, "payload": value}).encode()
        return json.dumps(value).encode()

    def event(self, op: str, key: dict | None, before=None, after=None, lsn: int | None = None, headers=None, partition=0) -> dict:
        if lsn is None:
            self.lsn += 10
            lsn = self.lsn
        value = {"before": before, "after": after, "source": self.source(lsn), "op": op, "ts_ms": 1_700_000_000_000}
        return {"key": self.encode_key(key), "value": self.encode_value(value), "headers": headers, "partition": partition}

    def commit(self) -> None:
        self.last_commit = self.lsn

    def upsert(self, op: str, id: int, name, notes="n", born=19000, **kw) -> dict:
        return self.event(op, {"id": id}, after={"id": id, "name": name, "notes": notes, "born": born}, **kw)

    def delete(self, id: int, **kw) -> list[dict]:
        before = {"id": id, "name": None, "notes": None, "born": None}
        return [self.event("d", {"id": id}, before=before, **kw),
                {"key": self.encode_key({"id": id}), "value": None, "partition": kw.get("partition", 0)}]  # fmt: skip


def state(rows: list[dict]) -> dict[int, tuple]:
    keyed: dict[int, tuple] = {}
    for row in rows:
        assert row["id"] not in keyed, f"two rows for id {row['id']}"
        keyed[row["id"]] = (row["name"], row["notes"], str(row["born"]))
    return keyed


ENCODINGS = ["avro-referenced", "avro-inline", "json-schema", "json-plain"]


def table_config(make_config, topic: str, encoding: str, **extra):
    return make_config({"topic": topic, "format": "avro" if encoding.startswith("avro") else "json",
                        "envelope": "debezium", "mode": "upsert", **extra})  # fmt: skip


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_mirror_table_applies_creates_updates_deletes(spark, broker, registry, state_dir, topic, make_config, encoding):
    """c/r/u upsert `after`, d deletes, the tombstone changes nothing; the columns are the source table's."""
    topic = f"{topic}"
    broker.create_topic(topic, 1)
    events = Events(topic, encoding, registry.url)
    records = [events.upsert("r", 1, "snap-1"), events.upsert("r", 2, "snap-2"), events.upsert("r", 3, "snap-3")]
    events.commit()
    records += [events.upsert("c", 4, "new-4"), events.upsert("u", 2, "upd-2"), *events.delete(3)]
    produce(broker.bootstrap_servers, topic, records)
    config = table_config(make_config, topic, encoding)
    result = run_table(spark, config, config.tables[0], state_dir)
    born = "2022-01-08" if encoding != "json-plain" else "19000"
    expected = {1: ("snap-1", "n", born), 2: ("upd-2", "n", born), 4: ("new-4", "n", born)}
    rows = read_pyiceberg(state_dir, result.identifier)
    assert state(rows) == expected
    assert sorted(c for c in rows[0] if not c.startswith("kafka_")) == ["born", "cdc_position", "id", "name", "notes"]
    assert state(read_duckdb(result.metadata_location)) == expected
    # A second batch: a replay of the earlier events (a connector restart) changes nothing; newer ones apply.
    replay = Events(topic, encoding, registry.url)
    replayed = [replay.upsert("r", 1, "snap-1"), replay.upsert("r", 2, "snap-2"), replay.upsert("r", 3, "snap-3")]
    replay.commit()
    replayed += [replay.upsert("c", 4, "new-4"), replay.upsert("u", 2, "upd-2"), *replay.delete(3)]
    produce(broker.bootstrap_servers, topic, [*replayed, events.upsert("u", 1, "upd-1")])
    result = run_table(spark, config, config.tables[0], state_dir)
    expected[1] = ("upd-1", "n", born)
    assert state(read_pyiceberg(state_dir, result.identifier)) == expected
