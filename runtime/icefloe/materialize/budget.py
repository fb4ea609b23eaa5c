"""How much one batch reads: what it can read, decode and write well inside the time the run has.

The time a batch has is the least of the table's `runTimeout` (an older run does not publish) and what the job's own
time limit leaves (`--deadline-minutes`: EMR Serverless stops the job then, and a batch cut short publishes nothing)
less a margin; a batch is planned for SAFETY of it. Each commit records its batch's records, bytes and start
(`commit_state.Throughput`) and its snapshot's commit time ends the measurement, so the next plan knows the rate at
which this table's batches were really read, decoded and written:

    records = time planned x measured bytes per second / mean record size

The mean record size is the measured one, or (when the budget binds, or nothing was measured yet) the mean of a few
records read where the batch starts. A table's first batch assumes DEFAULT_BYTES_PER_SECOND, at most
FIRST_BATCH_BYTES; so does a batch after one that read all there was, unless that one measured more: a small batch
is mostly fixed costs (starting Spark jobs, commits), so its rate says little about what a large one reaches.
A run stopped before it published (the job's time limit, a lost driver) leaves its branch: each such branch of a
run started since the last commit halves the next plan, so a backlog that a batch could not take in time is taken
in smaller ones instead of being read and stopped for ever; so does each attempt of a run refused at `runTimeout`
(`runner.run_table` retries at once with at most half of it). `maxRecordsPerRun` caps every plan, and so does a cap in bytes: a batch read on
the Python path, or read again for Python, is kept whole on the executors' disks (spilled), so it may weigh at most
`maxBytesPerRun`, by default DISK_SHARE of their disks (`disk_cap_bytes`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace

from icefloe.commit.checkpoint import CommittedState
from icefloe.source.kafka import OffsetRange, Plan, sample_record_bytes, share_budget
from icefloe.spec import TableSpec
from icefloe.table.iceberg import IcebergTable
from icefloe.table.refs import BRANCH_PREFIX, run_started

log = logging.getLogger(__name__)
SAFETY = 0.5
# A first batch reads at most this many bytes at this rate: the Python path decodes ~3 MiB/s per core
# (docs/benchmarks.md), the JVM path ~30; a slow sink or large nested records can be slower still.
DEFAULT_BYTES_PER_SECOND = 1024 * 1024
FIRST_BATCH_BYTES = 1024**3
# Of the job's time limit, what a batch never plans to use: the job's start before the runtime runs, publishing,
# maintenance, stopping.
DEADLINE_MARGIN_S = 180.0
DEADLINE_MARGIN_SHARE = 0.2
# Of the executors' local disks, what one batch may keep there; the rest is for shuffles (upsert) and Spark's files.
DISK_SHARE = 0.25
EMR_EXECUTOR_DISK = "20g"  # EMR Serverless's worker disk unless `spark.emr-serverless.executor.disk` says more
_SIZE = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def disk_cap_bytes(conf: dict[str, str | None], local_free: int) -> int:
    """What one batch may keep on the executors' disks (DISK_SHARE of them), from the job's Spark settings `conf`:
    on a cluster, each executor's disk (`spark.emr-serverless.executor.disk`, else EMR Serverless's default) times
    the most executors it may have; on a local master, of `local_free`, the free bytes where Spark spills."""
    if (conf.get("spark.master") or "local").startswith("local"):
        return int(DISK_SHARE * local_free)
    disk = (conf.get("spark.emr-serverless.executor.disk") or EMR_EXECUTOR_DISK).strip().lower().rstrip("b")
    per_executor = float(disk[:-1]) * _SIZE[disk[-1]] if disk[-1] in _SIZE else float(disk)
    executors = conf.get("spark.dynamicAllocation.maxExecutors") or conf.get("spark.executor.instances") or "1"
    return int(DISK_SHARE * per_executor * int(executors))


def _spark_disk_cap(table: IcebergTable) -> int:
    keys = (
        "spark.master",
        "spark.emr-serverless.executor.disk",
        "spark.dynamicAllocation.maxExecutors",
        "spark.executor.instances",
    )
    conf = {key: table.spark.conf.get(key, None) for key in keys}
    # Where Spark spills: SPARK_LOCAL_DIRS overrides spark.local.dir (Spark's configuration docs), else /tmp
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS") or table.spark.conf.get("spark.local.dir", None)
    spill = (local_dirs or tempfile.gettempdir()).split(",")[0]
    return disk_cap_bytes(conf, shutil.disk_usage(spill).free)


@dataclass(frozen=True)
class Deadline:
    """When the job running this process is stopped (epoch seconds), and how long it may run in all."""

    at: float
    total: float

    @classmethod
    def after_minutes(cls, minutes: float, started: float) -> Deadline:
        return cls(started + minutes * 60, minutes * 60)

    @property
    def margin(self) -> float:
        return min(DEADLINE_MARGIN_S, DEADLINE_MARGIN_SHARE * self.total)

    def left(self, now: float | None = None) -> float:
        """Seconds a batch may still take: until the job is stopped, less the margin."""
        return self.at - self.margin - (time.time() if now is None else now)


def seconds_for_batch(run_timeout_s: float, deadline: Deadline | None, now: float | None = None) -> float:
    """The time a batch is planned for: SAFETY of the least of `runTimeout` and what the deadline leaves."""
    available = run_timeout_s if deadline is None else min(run_timeout_s, deadline.left(now))
    return max(0.0, available) * SAFETY


@dataclass(frozen=True)
class Rate:
    """A committed batch's measured throughput."""

    records_per_s: float
    bytes_per_s: float
    mean_record_bytes: float
    cut: bool = True  # the batch read less than was pending: its rate is what this table's batches reach


