"""Debezium change events (`envelope: debezium`) through the real broker and registry: mirror tables equal the
source table, whatever the encoding (Avro with referenced or self-contained schemas, JSON with or without the
JsonConverter's wrapper), and never regress (replays, truncates, deletes), read back with pyiceberg and DuckDB."""

from __future__ import annotations

import base64
import datetime as dt
import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.types import ListType, StructType

import icefloe.materialize.batch as batch_module
from icefloe.errors import RecordError
from icefloe.materialize.upsert import merge_batch
from icefloe.operate.runner import run_table
from support import as_utc, load_pyiceberg, produce, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
PLACEHOLDER = "__debezium_unavailable_value"


def value_record(topic: str) -> dict:
    return {
        "type": "record",
        "name": "Value",
        "namespace": topic,
        "connect.name": f"{topic}.Value",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "notes", "type": ["null", "string"], "default": None},
            {
                "name": "born",
                "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}],
                "default": None,
            },
        ],
    }


def source_record() -> dict:
    return {
        "type": "record",
        "name": "Source",
        "namespace": "io.debezium.connector.postgresql",
        "fields": [
            {"name": "connector", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "lsn", "type": ["null", "long"], "default": None},
            {"name": "sequence", "type": ["null", "string"], "default": None},
            {"name": "txId", "type": ["null", "long"], "default": None},
        ],
    }


def envelope(topic: str, value: object, source: object) -> dict:
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": topic,
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {
                "name": "after",
                "type": ["null", f"{topic}.Value" if value == f"{topic}.Value" else "Value"],
                "default": None,
            },
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }


class Events:
    """Debezium-shaped events of a PostgreSQL table `(id int primary key, name, notes, born date)`."""

    def __init__(self, topic: str, encoding: str, registry_url: str | None = None):
        self.topic, self.encoding, self.lsn = topic, encoding, 1000
        self.last_commit = 0
        if encoding.startswith("avro"):
            client = SchemaRegistryClient({"url": registry_url})
            value = value_record(topic)
            if encoding == "avro-referenced":  # as Apicurio's converter registers them: nested records as subjects
                # The versions these registrations got: the session's registry may hold a real connector's Source
                # under the same subject (tests/formats/test_cdc_postgres.py), so ours is not always version 1.
                source = "io.debezium.connector.postgresql.Source"
                refs = []
                for subject, record in ((f"{topic}.Value", value), (source, source_record())):
                    registered = Schema(json.dumps(record), "AVRO")
                    client.register_schema(subject, registered)
                    refs.append(SchemaReference(subject, subject, client.lookup_schema(subject, registered).version))
                schema = Schema(
                    json.dumps(envelope(topic, f"{topic}.Value", source)),
                    "AVRO",
                    refs,
                )
            else:
                schema = Schema(json.dumps(envelope(topic, value, source_record())), "AVRO")
            key_schema = {
                "type": "record",
                "name": "Key",
                "namespace": topic,
                "fields": [{"name": "id", "type": "int"}],
            }
            conf = {"auto.register.schemas": True}
            self.value = AvroSerializer(client, schema, conf=conf)
            self.key = AvroSerializer(client, json.dumps(key_schema), conf=conf)

    def source(self, lsn: int) -> dict:
        return {
            "connector": "postgresql",
            "ts_ms": 1_700_000_000_000 + lsn,
            "lsn": lsn,
            "sequence": json.dumps([str(self.last_commit), str(lsn)]),
            "txId": 7,
        }

    def encode_key(self, key: dict | None) -> bytes | None:
        if key is None:
            return None
        if self.encoding.startswith("avro"):
            return self.key(key, SerializationContext(self.topic, MessageField.KEY))
        if self.encoding == "json-schema":
            schema = {
                "type": "struct",
                "optional": False,
                "fields": [{"type": "int32", "optional": False, "field": "id"}],
            }
            return json.dumps({"schema": schema, "payload": key}).encode()
        return json.dumps(key).encode()

    def encode_value(self, value: dict | None) -> bytes | None:
        if value is None:
            return None
        if self.encoding.startswith("avro"):
            return self.value(value, SerializationContext(self.topic, MessageField.VALUE))
        if self.encoding == "json-schema":
            row = {
                "type": "struct",
                "optional": True,
                "fields": [
                    {"type": "int32", "optional": False, "field": "id"},
                    {"type": "string", "optional": True, "field": "name"},
                    {"type": "string", "optional": True, "field": "notes"},
                    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "born"},
                ],
            }
            schema = {
                "type": "struct",
                "name": f"{self.topic}.Envelope",
                "optional": False,
                "fields": [
                    {**row, "field": "before"},
                    {**row, "field": "after"},
                    {
                        "type": "struct",
                        "optional": False,
                        "field": "source",
                        "fields": [
                            {"type": "string", "optional": False, "field": "connector"},
                            {"type": "int64", "optional": False, "field": "ts_ms"},
                            {"type": "int64", "optional": True, "field": "lsn"},
                            {"type": "string", "optional": True, "field": "sequence"},
                            {"type": "int64", "optional": True, "field": "txId"},
                        ],
                    },
                    {"type": "string", "optional": False, "field": "op"},
                    {"type": "int64", "optional": True, "field": "ts_ms"},
                ],
            }
            return json.dumps({"schema": schema, "payload": value}).encode()
        return json.dumps(value).encode()

    def event(
        self, op: str, key: dict | None, before=None, after=None, lsn: int | None = None, headers=None, partition=0
    ) -> dict:
        if lsn is None:
            self.lsn += 10
            lsn = self.lsn
        value = {"before": before, "after": after, "source": self.source(lsn), "op": op, "ts_ms": 1_700_000_000_000}
        return {
            "key": self.encode_key(key),
            "value": self.encode_value(value),
            "headers": headers,
            "partition": partition,
        }

    def commit(self) -> None:
        self.last_commit = self.lsn

    def upsert(self, op: str, id: int, name, notes="n", born=19000, **kw) -> dict:
        return self.event(op, {"id": id}, after={"id": id, "name": name, "notes": notes, "born": born}, **kw)

    def delete(self, id: int, **kw) -> list[dict]:
        before = {"id": id, "name": None, "notes": None, "born": None}
        return [
            self.event("d", {"id": id}, before=before, **kw),
            {"key": self.encode_key({"id": id}), "value": None, "partition": kw.get("partition", 0)},
        ]


