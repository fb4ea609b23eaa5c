"""Debezium's semantic types to table types and values (pure logic: the Connect schemas as both converters write
them), and the source positions' order."""

import base64
import datetime as dt
import json
from decimal import Decimal

import pytest
from pyspark.sql import types as T

from icefloe.errors import ConfigError
from icefloe.formats.debezium import types
from icefloe.formats.debezium.envelope import position

CASES = [  # (Connect JSON schema, raw value as the JsonConverter writes it, table type, table value)
    ({"type": "int32", "name": "io.debezium.time.Date"}, 19000, T.DateType(), dt.date(2022, 1, 8)),
    ({"type": "int32", "name": "io.debezium.time.Time"}, 3_600_123, T.LongType(), 3_600_123_000),
    ({"type": "int64", "name": "io.debezium.time.MicroTime"}, 3_600_000_001, T.LongType(), 3_600_000_001),
    ({"type": "int64", "name": "io.debezium.time.NanoTime"}, 3_600_000_001_999, T.LongType(), 3_600_000_001),
    (
        {"type": "int64", "name": "io.debezium.time.Timestamp"},
        1_700_000_000_123,
        T.TimestampNTZType(),
        dt.datetime(2023, 11, 14, 22, 13, 20, 123000),
    ),
    (
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        -1,
        T.TimestampNTZType(),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    ),
    (
        {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        -1,
        T.TimestampNTZType(),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    ),  # truncated (floor), also before 1970
    (
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        "2024-02-29T12:00:00.5Z",
        T.TimestampType(),
        "2024-02-29T12:00:00.5Z",
    ),  # the table's converter parses the ISO text
    ({"type": "string", "name": "io.debezium.time.ZonedTime"}, "12:00:00Z", T.StringType(), "12:00:00Z"),
    # time.precision.mode=isostring: ISO-8601 text, always at UTC ("Z"); the date and clock are the database's
    ({"type": "string", "name": "io.debezium.time.IsoDate"}, "2017-09-15Z", T.DateType(), dt.date(2017, 9, 15)),
    ({"type": "string", "name": "io.debezium.time.IsoTime"}, "04:05:11.789Z", T.LongType(), 14_711_789_000),
    ({"type": "string", "name": "io.debezium.time.IsoTime"}, "23:59:59.999999Z", T.LongType(), 86_399_999_999),
    ({"type": "string", "name": "io.debezium.time.IsoTime"}, "00:00:00.123456789Z", T.LongType(), 123_456),
    (
        {"type": "string", "name": "io.debezium.time.IsoTimestamp"},
        "2019-07-09T02:28:57Z",
        T.TimestampNTZType(),
        dt.datetime(2019, 7, 9, 2, 28, 57),
    ),
    (
        {"type": "string", "name": "io.debezium.time.IsoTimestamp"},
        "2019-07-09T02:28:57.1Z",
        T.TimestampNTZType(),
        dt.datetime(2019, 7, 9, 2, 28, 57, 100000),
    ),
    (
        {"type": "string", "name": "io.debezium.time.IsoTimestamp"},
        "1969-12-31T23:59:59.999999999Z",
        T.TimestampNTZType(),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    ),  # nanoseconds (MySQL, other JDBC sources) truncated
    (
        {"type": "array", "items": {"type": "string", "optional": True, "name": "io.debezium.time.IsoTime"}},
        ["02:59:59.999999Z", None],
        T.ArrayType(T.LongType()),
        [10_799_999_999, None],
    ),  # PostgreSQL time[]
    (
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "12"},
        },
        "MBE=",
        T.DecimalType(12, 2),
        Decimal("123.05"),
    ),
    (
        {
            "type": "struct",
            "name": "io.debezium.data.VariableScaleDecimal",
            "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}],
        },
        {"scale": 3, "value": "MDk="},
        types.VARIABLE_SCALE,
        Decimal("12.345"),
    ),
    ({"type": "double"}, 1.5, T.DoubleType(), 1.5),  # decimal.handling.mode=double
    ({"type": "string"}, "123.45", T.StringType(), "123.45"),  # decimal.handling.mode=string
    ({"type": "string", "name": "io.debezium.data.Json"}, '{"a": 1}', T.StringType(), '{"a": 1}'),
    (
        {"type": "string", "name": "io.debezium.data.Uuid"},
        "0b5b4c1e-0000-4000-8000-000000000001",
        T.StringType(),
        "0b5b4c1e-0000-4000-8000-000000000001",
    ),
    ({"type": "string", "name": "io.debezium.data.Enum", "parameters": {"allowed": "a,b"}}, "a", T.StringType(), "a"),
    (
        {"type": "array", "items": {"type": "string", "optional": True}},
        ["x", None],
        T.ArrayType(T.StringType()),
        ["x", None],
    ),
    (
        {"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}},
        [0],
        T.ArrayType(T.DateType()),
        [dt.date(1970, 1, 1)],
    ),
    (
        {
            "type": "struct",
            "name": "io.debezium.data.geometry.Geometry",
            "fields": [{"type": "bytes", "field": "wkb"}, {"type": "int32", "field": "srid"}],
        },
        {"wkb": "AQEAAAAAAAAAAADwPwAAAAAAAABA", "srid": None},
        T.BinaryType(),
        bytes.fromhex("0101000000000000000000f03f0000000000000040"),
    ),
    ({"type": "int16"}, 7, T.IntegerType(), 7),
    ({"type": "float"}, 1.5, T.FloatType(), 1.5),
]


