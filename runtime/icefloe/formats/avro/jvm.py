"""Avro values decoded in the JVM: the registry's framing split with Spark expressions, then `from_avro` per writer
schema.

For every schema id registered under the table's subject (Confluent framing: magic byte 0, 4-byte id), or every
version of the table's schema in an AWS Glue Schema Registry (header 3, compression byte 0, 16-byte version UUID;
a zlib-compressed payload goes to Python, Spark has no inflate), the driver asks the registry once per batch; the
record's body is decoded with that id's writer schema and the table's reader schema (`avroSchema`), so older
records resolve to the evolved table schema as they do in Python. The reader schema carries one extra field,
`__icefloe_decoded` (boolean, default true): Spark's PERMISSIVE mode turns a record it cannot decode into a struct
of nulls, and only this field tells it from a record whose fields are all null.

The Python decoder stays the reference. A record is *exact* when the JVM's result is what Python would produce;
anything else goes to Python, which gives its value or its exact error. Not exact:
  - a payload that is not framed, or framed with an id the JVM has no writer schema for (another subject or Glue
    schema, a compressed Glue payload, schema references, a schema Avro Java refuses or cannot resolve against the reader, logical types that differ between
    writer and reader: Python and Java resolve those differently);
  - a body `from_avro` cannot decode (truncated, overflowing a timestamp, a decimal beyond its precision; a
    decimal of precision 18 or less is read at a wider one, since Spark keeps it as its unscaled value's low 64 bits
    and a longer value could wrap into range: `_widened_precision`);
  - values Avro Java accepts but Python refuses or rewrites: strings (map keys included) that are not UTF-8,
    uuids not in canonical lowercase form, timestamps and dates outside years 1..9999, times outside one day;
  - with an inline schema (no registry), a body longer than its re-encoding: trailing bytes.
Types then match the table (avro.mapping), except where Avro Java 1.11 (Spark's) reads a logical type as its
base type: time-millis (an int) becomes microseconds, timestamp-nanos (a long) a timestamp in microseconds,
uuid on fixed(16) its canonical text, duration (fixed(12)) its struct.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from itertools import count
from typing import Any
from uuid import UUID

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

from icefloe.formats.avro.names import Names as _Names
from icefloe.formats.avro.unions import branches as union_branches
from icefloe.formats.avro.unions import collapsed as collapsed_union
from icefloe.formats.avro.unions import member_name
from icefloe.formats.base import GLUE, INLINE, DecoderSpec
from icefloe.inline_types import TIMESTAMP_MICROS
from icefloe.jvm_gateway import jvm_gateway
from icefloe.registries import glue as glue_registry
from icefloe.registries.confluent import subject_for, subject_schemas

log = logging.getLogger(__name__)
MARKER = "__icefloe_decoded"
_LONG_DIGITS = 18  # Spark's Decimal keeps a precision up to this as a long
MAX_WRITER_VERSIONS = 100  # the subject's newest versions the JVM decodes; older ids go to Python
_FROM_AVRO = {"mode": "PERMISSIVE", "datetimeRebaseMode": "CORRECTED"}
_TS_MICROS = TIMESTAMP_MICROS
_RANGES = {
    "timestamp-millis": f"timestamp_micros({_TS_MICROS[0]}) AND timestamp_micros({_TS_MICROS[1]})",
    "timestamp-micros": f"timestamp_micros({_TS_MICROS[0]}) AND timestamp_micros({_TS_MICROS[1]})",
    "local-timestamp-millis": "TIMESTAMP_NTZ'0001-01-01 00:00:00' AND TIMESTAMP_NTZ'9999-12-31 23:59:59.999999'",
    "local-timestamp-micros": "TIMESTAMP_NTZ'0001-01-01 00:00:00' AND TIMESTAMP_NTZ'9999-12-31 23:59:59.999999'",
    "date": "DATE'0001-01-01' AND DATE'9999-12-31'",
    "time-millis": "0 AND 86399999",
    "time-micros": "0 AND 86399999999",
}
# The regex `\z` (escaped for SQL), the very end: Java's `$` also matches before a final line break, which Python's UUID
# refuses
_UUID = "'^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\\\\z'"
_UUID_GROUPS = ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))


@dataclass(frozen=True)
class AvroJvmPlan:
    """How one batch's values are decoded in the JVM (built on the driver)."""

    reader: dict  # the table's Avro schema (the subject's latest, or the inline one)
    writers: dict[
        int | UUID, str
    ]  # schema id (Confluent) or version UUID (Glue) -> writer schema, those the JVM decodes
    inline: bool = False  # no registry: every framed record is decoded with `reader`, its id ignored
    routed: dict[int | UUID, str] = field(default_factory=dict)  # ids left to Python, and why

    @property
    def reason(self) -> str:
        writers = (
            "inline schema"
            if self.inline
            else f"writer schemas {', '.join(str(i) for i in sorted(self.writers)) or 'none'}"
        )
        return f"Kafka source and from_avro ({writers})"

    # The JVM codec (formats.base.JvmCodec)
    def decoded(self, value: Column) -> Column:
        """The value decoded to the reader's struct plus the marker field; null for a null value, an unframed value or
        an id without writer schema; a struct of nulls (marker included) where `from_avro` fails."""
        options = {**_FROM_AVRO, "avroSchema": self.reader_with_marker}
        if self.inline:
            writer = json.dumps(self.reader)
            framed = (F.length(value) > 5) & (value.substr(1, 1) == F.lit(bytearray(b"\x00")))
            return F.when(framed, from_avro(value.substr(6, 2**31 - 1), writer, options))
        result = None
        for schema_id, writer in sorted(self.writers.items()):
            prefix = _frame(schema_id)
            match = (F.length(value) > len(prefix)) & (value.substr(1, len(prefix)) == F.lit(bytearray(prefix)))
            body = from_avro(value.substr(len(prefix) + 1, 2**31 - 1), writer, options)
            result = F.when(match, body) if result is None else result.when(match, body)
        return result if result is not None else F.lit(None)

    def exact(self, value: Column, struct: str) -> Column:
        """True where the JVM's decoding of a non-null `value` (column `struct`, from `decoded`) is the Python one."""
        checks = _checks(self.reader, struct, _Names(), count())
        strings = _strings(self.reader, struct, _Names(), count())
        condition = F.col(f"{struct}.{MARKER}").isNotNull()
        for check in [checks, _utf8(strings) if strings else None]:
            if check:
                condition = condition & F.expr(check)
        if self.inline:  # Python refuses trailing bytes after the record; Avro's encoding of a value is canonical
            plain = F.struct(*[F.col(struct)[f["name"]] for f in self.reader["fields"]])
            condition = condition & (F.length(to_avro(plain, json.dumps(self.reader))) == F.length(value) - 5)
        return condition

    def value_columns(self, struct: str) -> dict[str, Column]:
        """The table's value columns by name, from the decoded struct (time-millis widened to microseconds)."""
        names = _Names()
        columns = {}
        for item in self.reader["fields"]:
            source = f"{struct}.`{item['name']}`"
            converted = _conform(item["type"], source, names, count(), self.reader.get("namespace", ""))
            columns[item["name"]] = F.expr(converted) if converted else F.col(source)
        return columns

    @property
    def reader_with_marker(self) -> str:
        """The reader schema `from_avro` decodes with: the marker field added, and (with a registry) decimals that
        Spark would keep as a long read wider (`_widened_precision`); the inline mode's re-encoding check sees
        those by their length instead."""
        reader = self.reader if self.inline else _wide_decimals(self.reader)
        marked = {**reader, "fields": [*reader["fields"], {"name": MARKER, "type": "boolean", "default": True}]}
        return json.dumps(marked)


