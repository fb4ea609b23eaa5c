"""A catalogue of poison records, each checked in every error mode (fail, skip, dlq).

Every poison sits in its own partition between two good records. skip and dlq must commit every good record and
account for every bad one (dlq: exactly once in the dead-letter table, with its raw bytes and error class); fail
must stop with the poison named and commit exactly the good record before it in each partition.
"""

from __future__ import annotations

import json
import struct
from decimal import Decimal

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from icefloe.errors import RecordError, SourceError
from icefloe.materialize.batch import materialize_once
from icefloe.materialize.read_paths import PYTHON
from icefloe.operate import runner
from icefloe.registries import confluent
from icefloe.table.iceberg import IcebergTable
from support import avro_serializer, by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]

AVRO_SCHEMA = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "payer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
JSON_SCHEMA = {
    "fields": [
        {"name": "id", "type": "long", "optional": False},
        {"name": "small", "type": "int"},
        {"name": "price", "type": "decimal(5,2)"},
        {"name": "ratio", "type": "double"},
        {"name": "at", "type": "timestamptz"},
        {"name": "day", "type": "date"},
        {"name": "blob", "type": "binary"},
        {"name": "tags", "type": "list", "element": {"type": "long"}},
        {"name": "owner", "type": "struct", "fields": [{"name": "name", "type": "string", "optional": False}]},
    ]
}
MAX_BYTES = 4096
NANOS_TIMESTAMP = 1_700_000_000_000_000_000  # a producer that set nanoseconds where Kafka wants milliseconds


def payment(i: int, at: int = 1_700_000_000_000) -> dict:
    return {"id": i, "payer": f"p{i}", "amount": Decimal("3.10"), "at": at}


