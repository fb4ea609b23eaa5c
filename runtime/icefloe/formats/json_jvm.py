"""Inline-schema JSON values decoded in the JVM: `from_json` to the table's columns, and a proof per record that the
Python decoder would give the same row, else the record goes to Python (as Avro's `formats.avro.jvm` does).

The proof is a round trip: a record is *exact* when its bytes equal Spark's own re-encoding of the decoded row
(`to_json`, UTF-8), with null fields written or left out, whitespace between tokens aside. Spark's JSON parser is
lenient where the Python decoder is strict (a number read into a string column as its text, `1.0` into an int,
single quotes, `NaN`, leading zeros, duplicate keys, trailing bytes, invalid UTF-8 replaced), and every one of those
changes the re-encoding's tokens: such a record is not exact and Python gives its value or its exact error. What
survives is JSON with the table's fields in order, null fields all written or all left out, numbers and strings as Jackson
writes them: what Jackson-based producers (Kafka Connect's JsonConverter, Spring's JsonSerializer) write, and
Python's `json.dumps` with `ensure_ascii=False`. A record written otherwise (another key order, some null fields
written and others left out, `\\u00e9` escapes, `1e2`) decodes on Python: correct, at the Python path's speed.

Beyond the round trip:
  - doubles must be finite: Spark reads the strings "NaN" and "Infinity" into a double and writes them back quoted;
  - timestamps and dates are read as text and converted here, only in the shapes both decoders read alike:
    `yyyy-MM-ddTHH:mm:ss[.SSS|.SSSSSS]` then `Z` or `+00:00` for `timestamptz` and nothing for `timestamp`, and
    `yyyy-MM-dd` for `date` (years 0001-9999; a date Spark cannot build, such as February 30, is not exact);
  - where a value may be null or missing is the decoder's (`Presence`, checked where the enclosing struct is not
    null): an inline field declared `optional: false` is neither; a JSON Schema property is null only if its type
    allows null, and missing only if it is not `required`. The round trip tells which the record did: a record
    equal to the re-encoding with every null written wrote its nulls, one equal to the re-encoding without them
    left them out;
  - a string with `enum` members must be one of them, one with a `pattern` (JSON Schema's `format: uuid`) match it.
A codec may read a framed payload (`frame`: JSON Schema's magic byte and schema id): other records go to Python.
Types the JVM path leaves to Python (the table stays on the Python path, `codec_for`): float (Python rounds a
decimal text to a double, then to a float; Java rounds once), decimal (Python's JSON parser reads a float first),
binary (base64 text) and map (duplicate keys).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

_READ = {"mode": "PERMISSIVE", "allowNonNumericNumbers": "false"}
_NULLS_WRITTEN, _NULLS_LEFT_OUT = {"ignoreNullFields": "false"}, {"ignoreNullFields": "true"}
_LEAVES = (T.StringType, T.IntegerType, T.LongType, T.DoubleType, T.BooleanType)
_TEMPORAL = (T.TimestampType, T.TimestampNTZType, T.DateType)
_DAY = "(?!0000)[0-9]{4}-[0-9]{2}-[0-9]{2}"
_TIME = "T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\\\.[0-9]{3}|\\\\.[0-9]{6})?"
# The end of the text is the regex `\z` (escaped for SQL): Java's `$` also matches before a final line break, which
# Spark's cast then trims, where Python refuses "2026-01-01\n".
_END = "\\\\z"
_SHAPES = {  # the text a temporal value must have (SQL regular expressions) and the cast that reads it
    "timestamp": (f"^{_DAY}{_TIME}(Z|\\\\+00:00){_END}", "TIMESTAMP"),
    "timestamp_ntz": (f"^{_DAY}{_TIME}{_END}", "TIMESTAMP_NTZ"),
    "date": (f"^{_DAY}{_END}", "DATE"),
}


@dataclass(frozen=True)
class Presence:
    """Where the decoder takes a value as null or missing, and what else it requires of it: one per field (a
    struct's `fields`, a list's `element`); the default takes anything the table's type holds."""

    null: bool = True  # the value may be written as JSON null (a list element: may be null)
    missing: bool = True  # the field may be left out of its object
    fields: tuple[tuple[str, Presence], ...] = ()  # a struct's fields, by name
    element: Presence | None = None  # a list's element
    members: tuple[str, ...] | None = None  # a string's `enum`: the only values it may hold
    pattern: str | None = None  # a regular expression a string must match (SQL text: `\\` for a backslash)


def codec_for(schema_str: str) -> JsonJvmCodec | str:
    """The codec of an inline JSON table (`schema_str`: `inline_schema_str`'s), or why its values stay on Python."""
    described = json.loads(schema_str)
    struct = T.StructType.fromJson(described["columns"])
    unsupported = unsupported_type(struct)
    if unsupported:
        return f"JSON values are checked in Python: the JVM path does not read {unsupported}"
    return JsonJvmCodec(struct, _inline_presence(struct, frozenset(described["required"]), ""))