def plan_avro(spark: SparkSession, decoder: DecoderSpec) -> AvroJvmPlan | None:
    """The JVM decoding of `decoder`'s values, or None when the JVM cannot read this table (logged)."""
    reader = json.loads(decoder.schema)
    jvm = jvm_gateway(spark).org.apache.avro
    try:
        reader_schema = jvm.Schema.Parser().parse(AvroJvmPlan(reader, {}).reader_with_marker)
    except Exception as error:  # Avro Java is stricter than fastavro (names, defaults)
        log.warning(
            "%s: Avro Java refuses the table's schema, values are decoded in Python: %s",
            decoder.topic,
            _first_line(error),
        )
        return None
    if decoder.schema_from == INLINE:
        return AvroJvmPlan(reader, {}, inline=True)
    versions: dict[Any, tuple[str, list]]  # by schema id (Confluent) or version UUID (Glue)
    if decoder.schema_from == GLUE:  # Glue schemas have no references
        versions = {
            v: (text, []) for v, text in glue_registry.avro_versions(decoder.registry, MAX_WRITER_VERSIONS).items()
        }
    else:
        versions = subject_schemas(decoder.registry, subject_for(decoder.topic), MAX_WRITER_VERSIONS)
    writers: dict[int | UUID, str] = {}
    routed: dict[int | UUID, str] = {}
    for schema_id, (text, references) in versions.items():
        reason = "it has schema references" if references else _unusable(jvm, reader_schema, text, reader)
        if reason:
            routed[schema_id] = reason
        else:
            writers[schema_id] = text
    for schema_id, reason in routed.items():
        log.info("%s: records with schema id %s are decoded in Python: %s", decoder.topic, schema_id, reason)
    return AvroJvmPlan(reader, writers, routed=routed)


