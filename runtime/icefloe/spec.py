"""The topic-spec model: the one description of what a user declares, shared by infra and runtime.

Users write it in Pulumi stack config (`Pulumi.<stack>.yaml`, keys under `icefloe:`), in camelCase like
all Pulumi config. The Pulumi program validates it at `pulumi preview`; the runtime validates the very same
document again before it touches Kafka, so a typo fails early in both places with a message that names the
table and the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from icefloe.batch_columns import KAFKA_COLUMNS, UPSERT_COLUMNS
from icefloe.errors import ConfigError
from icefloe.inline_types import DECIMAL_TYPE, FIXED_TYPE, PRIMITIVES
from icefloe.partitioning import PartitionField, parse_partition_field

# Glue and Athena want lowercase names of letters, digits and underscores.
GLUE_NAME = r"^[a-z_][a-z0-9_]{0,254}$"
LAG_ALARM_REFRESHES = 3
DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def glue_safe_name(text: str) -> str:
    """Derive a Glue/Athena-safe identifier (lowercase, `[a-z0-9_]`) from a topic or cluster name."""
    name = re.sub(r"[^a-z0-9_]", "_", text.lower())
    if not name or name[0].isdigit():
        name = "t_" + name
    return name[:255]


def duration_seconds(text: str) -> float:
    match = DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 1h or 7d")
    return int(match.group(1)) * _DURATION_SECONDS[match.group(2)]


def format_duration(seconds: float) -> str:
    """A duration for people, to the second: 42s, 3m05s, 2h10m, 3d04h."""
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _without_userinfo(value: str | None, info: ValidationInfo, instead: str) -> str | None:
    """A URL field's value, refused when it carries credentials (`instead`: where they belong): they would be printed
    with every error that names the URL (logs, --json, heartbeats, metrics)."""
    if value is not None and "@" in urlsplit(value).netloc:
        raise ValueError(
            f"{to_camel(info.field_name)} must not carry credentials (user:password@host): {instead}"  # type: ignore[arg-type]  # a field validator has its field's name
        )
    return value


class Model(BaseModel):
    """camelCase in, snake_case attributes; unknown keys are errors (a typo must not be ignored)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class SecretRef(Model):
    """Where a credential lives. Never the credential itself.

    `secretArn`: an AWS Secrets Manager secret holding JSON like {"username": ..., "password": ...}.
    `name`: a secret the stack creates in Secrets Manager from Pulumi secret config (`icefloe:secrets`); the
    Pulumi program replaces it by the created secret's ARN in the job's config.
    `env`: a prefix of environment variables (`<ENV>_USERNAME`, `<ENV>_PASSWORD`), for local runs.
    """

    secret_arn: Annotated[str, StringConstraints(pattern=r"^arn:aws[a-z-]*:secretsmanager:")] | None = None
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")] | None = None
    env: Annotated[str, StringConstraints(pattern=r"^[A-Z_][A-Z0-9_]*$")] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if [self.secret_arn, self.name, self.env].count(None) != 2:
            raise ValueError("give exactly one of secretArn, name or env")
        return self


class TlsSpec(Model):
    """TLS material for a cluster or a registry, each a secret reference holding PEM text (never the PEM itself).

    `caCertificate`: the CA (chain) that signed the server's certificate, when it is not a public one (a private CA).
    `clientCertificate` + `clientKey`: a client certificate for mutual TLS (MSK with ACM Private CA, Aiven, most
    on-premises clusters); `clientKeyPassword` when the key is encrypted. A `secretArn` secret's SecretString is the
    PEM text (the password: the text of the password); `env` names one environment variable holding it (local runs).
    `endpointIdentification`: check that the server's certificate names the host connected to (on by default).
    """

    ca_certificate: SecretRef | None = None
    client_certificate: SecretRef | None = None
    client_key: SecretRef | None = None
    client_key_password: SecretRef | None = None
    endpoint_identification: bool = True

    @model_validator(mode="after")
    def _pairs(self) -> TlsSpec:
        if (self.client_certificate is None) != (self.client_key is None):
            raise ValueError("clientCertificate and clientKey go together (mutual TLS needs both)")
        if self.client_key_password is not None and self.client_key is None:
            raise ValueError("clientKeyPassword only applies with clientKey")
        return self

    def references(self) -> dict[str, SecretRef]:
        """The set references by their camelCase key."""
        refs = {
            "caCertificate": self.ca_certificate,
            "clientCertificate": self.client_certificate,
            "clientKey": self.client_key,
            "clientKeyPassword": self.client_key_password,
        }
        return {key: ref for key, ref in refs.items() if ref is not None}


