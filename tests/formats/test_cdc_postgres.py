"""Change data end to end: PostgreSQL -> Debezium (Kafka Connect standalone) -> the broker -> icefloe -> Iceberg.

One module-scoped run makes the topics: a private database on the session's PostgreSQL, one Connect worker (one JVM
for the module) with four Debezium connectors on the same `customers` table, one per converter (Apicurio's Avro with
referenced and with dereferenced schemas, the JsonConverter with and without schemas), a seeded random workload
(icefloe_dev.cdc_workload) over an initial snapshot, the connectors restarted cleanly once (their offsets
committed), then the worker SIGKILLed and restarted: it replays every change since the clean restart (the truncate
included) with their original positions, so every topic holds duplicates. Then:
- platform checks (cheap, no icefloe): each topic holds what ../shared/PLATFORM.md describes;
- the mirror table (`envelope: debezium, mode: upsert`) per converter, read by pyiceberg and DuckDB, equals
  `SELECT * FROM customers` row for row, with the database's types;
- the changelog (`mode: append`): one row per change event.
Select them with `-m cdc`. ICEFLOE_CDC_SEED replays a workload (the seed is in every failure).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import pytest

from icefloe import cli
from icefloe.operate.runner import run_table
from icefloe_dev import cdc_demo
from icefloe_dev.cdc_workload import (
    DDL,
    MARKER_TABLE,
    PLACEHOLDER,
    TABLE,
    Event,
    Workload,
    mark,
    mirror_differences,
    read_events,
    typed_rows,
    wait_for_marker,
)
from icefloe_dev.kafka_connect import CONVERTERS, KafkaConnect, debezium_postgres
from support import read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.cdc, pytest.mark.broker]
log = logging.getLogger(__name__)
SEED = int(os.environ.get("ICEFLOE_CDC_SEED", "29"))
PARTITIONS = 3
TABLE_FORMAT = {"avro": "avro", "avro-dereferenced": "avro", "json": "json", "json-schemaless": "json"}


@dataclass
class CdcRun:
    seed: int
    database: str
    topics: dict[str, str]  # converter -> customers topic
    events: dict[str, list[Event]]  # converter -> every message of its topic
    expected: list[dict[str, Any]]  # SELECT * FROM customers, typed
    counts: dict[str, int]  # what the workload did


def connector_name(converter: str) -> str:
    return f"cdc_{converter.replace('-', '_')}"


@pytest.fixture(scope="module", autouse=True)
def no_compatibility_rule(registry):
    """The session's registry already holds Debezium-shaped schemas that tests/formats/test_cdc_envelope.py registered
    under Debezium's own record names (`io.debezium.connector.postgresql.Source`): the connectors' real ones are
    not BACKWARD compatible with them, and Apicurio's converter would be refused (`RuleViolation`), as it was when
    both modules ran on one worker. This module's connectors register under NONE."""
    registry.set_compatibility("NONE")
    yield
    registry.set_compatibility(registry.compatibility)


