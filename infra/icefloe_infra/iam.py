"""IAM: the EMR Serverless job role (least privilege) and read-only external access roles fenced by ExternalId."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from . import prefixes
from .deployment import ExternalAccessSpec


def policy(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def service_trust(service: str, account_id: str) -> str:
    """Trust an AWS service, only on behalf of this account (confused-deputy guard)."""
    return policy({"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole",
                   "Condition": {"StringEquals": {"aws:SourceAccount": account_id}}})  # fmt: skip


@dataclass
class Scope:
    """What a role may touch: ARNs and names resolved from the stack's resources."""

    account_id: str
    region: str
    bucket_arn: str
    kms_key_arn: str
    warehouse_prefix: str
    databases: list[str]
    secret_arns: list[str] = field(default_factory=list)
    log_group_arn: str | None = None
    schema_registries: list[tuple[str, str]] = field(default_factory=list)  # Glue schema registries: (region, name)

    def glue_arns(self) -> list[str]:
        base = f"arn:aws:glue:{self.region}:{self.account_id}"
        return [f"{base}:catalog"] + [
            arn for db in self.databases for arn in (f"{base}:database/{db}", f"{base}:table/{db}/*")
        ]


def glue_schema_registries(spec) -> list[tuple[str, str]]:
    """(region, registry name) of the Glue schema registries the source clusters decode records with."""
    found = []
    for cluster in spec.source_clusters:
        registry = cluster.schema_registry
        if registry is not None and registry.type == "glue" and (registry.region, registry.registry_name) not in found:
            found.append((registry.region, registry.registry_name))
    return found


