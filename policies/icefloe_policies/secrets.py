"""No plaintext credentials in job arguments, Spark settings, environments, tags or the job's config object.

Values in those places are stored in the Pulumi state, shown by the AWS console and CLI, and copied into
job run records and logs. Credentials belong in Secrets Manager; pass the secret's ARN or name instead.
"""

from __future__ import annotations

from collections.abc import Iterator

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy, Severity

from . import tokens
from .credentials import scan
from .props import get
from .remedy import message

# Per resource type: the properties that carry job arguments, configuration or environment.
SCANNED_PROPERTIES: dict[str, list[tuple[str, ...]]] = {
    # The target input is the StartJobRun payload (JSON): entryPointArguments, sparkSubmitParameters, ...
    tokens.SCHEDULE: [("target", "input")],
    tokens.EVENT_TARGET: [("input",)],
    tokens.EMR_SERVERLESS_APPLICATION: [("runtimeConfigurations",)],
    tokens.GLUE_JOB: [("defaultArguments",), ("nonOverridableArguments",)],
    tokens.LAMBDA_FUNCTION: [("environment", "variables")],
    tokens.ECS_TASK_DEFINITION: [("containerDefinitions",)],
    # An object uploaded from text (the job's config, `--config s3://...`): a password or private key in it would be
    # readable by anyone who can read the bucket. Objects from files (the bundle, jars) have `source`, not `content`.
    **{token: [("content",)] for token in tokens.BUCKET_OBJECT},
}


def _places(args: ResourceValidationArgs) -> Iterator[tuple[str, object]]:
    for path in SCANNED_PROPERTIES.get(args.resource_type, []):
        yield ".".join(path), get(args.props, *path)
    yield "tags", get(args.props, "tags")  # every resource's tags


def _validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for where, value in _places(args):
        for finding in scan(value, where):
            report(
                message(
                    f"'{args.name}' has what looks like a {finding.kind} in plain text at {finding.where} "
                    "(value not shown). It would be stored in the Pulumi state and visible in AWS.",
                    "store it in AWS Secrets Manager and pass the secret's ARN or name; the job reads it at run time.",
                )
            )


NO_PLAINTEXT_CREDENTIALS = ResourceValidationPolicy(
    name="no-plaintext-credentials",
    description="No password, secret key, token or private key in plain text in job arguments, Spark "
    "parameters, runtime configuration, environment variables, tags or an uploaded config object.",
    validate=_validate,
    severity=Severity.CRITICAL,
    remediation_steps="Move the value to Secrets Manager and pass its ARN.",
)

POLICIES = [NO_PLAINTEXT_CREDENTIALS]
