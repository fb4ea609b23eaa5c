"""How far behind its topic a table is: per partition, in records and in seconds, measured against the broker.

Records: the partition's last stable offset (what a run would read up to) minus where the table's next run starts,
so offset gaps (transaction markers, aborted or compacted records) count too. Seconds: the age of the oldest record
the table has not read, from its Kafka timestamp (CreateTime or LogAppendTime, as the topic is configured).
Records deleted from the topic before the table read them are counted apart (`lost`): they can no longer be read.
So are records the table read that a truncated log no longer has (`truncated`: found by the same check a run makes,
from the leader epochs and topic id the table recorded); the lag then counts from where the log now diverges.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from icefloe.source.kafka import DELETED, TRUNCATED, first_record_timestamps, plan_ranges


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    committed: int | None  # the table's next offset; None before its first commit (or for a new partition)
    end: int  # the last stable offset
    records: int  # readable records the table has not read yet
    seconds: float | None  # age of the oldest of them; None when there are none or it could not be read
    lost: int  # records deleted before the table read them, not yet recorded by a run
    truncated: int = 0  # records the table read that the partition's log no longer has, not yet recorded by a run

    def as_dict(self) -> dict:
        return {
            "partition": self.partition,
            "committed": self.committed,
            "end": self.end,
            "lag_records": self.records,
            "lag_seconds": _round(self.seconds),
            "lost_unread": self.lost,
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class Lag:
    partitions: list[PartitionLag]

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def seconds(self) -> float:
        """The oldest unread record's age over all partitions (0 when nothing is waiting)."""
        return max((p.seconds for p in self.partitions if p.seconds is not None), default=0.0)

    @property
    def lost(self) -> int:
        return sum(p.lost for p in self.partitions)

    @property
    def truncated(self) -> int:
        return sum(p.truncated for p in self.partitions)


def measure_lag(
    conf: dict[str, str],
    topic: str,
    committed: dict[int, int],
    starting: str,
    now: float | None = None,
    topic_id: str | None = None,
    leader_epochs: dict[int, int] | None = None,
    known_records: dict[int, tuple[int, int]] | None = None,
) -> Lag:
    """The lag of a table whose next offsets are `committed` (empty before its first commit: then it counts from
    where the first run would start, per `startingOffsets`). `topic_id`, `leader_epochs`, `known_records`: what the
    table's checkpoint recorded, for the checks a run makes (a recreated topic is refused as a run refuses it)."""
    plan = plan_ranges(conf, topic, committed, starting, None, "warn", topic_id, leader_epochs, True, known_records)
    unread = {r.partition: (r.start, r.end) for r in plan.ranges}
    stamps = first_record_timestamps(conf, topic, unread)
    now = time.time() if now is None else now
    lost = {r.partition: r.end - r.start for r in plan.lost if r.kind == DELETED}
    truncated = {r.partition: r.end - r.start for r in plan.lost if r.kind == TRUNCATED}
    partitions = []
    for partition, end in sorted(plan.next_offsets.items()):
        start, _ = unread.get(partition, (end, end))
        age = max(0.0, now - stamps[partition]) if partition in stamps else None
        partitions.append(
            PartitionLag(
                partition,
                committed.get(partition),
                end,
                end - start,
                age,
                lost.get(partition, 0),
                truncated.get(partition, 0),
            )
        )
    return Lag(partitions)


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)
