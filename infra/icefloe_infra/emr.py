"""The EMR Serverless Spark application and the job run each table's schedule starts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from icefloe.catalog import EMR_ICEBERG_JAR, spark_catalog_conf
from icefloe.spec import CatalogSpec

from .deployment import EmrSpec


@dataclass
class SparkApplicationArgs:
    spec: EmrSpec
    log_group_name: pulumi.Input[str]
    logs_uri: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]
    tags: dict[str, str] = field(default_factory=dict)


class SparkApplication(pulumi.ComponentResource):
    def __init__(self, name: str, args: SparkApplicationArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:emr:SparkApplication", name, None, opts)
        spec = args.spec
        capacity = spec.maximum_capacity
        network = (
            aws.emrserverless.ApplicationNetworkConfigurationArgs(
                subnet_ids=list(spec.subnet_ids), security_group_ids=list(spec.security_group_ids)
            )
            if spec.subnet_ids
            else None
        )
        self.application = aws.emrserverless.Application(
            f"{name}-spark",
            type="spark",
            release_label=spec.release_label,
            architecture=spec.architecture,
            auto_start_configuration=aws.emrserverless.ApplicationAutoStartConfigurationArgs(enabled=True),
            auto_stop_configuration=aws.emrserverless.ApplicationAutoStopConfigurationArgs(
                enabled=True, idle_timeout_minutes=spec.idle_timeout_minutes
            ),
            maximum_capacity=aws.emrserverless.ApplicationMaximumCapacityArgs(
                cpu=capacity.cpu, memory=capacity.memory, disk=capacity.disk
            ),
            network_configuration=network,
            image_configuration=aws.emrserverless.ApplicationImageConfigurationArgs(image_uri=spec.image_uri)
            if spec.image_uri
            else None,
            monitoring_configuration=aws.emrserverless.ApplicationMonitoringConfigurationArgs(
                s3_monitoring_configuration=aws.emrserverless.ApplicationMonitoringConfigurationS3MonitoringConfigurationArgs(
                    log_uri=args.logs_uri, encryption_key_arn=args.kms_key_arn
                ),
                cloudwatch_logging_configuration=aws.emrserverless.ApplicationMonitoringConfigurationCloudwatchLoggingConfigurationArgs(
                    enabled=True, log_group_name=args.log_group_name, log_stream_name_prefix="icefloe"
                ),
            ),
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.id = self.application.id
        self.arn = self.application.arn
        self.register_outputs({"id": self.id, "arn": self.arn})


def spark_submit_parameters(warehouse_uri: str, archive_uri: str, python: str) -> str:
    """Spark settings for a job: the Glue catalog (the runtime's own settings), EMR's Iceberg jar, the bundle."""
    conf = spark_catalog_conf(CatalogSpec(type="glue", warehouse=warehouse_uri)) | {
        "spark.jars": EMR_ICEBERG_JAR,
        "spark.archives": f"{archive_uri}#deps",
        "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON": python,
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
        "spark.emr-serverless.driverEnv.PYTHONPATH": "./deps",
        "spark.executorEnv.PYTHONPATH": "./deps",
    }
    return " ".join(f"--conf {key}={value}" for key, value in conf.items())


# The Scheduler fills this in per firing: a unique ClientToken makes each firing one job run, and a retried
# delivery of the same firing the same job run.
EXECUTION_ID = "<aws.scheduler.execution-id>"


def start_job_run_request(
    *, application_id: str, role_arn: str, identifier: str, entry_point_uri: str, config_uri: str,
    spark_parameters: str, logs_uri: str, kms_key_arn: str, continuous: bool, timeout_minutes: int,
) -> dict:  # fmt: skip
    """The EMR Serverless StartJobRun request for one table (the Scheduler's universal-target input)."""
    arguments = ["run", "--config", config_uri, "--table", identifier, "--continuous" if continuous else "--once", "--json"]
    request = {
        "ApplicationId": application_id,
        "ExecutionRoleArn": role_arn,
        "ClientToken": EXECUTION_ID,
        "Name": f"icefloe-{identifier}",
        "Mode": "STREAMING" if continuous else "BATCH",
        "ExecutionTimeoutMinutes": timeout_minutes,
        "JobDriver": {"SparkSubmit": {"EntryPoint": entry_point_uri, "EntryPointArguments": arguments,
                                      "SparkSubmitParameters": spark_parameters}},  # fmt: skip
        "ConfigurationOverrides": {"MonitoringConfiguration": {"S3MonitoringConfiguration": {
            "LogUri": logs_uri, "EncryptionKeyArn": kms_key_arn}}},  # fmt: skip
    }
    return request


def job_config_document(config: dict) -> str:
    """The stack config as the job reads it (`--config s3://...`): JSON, keys sorted, so its hash is stable."""
    return json.dumps({"config": config}, sort_keys=True, indent=1)
