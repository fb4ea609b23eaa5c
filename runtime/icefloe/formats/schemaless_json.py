"""Schemaless JSON (`format: json` without `schema`): the table's columns inferred from the records of each batch.

Before a batch is read, the types of its planned records are inferred (by Spark tasks, one per range, each gives
the types it saw, or by the driver where they are few; the driver unifies them); the table then evolves
(`IcebergTable.evolve`) and the batch is read and converted against the evolved table as an inline-schema JSON
table would be: on the JVM path (`json_jvm`, each record proven by its re-encoding) where the columns' types allow,
else in Python. Only records the table's current columns do not already explain are inferred in Python: a JVM pass
first finds them (`unexplained_ranges`: a record `json_jvm` decodes exactly with the current columns has every key
a column, each value of its column's type, so it adds and widens nothing), and the ranges holding them are
inferred; a new table's first batch stands each partition's first records in for the table's columns. An append
table with columns skips that pass: the streamed write checks each record against the columns, and only what it
leaves to Python is inferred (`plain_json`, `BatchColumns.explains`).

Within a batch (docs/formats.md, "Schemaless JSON"):
  - each key of the top-level object is a column, in first-seen order; nested objects are structs (keys merged),
    arrays are lists (elements merged);
  - true/false -> boolean; integers -> int, long when one does not fit 32 bits; numbers with a fraction or an
    exponent -> double; integers and fractions together -> double; strings -> string;
  - anything else together (a string and a number, an object and a list, an integer beyond 64 bits) -> string,
    which keeps every value: strings as they are, anything else as its JSON text;
  - a key only ever null has no column yet (a null loses nothing); an array only ever empty is a list of strings,
    an object only ever empty a string (its JSON text).
Against the table's existing columns (a later batch):
  - new keys add columns (new nested keys add nested fields, in structs and in lists of structs);
  - int -> long widens the column (an Iceberg promotion);
  - otherwise the column keeps its type: in a string column any value is kept as its JSON text; a value that does
    not fit another column (a fraction in a long column, text in a double column, a list in a struct column) is a
    bad record naming the field. No value is dropped silently: a key with no column is a bad record too (a key
    differing from a column only in case, containing `.` or a backtick, or clashing with a Kafka column).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from icefloe.batch_columns import KAFKA_COLUMNS, UPSERT_COLUMNS
from icefloe.errors import BadRecord
from icefloe.formats.json import json_object

# Inferred types: "null", "boolean", "int", "long", "double", "string", {"list": t}, {"struct": [[name, t], ...]}
Inferred = Any
_INT32, _INT64 = 2**31, 2**63
_NUMBERS = ("int", "long", "double")
_PLAIN = {str: "string", float: "double", bool: "boolean", type(None): "null"}  # `signature`s of types with one
_MAX_SIGNATURES = 10_000  # per range: records of ever new shapes are each inferred, without a growing memory


def infer(value: Any) -> Inferred:
    """The type of one decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int" if -_INT32 <= value < _INT32 else "long" if -_INT64 <= value < _INT64 else "string"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        element: Inferred = "null"
        for item in value:
            element = unify(element, infer(item))
        return {"list": element}
    fields: dict[str, Inferred] = {}
    for key, item in value.items():
        if usable_key(key):
            fields[key] = unify(fields.get(key, "null"), infer(item))
    return {"struct": [[k, t] for k, t in fields.items()]}


def signature(value: Any) -> Any:
    """A hashable summary of a decoded JSON value that determines `infer(value)` (equal signatures, equal types),
    and is cheaper to make: a batch's records mostly repeat a few shapes, which are then inferred once each (`unify`
    with a type already taken in changes nothing). A list's elements appear once per distinct signature."""
    kind = type(value)
    if kind is str:
        return "string"
    if kind is dict:
        return ("struct", *[(key, _PLAIN.get(type(item)) or signature(item)) for key, item in value.items()])
    if kind is int:
        return "int" if -_INT32 <= value < _INT32 else "long" if -_INT64 <= value < _INT64 else "string"
    if kind is float:
        return "double"
    if kind is bool:
        return "boolean"
    if value is None:
        return "null"
    return ("list", *dict.fromkeys(signature(item) for item in value))


def usable_key(key: str) -> bool:
    return bool(key) and "." not in key and "`" not in key


def _family(kind: Inferred) -> str:
    if isinstance(kind, dict):
        return "list" if "list" in kind else "struct"
    return "number" if kind in _NUMBERS else kind


def _families(kind: Inferred) -> dict[str, Inferred]:
    if isinstance(kind, dict) and "either" in kind:
        return dict(kind["either"])
    return {} if kind == "null" else {_family(kind): kind}


