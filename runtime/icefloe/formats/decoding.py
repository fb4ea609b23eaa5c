"""Decoding record values: Avro through a Confluent-compatible Schema Registry, Avro or JSON with an inline schema
(and, in their own modules, schemaless JSON, raw and string values, the AWS Glue Schema Registry).

`value_schema()` runs on the driver and fixes the schema a batch reads with (the registry's latest version for the
subject, so older records are resolved to it and the table evolves forward). `Decoder` objects are built on
executors from a picklable `DecoderSpec`. A failure of the record itself raises `ValueError`; a failure of the
environment (registry unreachable) raises `SourceError`, which must never be treated as a bad record.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from icefloe.credentials import resolve_credentials
from icefloe.errors import ConfigError, IcefloeError, SourceError
from icefloe.formats.avro import fastavro_gaps
from icefloe.spec import SchemaRegistrySpec, SourceCluster, TableSpec

Decoder = Callable[[bytes], Any]


@dataclass(frozen=True)
class DecoderSpec:
    """Everything an executor needs to decode one table's values (picklable, holds no secret in its repr)."""

    format: str  # avro-registry | avro-inline | json | json-inferred (schemaless) | raw | string | glue | protobuf | json-schema
    topic: str
    schema_str: str | None = None
    registry_conf: dict[str, str] | None = None
    key_fields: tuple[str, ...] = ()  # upsert keyed by value fields: a tombstone's key gives their values
    key_format: str | None = None
    message_type: str | None = None  # protobuf: the full name of the message type the table reads
    key_conf: dict[str, str] | None = None  # keys framed for the AWS Glue Schema Registry (glue_registry)
    # An envelope's decoding plan (JSON; e.g. `debezium.tables`): its decoder reads the key and headers too.
    envelope_plan: str | None = None

    def __repr__(self) -> str:
        return f"DecoderSpec(format={self.format!r}, topic={self.topic!r})"

    # The fields a format reads are set for it by decoder_spec; these read them as set.
    @property
    def registry(self) -> dict[str, str]:
        return cast(dict[str, str], self.registry_conf)

    @property
    def schema(self) -> str:
        return cast(str, self.schema_str)


def registry_config(registry: SchemaRegistrySpec, cluster: str) -> dict[str, str]:
    conf = {"url": registry.url}
    if registry.credentials_secret:
        user, password = resolve_credentials(registry.credentials_secret, f"sourceCluster {cluster} schemaRegistry")
        conf["basic.auth.user.info"] = f"{user}:{password}"
    return conf  # type: ignore[return-value]  # a Confluent-compatible registry has a url (SchemaRegistrySpec)


def subject_for(topic: str) -> str:
    """Confluent's default TopicNameStrategy."""
    return f"{topic}-value"


def decoder_spec(table: TableSpec, cluster: SourceCluster) -> DecoderSpec:
    """Resolve how this table's values are decoded, fetching the latest registry schema (driver side)."""
    from icefloe.formats.schema_mapping import inline_to_avro
    from icefloe.registries import glue as glue_registry

    keys: dict[str, Any] = {
        "key_fields": table.key or (),
        "key_format": table.effective_key_format if table.key else None,
    }
    glue = cluster.schema_registry is not None and cluster.schema_registry.type == "glue"
    if glue and keys["key_format"] in glue_registry.DATA_FORMATS:
        keys["key_conf"], _ = glue_registry.checked_conf(
            cluster.schema_registry, table.topic, keys["key_format"], f"table {table.table_name}", key=True
        )
    if glue and table.format in glue_registry.DATA_FORMATS:
        return _glue_spec(table, cluster, keys)
    registry = registry_config(cluster.schema_registry, cluster.name) if _confluent(cluster) else None  # type: ignore[arg-type]  # _confluent(cluster) means it has one
    if table.envelope == "debezium":
        from icefloe.formats.debezium import tables

        return tables.decoder_spec(table, registry, f"table {table.table_name}")
    if table.format in ("json", "raw", "string"):
        return DecoderSpec(table.format, table.topic, registry_conf=registry, **keys)
    if table.format in ("protobuf", "json-schema"):
        if registry is None:
            raise ConfigError(
                f"table {table.table_name}: format {table.format} needs sourceCluster {cluster.name}.schemaRegistry "
                "(a Confluent-compatible registry)"
            )
        return _registry_format_spec(table, registry, keys)
    if table.inline_schema is not None and registry is None:
        return DecoderSpec("avro-inline", table.topic, json.dumps(inline_to_avro(table.inline_schema)), **keys)
    if registry is None:
        raise ConfigError(
            f"table {table.table_name}: format avro needs sourceCluster {cluster.name}.schemaRegistry or an inline schema"
        )
    schema = _latest_schema(registry, subject_for(table.topic))
    return DecoderSpec("avro-registry", table.topic, schema, registry, **keys)


