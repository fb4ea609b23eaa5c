"""Schemaless JSON (`format: json` without `schema`): columns inferred from each batch's records, the table evolved
batch after batch, values that do not fit the table's columns as bad records naming the field."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import partial

import pytest
from pyspark.sql import types as T

from icefloe.formats import plain_json, schemaless_json
from icefloe.formats.base import BATCH, BatchContext, DecoderSpec
from icefloe.formats.json_jvm import schemaless_codec
from icefloe.formats.plain_json import JSON
from icefloe.formats.registry import decoder_spec
from icefloe.formats.schemaless_json import decoder, infer, signature, spark_type, unified, unify, value_struct
from icefloe.materialize.batch import Batch
from icefloe.materialize.read_paths import PYTHON, choose_read_path
from icefloe.operate.runner import run_table
from icefloe.source.kafka import OffsetRange, client_config
from support import by_position, produce, read_duckdb, read_pyiceberg
from test_jvm_path import check_rows_on_both_paths


def inferred(*values) -> T.DataType:
    kind = "null"
    for value in values:
        kind = unify(kind, infer(value))
    return spark_type(kind)


def test_inference_rules():
    assert inferred({"a": 1}, {"a": 2**40}).simpleString() == "struct<a:bigint>", "int -> long"
    assert inferred({"a": 1}, {"a": 0.5}).simpleString() == "struct<a:double>", "int -> double"
    assert inferred({"a": 1}, {"a": "x"}).simpleString() == "struct<a:string>", "conflict -> string"
    assert inferred({"a": {"b": 1}}, {"a": [1]}).simpleString() == "struct<a:string>", "object and list -> string"
    assert inferred({"a": 2**64}).simpleString() == "struct<a:string>", "beyond 64 bits -> string"
    assert inferred({"a": None, "b": [], "c": {}}).simpleString() == "struct<b:array<string>,c:string>"
    assert inferred({"a": {"b": 1}}, {"a": {"c": [{"d": True}, {"e": 1.5}]}}).simpleString() == (
        "struct<a:struct<b:int,c:array<struct<d:boolean,e:double>>>>"
    )
    assert inferred({"x.y": 1, "`": 2, "": 3, "ok": 4}).simpleString() == "struct<ok:int>", "unusable keys: no column"


def random_json(rng: random.Random, depth: int = 0):
    """JSON values of few shapes, repeated, with keys differing in case, unusable keys and every number kind."""
    pick = rng.random()
    if depth < 3 and pick < 0.25:
        return {rng.choice(["a", "A", "b", "x.y", "c"]): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if depth < 3 and pick < 0.35:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([None, True, False, 0, -(2**31), 2**31, 2**63, -(2**63), 1.5, "s", ""])


@pytest.mark.parametrize("seed", range(20))
def test_repeated_shapes_are_inferred_once_to_the_same_type(seed):
    rng = random.Random(seed)
    values = [{"k": random_json(rng), "K": random_json(rng)} for _ in range(60)]
    values = [rng.choice(values) for _ in range(300)]  # shapes repeat, in any order
    folded = "null"
    for value in values:
        folded = unify(folded, infer(value))
    assert unified(values) == folded
    for a, b in zip(values, values[1:]):
        assert signature(a) != signature(b) or infer(a) == infer(b)


def test_a_later_batch_evolves_the_table_only_where_iceberg_can():
    current = [
        T.StructField("n", T.IntegerType()),
        T.StructField("s", T.StringType()),
        T.StructField("l", T.LongType()),
        T.StructField("st", T.StructType([T.StructField("a", T.IntegerType())])),
        T.StructField("kafka_offset", T.LongType()),
    ]
    batch = unify(infer({"n": 2**40, "s": 5, "l": 0.5, "st": {"a": 1, "b": "x"}, "new": [1]}), infer({"st": [1]}))
    assert value_struct(current, batch).simpleString() == (
        "struct<n:bigint,s:string,l:bigint,st:struct<a:int,b:string>,new:array<int>>"
    ), "int widens to long; string keeps; long stays (no long -> double in Iceberg); new keys add columns"
    assert value_struct([], infer({"kafka_offset": 1, "a": 1})).simpleString() == "struct<a:int>"


def test_values_are_shaped_for_the_columns_or_refused_naming_the_field():
    struct = T.StructType(
        [
            T.StructField("s", T.StringType()),
            T.StructField("d", T.DoubleType()),
            T.StructField("o", T.StructType([T.StructField("a", T.LongType())])),
        ]
    )
    decode = decoder(struct.json())
    assert decode(b'{"s": {"x": [1, "\xc3\xb1"]}, "d": 3, "o": {"a": 1, "z": null}}') == {
        "s": '{"x":[1,"ñ"]}',
        "d": 3,
        "o": {"a": 1},
    }
    with pytest.raises(ValueError, match=r"^o\.b: the table has no column for this key"):
        decode(b'{"o": {"a": 1, "b": 2}}')
    with pytest.raises(ValueError, match=r"^d: an integer that cannot be held exactly by the double column$"):
        decode(b'{"d": 9007199254740993}')


@pytest.mark.spark
@pytest.mark.broker
def test_schemaless_json_end_to_end_over_four_batches(spark, broker, state_dir, topic, make_config, monkeypatch):
    """A new table's batch, one that adds and widens columns and has bad records, then two of known shapes: the second
    read once, the table's columns assumed and only what the streamed write leaves to Python inferred (issue 31)."""
    broker.create_topic(topic, 2)
    found_first = []  # the JVM passes that find the records to infer before a batch is read
    monkeypatch.setattr(
        schemaless_json,
        "unexplained_ranges",
        partial(lambda real, *args: found_first.append(args) or real(*args), schemaless_json.unexplained_ranges),
    )
    first = [
        {
            "id": 1,
            "name": "ann",
            "score": 1,
            "ratio": 0.5,
            "ok": True,
            "tags": ["a", "b"],
            "address": {"city": "Oslo", "zip": 1234},
            "items": [{"sku": "x", "qty": 1}],
            "mixed": 1,
            "gone": None,
        },
        {
            "id": 2,
            "name": "bob",
            "score": 2,
            "ratio": 2,
            "ok": False,
            "tags": [],
            "address": {"city": "Rome"},
            "items": [],
            "mixed": "two",
        },
        {
            "id": 3,
            "name": None,
            "score": -3,
            "ratio": -1.25e3,
            "ok": None,
            "tags": ["ñ"],
            "address": None,
            "items": [{"sku": "y", "qty": 2}, {"sku": "z"}],
            "mixed": {"k": [1, None]},
        },
    ]
    produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"k%d" % r["id"], "value": json.dumps(r).encode(), "partition": r["id"] % 2} for r in first]
        + [{"value": None, "partition": 0}],
    )
    config = make_config({"topic": topic, "format": "json", "errors": "dlq"})
    table = config.tables[0]

    result = run_table(spark, config, table, state_dir)
    assert result.rows_written == 4 and result.records_failed == 0 and result.read_path == "jvm"
    rows = sorted(read_pyiceberg(state_dir, result.identifier), key=lambda r: (r["id"] is None, r["id"]))
    values = [{k: v for k, v in r.items() if not k.startswith("kafka_")} for r in rows]
    # The tombstone's null list of structs reads back as [] (pyiceberg and DuckDB; Spark's frame holds null):
    # not specific to schemaless JSON, left to the lead (see the branch report).
    assert values[3]["items"] in (None, [])
    values[3]["items"] = None
    assert values == [
        {
            "id": 1,
            "name": "ann",
            "score": 1,
            "ratio": 0.5,
            "ok": True,
            "tags": ["a", "b"],
            "address": {"city": "Oslo", "zip": 1234},
            "items": [{"sku": "x", "qty": 1}],
            "mixed": "1",
        },
        {
            "id": 2,
            "name": "bob",
            "score": 2,
            "ratio": 2.0,
            "ok": False,
            "tags": [],
            "address": {"city": "Rome", "zip": None},
            "items": [],
            "mixed": "two",
        },
        {
            "id": 3,
            "name": None,
            "score": -3,
            "ratio": -1250.0,
            "ok": None,
            "tags": ["ñ"],
            "address": None,
            "items": [{"sku": "y", "qty": 2}, {"sku": "z", "qty": None}],
            "mixed": '{"k":[1,null]}',
        },
        {
            "id": None,
            "name": None,
            "score": None,
            "ratio": None,
            "ok": None,
            "tags": None,
            "address": None,
            "items": None,
            "mixed": None,
        },  # the tombstone keeps its row
    ]
    duck = sorted(read_duckdb(result.metadata_location), key=lambda r: (r["id"] is None, r["id"]))
    duck_values = [{k: v for k, v in r.items() if not k.startswith("kafka_")} for r in duck]
    assert duck_values[:3] == values[:3] and {**duck_values[3], "items": None} == values[3]
    schema = {f.name: str(f.field_type) for f in _table(state_dir, result.identifier).schema().fields}
    assert schema["score"] == "int" and schema["ratio"] == "double" and "gone" not in schema

    second = [
        {
            "id": 4,
            "score": 2**40,
            "mixed": 5,
            "address": {"city": "Lima", "zone": "c"},
            "items": [{"sku": "w", "note": "n"}],
            "fresh": 7,
        },
        {"id": 5, "name": "fits", "ratio": 3},
        {"id": 2.5, "name": "a fraction in a long column"},
        {"id": 6, "ok": "yes"},
        {"id": 7, "address": [1]},
    ]
    positions = produce(
        broker.bootstrap_servers, topic, [{"value": json.dumps(r).encode(), "partition": 0} for r in second]
    )
    found_first.clear()
    again = run_table(spark, config, table, state_dir)
    assert again.rows_written == 2 and again.records_failed == 3
    assert len(found_first) == 1, "the table's columns assumed first, then the batch's inferred: found once"
    schema = {f.name: str(f.field_type) for f in _table(state_dir, result.identifier).schema().fields}
    assert schema["score"] == "long", "int widened to long"
    assert schema["fresh"] == "int" and "zone" in schema["address"] and "note" in schema["items"]
    rows = by_position(read_pyiceberg(state_dir, result.identifier))
    row = rows[positions[0]]
    assert (row["score"], row["mixed"], row["address"], row["items"], row["fresh"]) == (
        2**40,
        "5",
        {"city": "Lima", "zip": None, "zone": "c"},
        [{"sku": "w", "qty": None, "note": "n"}],
        7,
    )
    assert rows[positions[1]]["ratio"] == 3.0 and rows[positions[1]]["fresh"] is None
    dead = by_position(read_pyiceberg(state_dir, result.identifier + "_dlq"))
    assert {p: (r["error_class"], r["error_message"].split(":")[0]) for p, r in dead.items()} == {
        positions[2]: ("ConversionError", "id"),
        positions[3]: ("ConversionError", "ok"),
        positions[4]: ("ConversionError", "address"),
    }, "values that do not fit the table's columns are bad records naming the field"

    # Right after a batch that changed the columns, a batch is checked first (new keys may keep coming); then the
    # columns are assumed again.
    produce(broker.bootstrap_servers, topic, [{"value": json.dumps({"id": 7, "name": "checked"}).encode()}])
    found_first.clear()
    assert run_table(spark, config, table, state_dir).rows_written == 1 and len(found_first) == 1
    third = [{"id": 8, "name": "known shapes"}, {"id": 8.5}, {"id": 9, "fresh": 2, "mixed": 1}]
    positions = produce(
        broker.bootstrap_servers, topic, [{"value": json.dumps(r).encode(), "partition": 1} for r in third]
    )
    found_first.clear()
    last = run_table(spark, config, table, state_dir)
    assert (last.rows_written, last.records_failed, last.read_path, found_first) == (2, 1, "jvm", [])
    rows = by_position(read_pyiceberg(state_dir, result.identifier))
    assert (rows[positions[0]]["name"], rows[positions[2]]["fresh"], rows[positions[2]]["mixed"]) == (
        "known shapes",
        2,
        "1",
    )
    dead = by_position(read_pyiceberg(state_dir, result.identifier + "_dlq"))
    assert (dead[positions[1]]["error_class"], dead[positions[1]]["error_message"].split(":")[0]) == (
        "ConversionError",
        "id",
    )


