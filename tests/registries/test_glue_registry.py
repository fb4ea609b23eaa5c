"""The AWS Glue Schema Registry as a registry kind, against moto's Glue schema-registry API (a moto server, not AWS):
records serialized by the PyPI `aws-glue-schema-registry` library (the real wire format: header 3, compression,
version UUID), Avro and JSON Schema, materialized through the real broker and read back with pyiceberg and DuckDB;
poisons in every mode."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
import uuid
import zlib
from decimal import Decimal

import pytest

from icefloe.errors import ConfigError
from icefloe.formats.registry import decoder_spec
from icefloe.materialize.batch import materialize_once
from icefloe.materialize.read_paths import JVM, PYTHON
from icefloe.operate.runner import run_table
from icefloe.registries.glue import split
from icefloe.spec import parse_config
from support import by_position, produce, read_duckdb, read_pyiceberg
from test_poison import MAX_BYTES, check_mode, dead_letter_messages, lay_out

UTC = dt.UTC
V1 = {
    "type": "record",
    "name": "Payment",
    "namespace": "test.glue",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "payer", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "ref", "type": ["string", "long"]},
    ],
}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}


GLUE = {"type": "glue", "registryName": "r", "region": "eu-west-1"}


def _cluster(**registry) -> dict:
    return {"name": "c", "bootstrapServers": "b:9092", "schemaRegistry": registry}


@pytest.mark.parametrize(
    "registry, message",
    [
        ({"type": "glue", "region": "eu-west-1"}, "needs registryName and region"),
        ({"type": "glue", "registryName": "r", "region": "eu-west-1", "url": "http://x"}, "takes no url"),
        ({"registryName": "r", "region": "eu-west-1", "url": "http://x"}, "only apply with type: glue"),
        ({"type": "glue", "registryName": "r", "region": "Ireland"}, "region"),
        ({}, "needs url"),
        ({"url": "http://x", "keySchemaName": "k"}, "keySchemaName only apply with type: glue"),
        ({**GLUE, "keySchemaName": "{topc}-key"}, r"keySchemaName '\{topc\}-key': the only placeholder is \{topic\}"),
        ({**GLUE, "schemaName": "{topic"}, "schemaName '{topic': the only placeholder"),
        ({**GLUE, "keySchemaNme": "k"}, r"schemaRegistry.keySchemaNme: Extra inputs are not permitted"),
        (
            {**GLUE, "schemaName": "{topic}", "keySchemaName": "{topic}"},
            "schemaName and keySchemaName are both '{topic}'",
        ),
    ],
)
def test_glue_registry_settings_are_validated(registry, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"sourceClusters": [_cluster(**registry)]})


def test_glue_schema_names_replace_the_topic():
    registry = parse_config({"sourceClusters": [_cluster(**GLUE, keySchemaName="keys.{topic}")]}).source_clusters[0]
    names = registry.schema_registry.glue_schema("orders"), registry.schema_registry.glue_schema("orders", key=True)
    assert names == ("orders-value", "keys.orders")


def test_the_wire_format_is_split_and_refused_naming_the_problem():
    version = uuid.uuid4()
    assert split(b"\x03\x00" + version.bytes + b"body") == (version, b"body")
    assert split(b"\x03\x05" + version.bytes + zlib.compress(b"body")) == (version, b"body")
    for data, message in [
        (b"\x00\x00\x00\x00\x01body", "not AWS Glue Schema Registry wire format"),
        (b"\x03\x00" + version.bytes[:5], "not AWS Glue"),
        (b"\x03\x07" + version.bytes + b"x", "unknown Glue compression byte 7"),
        (b"\x03\x05" + version.bytes + b"not zlib", "does not decompress"),
    ]:
        with pytest.raises(ValueError, match=message):
            split(data)


def test_a_fresh_worker_reads_the_logical_types_fastavro_lacks():
    """fastavro's logical readers are per process: a Python worker that decodes only Glue tables must still read uuid
    on fixed(16), timestamp-nanos and duration as the table's types, not as their base types."""
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "u", "type": {"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}},
            {"name": "t", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
            {"name": "d", "type": {"type": "fixed", "name": "D", "size": 12, "logicalType": "duration"}},
        ],
    }
    script = f"""
import io, json, fastavro
from icefloe.formats.avro.reader import glue_payload as avro_payload
schema = json.loads({json.dumps(json.dumps(schema))})
body = io.BytesIO()
fastavro.schemaless_writer(body, fastavro.parse_schema(schema), {{"u": bytes(range(16)), "t": 1_500_999,
                                                               "d": bytes([1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0])}})
print(repr(avro_payload(json.dumps(schema), json.dumps(schema))(body.getvalue())))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # this icefloe, however pytest found it
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr(
        {
            "u": uuid.UUID(bytes=bytes(range(16))),
            "t": dt.datetime(1970, 1, 1, 0, 0, 0, 1500, tzinfo=UTC),
            "d": {"months": 1, "days": 2, "milliseconds": 3},
        }
    )


class Glue:
    """A Glue schema registry on the moto server, and the AWS library's serializer writing to it."""

    def __init__(self, moto_aws, name: str):
        from aws_schema_registry import KafkaSerializer, SchemaRegistryClient

        self.moto, self.name = moto_aws, name
        self.registry = SchemaRegistryClient(moto_aws.client("glue"), registry_name=name, wait_interval_seconds=0.1)
        self.serializer = KafkaSerializer(self.registry)
        self.key_serializer = KafkaSerializer(self.registry, is_key=True)  # its schema: `<topic>-key`

    def serialize(self, topic: str, schema: dict, value: dict, compressed: bool = False, key: bool = False) -> bytes:
        """With the library's AvroSchema, or its JsonSchema for a JSON Schema (one with `$schema`)."""
        from aws_schema_registry import DataAndSchema
        from aws_schema_registry.avro import AvroSchema
        from aws_schema_registry.codec import decode, encode
        from aws_schema_registry.jsonschema import JsonSchema

        kind = JsonSchema if "$schema" in schema else AvroSchema
        serializer = self.key_serializer if key else self.serializer
        data = serializer.serialize(topic, DataAndSchema(value, kind(schema)))
        if not compressed:
            return data
        payload, version = decode(data)
        return encode(payload, version, compression=True)  # the library's own zlib framing

    def config(self, topic: str, **table) -> dict:
        registry = {"type": "glue", "registryName": self.name, "region": "us-east-1", "endpoint": self.moto.endpoint}
        return {
            "sourceClusters": [{"name": "local", "bootstrapServers": "", "schemaRegistry": registry}],
            "tables": [{"sourceCluster": "local", "topic": topic, **table}],
        }