def measured_rate(state: CommittedState) -> Rate | None:
    """The rate of the batch that wrote the table's checkpoint, from its size, start and commit time."""
    found = state.checkpoint.throughput if state.checkpoint is not None else None
    if found is None or state.checkpoint_committed_at is None or found.records <= 0:
        return None
    seconds = max(0.001, state.checkpoint_committed_at.timestamp() - found.started_ms / 1000)
    return Rate(found.records / seconds, found.bytes / seconds, max(1.0, found.bytes / found.records), found.cut)


def batch_records(
    seconds: float,
    rate: Rate | None,
    mean_record_bytes: float,
    halvings: int = 0,
    cap: int | None = None,
    max_bytes: float | None = None,
) -> int:
    """The records a batch reads in `seconds` at the measured `rate` (else, or if more, the default), records of
    `mean_record_bytes`, at most `max_bytes` of them, halved per unfinished attempt, at most `cap`
    (`maxRecordsPerRun`), at least one."""
    budget_bytes = seconds * rate.bytes_per_s if rate is not None else 0.0
    if rate is None or not rate.cut:
        budget_bytes = max(budget_bytes, min(FIRST_BATCH_BYTES, seconds * DEFAULT_BYTES_PER_SECOND))
    if max_bytes is not None:
        budget_bytes = min(budget_bytes, max_bytes)
    records = max(1, int(budget_bytes / max(1.0, mean_record_bytes)) // 2**halvings)
    return records if cap is None else min(cap, records)


def unfinished_attempts(
    branches: list[str], state: CommittedState, deadline: Deadline | None, now: float | None = None
) -> int:
    """Runs started since the table's checkpoint was committed that left their branch (of `branches`, the table's
    run branches): stopped (a job's time limit, a SIGKILL, a lost driver) before they published; a run that fails
    otherwise drops its branch. With a deadline, a run younger than the job's time limit may still be writing (runs
    of a table may overlap) and is not counted."""
    since = int(state.checkpoint_committed_at.timestamp()) if state.checkpoint_committed_at is not None else 0
    now = time.time() if now is None else now
    count = 0
    for branch in branches:
        started = run_started(branch[len(BRANCH_PREFIX) :])
        if started is None or started < since:  # whole seconds: a run that published started before its commit
            continue
        if deadline is not None and now - started < deadline.total - deadline.margin:
            continue
        count += 1
    return count


def limited(plan: Plan, records: int) -> Plan:
    """`plan` reading at most `records`, shared evenly across its partitions (`kafka_source.share_budget`)."""
    allowed = share_budget({r.partition: r.count for r in plan.ranges}, records)
    ranges = [replace(r, end=r.start + allowed[r.partition]) for r in plan.ranges if allowed[r.partition]]
    next_offsets = dict(plan.next_offsets) | {r.partition: r.end for r in ranges}
    next_offsets |= {r.partition: r.start for r in plan.ranges if not allowed[r.partition]}
    return replace(plan, ranges=ranges, next_offsets=next_offsets)


@dataclass(frozen=True)
class Sized:
    """A plan cut to the batch's budget, and the mean size of its records (bytes of key and value)."""

    plan: Plan
    mean_record_bytes: float
    cut: bool = False  # more was pending

    @property
    def records(self) -> int:
        return sum(r.count for r in self.plan.ranges)


def size_batch(
    table: IcebergTable,
    conf: dict,
    spec: TableSpec,
    state: CommittedState,
    plan: Plan,
    deadline: Deadline | None,
    branches: list[str],
    at_most: int | None = None,
) -> Sized:
    """Cut `plan` (everything pending) to what one batch can publish in time (see the module's docstring);
    `branches`: the table's run branches (`commit.drop_stale_branches`); `at_most`: records (after an attempt of this
    run refused at `runTimeout`, half of it)."""
    pending = sum(r.count for r in plan.ranges)
    rate = measured_rate(state)
    mean = rate.mean_record_bytes if rate is not None else float(spec.max_record_bytes)
    if not pending:
        return Sized(plan, mean)
    seconds = seconds_for_batch(spec.run_timeout_seconds, deadline)
    halvings = unfinished_attempts(branches, state, deadline)
    max_bytes = spec.max_bytes_per_run or _spark_disk_cap(table)
    cap = min((c for c in (spec.max_records_per_run, at_most) if c is not None), default=None)
    records = batch_records(seconds, rate, mean, halvings, cap, max_bytes)
    if rate is None or pending > records:  # the size of what this batch starts at decides how many it takes
        sampled = sample_record_bytes(conf, spec.topic, _sampled_ranges(plan.ranges))
        if sampled is not None:
            mean = sampled
            records = batch_records(seconds, rate, mean, halvings, cap, max_bytes)
    if pending > records:
        speed = rate.bytes_per_s if rate is not None else DEFAULT_BYTES_PER_SECOND
        per_s = f"{speed / 1024:.0f} KiB/s {'measured' if rate is not None else 'assumed'}"
        log.info(
            "%s: %d of %d pending records this batch (%.0fs at %s, records of %.0f bytes%s%s%s%s)",
            table.identifier,
            records,
            pending,
            seconds,
            per_s,
            mean,
            f", halved {halvings}x after runs stopped before they published" if halvings else "",
            ", maxRecordsPerRun" if records == spec.max_records_per_run else "",
            ", half of an attempt refused at runTimeout" if at_most is not None and records == at_most else "",
            f", at most {max_bytes / 1024**2:.0f} MiB kept on disk" if records * mean >= max_bytes * 0.99 else "",
        )
        if halvings:
            log.warning(
                "%s: %d runs since the last commit were stopped before they published; planning smaller batches",
                table.identifier,
                halvings,
            )
        return Sized(limited(plan, records), mean, cut=True)
    return Sized(plan, mean)


def _sampled_ranges(ranges: list[OffsetRange]) -> list[OffsetRange]:
    """At most 16 partitions, the longest first: a sample, not a read."""
    return sorted(ranges, key=lambda r: -r.count)[:16]
