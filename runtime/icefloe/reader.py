"""The executor side of a batch: read planned offset ranges, decode, convert, emit Arrow record batches.

Runs inside Spark's `mapInArrow`. Everything it needs travels in a picklable `ReadPlan`. A bad record stops the
task with a marked error that the driver turns back into a `RecordError` naming partition, offset and cause.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from .decoding import DecoderSpec, build_decoder
from .errors import RecordError, SourceError
from .kafka_source import OffsetRange, read_range

_TIMESTAMP_TYPES = {0: None, 1: "CreateTime", 2: "LogAppendTime"}
_MARKER = "ICEFLOE-ERROR"
_MARKED = re.compile(_MARKER + r"(\{.*?\})" + _MARKER)


@dataclass(frozen=True)
class ReadPlan:
    kafka_conf: dict[str, str]
    decoder: DecoderSpec
    table_schema_json: str  # the Spark StructType of the table, as JSON
    value_fields: tuple[str, ...]
    strict: bool  # JSON values are checked field by field; Avro values are typed by the decoder
    batch_rows: int = 20_000

    def __repr__(self) -> str:  # the Kafka config may hold credentials
        return f"ReadPlan(decoder={self.decoder!r}, fields={len(self.value_fields)})"


def read_batches(plan: ReadPlan, tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function: input rows are (topic, partition, start, end) tasks."""
    from pyspark.sql import types as T

    from .conversion import BatchBuilder, ValueConverter

    table = T.StructType.fromJson(json.loads(plan.table_schema_json))
    values = T.StructType([table[name] for name in plan.value_fields])
    convert = ValueConverter(values, strict=plan.strict)
    decode = build_decoder(plan.decoder)
    builder = BatchBuilder(table, list(plan.value_fields))
    try:
        for task_batch in tasks:
            for task in task_batch.to_pylist():
                offset_range = OffsetRange(task["topic"], task["partition"], task["start"], task["end"])
                for msg in read_range(plan.kafka_conf, offset_range):
                    payload = msg.value()
                    value = None
                    if payload is not None:  # a tombstone keeps its row of metadata in append mode
                        try:
                            value = convert(decode(payload))
                        except ValueError as error:
                            raise RecordError(msg.partition(), msg.offset(), str(error)) from None
                    kind, ts = msg.timestamp()
                    builder.add(
                        value, msg.topic(), msg.partition(), msg.offset(), ts if kind else None,
                        _TIMESTAMP_TYPES.get(kind), msg.key(), msg.headers(),
                    )  # fmt: skip
                    if len(builder) >= plan.batch_rows:
                        yield _build(builder)
        if len(builder):
            yield _build(builder)
    except RecordError as error:
        raise RuntimeError(_mark("record", error.partition, error.offset, error.cause, error.kind)) from None
    except SourceError as error:
        raise RuntimeError(_mark("source", None, None, str(error), "SourceError")) from None


def _build(builder) -> pa.RecordBatch:
    try:
        return builder.build()
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        # Find the record Arrow refused, so the error names it.
        for value, partition, offset in zip(builder.values, builder.partitions, builder.offsets):
            try:
                builder.check_row(value)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as row_error:
                raise RecordError(partition, offset, str(row_error)) from None
        raise RecordError(builder.partitions[0], builder.offsets[0], str(error)) from None


def _mark(kind: str, partition: int | None, offset: int | None, cause: str, error_class: str) -> str:
    detail = {"kind": kind, "partition": partition, "offset": offset, "cause": cause, "class": error_class}
    return f"{_MARKER}{json.dumps(detail)}{_MARKER}"


def unmark(text: str) -> Exception | None:
    """The icefloe error carried in a Spark failure's text, if any."""
    match = _MARKED.search(text)
    if not match:
        return None
    detail = json.loads(match.group(1))
    if detail["kind"] == "record":
        return RecordError(detail["partition"], detail["offset"], detail["cause"], detail["class"])
    return SourceError(detail["cause"])
