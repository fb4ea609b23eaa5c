"""Values framed for the AWS Glue Schema Registry (`registries.glue` has the wire format and the versions): the payload
decoder chosen by the writer version's DataFormat from `PAYLOAD_DECODERS`, and the table's columns by the latest
version's from `VALUE_FIELDS`. Avro is here, JSON Schema is `formats.json_schema`'s (each record validated against
its writer version), Protobuf `formats.protobuf.glue`'s (the AWS Python library has none; the framing is the Java
serde's). The table's `format` names the data format it reads (avro: AVRO, json-schema: JSON, protobuf: PROTOBUF);
a payload that does not decode is a bad record.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any
from uuid import UUID

from icefloe.errors import BadRecord, ConfigError
from icefloe.registries import glue
from icefloe.registries.glue import Decoder


def value_fields(data_format: str, definition: str, subject: str, message_type: str | None = None) -> list:
    """The table's value fields from its latest version (`message_type`: the Protobuf message the table reads)."""
    if data_format not in VALUE_FIELDS:
        raise ConfigError(f"{subject}: the Glue schema's data format {data_format} has no decoder in icefloe")
    return VALUE_FIELDS[data_format](definition, subject, message_type)


def decoder(conf: dict[str, str], table_schema: str | None = None, message_type: str | None = None) -> Decoder:
    """Decodes Glue-framed values (or keys: no `table_schema`): writer versions fetched by UUID, payloads by the
    version's data format. A version that cannot decode (unknown, another data format, a definition that does not
    parse) is remembered: every record written with it fails alike without asking the registry again."""
    client = glue.glue_client(conf)  # through the module: tests replace the client there
    decoders: dict[UUID, Decoder | ValueError] = {}

    def for_version(version: UUID) -> Decoder:
        found = glue.writer_version(client, conf, version)
        try:
            return PAYLOAD_DECODERS[found["DataFormat"]](found["SchemaDefinition"], table_schema, message_type)
        except ValueError as error:
            raise BadRecord(f"schema version {version}: {error}") from None

    def decode(data: bytes) -> Any:
        version, payload = glue.split(data)
        if version not in decoders:
            try:
                decoders[version] = for_version(version)
            except ValueError as error:
                decoders[version] = error
        found = decoders[version]
        if isinstance(found, ValueError):
            raise BadRecord(str(found))
        return found(payload)

    return decode


def avro_payload(writer: str, reader: str | None, message_type: str | None = None) -> Decoder:
    """An Avro payload written with `writer`, resolved to the table's schema `reader` (unions as member structs;
    no reader: a key, read as written)."""
    import fastavro

    from icefloe.formats.avro.fastavro_gaps import UnionIndexError, guarded, register, unpadded
    from icefloe.formats.avro.unions import needs_record_names, rewriter

    reader = reader or writer
    register()
    writer_schema = guarded(fastavro.parse_schema(json.loads(writer)))
    reader_schema = guarded(fastavro.parse_schema(json.loads(reader)))
    names = needs_record_names(reader)
    rewrite = rewriter(reader, names) or (lambda value: value)

    def decode(payload: bytes) -> Any:
        try:
            value = fastavro.schemaless_reader(io.BytesIO(payload), writer_schema, reader_schema, names)
        except UnionIndexError:
            raise
        except Exception as error:  # fastavro raises many types on corrupt input
            raise BadRecord(f"Avro payload cannot be decoded: {type(error).__name__}: {unpadded(str(error))}") from None
        return rewrite(value)

    return decode


def _avro_fields(definition: str, subject: str, message_type: str | None) -> list:
    from icefloe.formats.schema_mapping import avro_value_fields

    return avro_value_fields(definition, subject)


def _json_payload(writer: str, table: str | None, message_type: str | None) -> Decoder:
    from icefloe.formats.json_schema import glue_payload_decoder

    return glue_payload_decoder(writer, table)


def _json_fields(definition: str, subject: str, message_type: str | None) -> list:
    from icefloe.formats.json_schema import glue_value_fields

    return glue_value_fields(definition, subject)


def _protobuf_payload(writer: str, table: str | None, message_type: str | None) -> Decoder:
    from icefloe.formats.protobuf.glue import payload_decoder

    return payload_decoder(writer, table, message_type)  # type: ignore[arg-type]  # protobuf tables name their table


def _protobuf_fields(definition: str, subject: str, message_type: str | None) -> list:
    from icefloe.formats.protobuf.glue import value_fields as protobuf_fields

    return protobuf_fields(definition, subject, message_type)


# DataFormat -> factory(writer version's definition, the table's definition, its message type; None, None for keys)
PAYLOAD_DECODERS: dict[str, Callable[[str, str | None, str | None], Decoder]] = {
    "AVRO": avro_payload,
    "JSON": _json_payload,
    "PROTOBUF": _protobuf_payload,
}
# DataFormat -> function(the table's definition, what to name in errors, its message type) -> the table's value fields
VALUE_FIELDS: dict[str, Callable[[str, str, str | None], list]] = {
    "AVRO": _avro_fields,
    "JSON": _json_fields,
    "PROTOBUF": _protobuf_fields,
}
