"""Continuous mode and table maintenance on the local stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from icefloe.operate.maintenance import maintain
from icefloe.operate.runner import run_table
from icefloe.table.iceberg import IcebergTable
from support import by_position, produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
SCHEMA = {"fields": [{"name": "n", "type": "long"}]}


def records(start: int, count: int, partitions: int = 2, timestamp: int | None = None) -> list[dict]:
    return [
        {"value": json.dumps({"n": i}).encode(), "partition": i % partitions, "timestamp": timestamp}
        for i in range(start, start + count)
    ]


def start_continuous(
    config_path: Path, state_dir: Path, log: Path | None = None, quick_retries: bool = False
) -> subprocess.Popen:
    """The `icefloe run --continuous` command; `quick_retries` shortens its Kafka timeout and backoff (QUICK_RETRIES)."""
    program = QUICK_RETRIES if quick_retries else ["-m", "icefloe.cli"]
    command = [
        sys.executable,
        *program,
        "run",
        "--config",
        str(config_path),
        "--continuous",
        "--json",
        "--state-dir",
        str(state_dir),
    ]
    env = {**os.environ, "ICEFLOE_SPARK_MASTER": "local[2]"}
    stderr = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)


# The job as `icefloe run`, with a 2 s Kafka metadata timeout and 0.5 s first backoff instead of 15 s and 2 s: a run
# against an absent broker gives up within seconds (backing off 0.5 + 1 s instead of 2 + 4 s, and no metadata request
# waits 15 s), so an outage spans several of the loop's retries quickly. The loop (runner.run_continuously) is as shipped.
QUICK_RETRIES = [
    "-c",
    "import sys; from icefloe import cli; from icefloe.source import kafka as kafka_source; from icefloe.operate import runner; kafka_source.METADATA_TIMEOUT_S = 2.0; "
    "runner.SOURCE_BACKOFF_S = 0.5; sys.exit(cli.main())",
]
RUN_RETRY = "; retrying in "  # runner.run_table's line for each retry inside one run


def continuous_stack(path: Path, bootstrap: str, topic: str) -> Path:
    """A stack file with one continuous JSON table on a 2 s refresh, maintenance off."""
    path.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": bootstrap}],
                    "icefloe:tables": [
                        {
                            "sourceCluster": "local",
                            "topic": topic,
                            "format": "json",
                            "schema": SCHEMA,
                            "refresh": "2s",
                            "continuous": True,
                            "maintenance": {"enabled": False},
                        }
                    ],
                }
            }
        )
    )
    return path


def test_continuous_rows_visible_within_interval_and_sigterm_restart_is_exactly_once(
    broker, spark, state_dir, topic, tmp_path
):
    broker.create_topic(topic, 2)
    path = continuous_stack(tmp_path / "Pulumi.cont.yaml", broker.bootstrap_servers, topic)
    identifier = f"local.{topic}"
    produced = 0
    for round_ in range(2):
        job_log = tmp_path / f"job-{round_}.log"
        process = start_continuous(path, state_dir, job_log)
        lines: list[str] = []
        threading.Thread(target=lines.extend, args=(process.stdout,), daemon=True).start()
        try:
            # A producer beside the running job; each marker must become visible to an independent reader.
            for step in range(3):
                produce(broker.bootstrap_servers, topic, records(produced, 50))
                produced += 50
                sent_at = time.monotonic()
                while True:
                    if (
                        IcebergTable(spark, identifier).exists()
                        and len(read_pyiceberg(state_dir, identifier)) == produced
                    ):
                        break
                    # Step 0 includes the job's Spark start (tens of seconds on a loaded 2-core machine).
                    limit = 180 if step == 0 else 60
                    assert time.monotonic() - sent_at < limit, (
                        f"rows not visible after {limit}s (round {round_}, step {step}):\n{job_log.read_text()[-3000:]}"
                    )
                    time.sleep(0.5)
                # Spark start is paid once per process; after that a batch is due every 2s (a loose functional bound:
                # a trigger that ignored `refresh` would wait for the 15m default).
                if step:
                    assert time.monotonic() - sent_at < 30, "rows were not committed on the 2s refresh"
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(120) == 0, "SIGTERM must stop the loop cleanly"
        assert any(json.loads(line)["status"] == "committed" for line in lines)
    rows = by_position(read_pyiceberg(state_dir, identifier))
    assert sorted(r["n"] for r in rows.values()) == list(range(produced))


def plant_orphan(table: IcebergTable) -> Path:
    """A data file no snapshot references, older than the tests' orphanFileAge (at least runTimeout: no run in
    flight can still own it)."""
    data_dir = Path(table.metadata_location().removeprefix("file:")).parent.parent / "data"
    orphan = data_dir / "left-by-a-crashed-run.parquet"
    orphan.write_bytes(b"PAR1 not referenced by any snapshot")
    old = time.time() - 600
    os.utime(orphan, (old, old))
    time.sleep(1.5)
    return orphan


def test_maintenance_compacts_expires_and_removes_orphans_without_changing_content(
    spark, broker, state_dir, topic, make_config
):
    broker.create_topic(topic, 2)
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "runTimeout": "1m",
            "maintenance": {
                "enabled": False,
                "snapshotRetention": "1s",
                "minSnapshotsToKeep": 1,
                "orphanFileAge": "1m",
            },
        }
    )
    table_spec = config.tables[0]
    for batch in range(6):  # six small commits: at least six small files per partition
        produce(broker.bootstrap_servers, topic, records(batch * 20, 20))
        run_table(spark, config, table_spec, state_dir)
    table = IcebergTable(spark, config.identifier(table_spec))
    before = sorted(r["n"] for r in read_pyiceberg(state_dir, table.identifier))
    orphan = plant_orphan(table)

    result = maintain(table, table_spec)

    assert result.data_files_before >= 6 and result.data_files_after <= 2
    assert sorted(r["n"] for r in read_pyiceberg(state_dir, table.identifier)) == before
    # Left: what maintenance itself committed within the last second (rewrites, manifests, the carried checkpoint).
    assert result.snapshots_after <= 4 and result.expired_snapshots >= 5
    assert not orphan.exists() and result.orphan_files_removed >= 1
    # Offsets survive the expiry: the next run adds only what is new.
    produce(broker.bootstrap_servers, topic, records(120, 10))
    after = run_table(spark, config, table_spec, state_dir)
    assert after.rows_written == 10
    assert len(by_position(read_pyiceberg(state_dir, table.identifier))) == 130


def test_managed_maintenance_leaves_compaction_expiry_and_orphans_to_the_catalog(
    spark, broker, state_dir, topic, make_config
):
    """S3 Tables maintain their tables themselves (`catalog.type: s3tables`): icefloe's maintenance then compacts,
    expires and removes nothing; run here on the local catalog with the flag S3 Tables sets."""
    broker.create_topic(topic, 1)
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "runTimeout": "1m",
            "maintenance": {
                "enabled": False,
                "snapshotRetention": "1s",
                "minSnapshotsToKeep": 1,
                "orphanFileAge": "1m",
            },
        }
    )
    table_spec = config.tables[0]
    for batch in range(3):
        produce(broker.bootstrap_servers, topic, records(batch * 10, 10, 1))
        run_table(spark, config, table_spec, state_dir)
    table = IcebergTable(spark, config.identifier(table_spec))
    orphan = plant_orphan(table)

    result = maintain(table, table_spec, managed=True)

    assert result.steps == ["manifests", "carry-checkpoint", "managed-by-catalog"]
    # What the unmanaged run does to the same table (the test above): one file, one snapshot, no orphan.
    assert result.data_files_after == result.data_files_before >= 3
    assert result.snapshots_after >= 3
    assert orphan.exists()
    assert sorted(r["n"] for r in read_pyiceberg(state_dir, table.identifier)) == list(range(30))


def test_retention_ttl_deletes_rows_older_than_the_window(spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 1)
    day_ago = int((time.time() - 86_400) * 1000)
    produce(broker.bootstrap_servers, topic, records(0, 5, 1, timestamp=day_ago) + records(5, 3, 1))
    config = make_config(
        {"topic": topic, "format": "json", "schema": SCHEMA, "retention": "1h", "maintenance": {"enabled": False}}
    )
    run_table(spark, config, config.tables[0], state_dir)
    table = IcebergTable(spark, config.identifier(config.tables[0]))
    result = maintain(table, config.tables[0])
    assert result.rows_expired_by_ttl == 5
    assert sorted(r["n"] for r in read_pyiceberg(state_dir, table.identifier)) == [5, 6, 7]


def test_continuous_mode_rides_out_a_broker_outage(spark, state_dir, topic, tmp_path):
    """The broker goes away for longer than one run's retries, several times over: the job keeps waiting (no exit,
    no suspension), resumes within a few refreshes of the broker coming back, and every record lands exactly once."""
    from icefloe.operate import runner
    from icefloe_dev.kafka_broker import KafkaBroker
    from icefloe_dev.readers import pyiceberg_catalog

    # Runs that gave up on the absent broker before it comes back (each logs SOURCE_ATTEMPTS - 1 retries); the first
    # one is where a job without the outage handling exits or suspends the table. ICEFLOE_TEST_OUTAGE_S keeps the
    # broker away at least that long as well (minutes, as on a real outage).
    failed_runs = 3
    outage_s = float(os.environ.get("ICEFLOE_TEST_OUTAGE_S", "0"))
    broker = KafkaBroker(tmp_path / "own-broker").start()  # its own broker: the shared one must stay up
    try:
        broker.create_topic(topic, 2)
        path = continuous_stack(tmp_path / "Pulumi.outage.yaml", broker.bootstrap_servers, topic)
        identifier = f"local.{topic}"

        def wait_until(done, what: str, within: float) -> None:
            deadline = time.monotonic() + within
            while not done():
                assert process.poll() is None, f"the continuous job exited:\n{job_log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"{what} not within {within:g}s:\n{job_log.read_text()[-3000:]}"
                time.sleep(0.5)

        def rows_visible(count: int):
            return lambda: (
                pyiceberg_catalog(state_dir).table_exists(identifier)
                and len(read_pyiceberg(state_dir, identifier)) == count
            )

        job_log = tmp_path / "job.log"
        process = start_continuous(path, state_dir, job_log, quick_retries=True)
        threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # drain --json lines
        try:
            produce(broker.bootstrap_servers, topic, records(0, 50))
            wait_until(rows_visible(50), "50 rows visible", 240)
            broker.stop()
            away_since = time.monotonic()
            retries = job_log.read_text().count(RUN_RETRY) + failed_runs * (runner.SOURCE_ATTEMPTS - 1)
            wait_until(
                lambda: job_log.read_text().count(RUN_RETRY) >= retries and time.monotonic() - away_since >= outage_s,
                f"{failed_runs} runs failing on the absent broker",
                180 + outage_s,
            )
            assert "waiting for its source/catalog to come back" in job_log.read_text()
            broker.start()  # same ports, same data: the broker is back
            produce(broker.bootstrap_servers, topic, records(50, 50))
            wait_until(rows_visible(100), "100 rows visible after the outage", 120)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(90) == 0, "SIGTERM must stop the loop cleanly after an outage too"
        rows = by_position(read_pyiceberg(state_dir, identifier))
        assert sorted(r["n"] for r in rows.values()) == list(range(100))
    finally:
        broker.stop()


def test_maintenance_also_compacts_and_expires_the_dead_letter_table(spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 1)
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "errors": "dlq",
            "maintenance": {"enabled": False, "snapshotRetention": "1s", "minSnapshotsToKeep": 1},
        }
    )
    table_spec = config.tables[0]
    for batch in range(4):  # four batches with a bad record each: four small DLQ files and snapshots
        produce(broker.bootstrap_servers, topic, [*records(batch * 2, 1, 1), {"value": b"not json"}])
        run_table(spark, config, table_spec, state_dir)
    table = IcebergTable(spark, config.identifier(table_spec))
    dead_before = sorted(by_position(read_pyiceberg(state_dir, table.identifier + "_dlq")))
    time.sleep(1.5)

    result = maintain(table, table_spec)

    assert result.dead_letters is not None
    assert result.dead_letters.data_files_before >= 4 and result.dead_letters.data_files_after == 1
    assert result.dead_letters.expired_snapshots >= 3
    assert sorted(by_position(read_pyiceberg(state_dir, table.identifier + "_dlq"))) == dead_before
    # The DLQ's own checkpoint survives its expiry: a bad record after maintenance is added exactly once.
    produce(broker.bootstrap_servers, topic, [{"value": b"not json either"}])
    run_table(spark, config, table_spec, state_dir)
    assert len(by_position(read_pyiceberg(state_dir, table.identifier + "_dlq"))) == len(dead_before) + 1


# What one micro-batch of an append table may cost, whatever came before it: catalog commits (branch create, the
# append carrying the checkpoint, the fast-forward, the branch drop) and table loads (`iceberg_table.LOADS`).
COMMITS_PER_BATCH = 4
LOADS_PER_BATCH = 13


def metadata_version(location: str) -> int:
    """The catalog's version of a table: a metadata file `<version>-<uuid>.metadata.json` per commit."""
    return int(Path(location).name.split("-", 1)[0])


