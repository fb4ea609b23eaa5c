"""Protobuf topics through the real registry (Apicurio, Confluent API), end to end into Iceberg.

Records are produced with confluent-kafka's own ProtobufSerializer (schemas registered as serialized descriptors,
imports as references), or framed by hand after registering `.proto` text with imports, as Java producers and
registry UIs do (Apicurio hands text back as text). Tables are read back with pyiceberg and DuckDB.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from icefloe.errors import ConfigError
from icefloe.materialize.batch import materialize_once
from support import as_utc, compile_protos, message_class, produce, protobuf_serializer, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]

MONEY = """syntax = "proto3";
package {ns};
message Money {{ int64 units = 1; string currency = 2; }}
"""
TRADE = """syntax = "proto3";
package {ns};
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "{ns}/money.proto";

enum Side {{ SIDE_UNSPECIFIED = 0; BUY = 1; SELL = 2; }}
message Trade {{
  message Venue {{ string name = 1; int32 rank = 2; }}
  string id = 1;
  int32 i32 = 2;
  sint32 s32 = 3;
  int64 i64 = 4;
  uint32 u32 = 5;
  uint64 u64 = 6;
  double d = 7;
  float f = 8;
  bool flag = 9;
  bytes raw = 10;
  Side side = 11;
  Venue venue = 12;
  repeated string tags = 13;
  repeated Venue history = 14;
  map<string, int64> counts = 15;
  map<int32, Venue> by_rank = 16;
  oneof payment {{ string card = 17; Money cash = 18; }}
  google.protobuf.Timestamp at = 19;
  google.protobuf.Duration took = 20;
  google.protobuf.Int64Value maybe_qty = 21;
  google.protobuf.StringValue maybe_note = 22;
  google.protobuf.Struct attrs = 23;
  optional int32 opt = 24;{extra}
}}
"""


def _ns(topic: str) -> str:
    return topic[-40:].strip("_")  # a proto package and reference subject per test


def trade_pool(tmp_path, topic: str, extra: str = ""):
    ns = _ns(topic)
    files = {f"{ns}/money.proto": MONEY.format(ns=ns), f"{ns}/trade.proto": TRADE.format(ns=ns, extra=extra)}
    return ns, compile_protos(files, tmp_path)


def full_trade(Trade, ns_pool) -> object:
    trade = Trade(
        id="t1",
        i32=-7,
        s32=-9,
        i64=2**40,
        u32=4_000_000_000,
        u64=2**64 - 1,
        d=2.5,
        f=1.5,
        flag=True,
        raw=b"\x00\xff",
        side=2,
        tags=["a", "b"],
        card="4111",
    )
    trade.venue.name, trade.venue.rank = "XNAS", 1
    trade.history.add(name="XLON", rank=2)
    trade.counts["x"] = 3
    trade.by_rank[5].name = "five"
    trade.at.FromDatetime(dt.datetime(2024, 2, 29, 12, 30, 1, 250000))
    trade.took.FromMicroseconds(1_500_000)
    trade.maybe_qty.value = 0  # set, to zero: a wrapper keeps presence
    trade.attrs.update({"k": "v", "n": 1})
    trade.opt = 0
    return trade


def three_trades(Trade, pool) -> list:
    """Every type set (t1), nothing but the id (t2), the other oneof member (t3): what `check_trades` expects."""
    cash = Trade(id="t3")
    cash.cash.units, cash.cash.currency = 12, "EUR"
    return [full_trade(Trade, pool), Trade(id="t2"), cash]


def test_every_protobuf_type_from_confluents_serializer(
    spark, broker, registry, state_dir, topic, make_config, tmp_path
):
    ns, pool = trade_pool(tmp_path, topic)
    Trade = message_class(pool, f"{ns}.Trade")
    serialize = protobuf_serializer(registry.url, topic, Trade)
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": serialize(trade)} for trade in three_trades(Trade, pool)])
    config = make_config({"topic": topic, "format": "protobuf"})
    result = materialize_once(spark, config, config.tables[0])
    assert result.read_path == "python" and result.rows_written == 3
    check_trades(state_dir, result)


def check_trades(state_dir, result) -> None:
    """The rows of `three_trades`, field by field, as pyiceberg and DuckDB read them back."""
    for rows in (read_pyiceberg(state_dir, result.identifier), read_duckdb(result.metadata_location)):
        rows = {r["id"]: r for r in rows}
        full = rows["t1"]
        assert (full["i32"], full["s32"], full["i64"], full["u32"], full["u64"]) == (
            -7,
            -9,
            2**40,
            4_000_000_000,
            Decimal(2**64 - 1),
        )
        assert (full["d"], full["f"], full["flag"], bytes(full["raw"]), full["side"]) == (
            2.5,
            1.5,
            True,
            b"\x00\xff",
            "SELL",
        )
        assert full["venue"] == {"name": "XNAS", "rank": 1}
        assert full["tags"] == ["a", "b"] and full["history"] == [{"name": "XLON", "rank": 2}]
        assert _as_dict(full["counts"]) == {"x": 3} and _as_dict(full["by_rank"]) == {5: {"name": "five", "rank": 0}}
        assert (full["card"], full["cash"], full["payment"]) == ("4111", None, "card")
        assert as_utc(full["at"]) == dt.datetime(2024, 2, 29, 12, 30, 1, 250000, tzinfo=dt.UTC)
        assert full["took"] == 1_500_000
        assert (full["maybe_qty"], full["maybe_note"], full["opt"]) == (0, None, 0)
        assert json.loads(full["attrs"]) == {"k": "v", "n": 1}

        empty = rows["t2"]  # nothing but the id sent: defaults where the encoding has no presence, else null
        assert (empty["i32"], empty["u64"], empty["flag"], bytes(empty["raw"]), empty["side"]) == (
            0,
            Decimal(0),
            False,
            b"",
            "SIDE_UNSPECIFIED",
        )
        assert empty["tags"] == [] and _as_dict(empty["counts"]) == {}
        assert (empty["venue"], empty["payment"], empty["card"], empty["at"], empty["took"]) == (
            None,
            None,
            None,
            None,
            None,
        )
        assert (empty["maybe_qty"], empty["attrs"], empty["opt"]) == (None, None, None)

        assert (rows["t3"]["cash"], rows["t3"]["payment"], rows["t3"]["card"]) == (
            {"units": 12, "currency": "EUR"},
            "cash",
            None,
        )


def _as_dict(value) -> dict:
    """Maps come back as a list of pairs from pyiceberg, as a dict from DuckDB."""
    return dict(value) if isinstance(value, list) else value


def _register_text(client: SchemaRegistryClient, topic: str, ns: str, trade_text: str) -> int:
    """Register `.proto` text as a Java producer or a registry UI would: the import as a reference, by text."""
    money_subject = f"{ns}-money"
    client.register_schema(money_subject, Schema(MONEY.format(ns=ns), "PROTOBUF"))
    version = client.get_latest_version(money_subject).version
    reference = SchemaReference(f"{ns}/money.proto", money_subject, version)
    return client.register_schema(f"{topic}-value", Schema(trade_text, "PROTOBUF", [reference]))


def framed(schema_id: int, message, indexes: bytes = b"\x00") -> bytes:
    """Confluent wire format as Java's serializer writes it: magic byte, schema id, message indexes, message."""
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + message.SerializeToString()


