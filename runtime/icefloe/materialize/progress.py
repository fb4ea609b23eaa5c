"""Progress of a long batch, per table: records read of planned, rate and ETA.

On a terminal (stderr is a TTY) one line is redrawn in place; otherwise a plain log line comes every LOG_EVERY_S
while the batch runs. Nothing in the read path reports records: once a batch is planned it calls `reading()`, which
tags the Spark jobs that follow with a job group, and a thread polls Spark's status tracker for that group. The
table's first job after planning reads the batch from Kafka into the cached frame; its first stage's completed
tasks, each a known slice of the planned records, give the records read (an estimate within one task's records).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from icefloe.spec import format_duration

log = logging.getLogger(__name__)
REDRAW_EVERY_S = 0.5
LOG_EVERY_S = 15.0


@dataclass(frozen=True)
class _Reading:
    group: str  # the Spark job group of the batch's jobs
    planned: int  # records the batch reads
    started: float  # monotonic


_watched: set[str] = set()  # tables whose batch runs inside `watch`
_reading: dict[str, _Reading] = {}  # identifier -> the batch in flight


def reading(spark, identifier: str, records: int) -> None:
    """Called by a batch once it is planned: its Spark jobs from here on are measured against `records` (when
    someone watches: a batch run outside `watch` is left alone)."""
    if identifier not in _watched:
        return
    group = f"icefloe-{identifier}-{uuid.uuid4().hex[:8]}"
    spark.sparkContext.setJobGroup(group, f"icefloe {identifier}: {records} records")
    _reading[identifier] = _Reading(group, records, time.monotonic())


@dataclass(frozen=True)
class Progress:
    identifier: str
    planned: int
    read: int  # records read (whole tasks)
    tasks_done: int
    tasks: int  # 0 until the read stage is submitted
    elapsed: float

    @property
    def done_reading(self) -> bool:
        return self.tasks > 0 and self.tasks_done >= self.tasks

    def describe(self, finished: bool = False) -> str:
        if self.done_reading:
            rate = self.planned / self.elapsed if self.elapsed > 0 else 0.0
            text = f"{self.identifier}: read {self.planned:,} records in {self.elapsed:.1f}s ({rate:,.0f} rec/s)"
            return text if finished else text + "; writing"
        percent = 100 * self.read / self.planned if self.planned else 0.0
        text = f"{self.identifier}: read {self.read:,} of {self.planned:,} records ({percent:.0f}%"
        text += f", {self.tasks_done}/{self.tasks} tasks)" if self.tasks else ", starting)"
        if self.read and self.elapsed > 0:
            rate = self.read / self.elapsed
            text += f", {rate:,.0f} rec/s, ETA {format_duration((self.planned - self.read) / rate)}"
        return text


def measure(tracker, identifier: str, batch: _Reading) -> Progress:
    """Where the batch's read stage is, from Spark's status tracker."""
    elapsed = time.monotonic() - batch.started
    jobs = sorted(tracker.getJobIdsForGroup(batch.group))
    job = tracker.getJobInfo(jobs[0]) if jobs else None
    stage = tracker.getStageInfo(min(job.stageIds)) if job and job.stageIds else None
    if stage is None or not stage.numTasks:
        return Progress(identifier, batch.planned, 0, 0, 0, elapsed)
    done = min(stage.numCompletedTasks, stage.numTasks)
    return Progress(identifier, batch.planned, batch.planned * done // stage.numTasks, done, stage.numTasks, elapsed)


@contextmanager
def watch(spark, identifier: str, stream: TextIO | None = None) -> Iterator[None]:
    """Show the progress of the batch run inside this block (if it plans any records), then clear its job group."""
    stream = stream or sys.stderr
    _watched.add(identifier)
    stop = threading.Event()
    thread = threading.Thread(target=_report, args=(spark, identifier, stream, stop), daemon=True, name="progress")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _watched.discard(identifier)
        _reading.pop(identifier, None)
        for key in ("spark.jobGroup.id", "spark.job.description"):
            spark.sparkContext.setLocalProperty(key, None)


def _report(spark, identifier: str, stream: TextIO, stop: threading.Event) -> None:
    interactive = stream.isatty()
    tracker = spark.sparkContext.statusTracker()
    shown, last_logged = False, time.monotonic()
    while True:
        finished = stop.wait(REDRAW_EVERY_S)
        batch = _reading.get(identifier)
        if batch is not None and (shown or not finished):  # a last word only after earlier ones
            try:
                text = measure(tracker, identifier, batch).describe(finished)
            except Exception as error:  # progress is a courtesy: never let it disturb the batch
                log.debug("progress of %s: %s", identifier, error)
                text = None
            if text and interactive:
                stream.write("\r\x1b[K" + text + ("\n" if finished else ""))
                stream.flush()
                shown = True
            elif text and (finished or time.monotonic() - last_logged >= LOG_EVERY_S):
                log.info("%s", text)
                last_logged, shown = time.monotonic(), True
        if finished:
            return
