"""Per-table CloudWatch alarms in the Pulumi program (under Pulumi's mocks), on the metrics the jobs print as
embedded-metric lines: thresholds from each table's refresh or its override, the SNS topic from stack config."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import yaml

from icefloe.cli import build_parser
from icefloe.errors import ConfigError
from icefloe.operate.metrics import BatchMetrics, emf_document
from icefloe_infra.deployment import load_stack_config
from pulumi_mocks import run_program

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE, MINIMAL = ROOT / "examples" / "Pulumi.example.yaml", ROOT / "examples" / "Pulumi.minimal.yaml"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
TOPIC = "arn:aws:sns:eu-west-1:123456789012:data-platform-alerts"


@pytest.fixture(autouse=True)
def _collect_after_failed_programs():
    yield
    gc.collect()


@pytest.fixture(scope="module")
def program():
    return run_program(EXAMPLE)


def alarms(run, metric: str) -> dict[str, dict]:
    """The alarms on `metric`, by the table they watch."""
    found = {}
    for alarm in run.of_type(ALARM):
        if alarm.inputs["metricName"] == metric:
            table = alarm.inputs["dimensions"]["Table"]
            assert table not in found, f"two {metric} alarms for {table}"
            found[table] = alarm.inputs
    return found


def test_every_enabled_table_has_a_lag_alarm_from_its_refresh_or_override(program):
    lag = alarms(program, "LagSeconds")
    # stock_trades refreshes every 15m, accounts every 5m: three intervals; clickstream (30s) overrides with 10m.
    # audit_log is disabled: no job, no alarm.
    expected = {"main.stock_trades": 2700, "main.accounts": 900, "main.clickstream": 600}
    assert {table: inputs["threshold"] for table, inputs in lag.items()} == expected
    for table, inputs in lag.items():
        assert inputs["period"] == expected[table] and inputs["evaluationPeriods"] == 1
        assert (inputs["namespace"], inputs["statistic"], inputs["comparisonOperator"]) == (
            "icefloe",
            "Maximum",
            "GreaterThanThreshold",
        )
        assert inputs["treatMissingData"] == "breaching", "a window without any batch report is late too"
        assert inputs["alarmActions"] == inputs["okActions"] == [TOPIC]
        assert inputs["name"] == f"icefloe-example-{table}-lag"
        assert inputs["tags"]["icefloe:stack"] == "example" and inputs["tags"]["icefloe:owner"]
    assert program.outputs["alarms"]["main.clickstream"] == ["icefloe-example-main.clickstream-lag"]


def test_dead_letter_growth_alarms_only_where_bad_records_are_kept(program):
    bad = alarms(program, "BadRecords")
    assert list(bad) == ["main.stock_trades"]  # errors: dlq; the others fail on a bad record (the lag alarm shows it)
    inputs = bad["main.stock_trades"]
    assert (inputs["statistic"], inputs["threshold"], inputs["period"]) == ("Sum", 0, 2700)
    assert inputs["treatMissingData"] == "notBreaching" and inputs["alarmActions"] == [TOPIC]
    assert "main.stock_trades_dlq grew" in inputs["alarmDescription"]


def test_the_alarms_watch_the_metrics_the_jobs_print(program):
    declared = emf_document(BatchMetrics("db.t", "t", "committed", 1.0, 5, 0, 0, 3, 2.0, 100))
    (directive,) = declared["_aws"]["CloudWatchMetrics"]
    names = {m["Name"] for m in directive["Metrics"]}
    for alarm in program.of_type(ALARM):
        assert alarm.inputs["namespace"] == directive["Namespace"]
        assert [list(alarm.inputs["dimensions"])] == directive["Dimensions"]
        assert alarm.inputs["metricName"] in names
    for schedule in program.of_type("aws:scheduler/schedule:Schedule"):
        request = json.loads(schedule.inputs["target"]["input"])
        args = build_parser().parse_args(request["JobDriver"]["SparkSubmit"]["EntryPointArguments"])
        assert args.metrics == "emf", "a job that prints no metrics would set off its lag alarm"


def stack_with(tmp_path: Path, tables: list[dict], **config) -> Path:
    document = yaml.safe_load(MINIMAL.read_text())
    document["config"]["icefloe:tables"] = [{"sourceCluster": "events", **t} for t in tables]
    document["config"].update(config)
    path = tmp_path / "Pulumi.alarms.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_thresholds_and_opting_out_per_table_and_no_topic(tmp_path):
    run = run_program(
        stack_with(
            tmp_path,
            [
                {"topic": "orders", "errors": "skip", "refresh": "1h", "alarms": {"lag": "2h", "badRecords": 10}},
                {"topic": "quiet", "alarms": {"enabled": False}},
                {"topic": "daily", "refresh": "12h"},
            ],
        )
    )
    lag, bad = alarms(run, "LagSeconds"), alarms(run, "BadRecords")
    assert {t: i["threshold"] for t, i in lag.items()} == {"events.orders": 7200, "events.daily": 86400}
    assert lag["events.daily"]["period"] == 86400, "three 12h intervals are capped at CloudWatch's one day"
    assert bad["events.orders"]["threshold"] == 10 and "skipped bad records" in bad["events.orders"]["alarmDescription"]
    assert all(a.inputs["alarmActions"] == [] and a.inputs["okActions"] == [] for a in run.of_type(ALARM))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"icefloe:tables": [{"sourceCluster": "events", "topic": "orders", "alarms": {"lag": "30s"}}]},
            r"icefloe:tables\[0\] \(orders\)\.alarms\.lag: lag must be between 1m and 1d",
        ),
        (
            {"icefloe:tables": [{"sourceCluster": "events", "topic": "orders", "alarms": {"badRecords": -1}}]},
            r"icefloe:tables\[0\] \(orders\)\.alarms\.badRecords: Input should be greater than or equal to 0",
        ),
        (
            {"icefloe:alarms": {"topicArn": "arn:aws:sqs:us-east-1:123456789012:q"}},
            r"icefloe:alarms\.topicArn: String should match",
        ),
        ({"icefloe:alarms": {"topic": TOPIC}}, r"icefloe:alarms\.topic: Extra inputs are not permitted"),
    ],
)
def test_bad_alarm_settings_are_named(change, message):
    raw = {
        k.split(":", 1)[1]: v
        for k, v in yaml.safe_load(MINIMAL.read_text())["config"].items()
        if k.startswith("icefloe:")
    }
    raw.update({k.split(":", 1)[1]: v for k, v in change.items()})
    with pytest.raises(ConfigError, match=message):
        load_stack_config(raw)
