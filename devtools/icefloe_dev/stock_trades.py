"""Demo data: stock trades shaped like Confluent Datagen's `stock_trades` quickstart, plus an event time."""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Iterator

SCHEMA = """
{
  "type": "record",
  "name": "StockTrade",
  "namespace": "io.icefloe.demo",
  "fields": [
    {"name": "side", "type": {"type": "enum", "name": "Side", "symbols": ["BUY", "SELL"]}},
    {"name": "quantity", "type": "int"},
    {"name": "symbol", "type": "string"},
    {"name": "price", "type": "int"},
    {"name": "account", "type": "string"},
    {"name": "userid", "type": "string"},
    {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}}
  ]
}
"""
SYMBOLS = ["ZBZX", "ZJZZT", "ZTEST", "ZVV", "ZVZZT", "ZWZZT", "ZXZZT"]
ACCOUNTS = ["ABC123", "LMN456", "XYZ789"]


def trades(count: int, seed: int = 7, start_ms: int | None = None) -> Iterator[tuple[str, dict]]:
    """(key, value) pairs; the key is the user, so one user's trades stay in order in one partition."""
    rng = random.Random(seed)
    now_ms = start_ms if start_ms is not None else int(time.time() * 1000) - count
    for index in range(count):
        userid = f"User_{rng.randint(1, 9)}"
        yield (
            userid,
            {
                "side": rng.choice(("BUY", "SELL")),
                "quantity": rng.randint(1, 5000),
                "symbol": rng.choice(SYMBOLS),
                "price": rng.randint(5, 1000),
                "account": rng.choice(ACCOUNTS),
                "userid": userid,
                "event_time": now_ms + index,
            },
        )


# The same trades as Protobuf and as JSON Schema (`icefloe demo --format protobuf|json-schema`).
PROTO_FILE = "io/icefloe/demo/stock_trade.proto"
PROTO = """syntax = "proto3";
package io.icefloe.demo;
import "google/protobuf/timestamp.proto";

enum Side { SIDE_UNSPECIFIED = 0; BUY = 1; SELL = 2; }
message StockTrade {
  Side side = 1;
  int32 quantity = 2;
  string symbol = 3;
  int32 price = 4;
  string account = 5;
  string userid = 6;
  google.protobuf.Timestamp event_time = 7;
}
"""
JSON_SCHEMA = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "StockTrade",
        "type": "object",
        "properties": {
            "side": {"enum": ["BUY", "SELL"]},
            "quantity": {"type": "integer"},
            "symbol": {"type": "string"},
            "price": {"type": "integer"},
            "account": {"type": "string"},
            "userid": {"type": "string"},
            "event_time": {"type": "string", "format": "date-time"},
        },
        "required": ["side", "quantity", "symbol", "price", "account", "userid", "event_time"],
        "additionalProperties": False,
    }
)


def as_protobuf(message_type, trade: dict):
    message = message_type(**{k: v for k, v in trade.items() if k != "event_time"})
    message.event_time.FromMilliseconds(trade["event_time"])
    return message


def as_json(trade: dict) -> dict:
    moment = dt.datetime.fromtimestamp(trade["event_time"] / 1000, dt.UTC)
    return {**trade, "event_time": moment.isoformat(timespec="milliseconds")}
