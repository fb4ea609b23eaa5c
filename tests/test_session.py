"""The local SparkSession's start-up: a class-data-sharing archive for a scheduled run's fresh JVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from icefloe_dev import stock_trades
from icefloe_dev.producer import produce_avro
from support import by_position, read_pyiceberg

ICEFLOE = [sys.executable, "-m", "icefloe.cli"]


@pytest.mark.spark
@pytest.mark.broker
def test_the_first_run_writes_a_cds_archive_and_the_next_maps_icebergs_classes_from_it(
    broker, registry, state_dir, topic, tmp_path
):
    """ICEFLOE_CDS_ARCHIVE: the first `run --once` writes the archive as its JVM exits; the next one loads classes
    from it, Iceberg's (a `spark.jars` jar) among them, and writes its batch as without it; --json stays parseable."""
    broker.create_topic(topic, 2)
    produce_avro(broker.bootstrap_servers, registry.url, topic, stock_trades.SCHEMA, stock_trades.trades(2000))
    path = tmp_path / "Pulumi.cds.yaml"
    path.write_text(yaml.safe_dump({"config": {
        "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers,
                                    "schemaRegistry": {"url": registry.url}}],
        "icefloe:tables": [{"sourceCluster": "local", "topic": topic, "maxRecordsPerRun": 1000}],
    }}))  # fmt: skip
    archive, classes = tmp_path / "icefloe.jsa", tmp_path / "classes.log"
    env = {**os.environ, "ICEFLOE_CDS_ARCHIVE": str(archive), "ICEFLOE_SPARK_MASTER": "local[2]"}
    command = [*ICEFLOE, "run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir)]

    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads(first.stdout.strip().splitlines()[-1])["rows_written"] == 1000
    assert archive.stat().st_size > 0

    env["SPARK_SUBMIT_OPTS"] = f"{env.get('SPARK_SUBMIT_OPTS', '')} -Xlog:class+load=info:file={classes}"
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads(second.stdout.strip().splitlines()[-1])["rows_written"] == 1000
    iceberg = [line for line in classes.read_text().splitlines() if " org.apache.iceberg." in line]
    shared = [line for line in iceberg if "shared objects file" in line]
    assert iceberg and len(shared) > len(iceberg) / 2, (len(shared), len(iceberg))
    assert len(by_position(read_pyiceberg(state_dir, f"local.{topic}"))) == 2000
