"""The JVM read path: Spark's Kafka source and `from_avro`, with Python only for the records the JVM cannot decode
exactly. The Python path is the reference: for every record, the JVM path's row (value, Kafka columns, status and
error) must be the Python path's row."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import random
import struct
import uuid
from decimal import Decimal
from itertools import count

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from icefloe.errors import ConfigError
from icefloe.formats.avro import jvm as avro_jvm
from icefloe.formats.avro.mapping import avro_value_fields
from icefloe.formats.base import DecoderSpec, ValueRules
from icefloe.formats.columns import batch_struct, table_struct
from icefloe.formats.registry import decoder_spec
from icefloe.materialize import batch as materializer
from icefloe.materialize import read_paths
from icefloe.materialize.python_tasks import ReadPlan
from icefloe.materialize.read_paths import JVM, PYTHON, JvmBatch, choose_read_path
from icefloe.operate.runner import run_table
from icefloe.source.kafka import client_config, plan_ranges
from icefloe.source.spark_kafka import kafka_options
from support import avro_serializer, by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
UTC = dt.UTC
ITEM = {
    "type": "record",
    "name": "Item",
    "fields": [
        {"name": "sku", "type": "string"},
        {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
    ],
}
SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "test.jvm",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "clock_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 2}},
        {"name": "ratio", "type": "float"},
        {"name": "items", "type": {"type": "array", "items": ITEM}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "Item"]}},
    ],
}


def raw_schema(schema: dict) -> dict:
    """The schema without logical types, strings as bytes (the same encoding): values are written as their raw
    int, long or bytes, so they can be what no serializer would write."""
    return json.loads(json.dumps(schema).replace('"logicalType"', '"x-logical"').replace('"string"', '"bytes"'))


def event(i: int, rng: random.Random) -> dict:
    """A random valid event, as raw Avro values."""
    return {
        "id": i,
        "name": None if i % 5 == 0 else f"ñame-{i}",
        "ref": str(uuid.UUID(int=rng.getrandbits(128))),
        "kind": rng.choice("AB"),
        "at": rng.randrange(-(10**12), 4 * 10**12),
        "at_us": rng.randrange(0, 4 * 10**15),
        "local": rng.randrange(0, 4 * 10**12),
        "day": rng.randrange(-(10**5), 10**5),
        "clock": rng.randrange(86_400_000),
        "clock_us": rng.randrange(86_400_000_000),
        "price": rng.randrange(-(10**8), 10**8).to_bytes(4, "big", signed=True),
        "code": bytes([rng.randrange(256), rng.randrange(256)]),
        "ratio": rng.choice([0.5, -2.0, 1e10]),
        "items": [{"sku": f"s{j}", "at": rng.randrange(86_400_000)} for j in range(rng.randrange(3))],
        "tags": [f"t{j}" for j in range(rng.randrange(3))],
        "attrs": {f"k{j}": None if j == 1 else {"sku": "x", "at": j} for j in range(rng.randrange(3))},
    }


# (name, changes to a valid event): values Avro Java decodes but Python refuses or rewrites, and bodies Java fails on.
MUTATIONS = [
    ("bad utf-8 string", {"name": b"\xff\xfe"}),
    ("bad utf-8 in an array", {"tags": [b"ok", b"\xc3"]}),
    ("bad utf-8 map key", {"attrs": {"QZ": None}}),  # QZ becomes E2 28 once encoded (map keys must be str here)
    ("bad utf-8 nested", {"items": [{"sku": b"a\x80", "at": 1}]}),
    ("uppercase uuid", {"ref": "ABCDEF00-0000-0000-0000-000000000000"}),
    ("uuid without dashes", {"ref": "abcdef00000000000000000000000000"}),
    ("not a uuid", {"ref": "nope"}),
    ("uuid and a line break", {"ref": "abcdef00-0000-0000-0000-000000000000\n"}),  # Java's `$` matches before it
    ("timestamp overflowing micros", {"at": 2**62}),
    ("timestamp after 9999", {"at": 253402300800000}),
    ("timestamp before year 1", {"at_us": -62135596800000001}),
    ("local timestamp after 9999", {"local": 253402300800000}),
    ("date after 9999", {"day": 2932897}),
    ("time below 0", {"clock": -1}),
    ("time of a day and more", {"clock_us": 86_400_000_000}),
    ("nested time out of range", {"items": [{"sku": "a", "at": 86_400_000}]}),
    ("decimal beyond precision", {"price": (10**9).to_bytes(5, "big", signed=True)}),
    # Spark keeps a decimal of precision <= 18 as its unscaled value's low 64 bits: these wrap into the precision
    ("decimal past 64 bits", {"price": (2**64 + 5).to_bytes(9, "big", signed=True)}),
    ("negative decimal past 64 bits", {"price": (-(2**70) + 1234).to_bytes(9, "big", signed=True)}),
]


def framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def encode(schema: dict, value: dict) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(raw_schema(schema)), _as_bytes(value))
    return buffer.getvalue().replace(b"\x04QZ", b"\x04\xe2\x28")


def _as_bytes(value):
    """Strings as UTF-8 bytes (enum symbols and map keys stay strings)."""
    if isinstance(value, dict):
        return {k: v if k == "kind" else _as_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_bytes(v) for v in value]
    return value.encode() if isinstance(value, str) else value


def read_plan(table, decoder, kafka_conf, value_fields, rules: ValueRules | None = None) -> ReadPlan:
    struct_ = table_struct(value_fields)
    rules = rules or ValueRules()
    return ReadPlan(
        kafka_conf=kafka_conf,
        decoder=decoder,
        batch_schema_json=batch_struct(struct_).json(),
        value_fields=tuple(f.name for f in value_fields),
        strict=rules.strict,
        required=rules.required,
        needs_key=table.mode == "upsert" and not table.key,
        max_record_bytes=table.max_record_bytes,
    )


def rows_of(frame) -> dict:
    return {(row.kafka_partition, row.kafka_offset): row.asDict(recursive=True) for row in frame.collect()}


def rows_on_both_paths(spark, config, value_fields=None, rules: ValueRules | None = None, decoder=None) -> tuple:
    """Every record of the first table's topic read by the JVM path and by the Python path: (read path, the JVM
    batch, JVM rows, Python rows), rows keyed by (partition, offset). Value fields default to the Avro mapping, the
    converter's rules to Avro's, the decoder spec to the table's."""
    table = config.tables[0]
    cluster = config.cluster(table.source_cluster)
    kafka_conf, decoder = client_config(cluster), decoder or decoder_spec(table, cluster)
    path = choose_read_path(spark, decoder)
    planned = plan_ranges(kafka_conf, table.topic, {}, "earliest", None)
    batch = materializer.Batch(planned.ranges, planned.next_offsets)
    fields = value_fields or avro_value_fields(decoder.schema_str, table.topic)
    plan = read_plan(table, decoder, kafka_conf, fields, rules)
    jvm = JvmBatch(spark, plan, path.avro, batch.ranges, 1)
    kept = jvm.kept()
    jvm_frame, release_jvm = kept.with_python(), kept.release
    python_frame, release_python = materializer._read(spark, plan, batch)
    try:
        return path, jvm, rows_of(jvm_frame), rows_of(python_frame)
    finally:
        release_jvm()
        release_python()


