"""End to end: the local Apache Kafka broker, Apicurio Registry, real Spark, tables read back independently."""

from __future__ import annotations

import datetime as dt
import json
import random
import time
import uuid
from decimal import Decimal

import pytest

from icefloe.commit.checkpoint import committed_state
from icefloe.errors import RecordError
from icefloe.materialize.batch import materialize_once
from icefloe.operate.runner import run_table
from icefloe.table.iceberg import IcebergTable
from support import (
    ANY_CATALOG,
    as_utc,
    avro_serializer,
    by_position,
    load_pyiceberg,
    produce,
    read_duckdb,
    read_pyiceberg,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker]
UTC = dt.UTC

ORDER_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "test.icefloe",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
            {"name": "created_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {
                "name": "created_us",
                "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
                "default": None,
            },
            {"name": "local_ts", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "blob", "type": ["null", "bytes"], "default": None},
            {"name": "score", "type": "double"},
            {"name": "ratio", "type": "float"},
            {"name": "flag", "type": "boolean"},
            {
                "name": "address",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "Address",
                        "fields": [
                            {"name": "street", "type": "string"},
                            {
                                "name": "geo",
                                "type": {
                                    "type": "record",
                                    "name": "Geo",
                                    "fields": [
                                        {"name": "lat", "type": "double"},
                                        {"name": "lon", "type": ["null", "double"]},
                                    ],
                                },
                            },
                        ],
                    },
                ],
                "default": None,
            },
            {
                "name": "items",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Item",
                        "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
                    },
                },
            },
            {"name": "attrs", "type": {"type": "map", "values": ["null", "string"]}},
            {"name": "checksum", "type": {"type": "fixed", "name": "Check", "size": 4}},
        ],
    }
)


FIELD_NAMES = [f["name"] for f in json.loads(ORDER_SCHEMA)["fields"]]


def order(i: int, rng: random.Random) -> dict:
    maybe = lambda v: None if rng.random() < 0.3 else v  # noqa: E731 - nulls in every optional field
    return {
        "id": i,
        "name": maybe(f"customer-{i}-ü"),
        "status": rng.choice(["NEW", "PAID", "SHIPPED"]),
        "amount": Decimal(rng.randint(-(10**9), 10**9)).scaleb(-3),
        "created_ms": dt.datetime(2024, 2, 29, 23, 59, 59, 123000, tzinfo=UTC) + dt.timedelta(seconds=i),
        "created_us": maybe(dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - dt.timedelta(days=i)),
        "local_ts": dt.datetime(2030, 1, 1, 8, 30, 0, 654321) + dt.timedelta(minutes=i),
        "day": dt.date(1970, 1, 1) + dt.timedelta(days=i * 37),
        "ref": uuid.UUID(int=rng.getrandbits(128)),
        "blob": maybe(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 16)))),
        "score": rng.uniform(-1e6, 1e6),
        "ratio": rng.choice([0.5, -1.25, 3.0, 0.0]),
        "flag": rng.random() < 0.5,
        "address": maybe(
            {"street": f"{i} Main St", "geo": {"lat": rng.uniform(-90, 90), "lon": maybe(rng.uniform(-180, 180))}}
        ),
        "items": [{"sku": f"sku-{j}", "qty": j} for j in range(rng.randint(0, 3))],
        "attrs": {f"k{j}": maybe(f"v{j}") for j in range(rng.randint(0, 3))},
        "checksum": i.to_bytes(4, "big"),
    }


def expected_row(value: dict) -> dict:
    """How each Avro value looks in the table (see formats.avro.mapping's mapping table)."""
    return {**value, "status": value["status"], "ref": str(value["ref"])}


def normalize(row: dict) -> dict:
    """Reader-specific shapes to plain Python: maps as dicts, timestamps in UTC."""
    out = {}
    for name, value in row.items():
        if name == "attrs" and isinstance(value, list):
            value = dict(value)
        if name == "ratio" and value is not None:
            value = float(value)
        out[name] = as_utc(value)
    return out


