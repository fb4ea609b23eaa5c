"""Debezium Avro mirror tables on the JVM read path (formats.debezium.jvm): the same topic read on the JVM path and
on the Python path gives the same table, row for row (every op, the TOAST placeholder, a primary-key change, a
truncate, replays, bad events), read back with pyiceberg and DuckDB; what the JVM does not cover goes to Python,
with Python's errors."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import functions as F

from icefloe.errors import RecordError
from icefloe.formats.debezium.format import DEBEZIUM
from icefloe.formats.registry import decoder_spec
from icefloe.operate.runner import run_table
from support import produce, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
PLACEHOLDER = "__debezium_unavailable_value"


def row_record(topic: str, extra: list[dict] | None = None) -> dict:
    def optional(kind) -> list:
        return ["null", kind]

    return {"type": "record", "name": "Value", "namespace": topic, "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": optional("string"), "default": None},
        {"name": "notes", "type": optional("string"), "default": None},
        {"name": "blob", "type": optional("bytes"), "default": None},
        {"name": "small", "type": optional({"type": "int", "connect.type": "int16"}), "default": None},
        {"name": "flag", "type": optional("boolean"), "default": None},
        {"name": "score", "type": optional("double"), "default": None},
        {"name": "born", "type": optional({"type": "int", "connect.name": "io.debezium.time.Date"}), "default": None},
        {"name": "seen", "type": optional({"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}),
         "default": None},
        {"name": "at", "type": optional({"type": "long", "connect.name": "io.debezium.time.Timestamp"}), "default": None},
        {"name": "nanos", "type": optional({"type": "long", "connect.name": "io.debezium.time.NanoTimestamp"}),
         "default": None},
        {"name": "amount", "type": optional({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2,
                                             "connect.name": "org.apache.kafka.connect.data.Decimal",
                                             "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}}),
         "default": None},
        {"name": "zoned", "type": optional({"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}),
         "default": None},
        *(extra or []),
    ]}  # fmt: skip


def envelope_schema(topic: str, row: dict) -> dict:
    source = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
        {"name": "connector", "type": "string"}, {"name": "ts_ms", "type": "long"},
        {"name": "lsn", "type": ["null", "long"], "default": None},
        {"name": "sequence", "type": ["null", "string"], "default": None}]}  # fmt: skip
    return {"type": "record", "name": "Envelope", "namespace": topic, "fields": [
        {"name": "before", "type": ["null", row], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": source}, {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}  # fmt: skip


class Events:
    def __init__(self, topic: str, registry_url: str, row: dict, referenced: bool = False):
        client = SchemaRegistryClient({"url": registry_url})
        conf = {"auto.register.schemas": True}
        key = {"type": "record", "name": "Key", "namespace": topic, "fields": [{"name": "id", "type": "long"}]}
        schema = Schema(json.dumps(envelope_schema(topic, row)), "AVRO")
        if referenced:  # as Apicurio's converter registers them: the row and the source records as subjects
            envelope = envelope_schema(topic, f"{topic}.Value")
            source = envelope["fields"][2]["type"]
            envelope["fields"][2]["type"] = "io.debezium.connector.postgresql.Source"
            refs = []
            for subject, record in ((f"{topic}.Value", row), (f"{topic}.Source", source)):
                name = f"{record.get('namespace', topic)}.{record['name']}"
                registered = Schema(json.dumps(record), "AVRO")
                client.register_schema(subject, registered)
                refs.append(SchemaReference(name, subject, client.lookup_schema(subject, registered).version))
            schema = Schema(json.dumps(envelope), "AVRO", refs)
        self.value = AvroSerializer(client, schema, conf=conf)
        self.key = AvroSerializer(client, json.dumps(key), conf=conf)
        self.topic, self.lsn, self.last_commit = topic, 1000, 0

    def event(self, op, key, before=None, after=None, lsn=None, headers=None, partition=0, sequence=True) -> dict:
        if lsn is None:
            self.lsn += 10
            lsn = self.lsn
        source = {"connector": "postgresql", "ts_ms": 1_700_000_000_000 + lsn, "lsn": lsn,
                  "sequence": sequence if isinstance(sequence, str) else  # as given, else the usual form or none
                              json.dumps([str(self.last_commit), str(lsn)]) if sequence else None}  # fmt: skip
        value = {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1_700_000_000_000}
        encoded = self.value(value, SerializationContext(self.topic, MessageField.VALUE))
        return {"key": self.encode_key(key), "value": encoded, "headers": headers, "partition": partition}

    def encode_key(self, key: dict | None) -> bytes | None:
        return None if key is None else self.key(key, SerializationContext(self.topic, MessageField.KEY))

    def row(self, id: int, name: str, notes="n", blob=b"b", **extra) -> dict:
        return {"id": id, "name": name, "notes": notes, "blob": blob, "small": -3, "flag": id % 2 == 0,
                "score": id / 3, "born": 19000 + id, "seen": 1_700_000_000_123_456 + id, "at": -1_000_000_123 * id,
                "nanos": -1_700_000_000_123_456_789, "amount": Decimal(id) / 4,
                "zoned": f"2024-01-0{id % 9 + 1}T03:04:05.{id}Z" if id % 2 else "2024-02-29T23:59:59Z", **extra}  # fmt: skip

    def upsert(self, op: str, id: int, name: str, **kw) -> dict:
        fields = {k: kw.pop(k) for k in ("notes", "blob") if k in kw}
        return self.event(op, {"id": id}, after=self.row(id, name, **fields), **kw)

    def delete(self, id: int, **kw) -> list[dict]:
        before = {**dict.fromkeys(self.row(id, "")), "id": id}
        tombstone = {"key": self.encode_key({"id": id}), "value": None, "partition": kw.get("partition", 0)}
        return [self.event("d", {"id": id}, before=before, **kw), tombstone]

    def commit(self) -> None:
        self.last_commit = self.lsn


def python_path(monkeypatch) -> None:
    monkeypatch.setattr(DEBEZIUM, "jvm_codec", lambda spark, spec: "forced to Python by the test", raising=False)


def both_paths(spark, make_config, state_dir, monkeypatch, topic: str, **extra) -> tuple[list, list, list]:
    """One batch of the topic into two mirror tables, one read on each path: (their rows, the two results)."""
    config = make_config(
        *[
            {
                "topic": topic,
                "table": f"{topic}_{path}",
                "format": "avro",
                "envelope": "debezium",
                "mode": "upsert",
                **extra,
            }
            for path in ("jvm", "python")
        ]  # fmt: skip
    )
    results = [run_table(spark, config, config.tables[0], state_dir)]
    with monkeypatch.context() as patched:
        python_path(patched)
        results.append(run_table(spark, config, config.tables[1], state_dir))
    rows = [
        sorted(read_pyiceberg(state_dir, r.identifier), key=lambda row: row["id"]) if r.identifier else []
        for r in results
    ]
    return rows[0], rows[1], results


def exact_events(spark, make_config, broker, topic: str) -> int:
    """How many of the topic's change events (tombstones apart) the JVM codec decodes exactly."""
    config = make_config({"topic": topic, "format": "avro", "envelope": "debezium", "mode": "upsert"})
    spec = decoder_spec(config.tables[0], config.cluster("local"))
    codec = DEBEZIUM.jvm_codec(spark, spec)
    assert not isinstance(codec, str), codec
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .select("value", F.col("key").alias("kafka_key"), F.col("headers").alias("kafka_headers"))
        .where(F.col("value").isNotNull())
    )
    decoded = raw.select("*", codec.decoded(F.col("value")).alias("s"))
    return decoded.where(codec.exact(F.col("value"), "s")).count()