def check_rows_on_both_paths(
    spark, config, value_fields, rules, *, records: int, failed: int, for_python: int, decoder=None
) -> None:
    """`rows_on_both_paths` for a table on the JVM path: every one of the topic's `records` gets the Python path's
    row on the JVM path, at least `failed` of them fail on Python, and exactly `for_python` are left to Python."""
    path, jvm, jvm_rows, python_rows = rows_on_both_paths(spark, config, value_fields, rules, decoder)
    assert path.name == JVM, path.reason
    assert len(python_rows) == records
    assert sum(r["icefloe_error_class"] is not None for r in python_rows.values()) >= failed, "bad ones fail on Python"
    for position, expected in python_rows.items():
        assert jvm_rows[position] == expected, position
    written_rows, observation = jvm.exact_rows("probe")
    written_rows.write.format("noop").mode("overwrite").save()
    assert (observation.get["rows"], observation.get["for_python"]) == (records, for_python)


def run_on_the_jvm_path(spark, config, state_dir, records: int) -> tuple:
    """The first table run once, on the JVM path (chosen and reported), its `records` records (ids 0 to
    `records` - 1) all written: (the result, the table's rows by id, from pyiceberg)."""
    table = config.tables[0]
    assert choose_read_path(spark, decoder_spec(table, config.cluster(table.source_cluster))).name == JVM
    result = run_table(spark, config, table, state_dir)
    assert result.read_path == JVM and result.rows_written == records, result.describe()
    rows = sorted(read_pyiceberg(state_dir, config.identifier(table)), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(records))
    return result, rows