class SchemaRegistrySpec(Model):
    """A Confluent-compatible registry (`url`, the default type) or an AWS Glue Schema Registry (`type: glue`).

    Glue: `registryName`, `region`; `schemaName` names the table's schema in the registry (`{topic}` is replaced;
    default `{topic}-value`), `keySchemaName` the schema of its Kafka keys when a `keyFormat` reads them through the
    registry (default `{topic}-key`, the Python serializer's naming); `endpoint` only for local runs (e.g. a moto
    server). AWS credentials come from the environment (the job's role on EMR), never from the config.
    """

    type: Literal["confluent", "glue"] = "confluent"
    url: Annotated[str, StringConstraints(pattern=r"^(https?|mock)://")] | None = None
    credentials_secret: SecretRef | None = None
    tls: TlsSpec | None = None
    registry_name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.$#-]{1,255}$")] | None = None
    region: Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")] | None = None
    schema_name: Annotated[str, StringConstraints(min_length=1, max_length=255)] = "{topic}-value"
    key_schema_name: Annotated[str, StringConstraints(min_length=1, max_length=255)] = "{topic}-key"
    endpoint: Annotated[str, StringConstraints(pattern=r"^https?://")] | None = None

    @model_validator(mode="after")
    def _kind(self) -> SchemaRegistrySpec:
        if self.type == "confluent":
            if self.url is None:
                raise ValueError("a Confluent-compatible schemaRegistry needs url (or type: glue)")
            glue_only = [
                k
                for k, v in (("registryName", self.registry_name), ("region", self.region), ("endpoint", self.endpoint))
                if v is not None
            ]
            named = [
                k
                for k, v, default in (
                    ("schemaName", self.schema_name, "{topic}-value"),
                    ("keySchemaName", self.key_schema_name, "{topic}-key"),
                )
                if v != default
            ]
            if glue_only or named:
                raise ValueError(f"{', '.join(glue_only + named)} only apply with type: glue")
            if self.tls is not None and not self.url.startswith("https://"):
                raise ValueError("tls applies to an https:// url only")
            if self.tls is not None and not self.tls.endpoint_identification:
                raise ValueError("a schemaRegistry's client always checks the host name: remove endpointIdentification")
        else:
            if self.registry_name is None or self.region is None:
                raise ValueError("a Glue schemaRegistry (type: glue) needs registryName and region")
            if self.url is not None or self.credentials_secret is not None or self.tls is not None:
                raise ValueError(
                    "a Glue schemaRegistry takes no url, credentialsSecret or tls (AWS credentials come "
                    "from the environment: the job's role)"
                )
            if self.schema_name == self.key_schema_name:
                raise ValueError(
                    f"schemaName and keySchemaName are both {self.schema_name!r}: keys and values need "
                    "schemas of their own (the table's columns come from the latest value version)"
                )
        return self

    @field_validator("url", "endpoint")
    @classmethod
    def _no_userinfo(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _without_userinfo(value, info, "put them in a secret named by credentialsSecret")

    @field_validator("schema_name", "key_schema_name")
    @classmethod
    def _only_topic_placeholder(cls, value: str, info: ValidationInfo) -> str:
        rest = value.replace("{topic}", "")  # Glue schema names have no braces: any left is a typo
        if "{" in rest or "}" in rest:
            raise ValueError(f"{to_camel(info.field_name)} {value!r}: the only placeholder is {{topic}}")  # type: ignore[arg-type]  # a field validator has its field's name
        return value

    def glue_schema(self, topic: str, key: bool = False) -> str:
        """The name of a topic's value (or key) schema in a Glue registry."""
        return (self.key_schema_name if key else self.schema_name).replace("{topic}", topic)


# arn:aws:kafka:<region>:<account>:cluster/<cluster name>/<cluster uuid>, as MSK names a provisioned or serverless cluster.
MSK_CLUSTER_ARN = re.compile(
    r"^arn:(aws[a-z-]*):kafka:([a-z0-9-]+):(\d{12}):cluster/([A-Za-z0-9-]{1,64})/([A-Za-z0-9-]+)$"
)
MSK_IAM = "AWS_MSK_IAM"
# arn:aws:s3tables:<region>:<account>:bucket/<name>: an S3 table bucket (3-63 lowercase letters, digits, hyphens).
TABLE_BUCKET_ARN = re.compile(
    r"^arn:(aws[a-z-]*):s3tables:([a-z0-9-]+):(\d{12}):bucket/([a-z0-9][a-z0-9-]{1,61}[a-z0-9])$"
)


class SourceCluster(Model):
    """A Kafka cluster. `saslMechanism: AWS_MSK_IAM` (Amazon MSK's IAM access control) signs in with the job role's
    own AWS credentials, so it takes no credentialsSecret but the cluster's `clusterArn`: its region signs the
    token, and the Pulumi program scopes the role's `kafka-cluster:*` permissions to it and the declared topics."""

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    bootstrap_servers: Annotated[str, StringConstraints(min_length=1)]
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "AWS_MSK_IAM"] | None = None
    credentials_secret: SecretRef | None = None
    tls: TlsSpec | None = None
    cluster_arn: Annotated[str, StringConstraints(pattern=MSK_CLUSTER_ARN.pattern)] | None = None
    schema_registry: SchemaRegistrySpec | None = None
    database: Annotated[str, StringConstraints(pattern=GLUE_NAME)] | None = None

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> SourceCluster:
        uses_sasl = self.security_protocol.startswith("SASL")
        if not uses_sasl and self.sasl_mechanism is not None:
            raise ValueError(f"saslMechanism is set but securityProtocol {self.security_protocol} does not use SASL")
        if self.sasl_mechanism == MSK_IAM:
            if self.security_protocol != "SASL_SSL":
                raise ValueError(f"saslMechanism {MSK_IAM} needs securityProtocol SASL_SSL (MSK's IAM listener is TLS)")
            if self.credentials_secret is not None:
                raise ValueError(
                    f"saslMechanism {MSK_IAM} signs in with the job's AWS credentials: remove credentialsSecret"
                )
            if self.cluster_arn is None:
                raise ValueError(
                    f"saslMechanism {MSK_IAM} needs clusterArn (arn:aws:kafka:<region>:<account>:"
                    "cluster/<name>/<uuid>): its region signs the token and scopes the job's permissions"
                )
        elif uses_sasl and (self.sasl_mechanism is None or self.credentials_secret is None):
            raise ValueError(f"securityProtocol {self.security_protocol} needs saslMechanism and credentialsSecret")
        if self.tls is not None and not self.security_protocol.endswith("SSL"):
            raise ValueError(f"tls needs securityProtocol SSL or SASL_SSL, not {self.security_protocol}")
        if self.cluster_arn is not None and self.sasl_mechanism != MSK_IAM:
            raise ValueError(f"clusterArn is only used with saslMechanism {MSK_IAM}")
        return self

    @property
    def database_name(self) -> str:
        return self.database or glue_safe_name(self.name)

    @property
    def msk_region(self) -> str | None:
        """The region of the MSK cluster (from clusterArn), for IAM authentication."""
        return MSK_CLUSTER_ARN.match(self.cluster_arn).group(2) if self.cluster_arn else None  # type: ignore[union-attr]  # clusterArn is validated against MSK_CLUSTER_ARN

    def msk_topic_arn(self, topic: str) -> str:
        """The IAM resource of one of the cluster's topics: arn:...:topic/<cluster name>/<cluster uuid>/<topic>."""
        match = MSK_CLUSTER_ARN.match(self.cluster_arn or "")
        if match is None:
            raise ValueError(f"sourceCluster {self.name} has no clusterArn")
        partition, region, account, name, uuid = match.groups()
        return f"arn:{partition}:kafka:{region}:{account}:topic/{name}/{uuid}/{topic}"


