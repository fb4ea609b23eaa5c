"""Privilege escalation: identity policies that let whoever holds them gain more than they were given.

A role that may rewrite IAM policies, hand any role to a service it controls, or assume any role can make
itself an administrator of the account. icefloe's job role needs no IAM action at all and its schedule role
passes exactly one role, the stack's own job role (with an `iam:PassedToService` condition).

`iam-no-privilege-escalation` is a resource rule (it runs before the role or policy is created);
`iam-passrole-stack-roles` needs the whole stack to know which roles are the stack's own, so it is a stack
rule and, like the S3 rules, skips what preview cannot know yet (the roles' generated names and ARNs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatchcase

from pulumi_policy import (
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Severity,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from . import tokens
from .documents import DocumentError, Statement, parse
from .iam import IDENTITY_POLICY_TYPES, is_unscoped, policy_documents, policy_statements
from .props import known
from .remedy import listing, message
from .stack import of_type

# Actions that change what a principal may do, or mint credentials for one.
POLICY_WRITE_ACTIONS = [
    "iam:CreatePolicyVersion",
    "iam:SetDefaultPolicyVersion",
    "iam:AttachRolePolicy",
    "iam:AttachUserPolicy",
    "iam:AttachGroupPolicy",
    "iam:PutRolePolicy",
    "iam:PutUserPolicy",
    "iam:PutGroupPolicy",
    "iam:UpdateAssumeRolePolicy",
    "iam:PutRolePermissionsBoundary",
    "iam:DeleteRolePermissionsBoundary",
    "iam:PutUserPermissionsBoundary",
    "iam:DeleteUserPermissionsBoundary",
    "iam:AddUserToGroup",
    "iam:CreateAccessKey",
    "iam:CreateLoginProfile",
    "iam:UpdateLoginProfile",
]
PASS_ROLE, ASSUME_ROLE = "iam:PassRole", "sts:AssumeRole"

_ROLE_ARN = re.compile(r"^arn:aws[\w-]*:iam::(?P<account>[^:]*):role/(?P<path>.*)$")


def names_any_role(resource: str) -> bool:
    """'*', or an ARN that leaves the account or the whole role name open (role/*, role/service-role/*)."""
    match = _ROLE_ARN.match(resource)
    if match is None:
        return is_unscoped(resource)
    return match["account"] in ("", "*") or match["path"].rsplit("/", 1)[-1] in ("", "*")


def _any_role(statement: Statement) -> list[str]:
    return ["NotResource"] if statement.not_resources else [r for r in statement.resources if names_any_role(r)]


def _validate_escalation(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for label, statement in policy_statements(args, report, trust=False):
        writes = [a for a in POLICY_WRITE_ACTIONS if statement.grants(a)]
        if writes:
            report(
                message(
                    f"'{args.name}' may change IAM permissions ({listing(writes)}; "
                    f"{label}, {statement.label}), so whoever runs as it can grant itself administrator access.",
                    "remove the IAM write actions: icefloe's roles never change IAM; declare roles and policies in "
                    "the Pulumi program instead.",
                )
            )
        anywhere = _any_role(statement)
        if anywhere and statement.grants(PASS_ROLE):
            report(
                message(
                    f"'{args.name}' may pass any role (iam:PassRole on {', '.join(anywhere)}; {label}, {statement.label}), "
                    "so it can hand a more powerful role to a service it starts.",
                    "scope Resource to the stack's job role ARN and add Condition {StringEquals: "
                    "{'iam:PassedToService': 'emr-serverless.amazonaws.com'}}.",
                )
            )
        if anywhere and statement.grants(ASSUME_ROLE):
            report(
                message(
                    f"'{args.name}' may assume any role (sts:AssumeRole on {', '.join(anywhere)}; {label}, "
                    f"{statement.label}), including roles with more permissions than its own.",
                    "list the ARNs of the roles it needs to assume.",
                )
            )


# --- PassRole on roles the stack does not declare ---------------------------------------------------------------

STACK_ROLES_CONFIG = PolicyConfigSchema(
    properties={
        "allowedRoleArns": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "Roles outside the stack that its policies may pass (ARN patterns, * allowed), "
            "e.g. a shared EMR runtime role.",
        },
    }
)


def _stack_roles(resources: Iterable[PolicyResource]) -> tuple[set[str], set[str], bool]:
    """(ARNs, names, all known) of the roles the stack declares; a role's id is its name."""
    arns, names, complete = set(), set(), True
    for role in of_type(resources, [tokens.IAM_ROLE]):
        arn, name = known(role.props, "arn"), known(role.props, "name", default=known(role.props, "id"))
        arns.update([arn] if isinstance(arn, str) else [])
        names.update([name] if isinstance(name, str) else [])
        complete &= isinstance(arn, str) or isinstance(name, str)
    return arns, names, complete


def _known_statements(resource: PolicyResource) -> list[tuple[str, Statement]]:
    """Statements of a resource's permission documents; none while a document is unknown (preview) or
    malformed (the resource rules report that)."""
    try:
        return [
            (label, statement)
            for label, document in policy_documents(resource, trust=False)
            if document is not None
            for statement in parse(document)
        ]
    except (UnknownValueError, DocumentError):
        return []


def _validate_stack_roles(args: StackValidationArgs, report: ReportViolation) -> None:
    arns, names, complete = _stack_roles(args.resources)
    allowed = [str(a) for a in args.get_config().get("allowedRoleArns", [])]

    def owned(resource: str) -> bool | None:
        match = _ROLE_ARN.match(resource)
        if resource in arns or (match and match["path"].rsplit("/", 1)[-1] in names):
            return True
        if any(fnmatchcase(resource, pattern) for pattern in allowed):
            return True
        return False if complete else None  # a role whose name is not known yet may be this one

    for resource in of_type(args.resources, IDENTITY_POLICY_TYPES | {tokens.IAM_ROLE}):
        for label, statement in _known_statements(resource):
            if not statement.grants(PASS_ROLE) or statement.not_resources:
                continue  # NotResource is iam-no-privilege-escalation's
            foreign = [r for r in statement.resources if not names_any_role(r) and owned(r) is False]
            if foreign:
                report(
                    message(
                        f"'{resource.name}' may pass role(s) the stack does not declare ({', '.join(foreign)}; {label}, "
                        f"{statement.label}), handing their permissions to whatever service it starts.",
                        "pass only roles this stack creates (use the role's arn output), or list a shared role in "
                        "this rule's allowedRoleArns config.",
                    ),
                    resource.urn,
                )


NO_PRIVILEGE_ESCALATION = ResourceValidationPolicy(
    name="iam-no-privilege-escalation",
    description="No IAM policy allows IAM policy writes (iam:CreatePolicyVersion, iam:AttachRolePolicy, "
    "iam:PutRolePolicy, ...), iam:PassRole on any role, or sts:AssumeRole on any role.",
    validate=_validate_escalation,
    severity=Severity.CRITICAL,
    remediation_steps="Remove IAM write actions; scope iam:PassRole and sts:AssumeRole to named role ARNs.",
)
PASSROLE_STACK_ROLES = StackValidationPolicy(
    name="iam-passrole-stack-roles",
    description="iam:PassRole names only roles the stack declares (or roles listed in allowedRoleArns).",
    validate=_validate_stack_roles,
    config_schema=STACK_ROLES_CONFIG,
    severity=Severity.HIGH,
    remediation_steps="Pass only the stack's own roles, or allow a shared role in the rule's config.",
)

POLICIES = [NO_PRIVILEGE_ESCALATION, PASSROLE_STACK_ROLES]
