"""Demo data: stock trades shaped like Confluent Datagen's `stock_trades` quickstart, plus an event time."""

from __future__ import annotations

import random
import time
from typing import Iterator

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
        yield userid, {
            "side": rng.choice(("BUY", "SELL")),
            "quantity": rng.randint(1, 5000),
            "symbol": rng.choice(SYMBOLS),
            "price": rng.randint(5, 1000),
            "account": rng.choice(ACCOUNTS),
            "userid": userid,
            "event_time": now_ms + index,
        }