def unify(a: Inferred, b: Inferred) -> Inferred:
    """The type holding values of both types, within a batch. Types of different kinds give {"either": {family:
    type}}: a string column when the key is new, and each kind kept, so an existing column evolves with its own."""
    families = _families(a)
    for family, kind in _families(b).items():
        families[family] = _unify_same(families[family], kind) if family in families else kind
    if not families:
        return "null"
    if len(families) == 1:
        return next(iter(families.values()))
    return {"either": families}


def _unify_same(a: Inferred, b: Inferred) -> Inferred:
    if a == b:
        return a
    if a in _NUMBERS:
        return _NUMBERS[max(_NUMBERS.index(a), _NUMBERS.index(b))]
    if "list" in a:
        return {"list": unify(a["list"], b["list"])}
    fields = {k.lower(): [k, t] for k, t in a["struct"]}
    for key, kind in b["struct"]:
        if key.lower() not in fields:
            fields[key.lower()] = [key, kind]
        elif fields[key.lower()][0] == key:  # keys differing only in case: the first seen has the column
            fields[key.lower()][1] = unify(fields[key.lower()][1], kind)
    return {"struct": list(fields.values())}


def spark_type(kind: Inferred):
    """The Spark type of an inferred type (None for "null": no column yet)."""
    from pyspark.sql import types as T

    if kind == "null":
        return None
    if isinstance(kind, str):
        return {
            "boolean": T.BooleanType(),
            "int": T.IntegerType(),
            "long": T.LongType(),
            "double": T.DoubleType(),
            "string": T.StringType(),
        }[kind]
    if "either" in kind:
        return T.StringType()
    if "list" in kind:
        return T.ArrayType(spark_type(kind["list"]) or T.StringType(), True)
    fields = [T.StructField(k, spark_type(t), True) for k, t in kind["struct"] if t != "null"]
    return T.StructType(fields) if fields else T.StringType()


def evolved(current, batch: Inferred):
    """The column type after a batch: `current` (Spark; None: no column yet) evolved with the batch's values of
    the same kind (`batch`, inferred)."""
    from pyspark.sql import types as T

    if current is None:
        return spark_type(batch)
    family = {T.StructType: "struct", T.ArrayType: "list", T.IntegerType: "number"}.get(type(current))
    same = _families(batch).get(family) if family else None
    if isinstance(current, T.IntegerType) and same == "long":
        return T.LongType()
    if isinstance(current, T.StructType) and same is not None and same["struct"]:
        have = {f.name.lower() for f in current.fields}
        kinds = dict(same["struct"])
        fields = [T.StructField(f.name, evolved(f.dataType, kinds.get(f.name, "null")), True) for f in current.fields]
        fields += [
            T.StructField(k, spark_type(t), True) for k, t in same["struct"] if k.lower() not in have and t != "null"
        ]
        return T.StructType(fields)
    if isinstance(current, T.ArrayType) and same is not None:
        return T.ArrayType(
            evolved(current.elementType, same["list"]) if same["list"] != "null" else current.elementType, True
        )
    return current


def value_struct(current_fields: list, batch: Inferred):
    """The table's value columns after a batch: the current ones (evolved) and the batch's new keys."""
    from pyspark.sql import types as T

    current = T.StructType([f for f in current_fields if f.name not in KAFKA_COLUMNS and f.name not in UPSERT_COLUMNS])
    objects = _families(batch).get("struct")
    if objects is None:
        return current
    clashing = {name.lower() for name in (*KAFKA_COLUMNS, *UPSERT_COLUMNS)}
    objects = {"struct": [[k, t] for k, t in objects["struct"] if k.lower() not in clashing]}
    return evolved(current, objects)


# --- executors -------------------------------------------------------------------------------------------------


def unified(values: Iterable[Any]) -> Inferred:
    """The unified type of decoded JSON values (`unify` of each one's `infer`), each distinct `signature` inferred
    once: unifying a type already taken in changes nothing."""
    kind: Inferred = "null"
    seen: set = set()
    for value in values:
        shape = signature(value)
        if shape in seen:
            continue
        if len(seen) < _MAX_SIGNATURES:
            seen.add(shape)
        kind = unify(kind, infer(value))
    return kind


def _objects(kafka_conf: dict, max_record_bytes: int, task) -> Iterator[dict]:
    """The JSON objects of the planned range `task` (OffsetRange); undecodable values are left to the read, which
    makes them bad records."""
    from icefloe.source.kafka import read_range

    for msg in read_range(kafka_conf, task):
        value = msg.value()
        if value is None or len(value) > max_record_bytes:
            continue
        try:
            yield json_object(value)
        except BadRecord:
            continue


