"""Batch sizing (`icefloe.materialize.budget`): the time a batch has, the records that fit it, the halving after stopped runs."""

from __future__ import annotations

import datetime as dt

from icefloe.commit.checkpoint import Checkpoint, CommittedState, Throughput
from icefloe.materialize import budget
from icefloe.materialize.budget import Deadline, Rate, batch_records, limited, measured_rate, seconds_for_batch
from icefloe.source.kafka import OffsetRange, Plan

UTC = dt.UTC


def test_a_batch_is_planned_well_inside_the_least_of_run_timeout_and_the_job_time_limit():
    hour = Deadline.after_minutes(60, started=1000.0)
    assert hour.at == 1000.0 + 3600 and hour.margin == budget.DEADLINE_MARGIN_S
    assert seconds_for_batch(12 * 3600, hour, now=1000.0) == (3600 - 180) * budget.SAFETY  # not runTimeout's 12h
    assert seconds_for_batch(12 * 3600, hour, now=1000.0 + 3000) == (600 - 180) * budget.SAFETY  # later in the job
    assert seconds_for_batch(12 * 3600, hour, now=1000.0 + 3500) == 0.0  # past the margin: nothing fits
    assert seconds_for_batch(600, hour, now=1000.0) == 600 * budget.SAFETY  # runTimeout shorter than the job
    assert seconds_for_batch(600, None) == 600 * budget.SAFETY  # no job limit (local runs)
    assert Deadline.after_minutes(1.5, started=0.0).margin == 0.2 * 90  # short limits keep a share, not 3 minutes


def test_the_first_batch_assumes_a_default_rate_in_bytes_and_later_ones_the_measured_rate():
    seconds = 100.0
    # 100 s at the default rate, records of 1 KiB; capped by FIRST_BATCH_BYTES for long times
    assert batch_records(seconds, None, 1024) == int(seconds * budget.DEFAULT_BYTES_PER_SECOND / 1024)
    assert batch_records(1e9, None, 1024) == budget.FIRST_BATCH_BYTES // 1024
    # measured: 2 MiB/s of 1 KiB records; records of 50 KiB now (a sample where the batch starts) are fewer
    rate = Rate(records_per_s=2048, bytes_per_s=2 * 1024 * 1024, mean_record_bytes=1024)
    assert batch_records(seconds, rate, 1024) == 204_800
    assert batch_records(seconds, rate, 50 * 1024) == 4096
    # halved per run stopped before it published, capped by maxRecordsPerRun, never nothing
    assert batch_records(seconds, rate, 1024, halvings=3) == 204_800 // 8
    assert batch_records(seconds, rate, 1024, cap=1000) == 1000
    assert batch_records(0.0, rate, 1024) == 1
    assert batch_records(seconds, rate, 1024, halvings=40) == 1
    # after a batch that read all there was (mostly fixed costs), at least the default rate
    idle = Rate(records_per_s=10, bytes_per_s=10 * 1024, mean_record_bytes=1024, cut=False)
    assert batch_records(seconds, idle, 1024) == batch_records(seconds, None, 1024)
    assert batch_records(seconds, Rate(2048, 2 * 1024 * 1024, 1024, cut=False), 1024) == 204_800


def test_the_rate_comes_from_the_checkpoint_and_its_commit_time():
    started = dt.datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    measured = Throughput(records=10_000, bytes=10_000 * 500, started_ms=int(started.timestamp() * 1000), cut=True)
    checkpoint = Checkpoint("t", {0: 10_000}, "run", throughput=measured)
    state = CommittedState(7, checkpoint, 7, started + dt.timedelta(seconds=20))
    assert measured_rate(state) == Rate(500.0, 250_000.0, 500.0)
    assert measured_rate(CommittedState(7, Checkpoint("t", {0: 5}), 7, started)) is None  # older commits: none
    # the summary round trip, and a maintenance copy does not carry the batch's measurement
    assert Checkpoint.from_summary(checkpoint.to_summary()) == checkpoint
    assert Checkpoint.from_summary(checkpoint.carried(7).to_summary()).throughput is None


def test_a_plan_is_cut_evenly_and_records_where_each_partition_stops():
    plan = Plan(
        [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 50, 60), OffsetRange("t", 2, 5, 1005)],
        {0: 1000, 1: 60, 2: 1005, 3: 7},
        [],
        None,
    )
    cut = limited(plan, 100)
    assert [(r.partition, r.start, r.end) for r in cut.ranges] == [(0, 0, 45), (1, 50, 60), (2, 5, 50)]
    assert cut.next_offsets == {0: 45, 1: 60, 2: 50, 3: 7}
    one = limited(plan, 1)
    assert sum(r.count for r in one.ranges) == 1 and one.next_offsets[0] + one.next_offsets[2] in (1 + 5, 0 + 6)


