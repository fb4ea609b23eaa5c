"""Avro unions of several types: a struct with one nullable field per branch (`member0`, `member1`, ... in branch
order, null left out: Spark's `from_avro` convention), the same rows on the JVM and the Python path."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from icefloe.errors import ConfigError
from icefloe.formats.avro.mapping import avro_value_fields
from icefloe.formats.avro.unions import needs_record_names
from icefloe.materialize.read_paths import JVM
from icefloe.operate.runner import run_table
from support import as_utc, avro_serializer, produce, read_duckdb, read_pyiceberg
from test_jvm_path import rows_on_both_paths

UTC = dt.UTC
NS = "test.unions"
CIRCLE = {"type": "record", "name": "Circle", "fields": [{"name": "radius", "type": "double"}]}
SQUARE = {
    "type": "record",
    "name": "Square",
    "fields": [{"name": "side", "type": "double"}, {"name": "label", "type": ["string", "long"]}],
}
LEVEL = {"type": "enum", "name": "Level", "symbols": ["LOW", "HIGH"]}
SCHEMA = {
    "type": "record",
    "name": "Thing",
    "namespace": NS,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sl", "type": ["string", "long"]},
        {"name": "shape", "type": ["null", CIRCLE, SQUARE], "default": None},
        {"name": "num", "type": ["int", "long"]},
        {"name": "real", "type": ["null", "float", "double"], "default": None},
        {
            "name": "mixed",
            "type": [
                "null",
                "boolean",
                "bytes",
                {"type": "array", "items": "int"},
                {"type": "map", "values": "string"},
            ],
            "default": None,
        },
        {
            "name": "when",
            "type": [
                {"type": "long", "logicalType": "timestamp-micros"},
                "string",
                {"type": "int", "logicalType": "time-millis"},
            ],
        },
        {"name": "list", "type": {"type": "array", "items": ["string", "double"]}},
        {"name": "by_key", "type": {"type": "map", "values": ["null", "long", LEVEL]}},
    ],
}
AT = dt.datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)


def member(index: int, value, size: int) -> dict:
    return {f"member{i}": value if i == index else None for i in range(size)}


# (value as produced, the row's value columns as the table holds them)
CASES = [
    (
        {
            "id": 1,
            "sl": "text",
            "shape": (f"{NS}.Circle", {"radius": 1.5}),
            "num": 7,
            "real": None,
            "mixed": True,
            "when": AT,
            "list": ["a", 2.5],
            "by_key": {"x": 3, "y": "HIGH", "z": None},
        },
        {
            "id": 1,
            "sl": member(0, "text", 2),
            "shape": member(0, {"radius": 1.5}, 2),
            "num": 7,
            "real": None,
            "mixed": member(0, True, 4),
            "when": member(0, AT, 3),
            "list": [member(0, "a", 2), member(1, 2.5, 2)],
            "by_key": {"x": member(0, 3, 2), "y": member(1, "HIGH", 2), "z": None},
        },
    ),
    (
        {
            "id": 2,
            "sl": 2**40,
            "shape": (f"{NS}.Square", {"side": 2.0, "label": 9}),
            "num": 2**40,
            "real": 0.25,
            "mixed": b"\x00\xff",
            "when": "soon",
            "list": [],
            "by_key": {},
        },
        {
            "id": 2,
            "sl": member(1, 2**40, 2),
            "shape": member(1, {"side": 2.0, "label": member(1, 9, 2)}, 2),
            "num": 2**40,
            "real": 0.25,
            "mixed": member(1, b"\x00\xff", 4),
            "when": member(1, "soon", 3),
            "list": [],
            "by_key": {},
        },
    ),
    (
        {
            "id": 3,
            "sl": "",
            "shape": None,
            "num": -1,
            "real": 1e300,
            "mixed": [1, 2],
            "when": dt.time(1, 2, 3, 4000),
            "list": [1.0],
            "by_key": {"k": "LOW"},
        },
        {
            "id": 3,
            "sl": member(0, "", 2),
            "shape": None,
            "num": -1,
            "real": 1e300,
            "mixed": member(2, [1, 2], 4),
            "when": member(2, 3_723_004_000, 3),
            "list": [member(1, 1.0, 2)],
            "by_key": {"k": member(1, "LOW", 2)},
        },
    ),
    (
        {
            "id": 4,
            "sl": "s",
            "shape": (f"{NS}.Square", {"side": 0.5, "label": "x"}),
            "num": 0,
            "real": None,
            "mixed": {"a": "b"},
            "when": "",
            "list": ["ñ"],
            "by_key": {},
        },
        {
            "id": 4,
            "sl": member(0, "s", 2),
            "shape": member(1, {"side": 0.5, "label": member(0, "x", 2)}, 2),
            "num": 0,
            "real": None,
            "mixed": member(3, {"a": "b"}, 4),
            "when": member(1, "", 3),
            "list": [member(0, "ñ", 2)],
            "by_key": {},
        },
    ),
]


def normalised(row: dict) -> dict:
    """A value row as pyiceberg gives it, maps as dicts (pyiceberg gives key/value pairs)."""
    out = {name: row[name] for name in CASES[0][1]}
    for name in ("mixed",):
        if out[name] and out[name]["member3"] is not None:
            out[name] = {**out[name], "member3": dict(out[name]["member3"])}
    out["by_key"] = dict(out["by_key"])
    return out


def test_union_types_follow_sparks_convention():
    fields = {f.name: f.dataType.simpleString() for f in avro_value_fields(json.dumps(SCHEMA), "t")}
    assert fields["sl"] == "struct<member0:string,member1:bigint>"
    assert (
        fields["shape"]
        == "struct<member0:struct<radius:double>,member1:struct<side:double,label:struct<member0:string,member1:bigint>>>"
    )
    assert fields["num"] == "bigint" and fields["real"] == "double", "int|long and float|double: Spark's widening"
    assert fields["mixed"] == "struct<member0:boolean,member1:binary,member2:array<int>,member3:map<string,string>>"
    assert fields["when"] == "struct<member0:timestamp,member1:string,member2:bigint>"
    assert fields["by_key"] == "map<string,struct<member0:bigint,member1:string>>"
    assert needs_record_names(json.dumps(SCHEMA)), "two records in one union: the decoder must name them"


@pytest.mark.parametrize(
    "union, clash",
    [
        (["string", LEVEL], "branches 0 and 1"),
        (["bytes", {"type": "fixed", "name": "F", "size": 2}], "branches 0 and 1"),
        (["null", {"type": "int", "logicalType": "date"}, "long"], "logical type"),
    ],
)
def test_unions_python_cannot_tell_apart_are_refused_naming_the_field(union, clash):
    schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}, {"name": "u", "type": union}]}
    with pytest.raises(ConfigError, match=clash) as caught:
        avro_value_fields(json.dumps(schema), "t")
    assert "value.u" in str(caught.value)


@pytest.mark.spark
@pytest.mark.broker
def test_unions_read_back_field_by_field_and_both_paths_give_the_same_rows(
    spark, broker, registry, state_dir, topic, make_config
):
    broker.create_topic(topic, 2)
    serialize = avro_serializer(registry.url, topic, json.dumps(SCHEMA))
    produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"k%d" % i, "value": serialize(value), "partition": i % 2} for i, (value, _) in enumerate(CASES)]
        + [{"key": b"bad", "value": serialize(CASES[0][0])[:9], "partition": 0}],
    )
    config = make_config({"topic": topic, "errors": "skip"})
    table = config.tables[0]

    # Row by row, the JVM path's rows are the Python path's (the reference).
    path, _, jvm_rows, python_rows = rows_on_both_paths(spark, config)
    assert path.name == JVM and path.avro.writers and not path.avro.routed, "unions are decoded in the JVM"
    assert len(python_rows) == len(CASES) + 1
    assert sum(r["icefloe_error_class"] is not None for r in python_rows.values()) == 1, "the truncated record"
    for position, expected in python_rows.items():
        assert jvm_rows[position] == expected, position

    result = run_table(spark, config, table, state_dir)
    assert result.read_path == JVM and result.rows_written == len(CASES) and result.records_failed == 1
    rows = sorted(read_pyiceberg(state_dir, result.identifier), key=lambda r: r["id"])
    assert [normalised(r) for r in rows] == [expected for _, expected in CASES]

    duck = sorted(read_duckdb(result.metadata_location), key=lambda r: r["id"])
    for row, (_, expected) in zip(duck, CASES):
        assert row["sl"] == expected["sl"] and row["shape"] == expected["shape"] and row["num"] == expected["num"]
        assert row["real"] == expected["real"] and row["list"] == expected["list"]
        assert {k: as_utc(v) for k, v in row["when"].items()} == expected["when"]
        mixed = row["mixed"]
        if mixed is not None and mixed["member3"] is not None:  # DuckDB gives a map as {key: [...], value: [...]}
            mixed = {**mixed, "member3": _duck_map(mixed["member3"])}
        assert mixed == expected["mixed"]
        assert _duck_map(row["by_key"]) == expected["by_key"]


def _duck_map(value) -> dict:
    if isinstance(value, dict) and set(value) == {"key", "value"}:
        return dict(zip(value["key"], value["value"]))
    return dict(value)


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_union_poison_catalogue(spark, broker, registry, state_dir, topic, make_config, mode):
    from test_poison import check_mode, lay_out

    serialize = avro_serializer(registry.url, topic, json.dumps(POISONED))
    header = serialize({"id": 1, "u": "ab", "n": None})[:5]
    poisons = [(name, "DecodeError", b"k", header + body) for name, body in UNION_POISONS]
    goods, bads = lay_out(
        broker, topic, poisons, lambda i: serialize({"id": i, "u": "s" if i % 2 else i, "n": f"n{i}"})
    )
    config = make_config({"topic": topic, "errors": mode})
    result = check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)
    if mode == "skip":
        assert result.read_path == JVM, "from_avro fails on them: the JVM path hands them to Python"
    if mode == "dlq":
        dead = read_pyiceberg(state_dir, config.identifier(config.tables[0]) + "_dlq")
        negative = [r["error_message"] for r in dead if r["kafka_partition"] in (2, 3, 4)]
        assert len(negative) == 3 and all("union branch index out of range" in m for m in negative), negative


POISONED = {
    "type": "record",
    "name": "U",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "u", "type": ["string", "long"]},
        {"name": "n", "type": ["null", "string"], "default": None},
    ],
}
# The body: id 1 (zigzag 0x02), `u`'s branch index (zigzag) and value, `n`'s branch index and value. fastavro reads a
# negative index from the end of the union (-1: the last branch), so those decoded silently into a wrong value.
UNION_POISONS = [
    ("union branch index out of range", b"\x02\x0e\x04ab\x00"),
    ("truncated inside a union member", b"\x02\x00\x08ab"),
    ("negative branch index -1 (read as long 2)", b"\x02\x01\x04\x00"),
    ("negative branch index -1 in [null, string] (read as 'x')", b"\x02\x00\x04ab\x01\x02x"),
    ("negative branch index -2 in [null, string] (read as null)", b"\x02\x00\x04ab\x03"),
]


@pytest.mark.parametrize("name, body", UNION_POISONS[2:])
def test_negative_union_branch_indexes_are_refused_by_every_python_avro_decoder(name, body):
    from icefloe.formats.avro.reader import glue_payload as avro_payload
    from icefloe.formats.avro.reader import inline_avro_decoder

    inline = inline_avro_decoder(json.dumps(POISONED))
    glue = avro_payload(json.dumps(POISONED), json.dumps(POISONED))
    # written without `n` (resolved to the table's schema): `u` with branch index -1
    evolved = avro_payload(json.dumps({**POISONED, "fields": POISONED["fields"][:2]}), json.dumps(POISONED))
    for decode, data in [(inline, b"\x00\x00\x00\x00\x01" + body), (glue, body), (evolved, b"\x02\x01\x04")]:
        with pytest.raises(ValueError, match=r"^Avro union branch index out of range \(negative"):
            decode(data)