def job_policy(scope: Scope) -> str:
    """What a table's job needs, and no more: its warehouse prefix, the stack's objects, key, tables, secrets, logs."""
    warehouse = f"{scope.bucket_arn}/{scope.warehouse_prefix}/*"
    statements = [
        {"Sid": "WarehouseReadWrite", "Effect": "Allow", "Resource": [warehouse],
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]},
        # The bundle, its entry point, the jars and the job config are read-only for the job.
        {"Sid": "ReadBundleAndConfig", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"{scope.bucket_arn}/{prefixes.ARTIFACTS}/*"]},
        {"Sid": "WriteJobLogs", "Effect": "Allow", "Action": ["s3:PutObject"],
         "Resource": [f"{scope.bucket_arn}/{prefixes.LOGS}/*"]},
        # Listing for Iceberg's orphan-file cleanup, limited to the warehouse prefix.
        {"Sid": "ListWarehouse", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [scope.bucket_arn],
         "Condition": {"StringLike": {"s3:prefix": [f"{scope.warehouse_prefix}/*", scope.warehouse_prefix]}}},
        {"Sid": "BucketLocation", "Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": [scope.bucket_arn]},
        {"Sid": "DataKey", "Effect": "Allow", "Resource": [scope.kms_key_arn],
         "Action": ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"]},
        {"Sid": "GlueTables", "Effect": "Allow", "Resource": scope.glue_arns(),
         "Action": ["glue:GetCatalog", "glue:GetDatabase", "glue:GetDatabases", "glue:GetTable", "glue:GetTables",
                    "glue:CreateTable", "glue:UpdateTable", "glue:DeleteTable", "glue:GetPartitions"]},
    ]  # fmt: skip
    if scope.secret_arns:
        statements.append({"Sid": "KafkaCredentials", "Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"],
                           "Resource": scope.secret_arns})  # fmt: skip
    if scope.schema_registries:
        # Decoding records framed for the AWS Glue Schema Registry: read-only, its registries and their schemas.
        base = f"arn:aws:glue:{{}}:{scope.account_id}"
        statements.append({"Sid": "GlueSchemaRegistry", "Effect": "Allow",
                           "Action": ["glue:GetSchemaVersion", "glue:GetSchema", "glue:GetSchemaByDefinition",
                                      "glue:GetRegistry"],
                           "Resource": [arn for region, name in scope.schema_registries
                                        for arn in (f"{base.format(region)}:registry/{name}",
                                                    f"{base.format(region)}:schema/{name}/*")]})  # fmt: skip
    if scope.log_group_arn:
        statements += [
            {"Sid": "JobLogs", "Effect": "Allow", "Resource": [f"{scope.log_group_arn}:*"],
             "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]},
            # EMR Serverless looks the group up before writing; DescribeLogGroups takes no narrower resource.
            {"Sid": "FindLogGroup", "Effect": "Allow", "Action": ["logs:DescribeLogGroups"],
             "Resource": [f"arn:aws:logs:{scope.region}:{scope.account_id}:log-group:*"]},
        ]  # fmt: skip
    return policy(*statements)


def read_only_policy(scope: Scope) -> str:
    """Read the tables: warehouse objects (any version), the key that decrypts them, the catalog entries."""
    return policy(
        {"Sid": "ReadWarehouse", "Effect": "Allow", "Action": ["s3:GetObject", "s3:GetObjectVersion"],
         "Resource": [f"{scope.bucket_arn}/{scope.warehouse_prefix}/*"]},
        {"Sid": "ListWarehouse", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [scope.bucket_arn],
         "Condition": {"StringLike": {"s3:prefix": [f"{scope.warehouse_prefix}/*", scope.warehouse_prefix]}}},
        {"Sid": "BucketLocation", "Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": [scope.bucket_arn]},
        {"Sid": "DecryptData", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:DescribeKey"],
         "Resource": [scope.kms_key_arn]},
        {"Sid": "ReadCatalog", "Effect": "Allow", "Resource": scope.glue_arns(),
         "Action": ["glue:GetCatalog", "glue:GetDatabase", "glue:GetDatabases", "glue:GetTable", "glue:GetTables",
                    "glue:GetPartitions"]},
    )  # fmt: skip


def external_trust(principal_arn: str, external_id: str) -> str:
    return policy({"Effect": "Allow", "Principal": {"AWS": principal_arn}, "Action": "sts:AssumeRole",
                   "Condition": {"StringEquals": {"sts:ExternalId": external_id}}})  # fmt: skip


@dataclass
class JobRoleArgs:
    scope: pulumi.Input[Scope]
    tags: dict[str, str] = field(default_factory=dict)


class JobRole(pulumi.ComponentResource):
    """The role EMR Serverless jobs run as."""

    def __init__(self, name: str, args: JobRoleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:iam:JobRole", name, None, opts)
        scope = pulumi.Output.from_input(args.scope)
        self.role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=scope.apply(lambda s: service_trust("emr-serverless.amazonaws.com", s.account_id)),
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.iam.RolePolicy(
            f"{name}-policy", role=self.role.id, policy=scope.apply(job_policy), opts=pulumi.ResourceOptions(parent=self)
        )
        self.arn = self.role.arn
        self.register_outputs({"arn": self.arn})


@dataclass
class ExternalAccessRoleArgs:
    spec: ExternalAccessSpec
    scope: pulumi.Input[Scope]
    tags: dict[str, str] = field(default_factory=dict)


class ExternalAccessRole(pulumi.ComponentResource):
    """Read-only access to the tables for exactly one outside principal, which must present the ExternalId."""

    def __init__(self, name: str, args: ExternalAccessRoleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:iam:ExternalAccessRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        if args.spec.external_id:
            external_id = pulumi.Output.secret(args.spec.external_id)
        else:  # generated once, kept in state, exported as a secret
            external_id = random.RandomPassword(f"{name}-external-id", length=32, special=False, opts=child).result
        self.external_id = pulumi.Output.secret(external_id)
        self.role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=external_id.apply(lambda eid: external_trust(args.spec.principal_arn, eid)),
            max_session_duration=3600,
            tags=args.tags,
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-read", role=self.role.id, policy=pulumi.Output.from_input(args.scope).apply(read_only_policy),
            opts=child,
        )  # fmt: skip
        self.arn = self.role.arn
        self.register_outputs({"arn": self.arn})