def micro_batches(spark, broker, state_dir, topic: str, make_config, count: int, observe) -> list:
    """`count` micro-batches of the continuous loop as shipped (runner.run_continuously) on a 1 s refresh, maintenance
    due daily (so it runs after the first batch only), 5 records produced after each batch so the next has work;
    `observe(result)` after each. Returns what `observe` returned, and checks every record landed once."""
    from icefloe.operate.runner import run_continuously

    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 5))
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "refresh": "1s",
            "continuous": True,
            "maintenance": {"interval": "1d"},
        }
    )
    stop, seen = threading.Event(), []

    def on_result(result) -> None:
        seen.append(observe(result))
        if len(seen) == count:
            stop.set()
        else:
            produce(broker.bootstrap_servers, topic, records(5 * len(seen), 5))

    run_continuously(spark, config, list(config.tables), state_dir, on_result, stop, poll_s=0.1)
    rows = by_position(read_pyiceberg(state_dir, f"local.{topic}"))
    assert sorted(r["n"] for r in rows.values()) == list(range(5 * count))
    return seen


def test_a_micro_batch_costs_the_same_commits_and_loads_however_many_came_before(
    spark, broker, state_dir, topic, make_config
):
    """Each micro-batch commits COMMITS_PER_BATCH times and loads the table at most LOADS_PER_BATCH times, the same
    for the 3rd and the 12th batch (the 1st and 2nd include creating and maintaining the table), so a regression
    that adds a commit or a load per batch, or one that grows with history, fails."""
    from icefloe.table.iceberg import LOADS

    def observe(result):
        return result.status, metadata_version(result.metadata_location), sum(LOADS.values())

    seen = micro_batches(spark, broker, state_dir, topic, make_config, 12, observe)
    assert [status for status, _, _ in seen] == ["committed"] * 12
    costs = [(version - seen[i][1], loads - seen[i][2]) for i, (_, version, loads) in enumerate(seen[1:])][1:]
    print("commits and loads per micro-batch:", costs)
    assert all(commits == COMMITS_PER_BATCH for commits, _ in costs), costs
    assert all(loads == costs[0][1] for _, loads in costs) and costs[0][1] <= LOADS_PER_BATCH, costs


