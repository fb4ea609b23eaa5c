"""`icefloe:catalog: {type: rest}` against Apache Iceberg's own REST catalog server (icefloe_dev.rest_catalog).

The settings are checked as rendered for Spark and pyiceberg (secrets only at run time, never in job parameters);
then the real `icefloe run --once` writes through the server in its own process, and pyiceberg's REST catalog reads
the table back. Two runs race to publish through a proxy that holds both commits until both have arrived; a commit
answered with a server error after the server applied it is resolved by reading the table back. A second server keeps
its warehouse on `s3://` on the moto server and vends its S3 credentials to a run that has none.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import yaml

import test_materialize as orders
from icefloe.errors import ConfigError
from icefloe.spec import CatalogSpec, parse_config
from icefloe.table.catalog import CATALOG, rest_properties, spark_catalog_conf, spark_secret_conf
from support import WatchedRun, ancestry, by_position, race, race_to_publish, read_duckdb

ICEFLOE = [sys.executable, "-m", "icefloe.cli"]
PREFIX = f"spark.sql.catalog.{CATALOG}"
CLUSTER = {"name": "local", "bootstrapServers": "127.0.0.1:9092"}


# --- the spec and its rendering ---------------------------------------------------------------------------------


def rest(**fields) -> CatalogSpec:
    return parse_config({"sourceClusters": [CLUSTER], "catalog": {"type": "rest", **fields}}).catalog


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        ({"type": "rest"}, r"icefloe:catalog: a rest catalog needs uri"),
        ({"type": "rest", "uri": "https://h", "tokn": {"env": "T"}}, r"icefloe:catalog\.tokn: Extra inputs"),
        ({"type": "rest", "uri": "https://u:p@h"}, r"icefloe:catalog\.uri: uri must not carry credentials"),
        (
            {"type": "rest", "uri": "https://h", "credential": {"env": "A"}, "token": {"env": "B"}},
            r"give credential .* or token .*, not both",
        ),
        (
            {"type": "rest", "uri": "https://h", "credential": "id:secret"},
            r"icefloe:catalog\.credential: Input should be a valid dictionary",
        ),
        (
            {"type": "rest", "uri": "https://h", "headers": {"Authorization": "Bearer x"}},
            r"header Authorization: set it with token",
        ),
        ({"type": "rest", "uri": "https://h", "scope": "PRINCIPAL_ROLE:ALL"}, r"scope and oauth2ServerUri only apply"),
        (
            {
                "type": "rest",
                "uri": "https://h",
                "token": {"env": "T"},
                "signing": {"region": "eu-west-1", "service": "glue"},
            },
            r"signing .* takes no credential or token",
        ),
        ({"type": "rest", "uri": "https://h", "accessDelegation": "vended"}, r"icefloe:catalog\.accessDelegation"),
        ({"type": "glue", "warehouse": "s3://b/w", "uri": "https://h"}, r"uri apply to a rest catalog only"),
        (
            {"type": "rest", "uri": "https://h", "endpoints": {"glue": "http://h:1", "s3": "http://h:1"}},
            r"endpoints\.glue applies to a glue catalog only",
        ),
        (
            {"type": "glue", "warehouse": "s3://b/w", "endpoints": {"s3": "http://h:1"}},
            r"endpoints\.glue: a glue catalog",
        ),
        (
            {
                "type": "s3tables",
                "warehouse": "arn:aws:s3tables:eu-west-1:123456789012:bucket/tables",
                "signing": {"region": "eu-west-1", "service": "s3tables"},
            },
            r"s3tables is a preset",
        ),
    ],
)
def test_rest_catalog_typos_and_plain_credentials_are_config_errors(catalog, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"sourceClusters": [CLUSTER], "catalog": catalog})


def test_rest_settings_for_spark_and_pyiceberg_are_one_set_without_secrets(monkeypatch):
    monkeypatch.setenv("POLARIS_CLIENT_ID", "client-7")
    monkeypatch.setenv("POLARIS_CLIENT_SECRET", "s3cr3t-value")
    catalog = rest(
        uri="https://polaris.example/api/catalog",
        warehouse="analytics",
        credential={"env": "POLARIS"},
        scope="PRINCIPAL_ROLE:ALL",
        headers={"X-Custom": "a"},
        accessDelegation="vended-credentials",
    )
    properties = rest_properties(catalog)
    assert properties == {
        "type": "rest",
        "uri": "https://polaris.example/api/catalog",
        "warehouse": "analytics",
        "scope": "PRINCIPAL_ROLE:ALL",
        "header.X-Custom": "a",
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
    }
    conf = spark_catalog_conf(catalog)
    assert {k.removeprefix(PREFIX + "."): v for k, v in conf.items() if k.startswith(PREFIX + ".")} == properties | {
        "cache-enabled": "false"
    }
    # What infra renders into the job (spark_catalog_conf) never holds the secret; the run resolves it itself.
    assert "s3cr3t-value" not in json.dumps(conf)
    assert spark_secret_conf(catalog) == {f"{PREFIX}.credential": "client-7:s3cr3t-value"}

    monkeypatch.setenv("UNITY_TOKEN", "dapi-token")
    assert spark_secret_conf(rest(uri="https://h", token={"env": "UNITY"})) == {f"{PREFIX}.token": "dapi-token"}
    monkeypatch.delenv("UNITY_TOKEN")
    with pytest.raises(ConfigError, match="token missing: set UNITY_TOKEN"):
        spark_secret_conf(rest(uri="https://h", token={"env": "UNITY"}))


def test_a_rest_catalogs_s3_endpoints_off_aws_reach_spark_and_pyiceberg_alike():
    catalog = rest(
        uri="http://127.0.0.1:1", warehouse="s3://b/w", endpoints={"s3": "http://127.0.0.1:2", "region": "us-east-1"}
    )
    s3 = {"s3.endpoint": "http://127.0.0.1:2", "s3.path-style-access": "true", "client.region": "us-east-1"}
    assert rest_properties(catalog) == {"type": "rest", "uri": "http://127.0.0.1:1", "warehouse": "s3://b/w"} | s3
    assert {k.removeprefix(PREFIX + "."): v for k, v in spark_catalog_conf(catalog).items()}.items() >= s3.items()


def test_s3_tables_is_a_preset_of_the_rest_catalog():
    bucket = "arn:aws:s3tables:eu-west-1:123456789012:bucket/tables"
    preset = CatalogSpec(type="s3tables", warehouse=bucket)
    spelled = rest(
        uri="https://s3tables.eu-west-1.amazonaws.com/iceberg",
        warehouse=bucket,
        signing={"type": "sigv4", "region": "eu-west-1", "service": "s3tables"},
    )
    assert preset.as_rest() == spelled
    assert rest_properties(preset) == rest_properties(spelled)
    # The preset adds S3FileIO and no metrics reports (the endpoint takes none): the only difference in Spark's settings.
    extra = set(spark_catalog_conf(preset).items()) - set(spark_catalog_conf(spelled).items())
    assert extra == {
        (f"{PREFIX}.io-impl", "org.apache.iceberg.aws.s3.S3FileIO"),
        (f"{PREFIX}.rest-metrics-reporting-enabled", "false"),
    }


# --- end to end, through Iceberg's REST catalog server -------------------------------------------------------------


@pytest.fixture
def rest_server(rest_catalog_server):
    return rest_catalog_server  # one per test session (tests/conftest.py)


@pytest.fixture
def proxy(rest_server):
    from icefloe_dev.rest_catalog import CommitProxy

    with CommitProxy(rest_server.uri) as running:
        yield running


def test_oauth2_client_credentials_are_exchanged_for_a_bearer_token(rest_server, proxy, monkeypatch, tmp_path):
    """`credential` from env: pyiceberg (`icefloe status`'s reader) asks the server's token endpoint, then sends the
    token as Bearer. (Iceberg's server grants any credential: the flow is verified here, not a vendor's check.)"""
    from icefloe.table.catalog import pyiceberg_catalog

    monkeypatch.setenv("REST_OAUTH_CLIENT_ID", "icefloe")
    monkeypatch.setenv("REST_OAUTH_CLIENT_SECRET", "s3cr3t-value")
    catalog = rest(**rest_server.catalog(proxy.uri), credential={"env": "REST_OAUTH"}, scope="catalog")
    pyiceberg_catalog(catalog, tmp_path).list_namespaces()
    methods = [(method, path.split("?")[0], scheme) for method, path, scheme in proxy.requests]
    assert methods[0][:2] == ("POST", "/v1/oauth/tokens"), methods
    assert ("GET", "/v1/namespaces", "Bearer") in methods, methods


def rest_stack(path: Path, broker, registry, catalog: dict, table: dict) -> Path:
    """A stack file with one table of `test_materialize`'s orders in the REST catalog `catalog`."""
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
                    "icefloe:catalog": catalog,
                }
            }
        )
    )
    return path


