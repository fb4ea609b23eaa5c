"""CloudWatch alarms per table, on the metrics each batch prints as embedded-metric log lines (`icefloe.operate.metrics`).

  lag          LagSeconds (Maximum) above the table's lag threshold (`alarms.lag`, default three refresh intervals,
               at least 5m), over one window as long as the threshold. Missing data is breaching: a window in which
               no batch reported (job not scheduled, failing before it could measure, or hung) alarms too.
  bad records  for `errors: dlq` (the dead-letter table grows) and `errors: skip`: BadRecords (Sum) above
               `alarms.badRecords` (default 0) within the same window; no data is fine here.

Both notify the stack's `icefloe:alarms.topicArn` (SNS) when set, on alarm and on recovery. Disabled tables, and
tables with `alarms.enabled: false`, get none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from icefloe.operate.metrics import DIMENSION, NAMESPACE
from icefloe.spec import IcefloeConfig, TableSpec

from .deployment import AlarmsSpec

MAX_PERIOD_S = 86400  # CloudWatch: period x evaluation periods may not exceed one day


def window_seconds(table: TableSpec) -> int:
    """The alarm period: the lag threshold rounded up to whole minutes (CloudWatch periods), at most a day."""
    return min(MAX_PERIOD_S, 60 * math.ceil(table.lag_alarm_seconds / 60))


@dataclass
class TableAlarmsArgs:
    spec: IcefloeConfig
    settings: AlarmsSpec
    stack_name: str
    tags: dict[str, str] = field(default_factory=dict)


class TableAlarms(pulumi.ComponentResource):
    alarm_names: dict[str, list[pulumi.Output[str]]]  # table identifier -> its alarms' names

    def __init__(self, name: str, args: TableAlarmsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:monitoring:TableAlarms", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        actions = [args.settings.topic_arn] if args.settings.topic_arn else []
        self.alarm_names = {}
        for table in args.spec.select(None):  # enabled tables only: a disabled table runs no job
            if not table.alarms.enabled:
                continue
            identifier = args.spec.identifier(table)
            slug = identifier.replace(".", "-").replace("_", "-")
            common: dict[str, Any] = dict(
                namespace=NAMESPACE,
                dimensions={DIMENSION: identifier},
                period=window_seconds(table),
                evaluation_periods=1,
                comparison_operator="GreaterThanThreshold",
                alarm_actions=actions,
                ok_actions=actions,
                tags=args.tags,
                opts=child,
            )
            lag = aws.cloudwatch.MetricAlarm(
                f"{name}-{slug}-lag",
                name=f"icefloe-{args.stack_name}-{identifier}-lag",
                alarm_description=(
                    f"{identifier}: records from {table.topic} waited longer than {table.lag_alarm_seconds:g}s, "
                    "or no batch reported within that time (refresh " + table.refresh + ")"
                ),
                metric_name="LagSeconds",
                statistic="Maximum",
                threshold=float(table.lag_alarm_seconds),
                treat_missing_data="breaching",
                **common,
            )
            names = [lag.name]
            if table.errors in ("dlq", "skip"):
                what = f"{identifier}_dlq grew" if table.errors == "dlq" else f"{identifier} skipped bad records"
                bad = aws.cloudwatch.MetricAlarm(
                    f"{name}-{slug}-bad-records",
                    name=f"icefloe-{args.stack_name}-{identifier}-bad-records",
                    alarm_description=f"{what}: more than {table.alarms.bad_records} bad records from {table.topic}",
                    metric_name="BadRecords",
                    statistic="Sum",
                    threshold=float(table.alarms.bad_records),
                    treat_missing_data="notBreaching",
                    **common,
                )
                names.append(bad.name)
            self.alarm_names[identifier] = names
        self.register_outputs({"alarmNames": self.alarm_names})
