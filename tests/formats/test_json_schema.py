"""JSON Schema topics through the real registry (Apicurio, Confluent API), end to end into Iceberg.

Records are produced with confluent-kafka's own JSONSerializer (which validates them too); references are registered
subjects named by `$ref`. Tables are read back with pyiceberg and DuckDB.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from icefloe.errors import ConfigError
from icefloe.materialize.batch import materialize_once
from support import as_utc, json_schema_serializer, produce, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]

ADDRESS = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
    "required": ["street"],
}
ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "definitions": {
        "line": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            "required": ["sku", "qty"],
            "additionalProperties": False,
        }
    },
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "count": {"type": "integer"},
        "price": {"type": "number"},
        "paid": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "note": {"type": ["string", "null"]},
        "coupon": {"oneOf": [{"type": "null"}, {"type": "string"}]},
        "status": {"enum": ["NEW", "PAID"]},
        "lines": {"type": "array", "items": {"$ref": "#/definitions/line"}},
        "ship_to": {"$ref": "address.json"},
        "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
        "anything": {},
        "meta": {"type": "object", "properties": {"source": {"type": "string"}}, "additionalProperties": True},
    },
    "required": ["id", "count"],
    "additionalProperties": False,
}


def order_schema(registry_url: str, topic: str, schema: dict = ORDER) -> Schema:
    """The order schema with its address reference registered under a subject of this test."""
    client = SchemaRegistryClient({"url": registry_url})
    subject = f"{topic}-address"
    client.register_schema(subject, Schema(json.dumps(ADDRESS), "JSON"))
    version = client.get_latest_version(subject).version
    return Schema(json.dumps(schema), "JSON", [SchemaReference("address.json", subject, version)])


FULL = {
    "id": "0b0e8b2e-3c3a-4a57-9d53-8f2f8d2d1c11",
    "count": 3,
    "price": 9.5,
    "paid": True,
    "at": "2024-02-29T12:30:01.250+01:00",
    "day": "2024-02-29",
    "note": "hi",
    "coupon": None,
    "status": "PAID",
    "lines": [{"sku": "a", "qty": 2}],
    "ship_to": {"street": "Main 1", "zip": "1000"},
    "labels": {"x": 1},
    "anything": {"deep": [1, 2]},
    "meta": {"source": "web", "campaign": "spring"},
}


def test_every_json_schema_type_from_confluents_serializer(spark, broker, registry, state_dir, topic, make_config):
    serialize = json_schema_serializer(registry.url, topic, order_schema(registry.url, topic))
    broker.create_topic(topic, 1)
    produce(
        broker.bootstrap_servers,
        topic,
        [
            {"value": serialize(FULL)},
            {"value": serialize({"id": "0b0e8b2e-3c3a-4a57-9d53-8f2f8d2d1c12", "count": 0, "meta": {"source": "app"}})},
        ],
    )
    config = make_config({"topic": topic, "format": "json-schema"})
    result = materialize_once(spark, config, config.tables[0])
    assert result.read_path == "python" and result.rows_written == 2

    readers = {
        "pyiceberg": read_pyiceberg(state_dir, result.identifier),
        "duckdb": read_duckdb(result.metadata_location),
    }
    # A null list comes back from pyiceberg 0.12 as [] (DuckDB: null); Spark wrote null.
    for reader, rows in readers.items():
        rows = {r["count"]: r for r in rows}
        full = rows[3]
        assert (full["id"], full["price"], full["paid"], full["note"], full["coupon"], full["status"]) == (
            FULL["id"],
            9.5,
            True,
            "hi",
            None,
            "PAID",
        )
        assert as_utc(full["at"]) == dt.datetime(2024, 2, 29, 11, 30, 1, 250000, tzinfo=dt.UTC)
        assert full["day"] == dt.date(2024, 2, 29)
        assert full["lines"] == [{"sku": "a", "qty": 2}]
        assert full["ship_to"] == {"street": "Main 1", "zip": "1000"}
        assert (dict(full["labels"]) if isinstance(full["labels"], list) else full["labels"]) == {"x": 1}
        assert json.loads(full["anything"]) == {"deep": [1, 2]}
        assert full["meta"]["source"] == "web" and json.loads(full["meta"]["additional_properties"]) == {
            "campaign": "spring"
        }
        sparse = rows[0]
        assert (sparse["price"], sparse["at"], sparse["ship_to"], sparse["anything"]) == (None,) * 4
        assert sparse["lines"] == ([] if reader == "pyiceberg" else None)
        assert sparse["meta"] == {"source": "app", "additional_properties": None}


def test_new_property_adds_a_column_incompatible_change_is_refused(
    spark, broker, registry, state_dir, topic, make_config
):
    serialize = json_schema_serializer(registry.url, topic, order_schema(registry.url, topic))
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": serialize({"id": FULL["id"], "count": 1})}])
    config = make_config({"topic": topic, "format": "json-schema"})
    materialize_once(spark, config, config.tables[0])

    v2 = {**ORDER, "properties": {**ORDER["properties"], "channel": {"type": "string"}}}
    serialize_v2 = json_schema_serializer(registry.url, topic, order_schema(registry.url, topic, v2))
    produce(
        broker.bootstrap_servers, topic, [{"value": serialize_v2({"id": FULL["id"], "count": 2, "channel": "web"})}]
    )
    result = materialize_once(spark, config, config.tables[0])
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        assert sorted((r["count"], r["channel"]) for r in rows) == [(1, None), (2, "web")]

    # `count` becomes a string: the registry (BACKWARD) refuses it...
    breaking = {**v2, "properties": {**v2["properties"], "count": {"type": "string"}}}
    client = SchemaRegistryClient({"url": registry.url})
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(f"{topic}-value", order_schema(registry.url, topic, breaking))
    assert refused.value.http_status_code == 409, refused.value
    # ...and where a registry lets it through, the table refuses the type change with a clear error.
    registry.set_compatibility("NONE")
    try:
        client.register_schema(f"{topic}-value", order_schema(registry.url, topic, breaking))
    finally:
        registry.set_compatibility("BACKWARD")
    # (the table takes a new version when a record written with it is planned)
    serialize_v3 = json_schema_serializer(registry.url, topic, order_schema(registry.url, topic, breaking))
    produce(broker.bootstrap_servers, topic, [{"value": serialize_v3({"id": FULL["id"], "count": "3"})}])
    with pytest.raises(ConfigError, match="column count changed from bigint to string: not a safe evolution"):
        materialize_once(spark, config, config.tables[0])


def test_upsert_keyed_by_a_field_with_json_schema_keys(spark, broker, registry, state_dir, topic, make_config):
    """`key: [account]`, keyFormat json-schema (the default for a JSON Schema table): a tombstone's key deletes its row."""
    draft = "http://json-schema.org/draft-07/schema#"
    key_schema = {
        "$schema": draft,
        "type": "object",
        "properties": {"account": {"type": "string"}},
        "required": ["account"],
    }
    value_schema = {
        "$schema": draft,
        "type": "object",
        "properties": {"account": {"type": "string"}, "balance": {"type": "integer"}},
    }
    key = json_schema_serializer(registry.url, topic, json.dumps(key_schema), key=True)
    value = json_schema_serializer(registry.url, topic, json.dumps(value_schema))

    def upsert(account, balance):
        return {"key": key({"account": account}), "value": value({"account": account, "balance": balance})}

    broker.create_topic(topic, 1)
    produce(
        broker.bootstrap_servers,
        topic,
        [upsert("a", 1), upsert("b", 2), upsert("a", 3), {"key": key({"account": "b"}), "value": None}],
    )
    config = make_config({"topic": topic, "format": "json-schema", "mode": "upsert", "key": ["account"]})
    result = materialize_once(spark, config, config.tables[0])
    assert [(r["account"], r["balance"]) for r in read_pyiceberg(state_dir, result.identifier)] == [("a", 3)]


