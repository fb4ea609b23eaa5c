"""Deployment settings: the `icefloe:*` keys only the Pulumi program reads (storage, EMR, access, secrets, tags).

Same style as the topic-spec model (camelCase, unknown keys are errors); `load_stack_config` validates both from
one `pulumi.Config("icefloe")`, so a typo fails at `pulumi preview` with the key named.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, ValidationError, model_validator

from icefloe.errors import ConfigError
from icefloe.spec import CONFIG_KEYS, DEPLOYMENT_KEYS, IcefloeConfig, Model, parse_config

AWS_ARN = r"^arn:aws[a-z-]*:"


class StorageSpec(Model):
    """The lakehouse bucket: created by the stack, or the user's own (bring your own storage)."""

    existing_bucket: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")] | None = None
    existing_kms_key_arn: Annotated[str, StringConstraints(pattern=AWS_ARN + r"kms:")] | None = None
    warehouse_prefix: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_-]+$")] = "warehouse"
    noncurrent_version_days: int = Field(default=30, ge=1)
    force_destroy: bool = False

    @model_validator(mode="after")
    def _byo_needs_key(self) -> "StorageSpec":
        if self.existing_bucket and not self.existing_kms_key_arn:
            raise ValueError("existingBucket needs existingKmsKeyArn (the key that encrypts it)")
        return self


class CapacitySpec(Model):
    cpu: Annotated[str, StringConstraints(pattern=r"^\d+ ?vCPU$")] = "16 vCPU"
    memory: Annotated[str, StringConstraints(pattern=r"^\d+ ?GB$")] = "64 GB"
    disk: Annotated[str, StringConstraints(pattern=r"^\d+ ?GB$")] = "200 GB"


class EmrSpec(Model):
    release_label: Annotated[str, StringConstraints(pattern=r"^emr-7\.\d+\.\d+$")] = "emr-7.5.0"
    architecture: Literal["X86_64", "ARM64"] = "X86_64"
    maximum_capacity: CapacitySpec = CapacitySpec()
    idle_timeout_minutes: int = Field(default=15, ge=1, le=10080)
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    # EMR 7.x images run Python 3.9; icefloe needs 3.11 (see infra/README.md for the two-line Dockerfile).
    image_uri: str | None = None
    python: str = "/usr/bin/python3.11"
    streaming_job_minutes: int = Field(default=60, ge=5, le=1440)

    @model_validator(mode="after")
    def _network_pairs(self) -> "EmrSpec":
        if bool(self.subnet_ids) != bool(self.security_group_ids):
            raise ValueError("subnetIds and securityGroupIds go together")
        return self


class ExternalAccessSpec(Model):
    """A read-only role for another account or a SaaS (Snowflake, Athena elsewhere), fenced by sts:ExternalId."""

    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]{1,40}$")]
    principal_arn: Annotated[str, StringConstraints(pattern=AWS_ARN + r"iam::\d{12}:(root|role/.+|user/.+)$")]
    external_id: Annotated[str, StringConstraints(min_length=2, max_length=1224, pattern=r"^[\w+=,.@:/-]+$")] | None = None


class SecretSpec(Model):
    """Credentials created in Secrets Manager from Pulumi secret config (`pulumi config set --secret --path ...`)."""

    username: str
    password: str


class GlueSpec(Model):
    delete_tables_on_destroy: bool = False


class DeploymentConfig(Model):
    storage: StorageSpec = StorageSpec()
    emr: EmrSpec = EmrSpec()
    external_access: tuple[ExternalAccessSpec, ...] = ()
    owner: Annotated[str, StringConstraints(min_length=1)] = "unknown"
    tags: dict[str, str] = {}
    glue: GlueSpec = GlueSpec()
    secrets: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")], SecretSpec] = {}
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 3653] = 30
    schedule: dict[str, Any] = {}


_ERROR_PREFIX = re.compile(r"^Value error, ")


def load_stack_config(raw: dict[str, Any], source: str = "stack config") -> tuple[IcefloeConfig, DeploymentConfig]:
    """Validate every `icefloe:*` key (without the prefix): the shared model, then the deployment settings."""
    spec = parse_config(raw, source)
    deployment_raw = {k: v for k, v in raw.items() if k in DEPLOYMENT_KEYS}
    try:
        deployment = DeploymentConfig.model_validate(deployment_raw)
    except ValidationError as error:
        lines = [
            "  icefloe:" + ".".join(str(p) for p in item["loc"]) + ": " + _ERROR_PREFIX.sub("", item["msg"])
            for item in error.errors()
        ]
        raise ConfigError(f"{source}: invalid icefloe config:\n" + "\n".join(lines)) from None
    for table in spec.tables:  # references to stack-created secrets must exist
        cluster = spec.cluster(table.source_cluster)
        for ref in (cluster.credentials_secret, cluster.schema_registry and cluster.schema_registry.credentials_secret):
            if ref is not None and ref.name and ref.name not in deployment.secrets:
                raise ConfigError(f"{source}: sourceCluster {cluster.name} names secret {ref.name!r}, "
                                  f"which icefloe:secrets does not declare")  # fmt: skip
            if ref is not None and ref.env:
                raise ConfigError(f"{source}: sourceCluster {cluster.name}: credentialsSecret.env is for local runs; "
                                  "use secretArn or name in a deployed stack")  # fmt: skip
    if spec.catalog.type != "local":
        raise ConfigError(f"{source}: icefloe:catalog is set by the stack (Glue), do not declare it")
    return spec, deployment


def read_pulumi_config(config) -> dict[str, Any]:
    """Every `icefloe:*` key from a `pulumi.Config("icefloe")`, structured values decoded."""
    raw: dict[str, Any] = {}
    for key in (*CONFIG_KEYS, *DEPLOYMENT_KEYS):
        value = config.get(key)
        if value is None:
            continue
        try:
            raw[key] = json.loads(value)
        except ValueError:
            raw[key] = value
    return raw
