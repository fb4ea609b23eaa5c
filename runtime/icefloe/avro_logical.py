"""Avro logical types fastavro does not read yet, read as schema_mapping maps them.

fastavro keeps one registry of logical readers for the process (confluent-kafka's deserializer uses it too), so every
Python decoder of Avro values calls `register()` before it reads: a worker that decodes only one kind of table must
read timestamp-nanos, uuid on fixed(16) and duration as the table's types, not as their base types.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Callable

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_LOCAL_EPOCH = dt.datetime(1970, 1, 1)


def _nanos(epoch: dt.datetime) -> Callable[..., dt.datetime]:
    # Iceberg v2 timestamps are microseconds: nanoseconds are truncated (rounded down, also before the epoch).
    return lambda data, *schemas: epoch + dt.timedelta(microseconds=data // 1000)


def _duration(data: bytes, *schemas) -> dict[str, int]:
    """Avro's duration: three unsigned little-endian 32-bit counts."""
    months, days, millis = (int.from_bytes(data[i : i + 4], "little") for i in (0, 4, 8))
    return {"months": months, "days": days, "milliseconds": millis}


def register() -> None:
    from fastavro.read import LOGICAL_READERS

    LOGICAL_READERS.setdefault("long-timestamp-nanos", _nanos(_EPOCH))
    LOGICAL_READERS.setdefault("long-local-timestamp-nanos", _nanos(_LOCAL_EPOCH))
    LOGICAL_READERS.setdefault("fixed-uuid", lambda data, *schemas: uuid.UUID(bytes=data))
    LOGICAL_READERS.setdefault("fixed-duration", _duration)
