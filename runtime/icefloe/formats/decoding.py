"""The formats' side of the schema registries (the clients are `registries.confluent` and `registries.glue`): which
registry a table's cluster has, a table's `DecoderSpec` resolved through it on the driver (its latest version fixes
the schema a batch reads with, so older records are resolved to it and the table evolves forward), and the decoders
it backs classified on executors (`registry_checked`). A failure of the record itself raises `BadRecord`; a failure
of the environment (registry unreachable) raises `SourceError`, which must never be treated as a bad record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from icefloe.errors import BadRecord, ConfigError, SourceError
from icefloe.formats.base import GLUE, Decoder, DecoderSpec
from icefloe.registries import confluent  # through the module: tests count and replace the clients there
from icefloe.registries import glue as glue_registry
from icefloe.spec import SourceCluster, TableSpec


def confluent_conf(cluster: SourceCluster) -> dict[str, str] | None:
    """The client settings of the cluster's Confluent-compatible registry, if it has one."""
    if cluster.schema_registry is None or cluster.schema_registry.type != "confluent":
        return None
    return confluent.registry_config(cluster.schema_registry, cluster.name)


def uses_glue(cluster: SourceCluster) -> bool:
    return cluster.schema_registry is not None and cluster.schema_registry.type == "glue"


def glue_spec(
    table: TableSpec, cluster: SourceCluster, keys: dict, message: Callable[[str, str], str] | None = None
) -> DecoderSpec:
    """A table framed for the AWS Glue Schema Registry: its schema's latest version, of the table's data format
    (`message`: the Protobuf message type the table reads, from the definition)."""
    conf, definition = glue_registry.checked_conf(
        cluster.schema_registry, table.topic, table.format, f"table {table.table_name}"
    )
    where = f"table {table.table_name} (Glue schema {conf['schema']!r})"
    message_type = message(definition, where) if message is not None else None
    return DecoderSpec(table.format, GLUE, table.topic, definition, conf, message_type=message_type, **keys)


def needs_registry(spec: DecoderSpec) -> None:
    """A key format read through a registry, on a table that has none."""
    if not spec.registry_conf:
        raise ConfigError(f"{spec.topic}: keyFormat {spec.key_format} needs a schema registry")


def registry_spec(
    table: TableSpec,
    cluster: SourceCluster,
    keys: dict,
    expected: str,
    build: Callable[[Any, Any, dict[str, str]], DecoderSpec],
) -> DecoderSpec:
    """Protobuf and JSON Schema through a Confluent-compatible registry: `build(client, latest, registry)` resolves the
    subject's latest version (of `expected` type) into the table's spec, registry failures classified."""
    registry = confluent_conf(cluster)
    if registry is None:
        raise ConfigError(
            f"table {table.table_name}: format {table.format} needs sourceCluster {cluster.name}.schemaRegistry "
            "(a Confluent-compatible registry)"
        )
    subject = confluent.subject_for(table.topic)
    with confluent.registry_errors(registry, subject):
        client = confluent.registry_client(registry)
        latest = client.get_latest_version(subject, fmt="serialized")
        kind = latest.schema.schema_type
        if kind != expected:
            raise ConfigError(
                f"subject {subject!r} holds a {kind or 'AVRO'} schema, not {expected} (format {table.format})"
            )
        return build(client, latest, registry)


# Pauses before asking again for a schema id the registry answered 404/422 for (8.5 s in all), and the ids asked again.
UNKNOWN_ID_RETRY_S = (0.5, 1.0, 2.0, 5.0)
_RETRIED_IDS: set[tuple[str, int | None]] = set()


def registry_checked(spec: DecoderSpec, decode: Decoder, what: str | None = None, opaque: bool = False) -> Decoder:
    """A registry-backed decoder whose failures are classified: an id the registry does not know, or a payload that
    does not decode, is a bad record (BadRecord), an unknown id only once the registry was asked again for a few
    seconds; a registry that cannot be reached is the environment's. `opaque`: a library's decoder (confluent-kafka's
    Avro deserializer, fastavro) that raises many types on corrupt input: any other exception is a bad record."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    what = what or spec.data_format

    def unknown_id(error: Exception) -> bool:
        return isinstance(error, SchemaRegistryError) and error.http_status_code in (404, 422)

    def checked(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as error:
            schema_id = int.from_bytes(data[1:5], "big") if len(data) >= 5 else None
            if not unknown_id(error) or (spec.registry["url"], schema_id) in _RETRIED_IDS:
                raise classified(error, schema_id) from None
            # A registry follower behind its leader (or one just restored) knows the id seconds later: ask again for
            # a few seconds, once per id per process, before the record is called bad.
            _RETRIED_IDS.add((spec.registry["url"], schema_id))
            for pause in UNKNOWN_ID_RETRY_S:
                time.sleep(pause)
                try:
                    return decode(data)
                except Exception as again:
                    if not unknown_id(again):
                        raise classified(again, schema_id) from None
                    error = again
            raise classified(error, schema_id) from None

    def classified(error: Exception, schema_id: int | None) -> Exception:
        if isinstance(error, BadRecord):
            return error
        refused = confluent.refusal(spec.registry["url"], error)
        if refused is not None:  # on an executor too: not retried (python_tasks marks it so for the driver)
            return refused
        if isinstance(error, SchemaRegistryError):
            if unknown_id(error):
                return BadRecord(
                    f"schema id {schema_id} is not known to the schema registry {spec.registry['url']}: "
                    f"{error.error_message} (code {error.error_code})"
                )
            return SourceError(f"schema registry {spec.registry['url']}: {error}")
        if isinstance(error, (OSError, ConnectionError)):
            return SourceError(f"schema registry {spec.registry['url']} unreachable: {error}")
        if isinstance(error, confluent.transport_errors()):
            return SourceError(f"schema registry {spec.registry['url']} unreachable: {error}")
        if not opaque:  # our own decoder: what it does not declare is a bug (python_tasks: DecoderFailure)
            return error
        return BadRecord(f"{what} payload cannot be decoded ({type(error).__name__})")  # its text may quote data

    return checked
