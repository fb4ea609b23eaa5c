"""The EMR job's catalog code path on one machine: Iceberg GlueCatalog + S3FileIO against a moto server.

The run is the real `icefloe run --once` command in its own process (a SparkSession is per process), with exactly the
Glue catalog settings infra renders into the EMR job plus the catalog's endpoint overrides; the table is then read
back by an independent reader, pyiceberg's Glue catalog, through the same moto server.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import yaml

import test_materialize as orders
from icefloe.errors import ConfigError
from icefloe.spec import CatalogSpec, parse_config
from icefloe.table.catalog import CATALOG, spark_catalog_conf
from support import WatchedRun, ancestry, avro_serializer, by_position, produce, race, race_to_publish

ICEFLOE = [sys.executable, "-m", "icefloe.cli"]
PREFIX = f"spark.sql.catalog.{CATALOG}"
ENDPOINT_KEYS = {f"{PREFIX}.{k}" for k in ("glue.endpoint", "s3.endpoint", "s3.path-style-access", "client.region")}


def test_endpoints_add_only_the_overrides_to_the_emr_settings():
    emr = spark_catalog_conf(CatalogSpec(type="glue", warehouse="s3://b/w"))
    endpoints = {"glue": "http://127.0.0.1:1", "s3": "http://127.0.0.1:2", "region": "eu-west-1"}
    local = spark_catalog_conf(CatalogSpec(type="glue", warehouse="s3://b/w", endpoints=endpoints))

    assert not ENDPOINT_KEYS & emr.keys(), "the EMR job's settings must not carry endpoint overrides"
    assert {k: v for k, v in local.items() if k not in ENDPOINT_KEYS} == emr
    assert {k: local[k] for k in ENDPOINT_KEYS} == {
        f"{PREFIX}.glue.endpoint": "http://127.0.0.1:1",
        f"{PREFIX}.s3.endpoint": "http://127.0.0.1:2",
        f"{PREFIX}.s3.path-style-access": "true",
        f"{PREFIX}.client.region": "eu-west-1",
    }


def test_the_emr_job_parameters_carry_no_endpoints():
    pytest.importorskip("pulumi")
    from icefloe.spec import CatalogSpec
    from icefloe_infra.deployment import EmrSpec
    from icefloe_infra.jobs import spark_submit_parameters

    emr = EmrSpec(python="/usr/bin/python3.11")  # an image with its own 3.11: no imageUri needed here
    glue = CatalogSpec(type="glue", warehouse="s3://b/w")
    parameters = spark_submit_parameters(glue, "s3://b/bundle.tar.gz", ["s3://b/jars/spark-avro.jar"], emr)
    assert f"--conf {PREFIX}.type=glue" in parameters
    assert "endpoint" not in parameters and "path-style" not in parameters and "client.region" not in parameters


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        (
            {"type": "local", "endpoints": {"glue": "http://h:1", "s3": "http://h:1"}},
            r"icefloe:catalog: endpoints apply to a glue or rest catalog only",
        ),
        (
            {"type": "glue", "warehouse": "s3://w", "endpoints": {"glue": "h:1", "s3": "http://h:1"}},
            r"icefloe:catalog\.endpoints\.glue: an endpoint must be an http",
        ),
        (
            {"type": "glue", "warehouse": "s3://w", "endpoints": {"glue": "http://h:1"}},
            r"icefloe:catalog\.endpoints\.s3: Field required",
        ),
    ],
)
def test_bad_endpoints_are_config_errors_naming_the_key(catalog, message):
    cluster = {"name": "local", "bootstrapServers": "127.0.0.1:9092"}
    with pytest.raises(ConfigError, match=message):
        parse_config({"sourceClusters": [cluster], "catalog": catalog})


def glue_stack(path: Path, broker, registry, server, warehouse: str, table: dict) -> Path:
    """A stack file with one table of `test_materialize`'s orders in a Glue catalog served by `server`."""
    path.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "icefloe:sourceClusters": [
                        {
                            "name": "local",
                            "bootstrapServers": broker.bootstrap_servers,
                            "schemaRegistry": {"url": registry.url},
                        }
                    ],
                    "icefloe:tables": [{"sourceCluster": "local", "partitionBy": ["day(created_ms)"], **table}],
                    "icefloe:catalog": {
                        "type": "glue",
                        "warehouse": warehouse,
                        "endpoints": server.catalog_endpoints(),
                    },
                }
            }
        )
    )
    return path