def state(rows: list[dict]) -> dict[int, tuple]:
    keyed: dict[int, tuple] = {}
    for row in rows:
        assert row["id"] not in keyed, f"two rows for id {row['id']}"
        keyed[row["id"]] = (row["name"], row["notes"], str(row["born"]))
    return keyed


ENCODINGS = ["avro-referenced", "avro-inline", "json-schema", "json-plain"]


def table_config(make_config, topic: str, encoding: str, **extra):
    return make_config(
        {
            "topic": topic,
            "format": "avro" if encoding.startswith("avro") else "json",
            "envelope": "debezium",
            "mode": "upsert",
            **extra,
        }
    )


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


def test_toast_placeholders_key_changes_and_truncates(spark, broker, registry, state_dir, topic, make_config):
    """An unchanged TOAST column keeps the row's value (within a batch and across batches); a primary-key change
    moves the row, the new key's `c` taking the placeholder's value from the old key's row (also when the old row
    was written by an earlier batch); a truncate empties the table and older events after it change nothing.
    Issue 30 for change data: the lookup of a moved row's values in the table is made once, before the merges (not
    again in each merge's plan), filtered by a Bloom filter of the batch's keys before it is shuffled, as the MERGE's
    own side is (not a join of every row of the table), and nothing of the batch stays cached after the merge (in a
    continuous run each such batch kept one more)."""
    from test_upsert import merge_plans, sql_executions

    broker.create_topic(topic, 3)
    events = Events(topic, "avro-inline", registry.url)
    config = table_config(make_config, topic, "avro-inline")

    def run(moved_rows: bool = False):
        before = max((execution.executionId() for execution in sql_executions(spark)), default=-1)
        result = run_table(spark, config, config.tables[0], state_dir)
        assert result.status == "committed" and result.records_failed == 0
        if moved_rows:
            merge = next(plan for name, plan in merge_plans(spark, before).items() if name.endswith(result.identifier))
            # The moved rows' values are looked up once, before the merges (their plans do not hold the lookup).
            lookups = [
                plan
                for plan in (e.physicalPlanDescription() for e in sql_executions(spark) if e.executionId() > before)
                if "WriteDelta" not in plan and table_scans(plan, result.identifier)
            ]
            assert len(lookups) == 1 and len(table_scans(merge, result.identifier)) == 1, (merge, lookups)
            for plan in (merge, *lookups):
                scans = table_scans(plan, result.identifier)
                assert all("might_contain" in filtered for filtered in scans.values()), f"joined whole:\n{plan}"
            assert spark._jsparkSession.sharedState().cacheManager().isEmpty(), "a frame of the batch is still cached"
        return state(read_pyiceberg(state_dir, result.identifier))

    def moved(old: int, new: int, name: str, partition_old: int, partition_new: int) -> list[dict]:
        """A primary-key change: `d` on the old key, its tombstone, `c` on the new key at the same lsn."""
        events.lsn += 10
        lsn = events.lsn
        header = [("__debezium.oldkey", json.dumps({"id": old}).encode())]
        return [
            *events.delete(old, lsn=lsn, partition=partition_old),
            events.upsert("c", new, name, notes=PLACEHOLDER, lsn=lsn, headers=header, partition=partition_new),
        ]

    produce(
        broker.bootstrap_servers,
        topic,
        [
            events.upsert("c", 1, "a", notes="long-1"),
            events.upsert("c", 2, "b", notes="long-2", partition=1),
            events.upsert("u", 1, "a2", notes=PLACEHOLDER),  # same batch: from the batch's earlier change
        ],
    )
    assert run() == {1: ("a2", "long-1", "2022-01-08"), 2: ("b", "long-2", "2022-01-08")}
    events.commit()
    produce(
        broker.bootstrap_servers,
        topic,
        [
            events.upsert("u", 2, "b2", notes=PLACEHOLDER, partition=1),  # across batches: from the table's row
            *moved(1, 10, "moved", 0, 2),  # the old row is in the table, the new key on another partition
            events.upsert("c", 3, "c", notes="long-3"),
            *moved(3, 30, "moved-3", 0, 1),  # the old row is in the same batch
            events.upsert("u", 30, "moved-3b", notes=PLACEHOLDER, partition=1),  # after the move, in the batch
        ],
    )
    assert run(moved_rows=True) == {
        2: ("b2", "long-2", "2022-01-08"),
        10: ("moved", "long-1", "2022-01-08"),
        30: ("moved-3b", "long-3", "2022-01-08"),
    }
    events.commit()
    before_truncate = events.upsert("u", 2, "before-truncate", partition=1)  # older than the truncate, read after it
    inserted = events.upsert("c", 4, "d")
    truncate = events.event("t", None, partition=2)
    produce(broker.bootstrap_servers, topic, [inserted, truncate])
    assert run() == {}
    events.commit()
    produce(broker.bootstrap_servers, topic, [before_truncate, events.upsert("c", 5, "after-truncate")])
    assert run() == {5: ("after-truncate", "n", "2022-01-08")}