@pytest.fixture
def aws_env(moto_aws, spark, monkeypatch):
    """AWS credentials for the driver (environment) and the Python workers (the SparkContext's worker environment)."""
    for key, value in moto_aws.aws_env().items():
        monkeypatch.setenv(key, value)
        monkeypatch.setitem(spark.sparkContext.environment, key, value)


def _parsed(raw: dict, broker) -> object:
    raw["sourceClusters"][0]["bootstrapServers"] = broker.bootstrap_servers
    return parse_config(raw)


def payment(i: int, note: bool = False) -> dict:
    value = {
        "id": i,
        "payer": None if i % 3 == 0 else f"p{i}",
        "amount": Decimal(i).scaleb(-2),
        "at": dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=i),
        "tags": [f"t{i}"] * (i % 3),
        "ref": f"r{i}" if i % 2 else i,
    }
    return {**value, "note": f"n{i}"} if note else value


def avro_row(value: dict) -> dict:
    """An Avro payment as its table row: the union `ref` as its member struct, `note` null before V2."""
    ref = value["ref"]
    return {
        "note": None,
        **value,
        "ref": {"member0": ref, "member1": None} if isinstance(ref, str) else {"member0": None, "member1": ref},
    }


def check_end_to_end(spark, broker, glue, state_dir, topic, schemas, make_value, as_row, read_path, **table):
    """20 records written with the first version, 6 with the second (zlib framing in both); all read with the second's
    columns on `read_path`, back from pyiceberg and DuckDB."""
    first, second = schemas
    broker.create_topic(topic, 2)
    values = [(make_value(i), glue.serialize(topic, first, make_value(i), compressed=i % 4 == 0)) for i in range(20)]
    values += [
        (make_value(i, True), glue.serialize(topic, second, make_value(i, True), compressed=i % 2 == 0))
        for i in range(20, 26)
    ]
    positions = produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"%d" % v["id"], "value": data, "partition": v["id"] % 2} for v, data in values],
    )
    config = _parsed(glue.config(topic, **table), broker)

    result = materialize_once(spark, config, config.tables[0])

    assert result.rows_written == len(values) and result.records_failed == 0 and result.read_path == read_path
    expected = {p: as_row(v) for p, (v, _) in zip(positions, values)}
    rows = by_position(read_pyiceberg(state_dir, result.identifier))
    assert {p: {k: r[k] for k in expected[p]} for p, r in rows.items()} == expected, "older records read as the latest"
    duck = by_position(read_duckdb(result.metadata_location))
    assert {p: {k: r[k] for k in expected[p]} for p, r in duck.items()} == expected


