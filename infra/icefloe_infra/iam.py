"""IAM: the EMR Serverless job role (least privilege) and read-only external access roles fenced by ExternalId."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from icefloe.source.kafka import CONSUMER_GROUP
from icefloe.spec import MSK_IAM, IcefloeConfig

from . import prefixes
from .deployment import ExternalAccessSpec


def policy(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def service_trust(service: str, account_id: str) -> str:
    """Trust an AWS service, only on behalf of this account (confused-deputy guard)."""
    return policy(
        {
            "Effect": "Allow",
            "Principal": {"Service": service},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
        }
    )


@dataclass(frozen=True)
class KafkaAccess:
    """An MSK cluster read with IAM authentication, and the topics the stack reads from it."""

    cluster_arn: str
    topic_arns: tuple[str, ...]
    group_arn: str  # the group librdkafka's consumers name (kafka_source.CONSUMER_GROUP)


def kafka_access(spec: IcefloeConfig) -> list[KafkaAccess]:
    """What the job reads from each MSK IAM cluster: its ARN, the declared topics' ARNs, the consumers' group ARN."""
    found = []
    for cluster in spec.source_clusters:
        if cluster.sasl_mechanism != MSK_IAM:
            continue
        topics = sorted({t.topic for t in spec.tables if t.source_cluster == cluster.name})
        group = cluster.msk_topic_arn(CONSUMER_GROUP).replace(":topic/", ":group/", 1)
        found.append(KafkaAccess(cluster.cluster_arn, tuple(cluster.msk_topic_arn(t) for t in topics), group))  # type: ignore[arg-type]  # clusterArn is required for MSK IAM (SourceCluster)
    return found


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
    table_bucket_arn: str | None = None  # the tables live in this S3 table bucket, not in the warehouse prefix + Glue
    kafka: list[KafkaAccess] = field(default_factory=list)  # MSK IAM clusters and the topics the stack reads
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
    """What a table's job needs, and no more: its warehouse prefix (or table bucket), the stack's objects, key,
    tables, secrets, logs, and the MSK topics it reads with IAM."""
    statements = [
        # The bundle, its entry point, the jars and the job config are read-only for the job.
        {
            "Sid": "ReadBundleAndConfig",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": [f"{scope.bucket_arn}/{prefixes.ARTIFACTS}/*"],
        },
        {
            "Sid": "WriteJobLogs",
            "Effect": "Allow",
            "Action": ["s3:PutObject"],
            "Resource": [f"{scope.bucket_arn}/{prefixes.LOGS}/*"],
        },
        {
            "Sid": "BucketLocation",
            "Effect": "Allow",
            "Action": ["s3:GetBucketLocation"],
            "Resource": [scope.bucket_arn],
        },
        {
            "Sid": "DataKey",
            "Effect": "Allow",
            "Resource": [scope.kms_key_arn],
            "Action": ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
        },
    ]
    statements += (
        table_bucket_statements(scope.table_bucket_arn) if scope.table_bucket_arn else warehouse_statements(scope)
    )
    statements += kafka_statements(scope.kafka)
    if scope.secret_arns:
        statements.append(
            {
                "Sid": "KafkaCredentials",
                "Effect": "Allow",
                "Action": ["secretsmanager:GetSecretValue"],
                "Resource": scope.secret_arns,
            }
        )
        # A referenced secret may be encrypted with a customer managed key of its own, unknown to the stack: Decrypt
        # with the keys of the secrets' accounts and regions, through Secrets Manager only and for these secrets only
        # (Secrets Manager's encryption context names the secret's ARN).
        places = sorted({tuple(arn.split(":")[3:5]) for arn in scope.secret_arns})
        key_arns: list[str] = [f"arn:aws:kms:{region}:{account}:key/*" for region, account in places]
        via: list[str] = sorted({f"secretsmanager.{region}.amazonaws.com" for region, _ in places})
        condition: dict[str, dict[str, list[str]]] = {
            "StringEquals": {"kms:ViaService": via},
            "ForAnyValue:StringEquals": {"kms:EncryptionContext:SecretARN": scope.secret_arns},
        }
        keys: dict[str, Any] = {"Sid": "KafkaCredentialKeys", "Effect": "Allow", "Action": ["kms:Decrypt"]}
        statements.append(keys | {"Resource": key_arns, "Condition": condition})
    if scope.schema_registries:
        # Decoding records framed for the AWS Glue Schema Registry: read-only, its registries and their schemas.
        base = f"arn:aws:glue:{{}}:{scope.account_id}"
        statements.append(
            {
                "Sid": "GlueSchemaRegistry",
                "Effect": "Allow",
                "Action": ["glue:GetSchemaVersion", "glue:GetSchema", "glue:GetSchemaByDefinition", "glue:GetRegistry"],
                "Resource": [
                    arn
                    for region, name in scope.schema_registries
                    for arn in (f"{base.format(region)}:registry/{name}", f"{base.format(region)}:schema/{name}/*")
                ],
            }
        )
    if scope.log_group_arn:
        statements += [
            {
                "Sid": "JobLogs",
                "Effect": "Allow",
                "Resource": [f"{scope.log_group_arn}:*"],
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            },
            # EMR Serverless looks the group up before writing; DescribeLogGroups takes no narrower resource.
            {
                "Sid": "FindLogGroup",
                "Effect": "Allow",
                "Action": ["logs:DescribeLogGroups"],
                "Resource": [f"arn:aws:logs:{scope.region}:{scope.account_id}:log-group:*"],
            },
        ]
    return policy(*statements)


def warehouse_statements(scope: Scope) -> list[dict]:
    """Tables in the lakehouse bucket's warehouse prefix, catalogued in Glue."""
    return [
        {
            "Sid": "WarehouseReadWrite",
            "Effect": "Allow",
            "Resource": [f"{scope.bucket_arn}/{scope.warehouse_prefix}/*"],
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
        },
        list_warehouse_statement(scope),  # Iceberg's orphan-file cleanup lists the warehouse
        {
            "Sid": "GlueTables",
            "Effect": "Allow",
            "Resource": scope.glue_arns(),
            "Action": [
                "glue:GetCatalog",
                "glue:GetDatabase",
                "glue:GetDatabases",
                "glue:GetTable",
                "glue:GetTables",
                "glue:CreateTable",
                "glue:UpdateTable",
                "glue:DeleteTable",
                "glue:GetPartitions",
            ],
        },
    ]


