"""The `icefloe` command as users run it: exit codes, clear errors, and crash safety under SIGKILL."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from itertools import islice
from pathlib import Path

import pytest
import yaml

from icefloe import cli
from icefloe.errors import SourceError
from icefloe.operate import runner
from icefloe.source import kafka as kafka_source
from icefloe_dev import demo, stock_trades
from icefloe_dev.producer import produce_avro
from support import WatchedRun, by_position, crash_point, crash_seed, crash_trials, read_pyiceberg

ICEFLOE = [sys.executable, "-m", "icefloe.cli"]


def stack_file(path: Path, bootstrap: str, registry_url: str, tables: list[dict]) -> Path:
    document = {
        "config": {
            "aws:region": "eu-west-1",
            "icefloe:sourceClusters": [
                {"name": "local", "bootstrapServers": bootstrap, "schemaRegistry": {"url": registry_url}}
            ],
            "icefloe:tables": [{"sourceCluster": "local", **t} for t in tables],
        }
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_bad_config_exits_2_and_names_table_and_field(tmp_path):
    path = stack_file(
        tmp_path / "Pulumi.bad.yaml", "127.0.0.1:1", "http://127.0.0.1:1", [{"topic": "orders", "mode": "upsrt"}]
    )
    done = subprocess.run(
        [*ICEFLOE, "run", "--config", str(path), "--once"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "icefloe:tables[0] (orders).mode: Input should be 'append' or 'upsert'" in done.stderr
    assert str(path) in done.stderr


def test_unreachable_broker_is_a_clear_source_error(spark, state_dir, make_config, monkeypatch):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(kafka_source, "METADATA_TIMEOUT_S", 2.0)
    monkeypatch.setattr(runner, "SOURCE_ATTEMPTS", 2)
    monkeypatch.setattr(runner, "SOURCE_BACKOFF_S", 0.1)
    config = make_config(
        {"topic": "nowhere", "format": "json", "schema": {"fields": [{"name": "a", "type": "long"}]}},
        bootstrap=f"127.0.0.1:{port}",
    )
    with pytest.raises(SourceError, match=f"cannot reach Kafka at 127.0.0.1:{port}"):
        runner.run_table(spark, config, config.tables[0], state_dir)


# Local and REST only: on Glue the same SIGKILLs are tried with two writers (tests/table/test_glue_catalog.py), and a
# third five-minute variant here would weigh on the suite's time more than it adds.
@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("catalog", ["local", pytest.param("rest", marks=pytest.mark.rest)], indirect=True)
def test_sigkill_midway_then_rerun_is_exactly_once(catalog, broker, registry, spark, state_dir, topic, tmp_path):
    records = 60_000
    path = trades_stack(tmp_path / "Pulumi.crash.yaml", broker, registry, topic, records, max_records=40_000)
    if catalog is not None:  # the REST server
        document = yaml.safe_load(path.read_text())
        document["config"]["icefloe:catalog"] = catalog
        path.write_text(yaml.safe_dump(document))
    env = {**os.environ, "ICEFLOE_SPARK_MASTER": "local[2]"}
    command = [*ICEFLOE, "run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir)]
    seed = crash_seed()
    rng = random.Random(seed)
    kills = 0
    for _ in range(2):  # a second try only if the first run finished before the kill landed
        if kills:
            break
        run, point = WatchedRun(command, env), crash_point(rng, test=0, trial=0)
        print(f"seed {seed}: killing at {point}")
        assert run.logged("records from", 120), "the run never started reading"
        kills += run.kill_at(point)
        run.process.wait(timeout=120)
    assert kills >= 1, f"seed {seed}: the run finished before it could be killed; the test did not test a crash"

    run_to_the_end(command, env)
    assert_exactly_once(state_dir, f"local.{topic}", records)


# A writer that takes no local lock: on AWS nothing serializes two runs of one table.
UNLOCKED = [
    sys.executable,
    "-c",
    "import contextlib, sys; from icefloe import cli; from icefloe.operate import runner; "
    "runner.table_lock = lambda *args: contextlib.nullcontext(); sys.exit(cli.main())",
]


@pytest.mark.spark
@pytest.mark.broker
def test_two_overlapping_writers_one_killed_at_random_is_exactly_once(
    broker, registry, spark, state_dir, topic, tmp_path
):
    """Two runs of one table overlap (no lock between them); one of them, chosen at random, is SIGKILLed at a random
    point of a phase (`crash_point`) while the other goes on to commit. Each trial (ICEFLOE_CRASH_TRIALS, one by default) overlaps the next
    batch of the same table; a trial whose victim finished before the kill is tried again."""
    trials, batch = crash_trials(), 6_000
    # A victim may end on its own before its kill point: it lost a catalog commit race, or the local catalog's SQLite
    # answered SQLITE_BUSY through all of the run's retries (seen on this 2-core machine in full-suite runs).
    attempts = 3 * trials + 3
    # The trades are produced as the attempts need them, not all up front for every attempt there may be (most runs
    # of the suite make one): an attempt commits at most two batches, so two more before each one, and one more for
    # the rerun after them (it always has one left).
    trades = stock_trades.trades(batch * (2 * attempts + 1))
    path = trades_stack(tmp_path / "Pulumi.crash2.yaml", broker, registry, topic, 0, max_records=batch)
    records = 0

    def produce_batches(count: int) -> None:
        nonlocal records
        records += produce_avro(
            broker.bootstrap_servers, registry.url, topic, stock_trades.SCHEMA, islice(trades, count * batch)
        )

    env = {**os.environ, "ICEFLOE_SPARK_MASTER": "local[1]"}
    arguments = ["run", "--once", "--json", "--state-dir", str(state_dir)]
    seed = crash_seed()
    rng = random.Random(seed)
    kills = 0
    for attempt in range(attempts):
        if kills == trials:
            break
        produce_batches(2)
        first = WatchedRun([*UNLOCKED, *arguments, "--config", str(path)], env)
        time.sleep(rng.uniform(0.0, 3.0))  # the second writer starts while the first plans, reads or commits
        second = WatchedRun([*UNLOCKED, *arguments, "--config", str(path)], env)
        victim, survivor = (first, second) if rng.random() < 0.5 else (second, first)
        point = crash_point(rng, test=1, trial=kills)
        print(
            f"seed {seed}, attempt {attempt}: killing the {'first' if victim is first else 'second'} writer at {point}"
        )
        kills += victim.kill_at(point)
        victim.process.wait(timeout=120)
        assert survivor.process.wait(timeout=600) in (0, 1), (
            f"attempt {attempt} (seed {seed}): the surviving writer crashed"
        )
    assert kills == trials, (
        f"seed {seed}: {kills} of {trials} victims still running when killed; the test did not test a crash"
    )
    produce_batches(1)
    run_to_the_end([*ICEFLOE, *arguments, "--config", str(catch_up_stack(path))], env)
    assert_exactly_once(state_dir, f"local.{topic}", records)


def trades_stack(path: Path, broker, registry, topic: str, records: int, max_records: int) -> Path:
    """A 3-partition topic of `records` Avro stock trades, and a stack file reading it `max_records` per batch."""
    broker.create_topic(topic, 3)
    produce_avro(broker.bootstrap_servers, registry.url, topic, stock_trades.SCHEMA, stock_trades.trades(records))
    return stack_file(
        path,
        broker.bootstrap_servers,
        registry.url,
        [{"topic": topic, "partitionBy": ["hour(event_time)"], "maxRecordsPerRun": max_records}],
    )


def catch_up_stack(path: Path) -> Path:
    """The same stack without `maxRecordsPerRun`: the rerun after the trials (whose survivors committed, so it resumes
    from a checkpoint) takes the rest in one batch, one Spark start instead of one per batch."""
    document = yaml.safe_load(path.read_text())
    for table in document["config"]["icefloe:tables"]:
        del table["maxRecordsPerRun"]
    catch_up = path.with_name(f"catch-up-{path.name}")
    catch_up.write_text(yaml.safe_dump(document))
    return catch_up


def run_to_the_end(command: list[str], env: dict) -> None:
    for _ in range(8):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if json.loads(done.stdout.strip().splitlines()[-1])["status"] == "up-to-date":
            return
    raise AssertionError("the table never caught up")


def assert_exactly_once(state_dir: Path, identifier: str, records: int) -> None:
    """Every (partition, offset) of the topic is in the table exactly once, with no gaps."""
    keyed = by_position(read_pyiceberg(state_dir, identifier))  # fails on any duplicate (partition, offset)
    assert len(keyed) == records
    per_partition = {}
    for partition, offset in keyed:
        per_partition.setdefault(partition, []).append(offset)
    for partition, offsets in per_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition} has gaps"


MARKER = "PAYLOAD-MARKER-7c1e"
BIG_MARKER = 2**53 + 1  # 9007199254740993
SECONDS_MARKER = 10**12 + 7341
STAMP_PROTO = """syntax = "proto3";
package {ns};
import "google/protobuf/timestamp.proto";
message Stamp {{ google.protobuf.Timestamp at = 1; }}
"""


@pytest.mark.spark
@pytest.mark.broker
def test_logs_errors_and_json_never_carry_a_bad_records_values(broker, registry, spark, state_dir, topic, tmp_path):
    """Values that do not fit the table, each holding a marker string: the error, the logs (verbose) and the --json
    output name partition, offset and field but never the value; the DLQ table keeps the raw payload."""
    from support import compile_protos, message_class, produce, protobuf_serializer

    broker.create_topic(topic, 1)
    schema = {
        "fields": [
            {"name": "n", "type": "long"},
            {"name": "at", "type": "timestamptz"},
            {"name": "day", "type": "date"},
            {"name": "price", "type": "decimal(9,2)"},
        ]
    }
    bad = [{"at": f"{MARKER}-at"}, {"day": f"{MARKER}-day"}, {"price": f"{MARKER}-price"}]
    values = [{"n": 1}, *bad, {"n": 2}]
    produce(broker.bootstrap_servers, topic, [{"value": json.dumps(v).encode()} for v in values])
    # Numbers as markers: a schemaless integer the inferred double column cannot hold exactly (2^53 + 1), and a
    # Protobuf Timestamp beyond year 9999.
    broker.create_topic(f"{topic}_sl", 1)
    produce(broker.bootstrap_servers, f"{topic}_sl", [{"value": b'{"d": 1.5}'}, {"value": b'{"d": %d}' % BIG_MARKER}])
    broker.create_topic(f"{topic}_pb", 1)
    ns = topic[-30:].strip("_")
    Stamp = message_class(compile_protos({f"{ns}/stamp.proto": STAMP_PROTO.format(ns=ns)}, tmp_path), f"{ns}.Stamp")
    stamp = Stamp()
    stamp.at.seconds = SECONDS_MARKER
    produce(
        broker.bootstrap_servers,
        f"{topic}_pb",
        [{"value": protobuf_serializer(registry.url, f"{topic}_pb", Stamp)(stamp)}],
    )
    path = stack_file(
        tmp_path / "Pulumi.marker.yaml",
        broker.bootstrap_servers,
        registry.url,
        [
            {"topic": topic, "table": "marker_fail", "format": "json", "schema": schema, "errors": "fail"},
            {"topic": topic, "table": "marker_skip", "format": "json", "schema": schema, "errors": "skip"},
            {"topic": topic, "table": "marker_dlq", "format": "json", "schema": schema, "errors": "dlq"},
            {"topic": f"{topic}_sl", "table": "marker_schemaless", "format": "json", "errors": "fail"},
            {"topic": f"{topic}_pb", "table": "marker_protobuf", "format": "protobuf", "errors": "fail"},
        ],
    )
    done = subprocess.run(
        [*ICEFLOE, "-v", "run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "ICEFLOE_SPARK_MASTER": "local[1]"},
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]  # the fail table stopped at its first bad record
    assert "partition 0 offset 1" in done.stderr and "at: not an ISO-8601 timestamp" in done.stderr
    assert MARKER not in done.stdout and MARKER not in done.stderr
    assert "local.marker_schemaless: " in done.stderr and "local.marker_protobuf: " in done.stderr, "both stopped"
    for marker in (str(BIG_MARKER), str(SECONDS_MARKER)):
        assert marker not in done.stdout and marker not in done.stderr
    dead = read_pyiceberg(state_dir, "local.marker_dlq_dlq")
    assert [json.loads(row["raw_value"]) for row in sorted(dead, key=lambda r: r["kafka_offset"])] == bad, (
        "raw payloads kept"
    )
    assert not any(MARKER in row["error_message"] for row in dead)


@pytest.mark.spark
@pytest.mark.broker
def test_the_demo_shows_protobuf_and_json_schema_topics_end_to_end(
    broker, registry, spark, state_dir, tmp_path, monkeypatch, capsys, caplog
):
    """`icefloe demo --format protobuf|json-schema` as a user runs it, on the session's broker, registry and Spark
    (they stand in for the ones the demo starts: the session starts them with the demo's own `local_services`): every
    trade in the table with its values, read on the Python path (Protobuf) or the JVM path (JSON Schema); the second
    run commits nothing; DuckDB's sums per symbol printed."""

    @contextmanager
    def running(demo_state):
        yield broker, registry

    monkeypatch.setattr(demo, "local_services", running)
    monkeypatch.setattr(demo, "local_spark", lambda catalog, demo_state: nullcontext(spark))
    records = 300
    expected = [{k: v for k, v in trade.items() if k != "event_time"} for _, trade in stock_trades.trades(records)]
    per_symbol = defaultdict(list)
    for trade in expected:
        per_symbol[trade["symbol"]].append(trade)
    for format in ("protobuf", "json-schema"):
        monkeypatch.setattr(demo, "TOPIC", f"demo_{format.replace('-', '_')}")
        caplog.clear()
        with caplog.at_level("INFO", logger="icefloe.materialize.batch"):
            code = cli.main(
                [
                    "demo",
                    "--format",
                    format,
                    "--records",
                    str(records),
                    "--partitions",
                    "2",
                    "--state-dir",
                    str(tmp_path / format),
                ]
            )
        out = capsys.readouterr().out
        assert code == 0, out
        assert "read path jvm" in caplog.text and "second run: " in out and "nothing committed" in out
        identifier = out.split("rows in ")[1].split(":")[0]
        assert f"rows in {identifier}: {records}\n" in out
        printed = {
            line.split()[0]: line.split()[1:] for line in out.split("avg_price\n")[1].split("\n\n")[0].splitlines()
        }
        for symbol, trades in per_symbol.items():
            count, shares, price = printed[symbol]
            assert (int(count), int(shares.replace(",", ""))) == (len(trades), sum(t["quantity"] for t in trades)), (
                format
            )
            assert abs(float(price) - sum(t["price"] for t in trades) / len(trades)) <= 0.0051, format
        rows = read_pyiceberg(state_dir, identifier)
        assert sorted(({k: r[k] for k in expected[0]} for r in rows), key=_items) == sorted(expected, key=_items), (
            format
        )
        times = sorted(r["event_time"] for r in rows)
        assert {(b - a).total_seconds() for a, b in zip(times, times[1:])} == {0.001}, "one trade per millisecond"


def _items(row: dict) -> list:
    return sorted(row.items())
