"""The whole icefloe stack: storage, Glue (or an S3 table bucket), secrets, roles, the runtime bundle, EMR,
schedules, and the outputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_aws as aws

from icefloe.session import jvm_lib
from icefloe.spec import CatalogSpec, IcefloeConfig
from icefloe_policies import TAG_OWNER, TAG_STACK

from . import prefixes
from .alarms import TableAlarms, TableAlarmsArgs
from .artifacts import RuntimeArtifacts, RuntimeArtifactsArgs
from .bundle import Bundle, build_bundle
from .deployment import RUNTIME_PYTHON_VERSION, DeploymentConfig
from .emr import SparkApplication, SparkApplicationArgs
from .glue import GlueDatabases, GlueDatabasesArgs
from .iam import (
    ExternalAccessRole,
    ExternalAccessRoleArgs,
    JobRole,
    JobRoleArgs,
    Scope,
    glue_schema_registries,
    kafka_access,
)
from .jars import job_jars
from .jobs import TableJob, job_config_document, spark_submit_parameters
from .schedules import ScheduledJob, TableSchedules, TableSchedulesArgs
from .secrets import StackSecrets, StackSecretsArgs, referenced_secret_arns
from .snippets import query_snippets
from .storage import LakehouseStorage, LakehouseStorageArgs
from .table_bucket import TableBucket, TableBucketArgs

BundleBuilder = Callable[[str, str], Bundle]  # (architecture, python version) -> Bundle


@dataclass
class IcefloeStackArgs:
    spec: IcefloeConfig
    deployment: DeploymentConfig
    stack_name: str
    build: BundleBuilder = field(default=build_bundle)
    jar_dir: Path = field(default_factory=lambda: jvm_lib() / "spark")  # where scripts/setup.sh put the jars


class IcefloeStack(pulumi.ComponentResource):
    outputs: dict

    def __init__(self, name: str, args: IcefloeStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:index:IcefloeStack", name, None, opts)
        spec, deployment = args.spec, args.deployment
        child = pulumi.ResourceOptions(parent=self)
        tags = {**deployment.tags, TAG_STACK: args.stack_name, TAG_OWNER: deployment.owner}
        identity, region = aws.get_caller_identity(), aws.get_region()

        storage = LakehouseStorage(f"{name}-lakehouse", LakehouseStorageArgs(deployment.storage, tags), child)
        databases = sorted({spec.database(t) for t in spec.tables} | {c.database_name for c in spec.source_clusters})
        table_bucket_arn: pulumi.Output[str | None] = pulumi.Output.from_input(None)
        if spec.catalog.type == "rest":  # an Iceberg REST catalog of its own: it owns namespaces and storage
            catalog = pulumi.Output.from_input(spec.catalog)
        elif deployment.storage.uses_table_bucket:
            table_bucket = TableBucket(
                f"{name}-tables",
                TableBucketArgs(
                    deployment.storage.table_bucket(args.stack_name),
                    databases,
                    deployment.storage.force_destroy,
                    tags,
                ),
                child,
            )
            table_bucket_arn = table_bucket.arn
            catalog = table_bucket.arn.apply(lambda arn: CatalogSpec(type="s3tables", warehouse=arn))
        else:
            GlueDatabases(
                f"{name}-glue",
                GlueDatabasesArgs(databases, storage.warehouse_uri, deployment.glue.delete_tables_on_destroy, tags),
                child,
            )
            catalog = storage.warehouse_uri.apply(lambda uri: CatalogSpec(type="glue", warehouse=uri))
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", retention_in_days=deployment.log_retention_days, tags=tags, opts=child
        )
        secrets = StackSecrets(
            f"{name}-secrets", StackSecretsArgs(deployment.secrets, storage.kms_key_arn, tags), child
        )
        referenced = referenced_secret_arns(spec)
        secret_arns = pulumi.Output.all(*secrets.arns.values()).apply(lambda created: [*referenced, *created])

        def scope(values: list) -> Scope:
            bucket_arn, key_arn, log_arn, arns, tables_arn = values
            return Scope(
                identity.account_id,
                region.region,
                bucket_arn,
                key_arn,
                deployment.storage.warehouse_prefix,
                databases,
                arns,
                log_arn,
                tables_arn,
                kafka_access(spec),
                glue_schema_registries(spec),
            )

        role_scope = pulumi.Output.all(
            storage.bucket_arn, storage.kms_key_arn, log_group.arn, secret_arns, table_bucket_arn
        ).apply(scope)
        job_role = JobRole(f"{name}-job", JobRoleArgs(role_scope, tags), child)
        external = {
            access.name: ExternalAccessRole(
                f"{name}-{access.name}", ExternalAccessRoleArgs(access, role_scope, tags), child
            )
            for access in deployment.external_access
        }

        bundle = args.build(deployment.emr.architecture, RUNTIME_PYTHON_VERSION)
        job_config = pulumi.Output.all(catalog, pulumi.Output.all(**secrets.arns)).apply(
            lambda values: job_config_document(spec, values[0], values[1])
        )
        jars = job_jars(args.jar_dir, msk_iam=spec.uses_msk_iam)
        artifacts = RuntimeArtifacts(
            f"{name}-runtime", RuntimeArtifactsArgs(storage.bucket_name, bundle, job_config, jars), child
        )
        logs_uri = storage.bucket_name.apply(lambda b: prefixes.s3_uri(b, f"{prefixes.LOGS}/"))
        application = SparkApplication(
            f"{name}-emr",
            SparkApplicationArgs(deployment.emr, log_group.name, logs_uri, storage.kms_key_arn, tags),
            child,
        )

        scheduled = []
        for table in spec.select(None):  # enabled tables only: a disabled table has no schedule
            job = TableJob.plan(spec, table, deployment.emr, deployment.schedule)
            request = pulumi.Output.all(
                application.id,
                job_role.arn,
                artifacts.entry_point_uri,
                artifacts.config_uri,
                artifacts.archive_uri,
                catalog,
                logs_uri,
                storage.kms_key_arn,
                artifacts.jar_uris,
            ).apply(
                lambda v, job=job: job.start_job_run_request(  # type: ignore[misc]  # a lambda binding the loop variable as a default
                    application_id=v[0],
                    role_arn=v[1],
                    entry_point_uri=v[2],
                    config_uri=v[3],
                    spark_parameters=spark_submit_parameters(v[5], v[4], v[8], deployment.emr),
                    logs_uri=v[6],
                    kms_key_arn=v[7],
                )
            )
            scheduled.append(ScheduledJob(job, request))
        schedules = TableSchedules(
            f"{name}-schedules",
            TableSchedulesArgs(
                scheduled, deployment.schedule, application.arn, job_role.arn, identity.account_id, tags
            ),
            child,
        )
        alarms = TableAlarms(f"{name}-alarms", TableAlarmsArgs(spec, deployment.alarms, args.stack_name, tags), child)

        identifiers = [spec.identifier(t) for t in spec.tables]
        external_arns = {key: role.arn for key, role in external.items()}
        self.outputs = {
            "bucket": storage.bucket_name,
            "kmsKeyArn": storage.kms_key_arn,
            "warehouseUri": storage.warehouse_uri,
            "glueDatabases": [] if deployment.storage.uses_table_bucket else databases,
            "tableBucketArn": table_bucket_arn,
            "tables": identifiers,
            "scheduledTables": {
                s.job.identifier: "continuous" if s.job.continuous else s.job.rate_expression for s in scheduled
            },
            "applicationId": application.id,
            "jobRoleArn": job_role.arn,
            "schedulerRoleArn": schedules.role_arn,
            "deadLetterQueueUrl": schedules.dead_letter_queue_url,
            "logGroup": log_group.name,
            "alarms": alarms.alarm_names,
            "externalRoleArns": external_arns,
            "externalIds": pulumi.Output.secret({key: role.external_id for key, role in external.items()}),
            "jobConfigUri": artifacts.config_uri,
            "bundleDigest": bundle.digest,
            "snippets": pulumi.Output.all(storage.warehouse_uri, external_arns).apply(
                lambda v: query_snippets(
                    identity.account_id,
                    region.region,
                    identifiers,
                    v[0],
                    v[1],
                    spec.catalog if spec.catalog.type == "rest" else None,
                )
            ),
        }
        self.register_outputs(self.outputs)