def infer_ranges(kafka_conf: dict, max_record_bytes: int, tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function: the unified type of the JSON objects in each planned range."""
    from icefloe.source.kafka import OffsetRange

    for task_batch in tasks:
        for task in task_batch.to_pylist():
            planned = OffsetRange(task["topic"], task["partition"], task["start"], task["end"])
            kind = unified(_objects(kafka_conf, max_record_bytes, planned))
            yield pa.RecordBatch.from_pylist([{"type": json.dumps(kind)}], schema=pa.schema([("type", pa.string())]))


def decoder(struct_json: str) -> Callable[[bytes], Any]:
    """Decodes a JSON object and shapes it for the table's value struct: non-strings in string columns become
    their JSON text; a key with no column, or an integer a double column cannot hold exactly, is an error."""
    from pyspark.sql import types as T

    shape = _shaper(T.StructType.fromJson(json.loads(struct_json)), "")
    return lambda data: shape(json_object(data))


def _shaper(dtype, path: str) -> Callable[[Any], Any]:
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return lambda v: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    if isinstance(dtype, T.DoubleType):

        def double(v: Any) -> Any:
            if isinstance(v, int) and not isinstance(v, bool) and float(v) != v:
                raise BadRecord(f"{path}: an integer that cannot be held exactly by the double column")  # no value
            return v

        return double
    if isinstance(dtype, T.ArrayType):
        element = _shaper(dtype.elementType, f"{path}[]")
        return lambda v: [None if x is None else element(x) for x in v] if isinstance(v, list) else v
    if isinstance(dtype, T.StructType):
        fields = {f.name: _shaper(f.dataType, f"{path}.{f.name}".lstrip(".")) for f in dtype.fields}

        def struct(v: Any) -> Any:
            if not isinstance(v, dict):
                return v  # the converter names the mismatch
            out = {}
            for key, item in v.items():
                if item is None:
                    continue
                if key not in fields:
                    raise BadRecord(f"{f'{path}.{key}'.lstrip('.')}: the table has no column for this key")
                out[key] = fields[key](item)
            return out

        return struct
    return lambda v: v


def infer_batch(spark, kafka_conf: dict, tasks: list, max_record_bytes: int) -> Inferred:
    """The unified type of the JSON objects in the planned ranges `tasks` (OffsetRange), read once by Spark tasks,
    one per range."""
    from functools import partial, reduce

    rows = [(t.topic, t.partition, t.start, t.end) for t in tasks]
    frame = spark.createDataFrame(
        spark.sparkContext.parallelize(rows, max(1, len(rows))),
        "topic string, partition int, start long, end long",
    )
    kinds = frame.mapInArrow(partial(infer_ranges, kafka_conf, max_record_bytes), "type string").collect()
    return reduce(unify, (json.loads(row.type) for row in kinds), "null")


def infer_here(kafka_conf: dict, tasks: list, max_record_bytes: int) -> Inferred:
    """The unified type of the JSON objects in the planned ranges `tasks` (OffsetRange), read by this process, the
    driver: for a few thousand records (a new table's sample, `first_records`), where a Spark task would start a
    Python worker that costs more than reading them (about a second of a first batch: docs/benchmarks.md)."""
    return unified(item for task in tasks for item in _objects(kafka_conf, max_record_bytes, task))


def first_records(tasks: list, records: int) -> list:
    """The first `records` records of each partition of the planned ranges `tasks` (OffsetRange, a partition's
    contiguous)."""
    from dataclasses import replace

    firsts: dict[int, Any] = {}
    for task in tasks:
        firsts.setdefault(task.partition, task)
    return [replace(task, end=min(task.end, task.start + records)) for task in firsts.values()]


def unexplained_ranges(spark, codec, batch) -> list:
    """The ranges (one per partition, from the first to the last such record) holding every record of the batch
    (`BatchContext`) that `codec` (`json_jvm.schemaless_codec` of the table's current columns) does not decode
    exactly: only those can add or widen a column. Tombstones and records over the size limit are not inferred."""
    from pyspark.sql import functions as F

    from icefloe.source.kafka import OffsetRange
    from icefloe.source.spark_kafka import read_ranges

    spans: dict[int, OffsetRange] = {}
    for task in batch.tasks:  # a partition's tasks are contiguous
        span = spans.get(task.partition)
        spans[task.partition] = task if span is None else OffsetRange(task.topic, task.partition, span.start, task.end)
    value = F.col("value")
    frame = read_ranges(spark, batch.kafka_conf, list(spans.values()), len(batch.tasks))
    frame = frame.select("kafka_partition", "kafka_offset", value, codec.decoded(value).alias("decoded"))
    explained = value.isNull() | (F.length(value) > batch.max_record_bytes) | codec.exact(value, "decoded")
    bounds = (
        frame.where(~F.coalesce(explained, F.lit(False)))
        .groupBy("kafka_partition")
        .agg(F.min("kafka_offset").alias("first"), F.max("kafka_offset").alias("last"))
        .collect()
    )
    topic = batch.tasks[0].topic
    return [
        OffsetRange(topic, r["kafka_partition"], r["first"], r["last"] + 1) for r in sorted(bounds, key=lambda r: r[0])
    ]