def avro_poisons(registry_url: str, topic: str) -> list[tuple[str, str, bytes | None, bytes]]:
    """(name, expected error class(es), key, value) for an Avro topic read through the registry."""
    good = avro_serializer(registry_url, topic, json.dumps(AVRO_SCHEMA))
    sample = good({"id": 1, "payer": "ann", "amount": Decimal("12.50"), "at": 0})
    framed = sample[:5]  # magic byte + schema id
    other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "boolean"}]}
    other_id = SchemaRegistryClient({"url": registry_url}).register_schema(
        f"{topic}-other-value", Schema(json.dumps(other), "AVRO")
    )
    wide_schema = {
        **AVRO_SCHEMA,
        "fields": [
            {**f, "type": {**f["type"], "precision": 20}} if f["name"] == "amount" else f for f in AVRO_SCHEMA["fields"]
        ],
    }
    wide = avro_serializer(registry_url, f"{topic}-wide", json.dumps(wide_schema))
    return [
        ("wrong magic byte", "DecodeError", b"k", b"\x01" + sample[1:]),
        ("unknown schema id", "DecodeError", b"k", b"\x00" + struct.pack(">I", 987654) + sample[5:]),
        ("truncated avro", "DecodeError", b"k", sample[:8]),
        ("written with another schema", "DecodeError", b"k", b"\x00" + struct.pack(">I", other_id) + b"\x01"),
        ("empty value", "DecodeError", b"k", b""),
        ("framing only", "DecodeError", b"k", framed),
        # id=1 (zigzag 0x02), then a 2-byte string (0x04) that is not UTF-8, then the rest of the sample after "ann"
        ("invalid utf-8 in string", "DecodeError", b"k", framed + b"\x02\x04\xff\xfe" + sample[10:]),
        ("oversized record", "RecordTooLarge", b"k", framed + b"\x00" * (MAX_BYTES + 1)),
        (
            "decimal beyond precision",
            "DecodeError|ConversionError",
            b"k",
            wide({"id": 2, "payer": "bob", "amount": Decimal("1234567890.12"), "at": 0}),
        ),
        # `at` is the last field and 0 encodes as one byte: replace it by a timestamp far past year 9999
        ("timestamp out of range", "DecodeError", b"k", sample[:-1] + _zigzag(2**62)),
        ("kafka timestamp in nanoseconds", "InvalidTimestamp", b"k", sample, NANOS_TIMESTAMP),
        ("kafka timestamp in microseconds", "InvalidTimestamp", b"k", sample, NANOS_TIMESTAMP // 1000),  # year 55,840
    ]


def _zigzag(number: int) -> bytes:
    encoded, out = (number << 1) ^ (number >> 63), bytearray()
    while encoded > 0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def json_poisons() -> list[tuple[str, str, bytes | None, bytes | None]]:
    ok = {
        "id": 1,
        "small": 2,
        "price": "1.25",
        "ratio": 0.5,
        "at": "2024-01-01T00:00:00Z",
        "day": "2024-01-01",
        "blob": "aGVsbG8=",
        "tags": [1, 2],
        "owner": {"name": "ann"},
    }

    def with_(**changes) -> bytes:
        return json.dumps({**ok, **changes}).encode()

    return [
        ("not an object", "DecodeError", b"k1", b"[1, 2, 3]"),
        ("invalid json", "DecodeError", b"k2", b'{"id": 1,'),
        ("invalid utf-8", "DecodeError", b"k3", b'{"id": "\xff"}'),
        ("NaN token", "DecodeError", b"k4", b'{"id": 1, "ratio": NaN}'),
        ("Infinity token", "DecodeError", b"k5", b'{"id": 1, "ratio": -Infinity}'),
        ("wrong type", "ConversionError", b"k6", with_(id="seven")),
        (
            "missing required field",
            "ConversionError",
            b"k7",
            json.dumps({k: v for k, v in ok.items() if k != "id"}).encode(),
        ),
        ("missing required nested field", "ConversionError", b"k8", with_(owner={})),
        ("int out of range", "ConversionError", b"k9", with_(small=2**40)),
        ("decimal beyond precision", "ConversionError", b"k10", with_(price="123456.78")),
        ("decimal NaN", "ConversionError", b"k11", with_(price="NaN")),
        ("timestamp out of range", "ConversionError", b"k12", with_(at="10000-01-01T00:00:00Z")),
        ("timestamp epoch overflow", "ConversionError", b"k13", with_(at=10**18)),
        ("invalid date", "ConversionError", b"k14", with_(day="2024-02-30")),
        ("bad base64", "ConversionError", b"k15", with_(blob="***")),
        ("list element wrong type", "ConversionError", b"k16", with_(tags=[1, "two"])),
        ("bool where number", "ConversionError", b"k17", with_(ratio=True)),
        ("null key in upsert", "InvalidKey", None, with_(id=99)),
        ("empty key in upsert", "InvalidKey", b"", with_(id=98)),
        ("oversized record", "RecordTooLarge", b"k20", with_(owner={"name": "x" * MAX_BYTES})),
        ("kafka timestamp in nanoseconds", "InvalidTimestamp", b"k21", good_json(99), NANOS_TIMESTAMP),
    ]


def schemaless_poisons() -> list[tuple[str, str, bytes | None, bytes | None]]:
    """Schemaless JSON: what no column can take within one batch (type conflicts become string columns)."""
    return [
        ("not an object", "DecodeError", b"k1", b'"text"'),
        ("invalid json", "DecodeError", b"k2", b'{"id": 1'),
        ("invalid utf-8", "DecodeError", b"k3", b'{"id": 1, "s": "\xff"}'),
        ("NaN token", "DecodeError", b"k4", b'{"id": NaN}'),
        ("key clashing with a Kafka column", "DecodeError", b"k5", b'{"id": 1, "kafka_offset": 5}'),
        ("key with a dot", "DecodeError", b"k6", b'{"id": 1, "a.b": 5}'),
        ("empty key", "DecodeError", b"k7", b'{"id": 1, "": 5}'),
        ("null key in upsert", "InvalidKey", None, good_schemaless(99)),
        ("oversized record", "RecordTooLarge", b"k9", json.dumps({"id": 1, "pad": "x" * MAX_BYTES}).encode()),
    ]


def good_schemaless(i: int) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "nested": {"at": "2024-01-01", "n": [i]}}).encode()


