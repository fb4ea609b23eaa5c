"""The deployed job on a real multi-process Spark cluster: how the EMR Serverless deployment is verified here.

A standalone master and two workers of one core each (separate JVMs; each executor a further JVM with its own Python
workers) run the job exactly as `pulumi up` deploys it: the Pulumi program runs (under mocks) with the real bundle
builder and the real jars, its S3 objects (bundle, entry point, jars, job config) and Glue databases are put on the
moto server, and each table's StartJobRun request becomes a `spark-submit` (icefloe_dev.spark_cluster.emr_job_submit:
only the master, the artifacts' paths, EMR's own Iceberg jar, the catalog's endpoints and the job's size replaced).
The driver and the executors run the system's /usr/bin/python3.11 (EMR's `python`, no site-packages of this project)
with PYTHONPATH=./deps: what they import comes from the bundle or not at all. The job reads its config from the
`s3://` URI on the moto server; Glue on the moto server is the catalog. Tables are read back by pyiceberg and DuckDB.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

import test_materialize as orders
from icefloe.session import jvm_lib
from icefloe_dev.moto_server import REGION
from icefloe_dev.readers import duckdb_over_s3_copy
from icefloe_dev.spark_cluster import DeployedStack, SparkCluster, SubmittedJob
from support import WatchedRun, by_position, crash_point, crash_seed, produce, read_duckdb
from test_poison import JSON_SCHEMA, good_json, json_poisons, lay_out
from test_upsert import SCHEMA as ACCOUNT_SCHEMA
from test_upsert import changes, expected_state, table_state

pytestmark = [pytest.mark.cluster, pytest.mark.broker, pytest.mark.bundle]

EMR_PYTHON = "/usr/bin/python3.11"  # EmrSpec's default `python`: here the system's, without this project's packages
DATABASE = "local"  # the source cluster's name
TOPICS = {
    "orders": "cluster_orders",  # Avro: the JVM read path
    "accounts": "cluster_accounts",  # JSON upsert: the JVM read path (from_json)
    "payments": "cluster_payments",  # JSON with bad records to the DLQ: the Python read path (decimal, binary columns)
    "executor_kill": "cluster_executor_kill",
    "driver_kill": "cluster_driver_kill",
}
# Maintenance runs in the first table's job (due on a new table: compaction, expiry, orphan removal through
# S3FileIO on the cluster); the others leave it out, which saves a minute or more each on this machine.
OFF = {"maintenance": {"enabled": False}}
TABLES = [
    {"topic": TOPICS["orders"], "partitionBy": ["day(created_ms)"]},
    {"topic": TOPICS["accounts"], "format": "json", "schema": ACCOUNT_SCHEMA, "mode": "upsert", **OFF},
    {"topic": TOPICS["payments"], "format": "json", "schema": JSON_SCHEMA, "errors": "dlq", **OFF},
    {"topic": TOPICS["executor_kill"], **OFF},
    {"topic": TOPICS["driver_kill"], **OFF},
]
pytest.importorskip("pulumi")
if not Path(EMR_PYTHON).exists():  # pragma: no cover
    pytest.skip(
        f"the job's Python {EMR_PYTHON} is not on this machine (scripts/setup.sh installs it)", allow_module_level=True
    )


@dataclass
class Deployment:
    stack: DeployedStack
    cluster: SparkCluster

    jobs: list[SubmittedJob] = field(default_factory=list)

    def submit(self, identifier: str) -> SubmittedJob:
        self.jobs.append(self.stack.submit(identifier, self.cluster.url))
        return self.jobs[-1]

    def remove_copies(self) -> None:
        for job in self.jobs:
            job.remove_copies()
        self.cluster.remove_finished_applications()


@pytest.fixture(scope="module")
def deployment(broker, registry, moto_aws, tmp_path_factory):
    from icefloe_infra.bundle import build_bundle
    from pulumi_mocks import run_program

    root = tmp_path_factory.mktemp("cluster")
    path = root / "Pulumi.cluster.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "aws:region": REGION,
                    "icefloe:owner": "tests@example.com",
                    "icefloe:sourceClusters": [
                        {
                            "name": DATABASE,
                            "bootstrapServers": broker.bootstrap_servers,
                            "schemaRegistry": {"url": registry.url},
                        }
                    ],
                    "icefloe:tables": [{"sourceCluster": DATABASE, **table} for table in TABLES],
                }
            }
        )
    )
    # The real bundle (dependency wheels for EMR's x86_64 CPython 3.11) and the jars jvm/pom.xml pins.
    program = run_program(path, build=build_bundle, jar_dir=jvm_lib() / "spark")
    stack = DeployedStack(program, moto_aws, root)
    for topic in TOPICS.values():
        if topic != TOPICS["payments"]:  # lay_out creates its own, one partition per bad record
            broker.create_topic(topic, 3)
    with SparkCluster(root / "spark", workers=2, cores=1, env=moto_aws.aws_env()) as cluster:
        yield Deployment(stack, cluster)
    # The artifacts' copies, the bundle's unpacked one with them (about 550 MB), not kept for the session's end.
    shutil.rmtree(root / "artifacts", ignore_errors=True)


@pytest.fixture(autouse=True)
def _copies_removed(deployment):
    """A job copies the bundle and the jars into its driver's and each executor's directory (about 1.2 GB a job;
    the drivers' ./deps is one copy for the module, `unpack_archive`): removed after each test, or the module's jobs
    fill the disk the session's broker writes to."""
    yield
    deployment.remove_copies()


def identifier(topic: str) -> str:
    return f"{DATABASE}.{topic}"


# A job's time on a loaded 2-core machine: 10 minutes was seen at a load average of 40 (other users' Spark runs).
TIMEOUT = 1800


def submit_and_wait(job: SubmittedJob, timeout: float = TIMEOUT) -> tuple[list[dict], str]:
    """Run the job to its end: (its JSON results, its whole output: the Python driver's and Spark's logs)."""
    done = subprocess.run(
        job.command,
        cwd=job.cwd,
        env=job.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    (job.cwd / "output.log").write_text(done.stdout)
    assert done.returncode == 0, done.stdout[-5000:]
    return json_results(done.stdout), done.stdout


def json_results(output: str) -> list[dict]:
    results = []
    for line in output.splitlines():
        if line.startswith("{") and '"identifier"' in line:
            results.append(json.loads(line))
    return results


def glue_table(moto_aws, ident: str):
    return moto_aws.pyiceberg_catalog().load_table(ident)


def read_back(moto_aws, ident: str) -> tuple[list[dict], list[dict]]:
    """The table's rows by pyiceberg (Glue on the moto server) and by DuckDB (its metadata file, the same S3)."""
    table = glue_table(moto_aws, ident)
    return table.scan().to_arrow().to_pylist(), read_duckdb_s3(moto_aws, table.metadata_location)


def read_duckdb_s3(moto_aws, metadata_location: str) -> list[dict]:
    """DuckDB's own Iceberg reader over the table's files as they are on the moto server (copied, at their s3://
    paths: DuckDB's S3 client, the httpfs extension, is not installed)."""
    bucket, key = metadata_location.removeprefix("s3://").split("/", 1)
    table_prefix = key.rsplit("/metadata/", 1)[0] + "/"
    return read_duckdb(metadata_location, con=duckdb_over_s3_copy(moto_aws.client("s3"), bucket, table_prefix))


# -- the tables ----------------------------------------------------------------------------------------------------


def test_append_table_on_the_jvm_path(deployment, broker, registry, moto_aws):
    topic = TOPICS["orders"]
    produced = orders.produce_orders(broker, registry, topic, range(300), random.Random(21))

    results, log = submit_and_wait(deployment.submit(identifier(topic)))

    assert [r["status"] for r in results] == ["committed"] and results[0]["rows_written"] == len(produced), log[-3000:]
    assert "read path jvm" in log, log[-3000:]
    rows, duck = read_back(moto_aws, identifier(topic))
    orders.assert_rows_match(rows, produced, topic, empty_for_null_struct_list=True)
    orders.assert_rows_match(duck, produced, topic)


def test_json_upsert_table_on_the_jvm_path(deployment, broker, moto_aws):
    topic = TOPICS["accounts"]
    sent = changes(random.Random(31), keys=40, count=300)
    produce(broker.bootstrap_servers, topic, sent)

    results, log = submit_and_wait(deployment.submit(identifier(topic)))

    assert [r["status"] for r in results] == ["committed"], log[-3000:]
    assert "read path jvm" in log, log[-3000:]
    rows, duck = read_back(moto_aws, identifier(topic))
    assert table_state(rows) == expected_state(sent)
    assert table_state(duck) == expected_state(sent)


DLQ_CASES = {"invalid json", "wrong type", "missing required field", "invalid date"}


def test_bad_records_go_to_the_dead_letter_table(deployment, broker, moto_aws):
    topic = TOPICS["payments"]
    goods, bads = lay_out(broker, topic, [p for p in json_poisons() if p[0] in DLQ_CASES], good_json)

    results, log = submit_and_wait(deployment.submit(identifier(topic)))

    assert [(r["status"], r["records_failed"]) for r in results] == [("committed", len(bads))], log[-3000:]
    assert "read path python" in log, log[-3000:]
    rows, duck = read_back(moto_aws, identifier(topic))
    assert set(by_position(rows)) == set(goods) and set(by_position(duck)) == set(goods)
    dead, dead_duck = read_back(moto_aws, identifier(topic) + "_dlq")
    assert set(by_position(dead)) == set(bads) and set(by_position(dead_duck)) == set(bads)
    for row in dead:
        name, kind = bads[(row["kafka_partition"], row["kafka_offset"])]
        assert row["error_class"] in kind.split("|"), f"{name}: {row['error_class']} {row['error_message']}"


# -- processes killed mid-batch ------------------------------------------------------------------------------------


def executors(ui_port: int) -> list[dict]:
    """The driver's view of its executors (its UI's REST API): id, activeTasks, ..."""

    def get(path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/{path}", timeout=5) as answer:
            return json.loads(answer.read())

    try:
        (app,) = get("applications")
        return get(f"applications/{app['id']}/executors")
    except (OSError, ValueError):
        return []  # the driver's UI is not up yet, or gone


def kill_an_executor_running_a_task(
    cluster: SparkCluster, ui_port: int, run: WatchedRun, timeout: float = TIMEOUT
) -> str:
    """SIGKILL an executor JVM while one of the batch's tasks runs on it; its id.

    An executor the driver shows with a running task is stopped (SIGSTOP) first: if the driver still shows the task
    running a second later, the task was running when the executor stopped (a task that had ended would have been
    reported by then), and the executor is killed; else it is let go on and the watch goes on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.process.poll() is None:
        busy = [e["id"] for e in executors(ui_port) if e["activeTasks"] > 0]
        pids = cluster.executor_pids() if busy else {}  # /proc read only once a task runs: the executors start slowly
        for executor in [e for e in busy if e in pids]:
            os.kill(pids[executor], signal.SIGSTOP)
            time.sleep(1.0)
            if any(e["id"] == executor and e["activeTasks"] > 0 for e in executors(ui_port)):
                os.kill(pids[executor], signal.SIGKILL)
                return executor
            os.kill(pids[executor], signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"no executor was seen running a task of the batch; the run's log ends: {run.lines[-20:]}")


def watched(job: SubmittedJob) -> WatchedRun:
    # Its own session, so that the whole driver (spark-submit's JVM and the Python it starts) can be killed at once.
    return WatchedRun(
        job.command, job.env, cwd=job.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def ended(run: WatchedRun, timeout: float = TIMEOUT) -> str:
    code = run.process.wait(timeout)
    while not run.ended:  # the last lines drained
        time.sleep(0.05)
    log = "".join(run.lines)
    assert code == 0, log[-5000:]
    return log


def test_an_executor_killed_mid_batch_its_tasks_rerun_and_the_batch_commits_every_record_once(
    deployment, broker, registry, moto_aws
):
    topic = TOPICS["executor_kill"]
    produced = orders.produce_orders(broker, registry, topic, range(3000), random.Random(41))
    job = deployment.submit(identifier(topic))
    run = watched(job)
    try:
        assert run.logged("records from", TIMEOUT), run.lines[-20:]  # planned: the batch's tasks come next
        executor = kill_an_executor_running_a_task(deployment.cluster, int(job.conf["spark.ui.port"]), run)
        log = ended(run)
    finally:
        if run.process.poll() is None:
            os.killpg(run.process.pid, signal.SIGKILL)

    # Spark lost the executor with the task running on it and ran the task again; the batch committed once, every
    # record once.
    assert f"Lost executor {executor} on 127.0.0.1: Command exited with code 137" in log, log[-5000:]
    assert [r["status"] for r in json_results(log)] == ["committed"], log[-3000:]
    rows, duck = read_back(moto_aws, identifier(topic))
    assert sorted(by_position(rows)) == sorted(produced), "every (partition, offset) exactly once"
    orders.assert_rows_match(duck, produced, topic)


def test_the_driver_killed_mid_batch_the_next_submission_commits_every_record_once(
    deployment, broker, registry, moto_aws
):
    from pyiceberg.exceptions import NoSuchTableError

    topic = TOPICS["driver_kill"]
    produced = orders.produce_orders(broker, registry, topic, range(3000), random.Random(51))
    point = crash_point(random.Random(crash_seed()), test=3, trial=0)
    print(f"seed {crash_seed()}: killing the driver at {point}")
    run = watched(deployment.submit(identifier(topic)))
    try:
        assert run.logged("records from", TIMEOUT), run.lines[-20:]
        assert run.logged(point.marker, TIMEOUT), run.lines[-20:]
        time.sleep(point.delay)
        assert run.process.poll() is None, f"the driver ended before {point}: the test did not kill it mid-batch"
    finally:
        os.killpg(run.process.pid, signal.SIGKILL)  # spark-submit's JVM and its Python driver, as a lost driver
    run.process.wait(60)

    try:
        left = set(by_position(glue_table(moto_aws, identifier(topic)).scan().to_arrow().to_pylist()))
    except NoSuchTableError:
        left = set()
    assert left in (set(), set(produced)), (
        f"the killed run left {len(left)} of {len(produced)} records: not all or nothing"
    )
    # The master ends the lost driver's application (its executors with it) before the next one gets their cores.
    deadline = time.monotonic() + 120
    while deployment.cluster.running_applications() and time.monotonic() < deadline:
        time.sleep(0.5)

    results, log = submit_and_wait(deployment.submit(identifier(topic)))

    assert [r["status"] for r in results] in (["committed"], ["up-to-date"]), log[-3000:]
    rows, duck = read_back(moto_aws, identifier(topic))
    orders.assert_rows_match(rows, produced, topic, empty_for_null_struct_list=True)
    orders.assert_rows_match(duck, produced, topic)
