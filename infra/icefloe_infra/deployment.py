"""Deployment settings: the `icefloe:*` keys only the Pulumi program reads (storage, EMR, access, secrets, tags).

Same style as the topic-spec model (camelCase, unknown keys are errors); `load_stack_config` validates both from
the stack's `icefloe:*` config, so a typo fails at `pulumi preview` with the key named.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, StringConstraints, field_validator, model_validator

from icefloe.errors import ConfigError
from icefloe.spec import (
    CONFIG_KEYS,
    DEPLOYMENT_KEYS,
    IcefloeConfig,
    Model,
    TableSpec,
    duration_seconds,
    namespaced,
    parse_config,
    validate_keys,
)
from icefloe_policies.emr import SUPPORTED_RELEASES, supported_release

AWS_ARN = r"^arn:aws[a-z-]*:"
# An ECR image: <account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag> or @sha256:<digest>.
ECR_IMAGE = r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/[a-z0-9._/-]+(:[\w.-]{1,128}|@sha256:[0-9a-f]{64})$"
# S3 table buckets: 3-63 lowercase letters, digits and hyphens, starting and ending with a letter or digit.
TABLE_BUCKET_NAME = r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"
# S3 Tables namespaces and tables: lowercase letters, digits and underscores, starting with a letter or digit (Glue
# names may start with an underscore; S3 Tables' may not), and no namespace starting with "aws".
S3_TABLES_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,254}$")
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 3653)
# Release images from emr-7.1.0 have Python 3.11 beside the default 3.9 (docs/deploying.md, "Python on EMR"): the
# bundle is built for it and the jobs run it. emr-7.12.0 ships Spark 3.5 and Iceberg 1.10.0, the nearest to the
# Spark 3.5 / Iceberg 1.10.1 the runtime is tested with locally.
DEFAULT_RELEASE = "emr-7.12.0"
DEFAULT_PYTHON = "/usr/bin/python3.11"
RUNTIME_PYTHON_VERSION = "3.11"


def _duration(value: str, low: float, high: float, what: str) -> str:
    seconds = duration_seconds(value)
    if not low <= seconds <= high:
        raise ValueError(f"{what} must be between {low:g}s and {high:g}s, got {value}")
    return value


class StorageSpec(Model):
    """The lakehouse bucket: created by the stack, or the user's own (bring your own storage); and where the tables
    live: `type: s3` (default) in that bucket under `warehousePrefix` with the Glue Data Catalog, or `type: s3tables`
    in an S3 table bucket the stack creates (`tableBucketName`, default `icefloe-<stack>`), one namespace per
    database. The lakehouse bucket still holds the jobs' bundle, jars, config and logs."""

    type: Literal["s3", "s3tables"] = "s3"
    table_bucket_name: Annotated[str, StringConstraints(pattern=TABLE_BUCKET_NAME)] | None = None
    existing_bucket: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")] | None = None
    existing_kms_key_arn: Annotated[str, StringConstraints(pattern=AWS_ARN + r"kms:")] | None = None
    warehouse_prefix: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_-]+$")] = "warehouse"
    noncurrent_version_days: int = Field(default=30, ge=1)
    force_destroy: bool = False

    @model_validator(mode="after")
    def _byo_needs_key(self) -> StorageSpec:
        if self.existing_bucket and not self.existing_kms_key_arn:
            raise ValueError("existingBucket needs existingKmsKeyArn (the key that encrypts it)")
        if self.existing_kms_key_arn and not self.existing_bucket:
            raise ValueError("existingKmsKeyArn is only used with existingBucket")
        if self.table_bucket_name and self.type != "s3tables":
            raise ValueError("tableBucketName is only used with type: s3tables")
        return self

    def table_bucket(self, stack_name: str) -> str:
        """The table bucket's name: `tableBucketName`, else `icefloe-<stack>` made a valid bucket name."""
        if self.table_bucket_name:
            return self.table_bucket_name
        return ("icefloe-" + re.sub(r"[^a-z0-9-]+", "-", stack_name.lower())).strip("-")[:63].rstrip("-")

    @property
    def uses_table_bucket(self) -> bool:
        return self.type == "s3tables"


