"""Resource policies: documents attached to a bucket, key, queue, secret or the Glue catalog admit no one at large.

A resource policy decides who *outside* IAM may reach the resource, so an Allow for `Principal: "*"` is a
public data leak (for S3 even anonymous), and an Allow for an AWS service principal lets every AWS customer's
use of that service reach it (the confused deputy: another account's bucket notifications, logs or
deliveries aimed at your queue or key). Either is fine once a condition pins the caller to an account, an
organization or a calling resource with a fixed value, as S3's own "is this policy public" check counts it.
"""

from __future__ import annotations

import re
from typing import Any

from pulumi_policy import (
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Severity,
)

from . import tokens
from .documents import DocumentError, Statement, parse
from .props import as_list, get, is_mapping
from .remedy import listing, message

# Every resource type whose `policy` input is a resource policy (pulumi-aws 7.x tokens).
RESOURCE_POLICY_TYPES = (
    tokens.BUCKET
    | tokens.BUCKET_POLICY
    | {
        tokens.KMS_KEY,
        tokens.KMS_KEY_POLICY,
        tokens.SQS_QUEUE,
        tokens.SQS_QUEUE_POLICY,
        tokens.SECRET,
        tokens.SECRET_POLICY,
        tokens.GLUE_RESOURCE_POLICY,
    }
)

# Condition keys that tie a caller to one account, organization, network endpoint or calling resource.
SCOPING_KEYS = (
    "aws:SourceArn",
    "aws:SourceAccount",
    "aws:SourceOwner",
    "aws:SourceOrgID",
    "aws:SourceOrgPaths",
    "aws:SourceVpc",
    "aws:SourceVpce",
    "aws:PrincipalOrgID",
    "aws:PrincipalOrgPaths",
    "aws:PrincipalAccount",
    "aws:PrincipalArn",
    "kms:CallerAccount",
)
# Operators that require the key to be present and equal (or like) the value. `...IfExists` passes when the
# key is missing, `ForAllValues:` passes on an empty set, `Not...` admits everything else: none of them scope.
_SCOPING_OPERATORS = {"stringequals", "stringequalsignorecase", "stringlike", "arnequals", "arnlike"}
# A wildcard value still scopes when what comes before the wildcard names an account or an organization.
_FIXED_PREFIX = re.compile(r"\d{12}|o-[a-z0-9]{10,32}")

CONFIG = PolicyConfigSchema(
    properties={
        "scopingConditionKeys": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "More condition keys that count as scoping a public or service principal "
            "(e.g. kms:EncryptionContext:aws:logs:arn), beside " + ", ".join(SCOPING_KEYS) + ".",
        },
    }
)


def _is_fixed(value: Any) -> bool:
    if not isinstance(value, str) or not value.strip():
        return False
    wildcard = re.search(r"[*?]", value)
    return wildcard is None or bool(_FIXED_PREFIX.search(value[: wildcard.start()]))


def is_scoped(statement: Statement, keys: set[str]) -> bool:
    """True when the Condition block pins one of `keys` (lowercase) to fixed values with a scoping operator."""
    for operator, block in statement.condition.items():
        operator = operator.lower().removeprefix("foranyvalue:")
        if operator not in _SCOPING_OPERATORS or not is_mapping(block):
            continue
        for key, values in block.items():
            values = as_list(values)
            if key.lower() in keys and values and all(_is_fixed(v) for v in values):
                return True
    return False


def public_principals(statement: Statement) -> list[str]:
    """The principals of a statement that stand for anyone: '*', NotPrincipal, or an AWS service."""
    if statement.has_not_principal:
        return ["NotPrincipal (everyone else)"]
    return [
        f"service {value}" if kind == "Service" else "Principal *"
        for kind, value in statement.principals
        if kind == "Service" or value == "*"
    ]


def _validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in RESOURCE_POLICY_TYPES:
        return
    document = get(args.props, "policy")
    if document is None:
        return
    kind = args.resource_type.split(":")[-1]
    keys = {k.lower() for k in (*SCOPING_KEYS, *args.get_config().get("scopingConditionKeys", []))}
    try:
        statements = parse(document)
    except DocumentError as error:
        report(
            message(
                f"The policy of {kind} '{args.name}' cannot be checked: {error}.",
                "give a JSON policy document with a Statement list.",
            )
        )
        return
    for statement in statements:
        who = public_principals(statement)
        if not statement.allows or not who or is_scoped(statement, keys):
            continue
        services_only = all(w.startswith("service ") for w in who)
        reach = (
            "every AWS customer's use of that service can reach it (confused deputy)"
            if services_only
            else "any AWS account (for S3, anyone at all) can reach it"
        )
        actions = listing(statement.actions) or "NotAction (everything else)"
        report(
            message(
                f"{kind} '{args.name}' allows {', '.join(who)} {actions} ({statement.label}) "
                f"with no condition that ties the caller to an account, organization or calling resource: {reach}.",
                "name the accounts or roles that need access instead of '*', and pin service principals with "
                "Condition {StringEquals: {'aws:SourceAccount': '<account id>'}}, {ArnLike: {'aws:SourceArn': "
                "'<calling resource ARN>'}} or {StringEquals: {'aws:PrincipalOrgID': 'o-...'}}.",
            )
        )


NO_PUBLIC_PRINCIPAL = ResourceValidationPolicy(
    name="resource-policy-no-public-principal",
    description="No resource policy (S3 bucket, KMS key, SQS queue, Secrets Manager secret, Glue catalog) allows "
    "Principal '*', NotPrincipal or an AWS service principal without a condition fixing the caller's "
    "account, organization or source ARN.",
    validate=_validate,
    config_schema=CONFIG,
    severity=Severity.CRITICAL,
    remediation_steps="Name the principals, or add an aws:SourceArn/aws:SourceAccount/aws:PrincipalOrgID condition.",
)

POLICIES = [NO_PUBLIC_PRINCIPAL]
