"""The topic-spec model: what users write in Pulumi stack config, and the errors a typo gets."""

from pathlib import Path

import pytest

from icefloe.errors import ConfigError
from icefloe.spec import Model, glue_safe_name, load_config, namespaced, parse_config, read_stack_file, validate_keys

CLUSTER = {"name": "main", "bootstrapServers": "127.0.0.1:9092", "schemaRegistry": {"url": "http://127.0.0.1:8081"}}


def config(**table):
    return {"sourceClusters": [CLUSTER], "tables": [{"sourceCluster": "main", "topic": "stock_trades", **table}]}


def error_of(raw) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, source="Pulumi.dev.yaml")
    return str(caught.value)


def test_defaults_derive_names_and_modes():
    parsed = parse_config(config(topic="Stock-Trades.v1"))
    table = parsed.tables[0]
    assert parsed.identifier(table) == "main.stock_trades_v1"
    assert (table.format, table.mode, table.errors, table.refresh_seconds, table.enabled) == (
        "avro",
        "append",
        "fail",
        900,
        True,
    )
    assert table.partition_by == ()


def test_partition_transforms_parse_to_spark_ddl():
    table = parse_config(config(partitionBy=["hour(kafka_timestamp)", "bucket(16, account)", "symbol"])).tables[0]
    assert [p.spark_ddl() for p in table.partitions] == [
        "hours(`kafka_timestamp`)",
        "bucket(16, `account`)",
        "`symbol`",
    ]


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"formatt": "avro"}, "icefloe:tables[0] (stock_trades).formatt: Extra inputs are not permitted"),
        ({"format": "jsn"}, "icefloe:tables[0] (stock_trades).format: Input should be"),
        ({"format": "json-schema", "messageType": "a.B"}, "messageType only applies with format: protobuf"),
        (
            {"format": "protobuf", "schema": {"fields": [{"name": "a", "type": "long"}]}},
            "format protobuf takes its schema from the registry",
        ),
        ({"format": "json", "partitionBy": ["day(at)"]}, "a schemaless JSON table (no schema) can only be partitioned"),
        ({"format": "raw", "schema": {"fields": [{"name": "a", "type": "long"}]}}, "it takes no schema"),
        ({"format": "string", "keyFormat": "raw"}, "keyFormat only applies with key"),
        ({"partitionBy": ["hourly(ts)"]}, "partitionBy 'hourly(ts)' is not understood"),
        ({"refresh": "soon"}, "'soon' is not a duration"),
        ({"sourceCluster": "other"}, "sourceCluster 'other' is not one of ['main']"),
        ({"table": "Bad-Name"}, "icefloe:tables[0] (Bad-Name).table: String should match pattern"),
        ({"schema": {"fields": [{"name": "a", "type": "varchar"}]}}, "unknown type 'varchar'"),
        ({"schema": {"fields": [{"name": "kafka_offset", "type": "long"}]}}, "clash with icefloe's Kafka metadata"),
        (
            {"schema": {"fields": [{"name": "a", "type": "long"}]}, "partitionBy": ["day(b)"]},
            "names unknown field 'b'",
        ),
        ({"mode": "append", "key": ["a"]}, "key is only used with mode: upsert"),
        ({"maintenance": {"orphanFileAge": "1h"}}, "maintenance.orphanFileAge 1h is shorter than runTimeout 12h"),
        (
            {"runTimeout": "1m", "maintenance": {"orphanFileAge": "30s"}},
            "orphanFileAge 30s is shorter than runTimeout 1m",
        ),
    ],
)
def test_config_errors_name_the_table_and_field(table, expected):
    message = error_of(config(**table))
    assert message.startswith("Pulumi.dev.yaml: invalid icefloe config") or "unknown key" in message
    assert expected in message