def _table(state_dir, identifier):
    from icefloe_dev.readers import pyiceberg_catalog

    return pyiceberg_catalog(state_dir).load_table(identifier)


def struct(**columns) -> T.StructType:
    return T.StructType([T.StructField(name, dtype, True) for name, dtype in columns.items()])


COLUMNS = struct(
    id=T.LongType(),
    name=T.StringType(),
    score=T.IntegerType(),
    ratio=T.DoubleType(),
    ok=T.BooleanType(),
    tags=T.ArrayType(T.StringType()),
    address=struct(city=T.StringType(), zip=T.IntegerType()),
    items=T.ArrayType(struct(sku=T.StringType(), qty=T.IntegerType())),
    mixed=T.StringType(),
)
FITTING = [  # every key a column, each value of its column's type: exact on the JVM, written compactly
    {"id": 1, "name": "ann", "score": 1, "ratio": 0.5, "ok": True, "tags": ["a"], "address": {"city": "Oslo",
     "zip": 1}, "items": [{"sku": "x", "qty": 1}], "mixed": "m"},
    {"id": 2, "name": None, "score": None, "ratio": -1250.0, "ok": None, "tags": [], "address": None, "items": [],
     "mixed": None},
    {"id": 3, "name": "ñ 🧊", "ratio": 0.125},  # keys left out: Python leaves them null too
    {"id": 4, "items": [{"sku": "y"}, None]},
]  # fmt: skip
NOT_FITTING = [  # Python decodes these (their value, or their error naming the field)
    {"id": 5, "mixed": 5},  # a number in a string column: its JSON text
    {"id": 6, "mixed": {"k": [1, None]}},
    {"id": 7, "ratio": 3},  # an integer in a double column (Spark writes 3.0)
    {"id": 13, "ratio": 1e-05},  # a double Python writes otherwise than Java (1.0E-5)
    {"id": 8, "fresh": 1},  # a key without a column
    {"id": 9, "score": 2**40},  # beyond the int column
    {"id": 2.5},  # a fraction in a long column
    {"id": 10, "ok": "yes"},
    {"id": 11, "address": [1]},
    {"name": "no id", "id": 12},  # another key order
]


def compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.fixture
def columns_spec(topic, make_config):
    """A schemaless table's config, and its decoder spec as `for_batch` gives it for COLUMNS."""
    config = make_config({"topic": topic, "format": "json", "errors": "skip"})
    table = config.tables[0]
    return config, replace(decoder_spec(table, config.cluster(table.source_cluster)), schema_str=COLUMNS.json())


def test_schemaless_rows_of_the_jvm_path_are_the_python_paths_rows(spark, broker, topic, columns_spec):
    config, spec = columns_spec
    broker.create_topic(topic, 2)
    values = [compact(r) for r in FITTING] + [json.dumps(r, ensure_ascii=False).encode() for r in FITTING]
    values += [compact(r) for r in NOT_FITTING] + [b"[1]", b"{", None]
    produce(broker.bootstrap_servers, topic, [{"value": v, "partition": i % 2} for i, v in enumerate(values)])
    table = config.tables[0]

    rules = JSON.rules(spec, table)
    check_rows_on_both_paths(
        spark,
        config,
        list(COLUMNS.fields),
        rules,
        records=len(values),
        failed=7,
        for_python=len(NOT_FITTING) + 2,
        decoder=spec,
    )


def test_schemaless_columns_the_jvm_does_not_read_keep_the_table_on_python():
    found = schemaless_codec(struct(id=T.LongType(), at=struct(when=T.TimestampType())))
    assert isinstance(found, str) and "at.when (timestamp) in schemaless JSON" in found
    spec = DecoderSpec("json", BATCH, "t", struct(id=T.LongType(), m=T.MapType(T.StringType(), T.LongType())).json())
    assert choose_read_path(None, spec).name == PYTHON


