"""The icefloe-safety policy pack, rule by rule and as a whole.

Rules are called the way the engine calls them: ResourceValidationArgs/StackValidationArgs whose camelCase
properties went through a protobuf Struct and the engine's unknown-checking proxies
(icefloe_policies.runner does that). Every rule has a violating and a passing case.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
from pulumi_policy import EnforcementLevel, StackValidationArgs
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from icefloe_policies import (
    ROLE_LAKEHOUSE,
    TAG_OWNER,
    TAG_ROLE,
    TAG_STACK,
    emr,
    iam,
    kms,
    logs,
    s3,
    scheduler,
    secrets,
    tagging,
)
from icefloe_policies.pack import all_policies, resolve_config
from icefloe_policies.runner import Resource, default_urn, resource_args, run_pack, stack_resources

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "111122223333"
SNOWFLAKE_USER = "arn:aws:iam::999988887777:user/snowflake-abc"
BUCKET_NAME = "icefloe-dev-lake"
BUCKET_ARN = f"arn:aws:s3:::{BUCKET_NAME}"
TAGS = {TAG_STACK: "dev", TAG_OWNER: "data-platform"}


# --- calling rules like the engine ---------------------------------------------------------------------------


def check(policy, type_token: str, props: dict, config: dict | None = None, name: str = "subject") -> list[str]:
    """Messages a resource rule reports for one resource."""
    args = resource_args(Resource(type_token, name, props), config)
    messages: list[str] = []
    policy.validate(args, lambda msg, urn=None: messages.append(msg))
    return messages


def check_stack(policy, resources: list[Resource]) -> list[tuple[str, str | None]]:
    """(message, urn) pairs a stack rule reports for a stack."""
    found: list[tuple[str, str | None]] = []
    policy.validate(StackValidationArgs(stack_resources(resources)), lambda msg, urn=None: found.append((msg, urn)))
    return found


def doc(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def urn(type_token: str, name: str) -> str:
    return default_urn(type_token, name)


# --- a safe lakehouse stack ----------------------------------------------------------------------------------

BUCKET = "aws:s3/bucket:Bucket"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
VERSIONING = "aws:s3/bucketVersioning:BucketVersioning"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
OWNERSHIP = "aws:s3/bucketOwnershipControls:BucketOwnershipControls"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
SCHEDULE = "aws:scheduler/schedule:Schedule"
EMR_APP = "aws:emrserverless/application:Application"

TLS_DENY = {
    "Sid": "DenyInsecureTransport",
    "Effect": "Deny",
    "Principal": "*",
    "Action": "s3:*",
    "Resource": [BUCKET_ARN, f"{BUCKET_ARN}/*"],
    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
}
KMS_RULES = [
    {
        "applyServerSideEncryptionByDefault": {
            "sseAlgorithm": "aws:kms",
            "kmsMasterKeyId": f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k1",
        },
        "bucketKeyEnabled": True,
    }
]
ALL_BLOCKED = {
    "blockPublicAcls": True,
    "blockPublicPolicy": True,
    "ignorePublicAcls": True,
    "restrictPublicBuckets": True,
}


def bucket_resources(name: str = "lake", bucket: str = BUCKET_NAME, tags: dict | None = None) -> list[Resource]:
    """A bucket with everything the S3 rules ask for, linked by bucket name like a deployed stack."""
    return [
        Resource(BUCKET, name, {"bucket": bucket, "tags": TAGS if tags is None else tags}, id=bucket),
        Resource(SSE, f"{name}-encryption", {"bucket": bucket, "rules": KMS_RULES}),
        Resource(PAB, f"{name}-public-access", {"bucket": bucket, **ALL_BLOCKED}),
        Resource(
            VERSIONING, f"{name}-versioning", {"bucket": bucket, "versioningConfiguration": {"status": "Enabled"}}
        ),
        Resource(
            BUCKET_POLICY,
            f"{name}-policy",
            {
                "bucket": bucket,
                "policy": doc({**TLS_DENY, "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}),
            },
        ),
        Resource(
            OWNERSHIP, f"{name}-ownership", {"bucket": bucket, "rule": {"objectOwnership": "BucketOwnerEnforced"}}
        ),
    ]


def start_job_run_input(arguments: list[str], spark_parameters: str = "--conf spark.executor.cores=4") -> str:
    """The Scheduler target input icefloe sends: an EMR Serverless StartJobRun payload."""
    return json.dumps(
        {
            "applicationId": "00fabc",
            "executionRoleArn": f"arn:aws:iam::{ACCOUNT}:role/icefloe-job",
            "clientToken": "<aws.scheduler.execution-id>",
            "jobDriver": {
                "sparkSubmit": {
                    "entryPoint": f"s3://{BUCKET_NAME}/jobs/materialize.py",
                    "entryPointArguments": arguments,
                    "sparkSubmitParameters": spark_parameters,
                }
            },
        }
    )


SAFE_ARGUMENTS = [
    "--config",
    f"s3://{BUCKET_NAME}/config/dev.json",
    "--credentials-secret-arn",
    f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:kafka-password-AbCd",
]


def schedule_props(arguments: list[str] = SAFE_ARGUMENTS) -> dict:
    return {
        "scheduleExpression": "rate(15 minutes)",
        "flexibleTimeWindow": {"mode": "OFF"},
        "target": {
            "arn": "arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun",
            "roleArn": f"arn:aws:iam::{ACCOUNT}:role/icefloe-scheduler",
            "input": start_job_run_input(arguments),
            "retryPolicy": {"maximumRetryAttempts": 3, "maximumEventAgeInSeconds": 3600},
            "deadLetterConfig": {"arn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:icefloe-dlq"},
        },
    }


def trust(principal: dict, condition: dict | None = None) -> str:
    statement = {"Effect": "Allow", "Principal": principal, "Action": "sts:AssumeRole"}
    if condition:
        statement["Condition"] = condition
    return doc(statement)


def snowflake_role(condition: dict | None = None) -> Resource:
    return Resource(ROLE, "snowflake-access", {"assumeRolePolicy": trust({"AWS": SNOWFLAKE_USER}, condition)})


JOB_POLICY = doc(
    {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], "Resource": f"{BUCKET_ARN}/*"},
    {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": BUCKET_ARN},
    {
        "Effect": "Allow",
        "Action": ["glue:GetTable", "glue:UpdateTable", "glue:CreateTable"],
        "Resource": [
            f"arn:aws:glue:us-east-1:{ACCOUNT}:catalog",
            f"arn:aws:glue:us-east-1:{ACCOUNT}:database/kafka",
            f"arn:aws:glue:us-east-1:{ACCOUNT}:table/kafka/*",
        ],
    },
    {"Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": "*"},
)


def safe_stack() -> list[Resource]:
    return [
        *bucket_resources(),
        Resource("aws:kms/key:Key", "lake-key", {"enableKeyRotation": True, "deletionWindowInDays": 30}),
        Resource(ROLE, "job-role", {"assumeRolePolicy": trust({"Service": "emr-serverless.amazonaws.com"})}),
        Resource(ROLE_POLICY, "job-role-policy", {"role": "job-role", "policy": JOB_POLICY}),
        Resource(ROLE, "scheduler-role", {"assumeRolePolicy": trust({"Service": "scheduler.amazonaws.com"})}),
        snowflake_role({"StringEquals": {"sts:ExternalId": "ABC123_SFCRole=2_abcdefg="}}),
        Resource("aws:glue/catalogDatabase:CatalogDatabase", "kafka", {"name": "kafka", "tags": TAGS}),
        Resource(
            EMR_APP,
            "spark",
            {
                "releaseLabel": "emr-7.5.0",
                "type": "SPARK",
                "maximumCapacity": {"cpu": "16 vCPU", "memory": "64 GB"},
                "autoStopConfiguration": {"enabled": True, "idleTimeoutMinutes": 15},
                "runtimeConfigurations": [
                    {
                        "classification": "spark-defaults",
                        "properties": {"spark.sql.catalog.glue.warehouse": f"s3://{BUCKET_NAME}/warehouse"},
                    }
                ],
            },
        ),
        Resource(SCHEDULE, "stock-trades", schedule_props()),
        Resource("aws:sqs/queue:Queue", "dlq", {"messageRetentionSeconds": 1209600}),
        Resource("aws:secretsmanager/secret:Secret", "kafka", {"name": "icefloe/dev/kafka", "kmsKeyId": "k1"}),
        Resource("aws:cloudwatch/logGroup:LogGroup", "jobs", {"retentionInDays": 30}),
    ]


def replace(stack: list[Resource], name: str, resource: Resource | None) -> list[Resource]:
    """The stack with resource `name` swapped (or removed when `resource` is None)."""
    assert any(r.name == name for r in stack), f"no resource named {name}"
    return [r2 for r2 in (resource if r.name == name else r for r in stack) if r2 is not None]


# --- the pack as a whole -------------------------------------------------------------------------------------


def test_safe_lakehouse_stack_passes_every_rule():
    assert run_pack(safe_stack()) == []


@pytest.mark.parametrize(
    "case, stack, rule",
    [
        (
            "external role without ExternalId",
            lambda: replace(safe_stack(), "snowflake-access", snowflake_role()),
            "iam-external-trust-requires-external-id",
        ),
        (
            "public bucket",
            lambda: replace(
                safe_stack(),
                "lake-public-access",
                Resource(
                    PAB,
                    "lake-public-access",
                    {"bucket": BUCKET_NAME, **ALL_BLOCKED, "blockPublicPolicy": False, "restrictPublicBuckets": False},
                ),
            ),
            "s3-bucket-public-access-block",
        ),
        (
            "bucket without public access block",
            lambda: replace(safe_stack(), "lake-public-access", None),
            "s3-bucket-public-access-block",
        ),
        (
            "plaintext password in a job argument",
            lambda: replace(
                safe_stack(),
                "stock-trades",
                Resource(SCHEDULE, "stock-trades", schedule_props([*SAFE_ARGUMENTS, "--kafka-password", "hunter2!"])),
            ),
            "no-plaintext-credentials",
        ),
    ],
)
def test_unsafe_variant_is_rejected_by_the_rule_that_names_it(case, stack, rule):
    violations = run_pack(stack())
    assert {v.policy for v in violations} == {rule}, case
    assert all(v.level == "mandatory" for v in violations)


def test_violations_point_at_the_offending_resource():
    [violation] = run_pack(replace(safe_stack(), "snowflake-access", snowflake_role()))
    assert violation.urn == urn(ROLE, "snowflake-access")
    assert SNOWFLAKE_USER in violation.message


def test_a_leaked_password_is_not_repeated_in_the_message():
    stack = replace(
        safe_stack(),
        "stock-trades",
        Resource(SCHEDULE, "stock-trades", schedule_props([*SAFE_ARGUMENTS, "--kafka-password", "hunter2!"])),
    )
    [violation] = run_pack(stack)
    assert "hunter2" not in violation.message
    assert "entryPointArguments[5]" in violation.message


def test_policies_are_described_and_every_message_says_how_to_fix():
    policies = all_policies()
    assert len({p.name for p in policies}) == len(policies)
    assert all(p.description and p.remediation_steps for p in policies)
    unsafe = [
        Resource(BUCKET, "bare", {"bucket": "bare"}),
        Resource(BUCKET, "legacy", {"bucket": "legacy"}),
        Resource(ROLE, "open", {"name": "open", "assumeRolePolicy": trust({"AWS": "*"})}),
        Resource(EMR_APP, "app", {"releaseLabel": "emr-6.9.0"}),
        Resource(SCHEDULE, "s", {"target": {}}),
        Resource("aws:kms/key:Key", "k", {}),
        Resource("aws:cloudwatch/logGroup:LogGroup", "l", {}),
        Resource(ROLE_POLICY, "p", {"policy": doc({"Effect": "Allow", "Action": "*", "Resource": "*"})}),
        Resource("aws:lambda/function:Function", "f", {"environment": {"variables": {"DB_PASSWORD": "x1"}}}),
        Resource(
            "aws:sqs/queuePolicy:QueuePolicy",
            "q",
            {"policy": doc({"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"})},
        ),
        Resource(
            ROLE_POLICY,
            "pass",
            {
                "policy": doc(
                    {"Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::999988887777:role/admin"}
                )
            },
        ),
        Resource("aws:s3/bucketAclV2:BucketAclV2", "acl", {"bucket": "bare", "acl": "public-read"}),
        Resource(OWNERSHIP, "own", {"bucket": "legacy", "rule": {"objectOwnership": "ObjectWriter"}}),
        Resource("aws:iam/accessKey:AccessKey", "key", {"user": "ci"}),
    ]
    violations = run_pack(unsafe)
    assert {v.policy for v in violations} == {p.name for p in policies} - {"emr-auto-stop"}
    assert all(" Fix: " in v.message for v in violations)


def test_pack_default_is_mandatory_and_scheduler_rules_are_advisory():
    levels = {name: s.level for name, s in resolve_config(all_policies()).items()}
    assert levels.pop("scheduler-retry-policy") == levels.pop("scheduler-dead-letter") == EnforcementLevel.ADVISORY
    assert levels.pop("s3-bucket-ownership-declared") == EnforcementLevel.ADVISORY  # AWS's default is enforced
    assert set(levels.values()) == {EnforcementLevel.MANDATORY}


def test_example_policy_config_file_is_valid():
    config = json.loads((ROOT / "policies" / "policy-config.example.json").read_text())
    settings = resolve_config(all_policies(), config)
    assert settings["iam-external-trust-requires-external-id"].properties == {"accountId": "123456789012"}


def test_all_sets_every_level_and_a_rule_setting_wins():
    stack = replace(safe_stack(), "snowflake-access", snowflake_role())
    assert {v.level for v in run_pack(stack, {"all": "advisory"})} == {"advisory"}
    assert (
        run_pack(stack, {"all": "advisory", "iam-external-trust-requires-external-id": "mandatory"})[0].level
        == "mandatory"
    )


def test_a_disabled_rule_does_not_run():
    stack = replace(safe_stack(), "snowflake-access", snowflake_role())
    assert run_pack(stack, {"iam-external-trust-requires-external-id": {"enforcementLevel": "disabled"}}) == []


def test_config_naming_an_unknown_rule_is_an_error():
    with pytest.raises(ValueError, match="iam-external-id"):
        run_pack([], {"iam-external-id": "advisory"})


def test_rule_properties_reach_the_rule():
    own = Resource(ROLE, "admin", {"assumeRolePolicy": trust({"AWS": f"arn:aws:iam::{ACCOUNT}:root"})})
    assert [v.policy for v in run_pack([own])] == ["iam-external-trust-requires-external-id"]
    assert run_pack([own], {"iam-external-trust-requires-external-id": {"accountId": ACCOUNT}}) == []


def test_unknown_value_in_preview_becomes_an_advisory_diagnostic_like_the_engine():
    role = Resource(ROLE, "later", {"assumeRolePolicy": UNKNOWN_STRING_VALUE})
    violations = run_pack([role])
    assert {v.level for v in violations} == {"advisory"}
    assert all("can't run policy" in v.message for v in violations)


def test_stack_rules_link_by_property_dependencies_while_the_bucket_id_is_unknown():
    """During preview a new bucket's id is unknown; the engine still says which resource `bucket` came from."""
    bucket_urn = urn(BUCKET, "lake")
    previewed = [
        Resource(
            r.type, r.name, {**r.inputs, "bucket": UNKNOWN_STRING_VALUE}, property_dependencies={"bucket": [bucket_urn]}
        )
        if r.type != BUCKET
        else Resource(BUCKET, "lake", {"tags": TAGS})
        for r in bucket_resources()
    ]
    assert run_pack(previewed) == []
    assert [v.policy for v in run_pack(replace(previewed, "lake-encryption", None))] == ["s3-bucket-kms-encryption"]


