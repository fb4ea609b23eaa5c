"""IAM: who may assume a role, and what a policy may do where.

Documents come from roles (trust policy and inline policies), role/user/group policies and managed
policies, as JSON strings or objects.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from pulumi_policy import (
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Severity,
)

from . import tokens
from .documents import DocumentError, Statement, covers, parse
from .props import as_list, get
from .remedy import listing, message

IDENTITY_POLICY_TYPES = {tokens.IAM_ROLE_POLICY, tokens.IAM_POLICY, tokens.IAM_USER_POLICY, tokens.IAM_GROUP_POLICY}

# Data-plane writes that must name the buckets/tables they touch.
DATA_WRITE_ACTIONS = [
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:PutObjectAcl",
    "s3:RestoreObject",
    "s3:AbortMultipartUpload",
    "glue:CreateDatabase",
    "glue:UpdateDatabase",
    "glue:DeleteDatabase",
    "glue:CreateTable",
    "glue:UpdateTable",
    "glue:DeleteTable",
    "glue:BatchDeleteTable",
    "glue:DeleteTableVersion",
    "glue:BatchDeleteTableVersion",
    "glue:CreatePartition",
    "glue:BatchCreatePartition",
    "glue:UpdatePartition",
    "glue:BatchUpdatePartition",
    "glue:DeletePartition",
    "glue:BatchDeletePartition",
    # S3 Tables: table data, metadata commits, tables and namespaces.
    "s3tables:PutTableData",
    "s3tables:UpdateTableMetadataLocation",
    "s3tables:CreateTable",
    "s3tables:DeleteTable",
    "s3tables:RenameTable",
    "s3tables:CreateNamespace",
    "s3tables:DeleteNamespace",
    # Amazon MSK (IAM access control): producing, and changing topics and groups.
    "kafka-cluster:WriteData",
    "kafka-cluster:CreateTopic",
    "kafka-cluster:AlterTopic",
    "kafka-cluster:DeleteTopic",
    "kafka-cluster:AlterGroup",
    "kafka-cluster:DeleteGroup",
]
# The first path element of ARNs that name a kind before the name: Glue's table/database/..., S3 Tables'
# bucket/<name>, MSK's cluster|topic|group/<cluster name>/...
_KIND_PREFIXES = {
    "table",
    "database",
    "userDefinedFunction",
    "connection",
    "bucket",
    "cluster",
    "topic",
    "group",
    "transactional-id",
}

# AWS managed policies that amount to "*" or "<service>:*".
_BROAD_MANAGED_POLICY = re.compile(
    r"^arn:aws[\w-]*:iam::aws:policy/(.*/)?(AdministratorAccess|PowerUserAccess|\w*FullAccess)$"
)
_ARN_ACCOUNT = re.compile(r"^arn:aws[\w-]*:(?:iam|sts)::(\d{12}):")

ACCOUNT_CONFIG = PolicyConfigSchema(
    properties={
        "accountId": {
            "type": "string",
            "pattern": "^[0-9]{12}$",
            "description": "The stack's AWS account; principals of other accounts are external. "
            "Unset: every AWS-account principal counts as external.",
        },
    }
)


# --- where the documents are ------------------------------------------------------------------------------


def policy_documents(args: ResourceValidationArgs | PolicyResource, trust: bool) -> Iterator[tuple[str, object]]:
    """(label, document) pairs: the trust policy when `trust`, else the permission documents.

    Works on a resource rule's args and on a stack's PolicyResource alike (both carry type and props)."""
    if args.resource_type == tokens.IAM_ROLE:
        if trust:
            yield "trust policy", get(args.props, "assumeRolePolicy")
        else:
            for i, inline in enumerate(as_list(get(args.props, "inlinePolicies", default=[]))):
                yield f"inline policy '{get(inline, 'name', default=i)}'", get(inline, "policy")
    elif args.resource_type in IDENTITY_POLICY_TYPES and not trust:
        yield "policy", get(args.props, "policy")


def policy_statements(
    args: ResourceValidationArgs, report: ReportViolation, trust: bool
) -> Iterator[tuple[str, Statement]]:
    """(label, statement) pairs of the resource's documents; a document that cannot be parsed is reported."""
    for label, document in policy_documents(args, trust):
        if document is None:
            continue
        try:
            for statement in parse(document):
                yield label, statement
        except DocumentError as error:
            report(
                message(
                    f"The {label} of '{args.name}' cannot be checked: {error}.",
                    "give a JSON policy document with a Statement list.",
                )
            )