class CapacitySpec(Model):
    """The application's ceiling across all running jobs (EMR Serverless `maximumCapacity`)."""

    cpu: Annotated[str, StringConstraints(pattern=r"^\d+ ?vCPU$")] = "16 vCPU"
    memory: Annotated[str, StringConstraints(pattern=r"^\d+ ?GB$")] = "64 GB"
    disk: Annotated[str, StringConstraints(pattern=r"^\d+ ?GB$")] = "200 GB"


class JobSizing(Model):
    """Spark driver and executors of one table's job. EMR Serverless workers take 1, 2, 4, 8 or 16 vCPUs."""

    driver_cores: Literal[1, 2, 4, 8, 16] = 1
    driver_memory: Annotated[str, StringConstraints(pattern=r"^\d+g$")] = "4g"
    executor_cores: Literal[1, 2, 4, 8, 16] = 2
    executor_memory: Annotated[str, StringConstraints(pattern=r"^\d+g$")] = "8g"
    initial_executors: int = Field(default=1, ge=1, le=100)
    max_executors: int = Field(default=4, ge=1, le=1000)
    # A JVM option for the driver and the executors, e.g. -XX:TieredStopAtLevel=1 (C1 only: a fresh run's JIT cost,
    # bench/results/cold_start.md). One option: EMR Serverless takes the Spark settings as one space-separated string.
    # Unset, EMR's own extraJavaOptions stand; set, it replaces them.
    java_option: Annotated[str, StringConstraints(pattern=r"^-XX:[+-]?[A-Za-z]\w*(=[\w.:/-]+)?$")] | None = None

    @model_validator(mode="after")
    def _executors(self) -> JobSizing:
        if self.initial_executors > self.max_executors:
            raise ValueError("initialExecutors must not exceed maxExecutors")
        return self

    def spark_conf(self) -> dict[str, str]:
        return {
            "spark.driver.cores": str(self.driver_cores),
            "spark.driver.memory": self.driver_memory,
            "spark.executor.cores": str(self.executor_cores),
            "spark.executor.memory": self.executor_memory,
            "spark.executor.instances": str(self.initial_executors),
            "spark.dynamicAllocation.maxExecutors": str(self.max_executors),
        } | (
            {"spark.driver.extraJavaOptions": self.java_option, "spark.executor.extraJavaOptions": self.java_option}
            if self.java_option
            else {}
        )


class EmrSpec(Model):
    release_label: str = DEFAULT_RELEASE
    architecture: Literal["X86_64", "ARM64"] = "X86_64"
    maximum_capacity: CapacitySpec = CapacitySpec()
    idle_timeout_minutes: int = Field(default=15, ge=1, le=10080)
    subnet_ids: tuple[Annotated[str, StringConstraints(pattern=r"^subnet-[0-9a-f]+$")], ...] = ()
    security_group_ids: tuple[Annotated[str, StringConstraints(pattern=r"^sg-[0-9a-f]+$")], ...] = ()
    image_uri: Annotated[str, StringConstraints(pattern=ECR_IMAGE)] | None = None  # optional: your own image
    python: Annotated[str, StringConstraints(pattern=r"^/[\w./-]+$")] = DEFAULT_PYTHON
    job: JobSizing = JobSizing()
    # How long one continuous (STREAMING) job runs before the next one replaces it.
    streaming_job_minutes: int = Field(default=60, ge=5, le=1440)

    @field_validator("release_label")
    @classmethod
    def _supported(cls, value: str) -> str:
        if not supported_release(value):  # the policy pack's rule, so the two accept the same releases
            raise ValueError(f"{value!r} is not a release icefloe runs on: use {SUPPORTED_RELEASES}")
        return value

    @model_validator(mode="after")
    def _network(self) -> EmrSpec:
        if bool(self.subnet_ids) != bool(self.security_group_ids):
            raise ValueError("subnetIds and securityGroupIds go together")
        return self