def _registry_format_spec(table: TableSpec, registry: dict[str, str], keys: dict) -> DecoderSpec:
    """Protobuf and JSON Schema: the subject's latest version, references resolved, fixes the table's columns."""
    subject = subject_for(table.topic)
    with _registry_errors(registry, subject):
        client = _registry_client(registry)
        latest = client.get_latest_version(subject, fmt="serialized")
        kind = latest.schema.schema_type
        expected = "PROTOBUF" if table.format == "protobuf" else "JSON"
        if kind != expected:
            raise ConfigError(
                f"subject {subject!r} holds a {kind or 'AVRO'} schema, not {expected} (format {table.format})"
            )
        if table.format == "protobuf":
            from icefloe.formats.protobuf.schemas import ProtobufSchemas, find_message, serialize_file

            file = ProtobufSchemas(client).resolve(latest.schema, f"{subject}.proto")
            try:
                message = find_message(file, table.message_type).full_name
            except ValueError as error:
                raise ConfigError(f"table {table.table_name}: {error}") from None
            return DecoderSpec("protobuf", table.topic, serialize_file(file), registry, message_type=message, **keys)
        from icefloe.formats.json_schema import resolve_schema

        return DecoderSpec("json-schema", table.topic, resolve_schema(client, latest.schema), registry, **keys)


def _confluent(cluster: SourceCluster) -> bool:
    return cluster.schema_registry is not None and cluster.schema_registry.type == "confluent"