# --- principals ---------------------------------------------------------------------------------------------


def principal_account(principal: str) -> str | None:
    """Account id of an AWS principal (`123456789012` or an iam/sts ARN), None if it names none."""
    if re.fullmatch(r"\d{12}", principal):
        return principal
    match = _ARN_ACCOUNT.match(principal)
    return match.group(1) if match else None


def is_external(principal: str, own_account: str | None) -> bool:
    """An AWS principal outside the stack's account. Without a known own account every account
    principal is external; a principal that names no account (e.g. a unique id) cannot be shown to be
    internal, so it is external too."""
    account = principal_account(principal)
    return own_account is None or account != own_account


def _assumes_role(statement: Statement) -> bool:
    return covers(statement.actions, "sts:AssumeRole")


def _requires_external_id(statement: Statement) -> bool:
    values = statement.condition_values("StringEquals", "sts:ExternalId")
    return bool(values) and all(isinstance(v, str) and v.strip() for v in values)


def _validate_external_id(args: ResourceValidationArgs, report: ReportViolation) -> None:
    own_account = args.get_config().get("accountId")
    for label, statement in policy_statements(args, report, trust=True):
        if not statement.allows or not _assumes_role(statement):
            continue
        # Only AWS principals: service principals are AWS itself, and web-identity/SAML federation
        # (AssumeRoleWithWebIdentity/SAML) has no ExternalId and needs an identity provider in this account.
        external = [p for kind, p in statement.principals if kind == "AWS" and is_external(p, own_account)]
        if external and not _requires_external_id(statement):
            report(
                message(
                    f"Role '{args.name}' lets {', '.join(external)} assume it ({label}, {statement.label}) without "
                    "an ExternalId, so any other customer of that account's service can reach your data "
                    "(confused deputy).",
                    "add Condition {StringEquals: {'sts:ExternalId': '<the id the service gave you>'}} to the "
                    "statement (and set this rule's accountId config so principals of your own account are "
                    "recognised).",
                )
            )


