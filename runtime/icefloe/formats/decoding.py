"""Schema registries as the formats use them: a Confluent-compatible registry's client, subjects and errors, the
decoders it backs classified (`registry_checked`), and the AWS Glue Schema Registry's table spec. (The Avro decoders
are `formats.avro.reader`'s.)

The formats (`formats.registry.FORMATS`) resolve a table's `DecoderSpec` with these on the driver: the registry's
latest version fixes the schema a batch reads with, so older records are resolved to it and the table evolves
forward. A failure of the record itself raises `BadRecord`; a failure of the environment (registry unreachable)
raises `SourceError`, which must never be treated as a bad record.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from icefloe.credentials import resolve_credentials, resolve_tls
from icefloe.errors import BadRecord, ConfigError, IcefloeError, SourceError
from icefloe.formats.base import GLUE, Decoder, DecoderSpec
from icefloe.registries import glue as glue_registry
from icefloe.spec import SchemaRegistrySpec, SourceCluster, TableSpec


def registry_config(registry: SchemaRegistrySpec, cluster: str) -> dict[str, str]:
    conf = {"url": registry.url}
    if registry.credentials_secret:
        user, password = resolve_credentials(registry.credentials_secret, f"sourceCluster {cluster} schemaRegistry")
        conf["basic.auth.user.info"] = f"{user}:{password}"
    if registry.tls is not None:
        # PEM texts under icefloe's own keys: the client takes files, written where it is built (`_registry_client`).
        tls = resolve_tls(registry.tls, f"sourceCluster {cluster} schemaRegistry")
        conf |= {f"icefloe.{key}": value for key, value in tls.items()}
    return conf  # type: ignore[return-value]  # a Confluent-compatible registry has a url (SchemaRegistrySpec)


# Per process: the PEM files of a registry's TLS material, by their content's hash (written once).
_PEM_FILES: dict[str, str] = {}


def _pem_file(text: str) -> str:
    """`text` in a file only this user can read, in a private directory on the local temp disk (never S3 or the
    table), removed when the process exits. The registry client (httpx) reads certificates and keys from files."""
    import atexit
    import hashlib
    import os
    import shutil
    import tempfile

    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest not in _PEM_FILES:
        directory = tempfile.mkdtemp(prefix="icefloe-tls-")  # mode 0700
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "material.pem")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        _PEM_FILES[digest] = path
    return _PEM_FILES[digest]


def registry_client_conf(conf: dict[str, str]) -> dict[str, Any]:
    """SchemaRegistryClient's settings for `registry_config`'s: TLS material as files (see `_pem_file`)."""
    client: dict[str, Any] = {k: v for k, v in conf.items() if not k.startswith("icefloe.")}
    if "icefloe.ssl.ca.pem" in conf:
        client["ssl.ca.location"] = _pem_file(conf["icefloe.ssl.ca.pem"])
    if "icefloe.ssl.certificate.pem" in conf:
        client["ssl.certificate.location"] = _pem_file(conf["icefloe.ssl.certificate.pem"])
        client["ssl.key.location"] = _pem_file(conf["icefloe.ssl.key.pem"])
    if "icefloe.ssl.key.password" in conf:
        client["ssl.key.password"] = conf["icefloe.ssl.key.password"]
    return client


def subject_for(topic: str) -> str:
    """Confluent's default TopicNameStrategy."""
    return f"{topic}-value"


def confluent_conf(cluster: SourceCluster) -> dict[str, str] | None:
    """The client settings of the cluster's Confluent-compatible registry, if it has one."""
    if cluster.schema_registry is None or cluster.schema_registry.type != "confluent":
        return None
    return registry_config(cluster.schema_registry, cluster.name)


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
    subject = subject_for(table.topic)
    with _registry_errors(registry, subject):
        client = _registry_client(registry)
        latest = client.get_latest_version(subject, fmt="serialized")
        kind = latest.schema.schema_type
        if kind != expected:
            raise ConfigError(
                f"subject {subject!r} holds a {kind or 'AVRO'} schema, not {expected} (format {table.format})"
            )
        return build(client, latest, registry)


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

    return SchemaRegistryClient(registry_client_conf(conf))


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


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The exception types of the HTTP libraries a registry client may use (confluent-kafka: httpx2 or httpx, over
    httpcore; older clients requests and urllib3): their failures are the network's, never the record's."""
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx", "httpcore2", "httpcore", "requests.exceptions", "urllib3.exceptions"):
        module = sys.modules.get(name)  # a library the client did not import raised nothing
        library = name.split(".")[0]
        for value in (
            vars(module) if module else {}
        ).values():  # the library's own types, not those it re-exports (JSONDecodeError)
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__.startswith(library):
                found.append(value)
    return tuple(found)


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
        if isinstance(error, SchemaRegistryError):
            if unknown_id(error):
                return BadRecord(
                    f"schema id {schema_id} is not known to the schema registry {spec.registry['url']}: "
                    f"{error.error_message} (code {error.error_code})"
                )
            return SourceError(f"schema registry {spec.registry['url']}: {error}")
        if isinstance(error, (OSError, ConnectionError)):
            return SourceError(f"schema registry {spec.registry['url']} unreachable: {error}")
        if isinstance(error, _transport_errors()):
            return SourceError(f"schema registry {spec.registry['url']} unreachable: {error}")
        if not opaque:  # our own decoder: what it does not declare is a bug (python_tasks: DecoderFailure)
            return error
        return BadRecord(f"{what} payload cannot be decoded ({type(error).__name__})")  # its text may quote data

    return checked
