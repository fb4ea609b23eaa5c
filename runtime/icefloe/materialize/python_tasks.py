"""The executor side of a batch: read planned offset ranges, decode, convert, emit Arrow record batches.

Runs inside Spark's `mapInArrow`; everything it needs travels in a picklable `ReadPlan`. A record that cannot be
read is emitted as a failed row (no value; its raw bytes and the error), and the driver applies the table's error
mode to those rows. A bad record is what a decoder declares (`BadRecord`) or conversion refuses (`ValueError`); any
other exception from a decoder is a bug and fails the task (`DecoderFailure`). An environment failure or a decoder
bug stops the task with a marked error the driver recovers (`unmark`): Spark carries a Python task's failure to the
driver only as text.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from icefloe.errors import BadRecord, DecoderFailure, InvalidChange, SourceAuthError, SourceError
from icefloe.formats.base import DecoderSpec
from icefloe.formats.registry import build_change_decoder, build_decoder, build_key_decoder
from icefloe.inline_types import TIMESTAMP_MICROS
from icefloe.source.kafka import OffsetRange, read_range

_TIMESTAMP_TYPES = {0: None, 1: "CreateTime", 2: "LogAppendTime"}
KAFKA_TIMESTAMP_MS = (TIMESTAMP_MICROS[0] // 1000, TIMESTAMP_MICROS[1] // 1000)  # the whole milliseconds of the range
INVALID_TIMESTAMP = "InvalidTimestamp"
_MARKER = "ICEFLOE-ERROR"
_MARKED = re.compile(_MARKER + r'(\["\w+", "(?:[^"\\]|\\.)*"\])' + _MARKER)


@dataclass(frozen=True)
class ReadPlan:
    kafka_conf: dict[str, str]
    decoder: DecoderSpec
    batch_schema_json: str  # the Spark StructType executors emit (table columns + status columns), as JSON
    value_fields: tuple[str, ...]
    strict: bool  # JSON values are checked field by field; Avro values are typed by the decoder
    required: frozenset[str] = frozenset()  # inline fields declared `optional: false`
    framed: bool = False  # values in Confluent wire format: a failed row carries its schema id
    needs_key: bool = False  # upsert keyed by the Kafka key: a record without one cannot be placed
    max_record_bytes: int = 8 * 1024 * 1024
    batch_rows: int = 20_000  # an Arrow batch is emitted at this many rows or at `batch_bytes`, whichever is first
    batch_bytes: int = 64 * 1024 * 1024  # of raw keys and values: large records must not pile up 20,000 deep

    def __repr__(self) -> str:  # the Kafka config may hold credentials
        return f"ReadPlan(decoder={self.decoder!r})"


def schema_id(payload: bytes | None) -> int | None:
    """The Schema Registry id in Confluent wire format, if the payload has that framing."""
    if payload and len(payload) >= 5 and payload[0] == 0:
        found = int.from_bytes(payload[1:5], "big")
        return found if found < 2**31 else None  # registry ids are positive 32-bit ints (the column's type)
    return None


def read_batches(plan: ReadPlan, tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function: input rows are (topic, partition, start, end) tasks."""
    try:
        yield from _read(plan, tasks)
    except (SourceError, DecoderFailure) as error:
        raise RuntimeError(_marked(error)) from None