@pytest.mark.spark
@pytest.mark.broker
def test_glue_avro_end_to_end_with_evolution_and_zlib(
    spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry
):
    check_end_to_end(spark, broker, Glue(moto_aws, glue_registry), state_dir, topic, (V1, V2), payment, avro_row, JVM)


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_glue_poison_catalogue(spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, mode):
    glue = Glue(moto_aws, glue_registry)
    sample = glue.serialize(topic, V1, payment(1))
    other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "boolean"}]}
    foreign = glue.serialize(f"{topic}-other", other, {"x": True})  # a version of another schema: does not resolve
    poisons = [
        ("confluent framing", "DecodeError", b"k", b"\x00\x00\x00\x00\x01" + sample[18:]),
        ("unknown compression byte", "DecodeError", b"k", sample[:1] + b"\x09" + sample[2:]),
        ("unknown schema version", "DecodeError", b"k", sample[:2] + uuid.uuid4().bytes + sample[18:]),
        ("corrupt zlib payload", "DecodeError", b"k", sample[:1] + b"\x05" + sample[2:]),
        ("truncated avro", "DecodeError", b"k", sample[:21]),
        ("header only", "DecodeError", b"k", sample[:18]),
        ("another schema's version", "DecodeError", b"k", foreign),
        ("negative union branch index", "DecodeError", b"k", sample[:19] + b"\x01" + sample[20:]),  # payer: -1, not 1
        ("oversized record", "RecordTooLarge", b"k", sample[:18] + b"\x00" * (MAX_BYTES + 1)),
    ]
    assert sample[19] == 0x02, "payer's branch index: 1"
    goods, bads = lay_out(broker, topic, poisons, lambda i: glue.serialize(topic, V1, payment(i)))
    config = _parsed(glue.config(topic, errors=mode, maxRecordBytes=MAX_BYTES), broker)
    result = check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)
    assert result is None or result.read_path == JVM, "the JVM path hands every poison to the Python decoder"


@pytest.mark.spark
@pytest.mark.broker
def test_glue_avro_takes_the_jvm_path_and_its_rows_are_the_python_paths(
    spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, caplog
):
    """Versions V1 and V2 decoded by `from_avro`; compressed payloads, unknown versions and what the JVM cannot decode
    exactly go to the Python decoder. Every row (values, status, error) is the Python path's row."""
    from test_jvm_path import rows_on_both_paths

    glue = Glue(moto_aws, glue_registry)
    broker.create_topic(topic, 2)
    valid = [glue.serialize(topic, V1, payment(i)) for i in range(30)]
    valid += [glue.serialize(topic, V2, payment(i, note=True)) for i in range(30, 40)]
    sample = valid[1]  # payer "p1": id 1 (0x02), union branch 1 (0x02), a 2-byte string (0x04) at byte 21
    for_python = [
        glue.serialize(topic, V1, payment(50), compressed=True),  # zlib: decompressed in Python
        sample[:2] + uuid.uuid4().bytes + sample[18:],  # unknown version
        sample[:21],  # truncated
        sample[:21] + b"\x04\xff\xfe" + sample[24:],  # payer not UTF-8
        sample[:18],  # header only
        b"\x00\x00\x00\x00\x01" + sample[18:],  # Confluent framing
        b"",
    ]
    assert sample[18:21] == b"\x02\x02\x04" and sample[21:23] == b"p1"
    values = valid + for_python + [None]
    produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"k%d" % i, "value": v, "partition": i % 2} for i, v in enumerate(values)],
    )
    config = _parsed(glue.config(topic, errors="skip"), broker)

    path, jvm, jvm_rows, python_rows = rows_on_both_paths(spark, config)

    assert path.name == JVM and len(path.avro.writers) == 2, path.reason
    assert (
        len(python_rows) == len(values) and sum(r["icefloe_error_class"] is not None for r in python_rows.values()) == 6
    )
    for position, expected in python_rows.items():
        assert jvm_rows[position] == expected, position
    exact, observation = jvm.exact_rows("probe")
    exact.write.format("noop").mode("overwrite").save()
    counts = {key: observation.get[key] for key in ("rows", "for_python")}  # beside them: each partition's range
    assert counts == {"rows": len(values), "for_python": len(for_python)}, "only those records go to Python"

    with caplog.at_level(logging.INFO, logger="icefloe.materialize.batch"):
        result = run_table(spark, config, config.tables[0], state_dir)
    assert (
        result.as_dict()["read_path"] == JVM and result.rows_written == len(values) - 6 and result.records_failed == 6
    )
    assert any("read path jvm: Kafka source and from_avro (writer schemas " in r.getMessage() for r in caplog.records)


