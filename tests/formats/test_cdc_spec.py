"""Table keys of change-data tables (`envelope: debezium`): what the one spec model accepts and refuses."""

import pytest

from icefloe.errors import ConfigError
from icefloe.spec import parse_config

CLUSTER = {"name": "main", "bootstrapServers": "127.0.0.1:9092", "schemaRegistry": {"url": "http://127.0.0.1:8081"}}


def config(**table):
    return {"sourceClusters": [CLUSTER], "tables": [{"sourceCluster": "main", "topic": "pg.public.customers", **table}]}


def error_of(raw) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, source="Pulumi.dev.yaml")
    return str(caught.value)


@pytest.mark.parametrize("format", ["avro", "json"])
@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_debezium_tables_are_accepted(format, mode):
    table = parse_config(config(format=format, envelope="debezium", mode=mode)).tables[0]
    assert (table.envelope, table.deletes, table.unavailable_value_placeholder) == (
        "debezium",
        "hard",
        "__debezium_unavailable_value",
    )


def test_soft_deletes_and_a_configured_placeholder():
    table = parse_config(
        config(envelope="debezium", mode="upsert", deletes="soft", unavailableValuePlaceholder="__toast")
    ).tables[0]
    assert (table.deletes, table.unavailable_value_placeholder) == ("soft", "__toast")


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (
            {"envelope": "debezium", "format": "protobuf"},
            "envelope debezium applies to format avro or json, not protobuf",
        ),
        ({"envelope": "debezium", "format": "raw"}, "envelope debezium applies to format avro or json, not raw"),
        ({"envelope": "maxwell"}, "envelope: Input should be 'debezium'"),
        ({"envelope": "debezium", "mode": "upsert", "key": ["id"]}, "the row key is the Debezium key"),
        ({"envelope": "debezium", "mode": "upsert", "keyFormat": "json"}, "the row key is the Debezium key"),
        (
            {"envelope": "debezium", "format": "json", "schema": {"fields": [{"name": "id", "type": "long"}]}},
            "takes its columns from the change events",
        ),
        ({"envelope": "debezium", "deletes": "soft"}, "deletes: soft needs mode: upsert"),
        ({"mode": "upsert", "deletes": "soft"}, "deletes: soft needs envelope: debezium"),
        ({"unavailableValuePlaceholder": "x"}, "unavailableValuePlaceholder only applies with envelope: debezium"),
        ({"envelope": "debezium", "deletes": "gone"}, "deletes: Input should be 'hard' or 'soft'"),
    ],
)
def test_config_errors_name_the_key(table, expected):
    message = error_of(config(**table))
    assert "icefloe:tables[0] (pg.public.customers)" in message
    assert expected in message
