"""Per enabled table: an EventBridge Scheduler schedule that starts the table's EMR Serverless job run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from .deployment import ScheduleSpec
from .iam import policy, service_trust
from .jobs import TableJob

# The Scheduler's universal target: any AWS API call, here EMR Serverless StartJobRun.
START_JOB_RUN = "arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun"


@dataclass
class ScheduledJob:
    job: TableJob
    request: pulumi.Input[dict]  # the StartJobRun request (jobs.TableJob.start_job_run_request)


@dataclass
class TableSchedulesArgs:
    jobs: list[ScheduledJob]
    spec: ScheduleSpec
    application_arn: pulumi.Input[str]
    job_role_arn: pulumi.Input[str]
    account_id: str
    tags: dict[str, str] = field(default_factory=dict)


def scheduler_policy(application_arn: str, job_role_arn: str, queue_arn: str) -> str:
    return policy(
        {
            "Sid": "StartTableJobs",
            "Effect": "Allow",
            "Action": ["emr-serverless:StartJobRun"],
            "Resource": [application_arn, f"{application_arn}/jobruns/*"],
        },
        {
            "Sid": "PassJobRole",
            "Effect": "Allow",
            "Action": ["iam:PassRole"],
            "Resource": [job_role_arn],
            "Condition": {"StringEquals": {"iam:PassedToService": "emr-serverless.amazonaws.com"}},
        },
        {"Sid": "DeadLetters", "Effect": "Allow", "Action": ["sqs:SendMessage"], "Resource": [queue_arn]},
    )


def schedule_name(identifier: str) -> str:
    return identifier.replace(".", "-").replace("_", "-")


class TableSchedules(pulumi.ComponentResource):
    role_arn: pulumi.Output[str]
    dead_letter_queue_url: pulumi.Output[str]

    def __init__(self, name: str, args: TableSchedulesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:scheduler:TableSchedules", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        spec = args.spec
        # Firings that fail after every retry land here (with the error), instead of vanishing.
        self.dead_letters = aws.sqs.Queue(
            f"{name}-dlq",
            message_retention_seconds=spec.dead_letter_retention_seconds,
            sqs_managed_sse_enabled=True,
            tags=args.tags,
            opts=child,
        )
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=service_trust("scheduler.amazonaws.com", args.account_id),
            tags=args.tags,
            opts=child,
        )
        role_policy = aws.iam.RolePolicy(
            f"{name}-start-jobs",
            role=role.id,
            policy=pulumi.Output.all(args.application_arn, args.job_role_arn, self.dead_letters.arn).apply(
                lambda arns: scheduler_policy(*arns)
            ),
            opts=child,
        )
        self.schedules = {
            scheduled.job.identifier: aws.scheduler.Schedule(
                f"{name}-{schedule_name(scheduled.job.identifier)}",
                description=f"icefloe: materialize {scheduled.job.identifier}",
                schedule_expression=scheduled.job.rate_expression,
                state=spec.state,
                flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
                target=aws.scheduler.ScheduleTargetArgs(
                    arn=START_JOB_RUN,
                    role_arn=role.arn,
                    input=pulumi.Output.from_input(scheduled.request).apply(json.dumps),
                    retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                        maximum_retry_attempts=spec.maximum_retry_attempts,
                        maximum_event_age_in_seconds=spec.maximum_event_age_seconds,
                    ),
                    dead_letter_config=aws.scheduler.ScheduleTargetDeadLetterConfigArgs(arn=self.dead_letters.arn),
                ),
                # The first firing must find the role allowed to start jobs.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[role_policy]),
            )
            for scheduled in args.jobs
        }
        self.role_arn = role.arn
        self.dead_letter_queue_url = self.dead_letters.url
        self.register_outputs({"schedules": list(self.schedules), "roleArn": self.role_arn})