def test_every_registry_format_is_accepted_through_a_glue_registry():
    glue = {**CLUSTER, "schemaRegistry": {"type": "glue", "registryName": "r", "region": "eu-west-1"}}
    for fmt in ("avro", "json-schema", "protobuf"):
        assert parse_config({**config(format=fmt), "sourceClusters": [glue]}).tables[0].format == fmt
    table = parse_config({**config(format="protobuf", messageType="a.Trade"), "sourceClusters": [glue]}).tables[0]
    assert table.message_type == "a.Trade"


def test_sasl_needs_a_secret_reference_not_a_password():
    cluster = {**CLUSTER, "securityProtocol": "SASL_SSL", "saslMechanism": "PLAIN"}
    assert "needs saslMechanism and credentialsSecret" in error_of({"sourceClusters": [cluster]})
    cluster["credentialsSecret"] = {"password": "hunter2"}
    assert "credentialsSecret.password: Extra inputs are not permitted" in error_of({"sourceClusters": [cluster]})
    cluster["credentialsSecret"] = {"secretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:kafka-AbCd"}
    assert parse_config({"sourceClusters": [cluster]}).source_clusters[0].credentials_secret.secret_arn


def test_a_registry_url_carrying_credentials_is_refused_without_printing_them():
    cluster = {**CLUSTER, "schemaRegistry": {"url": "https://key:s3cr3t-marker@registry.example.com"}}
    message = error_of({"sourceClusters": [cluster]})
    assert "schemaRegistry.url" in message and "credentialsSecret" in message
    assert "s3cr3t-marker" not in message and "key:" not in message


def test_unknown_top_level_key_is_named():
    assert "unknown key(s) icefloe:tabels" in error_of({"sourceClusters": [CLUSTER], "tabels": []})


def test_duplicate_tables_are_rejected():
    raw = config()
    raw["tables"].append(dict(raw["tables"][0]))
    assert "table main.stock_trades is also declared" in error_of(raw)


def test_load_config_reads_a_pulumi_stack_file(tmp_path: Path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(
        "config:\n  aws:region: eu-west-1\n  icefloe:sourceClusters:\n    - name: main\n      bootstrapServers: b:9092\n"
        "  icefloe:tables:\n    - sourceCluster: main\n      topic: orders\n      enabled: false\n"
    )
    parsed = load_config(str(path))
    assert [parsed.identifier(t) for t in parsed.tables] == ["main.orders"]
    assert parsed.select(None) == []  # disabled tables do not run
    with pytest.raises(ConfigError, match="no table named 'nope'"):
        parsed.select(["nope"])


def test_load_config_errors_name_the_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config: [oops")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))


def test_one_stack_file_reader_and_one_error_format_for_every_model(tmp_path: Path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text("config:\n  aws:region: eu-west-1\n  icefloe:owner: me\n  icefloe:tables: [{topic: orders}]\n")
    config = read_stack_file(str(path))  # what the runtime's load_config and the deploy dry run both read
    assert config == {"aws:region": "eu-west-1", "icefloe:owner": "me", "icefloe:tables": [{"topic": "orders"}]}
    assert namespaced(config) == {"owner": "me", "tables": [{"topic": "orders"}]}
    (tmp_path / "Pulumi.flat.yaml").write_text("icefloe:owner: me\n")
    with pytest.raises(ConfigError, match="expected a Pulumi stack file with a top-level 'config:' mapping"):
        read_stack_file(str(tmp_path / "Pulumi.flat.yaml"))

    class Owned(Model):  # any model over `icefloe:*` keys, like the Pulumi program's deployment settings
        owner: int
        tables: tuple[dict, ...] = ()

    with pytest.raises(ConfigError) as caught:
        validate_keys(Owned, {"owner": "me", "tables": ["x"], "other": 1}, ("owner", "tables"), "Pulumi.dev.yaml")
    assert str(caught.value) == (
        "Pulumi.dev.yaml: invalid icefloe config:\n"
        "  icefloe:owner: Input should be a valid integer, unable to parse string as an integer\n"
        "  icefloe:tables[0]: Input should be a valid dictionary"
    )


def test_glue_safe_name():
    assert glue_safe_name("Orders.EU-West") == "orders_eu_west"
    assert glue_safe_name("123abc") == "t_123abc"
