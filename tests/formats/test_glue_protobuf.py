"""Protobuf through the AWS Glue Schema Registry, against moto's Glue schema-registry API (a moto server, not AWS).

The AWS Python library has no Protobuf, so the reference records come from the AWS Java serde itself
(software.amazon.glue:schema-registry-serde, jvm/test-pom.xml, run by tests/jvm/GlueProtobufProducer.java): it
registers the `.proto` text it generates and frames each message (header 3, compression, version UUID, message
index, message). They go through the real broker, are materialized, and are read back with pyiceberg and DuckDB.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from icefloe.errors import ConfigError
from icefloe.formats.protobuf.glue import by_index, compile_definition
from icefloe.formats.protobuf.schemas import serialize_file
from icefloe.materialize.batch import materialize_once
from icefloe.spec import parse_config
from support import by_position, compile_protos, message_class, produce, read_duckdb, read_pyiceberg
from test_poison import MAX_BYTES, check_mode, dead_letter_messages, lay_out
from test_protobuf import TRADE, check_trades, three_trades

ROOT = Path(__file__).resolve().parents[2]
SERDE_JARS = ROOT / "jvm" / "test-lib" / "glue-serde"
FILE = "trade.proto"


def glue_file(ns: str, extra: str = "") -> str:
    """test_protobuf's Trade in one file (Glue has no references); Audit, declared last, sorts first by full name."""
    trade = TRADE.format(ns=ns, extra=extra).replace(f'import "{ns}/money.proto";\n', "")
    return trade + "message Money { int64 units = 1; string currency = 2; }\nmessage Audit { string by = 1; }\n"


def test_message_indexes_count_every_type_by_full_name():
    """MessageIndexFinder's own documented example (serde 1.1.27): B = 0, B.A = 1, B.A.D = 2, B.C = 3."""
    file = compile_definition('syntax = "proto3"; message B { message C {} message A { message D {} } }')
    assert [d.full_name for d in by_index(file)] == ["B", "B.A", "B.A.D", "B.C"]


def test_a_schema_that_does_not_compile_is_named_first_without_protoc_log_noise():
    """protoc logs through absl: a warning (no `syntax`) brings absl's preamble line and a log-prefixed line, which
    must neither come before the error nor push it out of the message."""
    with pytest.raises(ValueError) as caught:
        compile_definition("message Broken { int32 = 1; }")
    message = str(caught.value)
    assert message.startswith(
        "Protobuf schema text does not compile: icefloe_glue_schema.proto:1:18: Expected "
        '"required", "optional", or "repeated".'
    ), message
    assert "absl" not in message and "W0000" not in message and "parser.cc" not in message, message
    assert message.endswith(
        "(protoc: No syntax specified for the proto file: icefloe_glue_schema.proto. Please use "
        """'syntax = "proto2";' or 'syntax = "proto3";' to specify a syntax version. """
        "(Defaulted to proto2 syntax.))"
    ), message