@pytest.fixture
def inferred_over(monkeypatch) -> list:
    """The ranges each inference infers (`schemaless_json.infer_batch` in Spark tasks, `infer_here` in the driver),
    in call order."""
    calls: list = []
    in_spark, here = schemaless_json.infer_batch, schemaless_json.infer_here
    monkeypatch.setattr(
        schemaless_json,
        "infer_batch",
        lambda s, conf, ranges, *rest: calls.append(ranges) or in_spark(s, conf, ranges, *rest),
    )
    monkeypatch.setattr(
        schemaless_json, "infer_here", lambda conf, ranges, *rest: calls.append(ranges) or here(conf, ranges, *rest)
    )
    return calls


def test_only_records_the_columns_do_not_explain_are_inferred_in_python(
    spark, broker, topic, columns_spec, inferred_over, monkeypatch
):
    config, spec = columns_spec
    broker.create_topic(topic, 2)
    fitting = [compact(r) for r in FITTING]
    partition_1 = fitting[:2] + [compact({"id": 20, "fresh": 1})] + fitting[2:] + [compact({"id": 21, "ratio": 3})]
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": v, "partition": 0} for v in fitting + [None]] + [{"value": v, "partition": 1} for v in partition_1],
    )
    batch = Batch([OffsetRange(topic, 0, 0, 5), OffsetRange(topic, 1, 0, 6)], {0: 5, 1: 6})
    table_fields = [*COLUMNS.fields, T.StructField("kafka_offset", T.LongType())]
    context = BatchContext(client_config(config.cluster("local")), batch.tasks(), 1_000_000, table_fields)
    codec = schemaless_codec(COLUMNS)

    assert schemaless_json.unexplained_ranges(spark, codec, context) == [OffsetRange(topic, 1, 2, 6)]

    fields = JSON.for_batch(spark, spec, context).fields
    assert inferred_over == [[OffsetRange(topic, 1, 2, 6)]]
    assert [f.name for f in fields] == [*COLUMNS.fieldNames(), "fresh"] and fields[3].dataType == T.DoubleType()

    explained = BatchContext(context.kafka_conf, [OffsetRange(topic, 0, 0, 5)], 1_000_000, table_fields)
    inferred_over.clear()
    assert JSON.for_batch(spark, spec, explained).fields == list(COLUMNS.fields) and inferred_over == []
    # Columns assumed: nothing inferred before the batch is read; the records the write leaves to Python are
    # inferred then, and tell whether the table's columns explain them.
    assumed = JSON.for_batch(spark, spec, replace(context, assume=True))
    assert assumed.fields == list(COLUMNS.fields) and inferred_over == [] and assumed.explains is not None
    assert not assumed.explains([OffsetRange(topic, 1, 2, 3)])  # "fresh": a new column
    assert assumed.explains([OffsetRange(topic, 0, 0, 5)])

    monkeypatch.setattr(plain_json, "INFERRED_HERE", 3)  # more records than this: inferred by Spark tasks
    here = []
    monkeypatch.setattr(schemaless_json, "infer_here", lambda *args: here.append(args))
    assert JSON.for_batch(spark, spec, context).fields == fields and here == []


