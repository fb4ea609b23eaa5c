"""JSON Schema on the JVM read path (`formats.json_schema_jvm`): records framed with the table's schema id decoded by
`from_json`, each proven by its re-encoding and the schema's rules (checked as Spark expressions) to decode and
validate as the Python decoder would, every other record decoded and validated by Python. The Python path is the
reference: for every record, valid or not, the JVM path's row (value, Kafka columns, status and error) must be the
Python path's."""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from pyspark.sql.types import StructType

from icefloe.formats.base import CONFLUENT, DecoderSpec
from icefloe.formats.json_schema import JSON_SCHEMA
from icefloe.formats.json_schema_jvm import codec_for
from icefloe.formats.registry import decoder_spec, format_of
from icefloe.materialize.read_paths import PYTHON, choose_read_path
from support import produce, read_duckdb
from test_jvm_path import check_rows_on_both_paths, run_on_the_jvm_path

pytestmark = [pytest.mark.spark, pytest.mark.broker]

SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "definitions": {
        "line": {
            "type": "object",
            "description": "one line of the order",
            "properties": {"sku": {"type": "string"}, "qty": {"type": ["integer", "null"]}},
            "required": ["sku"],
        }
    },
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": ["string", "null"]},
        "side": {"enum": ["BUY", "SELL", "it's"]},
        "price": {"type": "number"},
        "active": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"oneOf": [{"type": "null"}, {"type": "string", "format": "date"}]},
        "owner": {
            "type": ["object", "null"],
            "properties": {"key": {"type": "string"}, "note": {"type": ["string", "null"]}},
            "required": ["key"],
        },
        "tags": {"type": "array", "items": {"type": "string"}},
        "ref": {"type": "string", "format": "uuid"},
        "lines": {"type": ["array", "null"], "items": {"$ref": "#/definitions/line"}},
    },
    "required": ["id", "side", "at", "name"],
    "additionalProperties": False,
}
TEXTS = ["plain", "é and ü", 'quote " and backslash \\\\', "line\nbreak\ttab", "emoji 🧊", "", "\u2028"]


def record(i: int, rng: random.Random) -> dict:
    """A valid record with every property (nulls written where the schema allows them), in the schema's order."""
    maybe = lambda value: value if rng.random() > 0.2 else None  # noqa: E731
    moment = dt.datetime(2000, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.randrange(10**15))
    stamp = moment.replace(tzinfo=None).isoformat(timespec=rng.choice(["seconds", "milliseconds", "microseconds"]))
    return {
        "id": i,
        "name": maybe(rng.choice(TEXTS)),
        "side": rng.choice(["BUY", "SELL", "it's"]),
        "price": round(rng.uniform(-1000, 1000), 2),
        "active": rng.random() < 0.5,
        "at": stamp + rng.choice(["Z", "+00:00"]),
        "day": maybe(moment.date().isoformat()),
        "owner": maybe({"key": f"o{i}", "note": maybe(rng.choice(TEXTS))}),
        "tags": [rng.choice(TEXTS) for _ in range(rng.randint(0, 2))],
        "ref": rng.choice([str, lambda u: str(u).upper()])(uuid.UUID(int=rng.getrandbits(128))),
        "lines": maybe([{"sku": f"s{i}", "qty": maybe(rng.randint(0, 10**12))}]),
    }


def compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def without_nulls(value):
    """The value with every null field left out, at every depth (Jackson's NON_NULL); list elements kept."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def cases(rng: random.Random) -> tuple[list[bytes], list[bytes]]:
    """(JSON payloads the JVM decodes, payloads for Python: valid ones written otherwise, and bad ones)."""
    exact = [compact(record(i, rng)) for i in range(120)]
    exact += [json.dumps(record(i, rng), ensure_ascii=False).encode() for i in range(120, 140)]  # Python's spaces
    exact.append(b" \n" + compact(record(140, rng)).replace(b",", b" ,\r\n") + b"\t")  # whitespace anywhere
    for i in range(141, 161):  # null fields left out: valid where no required property is null
        value = record(i, rng)
        exact.append(compact(without_nulls({**value, "name": value["name"] or "n"})))
    base = {**record(1000, rng), "name": "é", "owner": {"key": "k", "note": None}, "day": None, "lines": None}
    left_out = without_nulls(base)
    for_python = [
        # valid, written otherwise
        compact(dict(reversed(list(base.items())))),  # another key order
        compact({k: v for k, v in base.items() if k != "day"}),  # one null left out, the others written
        compact(base).replace("é".encode(), b"\\u00e9"),  # an escaped letter
        compact({**base, "id": 7.0}),  # an integer written 7.0: draft 7 takes it
        compact({**base, "at": "2026-01-01T10:00:00.123+02:00"}),  # another offset
        compact({**base, "owner": {"key": "k", "note": None, "extra": 1}}),  # a property `owner` does not declare
        compact({**base, "price": 5}),  # a number without a fraction: Spark writes 5.0
        # bad
        compact({**left_out, "name": None}),  # a required property null...
        compact({k: v for k, v in left_out.items() if k != "name"}),  # ...or missing with every null left out
        compact({k: v for k, v in base.items() if k != "name"}),  # missing where every null is written
        compact({**base, "id": None}),  # null where the type does not allow it
        compact({**base, "side": None}),  # null is not an enum member
        compact({**base, "side": "HOLD"}),
        compact({**base, "side": "BUY'"}),
        compact({k: v for k, v in left_out.items() if k != "side"}),
        compact({**base, "tags": None}),
        compact({**base, "tags": ["a", None]}),  # a null element where items are strings
        compact({**base, "owner": {"key": None, "note": None}}),
        compact({**left_out, "owner": {"note": "x"}}),  # a required property missing inside a struct
        compact({**base, "lines": [None]}),
        compact({**base, "lines": [{"sku": None, "qty": 1}]}),
        compact({**left_out, "lines": [{"qty": 1}]}),  # a required property missing in a list element
        compact({**base, "day": "2026-02-30"}),
        compact({**base, "day": "2026-13-01"}),
        compact({**base, "at": "2026-02-30T10:00:00Z"}),
        compact({**base, "at": "2026-01-01 10:00:00Z"}),
        compact({**base, "at": "2026-01-01T10:00:00Z\n"}),  # a final line break (Java's `$` matches before it)
        compact({**base, "price": "1.5"}),
        compact({**base, "ref": "abcdef00000000000000000000000000"}),  # UUID() takes it, the format's dashes not
        compact({**base, "ref": "{abcdef00-0000-0000-0000-000000000000}"}),
        compact({**base, "ref": "abcdef00-0000-0000-0000-000000000000\n"}),
        compact({**base, "ref": "abcdef00-0000-0000-0000-00000000000g"}),
        compact({**base, "extra": 1}),  # additionalProperties false
        compact({**base, "price": float("nan")}),
        compact([base]),
        compact(base)[:30],
        b"",
    ]
    return exact, for_python


@pytest.fixture
def schema_ids(registry, topic) -> tuple[int, int]:
    """(the table's schema id, the id of another schema its records may be framed with: valid, for Python)."""
    client = SchemaRegistryClient({"url": registry.url})
    other = client.register_schema(f"{topic}-other", Schema(json.dumps({**SCHEMA, "title": "Other"}), "JSON"))
    return client.register_schema(f"{topic}-value", Schema(json.dumps(SCHEMA), "JSON")), other


def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def test_every_json_schema_row_of_the_jvm_path_is_the_python_paths_row(spark, broker, topic, schema_ids, make_config):
    broker.create_topic(topic, 2)
    table_id, other_id = schema_ids
    exact, for_python = cases(random.Random(21))
    rng = random.Random(22)
    values = [framed(table_id, v) for v in [*exact, *for_python]]
    not_jvm = [framed(other_id, compact(record(2000, rng))), compact(record(2001, rng)), b"\x00\x00\x00"]
    values += not_jvm + [None]
    random.Random(23).shuffle(values)
    produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"k%d" % i, "value": v, "partition": i % 2} for i, v in enumerate(values)],
    )
    config = make_config({"topic": topic, "format": "json-schema", "errors": "skip"})
    table = config.tables[0]
    decoder = decoder_spec(table, config.cluster(table.source_cluster))
    schema_format = format_of(decoder)
    fields = schema_format.value_fields(decoder, table, "t")

    rules, left_to_python = schema_format.rules(decoder, table), len(for_python) + len(not_jvm)
    check_rows_on_both_paths(spark, config, fields, rules, records=len(values), failed=31, for_python=left_to_python)


def spec_of(schema: dict, schema_id: int | None = 1, references: dict | None = None) -> DecoderSpec:
    bundle = json.dumps({"schema": schema, "references": references or {}})
    return DecoderSpec("json-schema", CONFLUENT, "t", bundle, schema_id=schema_id)


def with_property(prop: dict, **root) -> dict:
    return {"type": "object", "properties": {"id": {"type": "integer"}, "x": prop}, **root}