class InlineType(Model):
    """An Iceberg-style type, as used for list elements and map keys/values."""

    type: str
    optional: bool = True
    fields: tuple[InlineField, ...] | None = None
    element: InlineType | None = None
    key: InlineType | None = None
    value: InlineType | None = None

    @model_validator(mode="after")
    def _well_formed(self) -> InlineType:
        kind = self.type
        if kind == "struct":
            if not self.fields:
                raise ValueError("a struct needs fields")
        elif kind == "list":
            if self.element is None:
                raise ValueError("a list needs element")
        elif kind == "map":
            if self.key is None or self.value is None:
                raise ValueError("a map needs key and value")
        elif kind not in PRIMITIVES and not DECIMAL_TYPE.match(kind) and not FIXED_TYPE.match(kind):
            raise ValueError(
                f"unknown type {kind!r}; use one of {sorted(PRIMITIVES)}, decimal(P,S), fixed[N], struct, list, map"
            )
        decimal = DECIMAL_TYPE.match(kind)
        if decimal:
            precision, scale = map(int, decimal.groups())
            if not (1 <= precision <= 38 and 0 <= scale <= precision):
                raise ValueError(f"{kind}: precision must be 1..38 and scale 0..precision")
        return self


class InlineField(InlineType):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    id: int | None = None
    doc: str | None = None


InlineType.model_rebuild()


