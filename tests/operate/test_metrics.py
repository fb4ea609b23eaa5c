"""Per-batch metrics as CloudWatch embedded metric format lines: checked against the EMF specification's rules, from
real batches on the local broker (a committed one that leaves a backlog, an up-to-date one, a failed one)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml

from icefloe.operate.metrics import BatchMetrics, emf_document
from icefloe.operate.runner import run_tables
from support import produce

SCHEMA = {"fields": [{"name": "n", "type": "long"}]}
# CloudWatch's metric units (MetricDatum.Unit).
UNITS = {
    "Seconds",
    "Microseconds",
    "Milliseconds",
    "Bytes",
    "Kilobytes",
    "Megabytes",
    "Gigabytes",
    "Terabytes",
    "Bits",
    "Kilobits",
    "Megabits",
    "Gigabits",
    "Terabits",
    "Percent",
    "Count",
    "Bytes/Second",
    "Kilobytes/Second",
    "Megabytes/Second",
    "Gigabytes/Second",
    "Terabytes/Second",
    "Bits/Second",
    "Kilobits/Second",
    "Megabits/Second",
    "Gigabits/Second",
    "Terabits/Second",
    "Count/Second",
    "None",
}


def valid_emf(line: str) -> dict[str, float]:
    """The metric values of one EMF log event, after checking the specification's rules: a JSON object whose `_aws`
    holds an integer millisecond Timestamp and CloudWatchMetrics directives, each with a Namespace (1-255 chars),
    Dimensions (lists of 1-30 names, each a string member at the root) and Metrics (1-100 of Name and a CloudWatch
    Unit, each a finite number at the root)."""
    document = json.loads(line)
    assert isinstance(document, dict) and "\n" not in line
    aws = document["_aws"]
    assert isinstance(aws["Timestamp"], int) and abs(aws["Timestamp"] / 1000 - time.time()) < 600
    assert isinstance(aws["CloudWatchMetrics"], list) and aws["CloudWatchMetrics"]
    values: dict[str, float] = {}
    for directive in aws["CloudWatchMetrics"]:
        assert isinstance(directive["Namespace"], str) and 1 <= len(directive["Namespace"]) <= 255
        for dimension_set in directive["Dimensions"]:
            assert isinstance(dimension_set, list) and 1 <= len(dimension_set) <= 30
            for name in dimension_set:
                assert isinstance(document[name], str) and document[name], name
        assert 1 <= len(directive["Metrics"]) <= 100
        for metric in directive["Metrics"]:
            assert set(metric) <= {"Name", "Unit", "StorageResolution"} and metric["Unit"] in UNITS, metric
            value = document[metric["Name"]]
            assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), metric
            values[metric["Name"]] = value
    return values


def test_metrics_not_measured_are_not_declared():
    document = emf_document(BatchMetrics("db.t", "t", "waiting", 1.5, error="cannot reach Kafka at h:1"))
    values = valid_emf(json.dumps(document))
    assert values == {"RecordsCommitted": 0, "BadRecords": 0, "BatchFailed": 1, "BatchDuration": 1.5, "RecordsLost": 0}
    assert "LagSeconds" not in document and "BytesWritten" not in document
    assert document["Table"] == "db.t" and document["Error"] == "cannot reach Kafka at h:1"
    assert document["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "icefloe"
    assert document["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Table"]]


def stack(tmp_path: Path, bootstrap: str, topic: str, **table) -> str:
    path = tmp_path / f"Pulumi.metrics{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": bootstrap}],
                    "icefloe:tables": [
                        {
                            "sourceCluster": "local",
                            "topic": topic,
                            "format": "json",
                            "schema": SCHEMA,
                            "maintenance": {"enabled": False},
                            **table,
                        }
                    ],
                }
            }
        )
    )
    return str(path)


def emf_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"_aws"')]


@pytest.mark.spark
@pytest.mark.broker
def test_each_batch_prints_one_valid_emf_line(spark, broker, state_dir, topic, tmp_path, capsys):
    broker.create_topic(topic, 1)
    five_minutes_ago = int((time.time() - 300) * 1000)
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": json.dumps({"n": i}).encode(), "partition": 0, "timestamp": five_minutes_ago} for i in range(10)],
    )
    limited = stack(tmp_path, broker.bootstrap_servers, topic, maxRecordsPerRun=4)
    capsys.readouterr()

    assert run_tables(limited, [], state_dir, continuous=False, on_result=lambda r: None, metrics=True) == 0
    (line,) = emf_lines(capsys.readouterr().out)
    values = valid_emf(json.dumps(line))
    assert line["Table"] == f"local.{topic}" and line["Status"] == "committed" and line["Topic"] == topic
    assert values["RecordsCommitted"] == 4 and values["BadRecords"] == 0 and values["BatchFailed"] == 0
    assert values["LagRecords"] == 6, "the six records past maxRecordsPerRun wait for the next batch"
    assert 290 <= values["LagSeconds"] <= 900 and values["BytesWritten"] > 0 and values["BatchDuration"] > 0

    everything = stack(tmp_path, broker.bootstrap_servers, topic)
    run_tables(everything, [], state_dir, continuous=False, on_result=lambda r: None, metrics=True)
    run_tables(everything, [], state_dir, continuous=False, on_result=lambda r: None, metrics=True)
    committed, idle = emf_lines(capsys.readouterr().out)
    assert valid_emf(json.dumps(committed))["RecordsCommitted"] == 6 and committed["LagRecords"] == 0
    assert idle["Status"] == "up-to-date" and valid_emf(json.dumps(idle))["RecordsCommitted"] == 0
    assert idle["LagRecords"] == 0 and idle["LagSeconds"] == 0 and "BytesWritten" not in idle

    # A bad record stops an `errors: fail` table: the line says so, and still parses.
    produce(broker.bootstrap_servers, topic, [{"value": b"not json", "partition": 0}])
    assert run_tables(everything, [], state_dir, continuous=False, on_result=lambda r: None, metrics=True) == 1
    (failed,) = emf_lines(capsys.readouterr().out)
    assert valid_emf(json.dumps(failed))["BatchFailed"] == 1 and failed["Status"] == "failed"
    assert "partition 0 offset 10" in failed["Error"]