def produce_orders(broker, registry, topic: str, ids: range, rng: random.Random) -> dict[tuple[int, int], dict]:
    serialize = avro_serializer(registry.url, topic, ORDER_SCHEMA)
    values = [order(i, rng) for i in ids]
    records = [
        {
            "key": None if i % 7 == 0 else f"order-{i}".encode(),
            "value": serialize(v),
            "headers": [("trace", f"t{i}".encode()), ("empty", None)] if i % 2 else None,
            "partition": i % 3,
        }
        for i, v in zip(ids, values)
    ]
    positions = produce(broker.bootstrap_servers, topic, records)
    return {pos: {"value": v, "record": r} for pos, v, r in zip(positions, values, records)}


def assert_rows_match(rows: list[dict], produced: dict, topic: str, empty_for_null_struct_list: bool = False) -> None:
    """`empty_for_null_struct_list`: pyiceberg 0.12 reads a null list<struct> as [] (apache/iceberg-python#3833;
    the Parquet file holds a null, which DuckDB reads back as null)."""
    keyed = by_position(rows)
    assert set(keyed) == set(produced), "table rows must be exactly the produced (partition, offset) pairs"
    for position, sent in produced.items():
        row = normalize(keyed[position])
        value = sent["value"]
        if value is None:
            if empty_for_null_struct_list and row["items"] == []:
                row["items"] = None
            assert all(row[name] is None for name in FIELD_NAMES), str(
                {n: row[n] for n in FIELD_NAMES if row[n] is not None}
            )
        else:
            for name, want in expected_row(value).items():
                assert row[name] == want, f"{position} field {name}: {row[name]!r} != {want!r}"
        record = sent["record"]
        assert row["kafka_topic"] == topic
        assert row["kafka_key"] == record["key"]
        headers = [(h["key"], h["value"]) for h in row["kafka_headers"]] if row["kafka_headers"] else None
        assert headers == record["headers"]
        assert row["kafka_timestamp"].tzinfo is not None and row["kafka_timestamp_type"] == "CreateTime"


@ANY_CATALOG
def test_avro_topic_lands_field_by_field(catalog, spark, broker, registry, state_dir, topic, make_config):
    broker.create_topic(topic, 3)
    rng = random.Random(42)
    produced = produce_orders(broker, registry, topic, range(240), rng)
    # A tombstone keeps its (partition, offset) as a row of metadata in an append table.
    tomb = produce(broker.bootstrap_servers, topic, [{"key": b"gone", "value": None, "partition": 1}])[0]
    produced[tomb] = {"value": None, "record": {"key": b"gone", "headers": None}}
    config = make_config({"topic": topic, "partitionBy": ["day(created_ms)"]})

    result = run_table(spark, config, config.tables[0], state_dir)

    assert result.status == "committed" and result.rows_written == len(produced)
    assert result.offsets == {p: 1 + max(o for (q, o) in produced if q == p) for p in range(3)}
    duck_rows = read_duckdb(result.metadata_location)
    assert_rows_match(duck_rows, produced, topic)
    iceberg_rows = read_pyiceberg(state_dir, result.identifier)
    assert_rows_match(iceberg_rows, produced, topic, empty_for_null_struct_list=True)
    spec = load_pyiceberg(state_dir, result.identifier).spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [("created_ms_day", "day")]


def test_second_run_commits_nothing_and_new_records_only_add_rows(
    spark, broker, registry, state_dir, topic, make_config
):
    broker.create_topic(topic, 3)
    rng = random.Random(7)
    produced = produce_orders(broker, registry, topic, range(90), rng)
    config = make_config({"topic": topic})
    first = run_table(spark, config, config.tables[0], state_dir)
    assert first.rows_written == 90

    again = run_table(spark, config, config.tables[0], state_dir)
    assert again.status == "up-to-date" and again.snapshot_id == first.snapshot_id
    table = IcebergTable(spark, first.identifier)
    assert table.main_snapshot_id() == first.snapshot_id, "a run with nothing new must not commit"

    produced |= produce_orders(broker, registry, topic, range(90, 130), rng)
    third = run_table(spark, config, config.tables[0], state_dir)
    assert third.rows_written == 40
    assert_rows_match(read_pyiceberg(state_dir, first.identifier), produced, topic)


