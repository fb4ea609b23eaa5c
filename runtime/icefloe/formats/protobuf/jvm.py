"""Protobuf values on the JVM read path: a record framed for the table's message type with the table's own schema
id (the subject's latest version, `DecoderSpec.schema_id`) is decoded by icefloe's own Java function
(jvm/src/icefloe/jvm/ProtobufRows.java, built by scripts/setup.sh into jvm/lib/spark/icefloe-jvm.jar), which reads
the wire format straight into the table's row following `messages`' mapping. It returns null wherever the Python
decoder (the reference) might decide otherwise, and those records go to Python: a field the type does not declare,
a value on another wire type, a message field sent twice (Protobuf merges them), a string that is not UTF-8, an
unknown value of a closed enum, a timestamp beyond years 1 to 9999, a truncated message; so do records of other
schema ids (older versions) or other message types, and unframed ones.

A table stays on Python when its message type holds what the function does not read: `google.protobuf.Struct`,
`Value` or `ListValue` (JSON text, as Python's json_format writes it), groups (proto2 and delimited encoding),
required fields (proto2: Python refuses a message without them), an enum with aliases, or when the type is not in
the schema's own file (no message-index path), or the jar is not on Spark's class path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]  # py4j ships no types
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.formats.base import CONFLUENT, DecoderSpec
from icefloe.formats.protobuf import messages
from icefloe.formats.protobuf.schemas import deserialize_file, find_message, message_at, ordered_messages
from icefloe.jvm_gateway import ICEFLOE_JAR, jvm_gateway

JAVA_CLASS = "icefloe.jvm.ProtobufRows"
_F = FieldDescriptor
_KINDS = {
    _F.TYPE_DOUBLE: "double", _F.TYPE_FLOAT: "float", _F.TYPE_INT32: "int32", _F.TYPE_INT64: "int64",
    _F.TYPE_UINT32: "uint32", _F.TYPE_UINT64: "uint64", _F.TYPE_SINT32: "sint32", _F.TYPE_SINT64: "sint64",
    _F.TYPE_FIXED32: "fixed32", _F.TYPE_FIXED64: "fixed64", _F.TYPE_SFIXED32: "sfixed32",
    _F.TYPE_SFIXED64: "sfixed64", _F.TYPE_BOOL: "bool", _F.TYPE_STRING: "string", _F.TYPE_BYTES: "bytes",
}  # fmt: skip
_WELL_KNOWN = {"google.protobuf.Timestamp": "timestamp", "google.protobuf.Duration": "duration"}


class _NotCovered(Exception):
    """The message type holds something the Java function does not read."""


@dataclass(frozen=True)
class ProtobufJvmCodec:
    """How the JVM path reads a Protobuf table's values (formats.base.JvmCodec): one Java function per plan."""

    function: str  # the registered function's name
    struct: T.StructType  # the table's value columns
    schema_id: int

    @property
    def reason(self) -> str:
        return f"Kafka source and icefloe's Protobuf decoder (records of schema id {self.schema_id})"

    def decoded(self, value: Column) -> Column:
        return F.call_udf(self.function, value)

    def exact(self, value: Column, struct: str) -> Column:
        return F.col(struct).isNotNull()  # the function's null: the record goes to Python

    def value_columns(self, struct: str) -> dict[str, Column]:
        return {f.name: F.col(struct)[f.name] for f in self.struct.fields}