TEXT_POISONS = [
    ("invalid utf-8", "DecodeError", b"k1", b"\xff\xfe"),
    ("truncated utf-8 sequence", "DecodeError", b"k2", b"abc\xe2\x82"),
    ("utf-8 encoded surrogate", "DecodeError", b"k3", b"\xed\xa0\x80"),
    ("null key in upsert", "InvalidKey", None, b"ok"),
    ("empty key in upsert", "InvalidKey", b"", b"ok"),
    ("oversized record", "RecordTooLarge", b"k6", b"x" * (MAX_BYTES + 1)),
]


def good_json(i: int) -> bytes:
    return json.dumps(
        {
            "id": i,
            "small": i,
            "price": "9.99",
            "ratio": 1.5,
            "at": 1_700_000_000_000 + i,
            "day": "2020-02-29",
            "blob": "",
            "tags": [],
            "owner": {"name": f"o{i}"},
        }
    ).encode()


def lay_out(broker, topic: str, poisons, good) -> tuple[dict, dict]:
    """Each poison in its own partition as good, POISON, good; returns (good positions, poison positions->spec).
    A poison may carry a fifth item: its Kafka timestamp (the topic accepts any)."""
    broker.create_topic(topic, len(poisons), config={"message.timestamp.after.max.ms": str(2**63 - 1)})
    records, kinds = [], []
    for partition, (name, kind, key, value, *timestamp) in enumerate(poisons):
        records += [
            {"key": f"g{partition}a".encode(), "value": good(2 * partition), "partition": partition},
            {"key": key, "value": value, "partition": partition, "timestamp": (timestamp or [None])[0]},
            {"key": f"g{partition}b".encode(), "value": good(2 * partition + 1), "partition": partition},
        ]
        kinds += ["good", (name, kind), "good"]
    positions = produce(broker.bootstrap_servers, topic, records)
    goods = {p: r for p, r, k in zip(positions, records, kinds) if k == "good"}
    bads = {p: k for p, k in zip(positions, kinds) if k != "good"}
    return goods, bads


def check_mode(spark, state_dir, config, table, mode, goods, bads):
    if mode == "fail":
        with pytest.raises(RecordError) as caught:
            materialize_once(spark, config, table)
        assert (caught.value.partition, caught.value.offset) in bads
        rows = by_position(read_pyiceberg(state_dir, config.identifier(table)))
        assert set(rows) == {p for p in goods if (p[0], p[1] + 1) in bads}, "exactly the good record before each poison"
        return
    result = materialize_once(spark, config, table)
    assert result.records_failed == len(bads), "every bad record accounted for"
    rows = by_position(read_pyiceberg(state_dir, config.identifier(table)))
    assert set(rows) == set(goods), "every good record in the table"
    if mode == "dlq":
        dead = by_position(read_pyiceberg(state_dir, config.identifier(table) + "_dlq"))
        assert set(dead) == set(bads)
        for position, (name, kind) in bads.items():
            row = dead[position]
            assert row["error_class"] in kind.split("|"), f"{name}: {row['error_class']} {row['error_message']}"
            assert row["error_message"] and row["run_id"] == result.run_id
        again = materialize_once(spark, config, table)
        assert again.status == "up-to-date"
        assert len(read_pyiceberg(state_dir, config.identifier(table) + "_dlq")) == len(bads)
    return result


def dead_letter_messages(state_dir, result, bads) -> dict[str, str]:
    """Poison name -> the error message its dead-letter row carries (after `check_mode` in dlq mode)."""
    dead = by_position(read_pyiceberg(state_dir, result.identifier + "_dlq"))
    return {bads[p][0]: row["error_message"] for p, row in dead.items()}


@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_json_poison_catalogue(spark, broker, state_dir, topic, make_config, mode):
    poisons = json_poisons()
    goods, bads = lay_out(broker, topic, poisons, good_json)
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": JSON_SCHEMA,
            "mode": "upsert",
            "errors": mode,
            "maxRecordBytes": MAX_BYTES,
        }
    )
    check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)


