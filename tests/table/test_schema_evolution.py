"""Schema evolutions a BACKWARD registry accepts, on both read paths: a removed field (top level and nested) keeps
its column, null in newer rows; a field added to a record inside an array or a map is added to the table; a version
registered between the schema fetch and the plan loses no field and no enum symbol."""

from __future__ import annotations

import json

import pytest

from icefloe.materialize import batch as materializer
from icefloe.materialize.batch import materialize_once
from support import ANY_CATALOG, avro_serializer, produce, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def record(name: str, fields: list[dict]) -> dict:
    return {"type": "record", "name": name, "fields": fields}


def optional(name: str, kind) -> dict:
    return {"name": name, "type": ["null", kind], "default": None}


def by_id(rows: list[dict]) -> dict:
    return {row["id"]: row for row in rows}


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_removed_field_keeps_its_column_and_newer_rows_have_null(
    spark, broker, registry, state_dir, topic, make_config, read_path, mode
):
    broker.create_topic(topic, 1)
    v1 = record(
        "Account",
        [
            {"name": "id", "type": "long"},
            {"name": "legacy", "type": "string"},
            {
                "name": "address",
                "type": record("Address", [{"name": "street", "type": "string"}, {"name": "zip", "type": "string"}]),
            },
        ],
    )
    v2 = record(
        "Account",
        [
            {"name": "id", "type": "long"},
            {"name": "address", "type": record("Address", [{"name": "street", "type": "string"}])},
        ],
    )
    old = avro_serializer(registry.url, topic, json.dumps(v1))
    produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"1", "value": old({"id": 1, "legacy": "x", "address": {"street": "s1", "zip": "z1"}})}],
    )
    config = make_config({"topic": topic, "mode": mode})
    materialize_once(spark, config, config.tables[0])

    new = avro_serializer(registry.url, topic, json.dumps(v2))  # BACKWARD allows removing fields
    produce(
        broker.bootstrap_servers,
        topic,
        [
            {"key": b"2", "value": new({"id": 2, "address": {"street": "s2"}})},
            {"key": b"1", "value": new({"id": 1, "address": {"street": "s3"}})},
        ],
    )
    result = materialize_once(spark, config, config.tables[0])

    assert result.status == "committed" and result.records_failed == 0 and result.read_path == read_path
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        got = {(r["id"], r["kafka_offset"]): (r["legacy"], r["address"]) for r in rows}
        newer = {(2, 1): (None, {"street": "s2", "zip": None}), (1, 2): (None, {"street": "s3", "zip": None})}
        assert got == ({(1, 0): ("x", {"street": "s1", "zip": "z1"})} | newer if mode == "append" else newer)


def test_a_field_added_inside_an_array_or_a_map_evolves_the_table(
    spark, broker, registry, state_dir, topic, make_config, read_path
):
    broker.create_topic(topic, 1)
    item = record("Item", [{"name": "sku", "type": "string"}])
    attr = record("Attr", [{"name": "v", "type": "long"}])
    v1 = record(
        "Order",
        [
            {"name": "id", "type": "long"},
            {"name": "items", "type": {"type": "array", "items": item}},
            {"name": "attrs", "type": {"type": "map", "values": attr}},
        ],
    )
    item2 = {**item, "fields": [*item["fields"], optional("qty", "int")]}
    attr2 = {**attr, "fields": [optional("w", "string"), *attr["fields"]]}  # added first: the table adds it last
    v2 = {
        **v1,
        "fields": [
            v1["fields"][0],
            {"name": "items", "type": {"type": "array", "items": item2}},
            {"name": "attrs", "type": {"type": "map", "values": attr2}},
        ],
    }
    produce(
        broker.bootstrap_servers,
        topic,
        [
            {
                "value": avro_serializer(registry.url, topic, json.dumps(v1))(
                    {"id": 1, "items": [{"sku": "a"}], "attrs": {"k": {"v": 1}}}
                )
            }
        ],
    )
    config = make_config({"topic": topic})
    materialize_once(spark, config, config.tables[0])

    produce(
        broker.bootstrap_servers,
        topic,
        [
            {
                "value": avro_serializer(registry.url, topic, json.dumps(v2))(
                    {"id": 2, "items": [{"sku": "b", "qty": 3}], "attrs": {"k": {"v": 2, "w": "x"}}}
                )
            }
        ],
    )
    result = materialize_once(spark, config, config.tables[0])

    assert result.status == "committed" and result.rows_written == 1 and result.read_path == read_path
    rows = by_id(read_pyiceberg(state_dir, result.identifier))
    assert rows[1]["items"] == [{"sku": "a", "qty": None}] and dict(rows[1]["attrs"]) == {"k": {"v": 1, "w": None}}
    assert rows[2]["items"] == [{"sku": "b", "qty": 3}] and dict(rows[2]["attrs"]) == {"k": {"v": 2, "w": "x"}}
    duck = by_id(read_duckdb(result.metadata_location))
    assert duck[2]["items"] == [{"sku": "b", "qty": 3}] and duck[2]["attrs"] == {"k": {"v": 2, "w": "x"}}


@ANY_CATALOG
def test_a_version_registered_between_the_schema_fetch_and_the_plan_loses_nothing(
    catalog, spark, broker, registry, state_dir, topic, make_config, read_path, monkeypatch
):
    broker.create_topic(topic, 1)
    kind = {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}
    v1 = record("Event", [{"name": "id", "type": "long"}, {"name": "kind", "type": kind}])
    v2 = record(
        "Event",
        [
            *v1["fields"][:1],
            {"name": "kind", "type": {**kind, "symbols": ["A", "B", "C"]}},
            optional("extra", "string"),
        ],
    )
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": avro_serializer(registry.url, topic, json.dumps(v1))({"id": 1, "kind": "A"})}],
    )
    config = make_config({"topic": topic, "errors": "skip"})
    real_plan = materializer.plan_ranges

    def plan_after_a_new_version(*args, **kwargs):
        """A producer registers v2 and writes with it after the run fetched the schema, before it plans."""
        newer = avro_serializer(registry.url, topic, json.dumps(v2))
        produce(broker.bootstrap_servers, topic, [{"value": newer({"id": 2, "kind": "C", "extra": "e"})}])
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(materializer, "plan_ranges", plan_after_a_new_version)
    result = materialize_once(spark, config, config.tables[0])

    assert result.records_failed == 0 and result.rows_written == 2 and result.read_path == read_path
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        assert {r["id"]: (r["kind"], r["extra"]) for r in rows} == {1: ("A", None), 2: ("C", "e")}