def schemaless_codec(struct: T.StructType) -> JsonJvmCodec | str:
    """The codec of schemaless JSON read with columns `struct` (the table's, evolved by the batch), or why its values
    stay on Python. The schemaless decoder takes any value as null or missing and reads no time from text."""
    unsupported = unsupported_type(struct) or _first_temporal(struct, "")
    if unsupported:
        return f"JSON values are checked in Python: the JVM path does not read {unsupported} in schemaless JSON"
    return JsonJvmCodec(struct, Presence(), source="the table's columns")


def _first_temporal(dtype: T.DataType, path: str) -> str | None:
    if isinstance(dtype, T.StructType):
        return next((found for f in dtype.fields if (found := _first_temporal(f.dataType, f"{path}.{f.name}"))), None)
    if isinstance(dtype, T.ArrayType):
        return _first_temporal(dtype.elementType, f"{path}[]")
    return f"{path.lstrip('.')} ({dtype.simpleString()})" if isinstance(dtype, _TEMPORAL) else None


def _inline_presence(struct: T.StructType, required: frozenset[str], prefix: str) -> Presence:
    """An inline table's rules: a field declared `optional: false` is neither null nor missing (list elements and
    their fields are not checked, as in Python)."""
    fields = []
    for f in struct.fields:
        optional = f"{prefix}{f.name}" not in required
        nested = (
            _inline_presence(f.dataType, required, f"{prefix}{f.name}.")
            if isinstance(f.dataType, T.StructType)
            else Presence()
        )
        fields.append((f.name, Presence(optional, optional, nested.fields)))
    return Presence(fields=tuple(fields))


def inline_schema_str(struct: T.StructType, required: frozenset[str]) -> str:
    """An inline JSON table's columns and its `optional: false` paths, as `DecoderSpec.schema_str` holds them."""
    return json.dumps({"columns": struct.jsonValue(), "required": sorted(required)})


def unsupported_type(dtype: T.DataType, path: str = "") -> str | None:
    """The first column (path and type) the JVM path does not read, or None."""
    if isinstance(dtype, T.StructType):
        return next((found for f in dtype.fields if (found := unsupported_type(f.dataType, f"{path}.{f.name}"))), None)
    if isinstance(dtype, T.ArrayType):
        return unsupported_type(dtype.elementType, f"{path}[]")
    if isinstance(dtype, _LEAVES + _TEMPORAL):
        return None
    return f"{path.lstrip('.')} ({dtype.simpleString()})"


def _as_text(dtype: T.DataType) -> T.DataType:
    """The schema `from_json` reads with: temporal values as their text."""
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, _as_text(f.dataType), True) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(_as_text(dtype.elementType), True)
    return T.StringType() if isinstance(dtype, _TEMPORAL) else dtype


def _compact(text: Column) -> Column:
    """The text without JSON's whitespace: between tokens it means nothing, and inside a string both sides have
    the same (the decoded string, written again), so only a difference in tokens remains."""
    return F.regexp_replace(text, r"[ \t\n\r]", "")


def _name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _shape(dtype: T.DataType) -> tuple[str, str]:
    return _SHAPES[dtype.typeName()]


def _checks(sql: str, dtype: T.DataType, depth: int = 0) -> list[str]:
    """SQL conditions, beyond the round trip, for a non-null or null value `sql` of `dtype` to decode as in Python."""
    if isinstance(dtype, T.StructType):
        inner = [c for f in dtype.fields for c in _checks(f"{sql}.{_name(f.name)}", f.dataType, depth)]
        return [f"({sql} IS NULL OR ({' AND '.join(inner)}))"] if inner else []
    if isinstance(dtype, T.ArrayType):
        element = f"e{depth}"
        inner = _checks(element, dtype.elementType, depth + 1)
        return [f"({sql} IS NULL OR forall({sql}, {element} -> {' AND '.join(inner)}))"] if inner else []
    if isinstance(dtype, T.DoubleType):
        return [f"({sql} IS NULL OR NOT (isnan({sql}) OR abs({sql}) = double('Infinity')))"]
    if isinstance(dtype, _TEMPORAL):
        pattern, cast = _shape(dtype)
        return [f"({sql} IS NULL OR ({sql} RLIKE '{pattern}' AND try_cast({sql} AS {cast}) IS NOT NULL))"]
    return []