@pytest.mark.parametrize(("schema", "raw", "table_type", "value"), CASES)
def test_semantic_types_map_to_table_types_and_values(schema, raw, table_type, value):
    connect = types.from_json(schema)
    assert types.spark_type(connect, "col") == table_type
    convert = types.converter(connect)
    assert (convert(raw) if convert else raw) == value


def test_avro_with_connect_names_maps_the_same():
    """Avro as the converters write it: `connect.name` on the type, decimals as Avro decimals."""
    date = {"type": "int", "connect.name": "io.debezium.time.Date", "connect.version": 1}
    decimal = {
        "type": "bytes",
        "logicalType": "decimal",
        "precision": 12,
        "scale": 2,
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
    }
    zoned = {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}

    def iso(name: str) -> list:  # time.precision.mode=isostring
        return ["null", {"type": "string", "connect.version": 1, "connect.name": f"io.debezium.time.{name}"}]

    record = {
        "type": "record",
        "name": "Value",
        "fields": [
            {"name": "d", "type": ["null", date]},
            {"name": "n", "type": ["null", decimal]},
            {"name": "z", "type": zoned},
            {"name": "id", "type": iso("IsoDate")},
            {"name": "it", "type": iso("IsoTime")},
            {"name": "its", "type": iso("IsoTimestamp")},
        ],
    }
    connect = types.from_avro(record, {})
    assert types.spark_type(connect, "v") == T.StructType(
        [
            T.StructField("d", T.DateType()),
            T.StructField("n", T.DecimalType(12, 2)),
            T.StructField("z", T.TimestampType()),
            T.StructField("id", T.DateType()),
            T.StructField("it", T.LongType()),
            T.StructField("its", T.TimestampNTZType()),
        ]
    )
    convert = types.converter(connect)
    raw = {
        "d": 1,
        "n": Decimal("1.05"),
        "z": "x",
        "id": "2017-09-15Z",
        "it": "00:00:01Z",
        "its": "2019-07-09T02:28:57Z",
    }
    assert convert(raw) == {
        "d": dt.date(1970, 1, 2),
        "n": Decimal("1.05"),
        "z": "x",
        "id": dt.date(2017, 9, 15),
        "it": 1_000_000,
        "its": dt.datetime(2019, 7, 9, 2, 28, 57),
    }


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("io.debezium.time.IsoTimestamp", "+294247-01-10T04:00:25.2Z"),  # PostgreSQL 'infinity'
        ("io.debezium.time.IsoTimestamp", "-290308-12-21T19:59:27.6Z"),  # '-infinity'
        ("io.debezium.time.IsoTimestamp", "2019-07-09 02:28:57Z"),
        ("io.debezium.time.IsoTimestamp", "2019-07-09T02:28:57+01:00"),  # not at UTC: nothing guesses the clock
        ("io.debezium.time.IsoDate", "+5877611-06-21Z"),  # 'infinity'
        ("io.debezium.time.IsoDate", "-0043-03-15Z"),  # 44 BC: before year 1
        ("io.debezium.time.IsoDate", "2019-02-29Z"),
        ("io.debezium.time.IsoTime", "24:00:01Z"),
        ("io.debezium.time.IsoTime", "12:60:00Z"),
        ("io.debezium.time.IsoTime", 3_600_000_000),
    ],
)
def test_iso_strings_outside_the_table_types_are_bad_values(name, raw):
    """What no date, time or timestamp column holds is a ValueError (a bad record), never quoting the value."""
    convert = types.converter(types.from_json({"type": "string", "name": name}))
    with pytest.raises(ValueError) as caught:
        convert(raw)
    assert str(raw) not in str(caught.value)


