"""Protobuf and JSON Schema pieces without a broker: the wire format, message lookup, mapping, rule messages."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import types as T

from icefloe.formats.json_schema import failed_rule, validator_for_bundle, value_fields
from icefloe.formats.protobuf.messages import parse_frame
from icefloe.formats.protobuf.messages import value_fields as proto_fields
from icefloe.formats.protobuf.schemas import find_message, is_text, message_at
from icefloe_dev.protos import compile_protos

PROTO = """syntax = "proto3";
package p;
message A { message Inner { int32 x = 1; } Inner inner = 1; optional string o = 2; oneof pick { int64 n = 3; string s = 4; } }
message B { A a = 1; }
message Loop { Loop next = 1; }
"""


@pytest.fixture(scope="module")
def file(tmp_path_factory):
    return compile_protos({"p/a.proto": PROTO}, tmp_path_factory.mktemp("protos")).FindFileByName("p/a.proto")


@pytest.mark.parametrize(
    ("header", "indexes"), [(b"\x00", [0]), (b"\x02\x02", [1]), (b"\x04\x00\x00", [0, 0]), (b"\x02\x01", [-1])]
)
def test_message_indexes_are_zigzag_varints(header, indexes):
    assert parse_frame(b"\x00\x00\x00\x00\x07" + header + b"body") == (7, indexes, b"body")


def test_frames_that_are_not_confluent_are_refused():
    with pytest.raises(ValueError, match="not Confluent wire format"):
        parse_frame(b"\x01\x00\x00\x00\x07\x00")
    with pytest.raises(ValueError, match="message indexes are truncated"):
        parse_frame(b"\x00\x00\x00\x00\x07\x04\x00")


def test_message_lookup_by_index_and_by_name(file):
    assert message_at(file, [1]).full_name == "p.B"
    assert message_at(file, [0, 0]).full_name == "p.A.Inner"
    with pytest.raises(ValueError, match=r"message index \[5\] does not exist: the schema's top level has 3"):
        message_at(file, [5])
    assert find_message(file, None).full_name == "p.A" and find_message(file, "B").full_name == "p.B"


def test_oneof_gets_a_case_column_proto3_optional_does_not(file):
    fields = {f.name: f.dataType for f in proto_fields(find_message(file, "A"))}
    assert fields == {
        "inner": T.StructType([T.StructField("x", T.IntegerType())]),
        "o": T.StringType(),
        "n": T.LongType(),
        "s": T.StringType(),
        "pick": T.StringType(),
    }


def test_recursive_message_is_refused(file):
    from icefloe.errors import ConfigError

    with pytest.raises(ConfigError, match="recursive message type p.Loop"):
        proto_fields(find_message(file, "Loop"))


def test_text_and_serialized_schemas_are_told_apart():
    assert is_text('syntax = "proto3"; message A { string a = 1; }')
    assert not is_text("CgdhLnByb3RvEgFh")


def test_json_schema_rule_messages_never_carry_the_value():
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["b"]}
    validator = validator_for_bundle({"schema": schema, "references": {}})
    errors = sorted(failed_rule(e) for e in validator.iter_errors({"a": "SECRET-VALUE"}))
    assert errors == ["value.a: fails maxLength 3", "value: required property 'b' is missing"]


def test_json_schema_nullable_forms_and_fallbacks():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": ["integer", "null"]},
            "b": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/d"}]},
            "c": {"type": ["integer", "string"]},
            "m": {"type": "object", "additionalProperties": {"type": "number"}},
        },
        "$defs": {"d": {"type": "string", "format": "date"}},
    }
    fields = {f.name: f.dataType for f in value_fields(json.dumps({"schema": schema, "references": {}}), "s")}
    assert fields == {
        "a": T.LongType(),
        "b": T.DateType(),
        "c": T.StringType(),
        "m": T.MapType(T.StringType(), T.DoubleType()),
    }


RANGED = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}


@pytest.mark.parametrize(
    ("format", "registry", "schema", "why"),
    [
        ("protobuf", "glue", None, "from the AWS Glue Schema Registry are decoded in Python"),
        ("json-schema", "confluent", RANGED, "validated in Python: value.n: the JVM path does not check minimum"),
    ],
)
def test_registry_formats_take_the_python_path_and_say_why(format, registry, schema, why):
    from icefloe.formats.base import DecoderSpec
    from icefloe.materialize.read_paths import PYTHON, choose_read_path

    bundle = schema and json.dumps({"schema": schema, "references": {}})
    path = choose_read_path(None, DecoderSpec(format, registry, "t", bundle, schema_id=1))  # no JVM needed
    assert path.name == PYTHON and why in path.reason


def test_every_table_format_and_key_format_has_one_format_object():
    """A format is one object in `FORMATS`: each `format` and `keyFormat` the config accepts resolves to one."""
    from typing import get_args

    from icefloe.formats.registry import FORMATS
    from icefloe.spec import TableSpec

    formats = set(get_args(TableSpec.model_fields["format"].annotation))
    key_formats = set(get_args(get_args(TableSpec.model_fields["key_format"].annotation)[0]))
    assert formats == key_formats == set(FORMATS), (formats, key_formats, set(FORMATS))
    assert all(f.name == name for name, f in FORMATS.items())


def test_a_json_decoder_declares_its_bad_records_and_nothing_else():
    """Strict JSON (formats.json): invalid UTF-8, invalid JSON, NaN and non-objects are `BadRecord`s, named by
    position, never quoting the bytes."""
    from icefloe.errors import BadRecord
    from icefloe.formats.base import DecoderSpec
    from icefloe.formats.registry import build_decoder

    decode = build_decoder(DecoderSpec("json", "inline", "t"))
    for data, message in [
        (b'{"a": "\xff"}', "value is not valid UTF-8 (invalid start byte at byte 7)"),
        (b'{"a": 1,', "value is not valid JSON: Expecting property name enclosed in double quotes at position 8"),
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b"[1]", "JSON value must be an object, got list"),
    ]:
        with pytest.raises(BadRecord) as caught:
            decode(data)
        assert str(caught.value) == message


def test_a_json_value_starting_with_a_byte_order_mark_is_refused_as_json_loads_refuses_it():
    from icefloe.errors import BadRecord
    from icefloe.formats.json import parse_json

    with pytest.raises(
        BadRecord, match=r"^value is not valid JSON: Unexpected UTF-8 BOM \(decode using utf-8-sig\) at position 0$"
    ):
        parse_json('\ufeff{"a": 1}'.encode())


def _values_read_field_by_field(message):
    """The row value as read before the reader was compiled per message type (asking the descriptor per field)."""
    import datetime as dt
    from decimal import Decimal

    from google.protobuf import json_format

    from icefloe.formats.protobuf import messages as m

    def single(field, value):
        if field.type == m._F.TYPE_ENUM:
            known = field.enum_type.values_by_number.get(value)
            return known.name if known is not None else str(value)
        if field.type in m._UNSIGNED_64:
            return Decimal(value)
        if field.type not in (m._F.TYPE_MESSAGE, m._F.TYPE_GROUP):
            return value
        name = field.message_type.full_name
        if name == m._TIMESTAMP:
            return m._EPOCH + dt.timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)
        if name == m._DURATION:
            return value.seconds * 1_000_000 + int(value.nanos / 1000)
        if name in m.WRAPPERS:
            return single(field.message_type.fields_by_name["value"], value.value)
        if name in m.JSON_TYPES:
            return json.dumps(json_format.MessageToDict(value), separators=(",", ":"), sort_keys=True)
        return _values_read_field_by_field(value)

    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if m.is_map(field):
            out[field.name] = {k: single(field.message_type.fields_by_name["value"], v) for k, v in value.items()}
        elif m.is_repeated(field):
            out[field.name] = [single(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = single(field, value)
    for oneof in m.real_oneofs(message.DESCRIPTOR):
        out[oneof] = message.WhichOneof(oneof)
    return out


def test_protobuf_messages_read_as_they_were_field_by_field(tmp_path):
    from icefloe.formats.protobuf.messages import message_values
    from icefloe_dev.protos import message_class
    from test_protobuf import MONEY, TRADE, full_trade

    files = {"u/money.proto": MONEY.format(ns="u"), "u/trade.proto": TRADE.format(ns="u", extra="")}
    pool = compile_protos(files, tmp_path)
    Trade = message_class(pool, "u.Trade")
    unknown_side = Trade(id="t4", side=7)  # an enum number the schema does not name
    unknown_side.by_rank[1].rank = 3
    unknown_side.history.add()
    trades = [full_trade(Trade, pool), Trade(id="t2"), Trade(id="t3", cash={"units": 12}), unknown_side]
    for trade in trades:
        parsed = Trade.FromString(trade.SerializeToString())
        assert message_values(parsed) == _values_read_field_by_field(parsed)
    assert message_values(trades[3])["side"] == "7" and message_values(trades[0])["u64"] == 2**64 - 1