def test_outputs_are_what_stack_rules_see():
    """Provider default tags land in the `tagsAll` output: stack rules read outputs when recorded."""
    [bucket, *rest] = bucket_resources(tags={})
    deployed = Resource(BUCKET, "lake", bucket.inputs, id=BUCKET_NAME, outputs={**bucket.inputs, "tagsAll": TAGS})
    assert run_pack([deployed, *rest]) == []
    assert [v.policy for v in run_pack([bucket, *rest])] == ["icefloe-ownership-tags"]


# --- S3 ------------------------------------------------------------------------------------------------------


def test_bucket_without_encryption_config_is_reported_on_the_bucket():
    found = check_stack(s3.ENCRYPTION, replace(bucket_resources(), "lake-encryption", None))
    assert [u for _, u in found] == [urn(BUCKET, "lake")]
    assert "no server-side encryption configuration" in found[0][0]


@pytest.mark.parametrize("algorithm, violates", [("AES256", True), ("aws:kms", False), ("aws:kms:dsse", False)])
def test_bucket_encryption_must_use_kms(algorithm, violates):
    rules = [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": algorithm}}]
    stack = replace(
        bucket_resources(), "lake-encryption", Resource(SSE, "lake-encryption", {"bucket": BUCKET_NAME, "rules": rules})
    )
    assert bool(check_stack(s3.ENCRYPTION, stack)) is violates


def test_v2_tokens_count_as_buckets_and_encryption_configs():
    stack = [Resource("aws:s3/bucketV2:BucketV2", "old", {"bucket": "old-lake"}, id="old-lake")]
    assert len(check_stack(s3.ENCRYPTION, stack)) == 1
    sse_v2 = "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2"
    encryption = Resource(sse_v2, "enc", {"bucket": "old-lake", "rules": KMS_RULES})
    assert check_stack(s3.ENCRYPTION, [*stack, encryption]) == []


def test_each_bucket_needs_its_own_encryption_config():
    stack = [*bucket_resources(), *replace(bucket_resources("raw", "icefloe-dev-raw"), "raw-encryption", None)]
    assert [u for _, u in check_stack(s3.ENCRYPTION, stack)] == [urn(BUCKET, "raw")]


@pytest.mark.parametrize(
    "settings, violates",
    [
        (ALL_BLOCKED, False),
        ({**ALL_BLOCKED, "ignorePublicAcls": False}, True),
        ({"blockPublicAcls": True, "blockPublicPolicy": True}, True),
    ],
)
def test_public_access_block_needs_all_four_settings(settings, violates):
    stack = replace(
        bucket_resources(),
        "lake-public-access",
        Resource(PAB, "lake-public-access", {"bucket": BUCKET_NAME, **settings}),
    )
    assert bool(check_stack(s3.PUBLIC_ACCESS_BLOCK, stack)) is violates


def test_bucket_without_public_access_block_is_reported():
    assert len(check_stack(s3.PUBLIC_ACCESS_BLOCK, replace(bucket_resources(), "lake-public-access", None))) == 1


@pytest.mark.parametrize(
    "statement, violates",
    [
        (TLS_DENY, False),
        ({**TLS_DENY, "Principal": {"AWS": "*"}, "Action": "*"}, False),
        ({**TLS_DENY, "Condition": {"Bool": {"aws:SecureTransport": False}}}, False),
        ({**TLS_DENY, "Effect": "Allow"}, True),
        ({k: v for k, v in TLS_DENY.items() if k != "Condition"}, True),
        ({**TLS_DENY, "Condition": {"Bool": {"aws:SecureTransport": "true"}}}, True),
        ({**TLS_DENY, "Resource": BUCKET_ARN}, True),  # objects are not covered
        ({**TLS_DENY, "Action": "s3:GetObject"}, True),
    ],
)
def test_bucket_policy_must_deny_insecure_transport(statement, violates):
    stack = replace(
        bucket_resources(),
        "lake-policy",
        Resource(BUCKET_POLICY, "lake-policy", {"bucket": BUCKET_NAME, "policy": doc(statement)}),
    )
    assert bool(check_stack(s3.DENY_INSECURE_TRANSPORT, stack)) is violates


def test_bucket_policy_as_object_is_understood():
    stack = replace(
        bucket_resources(),
        "lake-policy",
        Resource(
            BUCKET_POLICY,
            "lake-policy",
            {"bucket": BUCKET_NAME, "policy": {"Version": "2012-10-17", "Statement": [TLS_DENY]}},
        ),
    )
    assert check_stack(s3.DENY_INSECURE_TRANSPORT, stack) == []


def test_bucket_without_policy_is_reported():
    assert len(check_stack(s3.DENY_INSECURE_TRANSPORT, replace(bucket_resources(), "lake-policy", None))) == 1


def test_bucket_policy_unknown_during_preview_is_left_to_the_update():
    stack = replace(
        bucket_resources(),
        "lake-policy",
        Resource(BUCKET_POLICY, "lake-policy", {"bucket": BUCKET_NAME, "policy": UNKNOWN_STRING_VALUE}),
    )
    assert check_stack(s3.DENY_INSECURE_TRANSPORT, stack) == []


@pytest.mark.parametrize(
    "versioning, violates", [({"status": "Enabled"}, False), ({"status": "Suspended"}, True), (None, True)]
)
def test_lakehouse_bucket_must_be_versioned(versioning, violates):
    new = (
        None
        if versioning is None
        else Resource(VERSIONING, "lake-versioning", {"bucket": BUCKET_NAME, "versioningConfiguration": versioning})
    )
    assert bool(check_stack(s3.VERSIONING, replace(bucket_resources(), "lake-versioning", new))) is violates


@pytest.mark.parametrize("role, violates", [(ROLE_LAKEHOUSE, True), ("scratch", False)])
def test_only_a_bucket_tagged_with_another_role_may_skip_versioning(role, violates):
    stack = replace(bucket_resources(tags={**TAGS, TAG_ROLE: role}), "lake-versioning", None)
    assert bool(check_stack(s3.VERSIONING, stack)) is violates


# --- KMS -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "props, violates",
    [
        ({"enableKeyRotation": True}, False),
        ({"enableKeyRotation": False}, True),
        ({}, True),
        ({"customerMasterKeySpec": "RSA_2048", "keyUsage": "SIGN_VERIFY"}, False),  # cannot rotate
    ],
)
def test_kms_keys_rotate(props, violates):
    assert bool(check(kms.KEY_ROTATION, "aws:kms/key:Key", props)) is violates