@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_avro_poison_catalogue(spark, broker, registry, state_dir, topic, make_config, mode):
    poisons = avro_poisons(registry.url, topic)
    serialize = avro_serializer(registry.url, topic, json.dumps(AVRO_SCHEMA))
    goods, bads = lay_out(broker, topic, poisons, lambda i: serialize(payment(i)))
    config = make_config({"topic": topic, "errors": mode, "maxRecordBytes": MAX_BYTES})
    result = check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)
    if result is not None:  # Spark's Kafka source overflows on the nanoseconds: the batch was read in Python
        assert result.read_path == PYTHON


@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_schemaless_json_poison_catalogue(spark, broker, state_dir, topic, make_config, mode):
    goods, bads = lay_out(broker, topic, schemaless_poisons(), good_schemaless)
    config = make_config(
        {"topic": topic, "format": "json", "mode": "upsert", "errors": mode, "maxRecordBytes": MAX_BYTES}
    )
    check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)


@pytest.mark.parametrize("format", ["string", "raw"])
@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_raw_and_string_poison_catalogue(spark, broker, state_dir, topic, make_config, mode, format):
    poisons = TEXT_POISONS if format == "string" else [p for p in TEXT_POISONS if p[1] != "DecodeError"]
    goods, bads = lay_out(broker, topic, poisons, lambda i: b"good %d" % i)
    config = make_config(
        {"topic": topic, "format": format, "mode": "upsert", "errors": mode, "maxRecordBytes": MAX_BYTES}
    )
    check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)


def test_unreachable_registry_is_not_a_bad_record(spark, broker, registry, state_dir, topic, make_config, monkeypatch):
    """An environment failure must fail the run, never send good records to the DLQ."""
    broker.create_topic(topic, 1)
    serialize = avro_serializer(registry.url, topic, json.dumps(AVRO_SCHEMA))
    produce(broker.bootstrap_servers, topic, [{"value": serialize(payment(1))}])
    schema = json.dumps(AVRO_SCHEMA)
    monkeypatch.setattr(confluent, "latest_schema", lambda conf, subject: schema)  # the driver saw the registry...
    monkeypatch.setattr(runner, "SOURCE_BACKOFF_S", 0.05)
    config = make_config({"topic": topic, "errors": "dlq"}, registry_url="http://127.0.0.1:9")  # ...executors cannot
    with pytest.raises(SourceError, match="unreachable|registry"):
        runner.run_table(spark, config, config.tables[0], state_dir)
    assert not IcebergTable(spark, config.identifier(config.tables[0]) + "_dlq").exists()
    assert read_pyiceberg(state_dir, config.identifier(config.tables[0])) == []


PROTO = """syntax = "proto3";
package {ns};
message Payment {{ int64 id = 1; string payer = 2; message Note {{ string text = 1; }} Note note = 3; }}
"""


@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_protobuf_poison_catalogue(spark, broker, registry, state_dir, topic, make_config, mode, tmp_path):
    from support import compile_protos, message_class, protobuf_serializer

    ns = topic[-40:].strip("_")
    Payment = message_class(compile_protos({f"{ns}/payment.proto": PROTO.format(ns=ns)}, tmp_path), f"{ns}.Payment")
    serialize = protobuf_serializer(registry.url, topic, Payment)
    good = serialize(Payment(id=1, payer="a-long-payer-name"))
    header = good[:5]
    json_id = SchemaRegistryClient({"url": registry.url}).register_schema(
        f"{topic}-other",
        Schema(json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}), "JSON"),
    )
    poisons = [
        ("message index out of range", "DecodeError", None, header + b"\x02\x0a" + good[6:]),  # [5]
        ("a nested message, not the table's", "DecodeError", None, header + b"\x04\x00\x00" + good[6:]),  # [0, 0]
        ("unknown schema id", "DecodeError", None, b"\x00" + struct.pack(">I", 987654) + good[5:]),
        ("a JSON schema's id", "DecodeError", None, b"\x00" + struct.pack(">I", json_id) + good[5:]),
        ("truncated message", "DecodeError", None, good[:-4]),
        ("not framed", "DecodeError", None, b"\x01" + good[1:]),
    ]
    goods, bads = lay_out(broker, topic, poisons, lambda i: serialize(Payment(id=i, payer=f"p{i}")))
    config = make_config({"topic": topic, "format": "protobuf", "errors": mode})
    check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)