def table_scans(plan: str, identifier: str) -> dict[str, str]:
    """Of a formatted physical plan, the scans of table `identifier` (not of its markers) by node id, each with the
    condition of the filter above it ("" where none is): the tree's lines name a node and its id, whose details
    follow the tree."""
    lines = plan.splitlines()
    found = {}
    for at, line in enumerate(lines):
        node = line.lstrip(" :+-*").split()
        if node[:1] != ["BatchScan"] or not node[1].endswith(f".{identifier}"):
            continue
        above = at - 1  # up through the projections to the filter, if any
        while lines[above].lstrip(" :+-*").split()[0] in ("Project", "ColumnarToRow"):
            above -= 1
        parent = lines[above].lstrip(" :+-*").split()
        details = ""
        if parent[0] == "Filter":
            heading = f"{parent[1]} Filter"
            described = next(i for i, text in enumerate(lines) if text.startswith(heading))
            details = next(text for text in lines[described:] if text.startswith("Condition"))
        found[node[-1]] = details
    return found


def one_batch_or_two(spark, broker, registry, state_dir, topic, make_config, scenario, **extra) -> list[dict]:
    """The table `scenario(events)` leaves (a first batch, then a second one given as two parts) read in those two
    batches, and the same with the second batch split in two: the rows of both, which must be equal."""
    tables = []
    for split in (False, True):
        name = f"{topic}_split" if split else topic
        broker.create_topic(name, 1)
        events = Events(name, "avro-inline", registry.url)
        config = table_config(make_config, name, "avro-inline", **extra)
        first, *second = scenario(events)
        for records in [first, *(second if split else [[r for part in second for r in part]])]:
            produce(broker.bootstrap_servers, name, records)
            result = run_table(spark, config, config.tables[0], state_dir)
            assert result.status == "committed" and result.records_failed == 0
        rows = read_pyiceberg(state_dir, result.identifier)
        tables.append({r["id"]: {k: v for k, v in r.items() if not k.startswith("kafka_")} for r in rows})
    assert tables[0] == tables[1]
    return list(tables[0].values())


