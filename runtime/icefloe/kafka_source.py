"""Reading Kafka: client settings, planning offset ranges on the driver, reading one range in an executor.

Correct on Apache Kafka and on Tansu alike. Tansu answers `ListOffsets` (and so `get_watermark_offsets()`)
with a wrong high watermark, while the watermark carried by fetch responses is right on both. So the planner
fetches from each partition once and reads the *cached* watermark of that fetch; readers stop at the planned end
or at a partition-EOF event at or past it, never trusting a listed offset.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from .errors import SourceError
from .secrets import resolve_credentials
from .spec import SourceCluster

log = logging.getLogger(__name__)
METADATA_TIMEOUT_S = 15.0
PLAN_TIMEOUT_S = 30.0
READ_STALL_TIMEOUT_S = 60.0


def client_config(cluster: SourceCluster) -> dict[str, str]:
    """librdkafka settings for a source cluster (credentials resolved in memory, never logged)."""
    conf = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "security.protocol": cluster.security_protocol,
        "client.id": "icefloe",
    }
    if cluster.sasl_mechanism:
        user, password = resolve_credentials(cluster.credentials_secret, f"sourceCluster {cluster.name}")
        conf |= {"sasl.mechanism": cluster.sasl_mechanism, "sasl.username": user, "sasl.password": password}
    return conf


def _consumer(conf: dict[str, str], **extra: str | int | bool) -> Consumer:
    return Consumer(
        {
            **conf,
            # Offsets live in the Iceberg snapshot, not in Kafka: no group membership, no commits.
            "group.id": "icefloe",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            **extra,
        }
    )


@dataclass(frozen=True)
class OffsetRange:
    """Records [start, end) of one partition: one executor task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def list_partitions(conf: dict[str, str], topic: str) -> list[int]:
    admin = AdminClient(conf)
    try:
        metadata = admin.list_topics(topic=topic, timeout=METADATA_TIMEOUT_S)
    except KafkaException as error:
        raise SourceError(f"cannot reach Kafka at {conf['bootstrap.servers']}: {error.args[0].str()}") from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        reason = info.error.str() if info is not None and info.error else "unknown topic"
        raise SourceError(f"topic {topic!r} on {conf['bootstrap.servers']}: {reason}")
    return sorted(info.partitions)


def plan_ranges(
    conf: dict[str, str], topic: str, committed: dict[int, int], starting: str, max_records: int | None
) -> tuple[list[OffsetRange], dict[int, int]]:
    """Ranges to read now, and the next offset per partition once they are committed.

    `committed` holds the next offset per partition from the table's snapshot; partitions without one start at
    the earliest offset, or at the current end when `starting` is "latest" (nothing read on the first run).
    """
    partitions = list_partitions(conf, topic)
    low_high = _fetch_watermarks(conf, topic, partitions, committed)
    ranges, next_offsets = [], {}
    budget = max_records
    for partition in partitions:
        low, high = low_high[partition]
        start = committed.get(partition)
        if start is None:
            start = high if starting == "latest" else low
        elif start > high:
            raise SourceError(
                f"{topic}[{partition}]: the table has read up to offset {start}, but the partition ends at {high}; "
                "was the topic deleted and recreated? Materialize it into a new table"
            )
        elif start < low:
            log.warning(
                "%s[%d]: offsets %d..%d were deleted by retention before icefloe read them", topic, partition, start, low - 1
            )
            start = low
        end = high
        if budget is not None:
            end = min(end, start + budget)
            budget -= max(0, end - start)
        if partition in committed or end > low:  # an empty, never-read partition needs no commit
            next_offsets[partition] = max(start, end)
        if end > start:
            ranges.append(OffsetRange(topic, partition, start, end))
    return ranges, next_offsets


def _fetch_watermarks(
    conf: dict[str, str], topic: str, partitions: list[int], committed: dict[int, int]
) -> dict[int, tuple[int, int]]:
    """(low, high) watermarks per partition, as reported by a real fetch (see the module docstring)."""
    consumer = _consumer(conf, **{"fetch.max.bytes": 1024 * 1024, "max.partition.fetch.bytes": 64 * 1024})
    try:
        consumer.assign(
            [TopicPartition(topic, p, committed.get(p, -2)) for p in partitions]  # -2: OFFSET_BEGINNING
        )
        pending = set(partitions)
        deadline = time.monotonic() + PLAN_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=len(partitions) * 4, timeout=0.5):
                error = msg.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise SourceError(f"{topic}[{msg.partition()}]: {error.str()}")
                pending.discard(msg.partition())
        if pending:
            raise SourceError(
                f"{topic}: no fetch answer from partitions {sorted(pending)} within {PLAN_TIMEOUT_S:.0f}s "
                f"(is {conf['bootstrap.servers']} reachable?)"
            )
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True) for p in partitions}
    finally:
        consumer.close()


def read_range(conf: dict[str, str], task: OffsetRange, poll_batch: int = 5000) -> Iterator[Message]:
    """Every record of the range in offset order (gaps from compaction or transaction markers are skipped)."""
    consumer = _consumer(conf, **{"auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
        last_progress = time.monotonic()
        while True:
            messages = consumer.consume(num_messages=poll_batch, timeout=1.0)
            if messages:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                raise SourceError(
                    f"{task.topic}[{task.partition}]: no records for {READ_STALL_TIMEOUT_S:.0f}s "
                    f"while reading offsets {task.start}..{task.end - 1}"
                )
            for msg in messages:
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= task.end:
                            return
                        continue
                    raise SourceError(f"{task.topic}[{task.partition}] at offset {msg.offset()}: {error.str()}")
                if msg.offset() >= task.end:
                    return
                yield msg
                if msg.offset() >= task.end - 1:
                    return
    finally:
        consumer.close()
