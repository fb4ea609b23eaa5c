"""A seeded random change workload on a PostgreSQL `customers` table, and the change events Debezium makes of it.

The table has one column of each kind a mirror must carry exactly: an integer primary key, text, a TOASTed text
(`notes`, ~3 kB stored out of line without compression, so an UPDATE that leaves it alone sends Debezium's
`__debezium_unavailable_value`), numeric(12,2), timestamptz, date, boolean, text[], jsonb and uuid, with NULLs.
The workload is SQL text for psql: an initial set of rows (Debezium's snapshot), then inserts, updates (most leave
`notes` unchanged), deletes, primary-key changes (some to keys deleted earlier), multi-statement transactions (some
rolled back), and optionally one TRUNCATE. The table keeps PostgreSQL's default REPLICA IDENTITY: that is what
sources run with, and it is the hard case (a delete's `before` holds only the key; the unchanged-TOAST placeholder).

`cdc_marker` is a second captured table: inserting a marker row after a step and waiting for its event on each
connector's marker topic tells that the connector has sent everything before it (Debezium sends changes in commit
order, and Connect's producer writes them to the one broker in that order).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import string
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .processes import ServiceError

TABLE = "customers"
MARKER_TABLE = "cdc_marker"
PLACEHOLDER = "__debezium_unavailable_value"

DDL = f"""\
CREATE TABLE {TABLE} (
  id integer PRIMARY KEY,
  name text NOT NULL,
  notes text,
  balance numeric(12, 2),
  updated_at timestamptz,
  birthday date,
  active boolean,
  tags text[],
  profile jsonb,
  ref uuid
);
-- No compression: every notes value (> 2 kB) is stored out of line, TOASTed.
ALTER TABLE {TABLE} ALTER COLUMN notes SET STORAGE EXTERNAL;
CREATE TABLE {MARKER_TABLE} (id integer PRIMARY KEY);
"""

NAMES = ["Ada", "Grace", "Edsger", "Barbara", "O'Brien", "Zoë", "Łukasz", "José", "李", "Ngozi"]
TIERS = ["free", "pro", "enterprise"]
NON_KEY = ["name", "balance", "updated_at", "birthday", "active", "tags", "profile", "ref"]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass
class Workload:
    """SQL for psql, made from a seed: the same seed gives the same statements. It tracks which keys exist (and
    which were deleted) so that every statement touches a real row or makes a new one."""

    seed: int
    next_id: int = 1

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.ids: set[int] = set()
        self.deleted: set[int] = set()
        self.counts: dict[str, int] = {}

    # -- values as SQL literals (None -> NULL), from the seed
    def _maybe_null(self, literal: str, rate: float = 0.15) -> str:
        return "NULL" if self.rng.random() < rate else literal

    def notes(self) -> str:
        alphabet = string.ascii_letters + string.digits + " .,;"
        return _quote("".join(self.rng.choices(alphabet, k=self.rng.randint(2500, 4000))))

    def value(self, column: str) -> str:
        rng = self.rng
        if column == "name":
            return _quote(f"{rng.choice(NAMES)} {rng.randint(1, 9999)}")
        if column == "balance":
            return self._maybe_null(str(Decimal(rng.randint(-(10**11) + 1, 10**11 - 1)).scaleb(-2)))
        if column == "updated_at":
            instant = dt.datetime(1990, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
                microseconds=rng.randrange(40 * 365 * 86400 * 10**6)
            )
            zone = dt.timezone(dt.timedelta(minutes=rng.choice([0, 0, 330, -420])))  # written in several zones
            return self._maybe_null(_quote(instant.astimezone(zone).isoformat()) + "::timestamptz")
        if column == "birthday":
            day = dt.date(1940, 1, 1) + dt.timedelta(days=rng.randrange(70 * 365))
            return self._maybe_null(_quote(day.isoformat()) + "::date")
        if column == "active":
            return self._maybe_null(rng.choice(["true", "false"]))
        if column == "tags":
            tags = [
                rng.choice(["vip", "new", "churn risk", "ärger", "a,b", 'q"uote', None])
                for _ in range(rng.randint(0, 3))
            ]
            items = ", ".join("NULL" if t is None else _quote(t) for t in tags)
            return self._maybe_null(f"ARRAY[{items}]::text[]")
        if column == "profile":
            profile = {
                "tier": rng.choice(TIERS),
                "score": rng.randint(0, 10**6) / 100,
                "visits": [rng.randint(0, 9) for _ in range(rng.randint(0, 3))],
                "nested": {"ok": rng.random() < 0.5},
            }
            return self._maybe_null(_quote(json.dumps(profile)) + "::jsonb")
        if column == "ref":
            return self._maybe_null(_quote(str(uuid.UUID(int=rng.getrandbits(128), version=4))) + "::uuid")
        raise ValueError(column)

    def _new_id(self) -> int:
        if self.deleted and self.rng.random() < 0.2:  # a key deleted earlier comes back
            key = self.rng.choice(sorted(self.deleted))
            self.deleted.discard(key)
            return key
        key, self.next_id = self.next_id, self.next_id + 1
        return key

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # -- statements
    def insert(self) -> str:
        key = self._new_id()
        self.ids.add(key)
        self._count("insert")
        values = ", ".join(self.value(c) for c in NON_KEY)
        return f"INSERT INTO {TABLE} (id, notes, {', '.join(NON_KEY)}) VALUES ({key}, {self.notes()}, {values});"

    def update(self) -> str:
        key = self.rng.choice(sorted(self.ids))
        columns = self.rng.sample(NON_KEY, self.rng.randint(1, 3))
        assignments = [f"{c} = {self.value(c)}" for c in columns]
        if self.rng.random() < 0.25:
            assignments.append(f"notes = {self.notes()}")
            self._count("update with notes")
        else:
            self._count("update leaving notes")
        return f"UPDATE {TABLE} SET {', '.join(assignments)} WHERE id = {key};"

    def delete(self) -> str:
        key = self.rng.choice(sorted(self.ids))
        self.ids.discard(key)
        self.deleted.add(key)
        self._count("delete")
        return f"DELETE FROM {TABLE} WHERE id = {key};"

    def change_key(self) -> str:
        old = self.rng.choice(sorted(self.ids))
        new = self._new_id()
        self.ids.discard(old)
        self.deleted.add(old)
        self.ids.add(new)
        self._count("key change")
        also = f", balance = {self.value('balance')}" if self.rng.random() < 0.5 else ""
        return f"UPDATE {TABLE} SET id = {new}{also} WHERE id = {old};"

    def statement(self) -> str:
        if len(self.ids) < 5:
            return self.insert()
        pick = self.rng.random()
        if pick < 0.25:
            return self.insert()
        if pick < 0.65:
            return self.update()
        if pick < 0.85:
            return self.delete()
        return self.change_key()

    def initial_rows(self, rows: int) -> str:
        return "\n".join(self.insert() for _ in range(rows))

    def changes(self, statements: int, truncate_after: int | None = None) -> str:
        """About `statements` statements: single ones and transactions of 2-5 (one in ten rolled back), with a
        TRUNCATE after `truncate_after` of them if given."""
        script: list[str] = []
        done = 0
        truncated = truncate_after is None
        while done < statements:
            if not truncated and done >= truncate_after:  # type: ignore[operator]
                script.append(f"TRUNCATE {TABLE};")
                self.deleted |= self.ids
                self.ids.clear()
                self._count("truncate")
                truncated = True
            if self.rng.random() < 0.6:
                script.append(self.statement())
                done += 1
                continue
            size = self.rng.randint(2, 5)
            if self.rng.random() < 0.1:
                saved = (set(self.ids), set(self.deleted), self.next_id, dict(self.counts))
                body = [self.statement() for _ in range(size)]
                self.ids, self.deleted, self.next_id, self.counts = saved
                self.counts["rolled back"] = self.counts.get("rolled back", 0) + 1
                script += ["BEGIN;", *body, "ROLLBACK;"]
            else:
                script += ["BEGIN;", *(self.statement() for _ in range(size)), "COMMIT;"]
                done += size
        return "\n".join(script)


def typed_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`PostgresCluster.rows()` of the customers table as Python values the way the database has them: timestamptz
    as aware UTC datetimes, dates, UUIDs as text, numeric as Decimal, jsonb as its JSON value."""
    typed = []
    for row in rows:
        row = dict(row)
        if row["updated_at"] is not None:
            row["updated_at"] = dt.datetime.fromisoformat(row["updated_at"]).astimezone(dt.UTC)
        if row["birthday"] is not None:
            row["birthday"] = dt.date.fromisoformat(row["birthday"])
        typed.append(row)
    return sorted(typed, key=lambda r: r["id"])