def test_a_new_tables_first_batch_infers_its_first_records_and_what_they_do_not_explain(
    spark, broker, topic, columns_spec, inferred_over, monkeypatch, caplog
):
    """A new table: each partition's first records (here 2) are inferred, their columns stand in for the table's in
    the JVM pass, and only what they do not explain is inferred too; the columns' types are those of inferring the
    whole batch, in the order the keys appear in the first records, then in the rest. The first records are read
    by the driver itself: a Spark task for them would start a Python worker, which costs more (issue 31)."""
    config, spec = columns_spec
    broker.create_topic(topic, 2)
    partition_0 = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": 7}, {"id": 4}, {"late": 1.5}]
    partition_1 = [{"id": 6, "score": 1}, {"id": 7, "score": 2}, {"id": 8, "score": 2**40}, {"id": 9, "score": 3}]
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": compact(v), "partition": p} for p, part in enumerate((partition_0, partition_1)) for v in part],
    )
    tasks = [OffsetRange(topic, 0, 0, 5), OffsetRange(topic, 1, 0, 4)]
    context = BatchContext(client_config(config.cluster("local")), tasks, 1_000_000, [])
    monkeypatch.setattr(plain_json, "SAMPLE_RECORDS", 2)
    sampled_here: list = []
    here = schemaless_json.infer_here  # the fixture's recorder
    monkeypatch.setattr(
        schemaless_json,
        "infer_here",
        lambda conf, ranges, *rest: sampled_here.append(ranges) or here(conf, ranges, *rest),
    )

    with caplog.at_level("INFO", logger="icefloe.formats.plain_json"):
        fields = JSON.for_batch(spark, spec, replace(context, assume=True)).fields  # a new table's: never assumed
    assert "4 (at most) of the batch's records to infer in Python, the first records' columns" in caplog.text

    first_records = [OffsetRange(topic, 0, 0, 2), OffsetRange(topic, 1, 0, 2)]
    assert inferred_over == [first_records, [OffsetRange(topic, 0, 2, 5), OffsetRange(topic, 1, 2, 3)]]
    assert sampled_here == inferred_over  # few records: read by the driver
    assert [f.name for f in fields] == ["id", "name", "score", "late"]
    monkeypatch.setattr(plain_json, "SAMPLE_RECORDS", 100)  # the first records are the whole batch
    inferred_over.clear()
    whole = JSON.for_batch(spark, spec, context).fields
    assert inferred_over[0] == tasks and [f.name for f in whole] == ["id", "name", "late", "score"]
    assert {f.name: f.dataType for f in fields} == {f.name: f.dataType for f in whole}
    assert (whole[1].dataType, whole[3].dataType) == (T.StringType(), T.LongType())


