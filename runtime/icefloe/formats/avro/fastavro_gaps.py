"""Where fastavro (the Python decoders' Avro reader) falls short of what icefloe needs, and the fixes. Every Python
decoder of Avro values calls `register()` once and reads with `guarded` schemas.

- Logical types it does not read yet (timestamp-nanos, uuid on fixed(16), duration) are read as avro.mapping maps
  them. fastavro keeps one registry of logical readers per process (confluent-kafka's deserializer uses it too), so a
  worker that decodes only one kind of table must register them as well.
- Union branch indexes are not bounds-checked: the C reader takes `union[index]`, so a corrupt negative index (an odd
  byte: zigzag) silently reads a branch from the end (`["null", "string"]` with -1: a string). `guarded` appends to
  every union as many sentinel branches as it has: an index from -n to 2n-1 outside 0..n-1 then lands on a sentinel,
  whose reading raises `UnionIndexError`; any other is outside the list (IndexError). Reader schemas are guarded too,
  so schema resolution matches the writer's sentinel with the reader's and reads it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from icefloe.errors import BadRecord

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_LOCAL_EPOCH = dt.datetime(1970, 1, 1)
SENTINEL = "icefloe.UnionBranchIndexOutOfRange"  # a named type no Avro schema of a table can hold (a reserved name)
_LOGICAL = "icefloe-union-branch-index-out-of-range"
_SENTINEL_TYPE = {"type": "fixed", "name": SENTINEL, "size": 0, "logicalType": _LOGICAL}
_GUARDED = "__icefloe_guarded"  # marks a parsed record schema already guarded (fastavro marks its own the same way)


class UnionIndexError(BadRecord):
    def __init__(self) -> None:
        super().__init__(
            "Avro union branch index out of range (negative, or past the union's branches): a corrupt payload"
        )


def _nanos(epoch: dt.datetime) -> Callable[..., dt.datetime]:
    # Iceberg v2 timestamps are microseconds: nanoseconds are truncated (rounded down, also before the epoch).
    return lambda data, *schemas: epoch + dt.timedelta(microseconds=data // 1000)


def _duration(data: bytes, *schemas) -> dict[str, int]:
    """Avro's duration: three unsigned little-endian 32-bit counts."""
    months, days, millis = (int.from_bytes(data[i : i + 4], "little") for i in (0, 4, 8))
    return {"months": months, "days": days, "milliseconds": millis}


def _refuse(*_) -> None:
    raise UnionIndexError()


def register() -> None:
    from fastavro.read import LOGICAL_READERS

    LOGICAL_READERS.setdefault("long-timestamp-nanos", _nanos(_EPOCH))
    LOGICAL_READERS.setdefault("long-local-timestamp-nanos", _nanos(_LOCAL_EPOCH))
    LOGICAL_READERS.setdefault("fixed-uuid", lambda data, *schemas: uuid.UUID(bytes=data))
    LOGICAL_READERS.setdefault("fixed-duration", _duration)
    LOGICAL_READERS.setdefault(f"fixed-{_LOGICAL}", _refuse)


def guarded(parsed: Any) -> Any:
    """`parsed` (fastavro.parse_schema's result, changed in place) with every union padded with sentinels; again on a
    guarded schema changes nothing (and costs nothing for a record: it is marked)."""
    if isinstance(parsed, dict) and parsed.get(_GUARDED):
        return parsed
    seen: set[int] = set()

    def pad(node: Any) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, list) and SENTINEL not in node:
            for branch in list(node):
                pad(branch)
            node.extend([SENTINEL] * len(node))
        elif isinstance(node, dict):
            for key in ("type", "items", "values"):
                pad(node.get(key))
            for item in node.get("fields", ()):
                pad(item)

    pad(parsed)
    named = parsed.get("__named_schemas") if isinstance(parsed, dict) else None
    if named is not None:  # named types referenced by name are read from here
        for schema in list(named.values()):
            pad(schema)
        named.setdefault(SENTINEL, _SENTINEL_TYPE)
        parsed[_GUARDED] = True
    return parsed