class InlineSchema(Model):
    fields: tuple[InlineField, ...] = Field(min_length=1)

    @field_validator("fields")
    @classmethod
    def _unique(cls, fields: tuple[InlineField, ...]) -> tuple[InlineField, ...]:
        names = [f.name.lower() for f in fields]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate field names {dupes}")
        return fields


class MaintenanceSpec(Model):
    """Table maintenance cadence and targets (used by `icefloe maintain` and continuous mode)."""

    enabled: bool = True
    interval: str = "1h"
    target_file_size_mb: int = Field(default=128, ge=1, le=2048)
    snapshot_retention: str = "1d"
    min_snapshots_to_keep: int = Field(default=5, ge=1)
    orphan_file_age: str = "3d"

    @field_validator("interval", "snapshot_retention", "orphan_file_age")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_seconds(value)
        return value


class AlarmSpec(Model):
    """The CloudWatch alarms a deployed table gets from its per-batch metrics (`icefloe.operate.metrics`; created by infra).

    `lag`: alarm when the oldest unread record is older than this, or when no batch reported in a window this long
    (default: three refresh intervals, at least 5m; 1m to 1d). `badRecords`: with `errors: dlq` or `skip`, alarm
    when more bad records than this arrive within that window (default 0: any).
    """

    enabled: bool = True
    lag: str | None = None
    bad_records: int = Field(default=0, ge=0)

    @field_validator("lag")
    @classmethod
    def _lag(cls, value: str | None) -> str | None:
        if value is not None and not 60 <= duration_seconds(value) <= 86400:
            raise ValueError(f"lag must be between 1m and 1d (CloudWatch alarm periods), got {value}")
        return value


# What Debezium sends for a column it did not capture (PostgreSQL unchanged TOAST), unless configured otherwise.
DEBEZIUM_PLACEHOLDER = "__debezium_unavailable_value"


