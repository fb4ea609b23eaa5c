"""No long-lived credentials: icefloe's jobs and schedules run on roles, so no IAM user needs a key or password.

An access key or console password works until someone deletes it, is not rotated by anything, and (for an
access key created by Pulumi) its secret sits in the stack's state. A user on its own holds no credential and
is not reported; its keys, login profile and service-specific passwords are.
"""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy, Severity

from . import tokens
from .props import known
from .remedy import message

# Credential resource type -> (what it hands out, the input naming its user).
CREDENTIALS = {
    tokens.IAM_ACCESS_KEY: ("an access key", "user"),
    tokens.IAM_USER_LOGIN_PROFILE: ("a console password", "user"),
    tokens.IAM_SERVICE_SPECIFIC_CREDENTIAL: ("a service-specific password", "userName"),
}


def _validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in CREDENTIALS:
        return
    what, user_input = CREDENTIALS[args.resource_type]
    user = known(args.props, user_input)  # the verdict does not depend on the user, so report it in preview too
    whose = f"IAM user '{user}'" if isinstance(user, str) else "an IAM user"
    report(
        message(
            f"'{args.name}' gives {whose} {what}: a long-lived credential that works until someone deletes it "
            "and, unlike a role's, is never rotated.",
            "run the workload on an IAM role (the EMR Serverless job role, a role for CI through OIDC) and give people "
            "access through IAM Identity Center; remove the user's credentials.",
        )
    )


NO_LONG_LIVED_CREDENTIALS = ResourceValidationPolicy(
    name="iam-no-long-lived-credentials",
    description="No IAM user access keys, login profiles (console passwords) or service-specific credentials: "
    "workloads run on roles.",
    validate=_validate,
    severity=Severity.HIGH,
    remediation_steps="Use an IAM role instead of a user's access key or password.",
)

POLICIES = [NO_LONG_LIVED_CREDENTIALS]
