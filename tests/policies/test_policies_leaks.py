"""The pack's rules against leaks beside IAM roles (issue 14): resource policies with public or unscoped service
principals, privilege escalation, public ACLs and object ownership, long-lived IAM user credentials.

Each rule is called the way the engine calls it (helpers from test_policies), with violating cases, the allowed
look-alikes and preview-time unknowns; then the real Pulumi program under mocks passes the whole pack, and an unsafe
variant of it per class is rejected by the rule that names that class.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from icefloe_policies import TAG_ROLE, escalation, iam_users, resource_policies, s3_acls
from icefloe_policies.runner import Resource, run_pack
from pulumi_mocks import ACCOUNT_ID, run_program
from test_policies import (
    ACCOUNT,
    BUCKET,
    BUCKET_ARN,
    BUCKET_NAME,
    OWNERSHIP,
    ROLE,
    ROLE_POLICY,
    TAGS,
    bucket_resources,
    check,
    check_stack,
    doc,
    replace,
    safe_stack,
    trust,
    urn,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "Pulumi.example.yaml"
MINIMAL = ROOT / "examples" / "Pulumi.minimal.yaml"
JOB_ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/icefloe-job-role"
TO_EMR = {"StringEquals": {"iam:PassedToService": "emr-serverless.amazonaws.com"}}


def allow(principal, action, resource="*", condition: dict | None = None, effect: str = "Allow") -> dict:
    statement = {"Effect": effect, "Principal": principal, "Action": action, "Resource": resource}
    return {**statement, "Condition": condition} if condition else statement


def preview_diagnostics(policy, resource: Resource) -> list:
    """What the engine reports for one resource rule during preview: 'can't run policy' diagnostics."""
    return run_pack([resource], policies=[policy])


# --- resource policies -----------------------------------------------------------------------------------------