def test_text_schema_with_imports(spark, broker, registry, state_dir, topic, make_config, tmp_path):
    ns, pool = trade_pool(tmp_path, topic)
    Trade = message_class(pool, f"{ns}.Trade")
    client = SchemaRegistryClient({"url": registry.url})
    schema_id = _register_text(client, topic, ns, TRADE.format(ns=ns, extra=""))
    assert "message Trade" in client.get_schema(schema_id, fmt="serialized").schema_str, "Apicurio returns the text"

    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": framed(schema_id, full_trade(Trade, pool))}])
    config = make_config({"topic": topic, "format": "protobuf", "messageType": "Trade"})
    result = materialize_once(spark, config, config.tables[0])
    for row in (read_pyiceberg(state_dir, result.identifier)[0], read_duckdb(result.metadata_location)[0]):
        assert (row["id"], row["u64"], row["side"], row["venue"], row["payment"]) == (
            "t1",
            Decimal(2**64 - 1),
            "SELL",
            {"name": "XNAS", "rank": 1},
            "card",
        )
        assert as_utc(row["at"]) == dt.datetime(2024, 2, 29, 12, 30, 1, 250000, tzinfo=dt.UTC)


def test_unknown_message_type_is_named(spark, broker, registry, topic, make_config):
    """A messageType the schema does not declare stops the table, listing what it declares."""
    client = SchemaRegistryClient({"url": registry.url})
    text = 'syntax = "proto3";\nmessage A { string id = 1; }\n'
    client.register_schema(f"{topic}-value", Schema(text, "PROTOBUF"))
    broker.create_topic(topic, 1)
    config = make_config({"topic": topic, "format": "protobuf", "messageType": "Missing"})
    with pytest.raises(ConfigError, match=r"messageType 'Missing' is not in the schema; it declares \['A'\]"):
        materialize_once(spark, config, config.tables[0])


