"""`icefloe status` against the local broker and real tables: lag that appears with new records and goes after a run,
data lost to retention (pending, then recorded), `--max-lag` exit codes, and the heartbeat that tells an idle table
from a stuck one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import TopicPartition

from icefloe.materialize.batch import materialize_once
from icefloe.operate.heartbeat import FAILED, RUNNING, STOPPED, Heartbeat, read_heartbeat
from icefloe.operate.lag import Lag, PartitionLag
from icefloe.operate.runner import run_continuously
from icefloe.operate.status import MaxLag, collect_status, decide_state
from icefloe.source import kafka as kafka_source
from icefloe.spec import load_config, parse_config
from support import produce

SCHEMA = {"fields": [{"name": "n", "type": "long"}]}
ICEFLOE = [sys.executable, "-m", "icefloe.cli"]


def records(start: int, count: int, partition: int, age_s: float) -> list[dict]:
    stamp = int((time.time() - age_s) * 1000)
    return [
        {"value": json.dumps({"n": i}).encode(), "partition": partition, "timestamp": stamp}
        for i in range(start, start + count)
    ]


def stack_file(tmp_path: Path, bootstrap: str, topic: str, **table) -> Path:
    path = tmp_path / "Pulumi.status.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": bootstrap}],
                    "icefloe:tables": [
                        {"sourceCluster": "local", "topic": topic, "format": "json", "schema": SCHEMA, **table}
                    ],
                }
            }
        )
    )
    return path


def status(path: Path, state_dir: Path, *extra: str, json_lines: bool = True) -> tuple[int, list[dict] | str]:
    command = [*ICEFLOE, "status", "--config", str(path), "--state-dir", str(state_dir), *extra]
    done = subprocess.run(command + (["--json"] if json_lines else []), capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 4), done.stderr[-2000:]
    if not json_lines:
        return done.returncode, done.stdout
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.spark
@pytest.mark.broker
def test_status_shows_lag_until_a_run_and_the_data_lost_to_retention(spark, broker, state_dir, topic, tmp_path):
    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 6, 0, age_s=600) + records(6, 4, 1, age_s=600))
    path = stack_file(tmp_path, broker.bootstrap_servers, topic, onDataLoss="warn")
    config = load_config(str(path))

    code, (before,) = status(path, state_dir)
    assert code == 0 and before["state"] == "missing" and before["exists"] is False
    assert before["lag_records"] == 10 and 590 <= before["lag_seconds"] <= 900
    assert [(p["partition"], p["committed"], p["end"], p["lag_records"]) for p in before["partitions"]] == [
        (0, None, 6, 6),
        (1, None, 4, 4),
    ]

    materialize_once(spark, config, config.tables[0])
    code, (after,) = status(path, state_dir)
    assert code == 0 and after["state"] == "up-to-date" and after["exists"] is True
    assert after["lag_records"] == 0 and after["lag_seconds"] == 0
    assert after["offsets"] == {"0": 6, "1": 4} and after["rows"] == 10 and after["files"] >= 1
    assert after["dlq_rows"] is None and after["data_lost"] == [] and after["mode"] == "append"
    committed_at = time.mktime(time.strptime(after["last_commit"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert abs(committed_at - time.time()) < 300

    # New records: the lag is back, with the age of the oldest; --max-lag decides the exit code.
    produce(broker.bootstrap_servers, topic, records(10, 3, 1, age_s=120))
    code, (behind,) = status(path, state_dir, "--max-lag", "2")
    assert code == 4 and behind["behind_max_lag"] is True
    assert behind["lag_records"] == 3 and 110 <= behind["lag_seconds"] <= 400
    assert behind["state"] == "catching-up"  # younger than two refresh intervals (the default refresh is 15m)
    assert [p["lag_records"] for p in behind["partitions"]] == [0, 3]
    assert status(path, state_dir, "--max-lag", "3")[0] == 0
    assert status(path, state_dir, "--max-lag", "1m")[0] == 4
    assert status(path, state_dir, "--max-lag", "10m", "--max-lag", "100")[0] == 0

    # Retention deletes two of the three unread records: shown as lost before the run, recorded after it.
    for future in broker.admin.delete_records([TopicPartition(topic, 1, 6)]).values():
        future.result(30)
    code, (pending,) = status(path, state_dir)
    assert pending["partitions"][1]["lost_unread"] == 2 and pending["partitions"][1]["lag_records"] == 1
    assert pending["lost_unread"] == 2
    materialize_once(spark, config, config.tables[0])
    code, (recorded,) = status(path, state_dir)
    assert recorded["data_lost"] == [{"partition": 1, "start": 4, "end": 6}]
    assert recorded["lag_records"] == 0 and recorded["lost_unread"] == 0 and recorded["rows"] == 11

    code, text = status(path, state_dir, json_lines=False)
    assert code == 0
    header, row, *details = text.splitlines()
    assert header.split()[:2] == ["TABLE", "STATE"]
    assert row.split()[:4] == [f"local.{topic}", "up-to-date", "append", "fail"]
    assert "DATA LOST (recorded): partition 1 offsets 4..5 (2 records)" in text
    assert any(d.strip().startswith("partition 1: next offset 7, end 7: 0 behind") for d in details), text


@pytest.mark.spark
@pytest.mark.broker
def test_status_tells_an_idle_table_from_a_stuck_one(spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, records(0, 5, 0, age_s=0))
    config = make_config(
        {"topic": topic, "format": "json", "schema": SCHEMA, "refresh": "1s", "maintenance": {"enabled": False}}
    )
    identifier = config.identifier(config.tables[0])
    results, stop = [], threading.Event()
    loop = threading.Thread(
        target=run_continuously, args=(spark, config, list(config.tables), state_dir, results.append, stop)
    )
    loop.start()
    try:
        deadline = time.monotonic() + 120
        while not any(r.status == "up-to-date" for r in results):  # committed the five, then checked again
            assert loop.is_alive() and time.monotonic() < deadline, results
            time.sleep(0.5)
        (idle,) = collect_status(config, [], state_dir, MaxLag())
        assert idle.state == "idle", idle.as_dict()
        beat = idle.as_dict()["heartbeat"]
        assert beat["pid"] == os.getpid() and beat["process_alive"] is True and beat["offsets"] == {"0": 5}
        assert beat["outcome"] in ("up-to-date", RUNNING)
    finally:
        stop.set()
        loop.join(120)
    assert read_heartbeat(state_dir, identifier).outcome == STOPPED

    # The job is gone and records wait longer than two refresh intervals (and 60s): stuck.
    produce(broker.bootstrap_servers, topic, records(5, 2, 0, age_s=300))
    (stuck,) = collect_status(config, [], state_dir, MaxLag.parse(["1m"]))
    assert stuck.state == "stuck" and stuck.behind_max_lag and stuck.lag.records == 2


@pytest.mark.spark
@pytest.mark.broker
def test_status_names_an_unreachable_broker(spark, broker, state_dir, topic, make_config, monkeypatch):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(kafka_source, "METADATA_TIMEOUT_S", 2.0)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA}, bootstrap=f"127.0.0.1:{port}")
    (unreachable,) = collect_status(config, [], state_dir, MaxLag())
    assert unreachable.state == "unknown" and unreachable.lag is None
    (problem,) = unreachable.problems
    assert problem.startswith(f"broker: cannot reach Kafka at 127.0.0.1:{port}")
    assert unreachable.as_dict()["error"] == problem


@pytest.mark.broker
def test_status_reads_a_glue_table_without_spark(broker, moto_aws, topic, tmp_path, monkeypatch):
    """The AWS code path: pyiceberg's GlueCatalog (on the moto server) holding a table whose snapshot carries
    icefloe's checkpoint, read with the credentials and region of the environment, as on AWS."""
    import pyarrow as pa

    from icefloe.commit.checkpoint import Checkpoint

    bucket = "icefloe-status-" + topic.replace("_", "-")[:40].strip("-")
    moto_aws.client("s3").create_bucket(Bucket=bucket)
    warehouse = f"s3://{bucket}/warehouse"
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, records(0, 8, 0, age_s=60))
    writer = moto_aws.pyiceberg_catalog(warehouse=warehouse)
    writer.create_namespace_if_not_exists("local")  # the moto server is shared by the session
    rows = pa.table({"n": pa.array(range(5), pa.int64())})
    table = writer.create_table(f"local.{topic}", schema=rows.schema)
    table.append(rows, snapshot_properties=Checkpoint(topic, {0: 5}, run_id="r1").to_summary())
    config = parse_config(
        {
            "sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers}],
            "tables": [{"sourceCluster": "local", "topic": topic, "format": "json", "schema": SCHEMA}],
            "catalog": {"type": "glue", "warehouse": warehouse, "endpoints": moto_aws.catalog_endpoints()},
        }
    )
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in moto_aws.aws_env().items():
        monkeypatch.setenv(key, value)

    (glue,) = collect_status(config, [], tmp_path, MaxLag())
    assert glue.problems == [] and glue.facts.exists and glue.facts.offsets == {0: 5}
    assert glue.facts.rows == 5 and glue.facts.files == 1 and glue.dlq_rows is None
    assert glue.lag.records == 3 and 50 <= glue.lag.seconds <= 600 and glue.state == "catching-up"


