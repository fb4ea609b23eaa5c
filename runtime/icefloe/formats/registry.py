"""The formats by name, and what the rest of the runtime asks of them: a table's `DecoderSpec` (driver), its
decoders (executors). Adding a format is a module (or package) under formats/ with a `Format` object, and one line
in `FORMATS`; an envelope likewise, with an `Envelope` object and a line in `ENVELOPES`. Materialize names neither."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from icefloe.errors import BadRecord
from icefloe.formats.avro.format import AVRO
from icefloe.formats.base import ChangeDecoder, Decoder, DecoderSpec, Envelope, Format
from icefloe.formats.debezium.format import DEBEZIUM
from icefloe.formats.json_schema import JSON_SCHEMA
from icefloe.formats.plain_json import JSON
from icefloe.formats.protobuf.format import PROTOBUF
from icefloe.formats.raw import RAW, STRING
from icefloe.registries import glue as glue_registry
from icefloe.spec import SourceCluster, TableSpec

# The table's `format` (and `keyFormat`) -> its Format
FORMATS: dict[str, Format] = {f.name: f for f in (AVRO, JSON, JSON_SCHEMA, PROTOBUF, RAW, STRING)}

# The table's `envelope` -> its Envelope (change data wrapped around a format's values)
ENVELOPES: dict[str, Envelope] = {e.name: e for e in (DEBEZIUM,)}


def format_of(spec: DecoderSpec) -> Format:
    return FORMATS[spec.data_format]


def envelope_of(spec: DecoderSpec) -> Envelope | None:
    """The envelope around the table's values (None: plain values)."""
    return ENVELOPES[spec.envelope] if spec.envelope is not None else None


def decoder_spec(table: TableSpec, cluster: SourceCluster) -> DecoderSpec:
    """Resolve how this table's values are decoded, fetching the latest registry schema (driver side)."""
    keys: dict[str, Any] = {
        "key_fields": table.key or (),
        "key_format": table.effective_key_format if table.key else None,
    }
    glue = cluster.schema_registry is not None and cluster.schema_registry.type == "glue"
    if glue and keys["key_format"] in glue_registry.DATA_FORMATS:
        keys["key_conf"], _ = glue_registry.checked_conf(
            cluster.schema_registry, table.topic, keys["key_format"], f"table {table.table_name}", key=True
        )
    if table.envelope is not None:  # change events: the envelope resolves its columns and key itself
        return ENVELOPES[table.envelope].resolve(table, cluster)
    return FORMATS[table.format].resolve(table, cluster, keys)


def build_decoder(spec: DecoderSpec) -> Decoder:
    return format_of(spec).decoder(spec)


def build_change_decoder(spec: DecoderSpec) -> ChangeDecoder | None:
    """An envelope's decoder: (value, key, headers) -> the row and its change columns (None: plain values)."""
    envelope = envelope_of(spec)
    return envelope.decoder(spec) if envelope is not None else None


def build_key_decoder(spec: DecoderSpec) -> Callable[[bytes], dict]:
    """Decodes a Kafka key into {key field: value}, for tombstones of tables keyed by value fields."""
    decode = FORMATS[spec.key_format].key_decoder(spec)  # type: ignore[index]  # a table with key fields has one

    def keyed(data: bytes) -> dict:
        value = decode(data)
        if isinstance(value, dict):
            return value
        if len(spec.key_fields) == 1 and not isinstance(value, list):  # a primitive key gives the one key field
            return {spec.key_fields[0]: value}
        raise BadRecord(f"key must decode to an object with fields {list(spec.key_fields)}")

    return keyed
