"""The local catalog: Iceberg's JDBC catalog on one SQLite file under the state directory, shared by every process
that runs on it (runs of other tables, maintenance, readers and other writers)."""

from __future__ import annotations

import json
import os
import signal
import sys

import pyarrow as pa
import pytest
import yaml

from icefloe_dev.readers import pyiceberg_catalog
from support import WatchedRun, produce, read_pyiceberg, stop_at

pytestmark = [pytest.mark.process, pytest.mark.broker]


def test_a_run_lets_other_processes_commit_to_the_local_catalog_while_it_lives(broker, topic, tmp_path):
    """Iceberg's JDBC catalog, opening a catalog file that exists, left its schema check's statement open, and with
    it SQLite's read lock on the file until the run exited: another process's commit waited its busy timeout and
    failed with "database is locked" (a continuous run would have held the catalog for ever)."""
    state = tmp_path / "state"
    state.mkdir()
    other = pyiceberg_catalog(state)  # the catalog file exists before the run opens it, as after any first run
    other.create_namespace("other")
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": json.dumps({"n": n}).encode()} for n in range(10)])
    stack = tmp_path / "Pulumi.local.yaml"
    table = {
        "sourceCluster": "local",
        "topic": topic,
        "format": "json",
        "schema": {"fields": [{"name": "n", "type": "long"}]},
    }
    stack.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "aws:region": "eu-west-1",
                    "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers}],
                    "icefloe:tables": [table],
                }
            }
        )
    )
    command = [sys.executable, "-m", "icefloe.cli", "run", "--once", "--config", str(stack), "--state-dir", str(state)]
    run = WatchedRun(command, {**os.environ, "ICEFLOE_SPARK_MASTER": "local[1]"})
    try:
        stop_at(run, "records from")  # its catalog is open: it read the table's committed offsets
        assert run.stopped, "".join(run.lines[-20:])
        # Another process commits to the same catalog (pyiceberg waits at most SQLite's 5 s for the lock).
        created = other.create_table("other.t", schema=pa.schema([("x", pa.int64())]))
        created.append(pa.table({"x": [1, 2]}))
    finally:
        run.process.send_signal(signal.SIGCONT)
    assert run.process.wait(timeout=300) == 0, "".join(run.lines[-20:])
    assert sorted(row["x"] for row in read_pyiceberg(state, "other.t")) == [1, 2]
    assert sorted(row["n"] for row in read_pyiceberg(state, f"local.{topic}")) == list(range(10))