class TableSpec(Model):
    source_cluster: str
    topic: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
    table: Annotated[str, StringConstraints(pattern=GLUE_NAME)] | None = None
    database: Annotated[str, StringConstraints(pattern=GLUE_NAME)] | None = None
    format: Literal["avro", "json", "json-schema", "protobuf", "raw", "string"] = "avro"
    schema_: InlineSchema | None = Field(default=None, alias="schema")
    mode: Literal["append", "upsert"] = "append"
    # A change-data envelope: `debezium` (README "Change data"): upsert = the mirror table, append = the changelog.
    envelope: Literal["debezium"] | None = None
    # Iceberg's table format, at creation: 3 keeps an upsert table's deletes as deletion vectors (one per data file,
    # reads stay fast between compactions) but needs readers of v3 (docs "Table modes"); 2 is read by every engine.
    format_version: Literal[2, 3] = 2
    deletes: Literal["hard", "soft"] = "hard"  # soft: a mirror table keeps deleted rows, flagged (cdc_deleted)
    # What Debezium sends for a value it does not have (PostgreSQL's unchanged TOAST): the row's value is kept.
    unavailable_value_placeholder: Annotated[str, StringConstraints(min_length=1)] = DEBEZIUM_PLACEHOLDER
    key: tuple[str, ...] | None = None
    key_format: Literal["json", "avro", "string", "raw", "protobuf", "json-schema"] | None = None
    # protobuf: the message type the table reads (full or package-relative name); default the schema's first message
    message_type: str | None = None
    partition_by: tuple[str, ...] = ()
    errors: Literal["fail", "skip", "dlq"] = "fail"
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # Records deleted from the topic (retention) before they were read: stop (fail) or go on and record them (warn).
    on_data_loss: Literal["fail", "warn"] = "fail"
    refresh: str = "15m"
    continuous: bool = False
    commit_records: int | None = Field(default=None, ge=1)
    retention: str | None = None
    # upsert: how long a deleted key's marker is kept (a change older than the delete, read later from a lagging
    # partition, must not bring the key back); measured on the delete's clock.
    delete_marker_retention: str = "7d"
    # The `<table>_dlq` table's rows (raw payloads) are deleted this long after they were dead-lettered (null: kept).
    dead_letter_retention: str | None = "7d"
    max_records_per_run: int | None = Field(default=None, ge=1)  # a hard cap; batches are sized by time (budget)
    # A hard cap on a batch's bytes (keys and values): what it may keep on executor disks (default: `budget`'s share)
    max_bytes_per_run: int | None = Field(default=None, ge=1)
    max_record_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    # The longest a batch may take: an older run does not publish, so other runs may drop its branch.
    run_timeout: str = "12h"
    enabled: bool = True
    maintenance: MaintenanceSpec = MaintenanceSpec()
    alarms: AlarmSpec = AlarmSpec()

    @field_validator("refresh", "run_timeout")
    @classmethod
    def _at_least(cls, value: str, info: ValidationInfo) -> str:
        name, least = {"refresh": ("refresh", "1s"), "run_timeout": ("runTimeout", "1m")}[info.field_name]  # type: ignore[index]  # a field validator has its field's name
        if duration_seconds(value) < duration_seconds(least):
            raise ValueError(f"{name} must be at least {least}")
        return value

    @field_validator("retention", "dead_letter_retention", "delete_marker_retention")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        if value is not None:
            duration_seconds(value)
        return value

    @field_validator("partition_by")
    @classmethod
    def _partitions_parse(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            parse_partition_field(value)
        return values

    @model_validator(mode="after")
    def _change_data(self) -> TableSpec:
        if self.envelope is not None:
            if self.format not in ("avro", "json"):
                raise ValueError(f"envelope {self.envelope} applies to format avro or json, not {self.format}")
            if self.schema_ is not None:
                raise ValueError(f"envelope {self.envelope} takes its columns from the change events; remove schema")
            if self.key or self.key_format:
                raise ValueError(
                    f"envelope {self.envelope}: the row key is the Debezium key (the source's primary key columns); "
                    "remove key and keyFormat"
                )
        # By value, not by whether it was set: the deployed job's config is the validated spec dumped whole.
        elif self.unavailable_value_placeholder != DEBEZIUM_PLACEHOLDER:
            raise ValueError("unavailableValuePlaceholder only applies with envelope: debezium")
        if self.deletes == "soft":
            if self.envelope is None:
                raise ValueError("deletes: soft needs envelope: debezium (its deletes carry their time)")
            if self.mode != "upsert":
                raise ValueError("deletes: soft needs mode: upsert (a changelog keeps every delete as a row)")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> TableSpec:
        if self.message_type is not None and self.format != "protobuf":
            raise ValueError("messageType only applies with format: protobuf")
        if self.format in ("protobuf", "json-schema") and self.schema_ is not None:
            raise ValueError(f"format {self.format} takes its schema from the registry; remove schema")
        if self.format in ("raw", "string"):
            if self.schema_ is not None:
                raise ValueError(
                    f"format {self.format} keeps the value whole in the column `value`; it takes no schema"
                )
            if self.key:
                raise ValueError(f"format {self.format} has no value fields to key on; upsert keys on the Kafka key")
            for partition in self.partitions:
                if partition.source not in {"value", *KAFKA_COLUMNS}:
                    raise ValueError(f"partitionBy {partition.text!r} names unknown field {partition.source!r}")
        if self.format == "json" and self.schema_ is None:  # schemaless: columns inferred from the records
            for partition in self.partitions:
                if partition.source not in KAFKA_COLUMNS:
                    raise ValueError(
                        f"partitionBy {partition.text!r}: a schemaless JSON table (no schema) can only be partitioned "
                        "by Kafka columns, its value columns do not exist when it is created"
                    )
        if self.schema_ is not None:
            clash = sorted({f.name for f in self.schema_.fields} & {*KAFKA_COLUMNS, *UPSERT_COLUMNS})
            if clash:
                raise ValueError(f"schema fields {clash} clash with icefloe's Kafka metadata columns")
            known = {f.name for f in self.schema_.fields} | set(KAFKA_COLUMNS)
            for partition in self.partitions:
                if partition.source not in known:
                    raise ValueError(f"partitionBy {partition.text!r} names unknown field {partition.source!r}")
        if self.key and self.mode != "upsert":
            raise ValueError("key is only used with mode: upsert")
        if self.key and self.schema_ is not None:
            missing = sorted(set(self.key) - {f.name for f in self.schema_.fields})
            if missing:
                raise ValueError(f"key names unknown fields {missing}")
        if self.key_format and not self.key:
            raise ValueError("keyFormat only applies with key: [fields] (the default key is the raw Kafka key)")
        # A file younger than runTimeout may belong to a run that has not published yet (on AWS nothing serializes
        # runs and maintenance); removing it as an orphan would break that run's commit.
        if duration_seconds(self.maintenance.orphan_file_age) < self.run_timeout_seconds:
            raise ValueError(
                f"maintenance.orphanFileAge {self.maintenance.orphan_file_age} is shorter than runTimeout "
                f"{self.run_timeout}: files of a run still in flight would be removed as orphans"
            )
        return self

    @property
    def partitions(self) -> tuple[PartitionField, ...]:
        return tuple(parse_partition_field(text) for text in self.partition_by)

    @property
    def effective_key_format(self) -> str:
        """How a tombstone's Kafka key is decoded to find the key fields (defaults to the value format)."""
        return self.key_format or (self.format if self.format in ("avro", "protobuf", "json-schema") else "json")

    @property
    def inline_schema(self) -> InlineSchema | None:
        return self.schema_

    @property
    def table_name(self) -> str:
        return self.table or glue_safe_name(self.topic)

    @property
    def refresh_seconds(self) -> float:
        return duration_seconds(self.refresh)

    @property
    def run_timeout_seconds(self) -> float:
        return duration_seconds(self.run_timeout)

    @property
    def lag_alarm_seconds(self) -> float:
        """When the table counts as late: its `alarms.lag`, else three refresh intervals (at least 5 minutes)."""
        if self.alarms.lag is not None:
            return duration_seconds(self.alarms.lag)
        return min(86400.0, max(300.0, LAG_ALARM_REFRESHES * self.refresh_seconds))


class CatalogEndpoints(Model):
    """Where a Glue catalog's AWS APIs, or the S3 holding a REST catalog's tables, answer when a run is off AWS, e.g.
    a moto server on loopback (`glue` for a glue catalog only, where it is needed).

    For local runs only: the Pulumi program renders the EMR job's catalog itself and never sets these. Credentials
    never go here; they come from the environment, as on EMR, or a REST server vends them.
    """

    glue: str | None = None
    s3: str
    region: str | None = None  # else the AWS SDK's default chain (AWS_REGION); without any region it fails

    @field_validator("glue", "s3")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"an endpoint must be an http:// or https:// URL, got {value!r}")
        return value