def test_decimals_wider_than_iceberg_are_a_config_error():
    schema = {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "50"},
    }
    with pytest.raises(ConfigError, match="decimal precision 50 is too wide"):
        types.spark_type(types.from_json(schema), "balance")


def test_source_positions_order_as_the_source_does():
    def pg(last, lsn):
        return position({"connector": "postgresql", "lsn": lsn, "sequence": json.dumps([last, str(lsn)])})

    snapshot, first_streamed, later = pg(None, 100), pg(None, 150), pg("160", 140)  # interleaved txns: commit order
    assert snapshot < first_streamed < later
    assert pg("160", 140) == pg("160", 140)  # a replay is the same change
    assert position({"connector": "postgresql", "lsn": 5}) < position({"connector": "postgresql", "lsn": 6})
    mysql = [
        position({"connector": "mysql", "file": f, "pos": p, "row": r})
        for f, p, r in [("bin.000002", 900, 0), ("bin.000010", 4, 0), ("bin.000010", 4, 1)]
    ]
    assert mysql == sorted(mysql)
    assert position({"connector": "sqlserver", "change_lsn": "x"}) is None  # Kafka order decides


@pytest.mark.parametrize("wrapped", [True, False])
def test_the_placeholder_of_an_unchanged_bytea_is_recognized_in_json(wrapped):
    """An unchanged TOASTed `bytea` arrives as the placeholder's bytes, which the JsonConverter writes as base64
    text (with or without its schema): the column is left unchanged, never overwritten with the placeholder."""
    from icefloe.batch_columns import CHANGE_UNCHANGED
    from icefloe.formats.debezium.envelope import ChangeDecoder
    from icefloe.formats.debezium.tables import parse_json

    placeholder = "__debezium_unavailable_value"
    plan = {"mode": "upsert", "keys": ["id"], "columns": ["id", "data"], "placeholder": placeholder, "connect": None}
    decoder = ChangeDecoder(plan, parse_json, lambda data: parse_json(data)[0])
    after = {"id": 1, "data": base64.b64encode(placeholder.encode()).decode()}
    payload = {"before": None, "after": after, "op": "u", "source": {"connector": "postgresql", "lsn": 10}}
    row_schema = {"type": "struct", "fields": [{"field": "id", "type": "int32"}, {"field": "data", "type": "bytes"}]}
    schema = {
        "type": "struct",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "string", "field": "op"},
        ],
    }
    value = {"schema": schema, "payload": payload} if wrapped else payload
    row = decoder(json.dumps(value).encode(), json.dumps({"id": 1}).encode(), None)
    assert "data" not in row and row[CHANGE_UNCHANGED] == ["data"]
    after["data"] = base64.b64encode(b"\x00\x01").decode()  # any other value is the column's
    row = decoder(json.dumps(value).encode(), json.dumps({"id": 1}).encode(), None)
    assert row["data"] == after["data"] and row[CHANGE_UNCHANGED] is None  # the table's converter decodes it