def test_bad_record_stops_there_and_a_fixed_rerun_resumes_at_it(spark, broker, registry, state_dir, topic, make_config):
    broker.create_topic(topic, 3)
    rng = random.Random(3)
    produce_orders(broker, registry, topic, range(30), rng)
    config = make_config({"topic": topic})
    run_table(spark, config, config.tables[0], state_dir)
    # Wrong magic byte in partition 2, with good records behind it in every partition.
    bad = produce(broker.bootstrap_servers, topic, [{"value": b"\x07not-avro", "partition": 2}])[0]
    later = produce_orders(broker, registry, topic, range(30, 36), rng)

    with pytest.raises(RecordError) as caught:
        materialize_once(spark, config, config.tables[0])
    assert (caught.value.partition, caught.value.offset) == bad
    assert "magic byte" in caught.value.cause.lower()
    identifier = config.identifier(config.tables[0])
    state = committed_state(IcebergTable(spark, identifier), topic)
    assert state.offsets == {0: 12, 1: 12, 2: bad[1]}, "nothing at or past the bad record is committed"
    positions = set(by_position(read_pyiceberg(state_dir, identifier)))
    assert {p for p in later if p[0] != 2} <= positions and not {p for p in later if p[0] == 2} & positions

    # The fix (here: skip bad records) resumes exactly at the bad record.
    fixed = make_config({"topic": topic, "errors": "skip"})
    result = run_table(spark, fixed, fixed.tables[0], state_dir)
    assert result.records_failed == 1 and result.rows_written == 2
    assert len(by_position(read_pyiceberg(state_dir, identifier))) == 36


def test_schema_evolution_adds_a_column(spark, broker, registry, state_dir, topic, make_config):
    broker.create_topic(topic, 1)
    v1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}, {"name": "age", "type": "int"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}
    first = avro_serializer(registry.url, topic, json.dumps(v1))
    produce(broker.bootstrap_servers, topic, [{"value": first({"id": i, "age": 30 + i})} for i in range(3)])
    config = make_config({"topic": topic})
    run_table(spark, config, config.tables[0], state_dir)

    second = avro_serializer(registry.url, topic, json.dumps(v2))
    produce(broker.bootstrap_servers, topic, [{"value": second({"id": 9, "age": 50, "email": "a@b.c"})}])
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.rows_written == 1
    rows = sorted(read_pyiceberg(state_dir, result.identifier), key=lambda r: r["id"])
    assert [(r["id"], r["age"], r["email"]) for r in rows] == [
        (0, 30, None),
        (1, 31, None),
        (2, 32, None),
        (9, 50, "a@b.c"),
    ]


def test_a_key_field_the_registry_schema_lacks_is_a_config_error(
    spark, broker, registry, state_dir, topic, make_config
):
    from icefloe.errors import ConfigError

    broker.create_topic(topic, 1)
    schema = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": avro_serializer(registry.url, topic, json.dumps(schema))({"id": 1})}],
    )
    config = make_config({"topic": topic, "mode": "upsert", "key": ["user_id"]})
    with pytest.raises(ConfigError, match=r"key names field\(s\) \['user_id'\] that the value schema does not have"):
        materialize_once(spark, config, config.tables[0])
    assert not IcebergTable(spark, config.identifier(config.tables[0])).exists()


