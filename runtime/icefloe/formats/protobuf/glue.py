"""Protobuf through the AWS Glue Schema Registry (glue_registry calls this for versions whose DataFormat is PROTOBUF).

The AWS library's framing, as its Java serde (software.amazon.glue:schema-registry-serde 1.1.27: ProtobufSerializer,
ProtobufWireFormatEncoder, MessageIndexFinder) writes it: after Glue's 18-byte prefix (glue_registry.split) comes
one **unsigned** varint, the message index (not Confluent's zigzag index path), then the message. The index counts
every message type of the schema's file, nested ones and map entries included, **sorted by full name**
(`B`, `B.A`, `B.A.D`, `B.C`), not in declaration order. A record's message type is the one its index names; a
record of another type than the table's is a bad record.

A version's definition is one `.proto` file as text (Glue has no references; imports can only be the well-known
types and google/type/*, which the serde and protobuf_schemas both carry). The Java serializer generates that text
from the message's descriptor with Wire, which writes a map field as its entry message with
`option map_entry = true;`, and protoc refuses that option. So it is carried through protoc as a reserved name and
set back on the compiled descriptor: the field maps as a map, as its writer declared it.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from icefloe.errors import BadRecord, ConfigError
from icefloe.formats.protobuf.messages import message_values
from icefloe.formats.protobuf.messages import value_fields as message_fields
from icefloe.formats.protobuf.schemas import builtin_files, compile_text, find_message, in_pool

FILE_NAME = "icefloe_glue_schema.proto"  # a Glue schema version has no file name of its own
_MAP_ENTRY = re.compile(r"\boption\s+map_entry\s*=\s*true\s*;")
_MARKER = "icefloe_map_entry"  # a reserved name protoc keeps in the descriptor


@functools.lru_cache(maxsize=64)  # per schema version: protoc runs once per definition in a process
def compile_definition(definition: str) -> FileDescriptor:
    """A Glue schema version's `.proto` text as a file descriptor (ValueError if it does not compile)."""
    marked = _MAP_ENTRY.sub(f'reserved "{_MARKER}";', definition)
    proto = compile_text(FILE_NAME, marked, list(builtin_files().values()))
    _restore_map_entries(proto.message_type)
    return in_pool(proto, builtin_files())


def _restore_map_entries(messages) -> None:
    for message in messages:
        if _MARKER in message.reserved_name:
            message.reserved_name.remove(_MARKER)
            message.options.map_entry = True
        _restore_map_entries(message.nested_type)


def by_index(file: FileDescriptor) -> list[Descriptor]:
    """The file's message types in the order the AWS serde numbers them: all of them, nested included, by full name."""
    found, queue = [], deque(file.message_types_by_name.values())
    while queue:
        descriptor = queue.popleft()
        found.append(descriptor)
        queue.extend(descriptor.nested_types)
    return sorted(found, key=lambda d: d.full_name)


def _table_descriptor(definition: str, message_type: str | None, subject: str) -> Descriptor:
    """The message type the table reads (`messageType`, else the file's first message) in the latest version."""
    try:
        return find_message(compile_definition(definition), message_type)
    except ValueError as error:
        raise ConfigError(f"{subject}: {error}") from None


def table_message(definition: str, message_type: str | None, subject: str) -> str:
    return _table_descriptor(definition, message_type, subject).full_name


def value_fields(definition: str, subject: str, message_type: str | None) -> list:
    return message_fields(_table_descriptor(definition, message_type, subject))


def _index(payload: bytes) -> tuple[int, int]:
    """(message index, where the message starts): one unsigned varint of at most 32 bits, as Java's readUInt32."""
    index, shift = 0, 0
    for pos, byte in enumerate(payload[:5]):
        index |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return index, pos + 1
        shift += 7
    raise BadRecord("Glue Protobuf message index is truncated or longer than 5 bytes")


def payload_decoder(writer: str, table: str, message_type: str | None) -> Callable[[bytes], dict[str, Any]]:
    """A Glue Protobuf payload (message index, message) decoded with its writer version's `.proto` text into the
    values of the table's message type `message_type` (fields the writer lacks are left to the row: null; None: a
    key, of whichever type its index names)."""
    try:
        types = by_index(compile_definition(writer))
    except ValueError as error:
        raise BadRecord(f"writer version: {error}") from None
    classes: dict[int, Any] = {}

    def decode(payload: bytes) -> dict[str, Any]:
        index, start = _index(payload)
        if index not in classes:
            if index >= len(types):
                raise BadRecord(
                    f"Glue Protobuf message index {index} does not exist: the writer version has "
                    f"{len(types)} message type(s)"
                )
            if message_type is not None and types[index].full_name != message_type:
                raise BadRecord(
                    f"record is a {types[index].full_name} (message index {index}), the table reads {message_type}"
                )
            classes[index] = GetMessageClass(types[index])
        message = classes[index]()
        try:
            message.ParseFromString(payload[start:])
        except DecodeError as error:
            raise BadRecord(f"Protobuf payload cannot be decoded: {error}") from None
        return message_values(message)

    return decode