# --- IAM -----------------------------------------------------------------------------------------------------

EXTERNAL_ID = {"StringEquals": {"sts:ExternalId": "ABC123_SFCRole=2_abcdefg="}}


@pytest.mark.parametrize(
    "principal, condition, config, violates",
    [
        ({"AWS": SNOWFLAKE_USER}, None, {}, True),
        ({"AWS": SNOWFLAKE_USER}, EXTERNAL_ID, {}, False),
        ({"AWS": SNOWFLAKE_USER}, {"StringLike": {"sts:ExternalId": "*"}}, {}, True),
        ({"AWS": SNOWFLAKE_USER}, {"StringEquals": {"sts:externalid": "abc"}}, {}, False),  # keys are case-insensitive
        ({"AWS": [f"arn:aws:iam::{ACCOUNT}:role/ci", SNOWFLAKE_USER]}, None, {"accountId": ACCOUNT}, True),
        ({"AWS": "999988887777"}, None, {"accountId": ACCOUNT}, True),
        ({"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, None, {"accountId": ACCOUNT}, False),
        ({"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, None, {}, True),  # own account unknown: every account is external
        ({"Service": "emr-serverless.amazonaws.com"}, None, {}, False),
        ({"Service": ["scheduler.amazonaws.com"]}, None, {}, False),
    ],
)
def test_external_trust_requires_external_id(principal, condition, config, violates):
    found = check(iam.EXTERNAL_ID, ROLE, {"assumeRolePolicy": trust(principal, condition)}, config)
    assert bool(found) is violates


def test_trust_policy_given_as_object_is_checked():
    policy = {
        "Version": "2012-10-17",
        "Statement": {
            "Effect": "Allow",
            "Principal": {"AWS": SNOWFLAKE_USER},
            "Action": ["sts:AssumeRole", "sts:TagSession"],
        },
    }
    assert len(check(iam.EXTERNAL_ID, ROLE, {"assumeRolePolicy": policy})) == 1


def test_deny_statements_need_no_external_id():
    deny = doc({"Effect": "Deny", "Principal": {"AWS": SNOWFLAKE_USER}, "Action": "sts:AssumeRole"})
    assert check(iam.EXTERNAL_ID, ROLE, {"assumeRolePolicy": deny}) == []


@pytest.mark.parametrize("principal", ["*", {"AWS": "*"}, {"AWS": ["arn:aws:iam::999988887777:root", "*"]}])
def test_trust_policy_must_not_admit_everyone(principal):
    found = check(iam.NO_WILDCARD_PRINCIPAL, ROLE, {"assumeRolePolicy": trust(principal, EXTERNAL_ID)})
    assert len(found) == 1 and "any AWS principal" in found[0]


def test_named_principals_are_fine():
    assert check(iam.NO_WILDCARD_PRINCIPAL, ROLE, {"assumeRolePolicy": trust({"AWS": SNOWFLAKE_USER})}) == []


def test_not_principal_allow_is_a_wildcard_principal():
    policy = doc(
        {
            "Effect": "Allow",
            "NotPrincipal": {"AWS": SNOWFLAKE_USER},
            "Action": "s3:GetObject",
            "Resource": f"{BUCKET_ARN}/*",
        }
    )
    assert len(check(iam.NO_WILDCARD_PRINCIPAL, "aws:iam/policy:Policy", {"policy": policy})) == 1


@pytest.mark.parametrize(
    "action, violates",
    [
        ("*", True),
        ("s3:*", True),
        ("glue:*", True),
        (["s3:GetObject", "kms:*"], True),
        ("s3:Get*", False),
        (["s3:GetObject", "s3:PutObject"], False),
    ],
)
@pytest.mark.parametrize("type_token", [ROLE_POLICY, "aws:iam/policy:Policy"])
def test_no_service_wide_actions(action, violates, type_token):
    policy = doc({"Effect": "Allow", "Action": action, "Resource": f"{BUCKET_ARN}/*"})
    assert bool(check(iam.NO_WILDCARD_ACTIONS, type_token, {"policy": policy})) is violates


def test_role_inline_policies_are_checked():
    inline = [
        {"name": "ok", "policy": JOB_POLICY},
        {"name": "too-much", "policy": doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*"})},
    ]
    found = check(
        iam.NO_WILDCARD_ACTIONS,
        ROLE,
        {"assumeRolePolicy": trust({"Service": "x.amazonaws.com"}), "inlinePolicies": inline},
    )
    assert len(found) == 1 and "inline policy 'too-much'" in found[0]


def test_not_action_allow_is_a_wildcard_action():
    policy = doc({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})
    assert len(check(iam.NO_WILDCARD_ACTIONS, ROLE_POLICY, {"policy": policy})) == 1


def test_deny_with_wildcards_is_fine():
    policy = doc({"Effect": "Deny", "Action": "*", "Resource": "*"})
    assert check(iam.NO_WILDCARD_ACTIONS, ROLE_POLICY, {"policy": policy}) == []
    assert check(iam.NO_UNSCOPED_WRITES, ROLE_POLICY, {"policy": policy}) == []


@pytest.mark.parametrize(
    "type_token, props, violates",
    [
        (
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            {"role": "r", "policyArn": "arn:aws:iam::aws:policy/AdministratorAccess"},
            True,
        ),
        (
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            {"role": "r", "policyArn": "arn:aws:iam::aws:policy/AmazonS3FullAccess"},
            True,
        ),
        (
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            {"role": "r", "policyArn": "arn:aws:iam::aws:policy/service-role/AmazonEMRServicePolicy_v2"},
            False,
        ),
        (
            ROLE,
            {
                "assumeRolePolicy": trust({"Service": "x.amazonaws.com"}),
                "managedPolicyArns": ["arn:aws:iam::aws:policy/PowerUserAccess"],
            },
            True,
        ),
    ],
)
def test_no_full_access_managed_policies(type_token, props, violates):
    assert bool(check(iam.NO_WILDCARD_ACTIONS, type_token, props)) is violates


@pytest.mark.parametrize(
    "action, resource, violates",
    [
        ("s3:PutObject", "*", True),
        ("s3:DeleteObject", "arn:aws:s3:::*/*", True),
        ("s3:Put*", "*", True),
        ("glue:UpdateTable", "arn:aws:glue:*:*:table/*", True),
        ("glue:Create*", f"arn:aws:glue:us-east-1:{ACCOUNT}:*", True),
        ("s3:PutObject", f"{BUCKET_ARN}/*", False),
        ("glue:UpdateTable", f"arn:aws:glue:us-east-1:{ACCOUNT}:table/kafka/*", False),
        ("s3:GetObject", "*", False),  # reads are not this rule's concern
        ("glue:GetTable", "*", False),
    ],
)
def test_no_data_writes_on_every_resource(action, resource, violates):
    policy = doc({"Effect": "Allow", "Action": action, "Resource": resource})
    assert bool(check(iam.NO_UNSCOPED_WRITES, ROLE_POLICY, {"policy": policy})) is violates


def test_policy_that_is_not_json_cannot_pass():
    found = check(iam.NO_UNSCOPED_WRITES, ROLE_POLICY, {"policy": "{not json"})
    assert len(found) == 1 and "cannot be checked" in found[0]


# --- EMR Serverless ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "props, violates",
    [
        ({"maximumCapacity": {"cpu": "16 vCPU", "memory": "64 GB"}}, False),
        ({"maximumCapacity": {"cpu": "16 vCPU"}}, True),
        ({}, True),
    ],
)
def test_emr_application_has_maximum_capacity(props, violates):
    assert bool(check(emr.MAXIMUM_CAPACITY, EMR_APP, props)) is violates


@pytest.mark.parametrize(
    "props, violates",
    [
        ({"autoStopConfiguration": {"enabled": True, "idleTimeoutMinutes": 15}}, False),
        ({}, False),  # AWS enables auto-stop when the block is absent
        ({"autoStopConfiguration": {"enabled": False}}, True),
    ],
)
def test_emr_application_keeps_auto_stop(props, violates):
    assert bool(check(emr.AUTO_STOP, EMR_APP, props)) is violates


@pytest.mark.parametrize(
    "label, violates",
    [
        ("emr-7.1.0", False),
        ("emr-7.12.0", False),
        ("emr-7.14.1", False),
        # 7.0.0: no Python 3.11 in the image, no streaming jobs; 8.x / emr-spark-8: Spark 4 on Scala 2.13
        ("emr-7.0.0", True),
        ("emr-8.1.0", True),
        ("emr-spark-8.0.0", True),
        ("emr-7.12", True),
        ("emr-7.12.0-latest", True),
        ("emr-6.15.0", True),
        ("emr-5.36.2", True),
        ("latest", True),
        (None, True),
    ],
)
def test_emr_release_is_one_icefloe_runs_on(label, violates):
    props = {} if label is None else {"releaseLabel": label}
    assert bool(check(emr.RELEASE_LABEL, EMR_APP, props)) is violates


def test_the_program_accepts_exactly_the_releases_the_pack_accepts():
    from pydantic import ValidationError

    from icefloe_infra.deployment import EmrSpec

    for label in ("emr-7.0.0", "emr-7.1.0", "emr-7.12.0", "emr-7.14.1", "emr-8.1.0", "emr-6.15.0", "emr-7.12"):
        try:
            EmrSpec(release_label=label)
            accepted = True
        except ValidationError:
            accepted = False
        pack_accepts = not check(emr.RELEASE_LABEL, EMR_APP, {"releaseLabel": label})
        assert accepted == pack_accepts == emr.supported_release(label), label


def test_emr_rules_ignore_other_resources():
    assert check(emr.MAXIMUM_CAPACITY, "aws:emr/cluster:Cluster", {}) == []


# --- Scheduler -----------------------------------------------------------------------------------------------


def test_schedule_needs_a_retry_policy():
    props = schedule_props()
    assert check(scheduler.RETRY_POLICY, SCHEDULE, props) == []
    del props["target"]["retryPolicy"]
    assert len(check(scheduler.RETRY_POLICY, SCHEDULE, props)) == 1


def test_schedule_needs_a_dead_letter_queue():
    props = schedule_props()
    assert check(scheduler.DEAD_LETTER, SCHEDULE, props) == []
    del props["target"]["deadLetterConfig"]
    assert len(check(scheduler.DEAD_LETTER, SCHEDULE, props)) == 1


def test_scheduler_findings_are_advisory_by_default():
    props = copy.deepcopy(schedule_props())
    del props["target"]["retryPolicy"], props["target"]["deadLetterConfig"]
    violations = run_pack(replace(safe_stack(), "stock-trades", Resource(SCHEDULE, "stock-trades", props)))
    assert {(v.policy, v.level) for v in violations} == {
        ("scheduler-retry-policy", "advisory"),
        ("scheduler-dead-letter", "advisory"),
    }


# --- plaintext credentials (the detector itself: test_policies_credentials.py) -----------------------------


def test_schedule_input_with_password_in_arguments_is_rejected():
    props = schedule_props([*SAFE_ARGUMENTS, "--kafka-password", "hunter2!"])
    [found] = check(secrets.NO_PLAINTEXT_CREDENTIALS, SCHEDULE, props)
    assert "password" in found and "target.input.jobDriver.sparkSubmit.entryPointArguments[5]" in found


def test_schedule_input_with_secret_key_in_spark_parameters_is_rejected():
    props = schedule_props()
    payload = json.loads(props["target"]["input"])
    payload["jobDriver"]["sparkSubmit"]["sparkSubmitParameters"] = (
        "--conf spark.hadoop.fs.s3a.secret.key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    )
    props["target"]["input"] = json.dumps(payload)
    [*found] = check(secrets.NO_PLAINTEXT_CREDENTIALS, SCHEDULE, props)
    assert found and all("sparkSubmitParameters" in f for f in found)
    assert not any("wJalr" in f for f in found)


def test_safe_schedule_input_passes():
    assert check(secrets.NO_PLAINTEXT_CREDENTIALS, SCHEDULE, schedule_props()) == []


def test_emr_runtime_configuration_with_credentials_is_rejected():
    props = {
        "runtimeConfigurations": [
            {
                "classification": "spark-defaults",
                "properties": {
                    "spark.kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="icefloe" password="s3cr3t";'
                },
            }
        ]
    }
    assert len(check(secrets.NO_PLAINTEXT_CREDENTIALS, EMR_APP, props)) == 1


@pytest.mark.parametrize(
    "type_token, props",
    [
        ("aws:glue/catalogDatabase:CatalogDatabase", {"tags": {**TAGS, "db_password": "hunter2!"}}),
        ("aws:lambda/function:Function", {"environment": {"variables": {"KAFKA_SASL_PASSWORD": "hunter2!"}}}),
        (
            "aws:ecs/taskDefinition:TaskDefinition",
            {
                "containerDefinitions": json.dumps(
                    [{"name": "app", "environment": [{"name": "DB_PASSWORD", "value": "hunter2!"}]}]
                )
            },
        ),
        (
            "aws:glue/job:Job",
            {"defaultArguments": {"--jdbc-url": "jdbc:postgresql://db:5432/x?user=a&password=hunter2!"}},
        ),
    ],
)
def test_credentials_in_tags_and_environments_are_rejected(type_token, props):
    assert len(check(secrets.NO_PLAINTEXT_CREDENTIALS, type_token, props)) == 1


@pytest.mark.parametrize(
    "type_token, props",
    [
        ("aws:glue/catalogDatabase:CatalogDatabase", {"tags": {**TAGS, "secret-name": "icefloe/dev/kafka"}}),
        (
            "aws:lambda/function:Function",
            {
                "environment": {
                    "variables": {
                        "KAFKA_PASSWORD_SECRET_ARN": f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:kafka-password-AbCd"
                    }
                }
            },
        ),
        (
            "aws:ecs/taskDefinition:TaskDefinition",
            {
                "containerDefinitions": json.dumps(
                    [
                        {
                            "name": "app",
                            "secrets": [
                                {
                                    "name": "DB_PASSWORD",
                                    "valueFrom": f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:db-AbCd",
                                }
                            ],
                        }
                    ]
                )
            },
        ),
    ],
)
def test_references_to_credentials_pass(type_token, props):
    assert check(secrets.NO_PLAINTEXT_CREDENTIALS, type_token, props) == []


# --- log groups ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "props, violates", [({"retentionInDays": 30}, False), ({"retentionInDays": 0}, True), ({}, True)]
)
def test_log_groups_expire_logs(props, violates):
    assert bool(check(logs.LOG_RETENTION, "aws:cloudwatch/logGroup:LogGroup", props)) is violates


# --- ownership tags ------------------------------------------------------------------------------------------

GLUE_DB = "aws:glue/catalogDatabase:CatalogDatabase"


@pytest.mark.parametrize(
    "tags, missing",
    [
        (TAGS, []),
        ({TAG_STACK: "dev"}, [TAG_OWNER]),
        ({TAG_STACK: "dev", TAG_OWNER: "  "}, [TAG_OWNER]),
        ({}, [TAG_STACK, TAG_OWNER]),
    ],
)
@pytest.mark.parametrize("type_token", [BUCKET, "aws:s3/bucketV2:BucketV2", GLUE_DB])
def test_buckets_and_databases_carry_stack_and_owner_tags(tags, missing, type_token):
    found = check_stack(tagging.OWNERSHIP_TAGS, [Resource(type_token, "thing", {"tags": tags})])
    assert len(found) == (1 if missing else 0)
    if missing:
        assert all(key in found[0][0] for key in missing) and found[0][1] == urn(type_token, "thing")


def test_provider_default_tags_count():
    provider = Resource(
        "pulumi:providers:aws", "aws", {"region": "us-east-1", "defaultTags": json.dumps({"tags": TAGS})}
    )
    assert check_stack(tagging.OWNERSHIP_TAGS, [Resource(GLUE_DB, "kafka", {"name": "kafka"}, provider=provider)]) == []


def test_other_resources_need_no_ownership_tags():
    assert check_stack(tagging.OWNERSHIP_TAGS, [Resource("aws:sqs/queue:Queue", "dlq", {})]) == []


# --- the real icefloe program under Pulumi's mocks -------------------------------------------------------------


# ENABLE ME (lead): runs infra/ on examples/Pulumi.example.yaml under mocks and checks it against the pack.
# Skipped only while icefloe_infra.dry_run does not exist; once it does, a failure here is a real finding.
@pytest.mark.skipif(
    importlib.util.find_spec("icefloe_infra.dry_run") is None,
    reason="icefloe_infra.dry_run.run_program is not written yet (infra is in progress)",
)
def test_example_program_passes_the_pack():
    from pulumi_mocks import run_program

    resources = run_program(ROOT / "examples" / "Pulumi.example.yaml")
    assert resources, "the program registered no resources"
    mandatory = [v for v in run_pack(resources) if v.level == "mandatory"]
    assert mandatory == []