def _glue_spec(table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
    from icefloe.registries import glue as glue_registry

    conf, definition = glue_registry.checked_conf(
        cluster.schema_registry, table.topic, table.format, f"table {table.table_name}"
    )
    message = None
    if table.format == "protobuf":
        from icefloe.formats.protobuf.glue import table_message

        message = table_message(
            definition, table.message_type, f"table {table.table_name} (Glue schema {conf['schema']!r})"
        )
    return DecoderSpec(glue_registry.FORMAT, table.topic, definition, conf, message_type=message, **keys)


def _latest_schema(conf: dict[str, str], subject: str) -> str:
    with _registry_errors(conf, subject):
        registered = _registry_client(conf).get_latest_version(subject)
    if registered.schema.schema_type not in (None, "AVRO"):
        raise ConfigError(f"subject {subject!r} holds a {registered.schema.schema_type} schema, not Avro")
    return registered.schema.schema_str


def subject_schemas(conf: dict[str, str], subject: str, newest: int) -> dict[int, tuple[str, list]]:
    """Schema id -> (Avro schema, its references) for the subject's `newest` versions (driver side).

    A schema id's text never changes, but a version's id can: a hard-deleted version's number goes to the next
    registration. So each batch lists the versions and asks for the latest (two calls), and the window is fetched
    again only when either changed since this process's previous batch (`_SUBJECTS`). (Deleting versions below the
    latest and registering as many again, the latest's schema last, goes unseen: their records are decoded in Python,
    as any id not planned, from their id's own schema.)"""
    client = _registry_client(conf)
    found: dict[int, tuple[str, list]] = {}
    with _registry_errors(conf, subject):
        versions = sorted(client.get_versions(subject))[-newest:]
        if not versions:
            return found
        latest = client.get_version(subject, versions[-1])
        seen = (tuple(versions), latest.schema_id)
        cached = _SUBJECTS.get((conf["url"], subject))
        if cached is not None and cached[0] == seen:
            return dict(cached[1])
        for version in versions:
            registered = latest if version == versions[-1] else client.get_version(subject, version)
            if registered.schema.schema_type in (None, "AVRO"):
                found[registered.schema_id] = (registered.schema.schema_str, list(registered.schema.references or []))
    _SUBJECTS[(conf["url"], subject)] = (seen, dict(found))
    return found


# Per process: (registry URL, subject) -> ((version numbers, the latest's schema id), what subject_schemas found)
_SUBJECTS: dict[tuple[str, str], tuple[tuple, dict[int, tuple[str, list]]]] = {}


def _registry_client(conf: dict[str, str]):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(conf)


@contextmanager
def _registry_errors(conf: dict[str, str], subject: str) -> Iterator[None]:
    """Registry failures as icefloe errors: a missing subject is a config error, anything else the environment's."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        yield
    except IcefloeError:
        raise
    except ValueError as error:  # a registered schema this runtime cannot parse
        raise ConfigError(f"subject {subject!r} at {conf['url']}: {error}") from None
    except SchemaRegistryError as error:
        if error.http_status_code == 404:
            raise ConfigError(f"no schema registered under subject {subject!r} at {conf['url']}") from None
        raise SourceError(f"schema registry {conf['url']}: {error}") from None
    except Exception as error:  # connection failures surface as the HTTP library's own types
        raise SourceError(f"schema registry {conf['url']} unreachable: {error}") from None


def build_change_decoder(spec: DecoderSpec) -> Callable[[bytes | None, bytes | None, list | None], dict]:
    """An envelope's decoder: (value, key, headers) -> the row and its change columns."""
    from icefloe.formats.debezium import tables

    return tables.change_decoder(spec)


def build_decoder(spec: DecoderSpec) -> Decoder:
    if spec.format == "json":
        return _decode_json
    if spec.format == "glue":
        from icefloe.formats import glue_framed

        return glue_framed.decoder(spec.registry, spec.schema, spec.message_type)
    if spec.format == "json-inferred":  # schemaless JSON, shaped for the types inferred for the batch
        from icefloe.formats import schemaless_json as json_inference

        return json_inference.decoder(spec.schema)
    if spec.format in ("raw", "string"):
        from icefloe.formats import raw as raw_format

        return raw_format.decoder(spec.format)
    if spec.format == "avro-inline":
        return _inline_avro_decoder(spec.schema)
    if spec.format == "protobuf":
        from icefloe.formats.protobuf.messages import ProtobufDecoder

        return _registry_checked(spec, ProtobufDecoder(_registry_client(spec.registry), spec.message_type))
    if spec.format == "json-schema":
        from icefloe.formats.json_schema import JsonSchemaDecoder

        return _registry_checked(spec, JsonSchemaDecoder(_registry_client(spec.registry), spec.schema))
    return _with_unions(spec.schema, lambda names: _registry_avro_decoder(spec, spec.schema, False, names))


def _with_unions(schema_str: str, make: Callable[[bool], Decoder]) -> Decoder:
    """A decoder whose values have Avro unions of several types as the table's member structs (avro_unions)."""
    from icefloe.formats.avro.unions import needs_record_names, rewriter

    names = needs_record_names(schema_str)
    decode, rewrite = make(names), rewriter(schema_str, names)
    if rewrite is None:
        return decode
    return lambda data: rewrite(decode(data))


def build_key_decoder(spec: DecoderSpec) -> Callable[[bytes], dict]:
    """Decodes a Kafka key into {key field: value}, for tombstones of tables keyed by value fields."""
    if spec.key_format in ("string", "raw"):
        from icefloe.formats.raw import utf8

        if len(spec.key_fields) != 1:
            raise ConfigError(
                f"{spec.topic}: keyFormat {spec.key_format} can only give one key field, not {spec.key_fields}"
            )
        field_name, as_text = spec.key_fields[0], spec.key_format == "string"
        return lambda data: {field_name: utf8(data, "key") if as_text else data}
    if spec.key_conf is not None:  # framed for the AWS Glue Schema Registry, decoded as written
        from icefloe.formats import glue_framed

        decode = glue_framed.decoder(spec.key_conf)
    elif spec.key_format in ("avro", "protobuf", "json-schema") and not spec.registry_conf:
        raise ConfigError(f"{spec.topic}: keyFormat {spec.key_format} needs a schema registry")
    elif spec.key_format == "avro":
        decode = _registry_avro_decoder(spec, None, True)
    elif spec.key_format == "protobuf":  # the key's own message type, from its writer schema
        from icefloe.formats.protobuf.messages import ProtobufDecoder

        decode = _registry_checked(spec, ProtobufDecoder(_registry_client(spec.registry), None))
    elif spec.key_format == "json-schema":
        from icefloe.formats.json_schema import JsonSchemaDecoder

        decode = _registry_checked(spec, JsonSchemaDecoder(_registry_client(spec.registry), None))
    else:
        decode = _parse_json  # an object, or for one key field its value alone

    def keyed(data: bytes) -> dict:
        value = decode(data)
        if isinstance(value, dict):
            return value
        if len(spec.key_fields) == 1 and not isinstance(value, list):  # a primitive key gives the one key field
            return {spec.key_fields[0]: value}
        raise ValueError(f"key must decode to an object with fields {list(spec.key_fields)}")

    return keyed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode_json(data: bytes) -> Any:
    value = _parse_json(data)
    if not isinstance(value, dict):
        raise ValueError(f"JSON value must be an object, got {type(value).__name__}")
    return value


def _parse_json(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"value is not valid UTF-8 ({error.reason} at byte {error.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise ValueError(f"value is not valid JSON: {error.msg} at position {error.pos}") from None
    return value


def _inline_avro_decoder(schema_str: str) -> Decoder:
    """Confluent wire format (magic byte 0, 4-byte schema id) decoded with the inline schema; the id is ignored."""
    import fastavro

    fastavro_gaps.register()
    schema = fastavro_gaps.guarded(fastavro.parse_schema(json.loads(schema_str)))

    def decode(data: bytes) -> Any:
        if len(data) < 5 or data[0] != 0:
            raise ValueError("not Confluent wire format (magic byte 0 and a schema id expected)")
        buffer = io.BytesIO(data[5:])
        try:
            value = fastavro.schemaless_reader(buffer, schema, None)
        except fastavro_gaps.UnionIndexError:
            raise
        except Exception as error:  # fastavro raises many types on corrupt input
            raise ValueError(
                f"Avro payload does not match the inline schema ({type(error).__name__})"
            ) from None  # its text may quote data
        if buffer.tell() != len(data) - 5:
            raise ValueError("Avro payload has trailing bytes: written with another schema?")
        return value

    return decode


def _registry_avro_decoder(spec: DecoderSpec, reader_schema: str | None, key: bool, names: bool = False) -> Decoder:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

    class GuardedAvroDeserializer(AvroDeserializer):
        def _get_parsed_schema(self, schema):  # writer and reader schemas (parsed once, cached by confluent-kafka)
            return fastavro_gaps.guarded(super()._get_parsed_schema(schema))

    fastavro_gaps.register()
    client = SchemaRegistryClient(spec.registry)
    deserializer = GuardedAvroDeserializer(client, schema_str=reader_schema, return_record_name=names)
    context = SerializationContext(spec.topic, MessageField.KEY if key else MessageField.VALUE)

    def avro(data: bytes) -> Any:
        try:
            return deserializer(data, context)
        except SerializationError as error:
            raise ValueError(f"Avro: {error}") from None
        except ValueError as error:  # fastavro's own, on corrupt input
            raise ValueError(f"Avro payload cannot be decoded: ValueError: {error}") from None

    return _registry_checked(spec, avro, "Avro")


# Pauses before asking again for a schema id the registry answered 404/422 for (8.5 s in all), and the ids asked again.
UNKNOWN_ID_RETRY_S = (0.5, 1.0, 2.0, 5.0)
_RETRIED_IDS: set[tuple[str, int | None]] = set()


def _registry_checked(spec: DecoderSpec, decode: Decoder, what: str | None = None) -> Decoder:
    """A registry-backed decoder whose failures are classified: an id the registry does not know, or a payload that
    does not decode, is a bad record (ValueError), an unknown id only once the registry was asked again for a few
    seconds; a registry that cannot be reached is the environment's."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    what = what or spec.format

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
        if isinstance(error, ValueError):
            return error
        if isinstance(error, SchemaRegistryError):
            if unknown_id(error):
                return ValueError(
                    f"schema id {schema_id} is not known to the schema registry {spec.registry['url']}: "
                    f"{error.error_message} (code {error.error_code})"
                )
            return SourceError(f"schema registry {spec.registry['url']}: {error}")
        if isinstance(error, (OSError, ConnectionError)):
            return SourceError(f"schema registry {spec.registry['url']} unreachable: {error}")
        if type(error).__module__.split(".")[0].rstrip("0123456789") in ("httpx", "httpcore", "requests", "urllib3"):
            return SourceError(f"schema registry {spec.registry['url']} unreachable: {error}")
        return ValueError(f"{what} payload cannot be decoded ({type(error).__name__})")  # its text may quote data

    return checked
