"""Protobuf values: the Confluent wire format, message types to table types, messages to row values.

Mapping (the table's columns are the fields of one message type):
  double/float -> double/float, int32/sint32/sfixed32 -> int, int64/sint64/sfixed64 and uint32/fixed32 -> long,
  uint64/fixed64 -> decimal(20,0) (no unsigned 64-bit type in Iceberg), bool, string, bytes -> binary,
  enum -> string (the value's name; an unknown number as its digits), message -> struct, repeated -> list,
  map<K, V> -> map, oneof -> each member a nullable field plus a string column named after the oneof holding the
  member that was set, google.protobuf.Timestamp -> timestamp with zone, Duration -> long microseconds (both cut to
  microseconds, Iceberg's precision), wrappers (Int64Value, StringValue, ...) -> the nullable scalar,
  Struct/Value/ListValue -> JSON string.
Values as the encoding implies: a field without presence (proto3 scalars, enums) that was not sent is its default
(0, "", false, the first enum value); a field with presence (messages, proto3 `optional`, oneof members, proto2
optional) that was not sent is null; repeated and map fields not sent are empty.

Wire format: magic byte 0, 4-byte schema id, the message-index path (zigzag varints: count, then indexes; a single
0 byte for [0]), then the message.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from pyspark.sql import types as T

from icefloe.errors import BadRecord, ConfigError
from icefloe.formats.protobuf.schemas import ProtobufSchemas, message_at

_F = FieldDescriptor
# One line per width and signedness: the grouping is the mapping's point, so the formatter leaves it as written.
_SCALARS: dict[int, T.DataType] = {
    _F.TYPE_DOUBLE: T.DoubleType(), _F.TYPE_FLOAT: T.FloatType(),
    _F.TYPE_INT32: T.IntegerType(), _F.TYPE_SINT32: T.IntegerType(), _F.TYPE_SFIXED32: T.IntegerType(),
    _F.TYPE_INT64: T.LongType(), _F.TYPE_SINT64: T.LongType(), _F.TYPE_SFIXED64: T.LongType(),
    _F.TYPE_UINT32: T.LongType(), _F.TYPE_FIXED32: T.LongType(),
    _F.TYPE_UINT64: T.DecimalType(20, 0), _F.TYPE_FIXED64: T.DecimalType(20, 0),
    _F.TYPE_BOOL: T.BooleanType(), _F.TYPE_STRING: T.StringType(), _F.TYPE_BYTES: T.BinaryType(),
    _F.TYPE_ENUM: T.StringType(),
}  # fmt: skip
_UNSIGNED_64 = (_F.TYPE_UINT64, _F.TYPE_FIXED64)
WRAPPERS = {
    f"google.protobuf.{name}": kind
    for name, kind in (
        ("DoubleValue", _F.TYPE_DOUBLE),
        ("FloatValue", _F.TYPE_FLOAT),
        ("Int64Value", _F.TYPE_INT64),
        ("UInt64Value", _F.TYPE_UINT64),
        ("Int32Value", _F.TYPE_INT32),
        ("UInt32Value", _F.TYPE_UINT32),
        ("BoolValue", _F.TYPE_BOOL),
        ("StringValue", _F.TYPE_STRING),
        ("BytesValue", _F.TYPE_BYTES),
    )
}
_TIMESTAMP, _DURATION = "google.protobuf.Timestamp", "google.protobuf.Duration"
JSON_TYPES = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def is_repeated(field: FieldDescriptor) -> bool:
    return field.label == _F.LABEL_REPEATED


@functools.lru_cache(maxsize=1024)  # per record otherwise: it copies the descriptor
def real_oneofs(descriptor: Descriptor) -> tuple[str, ...]:
    """The message's oneof names, without the synthetic ones protoc makes for proto3 `optional` fields."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    synthetic = {proto.oneof_decl[f.oneof_index].name for f in proto.field if f.proto3_optional}
    return tuple(o.name for o in descriptor.oneofs if o.name not in synthetic)


# --- message types to table types ---------------------------------------------------------------------------------


def value_fields(descriptor: Descriptor) -> list[T.StructField]:
    """The table columns for a message type."""
    return list(_struct(descriptor, descriptor.full_name, ()).fields)


def _struct(descriptor: Descriptor, path: str, in_progress: tuple[str, ...]) -> T.StructType:
    if descriptor.full_name in in_progress:
        raise ConfigError(f"{path}: recursive message type {descriptor.full_name} cannot be a table column")
    inner = (*in_progress, descriptor.full_name)
    fields = [T.StructField(f.name, _field_type(f, f"{path}.{f.name}", inner), True) for f in descriptor.fields]
    names = {f.name for f in descriptor.fields}
    for oneof in real_oneofs(descriptor):
        if oneof in names:  # protoc refuses this; a descriptor built by hand might not
            raise ConfigError(f"{path}: oneof {oneof!r} has the name of a field")
        fields.append(T.StructField(oneof, T.StringType(), True))
    if not fields:
        raise ConfigError(f"{path}: message {descriptor.full_name} has no fields, and a table column cannot be empty")
    return T.StructType(fields)


def _field_type(field: FieldDescriptor, path: str, in_progress: tuple[str, ...]) -> T.DataType:
    if is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return T.MapType(_single_type(key, path, in_progress), _single_type(value, f"{path}{{}}", in_progress), True)
    single = _single_type(field, path, in_progress)
    return T.ArrayType(single, True) if is_repeated(field) else single


def _single_type(field: FieldDescriptor, path: str, in_progress: tuple[str, ...]) -> T.DataType:
    if field.type not in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return _SCALARS[field.type]
    name = field.message_type.full_name
    if name == _TIMESTAMP:
        return T.TimestampType()
    if name == _DURATION:
        return T.LongType()
    if name in WRAPPERS:
        return _SCALARS[WRAPPERS[name]]
    if name in JSON_TYPES:
        return T.StringType()
    return _struct(field.message_type, path, in_progress)