def test_continuous_mode_bounds_the_snapshots_and_keeps_the_checkpoint(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    """Snapshot expiry by count between maintenance runs (maintenance.bound_snapshots, 3 kept here): a table never
    holds more than twice that and a batch, whatever `snapshotRetention` (1d) says, and the next run resumes from
    the checkpoint (every record once)."""
    from icefloe.operate import maintenance

    monkeypatch.setattr(maintenance, "CONTINUOUS_SNAPSHOTS_KEPT", 3)

    def observe(result):
        return IcebergTable(spark, result.identifier).java().operations().current().snapshots().size()

    counts = micro_batches(spark, broker, state_dir, topic, make_config, 10, observe)
    print("snapshots after each micro-batch:", counts)
    assert max(counts[2:]) <= 2 * 3 + 1, counts  # the 1st and 2nd: the table's creation and its first maintenance
    produce(broker.bootstrap_servers, topic, records(50, 5))
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    assert run_table(spark, config, config.tables[0], state_dir).rows_written == 5
    rows = by_position(read_pyiceberg(state_dir, f"local.{topic}"))
    assert sorted(r["n"] for r in rows.values()) == list(range(55))


def test_continuous_mode_bounds_the_snapshots_of_the_delete_markers_and_dead_letters(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    """An upsert table with a delete and a bad record in every micro-batch commits to `<table>_deletes` and
    `<table>_dlq` each time: their snapshots are bounded like the table's (3 kept here), not left for the hourly
    maintenance to expire after `snapshotRetention` (a day of micro-batches in every metadata file of theirs)."""
    from icefloe.operate import maintenance
    from icefloe.operate.runner import run_continuously

    monkeypatch.setattr(maintenance, "CONTINUOUS_SNAPSHOTS_KEPT", 3)
    broker.create_topic(topic, 1)

    def changes(index: int) -> list[dict]:
        upsert = {"key": f"k{index}".encode(), "value": json.dumps({"n": index}).encode()}
        return [upsert, {"key": f"k{index - 1}".encode(), "value": None}, {"key": b"bad", "value": b"not json"}]

    produce(broker.bootstrap_servers, topic, changes(0))
    table = {"topic": topic, "format": "json", "schema": SCHEMA, "refresh": "1s", "mode": "upsert", "errors": "dlq"}
    config = make_config(table | {"maintenance": {"interval": "1d"}})
    identifier = config.identifier(config.tables[0])
    stop, counts = threading.Event(), []

    def snapshots(name: str) -> int:
        return IcebergTable(spark, name).java().operations().current().snapshots().size()

    def on_result(result) -> None:
        counts.append((snapshots(f"{identifier}_deletes"), snapshots(f"{identifier}_dlq")))
        if len(counts) == 10:
            stop.set()
        else:
            produce(broker.bootstrap_servers, topic, changes(len(counts)))

    run_continuously(spark, config, list(config.tables), state_dir, on_result, stop, poll_s=0.1)
    print("delete-marker and dead-letter snapshots after each micro-batch:", counts)
    assert max(max(pair) for pair in counts[2:]) <= 2 * 3 + 2, counts
    rows = read_pyiceberg(state_dir, identifier)
    assert sorted(r["n"] for r in rows) == [9], "every key but the last deleted"
    assert len(read_pyiceberg(state_dir, f"{identifier}_dlq")) == 10


def test_an_unexpected_failure_in_one_table_leaves_the_others_committing_and_heals(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    """A failure no icefloe error describes (a RuntimeError from a step of one table's batch) must not end the
    continuous job: the other table goes on committing, and the failing table commits again once the cause is gone."""
    from icefloe.materialize import batch as materializer
    from icefloe.operate import runner

    broken_topic, healthy_topic = f"{topic}_broken", f"{topic}_healthy"
    for name in (broken_topic, healthy_topic):
        broker.create_topic(name, 2)
        produce(broker.bootstrap_servers, name, records(0, 10))
    table = {"format": "json", "schema": SCHEMA, "refresh": "1s", "maintenance": {"enabled": False}}
    config = make_config({"topic": broken_topic, **table}, {"topic": healthy_topic, **table})
    real_committed_state = materializer.committed_state
    failures, results = [], []
    cause = threading.Event()
    cause.set()

    def failing_state(iceberg, name):
        if name == broken_topic and cause.is_set():
            failures.append(name)
            raise RuntimeError("an unexpected failure in a step of the batch")
        return real_committed_state(iceberg, name)

    monkeypatch.setattr(materializer, "committed_state", failing_state)
    stop = threading.Event()

    def committed(name: str) -> int:
        return sum(r.status == "committed" and r.topic == name for r in results)

    def next_step(result) -> None:
        """Called by the loop after each batch (the loop keeps the Spark session's thread)."""
        results.append(result)
        if result.topic == healthy_topic and committed(healthy_topic) == 1:
            produce(broker.bootstrap_servers, healthy_topic, records(10, 10))  # committed beside the failing table
        elif result.topic == healthy_topic and committed(healthy_topic) >= 2 and len(failures) >= 2:
            assert committed(broken_topic) == 0
            cause.clear()
        elif result.topic == broken_topic:
            stop.set()

    watchdog = threading.Timer(300, stop.set)  # a loop that never gets there ends, and the assertions say why
    watchdog.start()
    try:
        suspended = runner.run_continuously(spark, config, config.tables, state_dir, next_step, stop, poll_s=0.2)
    finally:
        watchdog.cancel()
    assert suspended == 0
    assert committed(healthy_topic) >= 2 and len(failures) >= 2 and not cause.is_set(), (len(failures), results)
    assert committed(broken_topic) == 1, "the failing table recovered"
    for name, count in ((broken_topic, 10), (healthy_topic, 20)):
        rows = by_position(read_pyiceberg(state_dir, f"local.{name}"))
        assert sorted(r["n"] for r in rows.values()) == list(range(count))


def test_an_idle_continuous_loop_polling_commit_records_reuses_one_admin_client(
    spark, broker, state_dir, topic, make_config, monkeypatch, caplog
):
    """`commitRecords` makes the loop plan every second: each plan must not open new Kafka connections (MSK IAM
    throttles new authenticated connections), and a data loss it sees is not logged every second."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from icefloe.operate.runner import run_continuously
    from icefloe.source import kafka as kafka_source

    broker.create_topic(topic, 2)
    produce(broker.bootstrap_servers, topic, records(0, 10))
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "refresh": "1h",
            "continuous": True,
            "commitRecords": 1000,
            "onDataLoss": "warn",
            "maintenance": {"enabled": False},
        }
    )
    opened: list[int] = []

    class Counted(AdminClient):
        def __init__(self, conf):
            opened.append(1)
            super().__init__(conf)

    monkeypatch.setattr(kafka_source, "AdminClient", Counted)
    results, stop = [], threading.Event()

    def on_result(result):
        results.append(result)
        threading.Timer(5.0, stop.set).start()  # then ~25 polls of an idle loop
        # Unread records deleted after the first batch: every later plan sees the loss.
        produce(broker.bootstrap_servers, topic, records(10, 4))
        for future in broker.admin.delete_records([TopicPartition(topic, 0, 6)]).values():
            future.result(30)

    with caplog.at_level("WARNING", logger="icefloe.source.kafka"):
        run_continuously(spark, config, config.tables[0:1], state_dir, on_result, stop, poll_s=0.2)
    assert [r.status for r in results] == ["committed"], "refresh 1h and a record pending: one batch only"
    assert len(opened) <= 1, f"{len(opened)} AdminClients opened"
    assert not [r for r in caplog.records if "data loss" in r.getMessage()], "the idle loop logged the loss"