def test_text_evolution_and_incompatible_change(spark, broker, registry, state_dir, topic, make_config, tmp_path):
    """Versions registered as text, as Java producers do. (Apicurio 3.0.9 cannot add a version to a subject whose
    versions are serialized descriptors: it answers 500 "Syntax error", parsing the stored version as text; so
    confluent-kafka's Python serializer can only ever register a subject's first version there.)"""
    ns, pool = trade_pool(tmp_path, topic)
    Trade = message_class(pool, f"{ns}.Trade")
    client = SchemaRegistryClient({"url": registry.url})
    v1 = _register_text(client, topic, ns, TRADE.format(ns=ns, extra=""))
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": framed(v1, Trade(id="old", i64=5))}])
    config = make_config({"topic": topic, "format": "protobuf"})
    materialize_once(spark, config, config.tables[0])

    v2 = _register_text(client, topic, ns, TRADE.format(ns=ns, extra="\n  string venue_code = 25;"))
    _, pool_v2 = trade_pool(tmp_path / "v2", topic, extra="\n  string venue_code = 25;")
    Trade_v2 = message_class(pool_v2, f"{ns}.Trade")
    produce(broker.bootstrap_servers, topic, [{"value": framed(v2, Trade_v2(id="new", venue_code="XNAS"))}])
    result = materialize_once(spark, config, config.tables[0])
    rows = {r["id"]: r for r in read_duckdb(result.metadata_location)}
    assert (rows["old"]["venue_code"], rows["new"]["venue_code"], rows["old"]["i64"]) == (None, "XNAS", 5)

    # Field 4 changed from int64 to string: the registry (BACKWARD) refuses it.
    breaking = TRADE.format(ns=ns, extra="\n  string venue_code = 25;").replace("int64 i64 = 4;", "string i64 = 4;")
    with pytest.raises(SchemaRegistryError) as refused:
        _register_text(client, topic, ns, breaking)
    assert refused.value.http_status_code == 409, refused.value

    # Registered anyway where the registry allows it (Apicurio's NONE on a subject falls back to the global rule,
    # so the global rule is lifted for a moment): the table refuses the type change with a clear error.
    registry.set_compatibility("NONE")
    try:
        v3 = _register_text(client, topic, ns, breaking)
    finally:
        registry.set_compatibility("BACKWARD")
    # (the table takes a new version when a record written with it is planned)
    produce(broker.bootstrap_servers, topic, [{"value": framed(v3, Trade_v2(id="newer"))}])
    with pytest.raises(ConfigError, match="column i64 changed from bigint to string: not a safe evolution"):
        materialize_once(spark, config, config.tables[0])


KEYED = """syntax = "proto3";
package {ns};
message AccountKey {{ string account = 1; }}
message Account {{ string account = 1; int64 balance = 2; }}
"""


def test_upsert_keyed_by_a_field_with_protobuf_keys(spark, broker, registry, state_dir, topic, make_config, tmp_path):
    """`key: [account]`, keyFormat protobuf (the default for a Protobuf table): a tombstone's key deletes its row."""
    ns = _ns(topic)
    pool = compile_protos({f"{ns}/keyed.proto": KEYED.format(ns=ns)}, tmp_path)
    Key, Account = message_class(pool, f"{ns}.AccountKey"), message_class(pool, f"{ns}.Account")
    key = protobuf_serializer(registry.url, topic, Key, key=True)
    value = protobuf_serializer(registry.url, topic, Account)

    def upsert(account, balance):
        return {"key": key(Key(account=account)), "value": value(Account(account=account, balance=balance))}

    broker.create_topic(topic, 1)
    produce(
        broker.bootstrap_servers,
        topic,
        [upsert("a", 1), upsert("b", 2), upsert("a", 3), {"key": key(Key(account="b")), "value": None}],
    )
    config = make_config(
        {"topic": topic, "format": "protobuf", "messageType": "Account", "mode": "upsert", "key": ["account"]}
    )
    result = materialize_once(spark, config, config.tables[0])
    assert [(r["account"], r["balance"]) for r in read_duckdb(result.metadata_location)] == [("a", 3)]
