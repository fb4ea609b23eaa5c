"""The Python path's Avro decoders (inline schema, Confluent registry, AWS Glue) on one error policy: a payload
fastavro cannot read is a bad record that names what failed and the exception's type, never the payload's bytes."""

from __future__ import annotations

import json
import struct

import pytest

from icefloe.errors import BadRecord
from icefloe.formats.avro.reader import glue_payload, inline_avro_decoder, registry_avro_decoder
from icefloe.formats.base import DecoderSpec

SCHEMA = json.dumps({"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]})
# A string of two bytes that are not UTF-8: fastavro's own text quotes them ("can't decode byte 0xff ...").
NOT_UTF8 = b"\x04\xff\xfe"


def _refusal(decode, data: bytes) -> str:
    with pytest.raises(BadRecord) as refused:
        decode(data)
    return str(refused.value)


def _withholds_the_payload(message: str) -> None:
    assert "0xff" not in message and "\\xff" not in message and "position" not in message, message
    assert message.endswith("(UnicodeDecodeError)"), message


def test_the_inline_and_glue_decoders_name_the_failure_without_the_payloads_bytes():
    _withholds_the_payload(_refusal(inline_avro_decoder(SCHEMA), b"\x00\x00\x00\x00\x01" + NOT_UTF8))
    _withholds_the_payload(_refusal(glue_payload(SCHEMA, SCHEMA), NOT_UTF8))


def test_the_registry_decoder_names_the_failure_without_the_payloads_bytes(registry, topic):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    schema_id = SchemaRegistryClient({"url": registry.url}).register_schema(f"{topic}-value", Schema(SCHEMA, "AVRO"))
    spec = DecoderSpec("avro", "confluent", topic, registry_conf={"url": registry.url})
    decode = registry_avro_decoder(spec, SCHEMA, key=False)
    assert decode(b"\x00" + struct.pack(">I", schema_id) + b"\x04ok") == {"s": "ok"}  # the schema is the one used
    _withholds_the_payload(_refusal(decode, b"\x00" + struct.pack(">I", schema_id) + NOT_UTF8))