# -- comparing a mirror table with the source
COLUMNS = ["id", "name", "notes", "balance", "updated_at", "birthday", "active", "tags", "profile", "ref"]


def _json_value(value: Any) -> Any:
    return json.loads(value, parse_float=Decimal) if isinstance(value, str) else value


def as_source_row(row: dict[str, Any], converter: str) -> dict[str, Any]:
    """A table row in the database's terms: instants in UTC, UUIDs as text, JSON as its value. Schemaless JSON
    carries no semantic types, so there a date may arrive as its days since 1970, an instant as its ISO text."""
    out = {column: row.get(column) for column in COLUMNS}
    if isinstance(out["updated_at"], dt.datetime):
        out["updated_at"] = out["updated_at"].astimezone(dt.UTC)
    if isinstance(out["ref"], uuid.UUID | bytes):
        out["ref"] = str(out["ref"] if isinstance(out["ref"], uuid.UUID) else uuid.UUID(bytes=out["ref"]))
    out["profile"] = _json_value(out["profile"])
    if isinstance(out["tags"], tuple):
        out["tags"] = list(out["tags"])
    if converter == "json-schemaless":
        if isinstance(out["birthday"], int):
            out["birthday"] = dt.date(1970, 1, 1) + dt.timedelta(days=out["birthday"])
        if isinstance(out["updated_at"], str):
            out["updated_at"] = dt.datetime.fromisoformat(out["updated_at"]).astimezone(dt.UTC)
        if isinstance(out["balance"], float):
            out["balance"] = Decimal(str(out["balance"]))
    return out