def _validate_wildcard_principal(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for trust in (True, False):
        for label, statement in policy_statements(args, report, trust=trust):
            if not statement.allows:
                continue
            if ("AWS", "*") in statement.principals or statement.has_not_principal:
                report(
                    message(
                        f"'{args.name}' allows any AWS principal ({label}, {statement.label}: "
                        f"{'NotPrincipal' if statement.has_not_principal else 'Principal *'}).",
                        "name the accounts, roles or services that need access instead of '*'.",
                    )
                )


# --- actions and resources --------------------------------------------------------------------------------


def _is_wildcard_action(action: str) -> bool:
    return action == "*" or bool(re.fullmatch(r"[\w-]+:\*", action))


def _validate_wildcard_actions(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for label, statement in policy_statements(args, report, trust=False):
        if not statement.allows:
            continue
        broad = [a for a in statement.actions if _is_wildcard_action(a)]
        if broad or statement.not_actions:
            what = ", ".join(broad) if broad else "NotAction (everything else)"
            report(
                message(
                    f"'{args.name}' grants every action of a service ({label}, {statement.label}: {what}), "
                    "including writes and deletes.",
                    "list the actions the job needs, e.g. s3:GetObject, s3:PutObject, glue:GetTable, glue:UpdateTable.",
                )
            )
    for arn in _managed_policy_arns(args):
        if _BROAD_MANAGED_POLICY.match(arn):
            report(
                message(
                    f"'{args.name}' attaches the AWS managed policy {arn}, which grants whole services.",
                    "attach a policy that lists the needed actions on the stack's own resources.",
                )
            )


def _managed_policy_arns(args: ResourceValidationArgs) -> list[str]:
    if args.resource_type == tokens.IAM_ROLE:
        return [str(a) for a in as_list(get(args.props, "managedPolicyArns", default=[]))]
    if args.resource_type == tokens.IAM_ROLE_POLICY_ATTACHMENT:
        return [str(get(args.props, "policyArn", default=""))]
    return []


def is_unscoped(resource: str) -> bool:
    """'*' or an ARN that names no bucket/database/table/cluster: arn:aws:s3:::*, arn:aws:glue:*:*:table/*,
    arn:aws:s3tables:*:*:bucket/*, arn:aws:kafka:*:*:topic/*/*/*."""
    if resource == "*":
        return True
    parts = resource.split(":", 5)
    if len(parts) < 6 or parts[0] != "arn":
        return False
    path = re.split(r"[/:]", parts[5])
    if path[0] in _KIND_PREFIXES and len(path) > 1:
        path = path[1:]
    return path[0] == "*"


def _writes(statement: Statement) -> list[str]:
    return [w for w in DATA_WRITE_ACTIONS if covers(statement.actions, w)]


def _validate_unscoped_writes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for label, statement in policy_statements(args, report, trust=False):
        if not statement.allows:
            continue
        writes = _writes(statement)
        unscoped = [r for r in statement.resources if is_unscoped(r)]
        if writes and (unscoped or statement.not_resources):
            report(
                message(
                    f"'{args.name}' allows data writes ({listing(writes)}) "
                    f"on every resource ({label}, {statement.label}).",
                    "scope Resource to the stack's bucket (arn:aws:s3:::<bucket>/*) and its Glue catalog, "
                    "database and table ARNs (S3 Tables: the table bucket's ARN; MSK: the cluster's topics).",
                )
            )


EXTERNAL_ID = ResourceValidationPolicy(
    name="iam-external-trust-requires-external-id",
    description="A role that AWS principals outside the stack's account may assume requires a "
    "StringEquals sts:ExternalId condition.",
    validate=_validate_external_id,
    config_schema=ACCOUNT_CONFIG,
    severity=Severity.CRITICAL,
    remediation_steps="Add Condition {StringEquals: {sts:ExternalId: ...}} to the trust statement.",
)
NO_WILDCARD_PRINCIPAL = ResourceValidationPolicy(
    name="iam-no-wildcard-principal",
    description="No IAM policy allows Principal '*' (or {AWS: '*'}, or NotPrincipal).",
    validate=_validate_wildcard_principal,
    severity=Severity.CRITICAL,
    remediation_steps="Name the principals that need access.",
)
NO_WILDCARD_ACTIONS = ResourceValidationPolicy(
    name="iam-no-wildcard-actions",
    description="No IAM policy allows Action '*', a whole service ('s3:*', 'glue:*'), NotAction, or attaches an "
    "AWS managed full-access policy.",
    validate=_validate_wildcard_actions,
    severity=Severity.HIGH,
    remediation_steps="List the needed actions explicitly.",
)
NO_UNSCOPED_WRITES = ResourceValidationPolicy(
    name="iam-no-unscoped-data-writes",
    description="No IAM policy allows S3 object, Glue catalog, S3 Tables or MSK writes on Resource '*' (or an ARN "
    "naming no bucket/table/cluster).",
    validate=_validate_unscoped_writes,
    severity=Severity.HIGH,
    remediation_steps="Scope Resource to the stack's bucket and Glue ARNs.",
)

POLICIES = [EXTERNAL_ID, NO_WILDCARD_PRINCIPAL, NO_WILDCARD_ACTIONS, NO_UNSCOPED_WRITES]
