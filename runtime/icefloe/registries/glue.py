"""The AWS Glue Schema Registry as a registry kind: `schemaRegistry: {type: glue, registryName, region}`.

Wire format (the AWS serializers', Java `GlueSchemaRegistryKafkaSerializer` and PyPI `aws-glue-schema-registry`):
byte 0x03, a compression byte (0x00 none, 0x05 zlib), the 16-byte schema version UUID, then the payload as the
version's data format writes it. The table's schema is the latest version of the schema named `schemaName` in the
registry (default `{topic}-value`, the Python serializer's naming; the Java serializer names a schema after the
topic: `schemaName: "{topic}"`). Executors fetch each writer version by its UUID (GetSchemaVersion) once; for the
JVM path (avro_jvm) the driver fetches the schema's newest Avro versions by number (`avro_versions`). An available
version is immutable: each process fetches it once, so a continuous run asks Glue only for the latest version per batch.

Keys framed the same way (`keyFormat` avro, json-schema or protobuf on a Glue registry) are decoded as they were
written, with no reader schema: each key by its own writer version, a Protobuf key as whichever message type its
index names. Their schema `keySchemaName` (default `{topic}-key`) is only checked on the driver (it exists, of the
keyFormat's data format): a deserializer finds a version by its UUID, never by a name.

How a payload decodes, by the version's DataFormat, is the formats' business (`formats.glue_framed`). A record
written with a version of another data format, a header that is not Glue's or a version that is unknown is a bad
record; a registry that cannot be reached or refuses access is the environment's failure (`SourceError`), never a
bad record.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any
from uuid import UUID

from icefloe.errors import BadRecord, ConfigError, SourceError

HEADER = 0x03
COMPRESSION = {0x00: None, 0x05: "zlib"}
PREFIX = 18  # header, compression, UUID
DATA_FORMATS = {
    "avro": "AVRO",
    "json-schema": "JSON",
    "protobuf": "PROTOBUF",
}  # the table's `format` -> the Glue DataFormat it reads
Decoder = Callable[[bytes], Any]


def registry_conf(registry, topic: str, key: bool = False) -> dict[str, str]:
    """What executors need to reach the registry (no credential: AWS clients take them from the environment)."""
    return {
        "type": "glue",
        "registry": registry.registry_name,
        "region": registry.region,
        "endpoint": registry.endpoint or "",
        "schema": registry.glue_schema(topic, key),
    }


def checked_conf(registry, topic: str, fmt: str, where: str, key: bool = False) -> tuple[dict[str, str], str]:
    """(conf with the schema's data format, its latest definition) for a value (`format`) or key (`keyFormat`)
    schema, which must be of the data format `fmt` reads (driver side)."""
    conf = registry_conf(registry, topic, key)
    data_format, definition = latest_version(conf)
    if data_format != DATA_FORMATS[fmt]:
        raise ConfigError(
            f"{where}: the Glue {'key ' if key else ''}schema {conf['schema']!r} is {data_format}, not "
            f"{DATA_FORMATS[fmt]} ({'keyFormat' if key else 'format'} {fmt})"
        )
    return conf | {"data_format": data_format}, definition


def glue_client(conf: dict[str, str]):
    import boto3

    return boto3.client("glue", region_name=conf["region"], endpoint_url=conf["endpoint"] or None)


def _where(conf: dict[str, str]) -> str:
    return f"Glue schema registry {conf['registry']} ({conf['region']})"


def latest_version(conf: dict[str, str]) -> tuple[str, str]:
    """(data format, definition) of the latest version of the table's schema (driver side)."""
    found = _latest(glue_client(conf), conf)
    return found["DataFormat"], found["SchemaDefinition"]


def avro_versions(conf: dict[str, str], newest: int) -> dict[UUID, str]:
    """Version UUID -> definition of the `newest` available versions of the table's Avro schema (driver side: the
    JVM path decodes the records written with them). Asked by version number: ListSchemaVersions gives no
    definitions (one GetSchemaVersion each anyway), and moto does not serve it. Only the latest is asked every
    batch; an available version is immutable and comes from this process's cache (`_AVAILABLE`)."""
    client = glue_client(conf)
    latest = _latest(client, conf)
    schema = (conf["endpoint"], latest["SchemaArn"])
    numbers = _AVAILABLE.setdefault(schema, {})
    if numbers.get(latest["VersionNumber"], latest["SchemaVersionId"]) != latest["SchemaVersionId"]:
        numbers.clear()  # the schema was deleted and created again under the same name: its numbers start over
    found = {}
    for number in range(max(1, latest["VersionNumber"] - newest + 1), latest["VersionNumber"] + 1):
        if number not in numbers:
            where = {"SchemaId": _schema_id(conf), "SchemaVersionNumber": {"VersionNumber": number}}
            version = latest if number == latest["VersionNumber"] else _schema_version(client, conf, **where)
            # (a deleted version is gone; a pending or failed one is left to the Python decoder, as any unknown UUID)
            if version is None or version["Status"] != "AVAILABLE":
                continue
            numbers[number] = version["SchemaVersionId"]
            _VERSIONS[UUID(version["SchemaVersionId"])] = version
        version = _VERSIONS[UUID(numbers[number])]
        if version["DataFormat"] == "AVRO":
            found[UUID(version["SchemaVersionId"])] = version["SchemaDefinition"]
    return found


# Per process: (endpoint, schema ARN) -> version number -> UUID of an AVAILABLE version, and UUID -> that version
# (GetSchemaVersion's answer). An available version never changes, so continuous runs ask only for the latest.
_AVAILABLE: dict[tuple[str, str], dict[int, str]] = {}
_VERSIONS: dict[UUID, dict] = {}


def _latest(client, conf: dict[str, str]) -> dict:
    found = _schema_version(client, conf, SchemaId=_schema_id(conf), SchemaVersionNumber={"LatestVersion": True})
    if found is None:
        raise ConfigError(f"no schema named {conf['schema']!r} in the {_where(conf)}")
    return found


def _schema_id(conf: dict[str, str]) -> dict[str, str]:
    return {"RegistryName": conf["registry"], "SchemaName": conf["schema"]}


def _schema_version(client, conf: dict[str, str], missing=("EntityNotFoundException",), **where) -> dict | None:
    """GetSchemaVersion; None where the registry does not have the version (error codes `missing`); any other
    failure is the environment's (`SourceError`)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return client.get_schema_version(**where)
    except ClientError as error:
        if error.response["Error"]["Code"] in missing:
            return None
        raise SourceError(f"{_where(conf)}: {error}") from None
    except BotoCoreError as error:
        raise SourceError(f"{_where(conf)} unreachable: {error}") from None


def frame(version: UUID) -> bytes:
    """The bytes before an uncompressed payload written with `version`."""
    return bytes([HEADER, 0x00]) + version.bytes


def split(data: bytes) -> tuple[UUID, bytes]:
    """The schema version id and the (decompressed) payload of a Glue-framed value."""
    if len(data) < PREFIX or data[0] != HEADER:
        raise BadRecord("not AWS Glue Schema Registry wire format (header byte 3, compression byte, version UUID)")
    if data[1] not in COMPRESSION:
        raise BadRecord(f"unknown Glue compression byte {data[1]} (0 none or 5 zlib expected)")
    payload = data[PREFIX:]
    if COMPRESSION[data[1]] == "zlib":
        try:
            payload = zlib.decompress(payload)
        except zlib.error as error:
            raise BadRecord(f"zlib-compressed payload does not decompress: {error}") from None
    return UUID(bytes=bytes(data[2:PREFIX])), payload


def writer_version(client, conf: dict[str, str], version: UUID) -> dict:
    """The writer schema version `version` (fetched once per process once available), checked to be of the data
    format the table reads; a BadRecord when the registry does not have it or it is another's."""
    found = _VERSIONS.get(version) or _schema_version(
        client, conf, ("EntityNotFoundException", "InvalidInputException"), SchemaVersionId=str(version)
    )
    if found is None:
        raise BadRecord(f"schema version {version} is not in the {_where(conf)}")
    if found["Status"] == "AVAILABLE":
        _VERSIONS[version] = found
    if found["DataFormat"] != conf["data_format"]:  # the table's columns (or key) come from a schema of another format
        raise BadRecord(f"schema version {version} is {found['DataFormat']}; the table reads {conf['data_format']}")
    return found
