"""Decoding record values: Avro through a Confluent-compatible Schema Registry, Avro or JSON with an inline schema.

`value_schema()` runs on the driver and fixes the schema a batch reads with (the registry's latest version for the
subject, so older records are resolved to it and the table evolves forward). `Decoder` objects are built on
executors from a picklable `DecoderSpec`. A failure of the record itself raises `ValueError`; a failure of the
environment (registry unreachable) raises `SourceError`, which must never be treated as a bad record.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigError, SourceError
from .secrets import resolve_credentials
from .spec import SchemaRegistrySpec, SourceCluster, TableSpec

Decoder = Callable[[bytes], Any]


@dataclass(frozen=True)
class DecoderSpec:
    """Everything an executor needs to decode one table's values (picklable, holds no secret in its repr)."""

    format: str  # avro-registry | avro-inline | json
    topic: str
    schema_str: str | None = None
    registry_conf: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"DecoderSpec(format={self.format!r}, topic={self.topic!r})"


def registry_config(registry: SchemaRegistrySpec, cluster: str) -> dict[str, str]:
    conf = {"url": registry.url}
    if registry.credentials_secret:
        user, password = resolve_credentials(registry.credentials_secret, f"sourceCluster {cluster} schemaRegistry")
        conf["basic.auth.user.info"] = f"{user}:{password}"
    return conf


def subject_for(topic: str) -> str:
    """Confluent's default TopicNameStrategy."""
    return f"{topic}-value"


def decoder_spec(table: TableSpec, cluster: SourceCluster) -> DecoderSpec:
    """Resolve how this table's values are decoded, fetching the latest registry schema (driver side)."""
    from .schema_mapping import inline_to_avro

    if table.format == "json":
        return DecoderSpec("json", table.topic)
    if table.inline_schema is not None and cluster.schema_registry is None:
        return DecoderSpec("avro-inline", table.topic, json.dumps(inline_to_avro(table.inline_schema)))
    if cluster.schema_registry is None:
        raise ConfigError(
            f"table {table.table_name}: format avro needs sourceCluster {cluster.name}.schemaRegistry or an inline schema"
        )
    conf = registry_config(cluster.schema_registry, cluster.name)
    subject = subject_for(table.topic)
    return DecoderSpec("avro-registry", table.topic, _latest_schema(conf, subject), conf)


def _latest_schema(conf: dict[str, str], subject: str) -> str:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        registered = SchemaRegistryClient(conf).get_latest_version(subject)
    except SchemaRegistryError as error:
        if error.http_status_code == 404:
            raise ConfigError(f"no schema registered under subject {subject!r} at {conf['url']}") from None
        raise SourceError(f"schema registry {conf['url']}: {error}") from None
    except Exception as error:  # connection failures surface as the HTTP library's own types
        raise SourceError(f"schema registry {conf['url']} unreachable: {error}") from None
    if registered.schema.schema_type not in (None, "AVRO"):
        raise ConfigError(f"subject {subject!r} holds a {registered.schema.schema_type} schema, not Avro")
    return registered.schema.schema_str


def build_decoder(spec: DecoderSpec) -> Decoder:
    if spec.format == "json":
        return _decode_json
    if spec.format == "avro-inline":
        return _inline_avro_decoder(spec.schema_str)
    return _registry_avro_decoder(spec)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode_json(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"value is not valid UTF-8 ({error.reason} at byte {error.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise ValueError(f"value is not valid JSON: {error.msg} at position {error.pos}") from None
    if not isinstance(value, dict):
        raise ValueError(f"JSON value must be an object, got {type(value).__name__}")
    return value


def _inline_avro_decoder(schema_str: str) -> Decoder:
    """Confluent wire format (magic byte 0, 4-byte schema id) decoded with the inline schema; the id is ignored."""
    import fastavro

    schema = fastavro.parse_schema(json.loads(schema_str))

    def decode(data: bytes) -> Any:
        if len(data) < 5 or data[0] != 0:
            raise ValueError("not Confluent wire format (magic byte 0 and a schema id expected)")
        buffer = io.BytesIO(data[5:])
        try:
            value = fastavro.schemaless_reader(buffer, schema, None)
        except Exception as error:  # fastavro raises many types on corrupt input
            raise ValueError(f"Avro payload does not match the inline schema: {type(error).__name__}: {error}") from None
        if buffer.tell() != len(data) - 5:
            raise ValueError("Avro payload has trailing bytes: written with another schema?")
        return value

    return decode


def _registry_avro_decoder(spec: DecoderSpec) -> Decoder:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

    client = SchemaRegistryClient(spec.registry_conf)
    deserializer = AvroDeserializer(client, schema_str=spec.schema_str)
    context = SerializationContext(spec.topic, MessageField.VALUE)

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data, context)
        except SchemaRegistryError as error:
            if error.http_status_code in (404, 422):
                raise ValueError(f"schema registry: {error.error_message} (code {error.error_code})") from None
            raise SourceError(f"schema registry {spec.registry_conf['url']}: {error}") from None
        except SerializationError as error:
            raise ValueError(f"Avro: {error}") from None
        except (OSError, ConnectionError) as error:
            raise SourceError(f"schema registry {spec.registry_conf['url']} unreachable: {error}") from None
        except Exception as error:
            if type(error).__module__.split(".")[0] in ("httpx", "httpcore", "requests", "urllib3"):
                raise SourceError(f"schema registry {spec.registry_conf['url']} unreachable: {error}") from None
            raise ValueError(f"Avro payload cannot be decoded: {type(error).__name__}: {error}") from None

    return decode