OLD_KEY = "__debezium.oldkey"
WRAPPED_OLD_KEY = json.dumps(
    {"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]}, "payload": {"id": 5}}
).encode()


@pytest.mark.parametrize("schemas", ["self-contained", "referenced"])
def test_jvm_path_equals_python_path_row_for_row(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch, schemas
):
    """c, r, u (unchanged TOAST text and bytes), d with its tombstone, primary-key changes (the `c` carries the old
    key in a header: a plain JSON object on the JVM, other forms Python's), a truncate (Python), bad events
    (Python's errors), then replays of older positions: the table the JVM path writes is the Python path's, column
    for column, and the JVM decoded most of it. Also with the nested records as referenced subjects (Apicurio's
    converter)."""
    broker.create_topic(topic, 2)
    events = Events(topic, registry.url, row_record(topic), referenced=schemas == "referenced")
    first = [events.upsert("r", i, f"snap-{i}", partition=i % 2) for i in range(1, 9)]
    events.commit()
    old_key = [("__debezium.oldkey", json.dumps({"id": 7}).encode())]
    first += [
        events.upsert("c", 20, "new-20"),
        events.upsert("u", 2, "upd-2", notes=PLACEHOLDER, blob=PLACEHOLDER.encode()),  # TOAST: the row keeps them
        events.upsert("u", 4, "upd-4", notes=None, partition=0),
        *events.delete(3, partition=1),
        *events.delete(7, lsn=events.lsn + 10, partition=1),  # a primary-key change: d and c at one lsn
        events.upsert("c", 70, "moved", notes=PLACEHOLDER, lsn=events.lsn + 10, headers=old_key, partition=0),
        # the header as Connect's header converter writes it (no blanks), and forms only Python decodes
        events.upsert("c", 73, "compact", notes=PLACEHOLDER, headers=[(OLD_KEY, b'{"id":4}')], partition=1),
        events.upsert("c", 74, "after-json", headers=[(OLD_KEY, b'{"id": 7} x')]),  # bad: not JSON
        events.upsert("c", 75, "twice", notes=PLACEHOLDER, headers=[(OLD_KEY, b'{"id": 1, "id": 2}')]),
        events.upsert("c", 76, "wrapped", notes=PLACEHOLDER, headers=[(OLD_KEY, WRAPPED_OLD_KEY)], partition=1),
        events.upsert("u", 5, "no-sequence", sequence=False, partition=1),
        events.event("x", {"id": 6}, after=events.row(6, "unknown-op")),  # bad: an unknown op
        events.upsert("u", 8, "wrong-key", partition=0) | {"key": events.encode_key({"id": 9})},  # bad: key mismatch
        events.event("c", {"id": 30}, after=events.row(30, "far", born=10**8)),  # bad: a date past 9999
        events.event("c", {"id": 31}, after=events.row(31, "no-day", zoned="2023-02-29T00:00:00Z")),  # bad
        events.event("c", {"id": 32}, after=events.row(32, "zone", zoned="2023-02-01T00:00:00+01:00")),  # Python's
        events.event("c", {"id": 33}, after=events.row(33, "break", zoned="2023-02-01T00:00:00Z\n")),  # bad
        # sequences of other forms Debezium's JSON allows: blanks, a null lastCommitLsn or lsn
        events.upsert("u", 1, "spaced", sequence='[ "5" , null ]', partition=1),
        events.upsert("u", 8, "null-last", sequence=f'[null,"{events.lsn + 15}"]', partition=0),
    ]
    produce(broker.bootstrap_servers, topic, first)
    jvm, python, results = both_paths(spark, make_config, state_dir, monkeypatch, topic, errors="skip")
    assert [r.read_path for r in results] == ["jvm", "python"]
    assert [r.records_failed for r in results] == [6, 6]
    assert jvm == python
    assert {r["id"] for r in jvm} == {1, 2, 4, 5, 6, 8, 20, 32, 70, 73, 75, 76}
    by_id = {r["id"]: r for r in jvm}
    assert (by_id[2]["notes"], by_id[2]["blob"], by_id[70]["notes"]) == ("n", b"b", "n")
    assert [by_id[i]["notes"] for i in (73, 75, 76)] == [None, "n", "n"]  # 4's notes were set null before
    assert by_id[1]["at"] == dt.datetime(1970, 1, 1) - dt.timedelta(milliseconds=1_000_000_123)
    assert read_duckdb(results[0].metadata_location, "count(*) AS n")[0]["n"] == len(python)
    # 27 change events; the two primary-key changes in other forms, the six bad events and the zoned time not in
    # Z go to Python
    assert exact_events(spark, make_config, broker, topic) == 18

    # Replays of older positions (a connector restart) change nothing; a truncate (Python) empties the table;
    # newer events after it apply.
    events.commit()
    replay = Events(topic, registry.url, row_record(topic), referenced=schemas == "referenced")
    second = [replay.upsert("r", i, f"replayed-{i}") for i in range(1, 5)]
    second += [events.event("t", None, partition=1)]
    second += [events.upsert("c", 40, "after-truncate", partition=1), events.upsert("u", 41, "after-2")]
    produce(broker.bootstrap_servers, topic, second)
    jvm, python, results = both_paths(spark, make_config, state_dir, monkeypatch, topic, errors="skip")
    assert jvm == python
    assert {r["id"] for r in jvm} == {40, 41}


def test_bad_events_fail_with_pythons_error(spark, broker, registry, state_dir, topic, make_config):
    """An unknown op on the JVM path: the record goes to Python, which names it as before (`fail` stops there)."""
    broker.create_topic(topic, 1)
    events = Events(topic, registry.url, row_record(topic))
    positions = produce(
        broker.bootstrap_servers,
        topic,
        [
            events.upsert("c", 1, "a"),
            events.event("x", {"id": 2}, after=events.row(2, "b")),
            events.upsert("c", 3, "c"),
        ],
    )
    config = make_config({"topic": topic, "format": "avro", "envelope": "debezium", "mode": "upsert"})
    with pytest.raises(RecordError) as caught:
        run_table(spark, config, config.tables[0], state_dir)
    assert (caught.value.partition, caught.value.offset, caught.value.kind) == (*positions[1], "InvalidChange")
    assert "unknown op" in caught.value.cause


def test_uncovered_types_read_on_python(spark, broker, registry, state_dir, topic, make_config):
    """A column of a type the JVM codec does not cover (a text array): the table reads on Python, as before."""
    broker.create_topic(topic, 1)
    tags = {"name": "tags", "type": ["null", {"type": "array", "items": ["null", "string"]}], "default": None}
    events = Events(topic, registry.url, row_record(topic, [tags]))
    record = events.event("c", {"id": 1}, after=events.row(1, "a", tags=["x", None]))
    produce(broker.bootstrap_servers, topic, [record])
    config = make_config({"topic": topic, "format": "avro", "envelope": "debezium", "mode": "upsert"})
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.read_path == "python" and result.records_failed == 0
    rows = read_pyiceberg(state_dir, result.identifier)
    assert rows[0]["tags"] == ["x", None]