def test_a_truncate_leaves_no_value_for_a_later_unchanged_column(
    spark, broker, registry, state_dir, topic, make_config
):
    """An unchanged TOAST column of a change after a truncate has no earlier value (null): the truncate took the
    key's row, whether it came in the same batch or an earlier one (also for a row moved from a truncated key)."""

    def scenario(events: Events) -> list[list[dict]]:
        first = [events.upsert("c", 1, "a", notes="long-1"), events.upsert("c", 2, "b", notes="long-2")]
        events.commit()
        truncate = [events.event("t", None)]
        events.lsn += 10
        header = [("__debezium.oldkey", json.dumps({"id": 2}).encode())]
        after = [
            events.upsert("u", 1, "a2", notes=PLACEHOLDER),
            *events.delete(2, lsn=events.lsn),
            events.upsert("c", 20, "moved", notes=PLACEHOLDER, lsn=events.lsn, headers=header),
        ]
        return [first, truncate, after]

    rows = one_batch_or_two(spark, broker, registry, state_dir, topic, make_config, scenario)
    assert state(rows) == {1: ("a2", None, "2022-01-08"), 20: ("moved", None, "2022-01-08")}


def test_a_soft_delete_keeps_the_values_of_the_change_before_it(spark, broker, registry, state_dir, topic, make_config):
    """A soft-deleted row keeps the values the key had before the delete: those of an update in the same batch
    too, as when the update came in an earlier batch."""

    def scenario(events: Events) -> list[list[dict]]:
        first = [events.upsert("c", 1, "a", notes="long-1"), events.upsert("c", 2, "b", notes="long-2")]
        events.commit()
        return [first, [events.upsert("u", 1, "a2", notes=PLACEHOLDER)], events.delete(1)]

    rows = one_batch_or_two(spark, broker, registry, state_dir, topic, make_config, scenario, deletes="soft")
    assert {r["id"]: (r["name"], r["notes"], r["cdc_deleted"]) for r in rows} == {
        1: ("a2", "long-1", True),
        2: ("b", "long-2", False),
    }