# --- JSON Schema through Glue ---------------------------------------------------------------------------------------
J1 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["id", "amount"],
    "properties": {
        "id": {"type": "integer"},
        "payer": {"type": ["string", "null"]},
        "amount": {"type": "number", "minimum": 0},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object", "properties": {"source": {"type": "string"}}},
        "attrs": {"type": "object"},
    },
}
J2 = {**J1, "properties": {**J1["properties"], "note": {"type": "string"}}}


def json_payment(i: int, note: bool = False) -> dict:
    value = {
        "id": i,
        "payer": None if i % 3 == 0 else f"p{i}",
        "amount": i / 4,
        "at": f"2026-01-01T00:00:{i:02d}Z",
        "tags": [f"t{i}"] * (i % 3),
        "meta": {"source": f"s{i}"},
        "attrs": {"k": i},
    }
    return {**value, "note": f"n{i}"} if note else value


def json_row(value: dict) -> dict:
    """A JSON payment as its table row: date-time as a timestamp, the free-form object as its JSON text."""
    at = dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=value["id"])
    return {"note": None, **value, "at": at, "attrs": json.dumps(value["attrs"], separators=(",", ":"))}


def test_a_glue_schema_of_another_data_format_than_the_table_reads_is_a_config_error(
    moto_aws, monkeypatch, topic, glue_registry
):
    for key, value in moto_aws.aws_env().items():
        monkeypatch.setenv(key, value)
    glue = Glue(moto_aws, glue_registry)
    glue.serialize(f"{topic}-a", V1, payment(1))
    glue.serialize(f"{topic}-j", J1, json_payment(1))

    def parsed(name: str, fmt: str):
        raw = glue.config(name, format=fmt)
        raw["sourceClusters"][0]["bootstrapServers"] = "b:9092"  # not reached: the decoder asks only the registry
        return parse_config(raw)

    for name, fmt, data_format in [(f"{topic}-a", "json-schema", "AVRO"), (f"{topic}-j", "avro", "JSON")]:
        config = parsed(name, fmt)
        with pytest.raises(
            ConfigError, match=f"Glue schema '{name}-value' is {data_format}, not .* \\(format {fmt}\\)"
        ):
            decoder_spec(config.tables[0], config.source_clusters[0])
    config = parsed(f"{topic}-j", "json-schema")
    spec = decoder_spec(config.tables[0], config.source_clusters[0])
    assert (spec.schema_from, spec.registry_conf["data_format"], json.loads(spec.schema_str)) == ("glue", "JSON", J1)
    assert spec.key_conf is None


def test_the_key_schema_is_checked_on_the_driver(moto_aws, monkeypatch, topic, glue_registry):
    """keyFormat avro, json-schema or protobuf on a Glue registry: the key schema (keySchemaName) must exist and be
    of the keyFormat's data format; keyFormat json, string or raw never asks the registry for it."""
    for key, value in moto_aws.aws_env().items():
        monkeypatch.setenv(key, value)
    glue = Glue(moto_aws, glue_registry)
    glue.serialize(topic, V1, payment(1))
    glue.serialize(topic, JSON_KEY, {"id": 1}, key=True)

    def spec(**table):
        raw = glue.config(topic, mode="upsert", key=["id"], **table)
        raw["sourceClusters"][0]["bootstrapServers"] = "b:9092"  # not reached: the decoder asks only the registry
        if "keySchemaName" in table:
            raw["sourceClusters"][0]["schemaRegistry"]["keySchemaName"] = raw["tables"][0].pop("keySchemaName")
        config = parse_config(raw)
        return decoder_spec(config.tables[0], config.source_clusters[0])

    with pytest.raises(ConfigError, match=f"the Glue key schema '{topic}-key' is JSON, not AVRO \\(keyFormat avro\\)"):
        spec()  # the default keyFormat of an Avro table: avro
    with pytest.raises(ConfigError, match=f"no schema named 'keys-{topic}' in the Glue schema registry"):
        spec(keyFormat="json-schema", keySchemaName="keys-{topic}")
    found = spec(keyFormat="json-schema")
    assert (found.key_format, found.key_conf["schema"], found.key_conf["data_format"]) == (
        "json-schema",
        f"{topic}-key",
        "JSON",
    )
    assert all(spec(keyFormat=fmt, keySchemaName="missing-{topic}").key_conf is None for fmt in ("json", "string"))


