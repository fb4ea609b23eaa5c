"""The whole icefloe stack: storage, Glue, secrets, roles, the runtime bundle, EMR, schedules, and the outputs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

import pulumi
import pulumi_aws as aws

from icefloe.spec import IcefloeConfig, SecretRef
from icefloe_policies import TAG_OWNER, TAG_STACK

from .bundle import Bundle, build_bundle
from .deployment import DeploymentConfig
from .emr import SparkApplication, SparkApplicationArgs, job_config_document, spark_submit_parameters, start_job_run_request
from .glue import GlueDatabases, GlueDatabasesArgs
from .iam import ExternalAccessRole, ExternalAccessRoleArgs, JobRole, JobRoleArgs, Scope
from .schedules import TableJob, TableSchedules, TableSchedulesArgs, rate_expression
from .secrets import StackSecrets, StackSecretsArgs
from .snippets import query_snippets
from .storage import LakehouseStorage, LakehouseStorageArgs

BundleBuilder = Callable[[str, str], Bundle]  # (architecture, python version) -> Bundle


@dataclass
class IcefloeStackArgs:
    spec: IcefloeConfig
    deployment: DeploymentConfig
    stack_name: str
    build: BundleBuilder = field(default=lambda arch, py: build_bundle(arch, py))


def _resolve_secret_refs(document: dict, arns: dict[str, str]) -> dict:
    """Replace `credentialsSecret: {name: x}` by the ARN of the secret the stack created for x."""
    for cluster in document.get("sourceClusters", []):
        for holder in (cluster, cluster.get("schemaRegistry") or {}):
            ref = holder.get("credentialsSecret")
            if ref and ref.get("name"):
                holder["credentialsSecret"] = {"secretArn": arns[ref["name"]]}
    return document


class IcefloeStack(pulumi.ComponentResource):
    def __init__(self, name: str, args: IcefloeStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:index:IcefloeStack", name, None, opts)
        spec, deployment = args.spec, args.deployment
        child = pulumi.ResourceOptions(parent=self)
        tags = {**deployment.tags, TAG_STACK: args.stack_name, TAG_OWNER: deployment.owner}
        identity, region = aws.get_caller_identity(), aws.get_region()

        storage = LakehouseStorage(f"{name}-lakehouse", LakehouseStorageArgs(deployment.storage, tags), child)
        databases = sorted({spec.database(t) for t in spec.tables} | {c.database_name for c in spec.source_clusters})
        glue = GlueDatabases(
            f"{name}-glue",
            GlueDatabasesArgs(databases, storage.warehouse_uri, deployment.glue.delete_tables_on_destroy, tags),
            child,
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", retention_in_days=deployment.log_retention_days, tags=tags, opts=child
        )
        secrets = StackSecrets(f"{name}-secrets", StackSecretsArgs(deployment.secrets, storage.kms_key_arn, tags), child)
        referenced = [
            ref.secret_arn
            for cluster in spec.source_clusters
            for ref in (cluster.credentials_secret, cluster.schema_registry and cluster.schema_registry.credentials_secret)
            if isinstance(ref, SecretRef) and ref.secret_arn
        ]
        secret_arns = pulumi.Output.all(*secrets.arns.values()).apply(lambda created: [*referenced, *created])

        def scope(values: list) -> Scope:
            bucket_arn, key_arn, log_arn, arns = values
            return Scope(identity.account_id, region.region, bucket_arn, key_arn, deployment.storage.warehouse_prefix,
                         databases, arns, log_arn)  # fmt: skip

        role_scope = pulumi.Output.all(storage.bucket_arn, storage.kms_key_arn, log_group.arn, secret_arns).apply(scope)
        job_role = JobRole(f"{name}-job", JobRoleArgs(role_scope, tags), child)
        external = {
            access.name: ExternalAccessRole(f"{name}-{access.name}", ExternalAccessRoleArgs(access, role_scope, tags), child)
            for access in deployment.external_access
        }

        bundle = args.build(deployment.emr.architecture, "3.11")
        prefix = f"icefloe/bundle/{bundle.digest}"
        aws.s3.BucketObjectv2(
            f"{name}-bundle", bucket=storage.bucket_name, key=f"{prefix}/deps.tar.gz",
            source=pulumi.FileAsset(str(bundle.archive)), opts=child,
        )  # fmt: skip
        aws.s3.BucketObjectv2(
            f"{name}-entry-point", bucket=storage.bucket_name, key=f"{prefix}/main.py",
            source=pulumi.FileAsset(str(bundle.entry_point)), opts=child,
        )  # fmt: skip
        # The job's config: the validated spec, secret names replaced by ARNs, on Glue, content-addressed.
        document = spec.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"catalog"})
        config_body = pulumi.Output.all(storage.warehouse_uri, pulumi.Output.all(**secrets.arns)).apply(
            lambda values: job_config_document({
                "icefloe:sourceClusters": _resolve_secret_refs(dict(document), values[1])["sourceClusters"],
                "icefloe:tables": document["tables"],
                "icefloe:catalog": {"type": "glue", "warehouse": values[0]},
            })  # fmt: skip
        )
        config_key = config_body.apply(lambda body: f"icefloe/config/{hashlib.sha256(body.encode()).hexdigest()}.json")
        config_object = aws.s3.BucketObjectv2(
            f"{name}-job-config", bucket=storage.bucket_name, key=config_key, content=config_body,
            content_type="application/json", opts=child,
        )  # fmt: skip

        logs_uri = storage.bucket_name.apply(lambda b: f"s3://{b}/logs/")
        application = SparkApplication(
            f"{name}-emr",
            SparkApplicationArgs(deployment.emr, log_group.name, logs_uri, storage.kms_key_arn, tags),
            child,
        )
        jobs = []
        for table in spec.select(None):  # enabled tables only: a disabled table has no schedule
            identifier = spec.identifier(table)
            request = pulumi.Output.all(
                application.id, job_role.arn, storage.bucket_name, storage.warehouse_uri, config_object.key,
                storage.kms_key_arn,
            ).apply(lambda v, t=table, ident=identifier: start_job_run_request(
                application_id=v[0], role_arn=v[1], identifier=ident,
                entry_point_uri=f"s3://{v[2]}/{prefix}/main.py", config_uri=f"s3://{v[2]}/{v[4]}",
                spark_parameters=spark_submit_parameters(v[3], f"s3://{v[2]}/{prefix}/deps.tar.gz", deployment.emr.python),
                logs_uri=f"s3://{v[2]}/logs/", kms_key_arn=v[5], continuous=t.continuous,
                timeout_minutes=deployment.emr.streaming_job_minutes if t.continuous else max(30, int(t.refresh_seconds // 60) * 4),
            ))  # fmt: skip
            rate = rate_expression(table.refresh_seconds, table.continuous, deployment.emr.streaming_job_minutes)
            jobs.append(TableJob(identifier, rate, request))
        TableSchedules(
            f"{name}-schedules",
            TableSchedulesArgs(jobs, application.arn, job_role.arn, identity.account_id, tags),
            child,
        )

        self.outputs = {
            "bucket": storage.bucket_name,
            "warehouseUri": storage.warehouse_uri,
            "glueDatabases": databases,
            "tables": [spec.identifier(t) for t in spec.tables],
            "scheduledTables": [job.identifier for job in jobs],
            "applicationId": application.id,
            "jobRoleArn": job_role.arn,
            "externalRoleArns": {key: role.arn for key, role in external.items()},
            "externalIds": pulumi.Output.secret({key: role.external_id for key, role in external.items()}),
            "bundleDigest": bundle.digest,
            "snippets": pulumi.Output.all(storage.warehouse_uri, {k: r.arn for k, r in external.items()}).apply(
                lambda v: query_snippets(region.region, [spec.identifier(t) for t in spec.tables], v[0], v[1])
            ),
        }
        self.register_outputs(self.outputs)