class ExternalAccessSpec(Model):
    """A read-only role for another account or a SaaS (Snowflake, Athena elsewhere), fenced by sts:ExternalId."""

    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]{1,40}$")]
    principal_arn: Annotated[str, StringConstraints(pattern=AWS_ARN + r"iam::\d{12}:(root|role/.+|user/.+)$")]
    external_id: Annotated[str, StringConstraints(min_length=2, max_length=1224, pattern=r"^[\w+=,.@:/-]+$")] | None = (
        None
    )


class SecretSpec(Model):
    """Credentials created in Secrets Manager from Pulumi secret config (`pulumi config set --secret --path ...`)."""

    username: Annotated[str, StringConstraints(min_length=1)]
    password: SecretStr  # never printed by repr() or in a validation error


class GlueSpec(Model):
    delete_tables_on_destroy: bool = False


class ScheduleSpec(Model):
    """How the per-table EventBridge schedules start jobs."""

    # A table whose refresh is shorter than this runs as a continuous (STREAMING) job: starting an EMR
    # Serverless job takes a minute or two, so batch runs that often would overlap.
    continuous_below: str = "5m"
    maximum_retry_attempts: int = Field(default=3, ge=0, le=185)
    maximum_event_age: str = "1h"
    dead_letter_retention: str = "14d"
    state: Literal["ENABLED", "DISABLED"] = "ENABLED"  # DISABLED pauses every table without destroying anything

    @field_validator("continuous_below")
    @classmethod
    def _threshold(cls, value: str) -> str:
        return _duration(value, 0, 86400, "continuousBelow")

    @field_validator("maximum_event_age")
    @classmethod
    def _event_age(cls, value: str) -> str:
        return _duration(value, 60, 86400, "maximumEventAge")  # Scheduler's bounds

    @field_validator("dead_letter_retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        return _duration(value, 60, 14 * 86400, "deadLetterRetention")  # SQS's bounds

    def runs_continuously(self, table: TableSpec) -> bool:
        return table.continuous or table.refresh_seconds < duration_seconds(self.continuous_below)

    @property
    def maximum_event_age_seconds(self) -> int:
        return int(duration_seconds(self.maximum_event_age))

    @property
    def dead_letter_retention_seconds(self) -> int:
        return int(duration_seconds(self.dead_letter_retention))


class AlarmsSpec(Model):
    """Where the tables' CloudWatch alarms notify (each table's thresholds are its `alarms` setting)."""

    topic_arn: (
        Annotated[str, StringConstraints(pattern=AWS_ARN + r"sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$")] | None
    ) = None


class DeploymentConfig(Model):
    owner: Annotated[str, StringConstraints(min_length=1)]
    storage: StorageSpec = StorageSpec()
    emr: EmrSpec = EmrSpec()
    external_access: tuple[ExternalAccessSpec, ...] = ()
    tags: dict[
        Annotated[str, StringConstraints(min_length=1, max_length=128)],
        Annotated[str, StringConstraints(max_length=256)],
    ] = {}
    glue: GlueSpec = GlueSpec()
    secrets: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")], SecretSpec] = {}
    log_retention_days: int = 30
    schedule: ScheduleSpec = ScheduleSpec()
    alarms: AlarmsSpec = AlarmsSpec()

    @field_validator("log_retention_days")
    @classmethod
    def _retention_days(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(f"CloudWatch Logs accepts one of {list(LOG_RETENTION_DAYS)}, got {value}")
        return value

    @field_validator("external_access")
    @classmethod
    def _unique_names(cls, values: tuple[ExternalAccessSpec, ...]) -> tuple[ExternalAccessSpec, ...]:
        names = [v.name for v in values]
        if len(set(names)) != len(names):
            raise ValueError(f"names must be unique, got {names}")
        return values


def load_stack_config(raw: dict[str, Any], source: str = "stack config") -> tuple[IcefloeConfig, DeploymentConfig]:
    """Validate every `icefloe:*` key (without the prefix): the shared model, then the deployment settings."""
    spec = parse_config(raw, source)  # also rejects keys that neither model knows
    if "catalog" in raw and spec.catalog.type != "rest":
        raise ConfigError(
            f"{source}: icefloe:catalog is set by the stack (Glue on the lakehouse bucket, or the "
            "table bucket with icefloe:storage.type s3tables) unless it is an Iceberg REST catalog (type: rest); "
            "remove it"
        )
    deployment = validate_keys(DeploymentConfig, raw, DEPLOYMENT_KEYS, source)
    if spec.catalog.type == "rest" and deployment.storage.uses_table_bucket:
        raise ConfigError(f"{source}: icefloe:catalog type rest and icefloe:storage.type s3tables: choose one")
    if deployment.storage.uses_table_bucket:
        _check_s3_tables_names(spec, source)
    for index, cluster in enumerate(spec.source_clusters):  # references to stack-created secrets must exist
        where = f"icefloe:sourceClusters[{index}] ({cluster.name})"
        refs = {
            "credentialsSecret": cluster.credentials_secret,
            "schemaRegistry.credentialsSecret": cluster.schema_registry.credentials_secret
            if cluster.schema_registry
            else None,
        }
        tls = {f"tls.{key}": ref for key, ref in (cluster.tls.references() if cluster.tls else {}).items()}
        registry_tls = cluster.schema_registry.tls if cluster.schema_registry else None
        tls |= {
            f"schemaRegistry.tls.{k}": ref for k, ref in (registry_tls.references() if registry_tls else {}).items()
        }
        for field, tls_ref in tls.items():
            if tls_ref.secret_arn is None:  # icefloe:secrets creates username/password secrets only
                raise ConfigError(
                    f"{source}: {where}.{field}: a deployed stack references TLS material by secretArn (a Secrets "
                    "Manager secret whose SecretString is the PEM text, or the key's password)"
                )
        _check_secret_refs(refs, where, deployment, source)
    _check_secret_refs(
        {"credential": spec.catalog.credential, "token": spec.catalog.token}, "icefloe:catalog", deployment, source
    )
    return spec, deployment


def _check_secret_refs(refs: dict, where: str, deployment: DeploymentConfig, source: str) -> None:
    """References to stack-created secrets must exist; env references are for local runs only."""
    for field, ref in refs.items():
        if ref is None:
            continue
        if ref.name and ref.name not in deployment.secrets:
            raise ConfigError(
                f"{source}: {where}.{field}: names secret {ref.name!r}, which icefloe:secrets "
                f"does not declare (declared: {sorted(deployment.secrets) or 'none'})"
            )
        if ref.env:
            raise ConfigError(
                f"{source}: {where}.{field}: env is for local runs; use secretArn or name in a deployed stack"
            )


def _check_s3_tables_names(spec: IcefloeConfig, source: str) -> None:
    """Databases become S3 Tables namespaces and tables S3 tables: names Glue takes but S3 Tables refuses fail now."""
    for index, table in enumerate(spec.tables):
        for what, name in (("database", spec.database(table)), ("table", table.table_name)):
            if not S3_TABLES_NAME.match(name) or (what == "database" and name.startswith("aws")):
                raise ConfigError(
                    f"{source}: icefloe:tables[{index}] ({table.topic}): {what} {name!r} is not a valid "
                    "S3 Tables name (lowercase letters, digits and underscores, starting with a letter "
                    "or digit; namespaces not starting with 'aws') for icefloe:storage.type s3tables"
                )


def decode_config_value(value: Any) -> Any:
    """A config value as the program receives it: objects and lists arrive as JSON text, scalars as text.

    Scalars stay text (pydantic coerces "30" to 30 where a number is wanted), so an owner like "1234" stays a string.
    """
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def read_pulumi_config(config, all_keys) -> dict[str, Any]:
    """Every `icefloe:*` key from a `pulumi.Config("icefloe")`, unknown ones included (so they can be rejected)."""
    raw: dict[str, Any] = {}
    for key in sorted(namespaced(dict.fromkeys(all_keys))):
        value = config.get(key)
        if value is not None:
            raw[key] = decode_config_value(value)
    return raw


__all__ = ["CONFIG_KEYS", "DEPLOYMENT_KEYS", "DeploymentConfig", "load_stack_config", "read_pulumi_config"]