def _unusable(jvm, reader_schema, text: str, reader: dict) -> str | None:
    """Why the JVM must not decode records written with `text`, or None."""
    try:
        writer_schema = jvm.Schema.Parser().parse(text)
    except Exception as error:
        return f"Avro Java refuses the schema: {_first_line(error)}"
    result = jvm.SchemaCompatibility.checkReaderWriterCompatibility(reader_schema, writer_schema)
    if result.getType().toString() != "COMPATIBLE":
        return "it does not resolve to the table's schema"
    differs = _logical_difference(json.loads(text), reader)
    return f"logical type of {differs} differs from the table's schema" if differs else None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[-1][:200]


def _frame(schema_id: int | UUID) -> bytes:
    """The bytes before the body of a record written with `schema_id`: Confluent's magic byte and schema id, or the
    Glue header of an uncompressed payload."""
    return glue_registry.frame(schema_id) if isinstance(schema_id, UUID) else b"\x00" + schema_id.to_bytes(4, "big")


def _nonnull(schema: Any) -> Any:
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return branches[0] if len(branches) == 1 else schema
    return schema


def _kind(schema: Any) -> tuple[str, str | None]:
    if isinstance(schema, str):
        return schema, None
    if isinstance(schema, list):
        return "union", None
    kind = schema.get("type")
    if isinstance(kind, (dict, list)):
        return _kind(kind)
    return kind, schema.get("logicalType")


def _widened_precision(schema: Any) -> int | None:
    """The precision a decimal is read with in the JVM, where it is not its own: Spark keeps a decimal of precision
    18 or less as the low 64 bits of its unscaled value, so a longer value (more bytes than such a decimal needs)
    could wrap into range and pass as another number. Read wider, it stays whole, and `_checks` sends a value beyond
    the table's precision to Python."""
    if not isinstance(schema, dict) or schema.get("logicalType") != "decimal":
        return None
    precision = schema.get("precision")
    if not isinstance(precision, int) or precision > _LONG_DIGITS:
        return None
    if schema.get("type") == "bytes":
        return 38
    size = schema.get("size")
    if schema.get("type") == "fixed" and isinstance(size, int) and size > 8:  # the digits a fixed of that size holds
        return min(38, len(str(2 ** (8 * size - 1) - 1)) - 1)
    return None


def _wide_decimals(node: Any) -> Any:
    """`node` (an Avro schema) with each decimal that `_widened_precision` names read at that precision."""
    if isinstance(node, list):
        return [_wide_decimals(item) for item in node]
    if not isinstance(node, dict):
        return node
    widened = {key: _wide_decimals(value) if key != "default" else value for key, value in node.items()}
    precision = _widened_precision(node)
    return {**widened, "precision": precision} if precision else widened


def _checks(schema: Any, expr: str, names: _Names, ids: count, namespace: str = "") -> str | None:
    """A SQL condition that is true where the value at `expr` has no value Python refuses or rewrites, strings
    apart (see `_strings`); None where there is nothing to check."""
    schema, namespace, _ = names.resolve(_nonnull(schema), namespace)
    kind, logical = _kind(schema)
    if kind == "record" or kind == "union":
        parts = [_checks(t, f"{expr}.`{name}`", names, ids, namespace) for name, t in _members(schema)]
        checks = [p for p in parts if p]
        return f"({expr} IS NULL OR ({' AND '.join(checks)}))" if checks else None
    if kind in ("array", "map"):
        var = f"x{next(ids)}"
        inner = _checks(schema["items" if kind == "array" else "values"], var, names, ids, namespace)
        items = expr if kind == "array" else f"map_values({expr})"
        return f"({expr} IS NULL OR forall({items}, {var} -> {inner}))" if inner else None
    if logical == "uuid" and kind == "string":  # (RLIKE decodes the bytes: bad UTF-8 does not match either)
        return f"({expr} IS NULL OR {expr} RLIKE {_UUID})"
    if logical in _RANGES and kind in ("int", "long"):
        return f"({expr} IS NULL OR {expr} BETWEEN {_RANGES[logical]})"
    if logical == "decimal" and _widened_precision(schema):  # read wider: in the table's precision, or Python's
        return f"({expr} IS NULL OR try_cast({expr} AS DECIMAL({schema['precision']}, {schema.get('scale', 0)})) IS NOT NULL)"
    return None  # boolean, numbers, bytes, fixed, enum, decimal: Avro Java's result is Python's; strings apart


