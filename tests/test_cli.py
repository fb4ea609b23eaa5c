"""The `icefloe` command as users run it: exit codes, clear errors, and crash safety under SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from icefloe import kafka_source, runner
from icefloe.errors import SourceError
from icefloe_dev import stock_trades
from icefloe_dev.producer import produce_avro
from support import by_position, read_pyiceberg

ICEFLOE = [sys.executable, "-m", "icefloe.cli"]


def stack_file(path: Path, bootstrap: str, registry_url: str, tables: list[dict]) -> Path:
    document = {
        "config": {
            "aws:region": "eu-west-1",
            "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": bootstrap, "schemaRegistry": {"url": registry_url}}],
            "icefloe:tables": [{"sourceCluster": "local", **t} for t in tables],
        }
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_bad_config_exits_2_and_names_table_and_field(tmp_path):
    path = stack_file(tmp_path / "Pulumi.bad.yaml", "127.0.0.1:1", "http://127.0.0.1:1", [{"topic": "orders", "mode": "upsrt"}])
    done = subprocess.run([*ICEFLOE, "run", "--config", str(path), "--once"], capture_output=True, text=True, timeout=60)
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
    config = make_config({"topic": "nowhere", "format": "json", "schema": {"fields": [{"name": "a", "type": "long"}]}},
                         bootstrap=f"127.0.0.1:{port}")  # fmt: skip
    with pytest.raises(SourceError, match=f"cannot reach Kafka at 127.0.0.1:{port}"):
        runner.run_table(spark, config, config.tables[0], state_dir)


@pytest.mark.spark
@pytest.mark.broker
def test_sigkill_midway_then_rerun_is_exactly_once(broker, registry, spark, state_dir, topic, tmp_path):
    records = 60_000
    broker.create_topic(topic, 3)
    produce_avro(broker.bootstrap_servers, registry.url, topic, stock_trades.SCHEMA, stock_trades.trades(records))
    path = stack_file(tmp_path / "Pulumi.crash.yaml", broker.bootstrap_servers, registry.url,
                      [{"topic": topic, "partitionBy": ["hour(event_time)"], "maxRecordsPerRun": 40_000}])  # fmt: skip
    env = {**os.environ, "ICEFLOE_SPARK_MASTER": "local[2]"}
    command = [*ICEFLOE, "run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir)]
    rng = random.Random(int(os.environ.get("ICEFLOE_CRASH_SEED", time.time())))
    kills = 0
    for _ in range(2):  # a second try only if the first run finished before the kill landed
        if kills:
            break
        process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        reading = threading.Event()

        def watch(stream=process.stderr, seen=reading) -> None:  # drain stderr so the run never blocks on it
            for line in stream:
                if "reading" in line and "records from" in line:
                    seen.set()

        threading.Thread(target=watch, daemon=True).start()
        assert reading.wait(120), "the run never started reading"
        time.sleep(rng.uniform(0.0, 4.0))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait(timeout=120)
    assert kills >= 1, "the run finished before it could be killed; the test did not test a crash"

    # Rerun to the end (two batches of at most 40k records) and check every record landed exactly once.
    for _ in range(3):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if json.loads(done.stdout.strip().splitlines()[-1])["status"] == "up-to-date":
            break
    rows = read_pyiceberg(state_dir, f"local.{topic}")
    keyed = by_position(rows)  # fails on any duplicate (partition, offset)
    assert len(keyed) == records
    per_partition = {}
    for partition, offset in keyed:
        per_partition.setdefault(partition, []).append(offset)
    for partition, offsets in per_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition} has gaps"
