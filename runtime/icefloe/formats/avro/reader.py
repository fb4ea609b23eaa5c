"""The Avro decoders of the Python path, on one fastavro reader (`schemaless`) and one error policy: fastavro's gaps
registered and the schemas guarded (`fastavro_gaps`), a union branch index out of range raised as itself, and any
other failure on corrupt input a `BadRecord` naming what failed and the exception's type only (`withheld`: fastavro's
text may quote the payload, e.g. the bytes that are not UTF-8). The decoders: Confluent wire format with an inline
schema, through a Confluent-compatible registry (confluent-kafka's deserializer, which resolves the writer schema by
its id and its references, on the same guarded schemas), and AWS Glue payloads.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import IO, Any

from icefloe.errors import BadRecord
from icefloe.formats.avro import fastavro_gaps
from icefloe.formats.avro.unions import needs_record_names, rewriter
from icefloe.formats.base import Decoder, DecoderSpec
from icefloe.formats.decoding import registry_checked
from icefloe.registries.confluent import registry_client_conf

# What a payload fastavro cannot read says: the BadRecord's text, from fastavro's exception.
ErrorPolicy = Callable[[Exception], str]


def withheld(what: str) -> ErrorPolicy:
    """`what` and the exception's type only: fastavro's text may quote data."""
    return lambda error: f"{what} ({type(error).__name__})"


def parsed(schema_str: str) -> Any:
    """An Avro schema parsed for fastavro, guarded (`fastavro_gaps`)."""
    import fastavro

    fastavro_gaps.register()
    return fastavro_gaps.guarded(fastavro.parse_schema(json.loads(schema_str)))


def schemaless(writer: Any, reader: Any, names: bool, policy: ErrorPolicy) -> Callable[[IO[bytes]], Any]:
    """Reads one Avro body written with `writer` (parsed), resolved to `reader` (parsed; None: as written);
    `names`: union values as (record name, value) for the union rewrite (`unions`)."""
    import fastavro

    def read(buffer: IO[bytes]) -> Any:
        try:
            return fastavro.schemaless_reader(buffer, writer, reader, names)
        except fastavro_gaps.UnionIndexError:
            raise
        except Exception as error:  # fastavro raises many types on corrupt input
            raise BadRecord(policy(error)) from None

    return read


def with_unions(schema_str: str, make: Callable[[bool], Decoder]) -> Decoder:
    """A decoder whose values have Avro unions of several types as the table's member structs (avro_unions)."""
    names = needs_record_names(schema_str)
    decode, rewrite = make(names), rewriter(schema_str, names)
    if rewrite is None:
        return decode
    return lambda data: rewrite(decode(data))


def inline_avro_decoder(schema_str: str) -> Decoder:
    """Confluent wire format (magic byte 0, 4-byte schema id) decoded with the inline schema; the id is ignored."""
    read = schemaless(parsed(schema_str), None, False, withheld("Avro payload does not match the inline schema"))

    def decode(data: bytes) -> Any:
        if len(data) < 5 or data[0] != 0:
            raise BadRecord("not Confluent wire format (magic byte 0 and a schema id expected)")
        buffer = io.BytesIO(data[5:])
        value = read(buffer)
        if buffer.tell() != len(data) - 5:
            raise BadRecord("Avro payload has trailing bytes: written with another schema?")
        return value

    return decode


def registry_avro_decoder(spec: DecoderSpec, reader_schema: str | None, key: bool, names: bool = False) -> Decoder:
    """Confluent wire format through the registry: confluent-kafka's deserializer (the writer schema by its id,
    parsed once and guarded), resolved to `reader_schema` (None: as written). Its failures are classified by
    `registry_checked` (opaque: any exception it does not name is a bad record, its text withheld)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

    class GuardedAvroDeserializer(AvroDeserializer):
        def _get_parsed_schema(self, schema):  # writer and reader schemas (parsed once, cached by confluent-kafka)
            return fastavro_gaps.guarded(super()._get_parsed_schema(schema))

    fastavro_gaps.register()
    undecodable = withheld("Avro payload cannot be decoded")
    client = SchemaRegistryClient(registry_client_conf(spec.registry))
    deserializer = GuardedAvroDeserializer(client, schema_str=reader_schema, return_record_name=names)
    context = SerializationContext(spec.topic, MessageField.KEY if key else MessageField.VALUE)

    def avro(data: bytes) -> Any:
        try:
            return deserializer(data, context)
        except SerializationError as error:
            raise BadRecord(f"Avro: {error}") from None
        except BadRecord:
            raise
        except ValueError as error:  # fastavro's own, on corrupt input
            raise BadRecord(undecodable(error)) from None

    return registry_checked(spec, avro, "Avro", opaque=True)


def glue_payload(writer: str, reader: str | None, message_type: str | None = None) -> Decoder:
    """An Avro payload framed for the AWS Glue Schema Registry (`glue_framed.PayloadDecoder`) written with `writer`,
    resolved to the table's schema `reader` (unions as member structs; no reader: a key, read as written)."""
    reader = reader or writer
    writer_schema, reader_schema = parsed(writer), parsed(reader)
    names = needs_record_names(reader)
    rewrite = rewriter(reader, names) or (lambda value: value)
    read = schemaless(writer_schema, reader_schema, names, withheld("Avro payload cannot be decoded"))
    return lambda payload: rewrite(read(io.BytesIO(payload)))