@pytest.fixture(scope="module")
def cdc(postgres, broker, registry, state_dir) -> CdcRun:
    database = postgres.create_database("cdc_e2e")
    workload = Workload(SEED)
    postgres.sql(DDL + workload.initial_rows(60), database=database)
    captured = [f"public.{TABLE}", f"public.{MARKER_TABLE}"]
    connectors = [
        debezium_postgres(connector_name(c), postgres, captured, c, registry.url, PARTITIONS, database=database)
        for c in CONVERTERS
    ]
    markers = {f"{connector_name(c)}.public.{MARKER_TABLE}": c for c in CONVERTERS}
    topics = {c: f"{connector_name(c)}.public.{TABLE}" for c in CONVERTERS}
    for topic in topics.values():  # made up front: Connect would create them at the first event, and wait
        broker.create_topic(topic, PARTITIONS)
    for topic in markers:
        broker.create_topic(topic, 1)
    started = time.monotonic()

    def took(what: str) -> None:  # the phases' times, shown with --log-cli-level=INFO
        log.info("cdc fixture: %s at %.1fs", what, time.monotonic() - started)

    def step(marker: int, sql: str) -> None:
        postgres.sql(sql, database=database)
        mark(postgres, marker, database)
        wait_for_marker(broker.bootstrap_servers, markers, marker, registry.url)
        took(f"step {marker} sent")

    # Offsets are flushed only by the clean connector restart below (the 10 min interval outlasts the run): the
    # SIGKILL then deterministically re-emits everything since that restart.
    worker = KafkaConnect(state_dir / "connect-cdc", broker.bootstrap_servers, connectors, offset_flush_ms=600_000)
    try:
        worker.start()
        worker.wait_streaming()  # the snapshot (`r`) is over
        took("snapshot")
        step(1, workload.changes(80))
        worker.restart_cleanly()  # offsets committed here
        took("clean restart")
        step(2, workload.changes(80, truncate_after=50))  # replayed after the kill, truncate included
        worker.kill()
        postgres.sql(workload.changes(40), database=database)  # while the connectors are down
        worker.start()
        worker.wait_streaming()
        took("restart after SIGKILL")
        step(3, workload.changes(60))
        # A clean stop, as in test_cdc_mariadb: the last marker's arrival does not prove the producer sent every
        # earlier record of the other topics (a retried request), and a SIGKILL now could lose the workload's tail.
        worker.stop(120.0)
    finally:
        worker.kill()
    events = {c: read_events(broker.bootstrap_servers, topics[c], c, registry.url) for c in CONVERTERS}
    expected = typed_rows(postgres.rows(f"SELECT * FROM {TABLE}", database=database))
    took("topics read")
    return CdcRun(SEED, database, topics, events, expected, dict(workload.counts))


# -- (a) the platform: what Debezium wrote, as PLATFORM.md says (no icefloe involved)
@pytest.mark.parametrize("converter", CONVERTERS)
def test_the_topics_hold_debeziums_envelope_with_duplicates_after_the_kill(cdc, converter):
    events = cdc.events[converter]
    ops = Counter(e.op for e in events)
    assert {"r", "c", "u", "d", "t"} <= set(ops), (cdc.seed, ops)
    assert ops["t"] >= 1 and all(e.key is None for e in events if e.op == "t"), "a truncate has no key"
    # every delete is followed by its tombstone in its partition
    by_partition: dict[int, list[Event]] = {}
    for event in events:
        by_partition.setdefault(event.partition, []).append(event)
    for series in by_partition.values():
        for event, after in zip(series, series[1:]):
            if event.op == "d":
                assert after.value is None and after.key == event.key, (cdc.seed, event.partition, event.offset)
    # an update that left notes alone carries the placeholder, not the value
    assert any(e.op == "u" and e.value["after"]["notes"] == PLACEHOLDER for e in events), cdc.seed
    # a key change: `d` on the old key naming the new one, `c` on the new key naming the old one, one lsn
    moved_from = {e.lsn: e for e in events if e.op == "c" and "__debezium.oldkey" in e.headers}
    moved_to = [e for e in events if e.op == "d" and "__debezium.newkey" in e.headers]
    assert moved_to and all(e.lsn in moved_from for e in moved_to), cdc.seed
    for removed in moved_to:
        added = moved_from[removed.lsn]
        assert json.loads(added.headers["__debezium.oldkey"]) == removed.key, cdc.seed
        assert json.loads(removed.headers["__debezium.newkey"]) == added.key, cdc.seed
    # the SIGKILL: events re-emitted with their positions (streamed and snapshot alike)
    seen = Counter((e.op, e.lsn, json.dumps(e.key, sort_keys=True)) for e in events if e.value is not None)
    assert any(n > 1 and op in ("c", "u", "d") for (op, _, _), n in seen.items()), f"no replayed change ({cdc.seed})"
    assert ops["t"] == 2, f"the truncate, and its replay ({cdc.seed})"


