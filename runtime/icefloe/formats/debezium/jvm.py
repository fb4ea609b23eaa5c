"""Debezium Avro mirror tables decoded in the JVM: `from_avro` decodes the envelope and the Kafka key (avro.jvm's
codec, one per subject), Spark expressions build the row and the change columns `envelope.ChangeDecoder` builds.

The Python decoder stays the reference: a record is *exact* only where these expressions give what it gives, and
everything else goes to Python per record (its value or its exact error). Covered, per table (else the table reads
on Python, the reason logged):
  - a mirror table (`mode: upsert`) whose source is PostgreSQL's (`connector`, `lsn`, `sequence`); registry
    references (Apicurio's converter registers the nested records as subjects) are inlined where each referenced
    type is first used by its full name;
  - `after` columns of Avro int, long, float, double, boolean, string, bytes without a logical type (Connect's
    int8/16/32/64, ..., and semantic types that stay text), io.debezium.time.Date, Timestamp, MicroTimestamp,
    NanoTimestamp (on int/long), ZonedTimestamp (ISO text at UTC, `Z`, up to 6 fraction digits), precise decimals
    (Avro's decimal); key columns the same, floats apart.
Per record (else Python): the schema id is the subject's latest (value and key alike), the Avro checks of avro.jvm
hold (UTF-8 strings, ...), op is c, r, u or d (a truncate, a missing or unknown op go to Python), the Kafka key is
there with no null field and matches the row's key columns (`before`'s for a delete), a `__debezium.oldkey`
header (a primary-key change) only on integer key columns, a plain JSON object of exactly them, temporal values
within years 1-9999, the source is `postgresql` with an `lsn` >= 0
and a `sequence` of two decimal strings (or nulls). The TOAST placeholder in a text or bytes column is what Python
does with it: the column left out and named in the unchanged columns.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.batch_columns import CHANGE, CHANGE_MOVED_FROM, CHANGE_TIME, CHANGE_UNCHANGED, SOURCE_POSITION
from icefloe.formats.avro.jvm import MAX_WRITER_VERSIONS, AvroJvmPlan
from icefloe.formats.avro.names import Names
from icefloe.formats.base import DecoderSpec
from icefloe.formats.debezium import tables, types
from icefloe.formats.debezium.envelope import OLD_KEY_HEADER
from icefloe.inline_types import TIMESTAMP_MICROS
from icefloe.jvm_gateway import jvm_gateway
from icefloe.registries.confluent import registry_client, registry_errors, subject_schemas

log = logging.getLogger(__name__)
_PLAIN = {"int": T.IntegerType(), "long": T.LongType(), "float": T.FloatType(), "double": T.DoubleType(),
          "boolean": T.BooleanType(), "string": T.StringType(), "bytes": T.BinaryType()}  # fmt: skip
_DAYS = (-719162, 2932896)  # 0001-01-01 and 9999-12-31 as days since 1970
# `\z`, the very end: Java's `$` also matches before a final line break, which Python's parser refuses
_ZONED = r"^(?!0000)[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?Z\z"
_SEQUENCE = r'^\[\s*(?:null|"([0-9]{1,18})")\s*,\s*(?:null|"([0-9]{1,18})")\s*\]$'
_SEQUENCE_NOISE = '[]" \t\n\x0b\x0c\r'  # what `_SEQUENCE` allows around the two numbers (`\s` is these)
_VALUE, _KEY = "v", "k"
# A primary-key change's `__debezium.oldkey` header decoded here: a JSON object of integer values only (names without
# escapes), JSON's own blanks around them; `\A`, `\z`: the whole text (Python's parser refuses anything after it).
_BLANK, _INTEGER = r"[ \t\n\r]*", "-?(?:0|[1-9][0-9]{0,18})"
_MEMBER = _BLANK + r'"[^"\\\x00-\x1f]+"' + _BLANK + ":" + _BLANK + _INTEGER + _BLANK
_OLD_KEY = r"\A" + _BLANK + r"\{" + _MEMBER + "(?:," + _MEMBER + ")*" + r"\}" + _BLANK + r"\z"
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


@dataclass(frozen=True)
class _Column:
    name: str
    kind: str  # plain | date | timestamp | zoned | decimal
    unit: int = 1  # timestamp: the divisor to microseconds (negative: the multiplier), as types.TIMESTAMP
    placeholder: str | None = None  # plain text or bytes: the type the TOAST placeholder can take


@dataclass(frozen=True)
class DebeziumJvmPlan:
    """How one batch's change events are decoded in the JVM (built on the driver)."""

    value: AvroJvmPlan  # the envelope
    key: AvroJvmPlan
    columns: tuple[_Column, ...]
    keys: tuple[str, ...]
    placeholder: str
    source_fields: frozenset[str]
    envelope_fields: frozenset[str]
    moved_type: str  # CHANGE_MOVED_FROM's type (JSON)

    @property
    def reason(self) -> str:
        return f"Kafka source and from_avro of the Debezium envelope ({self.value.reason}; key {self.key.reason})"

    # The JVM codec (formats.base.JvmCodec)
    def decoded(self, value: Column) -> Column:
        """The envelope and the Kafka key decoded (`v`, `k`); null for a tombstone."""
        key = F.col("kafka_key")
        return F.when(
            value.isNotNull(), F.struct(self.value.decoded(value).alias(_VALUE), self.key.decoded(key).alias(_KEY))
        )

    def exact(self, value: Column, struct: str) -> Column:
        """True where Python's envelope decoder gives the row `value_columns` gives (never for a tombstone: a null
        `value` is the caller's)."""
        env, key = f"{struct}.{_VALUE}", f"{struct}.{_KEY}"
        op = F.col(f"{env}.op")
        condition = self.value.exact(value, env) & self.key.exact(F.col("kafka_key"), key)
        condition = condition & F.col(f"{env}.source").isNotNull() & op.isin("c", "r", "u", "d")
        for name in self.keys:
            condition = condition & F.col(f"{key}.`{name}`").isNotNull()
        condition = condition & self._moved_from(op)[1]
        after, before = f"{env}.after", f"{env}.before"
        upserted = F.col(after).isNotNull() & self._in_range(after)
        for name in self.keys:
            upserted = upserted & (self._image(after, name) == self._converted(f"{key}.`{name}`", name))
        deleted = F.col(before).isNull() | self._in_range(before)
        for name in self.keys:
            image = self._image(before, name)
            deleted = deleted & (
                F.col(before).isNull() | image.isNull() | (image == self._converted(f"{key}.`{name}`", name))
            )
        condition = condition & F.when(op == "d", deleted).otherwise(upserted)
        micros, in_range = self._change_micros(env)
        condition = condition & in_range & self._position_exact(f"{env}.source")
        return F.coalesce(condition, F.lit(False))

    def value_columns(self, struct: str) -> dict[str, Column]:
        env, key = f"{struct}.{_VALUE}", f"{struct}.{_KEY}"
        decoded, op = F.col(struct), F.col(f"{env}.op")
        after = f"{env}.after"
        columns: dict[str, Column] = {}
        for column in self.columns:
            image = self._image(after, column.name)
            if column.name in self.keys:
                image = F.when(op == "d", self._converted(f"{key}.`{column.name}`", column.name)).otherwise(image)
            else:
                image = F.when(op != "d", image)
            columns[column.name] = image
        unchanged = [  # each column's name where the change left it unchanged (the placeholder), else nothing
            F.when((op != "d") & (F.col(f"{after}.`{c.name}`") == self._placeholder(c)), F.array(F.lit(c.name)))
            for c in self.columns
            if c.placeholder
        ]
        listed = _concat_arrays(unchanged) if unchanged else None
        micros, _ = self._change_micros(env)
        columns.update(
            {
                SOURCE_POSITION: self._position(f"{env}.source"),
                CHANGE: F.when(decoded.isNull(), F.lit("none"))
                .when(op == "d", F.lit("delete"))
                .otherwise(F.lit("upsert")),
                CHANGE_UNCHANGED: (
                    F.when(F.size(listed) > 0, listed) if listed is not None else F.lit(None).cast("array<string>")
                ),
                CHANGE_MOVED_FROM: self._moved_from(op)[0],
                **{name: F.lit(None) for name in (tables.DELETED, tables.DELETED_AT)},  # the writer's, as in Python
                CHANGE_TIME: F.timestamp_micros(micros),
            }
        )
        return columns

    # --- the columns ----------------------------------------------------------------------------------------------
    def _by_name(self, name: str) -> _Column:
        return next(c for c in self.columns if c.name == name)

    def _placeholder(self, column: _Column) -> Column:
        data = self.placeholder.encode()
        return F.lit(bytearray(data)) if column.placeholder == "bytes" else F.lit(self.placeholder)

    def _image(self, image: str, name: str) -> Column:
        """A column of `after` or `before` as Python's row holds it: converted, null where it is the placeholder."""
        column = self._by_name(name)
        raw = F.col(f"{image}.`{name}`")
        converted = self._converted(f"{image}.`{name}`", name)
        if column.placeholder:
            return F.when(raw != self._placeholder(column), converted)
        return converted

    def _converted(self, path: str, name: str) -> Column:
        column, raw = self._by_name(name), F.col(path)
        if column.kind == "date":
            return F.date_add(F.lit("1970-01-01").cast("date"), raw)
        if column.kind == "zoned":  # ISO text at UTC (`_in_range` checks its form)
            return F.regexp_replace(raw, "Z$", "+00:00").cast("timestamp")
        if column.kind == "timestamp":
            return F.expr(
                f"TIMESTAMP_NTZ'1970-01-01 00:00:00' + {_micros(path, column.unit)} * INTERVAL '0.000001' SECOND"
            )
        return raw

    def _in_range(self, image: str) -> Column:
        """Every temporal column of the image converts (Python refuses dates and timestamps outside years 1-9999)."""
        condition = F.lit(True)
        for column in self.columns:
            raw = F.col(f"{image}.`{column.name}`")
            if column.kind == "date":
                condition = condition & (raw.isNull() | raw.between(*_DAYS))
            elif column.kind == "zoned":  # a form Python reads as Spark does, and a real moment (not 24:00, Feb 30)
                converted = self._converted(f"{image}.`{column.name}`", column.name)
                valid = raw.rlike(_ZONED) & converted.isNotNull()
                condition = condition & (raw.isNull() | (raw == self._placeholder(column)) | valid)
            elif column.kind == "timestamp" and column.unit <= 1:
                scale = -column.unit if column.unit < 0 else 1
                low, high = -(-TIMESTAMP_MICROS[0] // scale), TIMESTAMP_MICROS[1] // scale
                condition = condition & (raw.isNull() | raw.between(low, high))
        return condition

    # --- the change columns ---------------------------------------------------------------------------------------
    def _moved_from(self, op: Column) -> tuple[Column, Column]:
        """The key a `c` or `r` moved the row from (a primary-key change: its `__debezium.oldkey` header, JSON text,
        the first such header), and whether Python's `envelope.ChangeDecoder` gives the same: decoded here only for
        integer key columns, from a JSON object (`_OLD_KEY`) of exactly them; any other header of a `c` or `r` goes to
        Python, which decodes it or names the error. Python leaves the header of other ops alone: so does this."""
        moved_type = T.StructType.fromJson(json.loads(self.moved_type))
        found = F.filter(F.col("kafka_headers"), lambda h: h["key"] == OLD_KEY_HEADER)
        raw = F.get(found, 0)["value"].cast("string")
        applies = op.isin("c", "r") & raw.isNotNull()
        if not all(isinstance(f.dataType, _INTEGRAL) for f in moved_type.fields):
            return F.lit(None).cast(moved_type), ~applies
        decoded = F.from_json(raw, moved_type)
        names = F.array(*[F.lit(name) for name in sorted(moved_type.fieldNames())])
        decodes = raw.rlike(_OLD_KEY) & (F.array_sort(F.json_object_keys(raw)) == names)
        for name in moved_type.fieldNames():  # null: a value its column's type cannot hold
            decodes = decodes & decoded[name].isNotNull()
        return F.when(applies, decoded), F.coalesce(~applies | decodes, F.lit(False))

    def _change_micros(self, env: str) -> tuple[Column, Column]:
        """`envelope.source_time`'s microseconds and whether Python gives the same (its value within years 1-9999)."""
        candidates = []
        for holder, fields in ((f"{env}.source", self.source_fields), (env, self.envelope_fields)):
            for name, scale in (("ts_us", 1), ("ts_ms", 1000)):
                if name in fields:
                    candidates.append((F.col(f"{holder}.{name}"), scale))
        micros: Column = F.lit(None).cast("bigint")
        in_range: Column = F.lit(True)
        for raw, scale in reversed(candidates):  # the first one given decides
            fits = raw.between(-(-TIMESTAMP_MICROS[0] // scale), TIMESTAMP_MICROS[1] // scale)
            micros = F.when(raw.isNotNull(), raw * scale).otherwise(micros)
            in_range = F.when(raw.isNotNull(), fits).otherwise(in_range)
        return micros, F.coalesce(in_range, F.lit(False))

    def _position_exact(self, source: str) -> Column:
        sequence = F.col(f"{source}.sequence")
        parsed = sequence.isNull() | (sequence == "") | sequence.rlike(_SEQUENCE)
        return (F.col(f"{source}.connector") == "postgresql") & (F.col(f"{source}.lsn") >= 0) & parsed

    def _position(self, source: str) -> Column:
        """`envelope.position` of a PostgreSQL source: 1, lastCommitLsn and lsn as 8-byte big-endian numbers.
        The sequence's form is `_position_exact`'s regular expression: once it holds, each side of its one comma
        with `[`, `]`, quotes and blanks trimmed off is digits or `null` (string functions: a regex per record costs;
        `translate` looks each character up in a map, measured 3% of a mirror batch's CPU, trimming the ends does not)."""
        sequence, lsn = F.col(f"{source}.sequence"), F.col(f"{source}.lsn")
        given = sequence.isNotNull() & (sequence != "")
        first, second = (
            F.call_function("btrim", F.substring_index(sequence, ",", side), F.lit(_SEQUENCE_NOISE)) for side in (1, -1)
        )
        last = F.when(given & (first != "null"), first.cast("bigint")).otherwise(F.lit(0).cast("bigint"))
        current = F.when(given & (second != "null"), second.cast("bigint")).otherwise(lsn)
        return F.concat(F.lit(bytearray(b"\x01")), _u64(last), _u64(current))


def _micros(path: str, unit: int) -> str:
    if unit < 0:
        return f"({path} * {-unit})"
    if unit == 1:
        return path
    return f"({path} div {unit} - IF({path} < 0 AND {path} % {unit} != 0, 1, 0))"  # floor, as Python's //


def _u64(number: Column) -> Column:
    """A non-negative long as 8 big-endian bytes (Spark's cast of a long to binary)."""
    return number.cast("bigint").cast("binary")


def _concat_arrays(arrays: list[Column]) -> Column:
    """The arrays (null ones skipped) as one, in codegen (a lambda's `filter` is interpreted per row)."""
    return F.concat(*[F.coalesce(a, F.array().cast("array<string>")) for a in arrays])


def plan_debezium(spark: SparkSession, spec: DecoderSpec) -> DebeziumJvmPlan | str:
    """The JVM decoding of a Debezium table's events, or why they stay on Python."""
    if spec.data_format != "avro":
        return "JSON change events are unwrapped in Python"
    layout = tables.layout_of(spec)
    if layout.mode != "upsert":
        return "a changelog's events are unwrapped in Python"
    value = _subject(spark, spec, f"{spec.topic}-value")
    key = _subject(spark, spec, f"{spec.topic}-key")
    if isinstance(value, str) or isinstance(key, str):
        return f"change events are unwrapped in Python: {value if isinstance(value, str) else key}"
    try:
        columns, source, envelope = _covered(value.reader, key.reader, layout)
    except _Uncovered as why:
        return f"change events are unwrapped in Python: {why}"
    moved_type = next(f for f in layout.change_fields() if f.name == CHANGE_MOVED_FROM).dataType.json()
    placeholder = tables.placeholder_of(spec)
    return DebeziumJvmPlan(value, key, columns, tuple(layout.keys), placeholder, source, envelope, moved_type)


class _Uncovered(Exception):
    pass


def _subject(spark: SparkSession, spec: DecoderSpec, subject: str) -> AvroJvmPlan | str:
    """The subject's latest schema as the reader, and the ids registered with that very schema as the writers (their
    registry references, Apicurio's nested subjects, inlined: `from_avro` takes one self-contained schema)."""
    versions = subject_schemas(spec.registry, subject, MAX_WRITER_VERSIONS)
    if not versions:
        return f"subject {subject} has no Avro schema"
    client, fetched = registry_client(spec.registry), dict[tuple, Any]()  # each referenced version once per batch
    with registry_errors(spec.registry, subject):
        resolved = {i: _self_contained(client, fetched, json.loads(t), refs) for i, (t, refs) in versions.items()}
    reader = list(resolved.values())[-1]  # the newest version last
    if reader is None:
        return f"subject {subject}'s schema references types by names the JVM codec does not resolve"
    plan = AvroJvmPlan(reader, {i: json.dumps(r) for i, r in resolved.items() if r == reader})
    try:
        jvm_gateway(spark).org.apache.avro.Schema.Parser().parse(plan.reader_with_marker)
    except Exception:
        return f"Avro Java refuses subject {subject}'s schema"
    return plan


def _self_contained(client: Any, fetched: dict, schema: Any, references: list) -> Any:
    """`schema` with each referenced type defined where it is first used (by the reference's full name), or None
    when a reference is not used by that name."""
    defined: dict[str, Any] = {}
    for reference in references:
        key = (reference.subject, reference.version)
        if key not in fetched:
            registered = client.get_version(reference.subject, reference.version)
            text, nested = registered.schema.schema_str, list(registered.schema.references or [])
            fetched[key] = _self_contained(client, fetched, json.loads(text), nested)
        if fetched[key] is None:
            return None
        defined[reference.name] = fetched[key]
    used: set[str] = set()

    def inline(node: Any) -> Any:
        if isinstance(node, str) and node in defined and node not in used:
            used.add(node)
            return defined[node]
        if isinstance(node, list):
            return [inline(member) for member in node]
        if isinstance(node, dict):
            out = dict(node)
            for name in ("type", "items", "values"):
                if name in out:
                    out[name] = inline(out[name])
            if isinstance(out.get("fields"), list):
                out["fields"] = [{**f, "type": inline(f["type"])} for f in out["fields"]]
            return out
        return node

    result = inline(schema)
    return result if used == set(defined) else None


def _record(schema: Any, names: Names, namespace: str) -> tuple[dict, str]:
    branches = [b for b in schema if b != "null"] if isinstance(schema, list) else [schema]
    if len(branches) != 1:
        raise _Uncovered("a union of several types in the envelope")
    found, namespace, _ = names.resolve(branches[0], namespace)
    if not isinstance(found, dict) or found.get("type") != "record":
        raise _Uncovered("the envelope's before, after and source are not records")
    return found, namespace


def _covered(envelope: dict, key: dict, layout: tables.Layout) -> tuple[tuple[_Column, ...], frozenset, frozenset]:
    names = Names(_Uncovered)
    if envelope.get("type") != "record":
        raise _Uncovered("the envelope is not a record")
    namespace = envelope.get("namespace", "")
    fields = {f["name"]: f["type"] for f in envelope["fields"]}
    if not {"before", "after", "source", "op"} <= set(fields) or fields["op"] != "string":
        raise _Uncovered("not a Debezium envelope of before, after, source and op")
    before, _ = _record(fields["before"], names, namespace)
    after, after_ns = _record(fields["after"], names, namespace)
    source, _ = _record(fields["source"], names, namespace)
    if before is not after:
        raise _Uncovered("before and after are not the same record")
    source_fields = {f["name"]: f["type"] for f in source["fields"]}
    if not {"connector", "lsn", "sequence"} <= set(source_fields) or "file" in source_fields:
        raise _Uncovered("the source is not PostgreSQL's")
    table = {f.name: f.dataType for f in layout.after}
    avro_fields = [(f["name"], f["type"]) for f in after["fields"]]
    if [n for n, _ in avro_fields] != list(table):
        raise _Uncovered("the after record's fields are not the table's columns")
    columns = tuple(_column(n, t, table[n], names, after_ns) for n, t in avro_fields)
    key_fields = {f["name"]: f["type"] for f in key.get("fields", [])} if key.get("type") == "record" else {}
    if sorted(key_fields) != sorted(layout.keys) or not layout.keys:
        raise _Uncovered("the key's fields are not the table's key columns")
    for name in layout.keys:
        column = next(c for c in columns if c.name == name)
        if _column(name, key_fields[name], table[name], names, key.get("namespace", "")) != column:
            raise _Uncovered(f"key column {name} differs from the after column")
        if isinstance(table[name], (T.FloatType, T.DoubleType)):
            raise _Uncovered(f"key column {name} is a floating point number")
    return columns, frozenset(source_fields), frozenset(fields)


def _column(name: str, schema: Any, table_type: T.DataType, names: Names, namespace: str) -> _Column:
    branches = [b for b in schema if b != "null"] if isinstance(schema, list) else [schema]
    if len(branches) != 1:
        raise _Uncovered(f"column {name}: a union of several types")
    found, _, _ = names.resolve(branches[0], namespace)
    base = found if isinstance(found, str) else found.get("type")
    logical = None if isinstance(found, str) else found.get("logicalType")
    connect = None if isinstance(found, str) else found.get("connect.name")
    if logical == "decimal" and base == "bytes":
        precision, scale = found.get("precision"), found.get("scale", 0)
        if isinstance(precision, int) and table_type == T.DecimalType(precision, scale):
            return _Column(name, "decimal")
        raise _Uncovered(f"column {name}: a decimal of another precision than the table's")
    if logical is not None or not isinstance(base, str) or base not in _PLAIN:
        raise _Uncovered(f"column {name}: type {base if isinstance(base, str) else 'complex'} is not covered")
    if connect in types.DATE and base == "int" and table_type == T.DateType():
        return _Column(name, "date")
    if connect == types.ZONED_TIMESTAMP and base == "string" and table_type == T.TimestampType():
        return _Column(name, "zoned", placeholder="string")
    if connect in types.TIMESTAMP and base == "long" and table_type == T.TimestampNTZType():
        return _Column(name, "timestamp", types.TIMESTAMP[connect])
    normalized = types.from_avro(found, {})
    if types.converter(normalized) is not None or table_type != _PLAIN[base]:
        raise _Uncovered(f"column {name}: Connect type {connect or base} is not covered")
    return _Column(name, "plain", placeholder=base if base in ("string", "bytes") else None)