def test_the_error_modes_pass_finds_the_change_facts_of_the_good_changes(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    """What an envelope's batch holds that decides its merge (`upsert.ChangeFacts`) comes from the error mode's
    pass over the batch (no job of its own), counting the good changes only: not a bad record (its placeholder),
    nor a delete's tombstone."""
    broker.create_topic(topic, 2)
    events = Events(topic, "avro-inline", registry.url)
    config = table_config(make_config, topic, "avro-inline", errors="skip")
    given = []

    def merge_recording(*args, **kwargs):
        given.append(kwargs.get("facts", args[6] if len(args) > 6 else None))
        return merge_batch(*args, **kwargs)

    monkeypatch.setattr(batch_module, "merge_batch", merge_recording)
    produce(broker.bootstrap_servers, topic, [events.upsert("c", 1, "a", notes="long-1"), events.upsert("c", 2, "b")])
    run_table(spark, config, config.tables[0], state_dir)
    bad = events.event("u", {"id": 3}, after={"id": 4, "name": "z", "notes": PLACEHOLDER, "born": 19000})
    produce(
        broker.bootstrap_servers,
        topic,
        [events.upsert("u", 1, "a2", notes=PLACEHOLDER, partition=1), bad, *events.delete(2)],
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.records_failed == 1
    found = [None if f is None else (f.truncates, f.deletes, f.unchanged, f.moved) for f in given]
    assert found == [(0, 0, (), False), (0, 1, ("notes",), False)]
    assert state(read_pyiceberg(state_dir, result.identifier)) == {1: ("a2", "long-1", "2022-01-08")}


def test_order_never_regresses_across_partitions(spark, broker, registry, state_dir, topic, make_config):
    """A key's changes on two partitions, read in batches where the newer arrives first: the source position
    decides, so the older change (a late partition, a replay) neither overwrites nor resurrects the row."""
    broker.create_topic(topic, 2)
    events = Events(topic, "json-schema")
    config = table_config(make_config, topic, "json-schema")
    old = events.upsert("u", 1, "old", partition=1)
    old_2 = events.upsert("c", 2, "old-2", partition=1)
    events.commit()
    produce(
        broker.bootstrap_servers, topic, [events.upsert("u", 1, "new", partition=0), *events.delete(2, partition=0)]
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    assert state(read_pyiceberg(state_dir, result.identifier)) == {1: ("new", "n", "2022-01-08")}
    produce(broker.bootstrap_servers, topic, [old, old_2])  # older positions, read later
    result = run_table(spark, config, config.tables[0], state_dir)
    assert state(read_pyiceberg(state_dir, result.identifier)) == {1: ("new", "n", "2022-01-08")}


@pytest.mark.parametrize("errors", ["skip", "fail"])
def test_bad_events_are_bad_records_named_by_partition_and_offset(
    spark, broker, registry, state_dir, topic, make_config, errors
):
    """No op, an unknown op, a key that does not match the row, an `after` that does not fit the table's columns."""
    broker.create_topic(topic, 1)
    events = Events(topic, "json-plain")
    config = table_config(make_config, topic, "json-plain", errors=errors)
    produce(broker.bootstrap_servers, topic, [events.upsert("c", 1, "a")])
    assert run_table(spark, config, config.tables[0], state_dir).status == "committed"  # the columns: born is int

    def change(key: int, **value) -> dict:
        return {"key": json.dumps({"id": key}).encode(), "value": json.dumps({"before": None, **value}).encode()}

    bad = [
        change(2, after={"id": 2}, source={}),
        change(2, after={"id": 2}, op="x"),
        change(3, after={"id": 2, "name": "z"}, op="c"),
        change(2, after={"id": 2, "born": {"x": 1}}, op="c"),
    ]
    positions = produce(broker.bootstrap_servers, topic, [*bad, events.upsert("c", 4, "d")])
    if errors == "fail":
        with pytest.raises(RecordError) as caught:
            run_table(spark, config, config.tables[0], state_dir)
        assert (caught.value.partition, caught.value.offset, caught.value.kind) == (*positions[0], "InvalidChange")
        assert "without op" in caught.value.cause
        return
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.records_failed == 4
    assert state(read_pyiceberg(state_dir, result.identifier)) == {1: ("a", "n", "19000"), 4: ("d", "n", "19000")}


def test_changelog_keeps_every_event(spark, broker, registry, state_dir, topic, make_config):
    """`mode: append`: one row per event with op, source position and time, the after columns, before as a struct."""
    broker.create_topic(topic, 1)
    events = Events(topic, "avro-referenced", registry.url)
    records = [
        events.upsert("c", 1, "a"),
        events.event(
            "u",
            {"id": 1},
            before={"id": 1, "name": "a", "notes": "n", "born": 1},
            after={"id": 1, "name": "b", "notes": PLACEHOLDER, "born": 1},
        ),
        *events.delete(1),
        events.event("t", None),
    ]
    produce(broker.bootstrap_servers, topic, records)
    config = make_config({"topic": topic, "format": "avro", "envelope": "debezium", "mode": "append"})
    result = run_table(spark, config, config.tables[0], state_dir)
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        rows = sorted(rows, key=lambda r: r["kafka_offset"])
        assert [r["cdc_op"] for r in rows] == ["c", "u", "d", None, "t"]  # the tombstone: a row, as append keeps it
        assert [(r["id"], r["name"], r["notes"]) for r in rows] == [
            (1, "a", "n"),
            (1, "b", None),
            (None, None, None),
            (None, None, None),
            (None, None, None),
        ]
        assert rows[1]["cdc_unavailable"] == ["notes"]
        assert rows[1]["cdc_before"]["name"] == "a" and rows[2]["cdc_before"]["id"] == 1
        assert [bytes(r["cdc_position"]) for r in rows if r["cdc_op"]] == sorted(
            bytes(r["cdc_position"]) for r in rows if r["cdc_op"]
        )
        assert rows[0]["cdc_ts"] is not None


def test_soft_deletes_keep_the_row_flagged(spark, broker, registry, state_dir, topic, make_config):
    broker.create_topic(topic, 1)
    events = Events(topic, "json-schema")
    config = table_config(make_config, topic, "json-schema", deletes="soft")
    produce(
        broker.bootstrap_servers, topic, [events.upsert("c", 1, "a"), events.upsert("c", 2, "b"), *events.delete(1)]
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    rows = {r["id"]: r for r in read_pyiceberg(state_dir, result.identifier)}
    assert (rows[1]["name"], rows[1]["cdc_deleted"], rows[2]["cdc_deleted"]) == ("a", True, False)
    assert rows[1]["cdc_deleted_at"] is not None and rows[2]["cdc_deleted_at"] is None
    produce(broker.bootstrap_servers, topic, [events.upsert("c", 1, "again")])  # re-inserted: no longer deleted
    result = run_table(spark, config, config.tables[0], state_dir)
    rows = {r["id"]: r for r in read_pyiceberg(state_dir, result.identifier)}
    assert (rows[1]["name"], rows[1]["cdc_deleted"]) == ("again", False)


@pytest.mark.parametrize("encoding", ["json-plain", "json-schema"])
def test_truncate_alone_in_a_json_batch_takes_effect_in_order(
    spark, broker, registry, state_dir, topic, make_config, encoding
):
    """A JSON batch holding only a truncate knows no key columns (a `t` has no key): first when the table has none
    yet, then when the table has them. Either way the truncate removes the rows older than it, keeps the newer ones,
    and keeps older events read in later batches (a late partition, a connector's replay) out."""
    broker.create_topic(topic, 2)
    events = Events(topic, encoding)
    config = table_config(make_config, topic, encoding)

    def run(records: list[dict]) -> dict:
        produce(broker.bootstrap_servers, topic, records)
        result = run_table(spark, config, config.tables[0], state_dir)
        assert result.status == "committed" and result.records_failed == 0
        return {k: v[0] for k, v in state(read_pyiceberg(state_dir, result.identifier)).items()}

    early = events.upsert("c", 1, "early", partition=1)  # older than the truncate, read after it
    truncate = events.event("t", None, partition=1)
    events.commit()
    later, newer = events.upsert("c", 2, "later"), events.upsert("c", 3, "newer")
    old = events.upsert("u", 2, "old", partition=1)  # older than the second truncate, read after it
    truncate_2 = events.event("t", None, partition=1)
    events.commit()
    assert run([truncate]) == {}  # the table's first batch: no columns, no key known yet
    assert run([early, later, newer]) == {2: "later", 3: "newer"}
    newest = events.upsert("c", 4, "newest")  # after the second truncate, read before it
    assert run([newest]) == {2: "later", 3: "newer", 4: "newest"}
    assert run([truncate_2]) == {4: "newest"}  # the table knows its key, the batch does not
    assert run([old]) == {4: "newest"}


ISO_COLUMNS = {  # a PostgreSQL table's temporal columns in time.precision.mode=isostring: their Connect names
    "d": "io.debezium.time.IsoDate",  # date
    "t": "io.debezium.time.IsoTime",  # time
    "ts": "io.debezium.time.IsoTimestamp",  # timestamp
    "tz": "io.debezium.time.ZonedTimestamp",  # timestamptz
    "ttz": "io.debezium.time.ZonedTime",  # timetz
}


def isostring_events(topic: str, encoding: str, registry_url: str, rows: list[dict]) -> list[dict]:
    """`c` events of `rows` as Debezium's PostgreSQL connector writes them with time.precision.mode=isostring."""
    source = {"connector": "postgresql", "ts_ms": 1_700_000_000_000, "sequence": None, "txId": 7}
    values = [
        {"before": None, "after": row, "source": {**source, "lsn": 100 + i}, "op": "c", "ts_ms": 1}
        for i, row in enumerate(rows)
    ]
    keys = [{"id": row["id"]} for row in rows]
    if encoding == "avro-inline":
        client = SchemaRegistryClient({"url": registry_url})
        text = [
            {"name": name, "type": ["null", {"type": "string", "connect.version": 1, "connect.name": semantic}]}
            for name, semantic in ISO_COLUMNS.items()
        ]
        row = {"type": "record", "name": "Value", "namespace": topic, "fields": [{"name": "id", "type": "int"}, *text]}
        value = AvroSerializer(client, json.dumps(envelope(topic, row, source_record())))
        key_record = {"type": "record", "name": "Key", "namespace": topic, "fields": [{"name": "id", "type": "int"}]}
        key = AvroSerializer(client, json.dumps(key_record))
        return [
            {
                "key": key(k, SerializationContext(topic, MessageField.KEY)),
                "value": value(v, SerializationContext(topic, MessageField.VALUE)),
            }
            for k, v in zip(keys, values, strict=True)
        ]
    fields = [
        {"type": "string", "optional": True, "name": semantic, "version": 1, "field": name}
        for name, semantic in ISO_COLUMNS.items()
    ]
    row_schema = {"type": "struct", "optional": True, "fields": [{"type": "int32", "field": "id"}, *fields]}
    source_fields = [
        {"type": "string", "field": "connector"},
        {"type": "int64", "field": "ts_ms"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "int64", "optional": True, "field": "txId"},
    ]
    schema = {
        "type": "struct",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "field": "source", "fields": source_fields},
            {"type": "string", "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }
    key_schema = {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}
    return [
        {
            "key": json.dumps({"schema": key_schema, "payload": k}).encode(),
            "value": json.dumps({"schema": schema, "payload": v}).encode(),
        }
        for k, v in zip(keys, values, strict=True)
    ]


@pytest.mark.parametrize("encoding", ["avro-inline", "json-schema"])
def test_isostring_temporals_are_the_database_values(spark, broker, registry, state_dir, topic, make_config, encoding):
    """`time.precision.mode=isostring`: temporals arrive as ISO-8601 text at UTC (the values below are those
    Debezium's own PostgreSQL tests expect). The columns get the database's types and values, not the text: date,
    time (microseconds of the day, as for the other modes), timestamp, timestamptz; timetz stays text. An infinite
    timestamp (written as a year past 9999, or 'infinity' for timestamptz) fits no column: a bad record."""
    broker.create_topic(topic, 1)
    first = {
        "id": 1,
        "d": "2017-09-15Z",
        "t": "04:05:11.789Z",
        "ts": "2019-07-09T02:28:57.123456Z",
        "tz": "2019-07-09T01:28:10.123456Z",
        "ttz": "12:05:11Z",
    }
    second = {"id": 2, "d": "1900-01-01Z", "t": "00:00:00Z", "ts": "1969-12-31T23:59:59.5Z", "tz": None, "ttz": None}
    infinite = [
        {**first, "id": 3, "ts": "+294247-01-10T04:00:25.2Z"},  # timestamp 'infinity'
        {**first, "id": 4, "tz": "infinity"},
    ]
    produce(
        broker.bootstrap_servers, topic, isostring_events(topic, encoding, registry.url, [first, second, *infinite])
    )
    config = table_config(make_config, topic, encoding, errors="skip")
    result = run_table(spark, config, config.tables[0], state_dir)
    kinds = {f.name: str(f.field_type) for f in load_pyiceberg(state_dir, result.identifier).schema().fields}
    assert {c: kinds[c] for c in ISO_COLUMNS} == {
        "d": "date",
        "t": "long",
        "ts": "timestamp",
        "tz": "timestamptz",
        "ttz": "string",
    }
    assert result.status == "committed" and result.records_failed == 2
    utc = dt.UTC
    expected = {
        1: (
            dt.date(2017, 9, 15),
            4 * 3_600_000_000 + 5 * 60_000_000 + 11_789_000,
            dt.datetime(2019, 7, 9, 2, 28, 57, 123456),
            dt.datetime(2019, 7, 9, 1, 28, 10, 123456, tzinfo=utc),
            "12:05:11Z",
        ),
        2: (dt.date(1900, 1, 1), 0, dt.datetime(1969, 12, 31, 23, 59, 59, 500000), None, None),
    }
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        assert {r["id"]: tuple(as_utc(r[c]) for c in ISO_COLUMNS) for r in rows} == expected


def test_schemaless_json_columns_are_typed_by_inference(spark, broker, state_dir, topic, make_config):
    """The JsonConverter without schemas carries no semantic types: each column is what its JSON values infer to
    (docs/change-data.md, "JSON without schemas"), values as the converter wrote them. An unchanged TOASTed `bytea`
    (its placeholder's bytes, as base64 text) keeps the row's value."""
    broker.create_topic(topic, 1)
    placeholder_b64 = base64.b64encode(PLACEHOLDER.encode()).decode()
    after = {
        "id": 1,
        "born": 19000,
        "seen_at": 1_700_000_000_123_456,
        "zoned": "2024-02-29T12:00:00.5Z",
        "price": "MBE=",
        "price_numeric": 123.05,
        "amount": {"scale": 3, "value": "MDk="},
        "blob": "AAE=",
        "tags": ["x"],
        "doc": '{"a": 1}',
        "shape": {"wkb": "AQEAAAAAAAAAAADwPwAAAAAAAABA", "srid": None},
    }
    source = {"connector": "postgresql", "lsn": 10, "ts_ms": 1}
    changes = [("c", after), ("u", {**after, "born": 19001, "blob": placeholder_b64})]
    produce(
        broker.bootstrap_servers,
        topic,
        [
            {
                "key": json.dumps({"id": 1}).encode(),
                "value": json.dumps(
                    {"before": None, "after": image, "op": op, "source": {**source, "lsn": 10 * (i + 1)}}
                ).encode(),
            }
            for i, (op, image) in enumerate(changes)
        ],
    )
    config = table_config(make_config, topic, "json-plain")
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.status == "committed" and result.records_failed == 0
    schema = load_pyiceberg(state_dir, result.identifier).schema()

    def kind(of) -> str:
        if isinstance(of, StructType):
            return "struct<" + ", ".join(f"{f.name}: {kind(f.field_type)}" for f in of.fields) + ">"
        return f"list<{kind(of.element_type)}>" if isinstance(of, ListType) else str(of)

    kinds = {f.name: kind(f.field_type) for f in schema.fields if not f.name.startswith(("kafka_", "cdc_"))}
    assert kinds == {
        "id": "int",
        "born": "int",
        "seen_at": "long",
        "zoned": "string",
        "price": "string",
        "price_numeric": "double",
        "amount": "struct<scale: int, value: string>",
        "blob": "string",
        "tags": "list<string>",
        "doc": "string",
        "shape": "struct<wkb: string>",
    }, kinds
    [row] = read_pyiceberg(state_dir, result.identifier)
    assert {k: row[k] for k in after if k != "shape"} == {
        **{k: v for k, v in after.items() if k != "shape"},
        "born": 19001,
    }
    assert row["shape"] == {"wkb": after["shape"]["wkb"]}  # a key only ever null has no column yet
