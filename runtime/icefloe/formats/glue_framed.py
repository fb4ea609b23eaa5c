"""Values framed for the AWS Glue Schema Registry (`registries.glue` has the wire format and the versions): the writer
version found by its UUID, its payload decoded by the table's format (`Format.decoder` passes its payload decoder).
Avro's is `formats.avro.reader.glue_payload`, JSON Schema's `formats.json_schema`'s (each record validated against its writer version),
Protobuf's `formats.protobuf.glue`'s (the AWS Python library has none; the framing is the Java serde's). The
table's `format` names the data format it reads (avro: AVRO, json-schema: JSON, protobuf: PROTOBUF); a payload that
does not decode is a bad record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from icefloe.errors import BadRecord
from icefloe.registries import glue
from icefloe.registries.glue import Decoder

# A format's decoder of Glue payloads: factory(writer version's definition, the table's definition, its message
# type; None, None for keys)
PayloadDecoder = Callable[[str, str | None, str | None], Decoder]


def decoder(
    conf: dict[str, str], payload: PayloadDecoder, table_schema: str | None = None, message_type: str | None = None
) -> Decoder:
    """Decodes Glue-framed values (or keys: no `table_schema`): writer versions fetched by UUID (of the data format
    `conf` reads, else a bad record), payloads by the format's `payload` decoder. A version that cannot decode
    (unknown, another data format, a definition that does not parse) is remembered: every record written with it
    fails alike without asking the registry again."""
    client = glue.glue_client(conf)  # through the module: tests replace the client there
    decoders: dict[UUID, Decoder | ValueError] = {}

    def for_version(version: UUID) -> Decoder:
        found = glue.writer_version(client, conf, version)
        try:
            return payload(found["SchemaDefinition"], table_schema, message_type)
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