def list_warehouse_statement(scope: Scope) -> dict:
    """Listing the lakehouse bucket, limited to the warehouse prefix."""
    return {
        "Sid": "ListWarehouse",
        "Effect": "Allow",
        "Action": ["s3:ListBucket"],
        "Resource": [scope.bucket_arn],
        "Condition": {"StringLike": {"s3:prefix": [f"{scope.warehouse_prefix}/*", scope.warehouse_prefix]}},
    }


def table_bucket_statements(bucket_arn: str) -> list[dict]:
    """Tables in an S3 table bucket through its Iceberg REST endpoint, mapped as AWS documents the endpoint's
    operations: config (GetTableBucket), namespaces listed and loaded, tables listed, created (CreateTable +
    PutTableData), loaded (GetTableMetadataLocation + GetTableData), committed (UpdateTableMetadataLocation +
    PutTableData + GetTableData) and checked (GetTable). Namespaces are the stack's (no CreateNamespace) and icefloe
    drops no table (no DeleteTable); nothing on other buckets. Table ARNs carry table ids, not names, so the tables
    are `bucket/<name>/table/*`."""
    return [
        {
            "Sid": "TableBucket",
            "Effect": "Allow",
            "Resource": [bucket_arn],
            "Action": [
                "s3tables:GetTableBucket",
                "s3tables:ListNamespaces",
                "s3tables:GetNamespace",
                "s3tables:ListTables",
                "s3tables:CreateTable",
            ],
        },
        {
            "Sid": "Tables",
            "Effect": "Allow",
            "Resource": [f"{bucket_arn}/table/*"],
            "Action": [
                "s3tables:GetTable",
                "s3tables:GetTableMetadataLocation",
                "s3tables:UpdateTableMetadataLocation",
                "s3tables:GetTableData",
                "s3tables:PutTableData",
            ],
        },
    ]


