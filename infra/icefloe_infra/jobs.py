"""What one table's scheduled job is: its config document, Spark parameters, mode and StartJobRun request."""

from __future__ import annotations

import json
from dataclasses import dataclass

from icefloe.spec import CatalogSpec, IcefloeConfig, TableSpec
from icefloe.table.catalog import EMR_ICEBERG_JAR, spark_catalog_conf

from .deployment import EmrSpec, ScheduleSpec

# EventBridge Scheduler replaces this context attribute with the ID of each invocation, so every firing
# starts its own job run (StartJobRun's clientToken is an idempotency key).
EXECUTION_ID = "<aws.scheduler.execution-id>"
# Batch jobs are stopped after this many refresh intervals (30 minutes to 12 hours): a stuck run must end.
BATCH_TIMEOUT_REFRESHES = 4
BATCH_TIMEOUT_BOUNDS = (30, 720)


def job_config_document(spec: IcefloeConfig, catalog: CatalogSpec, secret_arns: dict[str, str]) -> str:
    """The stack config as the job reads it (`--config s3://...`), secret names replaced by the created ARNs.

    JSON (which is YAML) in the stack-file shape `spec.load_config` reads; keys sorted so the hash is stable.
    Only references to secrets are in it, never their values.
    """
    document = spec.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"catalog"})
    for cluster in document["sourceClusters"]:
        for holder in (cluster, cluster.get("schemaRegistry") or {}):
            ref = holder.get("credentialsSecret")
            if ref and ref.get("name"):
                holder["credentialsSecret"] = {"secretArn": secret_arns[ref["name"]]}
    catalog_document = catalog.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True, mode="json")
    catalog_document["type"] = catalog.type
    for key in ("credential", "token"):  # a REST catalog's secret, by reference only
        ref = catalog_document.get(key)
        if ref and ref.get("name"):
            catalog_document[key] = {"secretArn": secret_arns[ref["name"]]}
    config = {
        "icefloe:sourceClusters": document["sourceClusters"],
        "icefloe:tables": document["tables"],
        "icefloe:catalog": catalog_document,
    }
    return json.dumps({"config": config}, sort_keys=True, indent=1)


def spark_submit_parameters(catalog: CatalogSpec, archive_uri: str, jar_uris: list[str], emr: EmrSpec) -> str:
    """Spark settings: the runtime's own catalog settings (Glue or S3 Tables), EMR's Iceberg jar and the shipped
    ones, the bundle and the Python to run it with (the release's 3.11, or your image's), the job size."""
    conf = (
        spark_catalog_conf(catalog)
        | {
            "spark.jars": ",".join([EMR_ICEBERG_JAR, *jar_uris]),
            # The bundle is unpacked as ./deps next to the driver and every executor.
            "spark.archives": f"{archive_uri}#deps",
            "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON": emr.python,
            "spark.emr-serverless.driverEnv.PYSPARK_PYTHON": emr.python,
            "spark.executorEnv.PYSPARK_PYTHON": emr.python,
            "spark.emr-serverless.driverEnv.PYTHONPATH": "./deps",
            "spark.executorEnv.PYTHONPATH": "./deps",
        }
        | emr.job.spark_conf()
    )
    for key, value in conf.items():
        if any(c.isspace() for c in key + value):  # the parameters are one space-separated string
            raise ValueError(f"Spark setting {key}={value!r} contains whitespace")
    return " ".join(f"--conf {key}={value}" for key, value in conf.items())


@dataclass(frozen=True)
class TableJob:
    """How a table runs: a batch per firing, or a continuous (STREAMING) job replaced every streamingJobMinutes."""

    identifier: str
    continuous: bool
    rate_minutes: int
    timeout_minutes: int

    @classmethod
    def plan(cls, spec: IcefloeConfig, table: TableSpec, emr: EmrSpec, schedule: ScheduleSpec) -> TableJob:
        if schedule.runs_continuously(table):
            # One streaming job at a time: the next firing comes as this one times out.
            minutes = emr.streaming_job_minutes
            return cls(spec.identifier(table), True, minutes, minutes)
        minutes = max(1, round(table.refresh_seconds / 60))  # Scheduler's rate() counts whole minutes
        low, high = BATCH_TIMEOUT_BOUNDS
        return cls(spec.identifier(table), False, minutes, min(high, max(low, minutes * BATCH_TIMEOUT_REFRESHES)))

    @property
    def rate_expression(self) -> str:
        unit = "minute" if self.rate_minutes == 1 else "minutes"
        return f"rate({self.rate_minutes} {unit})"

    def arguments(self, config_uri: str) -> list[str]:
        """The entry point's arguments: the runtime's own CLI (`icefloe.cli.build_parser`)."""
        mode = "--continuous" if self.continuous else "--once"
        # --metrics emf: a CloudWatch embedded-metric line per batch, which the tables' alarms watch (alarms.py).
        # --deadline-minutes: EMR stops the job at ExecutionTimeoutMinutes; batches are sized to publish before.
        return [
            "run",
            "--config",
            config_uri,
            "--table",
            self.identifier,
            mode,
            "--json",
            "--metrics",
            "emf",
            "--deadline-minutes",
            str(self.timeout_minutes),
        ]

    def start_job_run_request(
        self,
        *,
        application_id: str,
        role_arn: str,
        entry_point_uri: str,
        config_uri: str,
        spark_parameters: str,
        logs_uri: str,
        kms_key_arn: str,
    ) -> dict:
        """The StartJobRun request, as the Scheduler's universal target takes it (API member names)."""
        return {
            "ApplicationId": application_id,
            "ExecutionRoleArn": role_arn,
            "ClientToken": EXECUTION_ID,
            "Name": f"icefloe-{self.identifier}",
            "Mode": "STREAMING" if self.continuous else "BATCH",  # STREAMING: emr-7.1.0 and later
            "ExecutionTimeoutMinutes": self.timeout_minutes,
            "JobDriver": {
                "SparkSubmit": {
                    "EntryPoint": entry_point_uri,
                    "EntryPointArguments": self.arguments(config_uri),
                    "SparkSubmitParameters": spark_parameters,
                }
            },
            "ConfigurationOverrides": {
                "MonitoringConfiguration": {
                    "S3MonitoringConfiguration": {"LogUri": logs_uri, "EncryptionKeyArn": kms_key_arn}
                }
            },
        }
