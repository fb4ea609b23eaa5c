"""Conversion: decoded record values plus Kafka metadata to Arrow record batches of the table's exact types.

Decoders hand over Python values (dicts from fastavro or `json`). A converter compiled per table checks them
against the table's Spark types and normalises what Arrow cannot take as is (uuid objects, times, ISO strings and
base64 in JSON). A value that does not fit raises `ValueError` naming the field; the caller turns it into a
per-record error, so one bad record never hides inside a failed batch.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from icefloe.batch_columns import KAFKA_COLUMNS, STATUS_COLUMNS

Convert = Callable[[Any], Any]
# Types a decoder (fastavro) already hands over exactly as Arrow takes them; Arrow itself rejects what overflows.
_AVRO_NATIVE = (
    T.BooleanType,
    T.IntegerType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
    T.TimestampType,
    T.TimestampNTZType,
    T.DateType,
    T.BinaryType,
)
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class ValueConverter:
    """Compiles a converter for a Spark struct; `strict` is for JSON, where types must be checked by hand."""

    def __init__(self, struct: T.StructType, strict: bool, required: frozenset[str] = frozenset()):
        self.strict = strict
        self.required = required  # dotted paths of fields declared `optional: false`
        self.convert = self._struct(struct, "", top=True)

    def __call__(self, record: Any) -> Any:
        return self.convert(record)  # type: ignore[misc]  # the top-level struct always compiles to a converter

    def _compile(self, dtype: T.DataType, path: str) -> Convert | None:
        """A converter for one type, or None where values pass through unchanged (decoder output, not JSON)."""
        if isinstance(dtype, T.StructType):
            return self._struct(dtype, path)
        if isinstance(dtype, T.ArrayType):
            element = self._compile(dtype.elementType, f"{path}[]")
            if element is None:
                return None

            def array(value: Any) -> Any:
                if not isinstance(value, list):
                    raise ValueError(f"{path}: expected a list, got {type(value).__name__}")
                return [None if v is None else element(v) for v in value]

            return array
        if isinstance(dtype, T.MapType):
            key = self._compile(dtype.keyType, f"{path}.key")
            item = self._compile(dtype.valueType, f"{path}{{}}")
            if key is None and item is None:
                return None
            key, item = key or _same, item or _same

            def mapping(value: Any) -> Any:
                if not isinstance(value, dict):
                    raise ValueError(f"{path}: expected an object/map, got {type(value).__name__}")
                return [(key(k), None if v is None else item(v)) for k, v in value.items()]

            return mapping
        if not self.strict and isinstance(dtype, _AVRO_NATIVE):
            return None
        return _primitive(dtype, path, self.strict)

    def _struct(self, struct: T.StructType, path: str, top: bool = False) -> Convert | None:
        paths = [f"{path}.{f.name}".lstrip(".") for f in struct.fields]
        fields = [
            (f.name, self._compile(f.dataType, p) or _same, p in self.required) for f, p in zip(struct.fields, paths)
        ]
        where = path or "value"
        if not self.strict:
            converted = [(name, convert) for name, convert, _ in fields if convert is not _same]
            if not converted and not top:
                return None

            def lenient(value: Any) -> Any:
                if not isinstance(value, dict):
                    raise ValueError(f"{where}: expected a record, got {type(value).__name__}")
                if not converted:
                    return value
                out = dict(value)
                for name, convert in converted:
                    item = out.get(name)
                    if item is not None:
                        out[name] = convert(item)
                return out

            return lenient

        def record(value: Any) -> Any:
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected an object/record, got {type(value).__name__}")
            # Fields outside the declared schema are ignored, as a schema-on-read table would.
            out = {}
            for name, convert, required in fields:
                item = value.get(name)
                if item is None and required:
                    raise ValueError(f"{where}.{name}: required field is missing or null".removeprefix("value."))
                out[name] = None if item is None else convert(item)
            return out

        return record


def _same(value: Any) -> Any:
    return value


def _check_int(bounds: tuple[int, int], path: str, strict: bool) -> Convert:
    low, high = bounds

    def integer(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, dt.time):  # Avro time-millis/micros, stored as microseconds
                return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
            if strict and isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ValueError(f"{path}: expected an integer, got {type(value).__name__}")
        if not low <= value <= high:
            raise ValueError(f"{path}: out of range for a {(high + 1).bit_length()}-bit integer")
        return value

    return integer


def _check_float(path: str, single: bool) -> Convert:
    def floating(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: expected a number, got {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:  # a JSON integer past a double's range
            raise ValueError(f"{path}: out of range for a double") from None
        if single and math.isfinite(value) and abs(value) > 3.4028234663852886e38:
            raise ValueError(f"{path}: out of range for a float")
        return value

    return floating


def _check_string(path: str, strict: bool) -> Convert:
    def string(value: Any) -> str:
        if type(value) is str:
            return value
        if isinstance(value, uuid.UUID):  # Avro uuid logical type
            return str(value)
        if strict:
            raise ValueError(f"{path}: expected a string, got {type(value).__name__}")
        return str(value)

    return string


def _check_decimal(dtype: T.DecimalType, path: str) -> Convert:
    quantum = Decimal(1).scaleb(-dtype.scale)
    limit = Decimal(10) ** (dtype.precision - dtype.scale)

    def decimal(value: Any) -> Decimal:
        if isinstance(value, bool):
            raise ValueError(f"{path}: expected a decimal, got bool")
        try:
            number = value if isinstance(value, Decimal) else Decimal(str(value))
            scaled = number.quantize(quantum)
        except (InvalidOperation, ValueError):
            raise ValueError(f"{path}: not a decimal({dtype.precision},{dtype.scale})") from None
        if not scaled.is_finite() or abs(scaled) >= limit or scaled != number:
            raise ValueError(f"{path}: does not fit decimal({dtype.precision},{dtype.scale})")
        return scaled

    return decimal


def _check_timestamp(path: str, with_zone: bool) -> Convert:
    def timestamp(value: Any) -> dt.datetime:
        if isinstance(value, dt.datetime):
            moment = value
        elif isinstance(value, str):
            try:
                moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"{path}: not an ISO-8601 timestamp") from None
        elif isinstance(value, int) and not isinstance(value, bool):
            try:  # JSON epoch milliseconds
                moment = _EPOCH + dt.timedelta(milliseconds=value)
            except OverflowError:
                raise ValueError(f"{path}: epoch milliseconds out of the timestamp range") from None
        else:
            raise ValueError(f"{path}: expected a timestamp, got {type(value).__name__}")
        if moment.tzinfo:  # its instant, which an offset may put before year 1 or after 9999
            try:
                moment = moment.astimezone(dt.UTC)
            except OverflowError:
                raise ValueError(f"{path}: out of the timestamp range") from None
        if with_zone:
            moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
        else:
            moment = moment.replace(tzinfo=None)
        return moment  # years 1-9999: Python's datetime holds no other

    return timestamp


def _check_date(path: str) -> Convert:
    def date(value: Any) -> dt.date:
        if isinstance(value, dt.datetime):
            raise ValueError(f"{path}: expected a date, got a timestamp")
        if isinstance(value, dt.date):
            return value
        if isinstance(value, str):
            try:
                return dt.date.fromisoformat(value)
            except ValueError:
                raise ValueError(f"{path}: not an ISO-8601 date") from None
        raise ValueError(f"{path}: expected a date, got {type(value).__name__}")

    return date


def _check_binary(path: str, strict: bool) -> Convert:
    def binary(value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        if strict and isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except ValueError:
                raise ValueError(f"{path}: expected base64 bytes") from None
        raise ValueError(f"{path}: expected bytes, got {type(value).__name__}")

    return binary


def _check_boolean(path: str) -> Convert:
    def boolean(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path}: expected a boolean, got {type(value).__name__}")
        return value

    return boolean


def _primitive(dtype: T.DataType, path: str, strict: bool) -> Convert:
    if isinstance(dtype, T.BooleanType):
        return _check_boolean(path)
    if isinstance(dtype, T.IntegerType):
        return _check_int(_INT32, path, strict)
    if isinstance(dtype, T.LongType):
        return _check_int(_INT64, path, strict)
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        return _check_float(path, isinstance(dtype, T.FloatType))
    if isinstance(dtype, T.StringType):
        return _check_string(path, strict)
    if isinstance(dtype, T.DecimalType):
        return _check_decimal(dtype, path)
    if isinstance(dtype, T.TimestampType):
        return _check_timestamp(path, with_zone=True)
    if isinstance(dtype, T.TimestampNTZType):
        return _check_timestamp(path, with_zone=False)
    if isinstance(dtype, T.DateType):
        return _check_date(path)
    if isinstance(dtype, T.BinaryType):
        return _check_binary(path, strict)
    raise TypeError(f"{path}: no converter for {dtype.simpleString()}")


def from_text(dtype: T.DataType, path: str) -> Convert:
    """Parses text (a string Kafka key) into a value of `dtype` for its check; strings, decimals, dates and
    timestamps take text as they are."""
    parse: Callable[[str], Any]
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        kind, parse = "an integer", int
    elif isinstance(dtype, (T.FloatType, T.DoubleType)):
        kind, parse = "a number", float
    elif isinstance(dtype, T.BooleanType):
        kind, parse = "true or false", {"true": True, "false": False}.__getitem__
    else:
        return _same

    def parsed(text: str) -> Any:
        try:
            return parse(text.strip())
        except (ValueError, KeyError):
            raise ValueError(f"{path}: the text is not {kind}") from None  # the text itself is payload: not quoted

    return parsed


def arrow_schema(table: T.StructType) -> pa.Schema:
    """The Arrow schema Spark expects from `mapInArrow` for this table (Spark's own mapping, no drift)."""
    return to_arrow_schema(table)


class BatchBuilder:
    """Accumulates converted rows, their Kafka metadata and status, then emits one Arrow record batch."""

    def __init__(self, batch: T.StructType, value_fields: list[str]):
        self.schema = arrow_schema(batch)
        self.value_type = pa.struct([self.schema.field(name) for name in value_fields])
        self.clear()

    def clear(self) -> None:
        self.values: list[Any] = []
        self.payloads: list[bytes | None] = []  # kept (by reference) so a row refused later keeps its raw bytes
        self.rows: list[tuple] = []  # metadata and status per record, in _ROW_COLUMNS order (tuples: the hot path)

    def __len__(self) -> int:
        return len(self.values)

    def add(
        self,
        value: dict | None,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int | None,
        timestamp_type: str | None,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        tombstone: bool = False,
        error: RecordFailure | None = None,
        payload: bytes | None = None,
    ) -> None:
        self.values.append(value)
        self.payloads.append(payload)
        row = (
            topic,
            partition,
            offset,
            timestamp_ms,
            timestamp_type,
            key,
            [{"key": k, "value": v} for k, v in headers] if headers else None,
            tombstone,
            *(error if error is not None else (None, None, None, None)),
        )
        self.rows.append(row)

    def build(self) -> pa.RecordBatch:
        values = pa.array(self.values, type=self.value_type).flatten()
        rest = [self._column(name, column) for name, column in zip(_ROW_COLUMNS, zip(*self.rows))]
        batch = pa.RecordBatch.from_arrays([*values, *rest], schema=self.schema)
        self.clear()
        return batch

    def _column(self, name: str, column: tuple) -> pa.Array:
        arrow_type = self.schema.field(name).type
        if pa.types.is_timestamp(arrow_type):  # Kafka timestamps arrive as epoch milliseconds
            return pa.array(column, type=pa.int64()).cast(pa.timestamp("ms")).cast(arrow_type)
        return pa.array(column, type=arrow_type)

    def fail_row(self, index: int, kind: str, message: str, schema_id: int | None) -> None:
        """Turn row `index` into a failed record: no value, its raw bytes and the error."""
        self.values[index] = None
        status = (False, kind, message, self.payloads[index], schema_id)  # in STATUS_COLUMNS order
        self.rows[index] = self.rows[index][: -len(status)] + status

    def row_error(self, index: int) -> str | None:
        """Why Arrow refuses row `index` (None if it does not), to pinpoint a bad record in a failed batch: the
        field and the Arrow type, never Arrow's own message (it quotes the value)."""
        value = self.values[index]
        try:
            pa.array([value], type=self.value_type)
        except ARROW_REFUSALS as error:
            for field in self.value_type:
                try:
                    pa.array([value.get(field.name)], type=field.type)
                except ARROW_REFUSALS:
                    return f"{field.name}: Arrow cannot store the value as {field.type} ({type(error).__name__})"
            return f"Arrow cannot store the value ({type(error).__name__})"
        return None


# UnicodeEncodeError: a string UTF-8 cannot hold (a lone surrogate, which a JSON escape can spell)
ARROW_REFUSALS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeEncodeError)
# (error class, message, raw value bytes, schema id)
RecordFailure = tuple[str, str, "bytes | None", "int | None"]
_ROW_COLUMNS = (*KAFKA_COLUMNS, *STATUS_COLUMNS)