def redecode_rows(plan: ReadPlan, rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function of the JVM read path: the records the JVM could not decode exactly, given as Kafka
    columns (`kafka_timestamp_ms` for the timestamp) and `value`, decoded here for their value or exact error."""
    try:
        yield from _redecode(plan, rows)
    except (SourceError, DecoderFailure) as error:
        raise RuntimeError(_marked(error)) from None


def _read(plan: ReadPlan, tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    records = _Records(plan)
    for task_batch in tasks:
        for task in task_batch.to_pylist():
            offset_range = OffsetRange(task["topic"], task["partition"], task["start"], task["end"])
            for msg in read_range(plan.kafka_conf, offset_range):
                kind, ts = msg.timestamp()
                yield from records.add(
                    msg.value(),
                    msg.key(),
                    msg.topic(),  # type: ignore[arg-type]  # set on a consumed message
                    msg.partition(),  # type: ignore[arg-type]  # set on a consumed message
                    msg.offset(),  # type: ignore[arg-type]  # set on a consumed message
                    ts if kind else None,
                    _TIMESTAMP_TYPES.get(kind),
                    msg.headers(),
                )
    yield from records.flush()


def _redecode(plan: ReadPlan, rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    records = _Records(plan)
    for batch in rows:
        for row in batch.to_pylist():
            headers = [(h["key"], h["value"]) for h in row["kafka_headers"]] if row["kafka_headers"] else None
            yield from records.add(
                row["value"],
                row["kafka_key"],
                row["kafka_topic"],
                row["kafka_partition"],
                row["kafka_offset"],
                row["kafka_timestamp_ms"],
                row["kafka_timestamp_type"],
                headers,
            )
    yield from records.flush()


class _Records:
    """Decodes and converts records one by one into Arrow batches of the batch schema (failed rows included)."""

    def __init__(self, plan: ReadPlan):
        from pyspark.sql import types as T

        from icefloe.materialize.conversion import BatchBuilder, ValueConverter

        batch = T.StructType.fromJson(json.loads(plan.batch_schema_json))
        values = T.StructType([batch[name] for name in plan.value_fields])
        self.plan = plan
        self.convert = ValueConverter(values, strict=plan.strict, required=plan.required)
        # An envelope (change data) reads the key and headers too; its rows carry the change columns.
        self.change = build_change_decoder(plan.decoder)
        self.decode = build_decoder(plan.decoder) if self.change is None else None
        self.decode_key = _key_decoder(plan, values) if plan.decoder.key_fields else None
        self.builder = BatchBuilder(batch, list(plan.value_fields))
        self.bytes = 0  # raw bytes of the records in the builder

    def add(
        self,
        payload: bytes | None,
        key: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int | None,
        timestamp_type: str | None,
        headers,
    ) -> Iterator[pa.RecordBatch]:
        value, failure = None, None
        try:
            _check_timestamp(timestamp_ms)
            if self.change is not None:
                value = _change(self.plan, self.change, self.convert, payload, key, headers)
            else:
                value = _value(self.plan, self.decode, self.decode_key, self.convert, payload, key)
        except _Bad as bad:
            failure = (bad.kind, bad.message, payload, schema_id(payload) if self.plan.framed else None)
            if bad.kind == INVALID_TIMESTAMP:  # the row's timestamp column cannot hold it
                timestamp_ms = None
        except SourceError:  # the environment's (a registry unreachable): the task fails, the run retries
            raise
        except Exception as error:  # not declared by the decoder: a bug, never a bad record
            raise _bug(error, topic, partition, offset) from None
        self.builder.add(
            value,
            topic,
            partition,
            offset,
            timestamp_ms,
            timestamp_type,
            key,
            headers,
            tombstone=payload is None and failure is None,
            error=failure,
            payload=payload,
        )
        self.bytes += len(payload or b"") + len(key or b"")
        if len(self.builder) >= self.plan.batch_rows or self.bytes >= self.plan.batch_bytes:
            yield from self.flush()

    def flush(self) -> Iterator[pa.RecordBatch]:
        if len(self.builder):
            self.bytes = 0
            yield _build(self.builder)


def _bug(error: Exception, topic: str, partition: int, offset: int) -> DecoderFailure:
    """A decoder's undeclared exception, named by the record's position, its type and the line that raised it;
    never by its text, which may quote the value."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return DecoderFailure(
        f"{topic} partition {partition} offset {offset}: the decoder failed with {type(error).__name__}{where}; a "
        "bug, not a bad record: nothing was committed"
    )


