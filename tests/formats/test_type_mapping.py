"""Avro types beyond the common ones, on both read paths, read back with pyiceberg and DuckDB field by field:
uuid on fixed(16), timestamp-nanos (truncated to microseconds), duration (a struct), a named fixed decimal used a
second time by name; and a decimal wider than Iceberg allows, refused as a config error naming the field."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal

import pytest

from icefloe.errors import ConfigError
from icefloe.formats.avro.mapping import avro_value_fields
from icefloe.materialize.batch import materialize_once
from support import as_utc, avro_serializer, produce, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
UTC = dt.UTC
MONEY = {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 2}
SCHEMA = {
    "type": "record",
    "name": "Trip",
    "namespace": "test.types",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "ref", "type": {"type": "fixed", "name": "Ref", "size": 16, "logicalType": "uuid"}},
        {"name": "at_ns", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {
            "name": "local_ns",
            "type": ["null", {"type": "long", "logicalType": "local-timestamp-nanos"}],
            "default": None,
        },
        {"name": "took", "type": {"type": "fixed", "name": "Took", "size": 12, "logicalType": "duration"}},
        {"name": "price", "type": MONEY},
        {"name": "tip", "type": ["null", "Money"], "default": None},
        {
            "name": "legs",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Leg",
                    "fields": [{"name": "ref", "type": "Ref"}, {"name": "fare", "type": "test.types.Money"}],
                },
            },
        },
    ],
}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


def duration(months: int, days: int, millis: int) -> bytes:
    return months.to_bytes(4, "little") + days.to_bytes(4, "little") + millis.to_bytes(4, "little")


# (value as written, the row expected in the table)
CASES = [
    (
        {
            "id": 1,
            "ref": uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF).bytes,
            "at_ns": 1_700_000_000_123_456_789,
            "local_ns": 86_400_000_000_001,
            "took": duration(1, 2, 3),
            "price": Decimal("1234.56"),
            "tip": Decimal("0.10"),
            "legs": [{"ref": bytes(16), "fare": Decimal("-7.00")}],
        },
        {
            "id": 1,
            "ref": "01234567-89ab-cdef-0123-456789abcdef",
            "at_ns": EPOCH + dt.timedelta(seconds=1_700_000_000, microseconds=123_456),
            "local_ns": dt.datetime(1970, 1, 2),
            "took": {"months": 1, "days": 2, "milliseconds": 3},
            "price": Decimal("1234.56"),
            "tip": Decimal("0.10"),
            "legs": [{"ref": "00000000-0000-0000-0000-000000000000", "fare": Decimal("-7.00")}],
        },
    ),
    (  # before the epoch: nanoseconds round down to the microsecond; duration parts are unsigned 32-bit
        {
            "id": 2,
            "ref": b"\xff" * 16,
            "at_ns": -1,
            "local_ns": None,
            "took": duration(2**32 - 1, 0, 2**31),
            "price": Decimal("-9999999999.99"),
            "tip": None,
            "legs": [],
        },
        {
            "id": 2,
            "ref": "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "at_ns": EPOCH - dt.timedelta(microseconds=1),
            "local_ns": None,
            "took": {"months": 2**32 - 1, "days": 0, "milliseconds": 2**31},
            "price": Decimal("-9999999999.99"),
            "tip": None,
            "legs": [],
        },
    ),
]


def test_uuid_nanos_duration_and_named_decimals_land_field_by_field(
    spark, broker, registry, state_dir, topic, make_config, read_path
):
    broker.create_topic(topic, 1)
    serialize = avro_serializer(registry.url, topic, json.dumps(SCHEMA))
    produce(broker.bootstrap_servers, topic, [{"value": serialize(value)} for value, _ in CASES])
    config = make_config({"topic": topic})

    result = materialize_once(spark, config, config.tables[0])

    assert result.read_path == read_path and result.rows_written == len(CASES) and result.records_failed == 0
    names = [f["name"] for f in SCHEMA["fields"]]
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        got = sorted(({name: as_utc(row[name]) for name in names} for row in rows), key=lambda r: r["id"])
        assert got == [expected for _, expected in CASES]


def test_a_decimal_wider_than_iceberg_allows_is_a_config_error_naming_the_field(
    spark, broker, registry, topic, make_config
):
    wide = {
        "type": "record",
        "name": "W",
        "fields": [
            {
                "name": "inner",
                "type": {
                    "type": "record",
                    "name": "I",
                    "fields": [
                        {
                            "name": "huge",
                            "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2},
                        }
                    ],
                },
            }
        ],
    }
    with pytest.raises(ConfigError, match=r"inner\.huge: decimal precision 40 .* at most 38"):
        avro_value_fields(json.dumps(wide), "subject w-value")
    broker.create_topic(topic, 1)
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": avro_serializer(registry.url, topic, json.dumps(wide))({"inner": {"huge": Decimal("1.00")}})}],
    )
    config = make_config({"topic": topic})
    with pytest.raises(ConfigError, match=r"inner\.huge: decimal precision 40"):
        materialize_once(spark, config, config.tables[0])