# -- (b) icefloe: the mirror table equals the source table
@pytest.mark.spark
@pytest.mark.parametrize("converter", CONVERTERS)
def test_the_mirror_table_equals_the_source_table(cdc, converter, spark, make_config, state_dir):
    config = make_config(
        {
            "topic": cdc.topics[converter],
            "table": f"mirror_{converter.replace('-', '_')}",
            "format": TABLE_FORMAT[converter],
            "envelope": "debezium",
            "mode": "upsert",
            "errors": "fail",
        }
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.status == "committed", result.describe()
    for reader, rows in (
        ("pyiceberg", read_pyiceberg(state_dir, result.identifier)),
        ("duckdb", read_duckdb(result.metadata_location)),
    ):
        problems = mirror_differences(cdc.expected, rows, converter)
        assert not problems, f"{reader}, seed {cdc.seed}, {len(problems)} differences:\n" + "\n".join(problems[:40])
        assert len(rows) == len(cdc.expected)
    again = run_table(spark, config, config.tables[0], state_dir)
    assert again.status != "committed" or again.rows_written == 0, again.describe()


@pytest.mark.spark
def test_the_changelog_keeps_one_row_per_change_event(cdc, spark, make_config, state_dir):
    """`mode: append`: one row per message, replays included (tombstones too: a row whose `cdc_op` is null), each
    with its event's op and images."""
    config = make_config(
        {
            "topic": cdc.topics["avro"],
            "table": "changelog_avro",
            "format": "avro",
            "envelope": "debezium",
            "mode": "append",
            "errors": "fail",
        }
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.status == "committed", result.describe()
    rows = read_pyiceberg(state_dir, result.identifier)
    events = {(e.partition, e.offset): e for e in cdc.events["avro"]}
    assert sorted((r["kafka_partition"], r["kafka_offset"]) for r in rows) == sorted(events), cdc.seed
    assert Counter(r["cdc_op"] for r in rows) == Counter(e.op for e in events.values()), cdc.seed
    for row in rows:
        event = events[(row["kafka_partition"], row["kafka_offset"])]
        where = (cdc.seed, row["kafka_partition"], row["kafka_offset"], event.op)
        if event.op in ("c", "r", "u"):
            assert (row["id"], row["name"]) == (event.value["after"]["id"], event.value["after"]["name"]), where
        if event.op == "d":  # the deleted key, in the `before` image (the default replica identity: key only)
            assert row["id"] is None and row["cdc_before"]["id"] == event.key["id"], where
        if event.op is None or event.op == "t":
            assert row["id"] is None, where


# -- `icefloe demo --cdc`
@pytest.mark.spark
def test_the_cdc_demo_prints_a_mirror_equal_to_its_database(
    postgres, broker, registry, spark, tmp_path, monkeypatch, capsys
):
    """`icefloe demo --cdc --json` as a user runs it, on the session's broker, registry, PostgreSQL and Spark (the
    demo's own Kafka Connect worker): every kind of change made, the mirror equal to the database, both printed."""

    @contextmanager
    def running(demo_state):
        yield broker, registry

    monkeypatch.setattr(cdc_demo, "local_services", running)
    monkeypatch.setattr(cdc_demo, "local_postgres", lambda demo_state: nullcontext(postgres))
    monkeypatch.setattr(cdc_demo, "local_spark", lambda catalog, demo_state: nullcontext(spark))
    code = cli.main(["demo", "--cdc", "--json", "--state-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert out.out.strip(), f"exit {code}, no summary:\n{out.err[-4000:]}"
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert code == 0 and summary["equal"], out.err[-4000:]
    assert summary["table_rows"] == summary["source_rows"] > 0 and summary["differences"] == 0
    assert {"insert", "update leaving notes", "delete", "key change"} <= set(summary["changes"]), summary["changes"]
    assert "PostgreSQL: SELECT * FROM customers" in out.err and f"Iceberg: {summary['table']}" in out.err
    assert "the mirror equals the source: yes" in out.err