def test_added_columns_quote_nested_field_names(spark, state_dir):
    """New columns, one a struct whose nested names Spark SQL only reads quoted (`simpleString` leaves them bare),
    added by one metadata commit."""
    from pyspark.sql import types as T

    from icefloe.table.catalog import CATALOG

    table = IcebergTable(spark, "local.quoted_names")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.local")
    spark.sql(f"CREATE TABLE {table.full_name} (id bigint) USING iceberg")
    nested = T.StructType(
        [
            T.StructField("unit price", T.DoubleType()),
            T.StructField("a`b", T.LongType()),
            T.StructField("tags", T.ArrayType(T.StructType([T.StructField("x-y", T.StringType())]))),
        ]
    )
    wanted = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("price info", nested), T.StructField("n", T.LongType())]
    )
    commits = table.java().operations().current().previousFiles().size()
    table.evolve(wanted)
    assert spark.table(table.full_name).schema["price info"].dataType == nested
    # Every new column in one metadata commit (a new schemaless table gets its columns at once).
    assert table.java().operations().current().previousFiles().size() == commits + 1


N_SCHEMA = json.dumps({"type": "record", "name": "N", "fields": [{"name": "n", "type": "long"}]})
SECONDS_PER_RECORD = 0.03  # the slowed writer of the budget tests: at most 33 records/s


class StoppedByTimeLimit(Exception):
    """A batch still writing when its job's time limit passed: EMR stops the job, nothing is published."""


def small_backlog_table(fmt: str, broker, registry, topic: str, records: int) -> tuple[dict, list]:
    """A 2-partition topic of `records` tiny records (JSON or registry Avro) and the table spec reading it."""
    broker.create_topic(topic, 2)
    if fmt == "json":
        encode, spec = (
            (lambda n: json.dumps({"n": n}).encode()),
            {"format": "json", "schema": {"fields": [{"name": "n", "type": "long"}]}},
        )
    else:
        serialize = avro_serializer(registry.url, topic, N_SCHEMA)
        encode, spec = (lambda n: serialize({"n": n})), {"format": "avro"}
    positions = produce(
        broker.bootstrap_servers, topic, [{"value": encode(n), "partition": n % 2} for n in range(records)]
    )
    return {
        "topic": topic,
        **spec,
        "runTimeout": "1m",
        "maintenance": {"enabled": False, "orphanFileAge": "1m"},
    }, positions