DRAFT = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_property_names_with_a_dot_or_a_backtick_are_plain_columns(
    spark, broker, registry, state_dir, topic, make_config, mode
):
    """Property names become column names unchanged: Spark must not read `user.id` as field `id` of `user`, nor a
    backtick as the end of a quoted name (in the append, the table's conforming select and the MERGE text)."""
    schema = {
        "$schema": DRAFT,
        "type": "object",
        "properties": {"user.id": {"type": "string"}, "a`b": {"type": "integer"}},
    }
    value = json_schema_serializer(registry.url, topic, json.dumps(schema))
    broker.create_topic(topic, 1)
    records = [
        {"key": b"k", "value": value({"user.id": user, "a`b": n})} for user, n in (("u1", 1), ("u2", 2), ("u1", 3))
    ]
    if mode == "upsert":
        records.append({"key": json.dumps({"user.id": "u2"}).encode(), "value": None})
    produce(broker.bootstrap_servers, topic, records)
    spec = {"topic": topic, "format": "json-schema", "mode": mode}
    config = make_config({**spec, "key": ["user.id"], "keyFormat": "json"} if mode == "upsert" else spec)
    result = materialize_once(spark, config, config.tables[0])
    assert result.status == "committed" and result.records_failed == 0
    rows = sorted((r["user.id"], r["a`b"]) for r in read_pyiceberg(state_dir, result.identifier))
    assert rows == ([("u1", 1), ("u1", 3), ("u2", 2)] if mode == "append" else [("u1", 3)])


@pytest.mark.parametrize("names", [("Name", "name"), ("KAFKA_OFFSET",)])
def test_names_spark_cannot_tell_apart_are_refused(spark, broker, registry, state_dir, topic, make_config, names):
    """Spark resolves names case-insensitively: two properties differing only in case, or one that is a Kafka
    column's name in other case, would fail every batch; they are a config error naming them."""
    from icefloe.table.iceberg import IcebergTable

    schema = {"$schema": DRAFT, "type": "object", "properties": {name: {"type": "string"} for name in names}}
    value = json_schema_serializer(registry.url, topic, json.dumps(schema))
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": value(dict.fromkeys(names, "x"))}])
    config = make_config({"topic": topic, "format": "json-schema"})
    with pytest.raises(ConfigError) as refused:
        materialize_once(spark, config, config.tables[0])
    for name in names:
        assert repr(name) in str(refused.value)
    assert not IcebergTable(spark, config.identifier(config.tables[0])).exists()