KAFKA_POSITION = ("kafka_partition", "kafka_offset")


def test_every_row_of_the_jvm_path_is_the_python_paths_row(spark, broker, registry, topic, make_config):
    broker.create_topic(topic, 2)
    schema_id = SchemaRegistryClient({"url": registry.url}).register_schema(
        f"{topic}-value", Schema(json.dumps(SCHEMA), "AVRO")
    )
    other_id = SchemaRegistryClient({"url": registry.url}).register_schema(
        f"{topic}-other-value", Schema(json.dumps({"type": "record", "name": "O", "fields": []}), "AVRO")
    )
    rng = random.Random(5)
    valid = [framed(schema_id, encode(SCHEMA, event(i, rng))) for i in range(120)]
    sample = valid[0]
    for_python = [
        framed(schema_id, encode(SCHEMA, {**event(1000 + n, rng), **change})) for n, (_, change) in enumerate(MUTATIONS)
    ]
    for_python += [
        sample[:12],  # truncated
        b"\x01" + sample[1:],  # wrong magic byte
        framed(987654, sample[5:]),  # unknown schema id
        framed(other_id, sample[5:]),  # an id of another subject (Python decodes it, or fails)
        sample[:5],  # framing only
        b"",
    ]
    trailing = [sample + b"\x00"]  # trailing bytes after the record: both paths ignore them (registry framing)
    values = valid + for_python + trailing + [None]
    rng.shuffle(values)
    produce(
        broker.bootstrap_servers,
        topic,
        [
            {"key": b"k%d" % i, "value": v, "partition": i % 2, "headers": [("h", b"v")] if i % 3 == 0 else None}
            for i, v in enumerate(values)
        ],
    )

    config = make_config({"topic": topic, "errors": "skip"})
    path, jvm, jvm_rows, python_rows = rows_on_both_paths(spark, config)
    assert path.name == JVM and sorted(path.avro.writers) == [schema_id]
    assert len(python_rows) == len(values)
    assert sum(r["icefloe_error_class"] is not None for r in python_rows.values()) >= len(MUTATIONS)
    for position, expected in python_rows.items():
        assert jvm_rows[position] == expected, position

    exact, observation = jvm.exact_rows("probe")
    exact.write.format("noop").mode("overwrite").save()
    observed = observation.get
    assert (observed["rows"], observed["for_python"]) == (len(values), len(for_python)), "only those go to Python"
    # The streamed rows leave them out; per partition, the first and last of them are observed (read again).
    inexact = set(python_rows) - {(r.kafka_partition, r.kafka_offset) for r in exact.select(*KAFKA_POSITION).collect()}
    assert len(inexact) == len(for_python)
    for partition in (0, 1):
        offsets = [o for p, o in inexact if p == partition]
        assert (observed[f"first_{partition}"], observed[f"last_{partition}"]) == (min(offsets), max(offsets)), observed


# Strings inside collections, reached without lambdas where Spark allows (flatten, field extraction, map_values):
# arrays of arrays, of nullable arrays (a null must not hide its neighbours' strings), of records holding arrays,
# of nullable records, of records holding nullable records, of maps, of unions; maps of arrays.
LINE = {
    "type": "record",
    "name": "Line",
    "fields": [{"name": "sku", "type": "string"}, {"name": "tags", "type": {"type": "array", "items": "string"}}],
}
NESTED = {
    "type": "record",
    "name": "Nested",
    "namespace": "test.jvm",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "grid", "type": {"type": "array", "items": {"type": "array", "items": "string"}}},
        {"name": "holes", "type": {"type": "array", "items": ["null", {"type": "array", "items": "string"}]}},
        {"name": "lines", "type": {"type": "array", "items": LINE}},
        {"name": "maybe_lines", "type": {"type": "array", "items": ["null", "Line"]}},
        {"name": "dicts", "type": {"type": "array", "items": {"type": "map", "values": "string"}}},
        {"name": "groups", "type": {"type": "map", "values": {"type": "array", "items": "string"}}},
        {"name": "choice", "type": {"type": "array", "items": ["long", {"type": "array", "items": "string"}]}},
        {
            "name": "wrapped",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Wrap",
                    "fields": [
                        {
                            "name": "inner",
                            "type": [
                                "null",
                                {
                                    "type": "record",
                                    "name": "Inner",
                                    "fields": [{"name": "tags", "type": {"type": "array", "items": "string"}}],
                                },
                            ],
                        }
                    ],
                },
            },
        },
    ],
}


