"""Change data end to end from MariaDB: MariaDB -> Debezium's MariaDB connector (Kafka Connect standalone) -> the
broker -> icefloe -> Iceberg, with the binlog file, position and row as the order.

One module-scoped platform: a private MariaDB server (Debian's, binlog in ROW format), one Connect worker with one
connector (the JsonConverter with schemas), a seeded random workload of inserts, updates, deletes, primary-key changes
and multi-statement transactions over an initial snapshot, a truncate, the worker restarted cleanly (offsets
committed), then SIGKILLed and restarted: it replays every change since the clean restart (the truncate included)
with their original binlog positions. Then one mirror table, read by pyiceberg and DuckDB, equals
`SELECT * FROM customers` row for row. Select it with `-m cdc`; ICEFLOE_CDC_SEED replays a workload.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from collections import Counter
from decimal import Decimal

import pytest

from icefloe.operate.runner import run_table
from icefloe_dev.cdc_workload import read_events, wait_for_marker
from icefloe_dev.kafka_connect import KafkaConnect, debezium_mariadb
from icefloe_dev.mariadb import MariaDBServer
from support import read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.cdc, pytest.mark.broker]
SEED = int(os.environ.get("ICEFLOE_CDC_SEED", "29"))
DATABASE, TABLE, MARKERS, CONNECTOR = "shop", "customers", "cdc_marker", "cdc_mariadb"
COLUMNS = ["id", "name", "notes", "balance", "born", "seen"]
DDL = f"""
CREATE DATABASE {DATABASE};
USE {DATABASE};
CREATE TABLE {TABLE} (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL, notes TEXT, balance DECIMAL(12, 2),
                      born DATE, seen DATETIME(6));
CREATE TABLE {MARKERS} (id INT PRIMARY KEY);
"""


class Workload:
    """Seeded SQL over the keys that exist: every statement touches a real row or makes a new one."""

    def __init__(self, seed: int):
        self.rng, self.keys, self.next_id = random.Random(seed), set(), 1
        self.counts: Counter = Counter()

    def values(self, key: int) -> str:
        rng = self.rng
        notes = "NULL" if rng.random() < 0.2 else f"'n{rng.randrange(10**6)}'"
        born = f"'{dt.date(1950, 1, 1) + dt.timedelta(days=rng.randrange(25_000))}'"
        seen = (
            f"'2024-0{rng.randrange(1, 10)}-1{rng.randrange(10)} 1{rng.randrange(10)}:00:00.{rng.randrange(10**6):06d}'"
        )
        return f"({key}, 'name-{rng.randrange(1000)}', {notes}, {rng.randrange(-(10**6), 10**6) / 100:.2f}, {born}, {seen})"

    def insert(self) -> str:
        key, self.next_id = self.next_id, self.next_id + 1
        self.keys.add(key)
        self.counts["insert"] += 1
        return f"INSERT INTO {TABLE} VALUES {self.values(key)};"

    def statement(self, single: bool = False) -> str:
        choice = self.rng.random() * (0.9 if single else 1.0)
        if not self.keys or choice < 0.3:
            return self.insert()
        key = self.rng.choice(sorted(self.keys))
        if choice < 0.65:
            self.counts["update"] += 1
            return (
                f"UPDATE {TABLE} SET name = 'upd-{self.rng.randrange(1000)}', balance = balance + 1 WHERE id = {key};"
            )
        if choice < 0.8:
            self.keys.discard(key)
            self.counts["delete"] += 1
            return f"DELETE FROM {TABLE} WHERE id = {key};"
        if choice < 0.9:  # a primary-key change: Debezium's delete of the old key and create of the new
            new, self.next_id = self.next_id, self.next_id + 1
            self.keys.discard(key)
            self.keys.add(new)
            self.counts["key change"] += 1
            return f"UPDATE {TABLE} SET id = {new} WHERE id = {key};"
        self.counts["transaction"] += 1  # several statements on one key and others, one commit
        inner = " ".join(self.statement(single=True) for _ in range(3))
        return f"START TRANSACTION; {inner} COMMIT;"

    def changes(self, n: int, truncate_after: int | None = None) -> str:
        out = []
        for i in range(n):
            if i == truncate_after:
                self.keys.clear()
                self.counts["truncate"] += 1
                out.append(f"TRUNCATE TABLE {TABLE};")
            out.append(self.statement())
        return "\n".join(out)


@pytest.fixture(scope="module")
def mariadb_cdc(broker, state_dir):
    return run_workload(broker, state_dir)


def run_workload(broker, state_dir):
    """The topic after the whole workload, its events, `SELECT * FROM customers` then, and what the workload did."""
    workload = Workload(SEED)
    topic, markers = f"{CONNECTOR}.{DATABASE}.{TABLE}", {f"{CONNECTOR}.{DATABASE}.{MARKERS}": "json"}
    broker.create_topic(topic, 2)  # a key's changes stay on one partition; the truncate lands on either
    broker.create_topic(next(iter(markers)), 1)
    with MariaDBServer(state_dir / "mariadb") as server:
        server.sql(DDL + f"INSERT INTO {TABLE} VALUES " + ", ".join(workload.values(k) for k in range(1, 31)) + ";")
        workload.keys, workload.next_id = set(range(1, 31)), 31
        connect_dir = state_dir / "connect-mariadb"
        connector = debezium_mariadb(CONNECTOR, server, DATABASE, [TABLE, MARKERS], connect_dir / "history.dat", 2)
        worker = KafkaConnect(
            connect_dir, broker.bootstrap_servers, [connector], offset_flush_ms=600_000, plugins="mariadb"
        )

        def step(marker: int, script: str) -> None:
            server.sql(script + f"\nINSERT INTO {MARKERS} VALUES ({marker});", database=DATABASE)
            wait_for_marker(broker.bootstrap_servers, markers, marker, None)

        try:
            worker.start()
            worker.wait_streaming()
            step(1, workload.changes(40))
            worker.restart_cleanly()  # offsets committed here
            step(2, workload.changes(40, truncate_after=25))  # replayed after the kill, truncate included
            worker.kill()
            server.sql(workload.changes(20), database=DATABASE)  # while the connector is down
            worker.start()
            worker.wait_streaming()
            step(3, workload.changes(30))
            # A clean stop: the marker's arrival does not prove the producer sent every earlier record of the other
            # topic (a retried request), and a SIGKILL now could lose the workload's tail.
            worker.stop(120.0)
        finally:
            worker.kill()
        expected = server.rows(TABLE, COLUMNS, DATABASE)
    return topic, read_events(broker.bootstrap_servers, topic, "json", None), expected, workload.counts


def as_source(row: dict) -> dict:
    """A table row in MariaDB's JSON terms: decimals exact, dates and datetimes as MariaDB prints them."""
    out = {c: row[c] for c in COLUMNS}
    if out["born"] is not None:
        out["born"] = out["born"].isoformat()
    if out["seen"] is not None:
        out["seen"] = out["seen"].isoformat(sep=" ", timespec="microseconds")
    return out