def _strings(
    schema: Any, expr: str, names: _Names, ids: count, namespace: str = "", depth: int = 0, nulls: bool = False
) -> list[str]:
    """SQL expressions (string or array<string>) giving every string at `expr`, map keys included (not uuids, which
    `_checks` matches, nor enums, whose symbols come from the schema). At depth 1 `expr` is an array of the schema's
    values (`nulls`: it may hold nulls). Collections are reached with field extraction, `map_keys`, `map_values`
    and `flatten`, which Spark generates code for; a lambda (`transform`, which Spark interprets: several times
    slower) only where `flatten` could meet a null array (it would return null, hiding the other arrays' strings)
    or for an array of maps."""
    nullable = _nullable(schema)
    schema, namespace, _ = names.resolve(_nonnull(schema), namespace)
    kind, logical = _kind(schema)
    if kind == "string":
        return [] if logical == "uuid" else [expr]
    if kind == "record" or kind == "union":
        nulls = nulls or nullable or kind == "union"  # a null record, or the members of a union not taken
        return [
            p
            for name, t in _members(schema)
            for p in _strings(t, f"{expr}.`{name}`", names, ids, namespace, depth, nulls)
        ]
    if kind == "array" and depth == 0:
        return _strings(schema["items"], expr, names, ids, namespace, 1, _nullable(schema["items"]))
    if kind == "map" and depth == 0:
        values = _strings(
            schema["values"], f"map_values({expr})", names, ids, namespace, 1, _nullable(schema["values"])
        )
        return [f"map_keys({expr})", *values]
    if kind == "array" and not (nulls or nullable):  # an array of arrays: one array of their items
        return _strings(schema["items"], f"flatten({expr})", names, ids, namespace, 1, _nullable(schema["items"]))
    if kind in ("array", "map"):
        var = f"x{next(ids)}"
        inner = _strings(schema, var, names, ids, namespace)
        return [f"transform({expr}, {var} -> {_joined(inner)})"] if inner else []
    return []


def _nullable(schema: Any) -> bool:
    return isinstance(schema, list) and "null" in schema


def _members(schema: Any) -> list[tuple[str, Any]]:
    """The struct fields of a record, or of a union of several types (none for one Spark collapses to a long or a
    double), as (name, Avro type)."""
    if isinstance(schema, list):
        members = union_branches(schema)
        return [] if collapsed_union(members) else [(member_name(i), m) for i, m in enumerate(members)]
    return [(f["name"], f["type"]) for f in schema["fields"]]


def _joined(parts: list[str]) -> str:
    # An ASCII separator: a UTF-8 sequence cut at the end of one string cannot be completed by the next one.
    return f"concat_ws('\\n', {', '.join(parts)})"


def _utf8(parts: list[str]) -> str:
    """True where all the strings are valid UTF-8, checked once per record over their concatenation: Spark keeps
    Avro's string bytes as they are; `encode` goes through a Java String, which replaces each invalid sequence with
    U+FFFD (bytes EF BF BD). A valid U+FFFD in the data also sends its record to Python, which decodes it the same.
    The concatenation appears once: Spark does not share a subexpression inside a CASE branch, and this check is
    one (data_plane's tombstone case). No lambda: Spark generates code for this form."""
    return f"NOT contains(encode({_joined(parts)}, 'UTF-8'), X'EFBFBD')"