def run_once(config: Path, state_dir: Path, env: dict[str, str] | None = None) -> tuple[dict, str]:
    done = subprocess.run(
        [*ICEFLOE, "run", "--config", str(config), "--once", "--json", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        env=env or os.environ.copy(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.broker
def test_rest_catalog_materializes_with_a_bearer_token_and_pyiceberg_reads_it_back(
    broker, registry, rest_server, topic, tmp_path
):
    broker.create_topic(topic, 3)
    produced = orders.produce_orders(broker, registry, topic, range(150), random.Random(11))
    catalog = rest_server.catalog() | {"token": {"env": "REST_CATALOG"}}
    config = rest_stack(tmp_path / "Pulumi.rest.yaml", broker, registry, catalog, {"topic": topic})
    env = os.environ | {"REST_CATALOG_TOKEN": "not-a-real-token-4711"}

    first, log = run_once(config, tmp_path / "state", env)

    identifier = f"local.{topic}"
    assert first["status"] == "committed" and first["rows_written"] == len(produced)
    assert first["offsets"] == {str(p): 1 + max(o for (q, o) in produced if q == p) for p in range(3)}
    assert "not-a-real-token-4711" not in log
    table = rest_server.pyiceberg_catalog().load_table(identifier)
    assert f"rest-warehouse/local/{topic}/metadata/" in first["metadata_location"]  # written under its warehouse
    orders.assert_rows_match(table.scan().to_arrow().to_pylist(), produced, topic, empty_for_null_struct_list=True)
    # The run's branches are gone; the offsets ride on main's snapshot summary (what the next run plans from).
    assert set(table.metadata.refs) == {"main"}
    # The first run also ran maintenance (due on a new table); a second run finds nothing new and commits nothing.
    again, _ = run_once(config, tmp_path / "state", env)
    assert again["status"] == "up-to-date" and again["offsets"] == first["offsets"]
    assert rest_server.pyiceberg_catalog().load_table(identifier).metadata_location == table.metadata_location

    status = subprocess.run(
        [*ICEFLOE, "status", "--config", str(config), "--json", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr[-2000:]
    assert "not-a-real-token-4711" not in status.stdout + status.stderr
    assert str(len(produced)) in status.stdout


def two_runs(
    broker, registry, rest_server, proxy, topic, tmp_path, rng, run_in_worker
) -> tuple[list, list[list[str]], dict]:
    """240 orders on `topic`, the first 60 committed through the proxy (a batch in the worker's Spark: the runs need
    only the table, with a snapshot both plan from); then the commands of two runs of the table that overlap (one for
    all that is left, one for at most 60 records), their environment, and the orders."""
    broker.create_topic(topic, 3)
    produced = orders.produce_orders(broker, registry, topic, range(240), rng)
    stack = partial(rest_stack, broker=broker, registry=registry, catalog=rest_server.catalog(proxy.uri))
    run_in_worker(
        stack(tmp_path / "Pulumi.first.yaml", table={"topic": topic, "maxRecordsPerRun": 60}), tmp_path / "state"
    )
    everything = stack(tmp_path / "Pulumi.all.yaml", table={"topic": topic})
    smaller = stack(tmp_path / "Pulumi.smaller.yaml", table={"topic": topic, "maxRecordsPerRun": 60})
    command = [*ICEFLOE, "run", "--once", "--json", "--state-dir", str(tmp_path / "state")]
    env = os.environ | {"ICEFLOE_SPARK_MASTER": "local[1]"}
    return produced, [[*command, "--config", str(path)] for path in (everything, smaller)], env


@pytest.mark.broker
def test_two_runs_publishing_at_once_over_rest_keep_every_reported_commit(
    broker, registry, rest_server, proxy, topic, tmp_path, run_in_worker
):
    """Two `icefloe run` processes of one table (nothing serializes them) plan from the same snapshot and reach their
    publish step together: each is stopped (SIGSTOP) as it logs that step, the proxy holds the table's next two
    commits until both have arrived, and both runs go on. The server answers the second fast-forward with 409 (its
    requirement on main's snapshot fails); retried on the table reloaded, it is refused (main is not an ancestor of
    the branch) and that run re-plans: every publish a run reports is in main's history, every record in the table
    once."""
    produced, commands, env = two_runs(
        broker, registry, rest_server, proxy, topic, tmp_path, random.Random(5), run_in_worker
    )
    identifier = f"local.{topic}"
    logs = race_to_publish(commands, env, hold=lambda: proxy.gate_commits(identifier, 2))

    raced = proxy.commits(identifier)
    held = raced.index("2 commits held, released together")
    assert raced[held + 1 : held + 3] == ["200", "409"], raced
    assert sum("commit conflict, re-planning" in log for log in logs) == 1, [log[-3000:] for log in logs]
    published = [
        int(re.findall(rf"publishing branch {re.escape(branch)} \(snapshot (\d+)\)", log)[-1])
        for log in logs
        for branch in re.findall(r"published branch (\S+):", log)
    ]
    table = rest_server.pyiceberg_catalog().load_table(identifier)
    assert published and set(published) <= ancestry(table), f"published {published}, main {sorted(ancestry(table))}"
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(by_position(rows)) == sorted(produced), "every (partition, offset) exactly once"


@pytest.mark.broker
def test_two_runs_appending_to_their_branches_at_once_over_rest_both_finish(
    broker, registry, rest_server, proxy, topic, tmp_path, run_in_worker
):
    """Two runs of one table write their batches at the same moment, each to its own branch: each is stopped as it
    starts writing, the proxy holds both appends and lets them through together. Both were built on the same table
    metadata, so both carry the same sequence number; a REST server without apache/iceberg#15126 (Iceberg's own
    before 1.11) applies one and answers the other 400 "Cannot add snapshot with sequence number N older than last
    sequence number N": a race that run lost, nothing committed, not a bad request. That run re-plans as after a
    commit that lost a race (409); both runs finish, every record in the table once."""
    produced, commands, env = two_runs(
        broker, registry, rest_server, proxy, topic, tmp_path, random.Random(9), run_in_worker
    )
    identifier = f"local.{topic}"
    runs = [WatchedRun(command, env) for command in commands]
    logs = race([(run, "writing the batch on branch") for run in runs], lambda: proxy.gate_commits(identifier, 2))

    raced = proxy.commits(identifier)
    held = raced.index("2 commits held, released together")
    assert sorted(raced[held + 1 : held + 3]) == ["200", "400"], raced  # one applied, one refused for its number
    # The refused run said why and wrote again (race() checked that both runs exited 0)
    assert sum("older than last sequence number" in log for log in logs) == 1, [log[-3000:] for log in logs]
    table = rest_server.pyiceberg_catalog().load_table(identifier)
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(by_position(rows)) == sorted(produced), "every (partition, offset) exactly once"


@pytest.mark.broker
@pytest.mark.parametrize("status", [502])
def test_a_5xx_on_an_applied_commit_is_resolved_by_reading_the_table(
    broker, registry, rest_server, proxy, topic, tmp_path, status, run_in_worker
):
    """The server applies the publishing fast-forward, but the client gets a server error (the response lost):
    Iceberg reports `CommitStateUnknownException`, not a refusal. The run must not re-send the commit blindly; it
    re-plans from the table as the catalog has it, finds main carrying the batch's offsets, and commits nothing
    again. Every (partition, offset) once."""
    broker.create_topic(topic, 3)
    produced = orders.produce_orders(broker, registry, topic, range(90), random.Random(7))
    config = rest_stack(
        tmp_path / "Pulumi.rest.yaml",
        broker,
        registry,
        rest_server.catalog(proxy.uri),
        {"topic": topic, "maintenance": {"enabled": False}},
    )
    identifier = f"local.{topic}"
    # The run's commits: create (an empty first snapshot on a staging branch, main created at it), its branch,
    # the batch's append to the branch, then the fast-forward of main: the fourth commit after creation is the one.
    command = [*ICEFLOE, "run", "--once", "--json", "--state-dir", str(tmp_path / "state"), "--config", str(config)]
    run = WatchedRun(command, os.environ.copy())
    assert run.logged("writing the batch on branch", 300), "".join(run.lines[-20:])
    assert run.logged("publishing branch", 300), "".join(run.lines[-20:])
    run.process.send_signal(signal.SIGSTOP)
    proxy.fail_commits(identifier, [status])
    run.process.send_signal(signal.SIGCONT)
    assert run.process.wait(timeout=600) == 0, "".join(run.lines[-40:])
    log = "".join(run.lines)

    said = proxy.commits(identifier)
    assert f"200, answered {status}" in said, said
    assert "CommitStateUnknown" in log, log[-3000:]
    table = rest_server.pyiceberg_catalog().load_table(identifier)
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(by_position(rows)) == sorted(produced), "every (partition, offset) exactly once"
    again = run_in_worker(config, tmp_path / "state")  # a batch in the worker's Spark: its process is not checked
    assert [r.status for r in again] == ["up-to-date"]


@pytest.mark.broker
def test_rest_catalog_with_an_s3_warehouse_vends_the_credentials_the_run_writes_with(
    broker, registry, moto_aws, state_dir, topic, tmp_path
):
    """The REST server keeps its warehouse in a bucket on the moto server (S3FileIO, iceberg-aws-bundle) and vends its
    S3 credentials with every table it loads. The run asks for them (`accessDelegation: vended-credentials`: the
    `X-Iceberg-Access-Delegation` header, on every request) and has no AWS credentials of its own (no AWS_* in its
    environment, no credential files, no instance metadata): its Spark writes the data files through S3FileIO with
    the vended keys only. pyiceberg (through the server) and DuckDB (the bucket's files) read back what was produced.
    (Iceberg's fixture vends its own static keys whatever the header says: the header is verified as sent here, a
    vendor's short-lived, table-scoped credentials only there.)"""
    from icefloe_dev.readers import duckdb_over_s3_copy
    from icefloe_dev.rest_catalog import CommitProxy, RestCatalogServer

    bucket = "icefloe-rest-warehouse"
    s3 = moto_aws.client("s3")
    s3.create_bucket(Bucket=bucket)
    warehouse = f"s3://{bucket}/warehouse"
    broker.create_topic(topic, 3)
    produced = orders.produce_orders(broker, registry, topic, range(150), random.Random(13))
    server = RestCatalogServer(state_dir / "rest-on-s3", warehouse=warehouse, s3=moto_aws, vend_credentials=True)
    with server, CommitProxy(server.uri) as proxy:
        catalog = server.catalog(proxy.uri)
        assert catalog["accessDelegation"] == "vended-credentials" and catalog["endpoints"]["s3"] == moto_aws.endpoint
        config = rest_stack(tmp_path / "Pulumi.rest-s3.yaml", broker, registry, catalog, {"topic": topic})
        nowhere = str(tmp_path / "no-such-file")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
            "AWS_SHARED_CREDENTIALS_FILE": nowhere,
            "AWS_CONFIG_FILE": nowhere,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

        first, log = run_once(config, tmp_path / "state", env)

        identifier = f"local.{topic}"
        assert first["status"] == "committed" and first["rows_written"] == len(produced), first
        assert first["metadata_location"].startswith(f"{warehouse}/local/{topic}/metadata/"), first
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"warehouse/local/{topic}/")["Contents"]]
        assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys), keys
        table_requests = [(m, p.split("?")[0], d) for m, p, d in proxy.delegations if "/tables" in p]
        assert table_requests and all(d == "vended-credentials" for _, _, d in table_requests), table_requests

        # The first run also maintained the new table through the same FileIO (compaction, expiry, orphan listing).
        assert not first.get("maintenance_error"), first
        table = server.pyiceberg_catalog().load_table(identifier)
        assert table.io.properties.get("s3.access-key-id"), "pyiceberg read with the keys the server vended"
        orders.assert_rows_match(table.scan().to_arrow().to_pylist(), produced, topic, empty_for_null_struct_list=True)
        duck = duckdb_over_s3_copy(s3, bucket, f"warehouse/local/{topic}/")
        orders.assert_rows_match(read_duckdb(table.metadata_location, con=duck), produced, topic)