# Every resource type whose `policy` input is a resource policy, with the other inputs it needs and an action
# that reads its data.
RESOURCE_POLICY_HOLDERS = [
    ("aws:s3/bucketPolicy:BucketPolicy", {"bucket": BUCKET_NAME}, "s3:GetObject"),
    ("aws:s3/bucket:Bucket", {"bucket": BUCKET_NAME}, "s3:GetObject"),
    ("aws:kms/key:Key", {"enableKeyRotation": True}, "kms:Decrypt"),
    ("aws:kms/keyPolicy:KeyPolicy", {"keyId": "k1"}, "kms:Decrypt"),
    ("aws:sqs/queue:Queue", {}, "sqs:SendMessage"),
    ("aws:sqs/queuePolicy:QueuePolicy", {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q"}, "sqs:SendMessage"),
    ("aws:secretsmanager/secret:Secret", {"name": "icefloe/dev/kafka"}, "secretsmanager:GetSecretValue"),
    (
        "aws:secretsmanager/secretPolicy:SecretPolicy",
        {"secretArn": "arn:aws:secretsmanager:x"},
        "secretsmanager:GetSecretValue",
    ),
    ("aws:glue/resourcePolicy:ResourcePolicy", {}, "glue:GetTable"),
]
SOURCE_ARN = {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{BUCKET_NAME}"}}
SOURCE_ACCOUNT = {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
ORG = {"StringEquals": {"aws:PrincipalOrgID": "o-a1b2c3d4e5"}}
SNS = {"Service": "sns.amazonaws.com"}


def holder_check(type_token: str, inputs: dict, *statements: dict, config: dict | None = None) -> list[str]:
    return check(resource_policies.NO_PUBLIC_PRINCIPAL, type_token, {**inputs, "policy": doc(*statements)}, config)


@pytest.mark.parametrize("type_token, inputs, action", RESOURCE_POLICY_HOLDERS)
@pytest.mark.parametrize(
    "principal, condition, violates",
    [
        ("*", None, True),
        ({"AWS": "*"}, None, True),
        ({"AWS": [f"arn:aws:iam::{ACCOUNT}:root", "*"]}, None, True),
        (SNS, None, True),  # confused deputy: any account's topic could deliver
        (SNS, SOURCE_ARN, False),
        (SNS, SOURCE_ACCOUNT, False),
        ("*", ORG, False),
        ({"AWS": f"arn:aws:iam::{ACCOUNT}:role/reader"}, None, False),
        ({"AWS": "arn:aws:iam::999988887777:root"}, None, False),  # cross-account, not public: another rule's concern
    ],
)
def test_resource_policies_admit_no_one_at_large(type_token, inputs, action, principal, condition, violates):
    found = holder_check(type_token, inputs, allow(principal, action, condition=condition))
    assert bool(found) is violates
    if violates:
        assert len(found) == 1 and type_token.split(":")[-1] in found[0] and action in found[0]


@pytest.mark.parametrize(
    "condition",
    [
        {"StringEqualsIfExists": {"aws:SourceAccount": ACCOUNT}},  # passes when the key is missing
        {"StringNotEquals": {"aws:SourceAccount": "999988887777"}},
        {"ForAllValues:StringEquals": {"aws:PrincipalOrgID": ["o-a1b2c3d4e5"]}},  # true for an empty set
        {"ArnLike": {"aws:SourceArn": "arn:aws:s3:::*"}},  # any bucket, anyone's
        {"StringLike": {"aws:SourceAccount": "*"}},
        {"StringEquals": {"aws:SourceAccount": []}},
        {"Bool": {"aws:SecureTransport": "true"}},  # says how, not who
    ],
)
def test_conditions_that_do_not_pin_the_caller_do_not_scope(condition):
    statement = allow("*", "s3:GetObject", condition=condition)
    assert len(holder_check("aws:s3/bucketPolicy:BucketPolicy", {}, statement)) == 1


@pytest.mark.parametrize(
    "condition",
    [
        {"ArnLike": {"aws:SourceArn": f"arn:aws:logs:eu-west-1:{ACCOUNT}:log-group:*"}},  # account fixed
        {"ForAnyValue:StringLike": {"aws:PrincipalOrgPaths": ["o-a1b2c3d4e5/r-ab12/ou-ab12-11111111/*"]}},
        {"StringEquals": {"aws:sourceaccount": ACCOUNT}},  # condition keys are case-insensitive
        {"StringEquals": {"aws:SourceVpce": "vpce-1a2b3c4d"}},
    ],
)
def test_fixed_accounts_organizations_and_endpoints_scope(condition):
    assert holder_check("aws:sqs/queuePolicy:QueuePolicy", {}, allow(SNS, "sqs:SendMessage", condition=condition)) == []


def test_not_principal_and_deny_statements():
    not_principal = {
        "Effect": "Allow",
        "NotPrincipal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
        "Action": "kms:Decrypt",
        "Resource": "*",
    }
    assert len(holder_check("aws:kms/key:Key", {}, not_principal)) == 1
    assert holder_check("aws:kms/key:Key", {}, allow("*", "kms:*", effect="Deny")) == []


def test_safe_lakehouse_bucket_policy_with_its_tls_deny_passes():
    bucket_policy = next(r for r in bucket_resources() if r.type == "aws:s3/bucketPolicy:BucketPolicy")
    assert check(resource_policies.NO_PUBLIC_PRINCIPAL, bucket_policy.type, bucket_policy.inputs) == []


def test_each_public_statement_is_reported_and_named():
    found = holder_check(
        "aws:s3/bucketPolicy:BucketPolicy",
        {},
        {**allow("*", "s3:GetObject", f"{BUCKET_ARN}/*"), "Sid": "PublicRead"},
        allow({"Service": "logging.s3.amazonaws.com"}, "s3:PutObject"),
    )
    assert len(found) == 2
    assert "statement 'PublicRead'" in found[0] and "Principal *" in found[0] and "anyone" in found[0]
    assert "service logging.s3.amazonaws.com" in found[1] and "confused deputy" in found[1]
    assert all(" Fix: " in f and "aws:SourceArn" in f for f in found)


def test_more_scoping_keys_can_be_configured():
    # CloudWatch Logs' documented key policy pins the log group through the encryption context.
    statement = allow(
        {"Service": "logs.eu-west-1.amazonaws.com"},
        ["kms:Encrypt*", "kms:Decrypt*"],
        condition={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": f"arn:aws:logs:eu-west-1:{ACCOUNT}:log-group:*"}},
    )
    assert len(holder_check("aws:kms/key:Key", {}, statement)) == 1
    config = {"scopingConditionKeys": ["kms:EncryptionContext:aws:logs:arn"]}
    assert holder_check("aws:kms/key:Key", {}, statement, config=config) == []


def test_resource_policy_that_is_not_json_cannot_pass():
    found = check(resource_policies.NO_PUBLIC_PRINCIPAL, "aws:glue/resourcePolicy:ResourcePolicy", {"policy": "{x"})
    assert len(found) == 1 and "cannot be checked" in found[0]


def test_resources_without_a_policy_and_other_types_are_left_alone():
    assert check(resource_policies.NO_PUBLIC_PRINCIPAL, "aws:sqs/queue:Queue", {"name": "dlq"}) == []
    policy = {"policy": doc(allow("*", "sns:Publish"))}  # SNS is not a type this rule covers
    assert check(resource_policies.NO_PUBLIC_PRINCIPAL, "aws:sns/topicPolicy:TopicPolicy", policy) == []


def test_unknown_resource_policy_is_checked_again_at_update():
    found = preview_diagnostics(
        resource_policies.NO_PUBLIC_PRINCIPAL,
        Resource("aws:s3/bucketPolicy:BucketPolicy", "later", {"bucket": BUCKET_NAME, "policy": UNKNOWN_STRING_VALUE}),
    )
    assert [(v.level, "can't run policy" in v.message) for v in found] == [("advisory", True)]


# --- privilege escalation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action, resource, condition, violates",
    [
        ("iam:PassRole", "*", None, True),
        ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/*", None, True),
        ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/service-role/*", None, True),
        ("iam:PassRole", "arn:aws:iam::*:role/icefloe-job-role", None, True),
        ("iam:Pass*", "*", None, True),
        ("iam:PassRole", JOB_ROLE_ARN, TO_EMR, False),  # the schedule role's own grant
        ("sts:AssumeRole", "*", None, True),
        ("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/*", None, True),
        ("sts:AssumeRole", "arn:aws:iam::999988887777:role/reader", None, False),
        ("iam:CreatePolicyVersion", f"arn:aws:iam::{ACCOUNT}:policy/icefloe-job", None, True),
        ("iam:SetDefaultPolicyVersion", "*", None, True),
        ("iam:AttachRolePolicy", JOB_ROLE_ARN, None, True),
        ("iam:PutRolePolicy", JOB_ROLE_ARN, None, True),
        ("iam:Put*", "*", None, True),
        ("iam:CreateAccessKey", "*", None, True),
        ("iam:GetRole", "*", None, False),
        ("iam:List*", "*", None, False),
    ],
)
@pytest.mark.parametrize("type_token", [ROLE_POLICY, "aws:iam/policy:Policy", "aws:iam/userPolicy:UserPolicy"])
def test_no_privilege_escalation(action, resource, condition, violates, type_token):
    statement = {"Effect": "Allow", "Action": action, "Resource": resource}
    policy = doc({**statement, "Condition": condition} if condition else statement)
    found = check(escalation.NO_PRIVILEGE_ESCALATION, type_token, {"policy": policy})
    assert bool(found) is violates
    assert all(" Fix: " in f for f in found)


def test_not_action_and_not_resource_escalate_too():
    everything_but_s3 = doc({"Effect": "Allow", "NotAction": "s3:*", "Resource": "*"})
    found = check(escalation.NO_PRIVILEGE_ESCALATION, ROLE_POLICY, {"policy": everything_but_s3})
    assert {f.split(" (")[0] for f in found} == {
        "'subject' may change IAM permissions",
        "'subject' may pass any role",
        "'subject' may assume any role",
    }
    not_resource = doc({"Effect": "Allow", "Action": "iam:PassRole", "NotResource": JOB_ROLE_ARN})
    [found] = check(escalation.NO_PRIVILEGE_ESCALATION, ROLE_POLICY, {"policy": not_resource})
    assert "iam:PassRole on NotResource" in found
    except_iam = doc({"Effect": "Allow", "NotAction": ["iam:*", "sts:*"], "Resource": "*"})
    assert check(escalation.NO_PRIVILEGE_ESCALATION, ROLE_POLICY, {"policy": except_iam}) == []


def test_deny_and_role_inline_policies():
    deny = doc({"Effect": "Deny", "Action": "iam:*", "Resource": "*"})
    assert check(escalation.NO_PRIVILEGE_ESCALATION, ROLE_POLICY, {"policy": deny}) == []
    inline = [{"name": "escalate", "policy": doc({"Effect": "Allow", "Action": "iam:PutRolePolicy", "Resource": "*"})}]
    [found] = check(
        escalation.NO_PRIVILEGE_ESCALATION,
        ROLE,
        {"assumeRolePolicy": trust({"Service": "x"}), "inlinePolicies": inline},
    )
    assert "inline policy 'escalate'" in found and "iam:PutRolePolicy" in found


def test_unknown_identity_policy_is_checked_again_at_update():
    found = preview_diagnostics(
        escalation.NO_PRIVILEGE_ESCALATION,
        Resource(ROLE_POLICY, "later", {"role": "r", "policy": UNKNOWN_STRING_VALUE}),
    )
    assert [(v.level, "can't run policy" in v.message) for v in found] == [("advisory", True)]


# --- PassRole on the stack's own roles -------------------------------------------------------------------------


def job_role(**outputs) -> Resource:
    return Resource(
        ROLE,
        "job-role",
        {"assumeRolePolicy": trust({"Service": "emr-serverless.amazonaws.com"})},
        id="icefloe-job-role",
        outputs={"arn": JOB_ROLE_ARN, "name": "icefloe-job-role", **outputs},
    )


def passes(*resources: str, condition: dict | None = TO_EMR, policy=None) -> Resource:
    statement = {"Effect": "Allow", "Action": "iam:PassRole", "Resource": list(resources)}
    return Resource(
        ROLE_POLICY,
        "scheduler-policy",
        {
            "role": "scheduler",
            "policy": policy or doc({**statement, "Condition": condition} if condition else statement),
        },
    )


def stack_roles_findings(stack: list[Resource], config: dict | None = None) -> list[str]:
    return [
        v.message
        for v in run_pack(
            stack, {"iam-passrole-stack-roles": config} if config else None, policies=[escalation.PASSROLE_STACK_ROLES]
        )
    ]


@pytest.mark.parametrize(
    "resource, violates",
    [
        (JOB_ROLE_ARN, False),
        (f"arn:aws:iam::{ACCOUNT}:role/service-role/icefloe-job-role", False),  # the same role, under a path
        (f"arn:aws:iam::{ACCOUNT}:role/someone-elses-admin", True),
        (f"arn:aws:iam::{ACCOUNT}:role/icefloe-*", True),  # a prefix the stack cannot vouch for
        ("*", False),  # iam-no-privilege-escalation's
    ],
)
def test_passrole_names_only_the_stacks_roles(resource, violates):
    found = stack_roles_findings([job_role(), passes(resource)])
    assert bool(found) is violates
    if violates:
        assert resource in found[0] and "allowedRoleArns" in found[0]


def test_passrole_violation_points_at_the_policy():
    [violation] = run_pack(
        [job_role(), passes(f"arn:aws:iam::{ACCOUNT}:role/admin")], policies=[escalation.PASSROLE_STACK_ROLES]
    )
    assert violation.urn == urn(ROLE_POLICY, "scheduler-policy") and violation.level == "mandatory"


def test_a_shared_role_can_be_allowed_by_config():
    shared = f"arn:aws:iam::{ACCOUNT}:role/shared/EMR_DefaultRole"
    assert len(stack_roles_findings([job_role(), passes(shared)])) == 1
    config = {"allowedRoleArns": [f"arn:aws:iam::{ACCOUNT}:role/shared/*"]}
    assert stack_roles_findings([job_role(), passes(shared)], config) == []


def test_passrole_is_left_to_the_update_while_preview_cannot_tell():
    unnamed = Resource(
        ROLE,
        "job-role",
        {"assumeRolePolicy": trust({"Service": "x"})},
        outputs={"arn": UNKNOWN_STRING_VALUE, "name": UNKNOWN_STRING_VALUE},
    )
    assert stack_roles_findings([unnamed, passes(f"arn:aws:iam::{ACCOUNT}:role/admin")]) == []
    assert stack_roles_findings([job_role(), passes(policy=UNKNOWN_STRING_VALUE)]) == []


# --- public ACLs and object ownership --------------------------------------------------------------------------

ACL_V2, ACL = "aws:s3/bucketAclV2:BucketAclV2", "aws:s3/bucketAcl:BucketAcl"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTHENTICATED_USERS = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"


def acl_grants(*grants: tuple[dict, str], bucket: str = BUCKET_NAME) -> dict:
    return {
        "bucket": bucket,
        "accessControlPolicy": {
            "owner": {"id": "owner-canonical-id"},
            "grants": [{"grantee": grantee, "permission": permission} for grantee, permission in grants],
        },
    }


@pytest.mark.parametrize(
    "type_token, props, violates",
    [
        (ACL_V2, {"bucket": BUCKET_NAME, "acl": "public-read"}, True),
        (ACL, {"bucket": BUCKET_NAME, "acl": "public-read-write"}, True),
        (ACL, {"bucket": BUCKET_NAME, "acl": "authenticated-read"}, True),
        (ACL, {"bucket": BUCKET_NAME, "acl": "private"}, False),
        (ACL, {"bucket": BUCKET_NAME, "acl": "bucket-owner-full-control"}, False),
        (ACL, {"bucket": BUCKET_NAME, "acl": "log-delivery-write"}, False),  # the S3 log delivery group only
        (ACL_V2, acl_grants(({"type": "Group", "uri": ALL_USERS}, "READ")), True),
        (
            ACL,
            acl_grants(
                ({"type": "CanonicalUser", "id": "owner-canonical-id"}, "FULL_CONTROL"),
                ({"type": "Group", "uri": AUTHENTICATED_USERS}, "WRITE"),
            ),
            True,
        ),
        (ACL, acl_grants(({"type": "CanonicalUser", "id": "owner-canonical-id"}, "FULL_CONTROL")), False),
        (BUCKET, {"bucket": BUCKET_NAME, "acl": "public-read"}, True),
        (
            BUCKET,
            {"bucket": BUCKET_NAME, "grants": [{"type": "Group", "uri": ALL_USERS, "permissions": ["READ"]}]},
            True,
        ),
        (
            BUCKET,
            {"bucket": BUCKET_NAME, "grants": [{"type": "CanonicalUser", "id": "abc", "permissions": ["READ"]}]},
            False,
        ),
        (BUCKET, {"bucket": BUCKET_NAME, "tags": TAGS}, False),
        (OBJECT, {"bucket": BUCKET_NAME, "key": "warehouse/x.parquet", "acl": "public-read"}, True),
        ("aws:s3/bucketObject:BucketObject", {"bucket": BUCKET_NAME, "key": "k", "acl": "private"}, False),
    ],
)
def test_no_public_acls(type_token, props, violates):
    found = check(s3_acls.NO_PUBLIC_ACL, type_token, props)
    assert bool(found) is violates
    if violates:
        assert len(found) == 1 and " Fix: " in found[0] and ("canned ACL" in found[0] or "group" in found[0])


def test_unknown_acl_is_checked_again_at_update():
    found = preview_diagnostics(
        s3_acls.NO_PUBLIC_ACL, Resource(ACL_V2, "later", {"bucket": BUCKET_NAME, "acl": UNKNOWN_STRING_VALUE})
    )
    assert [(v.level, "can't run policy" in v.message) for v in found] == [("advisory", True)]


def ownership(setting) -> Resource:
    return Resource(OWNERSHIP, "lake-ownership", {"bucket": BUCKET_NAME, "rule": {"objectOwnership": setting}})


@pytest.mark.parametrize(
    "setting, violates",
    [
        ("BucketOwnerEnforced", False),
        ("BucketOwnerPreferred", True),
        ("ObjectWriter", True),
        (UNKNOWN_STRING_VALUE, False),  # computed: checked when known
    ],
)
def test_lakehouse_bucket_ownership_is_enforced(setting, violates):
    found = check_stack(s3_acls.OWNER_ENFORCED, replace(bucket_resources(), "lake-ownership", ownership(setting)))
    assert [u for _, u in found] == ([urn(OWNERSHIP, "lake-ownership")] if violates else [])


def test_a_bucket_tagged_with_another_role_may_keep_acls():
    logs_bucket = bucket_resources(tags={**TAGS, TAG_ROLE: "access-logs"})
    assert check_stack(s3_acls.OWNER_ENFORCED, replace(logs_bucket, "lake-ownership", ownership("ObjectWriter"))) == []


def test_a_lakehouse_bucket_without_ownership_controls_is_an_advisory_finding():
    stack = replace(safe_stack(), "lake-ownership", None)
    [violation] = run_pack(stack)
    assert (violation.policy, violation.level, violation.urn) == (
        "s3-bucket-ownership-declared",
        "advisory",
        urn(BUCKET, "lake"),
    )
    assert "BucketOwnerEnforced" in violation.message


def test_ownership_links_to_a_new_bucket_by_property_dependencies_in_preview():
    bucket_urn = urn(BUCKET, "lake")
    previewed = [
        Resource(BUCKET, "lake", {"tags": TAGS}),
        Resource(
            OWNERSHIP,
            "lake-ownership",
            {"bucket": UNKNOWN_STRING_VALUE, "rule": {"objectOwnership": "ObjectWriter"}},
            property_dependencies={"bucket": [bucket_urn]},
        ),
    ]
    assert len(check_stack(s3_acls.OWNER_ENFORCED, previewed)) == 1
    assert check_stack(s3_acls.OWNERSHIP_DECLARED, previewed) == []


# --- long-lived credentials ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "type_token, props, what",
    [
        ("aws:iam/accessKey:AccessKey", {"user": "ci"}, "an access key"),
        ("aws:iam/userLoginProfile:UserLoginProfile", {"user": "ci", "passwordLength": 32}, "a console password"),
        (
            "aws:iam/serviceSpecificCredential:ServiceSpecificCredential",
            {"userName": "ci", "serviceName": "codecommit.amazonaws.com"},
            "a service-specific password",
        ),
    ],
)
def test_iam_users_get_no_long_lived_credentials(type_token, props, what):
    [found] = check(iam_users.NO_LONG_LIVED_CREDENTIALS, type_token, props)
    assert f"IAM user 'ci' {what}" in found and " Fix: " in found


def test_a_user_alone_holds_no_credential():
    assert check(iam_users.NO_LONG_LIVED_CREDENTIALS, "aws:iam/user:User", {"name": "ci"}) == []


def test_a_key_for_a_user_created_in_the_same_preview_is_still_rejected():
    [violation] = run_pack(
        [Resource("aws:iam/accessKey:AccessKey", "key", {"user": UNKNOWN_STRING_VALUE})],
        policies=[iam_users.NO_LONG_LIVED_CREDENTIALS],
    )
    assert violation.level == "mandatory" and "gives an IAM user an access key" in violation.message


# --- levels and configuration ----------------------------------------------------------------------------------

UNSAFE_BY_RULE = {
    "resource-policy-no-public-principal": lambda: [
        *safe_stack(),
        Resource(
            "aws:s3/bucketPolicy:BucketPolicy",
            "public-read",
            {"bucket": BUCKET_NAME, "policy": doc(allow("*", "s3:GetObject", f"{BUCKET_ARN}/*"))},
        ),
    ],
    "iam-no-privilege-escalation": lambda: replace(
        safe_stack(),
        "job-role-policy",
        Resource(
            ROLE_POLICY,
            "job-role-policy",
            {"role": "job-role", "policy": doc({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*"})},
        ),
    ),
    "iam-passrole-stack-roles": lambda: [  # deployed: every role's id (its name) is known
        *(dataclasses.replace(r, id=r.name) if r.type == ROLE else r for r in safe_stack()),
        passes(f"arn:aws:iam::{ACCOUNT}:role/admin"),
    ],
    "s3-no-public-acl": lambda: [
        *safe_stack(),
        Resource(ACL_V2, "lake-acl", {"bucket": BUCKET_NAME, "acl": "public-read"}),
    ],
    "s3-bucket-owner-enforced": lambda: replace(safe_stack(), "lake-ownership", ownership("ObjectWriter")),
    "s3-bucket-ownership-declared": lambda: replace(safe_stack(), "lake-ownership", None),
    "iam-no-long-lived-credentials": lambda: [
        *safe_stack(),
        Resource("aws:iam/user:User", "ci", {"name": "ci"}),
        Resource("aws:iam/accessKey:AccessKey", "ci-key", {"user": "ci"}),
    ],
}


@pytest.mark.parametrize("rule", sorted(UNSAFE_BY_RULE))
def test_each_new_rule_has_its_level_and_can_be_reconfigured(rule):
    default = "advisory" if rule == "s3-bucket-ownership-declared" else "mandatory"
    stack = UNSAFE_BY_RULE[rule]()
    assert {(v.policy, v.level) for v in run_pack(stack)} == {(rule, default)}
    other = "mandatory" if default == "advisory" else "advisory"
    assert {(v.policy, v.level) for v in run_pack(stack, {rule: other})} == {(rule, other)}
    assert run_pack(stack, {rule: {"enforcementLevel": "disabled"}}) == []


# --- the real program under Pulumi's mocks ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def program():
    return run_program(EXAMPLE)


def mandatory(resources) -> set[str]:
    return {v.policy for v in run_pack(resources) if v.level == "mandatory"}


def test_the_program_passes_the_whole_pack_with_ownership_enforced(program):
    """Everything the leak rules read is in the program, and it passes them all, ownership declared included."""
    assert {r.type for r in program} >= {
        "aws:s3/bucketPolicy:BucketPolicy",
        "aws:kms/key:Key",
        "aws:sqs/queue:Queue",
        "aws:secretsmanager/secret:Secret",
        ROLE_POLICY,
        OBJECT,
        OWNERSHIP,
    }
    assert run_pack(program) == []


def test_the_program_without_its_ownership_controls_gets_the_advisory(program):
    without = [r for r in program if r.type != OWNERSHIP]
    assert [(v.policy, v.level, v.urn) for v in run_pack(without)] == [
        ("s3-bucket-ownership-declared", "advisory", program.one(BUCKET).urn)
    ]


def test_the_schedule_roles_passrole_is_checked_against_the_stacks_roles(program):
    """The program's PassJobRole statement passes because the job role is in the stack, not because it is ignored."""
    job = program.named("icefloe-job-role")
    assert escalation.PASSROLE_STACK_ROLES.name in mandatory([r for r in program if r is not job])


def test_bring_your_own_bucket_has_no_ownership_finding(tmp_path):
    document = yaml.safe_load(MINIMAL.read_text())
    document["config"]["icefloe:storage"] = {
        "existingBucket": "corp-lake",
        "existingKmsKeyArn": "arn:aws:kms:us-east-1:123456789012:key/1111-2222",
    }
    byo = tmp_path / "Pulumi.byo.yaml"
    byo.write_text(yaml.safe_dump(document))
    assert run_pack(run_program(byo)) == []  # the program does not create the bucket, so its ACLs are the user's


def bucket_id(program) -> str:
    return program.one(BUCKET).id


ADDED_BESIDE = [
    (
        "bucket policy allowing Principal * s3:GetObject",
        "resource-policy-no-public-principal",
        lambda p: [
            Resource(
                "aws:s3/bucketPolicy:BucketPolicy",
                "public-read",
                {"bucket": bucket_id(p), "policy": doc(allow("*", "s3:GetObject", f"arn:aws:s3:::{bucket_id(p)}/*"))},
            )
        ],
    ),
    (
        "key policy letting anyone decrypt the lakehouse key",
        "resource-policy-no-public-principal",
        lambda p: [
            Resource(
                "aws:kms/keyPolicy:KeyPolicy",
                "open-key",
                {
                    "keyId": p.one("aws:kms/key:Key").id,
                    "policy": doc(
                        allow({"AWS": f"arn:aws:iam::{ACCOUNT_ID}:root"}, "kms:*"),
                        allow("*", ["kms:Decrypt", "kms:DescribeKey"]),
                    ),
                },
            )
        ],
    ),
    (
        "dead-letter queue open to any SNS topic",
        "resource-policy-no-public-principal",
        lambda p: [
            Resource(
                "aws:sqs/queuePolicy:QueuePolicy",
                "dlq-policy",
                {"queueUrl": p.one("aws:sqs/queue:Queue").outputs["url"], "policy": doc(allow(SNS, "sqs:SendMessage"))},
            )
        ],
    ),
    (
        "Kafka secret readable by everyone",
        "resource-policy-no-public-principal",
        lambda p: [
            Resource(
                "aws:secretsmanager/secretPolicy:SecretPolicy",
                "secret-policy",
                {
                    "secretArn": p.one("aws:secretsmanager/secret:Secret").outputs["arn"],
                    "policy": doc(allow({"AWS": "*"}, "secretsmanager:GetSecretValue")),
                },
            )
        ],
    ),
    (
        "Glue catalog shared with everyone",
        "resource-policy-no-public-principal",
        lambda p: [
            Resource(
                "aws:glue/resourcePolicy:ResourcePolicy",
                "catalog-policy",
                {
                    "policy": doc(
                        allow("*", ["glue:GetTable", "glue:GetTables"], f"arn:aws:glue:eu-west-1:{ACCOUNT_ID}:*")
                    )
                },
            )
        ],
    ),
    (
        "BucketAcl public-read on the lakehouse bucket",
        "s3-no-public-acl",
        lambda p: [Resource(ACL_V2, "lake-acl", {"bucket": bucket_id(p), "acl": "public-read"})],
    ),
    (
        "BucketAcl granting AllUsers READ",
        "s3-no-public-acl",
        lambda p: [
            Resource(ACL, "lake-acl", acl_grants(({"type": "Group", "uri": ALL_USERS}, "READ"), bucket=bucket_id(p)))
        ],
    ),
    (
        "ownership ObjectWriter on the lakehouse bucket",
        "s3-bucket-owner-enforced",
        lambda p: [
            Resource(OWNERSHIP, "lake-ownership", {"bucket": bucket_id(p), "rule": {"objectOwnership": "ObjectWriter"}})
        ],
    ),
    (
        "an IAM user with an access key",
        "iam-no-long-lived-credentials",
        lambda p: [
            Resource("aws:iam/user:User", "ci", {"name": "ci"}),
            Resource("aws:iam/accessKey:AccessKey", "ci-key", {"user": "ci"}),
        ],
    ),
    (
        "an IAM user with a login profile",
        "iam-no-long-lived-credentials",
        lambda p: [
            Resource("aws:iam/user:User", "analyst", {"name": "analyst"}),
            Resource("aws:iam/userLoginProfile:UserLoginProfile", "analyst-login", {"user": "analyst"}),
        ],
    ),
]


@pytest.mark.parametrize("case, rule, build", ADDED_BESIDE, ids=[c for c, _, _ in ADDED_BESIDE])
def test_an_unsafe_resource_beside_the_program_is_rejected_by_its_rule(program, case, rule, build):
    added = build(program)
    violations = run_pack([*program, *added])
    assert {v.policy for v in violations if v.level == "mandatory"} == {rule}, case
    assert {v.urn for v in violations if v.policy == rule} <= {r.urn or urn(r.type, r.name) for r in added}


def with_statement(real, statement: dict):
    """A policy builder like `real` whose document gains `statement`."""

    def build(*args):
        document = json.loads(real(*args))
        document["Statement"].append(statement)
        return json.dumps(document)

    return build


def test_unsafe_role_policies_of_the_program_are_rejected_by_the_rule_that_names_them(monkeypatch):
    from icefloe_infra import iam as iam_module
    from icefloe_infra import schedules as schedules_module

    variants = [
        (
            iam_module,
            "job_policy",
            {"Sid": "PassAnyRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": "*"},
            "iam-no-privilege-escalation",
        ),
        (
            iam_module,
            "job_policy",
            {
                "Sid": "RewriteMyself",
                "Effect": "Allow",
                "Action": ["iam:CreatePolicyVersion", "iam:AttachRolePolicy", "iam:PutRolePolicy"],
                "Resource": f"arn:aws:iam::{ACCOUNT_ID}:role/icefloe-job-role",
            },
            "iam-no-privilege-escalation",
        ),
        (
            schedules_module,
            "scheduler_policy",
            {"Sid": "AssumeAnything", "Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"},
            "iam-no-privilege-escalation",
        ),
        (
            schedules_module,
            "scheduler_policy",
            {
                "Sid": "PassAdmin",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": f"arn:aws:iam::{ACCOUNT_ID}:role/admin",
                "Condition": TO_EMR,
            },
            "iam-passrole-stack-roles",
        ),
    ]
    for module, builder, statement, rule in variants:
        with monkeypatch.context() as patch:
            patch.setattr(module, builder, with_statement(getattr(module, builder), statement))
            run = run_program(EXAMPLE)
        assert mandatory(run) == {rule}, statement["Sid"]
        [violation] = [v for v in run_pack(run) if v.policy == rule]
        assert statement["Sid"] in violation.message