def glue_env(server) -> dict[str, str]:
    """No AWS settings of the machine leak in: credentials and region come from the environment, as on EMR."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | server.aws_env()


def run_once(config: Path, state_dir: Path, env: dict[str, str]) -> tuple[dict, str]:
    """`icefloe run --once --json` as its own process: (the table's JSON result, the log)."""
    done = subprocess.run(
        [*ICEFLOE, "run", "--config", str(config), "--once", "--json", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def glue_metadata_location(moto_aws, identifier: str) -> str:
    database, name = identifier.split(".")
    table = moto_aws.client("glue").get_table(DatabaseName=database, Name=name)["Table"]
    assert table["Parameters"]["table_type"].upper() == "ICEBERG"
    return table["Parameters"]["metadata_location"]


@pytest.mark.broker
def test_glue_catalog_on_moto_materializes_and_pyiceberg_reads_it_back(broker, registry, moto_aws, topic, tmp_path):
    bucket = "icefloe-glue-" + topic.replace("_", "-")[:40].strip("-")
    s3 = moto_aws.client("s3")
    s3.create_bucket(Bucket=bucket)
    warehouse = f"s3://{bucket}/warehouse"
    # A file no snapshot references, as a crashed run leaves behind: maintenance after the first batch removes it.
    orphan = f"warehouse/local.db/{topic}/data/left-by-a-crashed-run.parquet"
    s3.put_object(Bucket=bucket, Key=orphan, Body=b"PAR1 not referenced by any snapshot")
    moto_aws.backdate_object(bucket, orphan, 600)  # older than orphanFileAge (>= runTimeout): no run can still own it
    broker.create_topic(topic, 3)
    produced = orders.produce_orders(broker, registry, topic, range(150), random.Random(11))
    config = glue_stack(
        tmp_path / "Pulumi.glue.yaml",
        broker,
        registry,
        moto_aws,
        warehouse,
        {"topic": topic, "runTimeout": "1m", "maintenance": {"orphanFileAge": "1m"}},
    )
    env = glue_env(moto_aws)

    first, log = run_once(config, tmp_path / "state", env)

    identifier = f"local.{topic}"
    assert first["status"] == "committed" and first["rows_written"] == len(produced)
    assert first["offsets"] == {str(p): 1 + max(o for (q, o) in produced if q == p) for p in range(3)}
    assert first["metadata_location"].startswith(f"{warehouse}/local.db/{topic}")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys)
    # Maintenance ran through S3FileIO: compaction, expiry and orphan removal listing the bucket.
    assert orphan not in keys, f"orphan removal left {orphan}:\n{log[-3000:]}"
    # Iceberg Java sent Glue's VersionId with every commit, so the moto server checked each one as Glue would.
    commits = [line for line in moto_aws.log_path.read_text().splitlines() if f"UpdateTable {identifier}:" in line]
    assert commits and all("is current, accepted" in line for line in commits), commits

    table = moto_aws.pyiceberg_catalog().load_table(identifier)
    assert table.metadata_location == glue_metadata_location(moto_aws, identifier)
    orders.assert_rows_match(table.scan().to_arrow().to_pylist(), produced, topic, empty_for_null_struct_list=True)
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("created_ms_day", "day")]

    # The first run also ran maintenance (due on a new table); a second run finds nothing new and commits nothing.
    before = glue_metadata_location(moto_aws, identifier)
    again, _ = run_once(config, tmp_path / "state", env)
    assert again["status"] == "up-to-date" and again["offsets"] == first["offsets"]
    assert glue_metadata_location(moto_aws, identifier) == before, "a run with nothing new must not commit"


@pytest.mark.broker
def test_two_runs_publishing_at_once_on_glue_keep_every_reported_commit(
    broker, registry, moto_aws, topic, tmp_path, run_in_worker
):
    """Two `icefloe run` processes of one Glue table (nothing serializes them, as two EMR job runs) plan from the
    same snapshot and reach their publish step together: each is stopped (SIGSTOP) as it logs that step, the server
    holds the table's next two `UpdateTable` requests until both have arrived, and both runs go on. Glue refuses the
    second fast-forward (its `VersionId` is stale); retried on the table reloaded, it is refused (main moved, it is
    no longer an ancestor of the branch) and that run re-plans: every publish a run reports is in main's history and
    every record is in the table once. (Plain moto accepts both fast-forwards, the later replacing the earlier, so
    one run's reported commit is gone from main's history; it also loses the runs' earlier concurrent commits, such
    as a branch created while the other run appended, so it is not a reliable second case here.)"""
    bucket = "icefloe-race-" + topic.replace("_", "-")[:40].strip("-")
    moto_aws.client("s3").create_bucket(Bucket=bucket)
    broker.create_topic(topic, 3)
    produced = orders.produce_orders(broker, registry, topic, range(240), random.Random(5))
    stack = partial(glue_stack, broker=broker, registry=registry, server=moto_aws, warehouse=f"s3://{bucket}/warehouse")
    first_batch = stack(tmp_path / "Pulumi.first.yaml", table={"topic": topic, "maxRecordsPerRun": 60})
    everything = stack(tmp_path / "Pulumi.all.yaml", table={"topic": topic})
    smaller = stack(tmp_path / "Pulumi.smaller.yaml", table={"topic": topic, "maxRecordsPerRun": 60})
    env = glue_env(moto_aws) | {"ICEFLOE_SPARK_MASTER": "local[1]"}
    run_in_worker(first_batch, tmp_path / "state")  # the table exists, with a snapshot both runs plan from

    identifier = f"local.{topic}"
    command = [*ICEFLOE, "run", "--once", "--json", "--state-dir", str(tmp_path / "state")]
    commands = [[*command, "--config", str(path)] for path in (everything, smaller)]
    logs = race_to_publish(commands, env, hold=lambda: moto_aws.gate_updates(identifier, 2))

    raced = held_updates(moto_aws, identifier)
    # Both fast-forwards were held, then the first to take the lock won; the other was refused and its run re-planned.
    assert raced[0] == "2 requests held, released together", raced[:3]
    assert raced[1].endswith("is current, accepted") and "is stale" in raced[2], raced[:3]
    assert sum("commit conflict, re-planning" in log for log in logs) == 1, [log[-3000:] for log in logs]
    # The branch head each run says it published (a run that lost the race logged "publishing" but not "published").
    published = [
        int(re.findall(rf"publishing branch {re.escape(branch)} \(snapshot (\d+)\)", log)[-1])
        for log in logs
        for branch in re.findall(r"published branch (\S+):", log)
    ]
    table = moto_aws.pyiceberg_catalog().load_table(identifier)
    history = ancestry(table)
    assert published and set(published) <= history, f"published {published}, main's history {sorted(history)}"
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(by_position(rows)) == sorted(produced), "every (partition, offset) exactly once"


def held_updates(server, identifier: str) -> list[str]:
    """What the server logged of the table's `UpdateTable` requests since it was told to hold the next ones."""
    prefix = f"glue UpdateTable {identifier}: "
    said = [line.split(prefix, 1)[1] for line in server.log_path.read_text().splitlines() if prefix in line]
    armed = max(i for i, text in enumerate(said) if text.startswith("the next "))
    return said[armed + 1 :]


@pytest.mark.broker
def test_two_runs_evolving_the_schema_at_once_on_glue_both_finish(
    broker, registry, moto_aws, topic, tmp_path, run_in_worker
):
    """A new schema version reaches two runs of one Glue table at once: both add its column. The server holds the
    table's next two `UpdateTable` requests (both runs' first commit: the schema change) until both arrive; Glue
    refuses the second as stale and Iceberg does not retry a schema change, so that run fails its attempt with
    `CommitFailedException`, which nothing committed: the run reads the schema again (`IcebergTable.evolve`), finds
    the column there and goes on. Both runs end well, every record is in the table once, the newer ones with the new column."""
    bucket = "icefloe-evolve-" + topic.replace("_", "-")[:40].strip("-")
    moto_aws.client("s3").create_bucket(Bucket=bucket)
    broker.create_topic(topic, 3)
    produced = set(orders.produce_orders(broker, registry, topic, range(60), random.Random(3)))
    config = glue_stack(
        tmp_path / "Pulumi.evolve.yaml", broker, registry, moto_aws, f"s3://{bucket}/warehouse", {"topic": topic}
    )
    env = glue_env(moto_aws) | {"ICEFLOE_SPARK_MASTER": "local[1]"}
    run_in_worker(config, tmp_path / "state")  # the table, at the older schema
    newer = json.loads(orders.ORDER_SCHEMA)
    newer["fields"].append({"name": "coupon", "type": ["null", "string"], "default": None})
    serialize = avro_serializer(registry.url, topic, json.dumps(newer))
    rng = random.Random(4)
    values = [{**orders.order(i, rng), "coupon": f"c{i}"} for i in range(60, 120)]
    produced |= set(
        produce(
            broker.bootstrap_servers, topic, [{"value": serialize(v), "partition": i % 3} for i, v in enumerate(values)]
        )
    )

    identifier = f"local.{topic}"
    moto_aws.gate_updates(identifier, 2)
    command = [*ICEFLOE, "run", "--once", "--json", "--state-dir", str(tmp_path / "state"), "--config", str(config)]
    runs = [WatchedRun(command, env) for _ in range(2)]
    codes = [run.process.wait(timeout=600) for run in runs]
    logs = ["".join(run.lines) for run in runs]
    assert codes == [0, 0], [log[-3000:] for log in logs]

    raced = held_updates(moto_aws, identifier)
    assert raced[0] == "2 requests held, released together" and "is stale" in raced[2], raced[:3]
    assert sum("schema evolved" in log for log in logs) == 1, "one run added the column, the other found it"
    table = moto_aws.pyiceberg_catalog().load_table(identifier)
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(by_position(rows)) == sorted(produced), "every (partition, offset) exactly once"
    assert sorted(r["coupon"] for r in rows if r["coupon"] is not None) == sorted(v["coupon"] for v in values)


@pytest.mark.broker
def test_two_maintains_at_once_on_glue_one_maintains_the_other_skips(
    broker, registry, moto_aws, topic, tmp_path, run_in_worker
):
    """Two `icefloe maintain` of one Glue table started together (as two scheduled runs finding maintenance due at
    once). The server holds the table's next two `UpdateTable` requests (each process's first commit) until both
    arrive: one wins, Glue refuses the other as stale. Both must exit 0: one maintains, the other finds the table's
    maintenance claimed by the first and skips it, and no count is negative. (Before the claim both compacted, and
    the loser's rewrite failed Iceberg's validation after the refused commit: an uncaught traceback, exit 1.)"""
    bucket = "icefloe-maint-" + topic.replace("_", "-")[:40].strip("-")
    moto_aws.client("s3").create_bucket(Bucket=bucket)
    broker.create_topic(topic, 3)
    produced = set(orders.produce_orders(broker, registry, topic, range(60), random.Random(8)))
    table = {"topic": topic, "maintenance": {"enabled": False}}
    config = glue_stack(tmp_path / "Pulumi.maint.yaml", broker, registry, moto_aws, f"s3://{bucket}/warehouse", table)
    env = glue_env(moto_aws) | {"ICEFLOE_SPARK_MASTER": "local[1]"}
    run_in_worker(config, tmp_path / "state")
    produced |= set(orders.produce_orders(broker, registry, topic, range(60, 120), random.Random(9)))
    run_in_worker(config, tmp_path / "state")  # two batches: two small files per partition for compaction to rewrite

    identifier = f"local.{topic}"
    moto_aws.gate_updates(identifier, 2)
    command = [*ICEFLOE, "maintain", "--json", "--state-dir", str(tmp_path / "state"), "--config", str(config)]
    outputs = [(tmp_path / f"maintain-{i}.out", tmp_path / f"maintain-{i}.log") for i in range(2)]
    processes = [
        subprocess.Popen(command, stdout=open(out, "w"), stderr=open(log, "w"), env=env) for out, log in outputs
    ]
    codes = [process.wait(timeout=600) for process in processes]
    logs = [log.read_text() for _, log in outputs]
    assert codes == [0, 0], [log[-3000:] for log in logs]

    assert held_updates(moto_aws, identifier)[0] == "2 requests held, released together"
    reports = [json.loads(out.read_text().strip().splitlines()[-1]) for out, _ in outputs]
    skipped = [r for r in reports if r["skipped"]]
    assert len(skipped) == 1 and "claimed by" in skipped[0]["skipped"], reports
    done = [r for r in reports if not r["skipped"]][0]
    assert "compaction" in done["steps"] and done["data_files_after"] < done["data_files_before"], done
    counts = [v for r in reports for k, v in r.items() if isinstance(v, int) and not isinstance(v, bool)]
    assert all(v >= 0 for v in counts), reports
    assert sum("maintenance skipped" in log for log in logs) == 1, [log[-2000:] for log in logs]
    rows = moto_aws.pyiceberg_catalog().load_table(identifier).scan().to_arrow().to_pylist()
    assert sorted(by_position(rows)) == sorted(produced), "every (partition, offset) exactly once"


@pytest.mark.broker
def test_an_upsert_deleting_from_files_maintenance_compacts_at_once_on_glue(
    broker, registry, moto_aws, topic, tmp_path
):
    """An upsert run publishes deletes and updates into the data files that an `icefloe maintain` of the same Glue
    table is compacting at that moment: the run is stopped as it logs its publish step, maintenance as it has claimed
    the table, the server holds the table's next two `UpdateTable` requests (the run's fast-forward, the first
    compaction commit) and both go on. Whichever wins, the other may not undo it: the compaction is refused
    (Iceberg's validation: new deletes against the files it replaced) or the run re-plans on the compacted files.
    Both exit 0, no delete is lost and no deleted key comes back."""
    bucket = "icefloe-upmaint-" + topic.replace("_", "-")[:40].strip("-")
    moto_aws.client("s3").create_bucket(Bucket=bucket)
    broker.create_topic(topic, 2)
    schema = {"fields": [{"name": "k", "type": "long"}, {"name": "v", "type": "long"}]}
    table = {"topic": topic, "format": "json", "schema": schema, "mode": "upsert", "maintenance": {"enabled": False}}
    config = tmp_path / "Pulumi.upmaint.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers}],
                    "icefloe:tables": [{"sourceCluster": "local", **table}],
                    "icefloe:catalog": {
                        "type": "glue",
                        "warehouse": f"s3://{bucket}/warehouse",
                        "endpoints": moto_aws.catalog_endpoints(),
                    },
                }
            }
        )
    )
    env = glue_env(moto_aws) | {"ICEFLOE_SPARK_MASTER": "local[1]"}
    state = tmp_path / "state"

    def change(k: int, v: int | None) -> dict:
        value = None if v is None else json.dumps({"k": k, "v": v}).encode()
        return {"key": f"k{k}".encode(), "value": value, "partition": k % 2}

    expected: dict[int, int] = {}
    for v in (1, 2):  # two batches: small files and position deletes for compaction to rewrite
        produce(broker.bootstrap_servers, topic, [change(k, v) for k in range(40)])
        run_once(config, state, env)
        expected |= dict.fromkeys(range(40), v)
    produce(
        broker.bootstrap_servers, topic, [change(k, None) for k in range(20)] + [change(k, 3) for k in range(20, 30)]
    )
    expected = {k: 3 if k < 30 else v for k, v in expected.items() if k >= 20}

    identifier = f"local.{topic}"
    run = WatchedRun([*ICEFLOE, "run", "--once", "--json", "--state-dir", str(state), "--config", str(config)], env)
    report_path = tmp_path / "maintain.json"
    maintain_command = [*ICEFLOE, "maintain", "--json", "--state-dir", str(state), "--config", str(config)]
    # exec: the signals reach the Python process itself; its JSON report goes to a file (WatchedRun drops stdout)
    maintain = WatchedRun(["sh", "-c", f'exec "$@" > {report_path}', "sh", *maintain_command], env)

    def both_there() -> None:
        assert not maintain.seen("compaction"), "maintenance went on past its claim before it was stopped"
        moto_aws.gate_updates(identifier, 2)

    logs = race([(run, "publishing branch"), (maintain, "maintenance claimed")], both_there)
    assert held_updates(moto_aws, identifier)[0] == "2 requests held, released together"
    report = json.loads(report_path.read_text().strip().splitlines()[-1])
    compaction_lost = "compaction" in report["lost_races"] or report["compaction_failed_files"] > 0
    assert compaction_lost or "commit conflict, re-planning" in logs[0], "one of the two lost the race"
    print("maintenance:", report, "run:", [line for line in logs[0].splitlines() if "icefloe.r" in line][-3:])

    # The batch is in the table whole, or (its run yielded to maintenance's commits) not at all: never a part of it.
    rows = moto_aws.pyiceberg_catalog().load_table(identifier).scan().to_arrow().to_pylist()
    assert sorted((r["k"], r["v"]) for r in rows) in (sorted(expected.items()), [(k, 2) for k in range(40)]), rows
    run_once(config, state, env)  # the next run reads on from what is committed
    rows = moto_aws.pyiceberg_catalog().load_table(identifier).scan().to_arrow().to_pylist()
    assert sorted((r["k"], r["v"]) for r in rows) == sorted(expected.items()), "no delete lost, nothing resurrected"