@pytest.mark.spark
def test_the_mirror_of_a_mariadb_table_equals_it(mariadb_cdc, spark, make_config, state_dir):
    topic, events, expected, counts = mariadb_cdc
    ops = Counter(e.op for e in events)
    assert {"r", "c", "u", "d", "t"} <= set(ops) and ops["t"] == 2, (SEED, ops)  # the truncate and its replay
    assert any("__debezium.oldkey" in e.headers for e in events), SEED  # a primary-key change
    seen = Counter((e.op, e.value["source"]["pos"], e.value["source"]["row"], str(e.key)) for e in events if e.value)
    assert any(n > 1 and op in ("c", "u", "d") for (op, *_), n in seen.items()), f"no replayed change ({SEED})"
    config = make_config(
        {
            "topic": topic,
            "table": "mirror_mariadb",
            "format": "json",
            "envelope": "debezium",
            "mode": "upsert",
            "errors": "fail",
        }
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.status == "committed", result.describe()
    again = run_table(spark, config, config.tables[0], state_dir)  # the first batch read the whole topic
    assert again.status != "committed" or again.rows_written == 0, again.describe()
    want = sorted(
        ({**r, "balance": Decimal(str(r["balance"])) if r["balance"] is not None else None} for r in expected),
        key=lambda r: r["id"],
    )
    for reader, rows in (
        ("pyiceberg", read_pyiceberg(state_dir, result.identifier)),
        ("duckdb", read_duckdb(result.metadata_location)),
    ):
        got = sorted((as_source(r) for r in rows), key=lambda r: r["id"])
        assert got == want, f"{reader}, seed {SEED}, workload {dict(counts)}\n" + "\n".join(
            differences(got, want, events)
        )


def differences(got: list[dict], want: list[dict], events: list) -> list[str]:
    """Per key that differs: the table's row, the source's, and the key's events (op, partition, offset, position)."""
    mine, theirs = {r["id"]: r for r in got}, {r["id"]: r for r in want}
    out = []
    for key in sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))[:10]:
        out.append(f"id {key}: table {mine.get(key)}, source {theirs.get(key)}")
        for e in events:
            image = (e.value or {}).get("after") or (e.value or {}).get("before") or {}
            if (e.key or {}).get("id") == key or image.get("id") == key or (e.op == "t"):
                source = (e.value or {}).get("source") or {}
                out.append(
                    f"  {e.op} p{e.partition}@{e.offset} {source.get('file')}:{source.get('pos')}:"
                    f"{source.get('row')} gtid {source.get('gtid')} {(e.value or {}).get('after')}"
                )
    return out
