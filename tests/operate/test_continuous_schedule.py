"""The continuous loop's schedule (runner.run_continuously), its batches stood in for: when a table's batch is due."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from icefloe.operate import runner
from icefloe.spec import parse_config


def test_a_continuous_tables_first_batch_runs_at_once_on_a_machine_booted_a_moment_ago(tmp_path, monkeypatch):
    """`time.monotonic` counts from the machine's boot: an EMR worker, a container or a CI machine may have booted a
    minute ago. The first batch must not wait until the clock passes `refresh` (1 h here) as if one ran at boot."""
    config = parse_config(
        {
            "sourceClusters": [{"name": "local", "bootstrapServers": "127.0.0.1:9"}],
            "tables": [{"sourceCluster": "local", "topic": "t", "format": "json", "refresh": "1h", "continuous": True}],
        }
    )
    booted = time.monotonic() - 60.0  # the machine's clock read 60 s at the loop's start
    monkeypatch.setattr(runner, "time", SimpleNamespace(monotonic=lambda: time.monotonic() - booted, time=time.time))
    stop, attempts = threading.Event(), []

    def attempt(spark, config, table, state_dir, on_result, metrics, known=None, deadline=None, continuous=False):
        attempts.append(time.monotonic())
        stop.set()
        return runner.Outcome.OK, "", SimpleNamespace(offsets={0: 1})

    monkeypatch.setattr(runner, "_attempt", attempt)
    guard = threading.Timer(20.0, stop.set)  # the loop's end if no batch ever runs
    guard.start()
    try:
        started = time.monotonic()
        runner.run_continuously(None, config, list(config.tables), tmp_path, lambda result: None, stop, poll_s=0.05)
    finally:
        guard.cancel()
    assert attempts, "no batch ran: the first was due only once the machine's clock passed the refresh (1 h)"
    assert attempts[0] - started < 5.0