def kafka_statements(clusters: list[KafkaAccess]) -> list[dict]:
    """MSK IAM: connect to the cluster, describe and read the declared topics, nothing else (no writes, no
    topic or cluster changes). The consumers never join or commit to a group, but librdkafka's must name one and
    looks up its coordinator (FindCoordinator, authorized as DescribeGroup): that group only. Spark's Java consumers
    use `assign` without commits and ask for no group."""
    clusters = [c for c in clusters if c.topic_arns]  # a cluster no table reads needs nothing
    if not clusters:
        return []
    return [
        {
            "Sid": "KafkaConnect",
            "Effect": "Allow",
            "Action": ["kafka-cluster:Connect"],
            "Resource": [c.cluster_arn for c in clusters],
        },
        {
            "Sid": "KafkaReadTopics",
            "Effect": "Allow",
            "Action": ["kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"],
            "Resource": [arn for c in clusters for arn in c.topic_arns],
        },
        {
            "Sid": "KafkaConsumerGroup",
            "Effect": "Allow",
            "Action": ["kafka-cluster:DescribeGroup"],
            "Resource": [c.group_arn for c in clusters],
        },
    ]


def read_only_policy(scope: Scope) -> str:
    """Read the tables: warehouse objects (any version), the key that decrypts them, the catalog entries; or, in a
    table bucket, its namespaces, tables, metadata and data (the REST endpoint's read operations)."""
    if scope.table_bucket_arn:
        return policy(
            {
                "Sid": "ReadTableBucket",
                "Effect": "Allow",
                "Resource": [scope.table_bucket_arn],
                "Action": [
                    "s3tables:GetTableBucket",
                    "s3tables:ListNamespaces",
                    "s3tables:GetNamespace",
                    "s3tables:ListTables",
                ],
            },
            {
                "Sid": "ReadTables",
                "Effect": "Allow",
                "Resource": [f"{scope.table_bucket_arn}/table/*"],
                "Action": ["s3tables:GetTable", "s3tables:GetTableMetadataLocation", "s3tables:GetTableData"],
            },
        )
    return policy(
        {
            "Sid": "ReadWarehouse",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:GetObjectVersion"],
            "Resource": [f"{scope.bucket_arn}/{scope.warehouse_prefix}/*"],
        },
        list_warehouse_statement(scope),
        {
            "Sid": "BucketLocation",
            "Effect": "Allow",
            "Action": ["s3:GetBucketLocation"],
            "Resource": [scope.bucket_arn],
        },
        {
            "Sid": "DecryptData",
            "Effect": "Allow",
            "Action": ["kms:Decrypt", "kms:DescribeKey"],
            "Resource": [scope.kms_key_arn],
        },
        {
            "Sid": "ReadCatalog",
            "Effect": "Allow",
            "Resource": scope.glue_arns(),
            "Action": [
                "glue:GetCatalog",
                "glue:GetDatabase",
                "glue:GetDatabases",
                "glue:GetTable",
                "glue:GetTables",
                "glue:GetPartitions",
            ],
        },
    )


def external_trust(principal_arn: str, external_id: str) -> str:
    return policy(
        {
            "Effect": "Allow",
            "Principal": {"AWS": principal_arn},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"sts:ExternalId": external_id}},
        }
    )


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
            f"{name}-policy",
            role=self.role.id,
            policy=scope.apply(job_policy),
            opts=pulumi.ResourceOptions(parent=self),
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
        external_id: pulumi.Output[str]
        if args.spec.external_id:
            external_id = pulumi.Output.secret(args.spec.external_id)
        else:  # generated once, kept in state, exported as a secret
            external_id = random.RandomPassword(f"{name}-external-id", length=32, special=False, opts=child).result
        self.external_id: pulumi.Output[str] = pulumi.Output.secret(external_id)
        self.role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=external_id.apply(lambda eid: external_trust(args.spec.principal_arn, eid)),
            max_session_duration=3600,
            tags=args.tags,
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-read",
            role=self.role.id,
            policy=pulumi.Output.from_input(args.scope).apply(read_only_policy),
            opts=child,
        )
        self.arn = self.role.arn
        self.register_outputs({"arn": self.arn})