def mirror_differences(expected: list[dict], rows: list[dict], converter: str = "avro") -> list[str]:
    """How a mirror table's rows (pyiceberg's or DuckDB's) differ from the source's (`typed_rows`): per key,
    missing, not in the source, or each column that differs (expected vs got, cut short). Empty: equal."""
    got = [as_source_row(row, converter) for row in rows]
    want, have = {r["id"]: r for r in expected}, {r["id"]: r for r in got}
    if len(have) < len(got):
        return [f"{len(got) - len(have)} rows share a key with another row"]
    out = [f"id {k}: missing" for k in sorted(want.keys() - have.keys())]
    out += [f"id {k}: not in the source" for k in sorted(have.keys() - want.keys())]
    for key in sorted(want.keys() & have.keys()):
        for column in COLUMNS:
            if want[key][column] != have[key][column]:
                shown = [str(v)[:60] for v in (want[key][column], have[key][column])]
                out.append(f"id {key} {column}: expected {shown[0]!r}, got {shown[1]!r}")
    return out


# -- reading what Debezium wrote
@dataclass(frozen=True)
class Event:
    """One message of a Debezium topic, decoded: `key`/`value` as dicts (None for a tombstone or a keyless `t`)."""

    partition: int
    offset: int
    key: dict | None
    value: dict | None
    headers: dict[str, bytes]

    @property
    def op(self) -> str | None:
        return None if self.value is None else self.value.get("op")

    @property
    def lsn(self) -> int | None:
        return None if self.value is None else self.value["source"].get("lsn")


def decoder(converter: str, registry_url: str | None):
    """bytes -> dict for one converter's messages (keys and values alike)."""
    if converter.startswith("avro"):
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
        return lambda data: None if data is None else deserializer(data, None)
    if converter == "json":
        return lambda data: None if data is None else json.loads(data)["payload"]
    return lambda data: None if data is None else json.loads(data, parse_float=Decimal)


_decoders: dict[tuple[str, str | None], Any] = {}  # one per converter and registry: their schema caches live on


def read_events(
    bootstrap: str, topic: str, converter: str, registry_url: str | None, timeout: float = 30.0
) -> list[Event]:
    """Every message of `topic` up to its current end, decoded, in (partition, offset) order."""
    if (converter, registry_url) not in _decoders:
        _decoders[converter, registry_url] = decoder(converter, registry_url)
    decode = _decoders[converter, registry_url]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"icefloe-read-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in metadata.partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        left = {p for p, end in ends.items() if end > 0}
        events: list[Event] = []
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise ServiceError(f"reading {topic}: partitions {sorted(left)} not read to their end in {timeout:g}s")
            for message in consumer.consume(1000, 0.1):
                if message.error():
                    raise ServiceError(f"reading {topic}: {message.error()}")
                events.append(
                    Event(
                        message.partition(),
                        message.offset(),
                        decode(message.key()),
                        decode(message.value()),
                        dict(message.headers() or []),
                    )
                )
                if message.offset() + 1 >= ends[message.partition()]:
                    left.discard(message.partition())
        return sorted(events, key=lambda e: (e.partition, e.offset))
    finally:
        consumer.close()


def wait_for_marker(
    bootstrap: str, topics: dict[str, str], marker: int, registry_url: str | None, timeout: float = 300.0
) -> None:
    """Wait until every marker topic ({topic: converter}) holds the insert of marker row `marker`."""
    deadline = time.monotonic() + timeout
    waiting = dict(topics)
    while waiting:
        for topic, converter in list(waiting.items()):
            try:
                events = read_events(bootstrap, topic, converter, registry_url)
            except (ServiceError, KeyError, KafkaException):
                events = []  # the topic does not exist yet, or its partitions have no leader yet
            if any(e.key == {"id": marker} and e.op == "c" for e in events):
                del waiting[topic]
        if waiting and time.monotonic() > deadline:
            raise ServiceError(f"marker {marker} did not reach {sorted(waiting)} within {timeout:g}s")
        if waiting:
            time.sleep(0.3)


def mark(postgres, marker: int, database: str | None = None) -> None:
    postgres.sql(f"INSERT INTO {MARKER_TABLE} VALUES ({marker});", database=database)