@pytest.mark.spark
@pytest.mark.broker
def test_glue_json_schema_end_to_end_with_evolution_and_zlib(
    spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry
):
    glue = Glue(moto_aws, glue_registry)
    check_end_to_end(
        spark, broker, glue, state_dir, topic, (J1, J2), json_payment, json_row, PYTHON, format="json-schema"
    )


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_glue_json_schema_poison_catalogue(spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, mode):
    from aws_schema_registry.codec import decode, encode

    glue = Glue(moto_aws, glue_registry)
    # Written with J1 (which does not declare `note`), valid for it; the table's J2 makes `note` a string.
    clash = glue.serialize(topic, J1, {**json_payment(1), "note": 5})
    version = decode(clash)[1]

    def raw(value) -> bytes:  # a payload the library's serializer would refuse, framed with J1's version
        return encode(value if isinstance(value, bytes) else json.dumps(value).encode(), version)

    secret = json_payment(2)
    poisons = [
        ("fails minimum", "DecodeError", b"k", raw({**secret, "amount": -987654.5})),
        ("required property missing", "DecodeError", b"k", raw({k: v for k, v in secret.items() if k != "id"})),
        ("wrong type", "DecodeError", b"k", raw({**secret, "id": "SECRET-id"})),
        ("nested wrong type", "DecodeError", b"k", raw({**secret, "tags": ["a", 7]})),
        ("not an object", "DecodeError", b"k", raw([1, 2])),
        ("not json", "DecodeError", b"k", raw(b'{"id": 1,')),
        ("an avro version on a json table", "DecodeError", b"k", glue.serialize(f"{topic}-avro", V1, payment(1))),
        ("unknown schema version", "DecodeError", b"k", clash[:2] + uuid.uuid4().bytes + clash[18:]),
        ("valid for its writer, not the table's type", "ConversionError", b"k", clash),
        ("oversized record", "RecordTooLarge", b"k", raw({**secret, "payer": "x" * MAX_BYTES})),
    ]
    goods, bads = lay_out(broker, topic, poisons, lambda i: glue.serialize(topic, J2, json_payment(i, note=True)))
    config = _parsed(glue.config(topic, format="json-schema", errors=mode, maxRecordBytes=MAX_BYTES), broker)
    result = check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)
    if mode != "dlq":
        return
    messages = dead_letter_messages(state_dir, result, bads)
    assert "value.amount: fails minimum 0" in messages["fails minimum"]
    assert "required property 'id' is missing" in messages["required property missing"]
    assert 'value.id: fails type "integer"' in messages["wrong type"]
    assert 'value.tags[1]: fails type "string"' in messages["nested wrong type"]
    assert "is AVRO; the table reads JSON" in messages["an avro version on a json table"]
    assert "note" in messages["valid for its writer, not the table's type"]
    assert not [m for m in messages.values() if "987654" in m or "SECRET" in m], "errors name the rule, never the value"


# --- Keys through Glue (upsert keyed by a value field: a tombstone's Glue-framed key names the row) ----------------
AVRO_KEY = {
    "type": "record",
    "name": "PaymentKey",
    "namespace": "test.glue",
    "fields": [{"name": "id", "type": "long"}],
}
AVRO_KEY_2 = {
    **AVRO_KEY,
    "fields": [*AVRO_KEY["fields"], {"name": "region", "type": ["null", "string"], "default": None}],
}
JSON_KEY = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["id"],
    "properties": {"id": {"type": "integer"}},
}
JSON_KEY_2 = {**JSON_KEY, "properties": {**JSON_KEY["properties"], "region": {"type": "string"}}}
KEYED = {"mode": "upsert", "key": ["id"], "errors": "dlq"}