def test_the_table_message_and_bad_schemas_are_config_errors(moto_aws, monkeypatch, topic, glue_registry):
    """Driver side, through the registry on moto: `.proto` text as a console or CLI registers it (`map<K, V>`)."""
    from pyspark.sql import types as T

    from icefloe.formats.protobuf.glue import value_fields
    from icefloe.formats.registry import decoder_spec

    for key, value in moto_aws.aws_env().items():
        monkeypatch.setenv(key, value)
    client, registry = moto_aws.client("glue"), glue_registry
    texts = {
        "p": 'syntax = "proto3"; package a; message First { string id = 1; map<string, int64> counts = 2; }\n'
        "message Second { int32 n = 1; }",
        "bad": 'syntax = "proto3"; message Broken { int32 = 1; }',
        "avro": json.dumps({"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}),
    }
    for name, text in texts.items():
        client.create_schema(
            RegistryId={"RegistryName": registry},
            SchemaName=name,
            SchemaDefinition=text,
            DataFormat="AVRO" if name == "avro" else "PROTOBUF",
            Compatibility="NONE",
        )

    def spec(schema: str, **table):
        glue = {
            "type": "glue",
            "registryName": registry,
            "region": "us-east-1",
            "endpoint": moto_aws.endpoint,
            "schemaName": schema,
        }
        config = parse_config(
            {
                "sourceClusters": [{"name": "c", "bootstrapServers": "b:9092", "schemaRegistry": glue}],
                "tables": [{"sourceCluster": "c", "topic": topic, "format": "protobuf", **table}],
            }
        )
        return decoder_spec(config.tables[0], config.source_clusters[0])

    first, second = spec("p"), spec("p", messageType="Second")
    assert (first.schema_from, first.message_type, second.message_type) == ("glue", "a.First", "a.Second")
    fields = value_fields(first.schema_str, "t", first.message_type)
    assert [(f.name, f.dataType) for f in fields] == [
        ("id", T.StringType()),
        ("counts", T.MapType(T.StringType(), T.LongType(), True)),
    ]
    with pytest.raises(
        ConfigError, match=r"messageType 'Missing' is not in the schema; it declares \['a.First', 'a.Second'\]"
    ):
        spec("p", messageType="Missing")
    with pytest.raises(ConfigError, match="Glue schema 'bad'.*does not compile"):
        spec("bad")
    with pytest.raises(ConfigError, match="the Glue schema 'avro' is AVRO, not PROTOBUF \\(format protobuf\\)"):
        spec("avro")


class GlueJava:
    """A Glue registry on the moto server, written to by the AWS Java serde's GlueSchemaRegistryKafkaSerializer."""

    def __init__(self, moto_aws, name: str, workdir: Path):
        if not any(SERDE_JARS.glob("schema-registry-serde-*.jar")):
            pytest.fail(f"the AWS Glue serde is not in {SERDE_JARS}: run scripts/setup.sh")
        self.moto, self.name, self.workdir = moto_aws, name, workdir

    def serialize(
        self,
        topic: str,
        pool,
        messages: list,
        compression: str = "NONE",
        file: str = FILE,
        key_schema: str | None = None,
    ) -> list[bytes]:
        """Each message (of `file`) as the Kafka value the Java serializer makes of it (the schema named after the
        topic), or as the Kafka key with `key_schema`, the name of the key's schema."""
        descriptors = self.workdir / f"{uuid.uuid4().hex}.pb"
        descriptors.write_bytes(base64.standard_b64decode(serialize_file(pool.FindFileByName(file))))
        lines = "".join(
            f"{m.DESCRIPTOR.full_name} {base64.b64encode(m.SerializeToString()).decode()}\n" for m in messages
        )
        env = {
            **os.environ,
            **self.moto.aws_env(),
            "GLUE_REGION": "us-east-1",
            "GLUE_ENDPOINT": self.moto.endpoint,
            "GLUE_REGISTRY": self.name,
        }
        command = [
            "java",
            "-cp",
            f"{SERDE_JARS}/*",
            str(ROOT / "tests" / "jvm" / "GlueProtobufProducer.java"),
            str(descriptors),
            topic,
            compression,
            *([key_schema] if key_schema else []),
        ]
        done = subprocess.run(command, input=lines, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        values = [base64.b64decode(line) for line in done.stdout.split()]
        assert len(values) == len(messages)
        return values

    def config(self, broker, topic: str, **table) -> object:
        registry = {
            "type": "glue",
            "registryName": self.name,
            "region": "us-east-1",
            "endpoint": self.moto.endpoint,
            "schemaName": "{topic}",
        }  # the Java serializer's default schema naming
        return parse_config(
            {
                "sourceClusters": [
                    {"name": "local", "bootstrapServers": broker.bootstrap_servers, "schemaRegistry": registry}
                ],
                "tables": [
                    {"sourceCluster": "local", "topic": topic, "format": "protobuf", "messageType": "Trade", **table}
                ],
            }
        )


@pytest.fixture
def aws_env(moto_aws, spark, monkeypatch):
    """AWS credentials for the driver (environment) and the Python workers (the SparkContext's worker environment)."""
    for key, value in moto_aws.aws_env().items():
        monkeypatch.setenv(key, value)
        monkeypatch.setitem(spark.sparkContext.environment, key, value)


def _trades(tmp_path: Path, topic: str, extra: str = ""):
    ns = topic[-40:].strip("_")
    pool = compile_protos({FILE: glue_file(ns, extra)}, tmp_path / uuid.uuid4().hex)
    return ns, pool, message_class(pool, f"{ns}.Trade")


@pytest.mark.spark
@pytest.mark.broker
def test_every_protobuf_type_from_the_aws_java_serde_and_evolution(
    spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, tmp_path
):
    glue = GlueJava(moto_aws, glue_registry, tmp_path)
    ns, pool, Trade = _trades(tmp_path, topic)
    broker.create_topic(topic, 1)
    values = glue.serialize(topic, pool, three_trades(Trade, pool))
    assert [v[:2] for v in values] == [b"\x03\x00"] * 3 and {v[2:18] for v in values} == {values[0][2:18]}
    assert values[0][18] == 2, "Trade is third by full name (Audit, Money, Trade, Trade.ByRankEntry, ...)"
    produce(broker.bootstrap_servers, topic, [{"value": v} for v in values])
    config = glue.config(broker, topic)

    result = materialize_once(spark, config, config.tables[0])

    assert (result.rows_written, result.records_failed, result.read_path) == (3, 0, "python")
    check_trades(state_dir, result)
    definition = moto_aws.client("glue").get_schema_version(
        SchemaId={"RegistryName": glue.name, "SchemaName": topic}, SchemaVersionNumber={"LatestVersion": True}
    )["SchemaDefinition"]
    assert "option map_entry = true;" in definition, "the serde writes maps as entry messages (Wire), read as maps"

    # A newer version with one more field (zlib-compressed this time): the table gains a column, older rows read null.
    _, pool_v2, Trade_v2 = _trades(tmp_path, topic, extra="\n  string venue_code = 25;")
    newer = glue.serialize(topic, pool_v2, [Trade_v2(id="t4", venue_code="XNAS", i64=4)], compression="ZLIB")
    assert newer[0][:2] == b"\x03\x05" and newer[0][2:18] != values[0][2:18], "a new schema version, zlib framing"
    produce(broker.bootstrap_servers, topic, [{"value": newer[0]}])

    result = materialize_once(spark, config, config.tables[0])

    assert (result.rows_written, result.records_failed) == (1, 0)
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        rows = {r["id"]: r for r in rows}
        assert {i: (r["venue_code"], r["i64"]) for i, r in rows.items()} == {
            "t1": (None, 2**40),
            "t2": (None, 0),
            "t3": (None, 0),
            "t4": ("XNAS", 4),
        }
    check_trades(state_dir, result)


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("mode", ["fail", "skip", "dlq"])
def test_glue_protobuf_poison_catalogue(
    spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, mode, tmp_path
):
    from aws_schema_registry import DataAndSchema, KafkaSerializer, SchemaRegistryClient
    from aws_schema_registry.avro import AvroSchema

    glue = GlueJava(moto_aws, glue_registry, tmp_path)
    ns, pool, Trade = _trades(tmp_path, topic)
    Money = message_class(pool, f"{ns}.Money")
    n_goods = 2 * 12
    *goods_bytes, sample, money = glue.serialize(
        topic, pool, [Trade(id=f"g{i}", i64=i) for i in range(n_goods)] + [Trade(id="s"), Money(units=1)]
    )
    header, body = sample[:19], sample[19:]  # prefix and message index; the message
    # a version of another data format (the Python library's Avro), and a PROTOBUF version whose text does not compile
    client = moto_aws.client("glue")
    avro = KafkaSerializer(SchemaRegistryClient(client, registry_name=glue.name, wait_interval_seconds=0.1))
    other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "boolean"}]}
    an_avro_version = avro.serialize(f"{topic}-avro", DataAndSchema({"x": True}, AvroSchema(other)))
    broken = client.create_schema(
        RegistryId={"RegistryName": glue.name},
        SchemaName=f"{topic}-broken",
        DataFormat="PROTOBUF",
        Compatibility="NONE",
        SchemaDefinition="message Broken { int32 = 1; }",
    )
    poisons = [
        ("confluent framing", "DecodeError", b"k", b"\x00\x00\x00\x00\x01\x00" + body),
        ("unknown compression byte", "DecodeError", b"k", sample[:1] + b"\x09" + sample[2:]),
        ("unknown schema version", "DecodeError", b"k", sample[:2] + uuid.uuid4().bytes + sample[18:]),
        ("corrupt zlib payload", "DecodeError", b"k", sample[:1] + b"\x05" + sample[2:]),
        ("header only", "DecodeError", b"k", sample[:18]),
        ("message index beyond the file", "DecodeError", b"k", sample[:18] + b"\x63" + body),
        ("another message type of the file", "DecodeError", b"k", money),
        ("truncated message", "DecodeError", b"k", header + b"\x0a\x05ab"),
        ("invalid utf-8 in a string", "DecodeError", b"k", header + b"\x0a\x02\xff\xfe"),
        ("an avro version", "DecodeError", b"k", an_avro_version),
        (
            "a version that does not compile",
            "DecodeError",
            b"k",
            sample[:2] + uuid.UUID(broken["SchemaVersionId"]).bytes + sample[18:],
        ),
        ("oversized record", "RecordTooLarge", b"k", header + b"\x00" * (MAX_BYTES + 1)),
    ]
    assert len(poisons) * 2 == n_goods
    goods, bads = lay_out(broker, topic, poisons, lambda i: goods_bytes[i])
    config = glue.config(broker, topic, errors=mode, maxRecordBytes=MAX_BYTES)
    result = check_mode(spark, state_dir, config, config.tables[0], mode, goods, bads)
    if mode != "dlq":
        return
    messages = dead_letter_messages(state_dir, result, bads)
    assert (
        "message index 99 does not exist: the writer version has 6 message type(s)"
        in messages["message index beyond the file"]
    )
    assert (
        f"record is a {ns}.Money (message index 1), the table reads {ns}.Trade"
        in messages["another message type of the file"]
    )
    assert "is AVRO; the table reads PROTOBUF" in messages["an avro version"]
    assert "does not compile" in messages["a version that does not compile"]
    assert "is not in the Glue schema registry" in messages["unknown schema version"]
    assert "message index is truncated" in messages["header only"]
    rows = by_position(read_pyiceberg(state_dir, result.identifier))
    assert sorted(r["i64"] for r in rows.values()) == list(range(n_goods))
    assert sorted(r["id"] for r in rows.values()) == sorted(f"g{i}" for i in range(n_goods))