def test_a_kafka_timestamp_spark_cannot_read_sends_a_known_tables_batch_to_python(
    spark, broker, state_dir, topic, make_config
):
    """A table with columns meets a record whose Kafka timestamp overflows Spark's Kafka source (nanoseconds where
    Kafka wants milliseconds): the JVM pass that finds the records to infer cannot read it either, so Python infers
    them all, and the batch is read on the Python path, the record a bad record as there."""
    broker.create_topic(topic, 1, config={"message.timestamp.after.max.ms": str(2**63 - 1)})
    config = make_config({"topic": topic, "format": "json", "errors": "skip"})
    produce(broker.bootstrap_servers, topic, [{"value": compact({"id": 1, "name": "a"})}])
    assert run_table(spark, config, config.tables[0], state_dir).rows_written == 1
    nanoseconds = 1_700_000_000_000_000_000
    produce(
        broker.bootstrap_servers,
        topic,
        [
            {"value": compact({"id": 2, "name": "b"})},
            {"value": compact({"id": 3, "name": "c", "fresh": 1}), "timestamp": nanoseconds},
            {"value": compact({"id": 4, "name": "d"})},
        ],
    )

    result = run_table(spark, config, config.tables[0], state_dir)

    assert (result.read_path, result.rows_written, result.records_failed) == ("python", 2, 1), result.describe()
    rows = read_pyiceberg(state_dir, result.identifier)
    assert sorted(r["id"] for r in rows) == [1, 2, 4]