# --- messages to row values ---------------------------------------------------------------------------------------


def message_values(message: Message) -> dict[str, Any]:
    """A message as the row value its table type expects (see the module docstring for defaults)."""
    return _reader(message.DESCRIPTOR)(message)


# How `_reader` reads a field: a map, a repeated field, a field with presence (null when not sent), any other.
_MAP, _REPEATED, _PRESENCE, _PLAIN = range(4)


@functools.lru_cache(maxsize=1024)
def _reader(descriptor: Descriptor) -> Callable[[Message], dict[str, Any]]:
    """The row reader of a message type, compiled once: asking the descriptor about every field of every record
    cost most of a record's decoding."""
    fields: list[tuple[str, int, Callable[[Any], Any] | None]] = []
    for field in descriptor.fields:
        if is_map(field):
            fields.append((field.name, _MAP, _converter(field.message_type.fields_by_name["value"]) or _same))
        elif is_repeated(field):
            fields.append((field.name, _REPEATED, _converter(field) or _same))
        else:
            fields.append((field.name, _PRESENCE if field.has_presence else _PLAIN, _converter(field)))
    oneofs = real_oneofs(descriptor)

    def read(message: Message) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, kind, convert in fields:
            value = getattr(message, name)
            if kind == _MAP:
                out[name] = {k: convert(v) for k, v in value.items()}  # type: ignore[misc]  # set for maps
            elif kind == _REPEATED:
                out[name] = [convert(v) for v in value]  # type: ignore[misc]  # set for repeated fields
            elif kind == _PRESENCE and not message.HasField(name):
                out[name] = None
            else:
                out[name] = value if convert is None else convert(value)
        for oneof in oneofs:
            out[oneof] = message.WhichOneof(oneof)
        return out

    return read


def _same(value: Any) -> Any:
    return value


def _converter(field: FieldDescriptor) -> Callable[[Any], Any] | None:
    """How one value of the field becomes its row value; None where it is its row value already."""
    if field.type == _F.TYPE_ENUM:
        names = {number: value.name for number, value in field.enum_type.values_by_number.items()}

        def enum(value: int) -> str:
            name = names.get(value)
            return name if name is not None else str(value)

        return enum
    if field.type in _UNSIGNED_64:
        return Decimal
    if field.type not in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return None
    message_type = field.message_type
    name = message_type.full_name
    if name == _TIMESTAMP:
        where = field.full_name

        def timestamp(value: Any) -> dt.datetime:
            try:
                return _EPOCH + dt.timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)
            except OverflowError:
                raise BadRecord(f"{where}: timestamp out of range (beyond year 1 to 9999)") from None  # no value

        return timestamp
    if name == _DURATION:
        return lambda value: value.seconds * 1_000_000 + int(value.nanos / 1000)
    if name in WRAPPERS:
        inner = _converter(message_type.fields_by_name["value"]) or _same
        return lambda value: inner(value.value)
    if name in JSON_TYPES:
        return lambda value: json.dumps(json_format.MessageToDict(value), separators=(",", ":"), sort_keys=True)
    return lambda value: _reader(message_type)(value)  # on use: a recursive type compiles no further than its data


# --- the wire format ----------------------------------------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(data):
            raise BadRecord("Protobuf message indexes are truncated")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos  # zigzag
        shift += 7
        if shift > 63:
            raise BadRecord("Protobuf message indexes are malformed (varint too long)")


def parse_frame(data: bytes) -> tuple[int, list[int], bytes]:
    """(schema id, message indexes, message bytes) of a Confluent-framed Protobuf value."""
    if len(data) < 6 or data[0] != 0:
        raise BadRecord("not Confluent wire format (magic byte 0, a schema id and message indexes expected)")
    schema_id = int.from_bytes(data[1:5], "big")
    count, pos = _varint(data, 5)
    if not 0 <= count <= 100:
        raise BadRecord(f"Protobuf message indexes are malformed (count {count})")
    indexes = []
    for _ in range(count):
        index, pos = _varint(data, pos)
        indexes.append(index)
    return schema_id, indexes or [0], data[pos:]


class ProtobufDecoder:
    """Decodes framed values with their writer's schema (by id) into row values of the table's message type.

    Registry errors are the client's own (the caller classifies them); a bad record raises BadRecord."""

    def __init__(self, client, message_type: str | None):  # None: any type (keys)
        self.schemas = ProtobufSchemas(client)
        self.message_type = message_type
        self._classes: dict[tuple[int, tuple[int, ...]], type[Message]] = {}

    def __call__(self, data: bytes) -> dict[str, Any]:
        schema_id, indexes, body = parse_frame(data)
        message_class = self._class(schema_id, indexes)
        message = message_class()
        try:
            message.ParseFromString(body)
        except DecodeError as error:
            raise BadRecord(f"Protobuf payload cannot be decoded with schema id {schema_id}: {error}") from None
        return message_values(message)

    def _class(self, schema_id: int, indexes: list[int]) -> type[Message]:
        key = (schema_id, tuple(indexes))
        if key not in self._classes:
            try:
                descriptor = message_at(self.schemas.file(schema_id), indexes)
            except ValueError as error:
                raise BadRecord(f"schema id {schema_id}: {error}") from None
            if self.message_type is not None and descriptor.full_name != self.message_type:
                raise BadRecord(
                    f"record is a {descriptor.full_name} (schema id {schema_id}, message indexes {indexes}), "
                    f"the table reads {self.message_type}"
                )
            self._classes[key] = GetMessageClass(descriptor)
        return self._classes[key]
