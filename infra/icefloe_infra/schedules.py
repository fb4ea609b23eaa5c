"""Per enabled table: an EventBridge Scheduler schedule that starts the table's EMR Serverless job run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from .iam import policy, service_trust

START_JOB_RUN = "arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun"


def rate_expression(seconds: float, continuous: bool, streaming_minutes: int) -> str:
    """`rate(...)` for a table's refresh; a continuous table is (re)started as often as its streaming job lasts."""
    minutes = streaming_minutes if continuous else max(1, round(seconds / 60))
    return f"rate({minutes} minute{'s' if minutes > 1 else ''})"


@dataclass
class TableJob:
    identifier: str
    rate: str
    request: pulumi.Input[dict]


@dataclass
class TableSchedulesArgs:
    jobs: list[TableJob]
    application_arn: pulumi.Input[str]
    job_role_arn: pulumi.Input[str]
    account_id: str
    tags: dict[str, str] = field(default_factory=dict)


class TableSchedules(pulumi.ComponentResource):
    def __init__(self, name: str, args: TableSchedulesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:scheduler:TableSchedules", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.dead_letters = aws.sqs.Queue(
            f"{name}-dlq", message_retention_seconds=14 * 86400, sqs_managed_sse_enabled=True, tags=args.tags, opts=child
        )
        role = aws.iam.Role(
            f"{name}-role", assume_role_policy=service_trust("scheduler.amazonaws.com", args.account_id),
            tags=args.tags, opts=child,
        )  # fmt: skip
        aws.iam.RolePolicy(
            f"{name}-start-jobs",
            role=role.id,
            policy=pulumi.Output.all(args.application_arn, args.job_role_arn, self.dead_letters.arn).apply(
                lambda arns: policy(
                    {"Effect": "Allow", "Action": ["emr-serverless:StartJobRun"],
                     "Resource": [arns[0], f"{arns[0]}/jobruns/*"]},
                    {"Effect": "Allow", "Action": ["iam:PassRole"], "Resource": [arns[1]],
                     "Condition": {"StringEquals": {"iam:PassedToService": "emr-serverless.amazonaws.com"}}},
                    {"Effect": "Allow", "Action": ["sqs:SendMessage"], "Resource": [arns[2]]},
                )  # fmt: skip
            ),
            opts=child,
        )
        self.schedules = {
            job.identifier: aws.scheduler.Schedule(
                f"{name}-{job.identifier.replace('.', '-').replace('_', '-')}",
                description=f"icefloe: materialize {job.identifier}",
                schedule_expression=job.rate,
                flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
                target=aws.scheduler.ScheduleTargetArgs(
                    arn=START_JOB_RUN,
                    role_arn=role.arn,
                    input=pulumi.Output.from_input(job.request).apply(json.dumps),
                    retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                        maximum_retry_attempts=3, maximum_event_age_in_seconds=3600
                    ),
                    dead_letter_config=aws.scheduler.ScheduleTargetDeadLetterConfigArgs(arn=self.dead_letters.arn),
                ),
                opts=child,
            )
            for job in args.jobs
        }
        self.register_outputs({"schedules": list(self.schedules)})