def check_glue_keys(spark, broker, state_dir, topic, config, key, value) -> dict[str, str]:
    """Upsert keyed by the value field `id`: the later value per key wins, a tombstone deletes its row, also with its
    key written with a second key schema version, zlib-compressed (`key(id, newer)`; `value(id, payer)`). Tombstones
    with bad keys go to the dead-letter table (errors: dlq) as InvalidKey; returns their messages by name."""
    sample = key(2, False)
    bad_keys = {
        "unknown key schema version": sample[:2] + uuid.uuid4().bytes + sample[18:],
        "corrupt key payload": sample[:18] + b"\xff" * 10,
        "not Glue framing": b'{"id": 2}',
    }
    broker.create_topic(topic, 2)
    records = [
        {"key": key(i, False), "value": value(i, name), "partition": 0}
        for i, name in [(1, "one"), (2, "two"), (3, "three"), (1, "uno")]
    ]
    records += [
        {"key": key(2, False), "value": None, "partition": 0},
        {"key": key(3, True), "value": None, "partition": 0},
        {"key": key(4, False), "value": value(4, "four"), "partition": 0},
    ]
    records += [{"key": data, "value": None, "partition": 1} for data in bad_keys.values()]
    positions = produce(broker.bootstrap_servers, topic, records)

    result = materialize_once(spark, config, config.tables[0])

    expected_path = JVM if config.tables[0].format == "avro" else PYTHON  # Glue Avro values take the JVM path
    assert result.records_failed == len(bad_keys) and result.read_path == expected_path
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        assert sorted((str(r["id"]), r["payer"]) for r in rows) == [("1", "uno"), ("4", "four")]
    dead = by_position(read_pyiceberg(state_dir, result.identifier + "_dlq"))
    assert set(dead) == set(positions[-len(bad_keys) :])
    assert {row["error_class"] for row in dead.values()} == {"InvalidKey"}
    messages = {name: dead[p]["error_message"] for name, p in zip(bad_keys, positions[-len(bad_keys) :])}
    assert "schema version" in messages["unknown key schema version"]
    assert "is not in the Glue schema registry" in messages["unknown key schema version"]
    assert "not AWS Glue Schema Registry wire format" in messages["not Glue framing"]
    return messages


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("fmt", ["avro", "json-schema"])
def test_glue_keys_of_an_upsert_table(spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, fmt):
    """Keys and values from the AWS Python serializer: keys under `<topic>-key`, its default naming and icefloe's."""
    glue = Glue(moto_aws, glue_registry)
    schemas, make = {
        "avro": ((V1, AVRO_KEY, AVRO_KEY_2), payment),
        "json-schema": ((J1, JSON_KEY, JSON_KEY_2), json_payment),
    }[fmt]
    value_schema, key_v1, key_v2 = schemas

    def key(i: int, newer: bool) -> bytes:
        return glue.serialize(
            topic,
            key_v2 if newer else key_v1,
            {"id": i, **({"region": "eu"} if newer else {})},
            compressed=newer,
            key=True,
        )

    def value(i: int, payer: str) -> bytes:
        return glue.serialize(topic, value_schema, {**make(i), "payer": payer})

    config = _parsed(glue.config(topic, format=fmt, **KEYED), broker)
    messages = check_glue_keys(spark, broker, state_dir, topic, config, key, value)
    corrupt = "Avro payload cannot be decoded" if fmt == "avro" else "value is not valid UTF-8"
    assert messages["corrupt key payload"].startswith(f"tombstone key: {corrupt}"), messages


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_glue_bad_keys_in_every_error_mode(spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, mode):
    """Tombstones whose Glue key cannot name a row: InvalidKey, handled by the table's error mode like any bad record."""
    glue = Glue(moto_aws, glue_registry)
    sample = glue.serialize(topic, AVRO_KEY, {"id": 1}, key=True)
    poisons = [
        ("unknown key schema version", "InvalidKey", sample[:2] + uuid.uuid4().bytes + sample[18:], None),
        ("corrupt key payload", "InvalidKey", sample[:18] + b"\xff" * 10, None),
        ("key of another data format", "InvalidKey", glue.serialize(f"{topic}-j", JSON_KEY, {"id": 1}, key=True), None),
    ]
    goods, bads = lay_out(broker, topic, poisons, lambda i: glue.serialize(topic, V1, payment(i)))
    config = _parsed(glue.config(topic, mode="upsert", key=["id"], errors=mode), broker)
    result = check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)
    if mode == "dlq":
        assert (
            "is JSON; the table reads AVRO"
            in dead_letter_messages(state_dir, result, bads)["key of another data format"]
        )


