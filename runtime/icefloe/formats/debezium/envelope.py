"""One Debezium change event to a row of its table and the change it makes (executor side).

The event's value is the envelope (`before`, `after`, `source`, `op`, `ts_ms`), its Kafka key the source row's
primary key (a struct of the key columns). A mirror table's row is the `after` image, with the generic change
columns the upsert writer consumes (`batch_columns`): the change's kind, its source position, the columns the source
did not send (the unavailable-value placeholder: the row keeps its value) and, for a primary-key change, the key the
row moved from. A changelog's row is the `after` image with `cdc_op`, `cdc_position`, `cdc_ts` and `cdc_before`.

Ops: `c`, `r` (snapshot read), `u` upsert `after`; `d` deletes the key; `t` (truncate) empties the table; a Kafka
tombstone (after each delete, `tombstones.on.delete`) changes nothing. An event without `op`, with another op, an
`after` that does not fit the table, or a Kafka key that does not match the row's key columns is a bad record
(ValueError, never quoting a value).

Source position (`position`): PostgreSQL `(lastCommitLsn, lsn)` from `source.sequence` (`source.lsn` alone without
it): the stream is in commit order, and so is the sequence, including replays after a connector restart, which
carry the same positions; MySQL `(binlog file number, pos, row)`. Encoded as bytes that compare bytewise in that
order, prefixed by the source kind. Other connectors: no source position (Kafka order decides).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any

from icefloe.batch_columns import CHANGE, CHANGE_MOVED_FROM, CHANGE_TIME, CHANGE_UNCHANGED, SOURCE_POSITION
from icefloe.errors import InvalidChange
from icefloe.formats.debezium import types

OPS = {"c", "r", "u", "d", "t"}
OLD_KEY_HEADER = "__debezium.oldkey"
CDC_OP, CDC_TS, CDC_BEFORE, CDC_UNAVAILABLE = "cdc_op", "cdc_ts", "cdc_before", "cdc_unavailable"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_BINLOG_NUMBER = re.compile(r"(\d+)$")
_U64 = 2**64 - 1


def position(source: Any) -> bytes | None:
    """The change's position in its source database, as bytes ordered like the positions (None: unknown)."""
    if not isinstance(source, dict):
        return None
    if source.get("connector") in (None, "postgresql") and source.get("lsn") is not None:
        last, lsn = 0, int(source["lsn"])
        sequence = source.get("sequence")
        if sequence:
            try:
                pair = json.loads(sequence)
                last, lsn = int(pair[0] or 0), int(pair[1] or lsn)
            except (ValueError, TypeError, IndexError):
                raise ValueError("source.sequence is not [lastCommitLsn, lsn]") from None
        return b"\x01" + (last & _U64).to_bytes(8, "big") + (lsn & _U64).to_bytes(8, "big")
    if source.get("file") is not None and source.get("pos") is not None:  # MySQL, MariaDB: binlog coordinates
        number = _BINLOG_NUMBER.search(str(source["file"]))
        if number is not None:
            row = int(source.get("row") or 0)
            parts = (int(number.group(1)), int(source["pos"]))
            return (
                b"\x02" + b"".join((p & _U64).to_bytes(8, "big") for p in parts) + (row & 0xFFFFFFFF).to_bytes(4, "big")
            )
    return None


def source_time(envelope: dict) -> dt.datetime | None:
    """When the change happened in the source (`source.ts_us`, else `ts_ms`), else when Debezium saw it."""
    source = envelope.get("source") if isinstance(envelope.get("source"), dict) else {}
    for holder, name, unit in (
        (source, "ts_us", 1),
        (source, "ts_ms", 1000),
        (envelope, "ts_us", 1),
        (envelope, "ts_ms", 1000),
    ):
        value = holder.get(name)  # type: ignore[union-attr]  # source is a dict
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return _EPOCH + dt.timedelta(microseconds=value * unit)
            except OverflowError:
                return None
    return None