def test_a_continuous_run_ends_before_its_job_time_limit_instead_of_starting_a_batch(tmp_path):
    """55 s into a job stopped at 60 s (margin 12 s): no micro-batch starts (it could not publish), the loop ends."""
    import threading
    import time

    from icefloe.operate.runner import run_continuously
    from icefloe.spec import parse_config

    config = parse_config(
        {
            "sourceClusters": [{"name": "c", "bootstrapServers": "127.0.0.1:1"}],
            "tables": [{"sourceCluster": "c", "topic": "t", "format": "json"}],
        }
    )
    results: list = []
    deadline = Deadline.after_minutes(1, started=time.time() - 55)
    assert (
        run_continuously(
            None, config, list(config.tables), tmp_path, results.append, threading.Event(), deadline=deadline
        )
        == 0
    )
    assert results == []


def test_a_batch_keeps_at_most_a_share_of_the_executors_disks():
    emr = {"spark.master": "yarn", "spark.dynamicAllocation.maxExecutors": "4"}
    assert budget.disk_cap_bytes(emr, local_free=0) == int(budget.DISK_SHARE * 4 * 20 * 1024**3)  # EMR's 20 GB each
    bigger = emr | {"spark.emr-serverless.executor.disk": "200G", "spark.dynamicAllocation.maxExecutors": None}
    assert budget.disk_cap_bytes(bigger, local_free=0) == int(budget.DISK_SHARE * 200 * 1024**3)  # one executor
    assert budget.disk_cap_bytes({"spark.master": "local[2]"}, local_free=10_000) == 2_500
    # the cap binds on the bytes, whatever the time allows; halvings and maxRecordsPerRun still apply on top
    rate = Rate(records_per_s=2048, bytes_per_s=2 * 1024 * 1024, mean_record_bytes=1024)
    assert batch_records(100.0, rate, 1024, max_bytes=10 * 1024) == 10
    assert batch_records(100.0, rate, 1024, halvings=1, max_bytes=10 * 1024) == 5
    assert batch_records(100.0, rate, 1024, cap=3, max_bytes=10 * 1024) == 3


def test_the_local_disk_cap_measures_where_spark_spills(tmp_path, monkeypatch):
    """SPARK_LOCAL_DIRS overrides spark.local.dir (as Spark reads them): the free space measured is that disk's."""
    from types import SimpleNamespace

    measured = []
    monkeypatch.setattr(budget.shutil, "disk_usage", lambda path: measured.append(path) or SimpleNamespace(free=4))
    conf = {"spark.master": "local[2]", "spark.local.dir": "/conf-dir,/second"}
    table = SimpleNamespace(spark=SimpleNamespace(conf=SimpleNamespace(get=lambda key, default: conf.get(key))))
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/other")
    assert budget._spark_disk_cap(table) == 1  # type: ignore[arg-type]  # what the cap reads of a table
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    budget._spark_disk_cap(table)  # type: ignore[arg-type]
    assert measured == [str(tmp_path), "/conf-dir"]


def test_a_cut_batch_logs_why_it_was_cut(caplog, monkeypatch):
    """The line saying how many of the pending records a batch takes, and why (here maxRecordsPerRun), is logged
    whole: its format once had fewer placeholders than arguments, and logging printed a traceback instead."""
    import logging
    from types import SimpleNamespace

    from icefloe.spec import parse_config

    config = parse_config({
        "sourceClusters": [{"name": "c", "bootstrapServers": "127.0.0.1:9"}],
        "tables": [{"sourceCluster": "c", "topic": "t", "format": "json", "maxRecordsPerRun": 10}],
    })  # fmt: skip
    monkeypatch.setattr(budget, "_spark_disk_cap", lambda table: 10**12)
    monkeypatch.setattr(budget, "sample_record_bytes", lambda conf, topic, ranges: 100.0)
    plan = Plan([OffsetRange("t", 0, 0, 1000)], {0: 1000}, [], None)
    table = SimpleNamespace(identifier="db.t")
    with caplog.at_level(logging.INFO, logger=budget.__name__):
        sized = budget.size_batch(table, {}, config.tables[0], CommittedState(None), plan, None, [])  # type: ignore[arg-type]  # what sizing reads of a table
    assert sum(r.count for r in sized.plan.ranges) == 10
    [line] = [record.getMessage() for record in caplog.records if "pending records" in record.getMessage()]
    assert line.startswith("db.t: 10 of 1000 pending records") and line.endswith(", maxRecordsPerRun)"), line