def codec_for(spark: SparkSession, spec: DecoderSpec) -> ProtobufJvmCodec | str:
    """The JVM codec of a Protobuf table, its function registered in `spark`, or why its values stay on Python."""
    if spec.schema_from != CONFLUENT:
        return "Protobuf values from the AWS Glue Schema Registry are decoded in Python"
    if spec.schema_id is None:
        return "Protobuf values are decoded in Python: the table's schema id is not known"
    file = deserialize_file(spec.schema)
    descriptor = find_message(file, spec.message_type)
    try:
        frame = b"\x00" + spec.schema_id.to_bytes(4, "big") + _indexes(file, descriptor)
        plan = f"{frame.hex()} {_message(descriptor, ())}"
    except _NotCovered as why:
        return f"Protobuf values are decoded in Python: {why}"
    java_class = getattr(jvm_gateway(spark), JAVA_CLASS)
    if not isinstance(java_class, JavaClass):  # Py4J's JavaPackage: no such class on the driver's class path
        return (
            f"Protobuf values are decoded in Python: {ICEFLOE_JAR} is not on Spark's class path (run scripts/setup.sh)"
        )
    struct = T.StructType(messages.value_fields(descriptor))
    function = "icefloe_protobuf_" + hashlib.sha256(plan.encode()).hexdigest()[:16]
    if not spark.catalog.functionExists(function):  # named by its plan: registered once per session
        returns = spark._jsparkSession.parseDataType(struct.json())
        spark._jsparkSession.udf().register(function, java_class(plan), returns)
    return ProtobufJvmCodec(function, struct, spec.schema_id)


def _indexes(file: FileDescriptor, descriptor: Descriptor) -> bytes:
    """The Confluent message-index path of `descriptor` in `file`, as the serializer frames it ([0]: one 0 byte)."""
    chain = []
    at: Descriptor | None = descriptor
    while at is not None:
        chain.append(at)
        at = at.containing_type
    path, parent = [], None
    for level in reversed(chain):
        siblings = [d.full_name for d in ordered_messages(file, parent)]
        if level.full_name not in siblings:
            raise _NotCovered(f"message {descriptor.full_name} is not declared in the schema's own file")
        path.append(siblings.index(level.full_name))
        parent = level
    assert message_at(file, path).full_name == descriptor.full_name
    if path == [0]:
        return b"\x00"
    return b"".join(_zigzag(n) for n in [len(path), *path])


def _zigzag(n: int) -> bytes:
    value, out = (n << 1) ^ (n >> 63), bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _message(descriptor: Descriptor, in_progress: tuple[str, ...]) -> str:
    if descriptor.full_name in in_progress:  # value_fields refuses the table before this
        raise _NotCovered(f"recursive message type {descriptor.full_name}")
    inner = (*in_progress, descriptor.full_name)
    oneofs = messages.real_oneofs(descriptor)
    fields = []
    for field in descriptor.fields:
        if field.label == _F.LABEL_REQUIRED:
            raise _NotCovered(f"{field.full_name} is required (proto2)")
        oneof = field.containing_oneof.name if field.containing_oneof is not None else None
        head = f"{field.number} {field.name}"
        if messages.is_map(field):
            key, value = (field.message_type.fields_by_name[n] for n in ("key", "value"))
            fields.append(f"{head} map 0 -1 {_type(key, inner)} {_type(value, inner)}")
            continue
        shape = "repeated" if messages.is_repeated(field) else "single"
        presence = int(shape == "single" and field.has_presence)
        index = oneofs.index(oneof) if oneof in oneofs else -1  # proto3 `optional`: a synthetic oneof, not a column
        fields.append(f"{head} {shape} {presence} {index} {_type(field, inner)}")
    return " ".join(["message", str(len(fields)), *fields, str(len(oneofs)), *oneofs])


def _type(field: FieldDescriptor, in_progress: tuple[str, ...]) -> str:
    if field.type in _KINDS:
        return _KINDS[field.type]
    if field.type == _F.TYPE_ENUM:
        values = field.enum_type.values
        if len({v.number for v in values}) != len(values):
            raise _NotCovered(f"enum {field.enum_type.full_name} has aliases")
        named = " ".join(f"{v.number} {v.name}" for v in values)
        return f"enum {int(field.enum_type.is_closed)} {len(values)} {named}".rstrip()
    if field.type == _F.TYPE_GROUP:
        raise _NotCovered(f"{field.full_name} is a group")
    name = field.message_type.full_name
    if name in _WELL_KNOWN:
        return _WELL_KNOWN[name]
    if name in messages.WRAPPERS:
        return f"wrapper {_KINDS[messages.WRAPPERS[name]]}"
    if name in messages.JSON_TYPES:
        raise _NotCovered(f"{field.full_name} is a {name} (JSON text, written by Python's json_format)")
    return _message(field.message_type, in_progress)