class ChangeDecoder:
    """Decodes one event (value, key, headers) to the row the table's batch takes; `plan`: `tables.plan`."""

    def __init__(self, plan: dict, decode_value: Callable[[bytes], Any], decode_key: Callable[[bytes], Any]):
        self.mirror = plan["mode"] == "upsert"
        self.keys: list[str] = plan["keys"]
        self.columns: set[str] = set(plan["columns"])
        self.placeholder: str = plan["placeholder"]
        self.placeholder_bytes = self.placeholder.encode()
        self.decode_value, self.decode_key = decode_value, decode_key
        fixed = plan.get("connect")  # Avro: the table's `after` schema; JSON: each event's own schema
        # JSON: the JsonConverter writes bytes as base64, so a `bytea`'s placeholder arrives as that text
        self.placeholder_base64 = None if fixed is not None else base64.b64encode(self.placeholder_bytes).decode()
        self.fixed = self._converters(fixed) if fixed is not None else None
        self._last_schema: Any = None
        self._last_converters: dict[str, types.Convert] = {}

    def _converters(self, after: types.Connect | None) -> dict[str, types.Convert]:
        if after is None:
            return {}
        return {name: c for name, connect in after.get("fields", []) if (c := types.converter(connect)) is not None}

    def converters(self, schema: Any) -> dict[str, types.Convert]:
        """The semantic converters of the event's `after` columns: the table's (Avro), else the event schema's."""
        if self.fixed is not None:
            return self.fixed
        if schema is None:
            return {}
        if schema != self._last_schema:
            after = next((f for f in schema.get("fields", []) if f.get("field") == "after"), None)
            self._last_converters = self._converters(types.from_json(after) if after else None)
            self._last_schema = schema
        return self._last_converters

    def __call__(self, payload: bytes | None, key: bytes | None, headers: list | None) -> dict:
        if payload is None:  # the tombstone after a delete (Kafka compaction's): nothing to change
            return {CHANGE: "none"} if self.mirror else {}
        envelope, schema = self.decode_value(payload)
        if not isinstance(envelope, dict) or not {"op", "after", "before"} & set(envelope):
            raise InvalidChange("not a Debezium change event (no op, before or after)")
        op = envelope.get("op")
        if op is None:
            raise InvalidChange("Debezium change event without op")
        if op not in OPS:
            raise InvalidChange("Debezium change event with an unknown op (not c, r, u, d or t)")
        convert = self.converters(schema)
        where = f"op {op}"
        row: dict[str, Any] = {}
        if op in ("c", "r", "u"):
            after = envelope.get("after")
            if not isinstance(after, dict):
                raise InvalidChange(f"{where}: after is not a row")
            row, unavailable = self._image(after, convert, "after")
            self._check_key(key, row, convert, where)
        elif op == "d":
            unavailable = []
            row = self._key(key, convert, where) if self.mirror or key is not None else {}
            before = envelope.get("before")
            if isinstance(before, dict):
                image, _ = self._image(before, convert, "before")
                mismatched = [k for k in self.keys if image.get(k) is not None and image.get(k) != row.get(k)]
                if self.mirror and mismatched:
                    raise InvalidChange(f"{where}: the Kafka key does not match before's key column(s) {mismatched}")
                if not self.mirror:
                    row = {}
        else:  # t: no key, no images
            unavailable = []
        position_bytes = position(envelope.get("source"))
        if self.mirror:
            row[SOURCE_POSITION] = position_bytes
            row[CHANGE] = {"d": "delete", "t": "truncate"}.get(op, "upsert")
            row[CHANGE_UNCHANGED] = unavailable or None
            row[CHANGE_TIME] = source_time(envelope)
            if op in ("c", "r") and headers:
                row[CHANGE_MOVED_FROM] = self._old_key(headers, convert)
            return row
        row.update({CDC_OP: op, SOURCE_POSITION: position_bytes, CDC_TS: source_time(envelope)})
        row[CDC_UNAVAILABLE] = unavailable or None
        before = envelope.get("before")
        row[CDC_BEFORE] = self._image(before, convert, "before")[0] if isinstance(before, dict) else None
        return row

    def _image(self, image: dict, convert: dict[str, types.Convert], which: str) -> tuple[dict, list[str]]:
        """A row image's columns converted; columns holding the placeholder are left out and named."""
        out, unavailable = {}, []
        for name, value in image.items():
            if name not in self.columns:
                raise InvalidChange(f"{which}.{name}: the table has no column for this field")
            if self._unavailable(value):
                unavailable.append(name)
                continue
            if value is not None and name in convert:
                try:
                    value = convert[name](value)
                except ValueError as error:
                    raise InvalidChange(f"{which}.{name}: {error}") from None
            out[name] = value
        return out, unavailable

    def _unavailable(self, value: Any) -> bool:
        if isinstance(value, str):
            return value == self.placeholder or value == self.placeholder_base64
        if isinstance(value, (bytes, bytearray)):
            return value == self.placeholder_bytes
        if isinstance(value, list) and len(value) == 1:  # arrays of text: the placeholder as their one element
            return self._unavailable(value[0])
        return False

    def _key(self, key: bytes | None, convert: dict[str, types.Convert], where: str) -> dict:
        if not key:
            raise InvalidChange(
                f"{where}: no Kafka key: a mirror table needs the Debezium key (a source table without a primary key "
                "needs message.key.columns)"
            )
        decoded = self.decode_key(key)
        if not isinstance(decoded, dict):
            raise InvalidChange(f"{where}: the Kafka key is not a struct of the key columns {self.keys}")
        fields = sorted(decoded)
        if fields != sorted(self.keys):
            raise InvalidChange(f"{where}: the Kafka key's fields {fields} are not the table's key columns {self.keys}")
        out = {}
        for name in self.keys:
            value = decoded[name]
            if value is None:
                raise InvalidChange(f"{where}: key column {name} is null")
            out[name] = convert[name](value) if name in convert else value
        return out

    def _check_key(self, key: bytes | None, row: dict, convert: dict[str, types.Convert], where: str) -> None:
        if not self.mirror and (key is None or not self.keys):
            return
        keyed = self._key(key, convert, where)
        mismatched = [k for k in self.keys if row.get(k) != keyed[k]]
        if mismatched:
            raise InvalidChange(f"{where}: the Kafka key does not match the row's key column(s) {mismatched}")

    def _old_key(self, headers: list, convert: dict[str, types.Convert]) -> dict | None:
        raw = next((value for name, value in headers if name == OLD_KEY_HEADER), None)
        if raw is None:
            return None
        try:
            old = json.loads(raw)
        except ValueError:
            raise InvalidChange(f"header {OLD_KEY_HEADER} is not JSON") from None
        if isinstance(old, dict) and set(old) == {"schema", "payload"}:
            old = old["payload"]
        if not isinstance(old, dict) or sorted(old) != sorted(self.keys):
            raise InvalidChange(f"header {OLD_KEY_HEADER} does not name the key columns {self.keys}")
        return {k: convert[k](old[k]) if k in convert and old[k] is not None else old[k] for k in self.keys}