ENTRY = 'syntax = "proto3";\npackage {ns};\nmessage Entry {{ string id = 1; string payer = 2; }}\n'
ENTRY_KEY = 'syntax = "proto3";\npackage {ns};\nmessage Audit {{ string by = 1; }}\nmessage EntryKey {{ string id = 1;{extra} }}\n'


@pytest.mark.spark
@pytest.mark.broker
def test_glue_protobuf_keys_of_an_upsert_table(
    spark, broker, moto_aws, aws_env, state_dir, topic, glue_registry, tmp_path
):
    """Keys from the AWS Java serde configured as a key serializer, under `<topic>-key`: EntryKey is second by full
    name in its file (message index 0 is Audit), so the key is read as the type its index names."""
    from test_glue_registry import check_glue_keys

    glue = GlueJava(moto_aws, glue_registry, tmp_path)
    ns = topic[-40:].strip("_")
    pool = compile_protos({"entry.proto": ENTRY.format(ns=ns)}, tmp_path / "values")
    Entry = message_class(pool, f"{ns}.Entry")
    values = [(1, "one"), (2, "two"), (3, "three"), (1, "uno"), (4, "four")]
    framed = glue.serialize(topic, pool, [Entry(id=str(i), payer=p) for i, p in values], file="entry.proto")
    keys = {}
    for newer, extra in ((False, ""), (True, " string region = 2;")):
        key_pool = compile_protos({"entry_key.proto": ENTRY_KEY.format(ns=ns, extra=extra)}, tmp_path / f"keys{newer}")
        EntryKey = message_class(key_pool, f"{ns}.EntryKey")
        made = glue.serialize(
            topic,
            key_pool,
            [EntryKey(id=str(i), **({"region": "eu"} if newer else {})) for i in (1, 2, 3, 4)],
            compression="ZLIB" if newer else "NONE",
            file="entry_key.proto",
            key_schema=f"{topic}-key",
        )
        keys |= {(i, newer): data for i, data in zip((1, 2, 3, 4), made)}
    assert keys[(1, False)][18] == 1 and keys[(3, True)][1] == 5, "EntryKey is message index 1; the newer keys zlib"
    config = glue.config(broker, topic, messageType="Entry", mode="upsert", key=["id"], errors="dlq")

    messages = check_glue_keys(
        spark,
        broker,
        state_dir,
        topic,
        config,
        lambda i, newer: keys[(i, newer)],
        lambda i, payer: framed[values.index((i, payer))],
    )
    assert "message index is truncated" in messages["corrupt key payload"]
    names = moto_aws.client("glue").get_schema_version(
        SchemaId={"RegistryName": glue.name, "SchemaName": f"{topic}-key"}, SchemaVersionNumber={"LatestVersion": True}
    )
    assert "region" in names["SchemaDefinition"], "the key's versions are under the key schema's name"
