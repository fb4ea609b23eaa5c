"""CloudWatch log groups expire their logs."""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy, Severity

from . import tokens
from .props import get
from .remedy import message


def _validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != tokens.LOG_GROUP:
        return
    days = get(args.props, "retentionInDays")
    if not days:  # absent or 0 both mean "keep forever"
        report(
            message(
                f"Log group '{args.name}' keeps its logs forever: job logs can hold record samples and cost "
                "grows without bound.",
                "set retention_in_days on the aws.cloudwatch.LogGroup (e.g. 30).",
            )
        )


LOG_RETENTION = ResourceValidationPolicy(
    name="cloudwatch-log-retention",
    description="CloudWatch log groups set retentionInDays, so logs do not accumulate forever.",
    validate=_validate,
    severity=Severity.LOW,
    remediation_steps="Set retention_in_days on the log group.",
)

POLICIES = [LOG_RETENTION]
