"""`format: raw` (value -> binary) and `format: string` (value -> UTF-8 string), read on the JVM path, row for row
what the Python path gives, read back with pyiceberg and DuckDB."""

from __future__ import annotations

import pytest

from icefloe.errors import ConfigError
from icefloe.formats.base import DecoderSpec
from icefloe.formats.raw import value_fields
from icefloe.formats.registry import build_key_decoder
from icefloe.materialize.read_paths import JVM
from icefloe.operate.runner import run_table
from icefloe.spec import parse_config
from support import by_position, produce, read_duckdb, read_pyiceberg
from test_jvm_path import rows_on_both_paths

TEXT = [b"plain", b"", "ñandú €".encode(), b"\x00 nul", b"x" * 5000, None]
INVALID_UTF8 = [b"\xff\xfe", b"abc\xc3", b"\xed\xa0\x80 surrogate", b"\x00\xff\xfe\xfd framed-looking"]


def _cluster() -> dict:
    return {"name": "c", "bootstrapServers": "b:9092"}


@pytest.mark.parametrize(
    "table, message",
    [
        ({"format": "raw", "schema": {"fields": [{"name": "a", "type": "long"}]}}, "takes no schema"),
        ({"format": "string", "mode": "upsert", "key": ["value"]}, "upsert keys on the Kafka key"),
        ({"format": "raw", "partitionBy": ["day(at)"]}, "unknown field 'at'"),
    ],
)
def test_raw_spec_mistakes_are_named(table, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"sourceClusters": [_cluster()], "tables": [{"sourceCluster": "c", "topic": "t", **table}]})


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("format", ["raw", "string"])
def test_raw_and_string_values_end_to_end(spark, broker, state_dir, topic, make_config, format):
    topic = f"{topic}_{format}"
    broker.create_topic(topic, 2)
    values, bad = (TEXT + INVALID_UTF8, []) if format == "raw" else (TEXT, INVALID_UTF8)
    records = [
        {"key": b"k%d" % i, "value": v, "partition": i % 2, "headers": [("h", b"%d" % i)]}
        for i, v in enumerate(values + bad)
    ]
    positions = produce(broker.bootstrap_servers, topic, records)
    config = make_config({"topic": topic, "format": format, "errors": "skip", "partitionBy": ["bucket(4, value)"]})
    table = config.tables[0]

    path, _, jvm_rows, python_rows = rows_on_both_paths(spark, config, value_fields(format))
    assert path.name == JVM
    assert jvm_rows == python_rows and len(python_rows) == len(records)
    failed = {p: r for p, r in python_rows.items() if r["icefloe_error_class"]}
    assert set(failed) == set(positions[len(values) :])
    assert all(
        r["icefloe_error_class"] == "DecodeError" and "not valid UTF-8" in r["icefloe_error_message"]
        for r in failed.values()
    )

    result = run_table(spark, config, table, state_dir)
    assert result.read_path == JVM and result.rows_written == len(values) and result.records_failed == len(bad)
    expected = {p: (v if format == "raw" or v is None else v.decode()) for p, v in zip(positions, values)}
    rows = by_position(read_pyiceberg(state_dir, result.identifier))
    assert {p: r["value"] for p, r in rows.items()} == expected
    assert all(r["kafka_key"] == records[positions.index(p)]["key"] for p, r in rows.items())
    assert all(r["kafka_headers"] == [{"key": "h", "value": b"%d" % positions.index(p)}] for p, r in rows.items())
    duck = by_position(read_duckdb(result.metadata_location))
    assert {p: r["value"] for p, r in duck.items()} == expected


def test_key_formats_raw_and_string_give_the_one_key_field():
    raw = build_key_decoder(DecoderSpec("json", "inline", "t", key_fields=("id",), key_format="raw"))
    assert raw(b"\xff\x00") == {"id": b"\xff\x00"}
    text = build_key_decoder(DecoderSpec("json", "inline", "t", key_fields=("id",), key_format="string"))
    assert text("ñ".encode()) == {"id": "ñ"}
    with pytest.raises(ValueError, match="key is not valid UTF-8"):
        text(b"\xff")
    with pytest.raises(ConfigError, match="keyFormat raw can only give one key field"):
        build_key_decoder(DecoderSpec("json", "inline", "t", key_fields=("a", "b"), key_format="raw"))