def s3_tables_endpoint(region: str) -> str:
    """The S3 Tables Iceberg REST endpoint of a region."""
    return f"https://s3tables.{region}.amazonaws.com/iceberg"


class RestSigning(Model):
    """AWS SigV4 request signing of a REST catalog's requests (S3 Tables, Glue's Iceberg REST endpoint) with the
    job's own AWS credentials: `service` is the signing name (`s3tables`, `glue`), `region` the endpoint's."""

    type: Literal["sigv4"] = "sigv4"
    region: Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")]
    service: Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]{1,64}$")]


# Headers the REST settings own (`token`, `accessDelegation`): set there, so a secret never sits in plain config.
_OWNED_HEADERS = {"authorization": "token", "x-iceberg-access-delegation": "accessDelegation"}


class CatalogSpec(Model):
    """Where tables live. Local runs default to a SQLite JDBC catalog under the state directory.

    `glue`: Glue Data Catalog, data under `warehouse` (s3://bucket/prefix). `rest`: any Iceberg REST catalog at `uri`
    (Polaris / Snowflake Open Catalog, Unity, Nessie, Lakekeeper, Iceberg's own server); `warehouse` is what the
    server calls the catalog (a name, a path or an ARN), OAuth2 client credentials (`credential`, with `scope` and
    `oauth2ServerUri`) or a bearer `token` come from secret references, `headers` are sent with every request,
    `accessDelegation` asks the server for vended credentials or remote signing, `signing` signs requests with SigV4.
    `s3tables`: an S3 table bucket (managed Iceberg storage with its own maintenance), a preset of `rest` (its
    endpoint, signed for `s3tables`); `warehouse` is the table bucket's ARN.
    """

    type: Literal["local", "glue", "rest", "s3tables"] = "local"
    warehouse: str | None = None
    endpoints: CatalogEndpoints | None = None
    uri: Annotated[str, StringConstraints(pattern=r"^https?://")] | None = None
    credential: SecretRef | None = None
    token: SecretRef | None = None
    scope: Annotated[str, StringConstraints(min_length=1)] | None = None
    oauth2_server_uri: Annotated[str, StringConstraints(pattern=r"^https?://")] | None = None
    headers: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9-]{1,128}$")], str] = {}
    access_delegation: Literal["vended-credentials", "remote-signing"] | None = None
    signing: RestSigning | None = None

    @field_validator("uri", "oauth2_server_uri")
    @classmethod
    def _no_userinfo(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _without_userinfo(value, info, "use credential or token (secret references)")

    @field_validator("headers")
    @classmethod
    def _headers_not_owned(cls, headers: dict[str, str]) -> dict[str, str]:
        for name in headers:
            if name.lower() in _OWNED_HEADERS:
                raise ValueError(f"header {name}: set it with {_OWNED_HEADERS[name.lower()]}, not headers")
        return headers

    @model_validator(mode="after")
    def _endpoints_need_glue(self) -> CatalogSpec:
        if self.endpoints is not None:
            if self.type not in ("glue", "rest"):
                raise ValueError("endpoints apply to a glue or rest catalog only (type: glue, type: rest)")
            if self.type == "glue" and self.endpoints.glue is None:
                raise ValueError("endpoints.glue: a glue catalog's endpoints name Glue's")
            if self.type == "rest" and self.endpoints.glue is not None:
                raise ValueError(
                    "endpoints.glue applies to a glue catalog only: a rest catalog's endpoints are s3, region"
                )
        if self.type == "s3tables" and not TABLE_BUCKET_ARN.match(self.warehouse or ""):
            raise ValueError(
                "an s3tables catalog's warehouse is its table bucket's ARN "
                f"(arn:aws:s3tables:<region>:<account>:bucket/<name>), got {self.warehouse!r}"
            )
        rest_only = [
            to_camel(name)
            for name in ("uri", "credential", "token", "scope", "oauth2_server_uri", "access_delegation", "signing")
            if getattr(self, name) is not None
        ] + (["headers"] if self.headers else [])
        if self.type != "rest":
            if rest_only:
                preset = (
                    " (s3tables is a preset: its endpoint and signing are fixed)" if self.type == "s3tables" else ""
                )
                raise ValueError(f"{', '.join(rest_only)} apply to a rest catalog only (type: rest){preset}")
            return self
        if self.uri is None:
            raise ValueError("a rest catalog needs uri (the server's base URL, e.g. https://host/api/catalog)")
        if self.credential is not None and self.token is not None:
            raise ValueError("give credential (OAuth2 client credentials) or token (a bearer token), not both")
        if self.signing is not None and (self.credential is not None or self.token is not None):
            raise ValueError("signing (SigV4, the job's AWS credentials) takes no credential or token")
        if (self.scope is not None or self.oauth2_server_uri is not None) and self.credential is None:
            raise ValueError("scope and oauth2ServerUri only apply with credential (OAuth2 client credentials)")
        return self

    @property
    def region(self) -> str | None:
        """The table bucket's region (s3tables), which its REST endpoint and signatures use."""
        match = TABLE_BUCKET_ARN.match(self.warehouse or "") if self.type == "s3tables" else None
        return match.group(2) if match else None

    @property
    def managed_maintenance(self) -> bool:
        """S3 Tables compact, expire snapshots and remove unreferenced files themselves (on by default)."""
        return self.type == "s3tables"

    @property
    def secret_refs(self) -> list[SecretRef]:
        """The catalog's credential references (the job's role may read exactly these)."""
        return [ref for ref in (self.credential, self.token) if ref is not None]

    def as_rest(self) -> CatalogSpec:
        """The REST settings of a `rest` catalog, or those an `s3tables` preset stands for (AWS's documented Spark and
        PyIceberg settings: the regional endpoint, SigV4 for `s3tables`, the bucket's ARN as the warehouse)."""
        if self.type == "rest":
            return self
        if self.type == "s3tables":
            region: str = self.region  # type: ignore[assignment]  # an s3tables warehouse is a table bucket ARN (validated)
            return CatalogSpec(
                type="rest",
                uri=s3_tables_endpoint(region),
                warehouse=self.warehouse,
                signing=RestSigning(region=region, service="s3tables"),
            )
        raise ValueError(f"a {self.type} catalog is not a REST catalog")


class IcefloeConfig(Model):
    source_clusters: tuple[SourceCluster, ...] = Field(min_length=1)
    tables: tuple[TableSpec, ...] = ()
    catalog: CatalogSpec = CatalogSpec()

    @model_validator(mode="after")
    def _references(self) -> IcefloeConfig:
        names = [c.name for c in self.source_clusters]
        if len(set(names)) != len(names):
            raise ValueError(f"sourceClusters names must be unique, got {names}")
        seen: dict[str, str] = {}
        for index, table in enumerate(self.tables):
            if table.source_cluster not in names:
                raise ValueError(
                    f"tables[{index}] ({table.topic}): sourceCluster {table.source_cluster!r} is not one of {names}"
                )
            ident = self.identifier(table)
            if ident in seen:
                raise ValueError(f"tables[{index}] ({table.topic}): table {ident} is also declared by {seen[ident]}")
            seen[ident] = table.topic
        return self

    def cluster(self, name: str) -> SourceCluster:
        return next(c for c in self.source_clusters if c.name == name)

    @property
    def uses_msk_iam(self) -> bool:
        """Some cluster signs in with MSK IAM: Spark's Kafka source then needs the aws-msk-iam-auth jar."""
        return any(c.sasl_mechanism == MSK_IAM for c in self.source_clusters)

    def database(self, table: TableSpec) -> str:
        return table.database or self.cluster(table.source_cluster).database_name

    def identifier(self, table: TableSpec) -> str:
        """`database.table`, as Glue and every query engine name it."""
        return f"{self.database(table)}.{table.table_name}"

    def select(self, names: list[str] | None) -> list[TableSpec]:
        """Enabled tables, or the named ones (by table name, identifier or topic)."""
        if not names:
            return [t for t in self.tables if t.enabled]
        chosen = []
        for name in names:
            match = [t for t in self.tables if name in (t.table_name, self.identifier(t), t.topic)]
            if not match:
                known = ", ".join(self.identifier(t) for t in self.tables) or "none"
                raise ConfigError(f"no table named {name!r} in the config (declared: {known})")
            chosen.extend(match)
        return chosen


CONFIG_KEYS = {"sourceClusters": "source_clusters", "tables": "tables", "catalog": "catalog"}
# Keys that only the Pulumi program reads (validated by icefloe_infra.deployment); the runtime ignores them.
DEPLOYMENT_KEYS: tuple[str, ...] = (
    "storage",
    "emr",
    "externalAccess",
    "owner",
    "tags",
    "glue",
    "secrets",
    "logRetentionDays",
    "schedule",
    "alarms",
)
NAMESPACE = "icefloe"
ModelT = TypeVar("ModelT", bound=Model)


def _location(raw: dict[str, Any], loc: tuple[Any, ...]) -> str:
    """Turn a pydantic error location into `icefloe:tables[0] (stock_trades).format`."""
    if not loc:
        return NAMESPACE
    head, *rest = loc
    text = f"{NAMESPACE}:{head}"
    node: Any = raw.get(head)
    for part in rest:
        if isinstance(part, int):
            text += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and head == "tables" and text.count("[") == 1:
                label = node.get("table") or node.get("topic")
                if label:
                    text += f" ({label})"
        else:
            text += f".{part}"
            node = node.get(part) if isinstance(node, dict) else None
    return text


def config_error(error: ValidationError, raw: dict[str, Any], source: str) -> ConfigError:
    """A pydantic error as one ConfigError with a line per problem, each naming its key (see `_location`)."""
    lines = []
    for item in error.errors():
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        lines.append(f"  {_location(raw, loc)}: {item['msg'].removeprefix('Value error, ')}")
    return ConfigError(f"{source}: invalid icefloe config:\n" + "\n".join(lines))


def validate_keys(model: type[ModelT], raw: dict[str, Any], keys: Iterable[str], source: str) -> ModelT:
    """Validate the `icefloe:*` keys (without the namespace prefix) that `model` reads; errors name the key.

    The runtime validates its keys with IcefloeConfig, the Pulumi program its own with its deployment model.
    """
    keys = set(keys)
    try:
        return model.model_validate({k: v for k, v in raw.items() if k in keys})
    except ValidationError as error:
        raise config_error(error, raw, source) from None


def parse_config(raw: dict[str, Any], source: str = "stack config") -> IcefloeConfig:
    """Validate the `icefloe:*` keys (without the namespace prefix) and return the model."""
    unknown = sorted(set(raw) - set(CONFIG_KEYS) - set(DEPLOYMENT_KEYS))
    if unknown:
        known = ", ".join(f"{NAMESPACE}:{k}" for k in (*CONFIG_KEYS, *DEPLOYMENT_KEYS))
        raise ConfigError(f"{source}: unknown key(s) {', '.join(f'{NAMESPACE}:{k}' for k in unknown)}; known: {known}")
    return validate_keys(IcefloeConfig, raw, CONFIG_KEYS, source)


def read_stack_file(path: str) -> dict[str, Any]:
    """The `config:` mapping of a Pulumi stack file (or the same shape as JSON), from a local path or s3:// URI."""
    import yaml

    from icefloe.text_files import read_text

    try:
        document = yaml.safe_load(read_text(path))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise ConfigError(f"{path}: expected a Pulumi stack file with a top-level 'config:' mapping")
    return document["config"]


def namespaced(config: dict[str, Any]) -> dict[str, Any]:
    """The `icefloe:*` entries of a Pulumi config map, keyed without the namespace prefix."""
    return {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(NAMESPACE + ":")}


def load_config(path: str) -> IcefloeConfig:
    """Read a Pulumi stack file (or the same shape as JSON, local path or s3:// URI) and validate it."""
    raw = namespaced(read_stack_file(path))
    if not raw:
        raise ConfigError(f"{path}: no '{NAMESPACE}:' keys under config")
    return parse_config(raw, source=path)