@pytest.mark.parametrize("fmt", ["json", "avro"])  # the Python read path and the JVM one
def test_backlog_in_batches_that_each_publish_under_a_short_time_limit(
    fmt, spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    """Each run is a job stopped after 90 s (`--deadline-minutes 1.5`; a loaded machine needs tens of seconds for a
    batch of nothing), its writer slowed to 33 records/s: a batch of the whole backlog (2,000 records) would write
    for 60 s after that. Every run must publish (be done before its time limit); the first, unmeasured, is sized by
    the default rate, the next ones by the rate their predecessors measured."""
    from icefloe.commit import branch as commit
    from icefloe.materialize import budget
    from icefloe.materialize.budget import Deadline

    monkeypatch.setattr(budget, "DEFAULT_BYTES_PER_SECOND", 200)  # a first batch of a few hundred tiny records
    spec, positions = small_backlog_table(fmt, broker, registry, topic, 2_000)
    config = make_config(spec)
    deadlines: list[Deadline] = []
    append = commit.Branch.append

    def slow_append(branch, frame) -> None:
        time.sleep(SECONDS_PER_RECORD * branch.checkpoint.throughput.records)
        if time.time() > deadlines[-1].at:
            raise StoppedByTimeLimit(f"batch of {branch.checkpoint.throughput.records} records")
        append(branch, frame)

    monkeypatch.setattr(commit.Branch, "append", slow_append)
    written = []
    while True:
        deadlines.append(Deadline.after_minutes(1.5, time.time()))
        result = run_table(spark, config, config.tables[0], state_dir, deadline=deadlines[-1])
        if result.status != "committed":
            break
        written.append(result.rows_written)
    assert len(written) >= 3 and sum(written) == 2_000, written
    assert sorted(by_position(read_pyiceberg(state_dir, result.identifier))) == sorted(positions)


def test_a_run_stopped_before_it_published_halves_the_next_plan(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    """A run stopped at its job's time limit (or SIGKILLed) leaves its branch and publishes nothing; the next run
    plans half of what that run planned from the same checkpoint, so a backlog cannot wedge the table."""
    from icefloe.commit import branch as commit
    from icefloe.materialize import budget

    monkeypatch.setattr(budget, "DEFAULT_BYTES_PER_SECOND", 200)
    spec, positions = small_backlog_table("json", broker, registry, topic, 20_000)
    config = make_config(spec)
    first = run_table(spark, config, config.tables[0], state_dir)  # measures the rate of this table's batches
    # The measured rate depends on the machine's speed; fixed here so that a batch plans 4,000 records of 10 bytes.
    seconds = budget.seconds_for_batch(config.tables[0].run_timeout_seconds, None)
    monkeypatch.setattr(budget, "measured_rate", lambda state: budget.Rate(1.0, 4_000 * 10 / seconds, 10.0))
    monkeypatch.setattr(budget, "sample_record_bytes", lambda *args: 10.0)
    planned = []

    def stopped(branch, frame) -> None:
        planned.append(branch.checkpoint.throughput.records)
        raise StoppedByTimeLimit()

    with monkeypatch.context() as patched:  # stopped: no cleanup either, its branch stays
        patched.setattr(commit.Branch, "append", stopped)
        patched.setattr(IcebergTable, "drop_branch", lambda self, name: None)
        with pytest.raises(StoppedByTimeLimit):
            materialize_once(spark, config, config.tables[0])
    second = run_table(spark, config, config.tables[0], state_dir)
    assert second.status == "committed" and 3_990 <= planned[0] <= 4_000 < 20_000 - first.rows_written
    assert second.rows_written == planned[0] // 2
    while (result := run_table(spark, config, config.tables[0], state_dir)).status == "committed":
        pass
    assert sorted(by_position(read_pyiceberg(state_dir, result.identifier))) == sorted(positions)


def test_a_batch_refused_at_its_run_timeout_is_retried_at_half_the_size(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    """A batch that wrote for longer than `runTimeout` is refused before it publishes; `run_table` retries it at
    once, each retry planning half the records of the attempt before (the same size would be refused again), so
    the run publishes some of a backlog too big for its time."""
    from icefloe.commit import branch as commit

    spec, positions = small_backlog_table("json", broker, registry, topic, 2_000)
    config = make_config(spec)
    planned, late = [], set()
    append, started = commit.Branch.append, commit.run_started

    def append_slowly(branch, frame) -> None:
        planned.append(branch.checkpoint.throughput.records)
        append(branch, frame)
        if len(planned) < 3:  # the first two attempts write past runTimeout
            late.add(branch.checkpoint.run_id)

    monkeypatch.setattr(commit.Branch, "append", append_slowly)
    monkeypatch.setattr(commit, "run_started", lambda run_id: started(run_id) - (3600 if run_id in late else 0))
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.status == "committed" and planned[0] == 2_000, planned
    assert planned == [2_000, 1_000, 500] and result.rows_written == 500
    monkeypatch.undo()
    while run_table(spark, config, config.tables[0], state_dir).status == "committed":
        pass
    assert sorted(by_position(read_pyiceberg(state_dir, result.identifier))) == sorted(positions)


def test_max_bytes_per_run_caps_every_batch(spark, broker, registry, state_dir, topic, make_config):
    """`maxBytesPerRun`: what a batch may keep on the executors' disks (a batch read on the Python path, or read
    again for Python, is kept whole); however fast the table's batches are, none reads more."""
    spec, positions = small_backlog_table("json", broker, registry, topic, 2_000)  # records of ~10 bytes
    config = make_config({**spec, "maxBytesPerRun": 4_000})
    sizes = []
    while (result := run_table(spark, config, config.tables[0], state_dir)).status == "committed":
        sizes.append(result.rows_written)
    # the cap is on bytes as a sample of each batch's first records measures them: records of 8 to 11 bytes
    assert len(sizes) >= 2_000 * 8 // 4_000 and max(sizes) <= 4_000 // 8 and sum(sizes) == 2_000, sizes
    assert sorted(by_position(read_pyiceberg(state_dir, result.identifier))) == sorted(positions)