# --- the state rules, from lag and heartbeat (no broker needed) ----------------------------------------------

TABLE = parse_config(
    {
        "sourceClusters": [{"name": "c", "bootstrapServers": "x:1"}],
        "tables": [{"sourceCluster": "c", "topic": "t", "format": "json", "schema": SCHEMA, "refresh": "5m"}],
    }
).tables[0]


def lag(records: int, seconds: float | None) -> Lag:
    return Lag([PartitionLag(0, 100, 100 + records, records, seconds, 0)])


def beat(outcome: str, age: float, now: float, pid: int | None = None) -> Heartbeat:
    return Heartbeat("c.t", now - age, outcome, pid=os.getpid() if pid is None else pid)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    "lag_, heartbeat, expected",
    [
        (lag(0, None), None, "up-to-date"),
        (lag(0, None), ("up-to-date", 30), "idle"),
        (lag(0, None), ("up-to-date", 900), "up-to-date"),  # last checked three refresh intervals ago: not live
        (lag(0, None), ("stopped", 5), "up-to-date"),
        (lag(5, 100.0), None, "catching-up"),
        (lag(5, 700.0), None, "stuck"),  # older than two refresh intervals (10m), nobody reading
        (lag(5, 700.0), ("committed", 20), "behind"),  # a live job commits but does not keep up
        (lag(5, 700.0), (RUNNING, 3000), "catching-up"),  # a live job's long batch is in flight
        (lag(5, 700.0), ("committed", 20, "dead"), "stuck"),  # the job died
        (lag(5, 700.0), (RUNNING, 30, "dead"), "stuck"),  # it died mid-batch
        (lag(5, 700.0), ("waiting", 20), "waiting"),
        (lag(5, 700.0), (FAILED, 20, "dead"), "failed"),
        (None, None, "unknown"),
    ],
)
def test_state_rules(lag_, heartbeat, expected):
    now = time.time()
    heart = None
    if heartbeat is not None:
        outcome, age, *dead = heartbeat
        heart = beat(outcome, age, now, dead_pid() if dead else None)
    assert decide_state(TABLE, True, lag_, heart, now) == expected


def test_missing_table_and_max_lag_parsing():
    assert decide_state(TABLE, False, lag(3, 5.0), None, time.time()) == "missing"
    assert MaxLag.parse(["100", "5m"]) == MaxLag(100, 300.0)
    assert MaxLag.parse(["5m"]).exceeded_by(lag(10**6, 299.0)) is False
    assert MaxLag.parse(["5m"]).exceeded_by(lag(1, 301.0)) is True
    from icefloe.errors import ConfigError

    with pytest.raises(ConfigError, match="--max-lag 'soon': give a record count"):
        MaxLag.parse(["soon"])
