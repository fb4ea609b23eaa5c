"""Progress of a batch: redrawn in place on a terminal (a real pseudo-terminal), plain log lines otherwise, measured
from Spark's status tracker while a real batch reads from the local broker."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading

import pytest

from icefloe.materialize import batch as materializer
from icefloe.materialize import progress
from icefloe.materialize.progress import Progress
from icefloe.operate.runner import run_table
from support import produce

SCHEMA = {"fields": [{"name": "n", "type": "long"}]}
RECORDS, PER_TASK = 6000, 500  # twelve read tasks
FRAME = re.compile(r"read ([\d,]+) of 6,000 records \((\d+)%, (\d+)/(\d+) tasks\)")


@pytest.fixture
def backlog(broker, topic, make_config, monkeypatch):
    broker.create_topic(topic, 1)
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": json.dumps({"n": i}).encode(), "partition": 0} for i in range(RECORDS)],
    )
    monkeypatch.setattr(materializer, "RECORDS_PER_TASK", PER_TASK)
    monkeypatch.setattr(progress, "REDRAW_EVERY_S", 0.05)
    return make_config({"topic": topic, "format": "json", "schema": SCHEMA, "maintenance": {"enabled": False}})


@pytest.mark.spark
@pytest.mark.broker
def test_progress_is_redrawn_on_a_terminal(spark, state_dir, backlog, monkeypatch):
    controller, device = os.openpty()
    terminal = os.fdopen(device, "w")
    shown = bytearray()
    drain = threading.Thread(target=_drain, args=(controller, shown), daemon=True)  # a full terminal blocks writers
    drain.start()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = run_table(spark, backlog, backlog.tables[0], state_dir)
    terminal.close()
    drain.join(10)
    os.close(controller)
    text = shown.decode()
    assert result.rows_written == RECORDS
    frames = [f for f in text.replace("\r\n", "\n").split("\r\x1b[K") if f]
    assert frames, "nothing was drawn on the terminal"
    counted = [FRAME.search(f) for f in frames if FRAME.search(f)]
    assert counted, frames
    assert {m.group(4) for m in counted} == {"12"}, "the read stage has one task per 500 records"
    reads = [int(m.group(1).replace(",", "")) for m in counted]
    assert reads == sorted(reads) and all(r % PER_TASK == 0 for r in reads)
    assert re.fullmatch(rf"{result.identifier}: read 6,000 records in [\d.]+s \([\d,]+ rec/s\)\n", frames[-1])


@pytest.mark.spark
@pytest.mark.broker
def test_progress_is_logged_when_not_on_a_terminal(spark, state_dir, backlog, monkeypatch, caplog):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.05)
    with caplog.at_level(logging.INFO, logger="icefloe.materialize.progress"):
        result = run_table(spark, backlog, backlog.tables[0], state_dir)
    lines = [r.getMessage() for r in caplog.records if r.name == "icefloe.materialize.progress"]
    assert any(FRAME.search(line) or "starting" in line for line in lines[:-1]), lines
    assert re.fullmatch(rf"{result.identifier}: read 6,000 records in [\d.]+s \([\d,]+ rec/s\)", lines[-1])


def test_rate_and_eta_from_the_records_read():
    running = Progress("db.t", planned=10_000, read=2_500, tasks_done=1, tasks=4, elapsed=5.0)
    assert running.describe() == "db.t: read 2,500 of 10,000 records (25%, 1/4 tasks), 500 rec/s, ETA 15s"
    assert Progress("db.t", 10_000, 0, 0, 0, 1.0).describe() == "db.t: read 0 of 10,000 records (0%, starting)"
    done = Progress("db.t", 10_000, 10_000, 4, 4, 20.0)
    assert done.describe() == "db.t: read 10,000 records in 20.0s (500 rec/s); writing"
    assert done.describe(finished=True) == "db.t: read 10,000 records in 20.0s (500 rec/s)"


def _drain(fd: int, into: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal's other end was closed
            return
        if not chunk:
            return
        into.extend(chunk)
