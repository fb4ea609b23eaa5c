"""EventBridge Scheduler schedules retry failed starts and keep the ones that still fail.

Advisory by default: AWS retries for 24 hours without a retry policy, but without a dead-letter queue
a start that keeps failing (e.g. a throttled StartJobRun) is dropped silently.
"""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy, Severity

from . import tokens
from .props import get
from .remedy import message


def _validate_retry(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != tokens.SCHEDULE:
        return
    if get(args.props, "target", "retryPolicy") is None:
        report(
            message(
                f"Schedule '{args.name}' has no retry policy, so how long a failed StartJobRun is retried is left "
                "to AWS defaults (185 attempts over 24 hours).",
                "set target.retry_policy with maximum_retry_attempts and maximum_event_age_in_seconds.",
            )
        )


def _validate_dead_letter(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != tokens.SCHEDULE:
        return
    if not get(args.props, "target", "deadLetterConfig", "arn"):
        report(
            message(
                f"Schedule '{args.name}' has no dead-letter queue, so a job start that keeps failing is dropped "
                "without a trace.",
                "set target.dead_letter_config arn to the stack's SQS dead-letter queue.",
            )
        )


RETRY_POLICY = ResourceValidationPolicy(
    name="scheduler-retry-policy",
    description="EventBridge Scheduler schedules set an explicit retry policy on their target.",
    validate=_validate_retry,
    enforcement_level=EnforcementLevel.ADVISORY,
    severity=Severity.LOW,
    remediation_steps="Set target.retry_policy.",
)
DEAD_LETTER = ResourceValidationPolicy(
    name="scheduler-dead-letter",
    description="EventBridge Scheduler schedules send failed invocations to a dead-letter queue.",
    validate=_validate_dead_letter,
    enforcement_level=EnforcementLevel.ADVISORY,
    severity=Severity.LOW,
    remediation_steps="Set target.dead_letter_config to an SQS queue ARN.",
)

POLICIES = [RETRY_POLICY, DEAD_LETTER]