JSON_SCHEMA_DOC = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "ref": {"type": "string", "format": "uuid"},
        "at": {"type": "string", "format": "date-time"},
        "secret": {"type": "string", "maxLength": 8},
    },
    "required": ["id"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_json_schema_poison_catalogue(spark, broker, registry, state_dir, topic, make_config, mode):
    from support import json_schema_serializer

    serialize = json_schema_serializer(registry.url, topic, json.dumps(JSON_SCHEMA_DOC))
    header = serialize({"id": 0})[:5]

    def raw(value) -> bytes:  # bytes the serializer would refuse to write, as a buggy producer sends them
        return header + json.dumps(value).encode()

    poisons = [
        ("wrong type", "DecodeError", None, raw({"id": "PERSONAL-DATA"})),
        ("missing required property", "DecodeError", None, raw({"ref": None})),
        ("property not allowed", "DecodeError", None, raw({"id": 1, "PERSONAL-DATA": 1})),
        ("rule on the value", "DecodeError", None, raw({"id": 1, "secret": "PERSONAL-DATA"})),
        ("bad uuid", "DecodeError", None, raw({"id": 1, "ref": "PERSONAL-DATA"})),
        ("bad date-time", "DecodeError|ConversionError", None, raw({"id": 1, "at": "PERSONAL-DATA"})),
        ("not JSON", "DecodeError", None, header + b"{PERSONAL-DATA"),
        ("unknown schema id", "DecodeError", None, b"\x00" + struct.pack(">I", 987654) + b'{"id": 1}'),
        ("not framed", "DecodeError", None, b'{"id": 1}'),
    ]
    goods, bads = lay_out(broker, topic, poisons, lambda i: serialize({"id": i}))
    config = make_config({"topic": topic, "format": "json-schema", "errors": mode})
    check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)
    if mode == "dlq":  # the error names the rule that failed, never the value
        messages = [r["error_message"] for r in read_pyiceberg(state_dir, config.identifier(config.tables[0]) + "_dlq")]
        assert not [m for m in messages if "PERSONAL-DATA" in m], messages
        assert any('value.id: fails type "integer"' in m for m in messages), messages
        assert any("required property 'id' is missing" in m for m in messages), messages


@pytest.mark.parametrize("bug", [KeyError, ValueError, TypeError])
def test_a_decoder_bug_is_not_a_bad_record(spark, broker, state_dir, topic, make_config, monkeypatch, bug):
    """Only what a decoder declares (`BadRecord`) is a bad record: any other exception in a decoder is a bug, which
    fails the batch (nothing committed) under `errors: skip`, named by partition, offset and type, never its text."""
    from icefloe.errors import DecoderFailure
    from icefloe.materialize import batch as batch_module

    broker.create_topic(topic, 1)
    values = [good_json(0), b'{"id": 1, "secret": "hunter2"}', good_json(2)]
    produce(broker.bootstrap_servers, topic, [{"key": b"k%d" % i, "value": v} for i, v in enumerate(values)])
    real = batch_module.read_batches

    def buggy_read_batches(plan, tasks):  # runs in the Python worker: the decoder fails on the second record
        from icefloe.materialize import python_tasks

        init = python_tasks._Records.__init__

        def patched(self, plan):
            init(self, plan)
            decode = self.decode

            def broken(data):
                if b"hunter2" in data:
                    raise bug("hunter2")  # a bug's text may quote the value
                return decode(data)

            self.decode = broken

        python_tasks._Records.__init__ = patched
        try:
            yield from real(plan, tasks)
        finally:  # Python workers are reused by later tests
            python_tasks._Records.__init__ = init

    monkeypatch.setattr(batch_module, "read_batches", buggy_read_batches)
    config = make_config({"topic": topic, "format": "json", "schema": JSON_SCHEMA, "errors": "skip"})
    with pytest.raises(DecoderFailure) as caught:
        materialize_once(spark, config, config.tables[0])
    message = str(caught.value)
    assert f"{topic} partition 0 offset 1" in message and bug.__name__ in message, message
    assert "hunter2" not in message, "a bug's text may quote the record"
    assert read_pyiceberg(state_dir, config.identifier(config.tables[0])) == [], "nothing committed"