class _Bad(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def _check_timestamp(timestamp_ms: int | None) -> None:
    """A Kafka timestamp the table's timestamp column cannot hold makes a bad record (a producer that set
    nanoseconds or microseconds where Kafka wants milliseconds)."""
    if timestamp_ms is not None and not KAFKA_TIMESTAMP_MS[0] <= timestamp_ms <= KAFKA_TIMESTAMP_MS[1]:
        raise _Bad(
            INVALID_TIMESTAMP, f"Kafka timestamp {timestamp_ms} ms is outside years 1 to 9999 (not milliseconds?)"
        )


def _value(plan: ReadPlan, decode, decode_key, convert, payload: bytes | None, key: bytes | None) -> dict | None:
    key_fields = plan.decoder.key_fields
    if (plan.needs_key or (key_fields and payload is None)) and not key:
        raise _Bad(
            "InvalidKey", "upsert needs a non-empty record key, got " + ("none" if key is None else "an empty one")
        )
    if payload is None:
        if not key_fields:
            return None  # a tombstone
        try:  # a tombstone of a table keyed by value fields: its Kafka key names the row
            value = decode_key(key)
        except BadRecord as error:
            raise _Bad("InvalidKey", f"tombstone key: {error}") from None
    else:
        if len(payload) > plan.max_record_bytes:
            raise _Bad(
                "RecordTooLarge", f"value of {len(payload)} bytes exceeds maxRecordBytes {plan.max_record_bytes}"
            )
        try:
            decoded = decode(payload)
        except BadRecord as error:
            raise _Bad(error.kind, str(error)) from None
        try:
            value = convert(decoded)
        except ValueError as error:
            raise _Bad("ConversionError", str(error)) from None
    missing = [name for name in key_fields if value.get(name) is None]
    if missing:
        raise _Bad("InvalidKey", f"key field(s) {missing} are null")
    return value


def _change(plan: ReadPlan, change, convert, payload: bytes | None, key: bytes | None, headers) -> dict:
    """A change event's row (an envelope's): its value, key and headers decoded together."""
    if payload is not None and len(payload) > plan.max_record_bytes:
        raise _Bad("RecordTooLarge", f"value of {len(payload)} bytes exceeds maxRecordBytes {plan.max_record_bytes}")
    try:
        decoded = change(payload, key, headers)
    except InvalidChange as error:
        raise _Bad("InvalidChange", str(error)) from None
    except ValueError as error:
        raise _Bad("DecodeError", str(error)) from None
    try:
        return convert(decoded)
    except ValueError as error:
        raise _Bad("ConversionError", str(error)) from None


def _key_decoder(plan: ReadPlan, values) -> Callable[[bytes], dict]:
    """A tombstone's Kafka key as the values of the key fields, of their table types. Only the key fields are
    converted: the tombstone has no other field, so `optional: false` fields cannot refuse it. A string key is
    text for any type of its field (a long key field keyed by "42")."""
    from pyspark.sql import types as T

    from icefloe.materialize.conversion import ValueConverter, from_text

    key_fields = plan.decoder.key_fields
    struct = T.StructType([values[name] for name in key_fields])
    decode = build_key_decoder(plan.decoder)
    text = plan.decoder.key_format == "string"
    parse = from_text(struct[0].dataType, key_fields[0]) if text else None
    convert = ValueConverter(struct, strict=plan.strict or text)

    def decode_key(key: bytes) -> dict:
        fields = decode(key)
        decoded = {name: fields.get(name) for name in key_fields}
        try:  # the key's conversion refuses it as the value's would: a bad key
            if parse is not None:
                decoded = {name: parse(item) for name, item in decoded.items()}
            return convert(decoded)
        except BadRecord:
            raise
        except ValueError as error:
            raise BadRecord(str(error)) from None

    return decode_key


def _build(builder) -> pa.RecordBatch:
    """Build the Arrow batch; a value Arrow refuses (rare: checks run first) becomes a bad record itself."""
    from icefloe.materialize.conversion import ARROW_REFUSALS

    try:
        return builder.build()
    except ARROW_REFUSALS:
        pass
    for index in range(len(builder)):
        reason = builder.row_error(index)
        if reason is None:
            continue
        builder.fail_row(index, "ConversionError", reason, schema_id(builder.payloads[index]))
    return builder.build()


def _marked(error: SourceError | DecoderFailure) -> str:
    """The failure as text the driver finds in Spark's (`unmark`), with its kind: an authentication failure is not
    retried, a decoder's bug is not a bad record."""
    kind = (
        "auth" if isinstance(error, SourceAuthError) else "decoder" if isinstance(error, DecoderFailure) else "source"
    )
    return f"{_MARKER}{json.dumps([kind, str(error)])}{_MARKER}"


def unmark(text: str) -> SourceError | DecoderFailure | None:
    """The environment failure or decoder bug a Python task carried in a Spark failure's text, if any (PySpark gives
    the driver a Python task's exception only as text: the marker is that text's one structured part)."""
    match = _MARKED.search(text)
    if match is None:
        return None
    kind, message = json.loads(match.group(1))
    if kind == "decoder":
        return DecoderFailure(message)
    return SourceAuthError(message) if kind == "auth" else SourceError(message)