def nested(i: int, rng: random.Random, fffd: bool = True) -> dict:
    words = ["a", "ñ", "zz"] + (["\ufffd"] if fffd else [])  # U+FFFD is valid UTF-8: Python decodes it

    def some(n: int = 3) -> list:
        return [rng.choice(words) + str(j) for j in range(rng.randrange(n))]

    return {
        "id": i,
        "grid": [some() for _ in range(rng.randrange(3))],
        "holes": [None if rng.random() < 0.3 else some() for _ in range(rng.randrange(4))],
        "lines": [{"sku": rng.choice(words), "tags": some()} for _ in range(rng.randrange(3))],
        "maybe_lines": [None if rng.random() < 0.3 else {"sku": "s", "tags": some()} for _ in range(rng.randrange(4))],
        "dicts": [{f"k{j}": rng.choice(words) for j in range(rng.randrange(3))} for _ in range(rng.randrange(3))],
        "groups": {f"g{j}": some() for j in range(rng.randrange(3))},
        "choice": [rng.choice([7, some()]) for _ in range(rng.randrange(4))],
        "wrapped": [{"inner": None if rng.random() < 0.3 else {"tags": some()}} for _ in range(rng.randrange(4))],
    }


NESTED_MUTATIONS = [
    ("array of arrays", {"grid": [["ok"], [b"\xff"]]}),
    ("after a null array", {"holes": [None, [b"ok", b"\xc3"]]}),
    ("before a null array", {"holes": [[b"\xe2\x28"], None]}),
    ("array in a record in an array", {"lines": [{"sku": "a", "tags": []}, {"sku": "b", "tags": [b"\x80"]}]}),
    ("string of a record in an array", {"lines": [{"sku": b"\xed\xa0\x80", "tags": []}]}),  # a surrogate
    ("after a null record", {"maybe_lines": [None, {"sku": "s", "tags": [b"\xf0\x28"]}]}),
    ("map value in an array", {"dicts": [{}, {"k": b"\xc0\xaf"}]}),  # an overlong encoding
    ("map key in an array", {"dicts": [{"QZ": "v"}]}),
    ("array in a map", {"groups": {"g": [b"ok"], "h": [b"\xfe"]}}),
    ("array in a union", {"choice": [7, [b"\xff"]]}),  # the long's member1 is null
    ("array in a nullable record in an array", {"wrapped": [{"inner": None}, {"inner": {"tags": [b"\xff"]}}]}),
]


def test_strings_in_nested_collections_are_checked_as_python_decodes_them(spark, broker, registry, topic, make_config):
    broker.create_topic(topic, 1)
    schema_id = SchemaRegistryClient({"url": registry.url}).register_schema(
        f"{topic}-value", Schema(json.dumps(NESTED), "AVRO")
    )
    rng = random.Random(9)
    valid = [framed(schema_id, encode(NESTED, nested(i, rng))) for i in range(150)]
    # Without U+FFFD elsewhere: a mutation must be found by itself, not because its record also went to Python.
    bad = [
        framed(schema_id, encode(NESTED, {**nested(1000 + n, rng, fffd=False), **change}))
        for n, (_, change) in enumerate(NESTED_MUTATIONS)
    ]
    produce(broker.bootstrap_servers, topic, [{"key": b"k", "value": v} for v in valid + bad])

    config = make_config({"topic": topic, "errors": "skip"})
    path, jvm, jvm_rows, python_rows = rows_on_both_paths(spark, config)
    assert path.name == JVM
    failed = [position for position, row in python_rows.items() if row["icefloe_error_class"] is not None]
    assert len(failed) == len(NESTED_MUTATIONS), "every mutation is a bad record for Python"
    for position, expected in python_rows.items():
        assert jvm_rows[position] == expected, position
    exact, observation = jvm.exact_rows("probe")
    exact.write.format("noop").mode("overwrite").save()
    with_fffd = sum("\ufffd" in json.dumps(row, ensure_ascii=False, default=str) for row in python_rows.values())
    assert observation.get["for_python"] == len(NESTED_MUTATIONS) + with_fffd, "bad UTF-8 and U+FFFD go to Python"