@pytest.mark.parametrize(
    "schema, reason",
    [
        (with_property({"type": "string", "pattern": "^a"}), "value.x: the JVM path does not check pattern"),
        (with_property({"type": "integer", "minimum": 0}), "does not check minimum"),
        (with_property({"type": "string", "format": "email"}), "format date-time, date and uuid of a string only"),
        (with_property({"type": ["string", "integer"]}), "one type (and null)"),
        (with_property({"enum": [1, 2]}), "an enum of strings only"),
        (with_property({"oneOf": [{"type": "string"}, {"type": "integer"}]}), "oneOf of null and one schema only"),
        (with_property({"anyOf": [{"type": "null"}, {"enum": ["a"]}]}), "must have a type that is not null"),
        (with_property({"oneOf": [{"type": "null"}, {"type": ["string", "null"]}]}), "a type that is not null"),
        (with_property({"$ref": "other.json"}), "$ref alone, to a path of its own document"),
        (with_property({"$ref": "#/definitions/x", "type": "string"}, definitions={"x": {}}), "$ref alone"),
        (with_property({"type": "string"}, additionalProperties=True), "additional properties are kept in Python"),
        (with_property({"type": "string"}, required=["y"]), "`required` of declared properties only"),
        (with_property({"type": "array", "items": [{"type": "string"}]}), "`items` given one schema"),
        (with_property({"type": "object", "additionalProperties": {"type": "long"}}), "additional properties"),
        (with_property({"type": "number"}, **{"$schema": "http://json-schema.org/draft-03/schema#"}), "draft 3"),
    ],
)
def test_rules_the_jvm_does_not_check_keep_the_table_on_python(schema, reason):
    found = codec_for(spec_of(schema), StructType())
    assert isinstance(found, str) and reason in found, found


def test_registry_references_glue_framing_and_json_text_keep_the_table_on_python():
    schema = with_property({"type": "string"})
    assert "registry references" in codec_for(spec_of(schema, references={"a.json": {}}), StructType())
    assert "Confluent framing only" in codec_for(spec_of(schema, schema_id=None), StructType())
    free_form = spec_of(with_property({"type": "object"}))  # any object: Python keeps its JSON text
    assert "value.x is kept as its JSON text" in JSON_SCHEMA.jvm_codec(None, free_form)
    # `oneOf` of a null with a title and a string: a column of JSON text (an annotation makes the null branch unknown)
    titled = spec_of(with_property({"oneOf": [{"type": "null", "title": "none"}, {"type": "string"}]}))
    assert "value.x is kept as its JSON text" in JSON_SCHEMA.jvm_codec(None, titled)
    assert not isinstance(JSON_SCHEMA.jvm_codec(None, spec_of(schema)), str)


def test_a_json_schema_table_reads_on_the_jvm_path_into_the_rows_python_would_give(
    spark, broker, state_dir, topic, schema_ids, make_config
):
    broker.create_topic(topic, 1)
    table_id, other_id = schema_ids
    rng = random.Random(5)
    records = [record(i, rng) for i in range(40)]
    values = [framed(other_id if i % 10 == 0 else table_id, compact(r)) for i, r in enumerate(records)]
    produce(broker.bootstrap_servers, topic, [{"value": v} for v in values])
    config = make_config({"topic": topic, "format": "json-schema"})
    result, rows = run_on_the_jvm_path(spark, config, state_dir, len(records))
    for row, sent in zip(rows, records, strict=True):
        assert (row["name"], row["side"], row["tags"]) == (sent["name"], sent["side"], sent["tags"])
        assert row["at"] == dt.datetime.fromisoformat(sent["at"].replace("Z", "+00:00"))
        assert row["day"] == (sent["day"] and dt.date.fromisoformat(sent["day"]))
        assert (row["owner"] and row["owner"]["key"]) == (sent["owner"] and sent["owner"]["key"])
    # Lists of structs from DuckDB: pyiceberg 0.12 reads a null one as [] (apache/iceberg-python#3833)
    lines = {r["id"]: r["lines"] for r in read_duckdb(result.metadata_location, "id, lines")}
    assert [lines[i] for i in range(40)] == [r["lines"] for r in records]


def test_a_schema_outside_the_jvm_rules_reads_on_python(spark, registry, topic, make_config):
    schema = {**SCHEMA, "properties": {**SCHEMA["properties"], "id": {"type": "integer", "minimum": 0}}}
    SchemaRegistryClient({"url": registry.url}).register_schema(f"{topic}-value", Schema(json.dumps(schema), "JSON"))
    config = make_config({"topic": topic, "format": "json-schema"})
    path = choose_read_path(spark, decoder_spec(config.tables[0], config.cluster("local")))
    assert path.name == PYTHON and "value.id: the JVM path does not check minimum" in path.reason
