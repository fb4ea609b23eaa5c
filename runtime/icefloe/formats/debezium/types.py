"""Kafka Connect schemas and Debezium's semantic types, to table (Spark/Iceberg) types and values.

Both encodings of a Connect schema are normalized to one form (`Connect`): Avro as the converters write it (the
semantic type in `connect.name`, its parameters in `connect.parameters`; decimals also as Avro's `decimal`) and the
JsonConverter's `{"type", "name", "parameters", "fields", "items", ...}`. Mapping (README "Change data"):

  io.debezium.time.Date, connect Date                     -> date
  io.debezium.time.Time / MicroTime / NanoTime, connect Time -> long: microseconds of the day (nanoseconds truncated)
  io.debezium.time.Timestamp / MicroTimestamp / NanoTimestamp, connect Timestamp -> timestamp without zone
                                                              (PostgreSQL `timestamp`; nanoseconds truncated)
  io.debezium.time.ZonedTimestamp                          -> timestamp with zone (timestamptz)
  io.debezium.time.IsoDate / IsoTime / IsoTimestamp (time.precision.mode=isostring: ISO-8601 text at UTC)
                                                           -> date / long (as Time) / timestamp without zone
  io.debezium.time.ZonedTime, Interval, data.Json, Uuid, Enum, EnumSet, Xml, Ltree -> string (as Debezium gives it)
  connect Decimal (decimal.handling.mode=precise)          -> decimal(p, s) (p from the source; 38 when not given)
  io.debezium.data.VariableScaleDecimal (numeric without typmod) -> decimal(38, 18); a value it cannot hold exactly
                                                              is a bad record (use decimal.handling.mode=string)
  decimal.handling.mode=double / string                    -> double / string (plain Connect types)
  io.debezium.data.geometry.Geometry / Geography / Point   -> binary: the WKB
  int8, int16, int32 / int64 / float32 / float64 / boolean / string / bytes -> int / long / float / double /
                                                              boolean / string / binary
  struct, array, map                                       -> struct, list, map
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pyspark.sql import types as T

from icefloe.errors import ConfigError
from icefloe.formats.avro import names

Convert = Callable[[Any], Any]
# A Connect schema, normalized: {"type", "name", "params", "fields": [[name, Connect]], "items", "values"}
Connect = dict[str, Any]
MAX_PRECISION = 38
VARIABLE_SCALE = T.DecimalType(38, 18)
_EPOCH_DAY = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)

DATE = {"io.debezium.time.Date", "org.apache.kafka.connect.data.Date"}
TIME = {  # name -> divisor to microseconds (negative: multiplier)
    "io.debezium.time.Time": -1000,
    "org.apache.kafka.connect.data.Time": -1000,
    "io.debezium.time.MicroTime": 1,
    "io.debezium.time.NanoTime": 1000,
}
TIMESTAMP = {
    "io.debezium.time.Timestamp": -1000,
    "org.apache.kafka.connect.data.Timestamp": -1000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": 1000,
}
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
# time.precision.mode=isostring: Java's ISO_OFFSET_* formats of the database's values at UTC ("2017-09-15Z",
# "04:05:11.789Z", "2019-07-09T02:28:57.1Z"): the date and the clock are the database's, "Z" is no conversion
ISO_DATE = "io.debezium.time.IsoDate"
ISO_TIME = "io.debezium.time.IsoTime"
ISO_TIMESTAMP = "io.debezium.time.IsoTimestamp"
_ISO_DAY = r"(?P<year>[+-]?\d{4,})-(?P<month>\d\d)-(?P<day>\d\d)"
_ISO_CLOCK = r"(?P<hour>\d\d):(?P<minute>\d\d)(?::(?P<second>\d\d)(?:\.(?P<fraction>\d{1,9}))?)?"
_UTC = r"(?:Z|[+-]00:00)?"  # Debezium formats at UTC; another offset would leave the clock to a guess
_ISO_DATE_TEXT = re.compile(_ISO_DAY + _UTC, re.ASCII)
_ISO_TIME_TEXT = re.compile(_ISO_CLOCK + _UTC, re.ASCII)
_ISO_TIMESTAMP_TEXT = re.compile(_ISO_DAY + "T" + _ISO_CLOCK + _UTC, re.ASCII)
_DAY_MICROS = 86_400_000_000
DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
GEOMETRY = {
    "io.debezium.data.geometry.Geometry",
    "io.debezium.data.geometry.Geography",
    "io.debezium.data.geometry.Point",
}
_PRIMITIVE = {
    "int8": T.IntegerType(),
    "int16": T.IntegerType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "float32": T.FloatType(),
    "float64": T.DoubleType(),
    "boolean": T.BooleanType(),
    "string": T.StringType(),
    "bytes": T.BinaryType(),
}
_AVRO = {"int": "int32", "long": "int64", "float": "float32", "double": "float64", "boolean": "boolean",
         "string": "string", "bytes": "bytes"}  # fmt: skip
_JSON = {"float": "float32", "double": "float64"}


def from_avro(schema: Any, named: dict[str, Any], namespace: str = "") -> Connect:
    """An Avro schema (as the Connect converters write it) normalized; `named`: named types seen so far or resolved
    from registry references, by full and short name."""
    if isinstance(schema, list):
        members = [m for m in schema if m != "null"]
        if len(members) != 1:
            raise ConfigError(f"a union of {len(members)} types is not a Connect schema")
        return from_avro(members[0], named, namespace)
    if isinstance(schema, str):
        if schema in _AVRO:
            return {"type": _AVRO[schema]}
        found = names.lookup(named, schema, namespace)
        if found is not None:
            return from_avro(found[1], named, names.namespace_of(found[0]))
        raise ConfigError(f"unknown Avro type {schema!r} (a registry reference that did not resolve?)")
    kind = schema.get("type")
    name, params = schema.get("connect.name"), dict(schema.get("connect.parameters") or {})
    if kind in ("record", "enum", "fixed"):
        full = names.defined_name(schema, namespace)
        named.setdefault(full, schema)
        named.setdefault(schema["name"], schema)
        namespace = names.namespace_of(full)
    if schema.get("logicalType") == "decimal":
        params.setdefault("scale", str(schema.get("scale", 0)))
        params.setdefault("connect.decimal.precision", str(schema.get("precision", "")))
        return {"type": "bytes", "name": DECIMAL, "params": params}
    if kind == "record":
        fields = [[f["name"], from_avro(f["type"], named, namespace)] for f in schema["fields"]]
        return {"type": "struct", "name": name, "fields": fields}
    if kind == "array":
        return {"type": "array", "name": name, "items": from_avro(schema["items"], named, namespace)}
    if kind == "map":
        return {"type": "map", "name": name, "values": from_avro(schema["values"], named, namespace)}
    if kind == "enum":
        return {"type": "string", "name": name}
    if kind == "fixed":
        return {"type": "bytes", "name": name}
    if isinstance(kind, (dict, list)):
        return from_avro(kind, named, namespace)
    base = from_avro(kind, named, namespace)
    return {**base, "name": name or base.get("name"), "params": params or base.get("params")}


def from_json(schema: dict[str, Any]) -> Connect:
    """A JsonConverter schema (`{"schema": ..., "payload": ...}`'s schema) normalized."""
    kind = schema.get("type")
    kind = _JSON.get(kind, kind) if isinstance(kind, str) else kind
    out: Connect = {"type": kind, "name": schema.get("name"), "params": schema.get("parameters")}
    if kind == "struct":
        out["fields"] = [[f["field"], from_json(f)] for f in schema.get("fields", [])]
    elif kind == "array":
        out["items"] = from_json(schema["items"])
    elif kind == "map":
        out["values"] = from_json(schema["values"])
    return out


def spark_type(connect: Connect, path: str) -> T.DataType:
    name, kind = connect.get("name"), connect["type"]
    if name in DATE or name == ISO_DATE:
        return T.DateType()
    if name in TIME or name == ISO_TIME:
        return T.LongType()
    if name in TIMESTAMP or name == ISO_TIMESTAMP:
        return T.TimestampNTZType()
    if name == ZONED_TIMESTAMP:
        return T.TimestampType()
    if name == DECIMAL:
        params = connect.get("params") or {}
        precision = int(params.get("connect.decimal.precision") or MAX_PRECISION)
        scale = int(params.get("scale") or 0)
        if precision > MAX_PRECISION:
            raise ConfigError(
                f"{path}: decimal precision {precision} is too wide: Iceberg decimals have at most {MAX_PRECISION} "
                "digits (decimal.handling.mode=string keeps them as text)"
            )
        return T.DecimalType(precision, scale)
    if name == VARIABLE_DECIMAL:
        return VARIABLE_SCALE
    if name in GEOMETRY:
        return T.BinaryType()
    if kind == "struct":
        return T.StructType([T.StructField(n, spark_type(c, f"{path}.{n}"), True) for n, c in connect["fields"]])
    if kind == "array":
        return T.ArrayType(spark_type(connect["items"], f"{path}[]"), True)
    if kind == "map":
        return T.MapType(T.StringType(), spark_type(connect["values"], f"{path}{{}}"), True)
    if kind in _PRIMITIVE:
        return _PRIMITIVE[kind]
    raise ConfigError(f"{path}: Connect type {kind!r} has no table type")


def fields(connect: Connect, path: str) -> list[T.StructField]:
    """The columns of a Connect struct (the `after` image): one per field, of its mapped type."""
    return list(spark_type(connect, path).fields)  # type: ignore[attr-defined]  # a struct maps to a StructType


def converter(connect: Connect) -> Convert | None:
    """Raw decoded values (Avro's or JSON's) of a Connect schema to the Python values of its table type, before the
    table's value converter checks them; None where values pass as they are."""
    name, kind = connect.get("name"), connect["type"]
    if name in DATE:
        return _date
    if name in TIME:
        return _scaled(TIME[name], _time)
    if name in TIMESTAMP:
        return _scaled(TIMESTAMP[name], _timestamp)
    if name == ISO_DATE:
        return _iso_date
    if name == ISO_TIME:
        return _iso_time
    if name == ISO_TIMESTAMP:
        return _iso_timestamp
    if name == DECIMAL:
        return _decimal(int((connect.get("params") or {}).get("scale") or 0))
    if name == VARIABLE_DECIMAL:
        return _variable_decimal
    if name in GEOMETRY:
        return _wkb
    if kind == "struct":
        inner = [(n, converter(c)) for n, c in connect["fields"]]
        converted = [(n, c) for n, c in inner if c is not None]
        if not converted:
            return None

        def struct(value: Any) -> Any:
            if not isinstance(value, dict):
                return value  # the value converter names the mismatch
            out = dict(value)
            for field, convert in converted:
                if out.get(field) is not None:
                    out[field] = convert(out[field])
            return out

        return struct
    if kind == "array":
        item = converter(connect["items"])
        if item is None:
            return None
        return lambda value: [None if v is None else item(v) for v in value] if isinstance(value, list) else value
    if kind == "map":
        inner_value = converter(connect["values"])
        if inner_value is None:
            return None
        return lambda value: (
            {k: None if v is None else inner_value(v) for k, v in value.items()} if isinstance(value, dict) else value
        )
    return None


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected {what} as an integer, got {type(value).__name__}")
    return value


def _date(value: Any) -> Any:
    if isinstance(value, dt.date):
        return value
    try:
        return _EPOCH_DAY + dt.timedelta(days=_integer(value, "days since 1970"))
    except OverflowError:
        raise ValueError("days since 1970 out of the date range") from None


def _scaled(unit: int, make: Callable[[int], Any]) -> Convert:
    """`unit`: the divisor that gives microseconds (negative: the multiplier); values already typed pass."""

    def scaled(value: Any) -> Any:
        if isinstance(value, (dt.datetime, dt.time)):
            return value
        number = _integer(value, "a time count")
        return make(number * -unit if unit < 0 else number // unit)  # floor: truncated, also before 1970

    return scaled


def _time(micros: int) -> int:
    return micros


def _timestamp(micros: int) -> Any:
    try:
        return _EPOCH + dt.timedelta(microseconds=micros)
    except OverflowError:
        raise ValueError("timestamp out of range") from None


def _iso(value: Any, pattern: re.Pattern[str], what: str) -> re.Match[str]:
    if not isinstance(value, str):
        raise ValueError(f"expected {what} as ISO-8601 text, got {type(value).__name__}")
    match = pattern.fullmatch(value)
    if match is None:
        raise ValueError(f"expected {what} as ISO-8601 text at UTC ('Z')")
    return match


def _micros(fraction: str | None) -> int:
    return int((fraction or "")[:6].ljust(6, "0"))  # nanoseconds truncated


def _iso_date(value: Any) -> dt.date:
    day = _iso(value, _ISO_DATE_TEXT, "a date")
    try:
        return dt.date(int(day["year"]), int(day["month"]), int(day["day"]))
    except ValueError:  # PostgreSQL's infinity: a year far past 9999 (streamed: before 1); BC: a year before 1
        raise ValueError("not a date of the years 1-9999") from None


def _iso_time(value: Any) -> int:
    clock = _iso(value, _ISO_TIME_TEXT, "a time of day")
    hour, minute, second = int(clock["hour"]), int(clock["minute"]), int(clock["second"] or 0)
    micros = ((hour * 60 + minute) * 60 + second) * 1_000_000 + _micros(clock["fraction"])
    if minute > 59 or second > 59 or micros > _DAY_MICROS:  # PostgreSQL's 24:00:00 is the day's last moment
        raise ValueError("not a time of day")
    return micros


def _iso_timestamp(value: Any) -> dt.datetime:
    moment = _iso(value, _ISO_TIMESTAMP_TEXT, "a timestamp")
    try:
        return dt.datetime(
            int(moment["year"]),
            int(moment["month"]),
            int(moment["day"]),
            int(moment["hour"]),
            int(moment["minute"]),
            int(moment["second"] or 0),
            _micros(moment["fraction"]),
        )
    except ValueError:  # PostgreSQL's infinity and -infinity: years beyond 290000 and before -290000
        raise ValueError("not a timestamp of the years 1-9999") from None


def _bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):  # the JsonConverter writes bytes as base64
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise ValueError("expected base64 bytes") from None
    raise ValueError(f"expected bytes, got {type(value).__name__}")


def _decimal(scale: int) -> Convert:
    def decimal(value: Any) -> Any:
        if isinstance(value, Decimal):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # decimal.format=NUMERIC
            return Decimal(str(value))
        return Decimal(int.from_bytes(_bytes(value), "big", signed=True)).scaleb(-scale)

    return decimal


def _variable_decimal(value: Any) -> Any:
    if not isinstance(value, dict) or "value" not in value:
        raise ValueError("expected a VariableScaleDecimal struct {scale, value}")
    return _decimal(_integer(value.get("scale") or 0, "the scale"))(value["value"])


def _wkb(value: Any) -> Any:
    if not isinstance(value, dict) or "wkb" not in value:
        raise ValueError("expected a geometry struct {wkb, srid}")
    return _bytes(value["wkb"])