def _converted(sql: str, dtype: T.DataType, depth: int = 0) -> str | None:
    """SQL for the table's value of `sql` (text read where the table holds a time), or None where it is as read."""
    if isinstance(dtype, T.StructType):
        parts = [(f, _converted(f"{sql}.{_name(f.name)}", f.dataType, depth)) for f in dtype.fields]
        if all(done is None for _, done in parts):
            return None
        fields = ", ".join(f"'{f.name}', {done or f'{sql}.{_name(f.name)}'}" for f, done in parts)
        return f"CASE WHEN {sql} IS NULL THEN NULL ELSE named_struct({fields}) END"
    if isinstance(dtype, T.ArrayType):
        element = f"e{depth}"
        done = _converted(element, dtype.elementType, depth + 1)
        return None if done is None else f"transform({sql}, {element} -> {done})"
    if isinstance(dtype, _TEMPORAL):
        return f"CAST({sql} AS {_shape(dtype)[1]})"
    return None


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _allowed(sql: str, rule: Presence, nulls_written: bool, depth: int = 0) -> list[str]:
    """SQL conditions for a non-null value `sql` to meet `rule` in a record that wrote every null field
    (`nulls_written`) or left every one out: a null field was written as null, or missing, accordingly."""
    conditions = []
    if rule.members is not None:
        conditions.append(f"{sql} IN ({', '.join(_literal(m) for m in rule.members)})")
    if rule.pattern is not None:
        conditions.append(f"{sql} RLIKE '{rule.pattern}'")
    for name, inner in rule.fields:
        value = f"{sql}.{_name(name)}"
        if not (inner.null if nulls_written else inner.missing):
            conditions.append(f"{value} IS NOT NULL")
        nested = _allowed(value, inner, nulls_written, depth)
        if nested:
            conditions.append(f"({value} IS NULL OR ({' AND '.join(nested)}))")
    if rule.element is not None:  # a null element is written as null either way
        element = f"e{depth}"
        nested = _allowed(element, rule.element, nulls_written, depth + 1)
        each = [] if rule.element.null else [f"{element} IS NOT NULL"]
        each += [f"({element} IS NULL OR ({' AND '.join(nested)}))"] if nested else []
        if each:
            conditions.append(f"({sql} IS NULL OR forall({sql}, {element} -> {' AND '.join(each)}))")
    return conditions


def _all(conditions: list[str]) -> Column:
    return F.expr(" AND ".join(conditions)) if conditions else F.lit(True)


@dataclass(frozen=True)
class JsonJvmCodec:
    """How the JVM path reads a JSON table's values (formats.base.JvmCodec)."""

    struct: T.StructType  # the table's value columns
    rules: Presence  # where the decoder takes a null or a missing field, and `enum` members
    frame: bytes = b""  # the bytes before the JSON (JSON Schema: magic byte and schema id); other records: Python
    source: str = "inline schema"  # what the read path's log line names

    @property
    def reason(self) -> str:
        return f"Kafka source, from_json ({self.source}), each record checked against its re-encoding"

    def _framed(self, value: Column) -> Column:
        size = len(self.frame)
        return (F.length(value) >= size) & (value.substr(1, size) == F.lit(bytearray(self.frame)))

    def _payload(self, value: Column) -> Column:
        return value.substr(len(self.frame) + 1, 2**31 - 1) if self.frame else value

    def decoded(self, value: Column) -> Column:
        schema = cast(T.StructType, _as_text(self.struct))
        decoded = F.from_json(self._payload(value).cast("string"), schema, _READ)
        return F.when(self._framed(value), decoded) if self.frame else decoded

    def exact(self, value: Column, struct: str) -> Column:
        sql, payload = _name(struct), self._payload(value)
        checks = _all([c for f in self.struct.fields for c in _checks(f"{sql}.{_name(f.name)}", f.dataType)])
        row = F.col(struct)
        with_nulls, without_nulls = F.to_json(row, _NULLS_WRITTEN), F.to_json(row, _NULLS_LEFT_OUT)
        text = payload.cast("string")
        written, left_out = _allowed(sql, self.rules, True), _allowed(sql, self.rules, False)
        # As written (checked first: the cheapest), or differing only in JSON's whitespace (Python's `json.dumps` puts
        # a space after `,` and `:`), with null fields written or left out (Jackson's NON_NULL, JavaScript's
        # undefined). A value that is not UTF-8 is caught by its bytes: the cast to text replaces what is invalid.
        as_written = F.encode(with_nulls, "UTF-8") == payload
        utf8, compact = F.encode(text, "UTF-8") == payload, _compact(text)
        if written == left_out:  # the rules do not depend on how nulls were written: compare once
            same = (as_written | (utf8 & compact.isin(_compact(with_nulls), _compact(without_nulls)))) & _all(written)
        else:
            nulls_written = as_written | (utf8 & (compact == _compact(with_nulls)))
            nulls_left_out = utf8 & (compact == _compact(without_nulls))
            same = (nulls_written & _all(written)) | (nulls_left_out & _all(left_out))
        same = same & checks
        return self._framed(value) & same if self.frame else same

    def value_columns(self, struct: str) -> dict[str, Column]:
        columns = {}
        for f in self.struct.fields:
            sql = f"{_name(struct)}.{_name(f.name)}"
            done = _converted(sql, f.dataType)
            columns[f.name] = F.expr(done) if done is not None else F.col(struct)[f.name]
        return columns