def _conform(schema: Any, expr: str, names: _Names, ids: count, namespace: str) -> str | None:
    """A SQL expression giving the table's type for the value at `expr`, or None where it already has it."""
    schema, namespace, _ = names.resolve(_nonnull(schema), namespace)
    kind, logical = _kind(schema)
    if kind == "int" and logical == "time-millis":
        return f"(CAST({expr} AS BIGINT) * 1000)"
    if kind == "long" and logical in ("timestamp-nanos", "local-timestamp-nanos"):  # Avro Java 1.11 reads a long
        micros = f"({expr} div 1000 - IF({expr} < 0 AND {expr} % 1000 != 0, 1, 0))"  # rounded down, as in Python
        if logical == "timestamp-nanos":
            return f"timestamp_micros({micros})"
        return f"(TIMESTAMP_NTZ'1970-01-01 00:00:00' + {micros} * INTERVAL '0.000001' SECOND)"
    if kind == "fixed" and logical == "uuid":  # canonical text of the 16 bytes
        hexed = f"lower(hex({expr}))"
        parts = ", ".join(f"substr({hexed}, {start}, {length})" for start, length in _UUID_GROUPS)
        return f"concat_ws('-', {parts})"
    if kind == "fixed" and logical == "duration":  # three unsigned little-endian 32-bit counts
        counts = []
        for first in (1, 5, 9):  # each count's bytes, most significant first, as one hex number
            hex_digits = ", ".join(f"hex(substr({expr}, {first + i}, 1))" for i in (3, 2, 1, 0))
            counts.append(f"CAST(conv(concat({hex_digits}), 16, 10) AS BIGINT)")
        fields = ", ".join(f"'{name}', {count_}" for name, count_ in zip(("months", "days", "milliseconds"), counts))
        return f"IF({expr} IS NULL, NULL, named_struct({fields}))"
    if kind == "record" or kind == "union":
        members = [(name, _conform(t, f"{expr}.`{name}`", names, ids, namespace)) for name, t in _members(schema)]
        if not any(converted for _, converted in members):
            return None
        fields = ", ".join(f"'{name}', {converted or f'{expr}.`{name}`'}" for name, converted in members)
        return f"IF({expr} IS NULL, NULL, named_struct({fields}))"
    if kind == "array":
        var = f"x{next(ids)}"
        inner = _conform(schema["items"], var, names, ids, namespace)
        return f"transform({expr}, {var} -> {inner})" if inner else None
    if kind == "map":
        key, var = f"k{next(ids)}", f"v{next(ids)}"
        inner = _conform(schema["values"], var, names, ids, namespace)
        return f"transform_values({expr}, ({key}, {var}) -> {inner})" if inner else None
    return None


def _logical_difference(writer: Any, reader: Any) -> str | None:
    """The first field path whose logical type (or decimal precision/scale) differs between writer and reader."""
    return _compare(writer, reader, _Names(), _Names(), "", "", "value", set())


def _is_union(schema: Any) -> bool:
    return isinstance(schema, list) and len(union_branches(schema)) > 1


def _annotation(schema: Any) -> tuple:
    if not isinstance(schema, dict) or "logicalType" not in schema:
        return ()
    return schema["logicalType"], schema.get("precision"), schema.get("scale", 0 if "precision" in schema else None)


def _compare(writer, reader, wnames: _Names, rnames: _Names, wns: str, rns: str, path: str, seen: set) -> str | None:
    if _is_union(writer) or _is_union(reader):  # unions of several types: resolved branch to branch when alike
        if not (_is_union(writer) and _is_union(reader)) or len(union_branches(writer)) != len(union_branches(reader)):
            return path
        for index, (w, r) in enumerate(zip(union_branches(writer), union_branches(reader))):
            if _kind(wnames.resolve(w, wns)[0])[0] != _kind(rnames.resolve(r, rns)[0])[0]:
                return path  # another order or other branches: Python and Java may pick branches differently
            differs = _compare(w, r, wnames, rnames, wns, rns, f"{path}.{member_name(index)}", seen)
            if differs:
                return differs
        return None
    writer, wns, _ = wnames.resolve(_nonnull(writer), wns)
    reader, rns, _ = rnames.resolve(_nonnull(reader), rns)
    if _annotation(writer) != _annotation(reader):
        return path
    wkind, rkind = _kind(writer)[0], _kind(reader)[0]
    if wkind != rkind:
        return None  # a promotion (int -> long, ...) or a mismatch the compatibility check reports
    if wkind == "record":
        key = (id(writer), id(reader))
        if key in seen:
            return None
        seen.add(key)
        by_name = {f["name"]: f for f in writer["fields"]}
        for item in reader["fields"]:
            found = next((by_name[n] for n in [item["name"], *item.get("aliases", [])] if n in by_name), None)
            if found is not None:
                differs = _compare(
                    found["type"], item["type"], wnames, rnames, wns, rns, f"{path}.{item['name']}", seen
                )
                if differs:
                    return differs
    elif wkind == "array":
        return _compare(writer["items"], reader["items"], wnames, rnames, wns, rns, f"{path}[]", seen)
    elif wkind == "map":
        return _compare(writer["values"], reader["values"], wnames, rnames, wns, rns, f"{path}{{}}", seen)
    return None