def test_strings_are_reached_without_lambdas_unless_a_null_or_a_map_is_in_the_way():
    """Spark interprets lambdas (`transform`): several times slower than the generated code of field extraction,
    `flatten` and `map_values`."""

    def lambdas(schema: dict) -> dict:
        names = avro_jvm._Names()  # one for the whole schema: later fields name types defined by earlier ones
        return {
            f["name"]: "transform(" in " ".join(avro_jvm._strings(f["type"], f["name"], names, count()))
            for f in schema["fields"]
        }

    assert not any(lambdas(SCHEMA).values())
    assert lambdas(NESTED) == {
        "id": False,
        "grid": False,
        "holes": True,
        "lines": False,
        "maybe_lines": True,
        "dicts": True,
        "groups": False,
        "choice": True,
        "wrapped": True,
    }


def test_older_records_resolve_to_the_evolved_schema_and_logical_type_changes_go_to_python(
    spark, broker, registry, state_dir, topic, make_config
):
    broker.create_topic(topic, 1)
    v1 = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
    # Avro's compatibility rules ignore logical types: the registry accepts the change of unit.
    v2 = {
        **v1,
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "unit", "type": "string", "default": "none"},
        ],
    }
    v3 = {**v2, "fields": [*v2["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
    when = dt.datetime(2026, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    produced = []
    for version, value in [
        (v1, {"id": 1, "at": when}),
        (v2, {"id": 2, "at": when, "unit": "C"}),
        (v3, {"id": 3, "at": when, "unit": "F", "note": "n"}),
    ]:
        produced += produce(
            broker.bootstrap_servers,
            topic,
            [{"value": avro_serializer(registry.url, topic, json.dumps(version))(value)}],
        )
    config = make_config({"topic": topic})
    path = choose_read_path(spark, decoder_spec(config.tables[0], config.cluster("local")))
    assert len(path.avro.writers) == 2 and len(path.avro.routed) == 1, "v1's millis would be read as micros in Java"

    result = run_table(spark, config, config.tables[0], state_dir)

    assert result.read_path == JVM and result.rows_written == 3 and result.records_failed == 0
    rows = sorted(read_pyiceberg(state_dir, result.identifier), key=lambda r: r["id"])
    assert [(r["id"], r["at"], r["unit"], r["note"]) for r in rows] == [
        (1, when, "none", None),
        (2, when, "C", None),
        (3, when, "F", "n"),
    ]


def test_a_json_table_with_a_float_column_stays_on_python_and_the_path_is_reported(
    spark, broker, state_dir, topic, make_config, caplog
):
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": b'{"id": 1, "x": 0.5}'}])
    schema = {"fields": [{"name": "id", "type": "long"}, {"name": "x", "type": "float"}]}
    config = make_config({"topic": topic, "format": "json", "schema": schema})
    with caplog.at_level(logging.INFO, logger="icefloe.materialize.batch"):
        result = run_table(spark, config, config.tables[0], state_dir)
    assert result.read_path == PYTHON and result.as_dict()["read_path"] == PYTHON
    assert any("read path python" in r.getMessage() and "x (float)" in r.getMessage() for r in caplog.records)


def test_aborted_transactions_never_reach_the_table_on_the_jvm_path(
    spark, broker, registry, state_dir, topic, make_config
):
    broker.create_topic(topic, 1)
    serialize = avro_serializer(
        registry.url, topic, json.dumps({"type": "record", "name": "N", "fields": [{"name": "n", "type": "long"}]})
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{topic}-tx"})
    producer.init_transactions()
    for n, commit in [(0, True), (1, False), (2, True)]:
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, value=serialize({"n": n * 10 + i}))
        producer.flush()
        producer.commit_transaction() if commit else producer.abort_transaction()
    config = make_config({"topic": topic})

    result = run_table(spark, config, config.tables[0], state_dir)

    assert result.read_path == JVM and result.rows_written == 10
    assert sorted(r["n"] for r in read_pyiceberg(state_dir, result.identifier)) == [0, 1, 2, 3, 4, 20, 21, 22, 23, 24]
    assert result.offsets == {0: 18}, "3 transactions: 15 records and 3 markers"
    again = run_table(spark, config, config.tables[0], state_dir)
    assert again.status == "up-to-date"


def test_a_clean_append_batch_never_decodes_in_python(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch, caplog
):
    broker.create_topic(topic, 2)
    serialize = avro_serializer(registry.url, topic, json.dumps(SCHEMA))
    rng = random.Random(9)
    good = [{"value": serialize(cooked(event(i, rng))), "partition": i % 2} for i in range(50)]
    produce(broker.bootstrap_servers, topic, good)
    config = make_config({"topic": topic, "errors": "skip"})

    def refuse(self):
        raise AssertionError("the batch was read again with status columns")

    monkeypatch.setattr(JvmBatch, "kept", refuse)
    first = run_table(spark, config, config.tables[0], state_dir)
    assert first.read_path == JVM and first.rows_written == 50
    monkeypatch.undo()

    bad = produce(broker.bootstrap_servers, topic, [{"value": b"\x07junk", "partition": 1}, *good[:4]])
    with caplog.at_level(logging.INFO, logger="icefloe.materialize.batch"):
        second = run_table(spark, config, config.tables[0], state_dir)
    assert second.rows_written == 4 and second.records_failed == 1
    assert any("1 records need the Python decoder" in r.getMessage() for r in caplog.records)
    rows = by_position(read_pyiceberg(state_dir, second.identifier))
    assert len(rows) == 54 and bad[0] not in rows


def test_a_record_for_python_is_the_only_one_read_again(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    """One record the JVM cannot decode: the streamed write keeps every other record, and only that record's
    offsets are read again (for Python), not the whole batch; it is dead-lettered, the rest committed once."""
    broker.create_topic(topic, 2)
    serialize = avro_serializer(registry.url, topic, json.dumps(SCHEMA))
    rng = random.Random(10)
    good = [{"value": serialize(cooked(event(i, rng))), "partition": i % 2} for i in range(40)]
    produce(broker.bootstrap_servers, topic, good[:20])
    bad = produce(broker.bootstrap_servers, topic, [{"value": b"\x07junk", "partition": 1}])
    produce(broker.bootstrap_servers, topic, good[20:])
    config = make_config({"topic": topic, "errors": "dlq"})
    reads, real = [], read_paths.read_ranges

    def recorded(spark, conf, ranges, *args, **kwargs):
        reads.append(sorted((r.partition, r.start, r.end) for r in ranges))
        return real(spark, conf, ranges, *args, **kwargs)

    monkeypatch.setattr(read_paths, "read_ranges", recorded)
    result = run_table(spark, config, config.tables[0], state_dir)

    assert result.read_path == JVM and result.rows_written == 40 and result.records_failed == 1, result.describe()
    (partition, offset) = bad[0]
    assert reads[-1] == [(partition, offset, offset + 1)], reads
    rows = by_position(read_pyiceberg(state_dir, result.identifier))
    assert len(rows) == 40 and bad[0] not in rows
    dead = read_pyiceberg(state_dir, result.identifier + "_dlq")
    assert [(r["kafka_partition"], r["kafka_offset"]) for r in dead] == bad


def cooked(raw: dict) -> dict:
    """A raw event as the serializer wants it (logical types as Python values)."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=UTC)
    return {
        **raw,
        "at": epoch + dt.timedelta(milliseconds=raw["at"]),
        "at_us": epoch + dt.timedelta(microseconds=raw["at_us"]),
        "local": dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=raw["local"]),
        "day": dt.date(1970, 1, 1) + dt.timedelta(days=raw["day"]),
        "clock": (dt.datetime(2000, 1, 1) + dt.timedelta(milliseconds=raw["clock"])).time(),
        "clock_us": (dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=raw["clock_us"])).time(),
        "price": Decimal(int.from_bytes(raw["price"], "big", signed=True)).scaleb(-2),
        "items": [
            {**item, "at": (dt.datetime(2000, 1, 1) + dt.timedelta(milliseconds=item["at"])).time()}
            for item in raw["items"]
        ],
        "attrs": {
            k: None if v is None else {**v, "at": (dt.datetime(2000, 1, 1) + dt.timedelta(milliseconds=v["at"])).time()}
            for k, v in raw["attrs"].items()
        },
    }


def test_kafka_options_carry_the_cluster_security_settings():
    plain = kafka_options({"bootstrap.servers": "b:9092", "security.protocol": "PLAINTEXT", "client.id": "icefloe"})
    assert plain["kafka.bootstrap.servers"] == "b:9092" and plain["kafka.security.protocol"] == "PLAINTEXT"
    assert plain["kafka.isolation.level"] == "read_committed" and "kafka.sasl.jaas.config" not in plain
    scram = kafka_options(
        {
            "bootstrap.servers": "b:9096",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "u",
            "sasl.password": 'p"w\\d',
        }
    )
    assert scram["kafka.sasl.mechanism"] == "SCRAM-SHA-512" and scram["kafka.security.protocol"] == "SASL_SSL"
    assert scram["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p\\"w\\\\d";'
    )
    plain_sasl = kafka_options(
        {
            "bootstrap.servers": "b",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )
    assert plain_sasl["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )
    with pytest.raises(ConfigError, match="ssl.ca.location"):
        kafka_options({"bootstrap.servers": "b", "ssl.ca.location": "/x"})


def test_an_avro_schema_java_refuses_keeps_the_table_on_python(spark):
    # A default that does not match its type: fastavro accepts it, Avro Java's parser refuses it.
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "int", "default": "seven"}]}
    path = choose_read_path(spark, DecoderSpec("avro", "inline", "t", json.dumps(schema)))
    assert path.name == PYTHON


def test_avro_upsert_on_the_jvm_path_keeps_the_last_value_per_key(
    spark, broker, registry, state_dir, topic, make_config
):
    broker.create_topic(topic, 2)
    serialize = avro_serializer(
        registry.url,
        topic,
        json.dumps({"type": "record", "name": "Balance", "fields": [{"name": "amount", "type": "long"}]}),
    )
    rng = random.Random(3)
    records, state = [], {}
    for seq in range(300):
        key = f"acct-{rng.randrange(30)}".encode()
        value = None if rng.random() < 0.2 else seq
        records.append(
            {"key": key, "value": None if value is None else serialize({"amount": value}), "partition": key[-1] % 2}
        )
        state[key] = value
    records.append({"key": None, "value": serialize({"amount": -1}), "partition": 0})  # no key: a bad record
    produce(broker.bootstrap_servers, topic, records)
    config = make_config({"topic": topic, "mode": "upsert", "errors": "skip"})

    result = run_table(spark, config, config.tables[0], state_dir)

    assert result.read_path == JVM and result.records_failed == 1
    rows = read_pyiceberg(state_dir, result.identifier)
    assert {r["kafka_key"]: r["amount"] for r in rows} == {k: v for k, v in state.items() if v is not None}


def test_a_clean_upsert_batch_on_the_jvm_path_has_no_python_step(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    """Every record decodes exactly in the JVM: neither the error mode's pass nor the merge reads a frame with a
    Python step (a Python worker per task), as an append batch's streamed write has none."""
    broker.create_topic(topic, 2)
    serialize = avro_serializer(
        registry.url,
        topic,
        json.dumps({"type": "record", "name": "Balance", "fields": [{"name": "amount", "type": "long"}]}),
    )
    records = [
        {
            "key": f"acct-{n % 7}".encode(),
            "value": None if n == 37 else serialize({"amount": n}),
            "partition": n % 7 % 2,
        }
        for n in range(40)
    ]
    latest = {record["key"]: n for n, record in enumerate(records) if n != 37}  # the key of 37 is deleted
    del latest[b"acct-2"]
    produce(broker.bootstrap_servers, topic, records)
    config = make_config({"topic": topic, "mode": "upsert", "errors": "skip"})
    plans: dict[str, str] = {}

    def plan_of(frame) -> str:
        return frame._jdf.queryExecution().analyzed().toString()

    error_mode, merge = materializer._apply_error_mode, materializer.merge_batch

    def error_mode_pass(spark, identifier, table, frame, *args):
        plans["error mode"] = plan_of(frame)
        return error_mode(spark, identifier, table, frame, *args)

    def merged(frame, *args, **kwargs):
        plans["merge"] = plan_of(frame)
        return merge(frame, *args, **kwargs)

    monkeypatch.setattr(materializer, "_apply_error_mode", error_mode_pass)
    monkeypatch.setattr(materializer, "merge_batch", merged)
    result = run_table(spark, config, config.tables[0], state_dir)

    assert result.read_path == JVM and result.records_failed == 0
    assert set(plans) == {"error mode", "merge"}
    assert not [step for step, plan in plans.items() if "MapInArrow" in plan], plans
    rows = read_pyiceberg(state_dir, result.identifier)
    assert {r["kafka_key"]: r["amount"] for r in rows} == latest