def test_a_later_batch_asks_glue_only_for_the_latest_version(moto_aws, monkeypatch, topic, glue_registry):
    """Continuous runs plan a batch every `refresh`: available versions are immutable and fetched once per process;
    the latest is asked every batch, and a version registered since the previous batch is picked up, as is a schema
    deleted and created again."""
    from icefloe.registries import glue as registry_module

    for key, value in moto_aws.aws_env().items():
        monkeypatch.setenv(key, value)
    glue = Glue(moto_aws, glue_registry)
    v3 = {**V2, "fields": [*V2["fields"], {"name": "memo", "type": ["null", "string"], "default": None}]}
    calls = counted_glue_calls(monkeypatch)
    for schema in (V1, V2):
        glue.serialize(topic, schema, payment(1))
    conf = {"registry": glue.name, "region": "us-east-1", "endpoint": moto_aws.endpoint, "schema": f"{topic}-value"}

    def batch() -> dict:
        calls.clear()
        versions = registry_module.avro_versions(conf, 100)
        return {version: json.loads(text)["fields"][-1]["name"] for version, text in versions.items()}

    first = batch()
    assert len(first) == 2 and len(calls) == 2  # the latest (2), then version 1 by number
    assert batch() == first and [params["SchemaVersionNumber"] for _, params in calls] == [{"LatestVersion": True}]
    glue.serialize(topic, v3, payment(1))  # registered between two batches
    third = batch()
    assert sorted(third.values()) == ["memo", "note", "ref"] and len(calls) == 1  # the new latest is the only ask
    assert third.items() > first.items()
    client, schema = moto_aws.client("glue"), {"RegistryName": glue.name, "SchemaName": f"{topic}-value"}
    client.delete_schema(SchemaId=schema)  # created again under the same name: its version numbers start over
    client.create_schema(
        RegistryId={"RegistryName": glue.name},
        SchemaName=schema["SchemaName"],
        DataFormat="AVRO",
        Compatibility="BACKWARD",
        SchemaDefinition=json.dumps(v3),
    )
    again = batch()
    assert list(again.values()) == ["memo"] and not again.keys() & third.keys() and len(calls) == 1


def counted_glue_calls(monkeypatch) -> list[tuple[str, dict]]:
    """The (operation, parameters) the driver's Glue clients send, in order."""
    from icefloe.registries import glue as registry_module

    calls, real_client = [], registry_module.glue_client

    def record(params, model, **_):
        calls.append((model.name, params))

    def counted(conf):
        client = real_client(conf)
        client.meta.events.register("provide-client-params.glue.*", record)
        return client

    monkeypatch.setattr(registry_module, "glue_client", counted)
    return calls


@pytest.mark.spark
@pytest.mark.broker
def test_the_second_of_two_glue_batches_asks_only_for_the_latest_version(
    spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, monkeypatch
):
    glue, calls = Glue(moto_aws, glue_registry), counted_glue_calls(monkeypatch)
    broker.create_topic(topic, 1)
    values = [glue.serialize(topic, schema, payment(i, schema is V2)) for i, schema in enumerate([V1, V2])]
    produce(broker.bootstrap_servers, topic, [{"value": value, "partition": 0} for value in values])
    config = _parsed(glue.config(topic), broker)
    assert materialize_once(spark, config, config.tables[0]).read_path == JVM
    assert {"VersionNumber": 1} in [params.get("SchemaVersionNumber") for _, params in calls]  # every version, once
    produce(broker.bootstrap_servers, topic, [{"value": glue.serialize(topic, V2, payment(2, True)), "partition": 0}])
    calls.clear()
    result = materialize_once(spark, config, config.tables[0])
    # the table's schema (before and after planning), then the JVM plan's latest version
    latest = ("GetSchemaVersion", {"LatestVersion": True})
    assert [(name, params["SchemaVersionNumber"]) for name, params in calls] == [latest] * 3
    assert result.rows_written == 1 and sorted(r["id"] for r in read_pyiceberg(state_dir, result.identifier)) == [
        0,
        1,
        2,
    ]
