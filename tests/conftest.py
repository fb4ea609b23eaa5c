"""Shared fixtures: one Apache Kafka broker, one Apicurio Registry, one local SparkSession per test run.

Tests that materialize use the runtime's own code paths against these real processes and read the tables back
with independent readers (pyiceberg, DuckDB).
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

import pytest

from icefloe.spec import CatalogSpec, IcefloeConfig, parse_config

# The fixtures that start a process (JVM, broker, registry, moto server) or Spark: a test using none of them, and not
# marked `process` (it starts one itself) or `bundle`, is marked `unit` (`pytest -m unit`, well under a minute).
# `secured`: tests/source/test_secure_clusters.py's own broker (TLS, SASL).
PROCESS_FIXTURES = {"_services", "broker", "registry", "spark", "run_in_worker", "moto_aws", "secured"}

# The modules that take minutes (runs in their own processes, a platform of their own), longest first, from the
# `--durations` of full runs. `-n 2 --dist loadfile` hands out whole modules in collection order (see
# pytest_configure): these start first, and the short modules after them fill in, so both workers end together
# instead of one running a long module alone at the end.
LONG_MODULES = (
    "tests/table/test_glue_catalog.py",
    "tests/operate/test_cli.py",
    "tests/cluster/test_emr_on_cluster.py",
    "tests/operate/test_continuous.py",
    "tests/materialize/test_upsert.py",
    "tests/formats/test_cdc_postgres.py",
    "tests/formats/test_cdc_mariadb.py",
    "tests/materialize/test_materialize.py",
    "tests/table/test_rest_catalog.py",
    "tests/materialize/test_poison.py",
    "tests/source/test_kafka_semantics.py",
    "tests/formats/test_glue_protobuf.py",
    "tests/registries/test_glue_registry.py",
    "tests/formats/test_cdc_envelope.py",
    "tests/commit/test_concurrent_runs.py",
    "tests/table/test_schema_evolution.py",
    "tests/operate/test_maintenance_overlap.py",
    "tests/source/test_secure_clusters.py",
    "tests/operate/test_status.py",
    "tests/infra/test_infra_bundle.py",
)


def pytest_configure(config) -> None:
    # One crash seed for the whole run (support.crash_seed), also under pytest-xdist: its workers import support.py
    # each on their own, and inherit this environment from the controller that starts them.
    os.environ.setdefault("ICEFLOE_CRASH_SEED", str(int(time.time())))
    # Every Spark driver JVM of the run (the session's, and each `icefloe run` a test starts: they inherit this
    # environment; the cluster tests' jobs leave Spark settings out, as deployed) compiles with C1 only and collects
    # with the serial collector. A test's driver lives seconds to minutes on small data, where C2's compilations and
    # G1's threads cost more CPU than they save: about half the CPU time of a short Iceberg job here, on 2 cores shared
    # by two workers. What Spark computes is unchanged. They also start with ANSI SQL on, as Spark 4 and a cluster's
    # spark-defaults may: the runtime pins the semantics its expressions are written for (session.SQL_SEMANTICS), and
    # a session that lost the pin fails the suite (a mirror table's position: a long cast to binary, refused by ANSI).
    os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dspark.sql.ansi.enabled=true")
    # pytest-xdist's loadfile would hand out the modules with the most tests first (its default --loadscope-reorder):
    # the long modules, which have few tests, came last, and one worker ran them alone for many minutes. Collection
    # order instead, which pytest_collection_modifyitems starts with LONG_MODULES.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_finish(session) -> None:
    # Every test module is imported (pyspark, Pulumi, pyiceberg...): their objects live for the whole run. Frozen out
    # of the collector, the gc.collect() the infra tests run after each Pulumi program scans only what a test made
    # (a full collection scans some 100k objects: about half a second, many seconds on a loaded machine).
    gc.collect()
    gc.freeze()


# Each module's time in this run (its tests' set-up, call and tear-down summed; under xdist the controller gets every
# worker's reports), printed at the end, longest first: where the suite's time goes, and what LONG_MODULES should list.
MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    module = report.nodeid.split("::", 1)[0]
    MODULE_SECONDS[module] = MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    longest = sorted(MODULE_SECONDS.items(), key=lambda item: -item[1])[:25]
    if longest:
        terminalreporter.write_sep("=", f"slowest {len(longest)} modules (set-up, call and tear-down summed)")
        for module, seconds in longest:
            terminalreporter.write_line(f"{seconds:9.1f}s {module}")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if not uses & PROCESS_FIXTURES and not any(item.get_closest_marker(name) for name in ("process", "bundle")):
            item.add_marker(pytest.mark.unit)
    # The long modules first, longest first (a stable sort: every other module, and each module's tests, keep their
    # order). Every worker collects the same order, as xdist requires.
    rank = {module: i for i, module in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _spark_local_dirs(tmp_path_factory) -> None:
    """Spark's local files (a driver's copy of the jars, about 110 MB; shuffle and block files) under the run's
    base directory, not /tmp: a driver that is killed leaves them behind, and the crash tests kill dozens. Set before
    the session's Spark starts; the runs a test starts inherit it."""
    os.environ["SPARK_LOCAL_DIRS"] = str(tmp_path_factory.mktemp("spark-local"))


# What a worker's process tests hold on the disk of the temp root at a time, measured at about 4.5 GB for a full run
# of two workers (brokers' logs, Spark's local files, a deployed job's copies of the jars). On a fuller disk a broker
# stops answering and every later test fails with a timeout that hides why: said at once instead.
NEEDED_DISK_BYTES = 6 * 2**30


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    free = shutil.disk_usage(base).free
    if free < NEEDED_DISK_BYTES:
        pytest.fail(
            f"{free / 2**30:.1f} GiB free on the disk of {base}: the process tests need about "
            f"{NEEDED_DISK_BYTES / 2**30:.0f} GiB (brokers' logs, Spark's local files, jobs' copies of the jars); "
            "free some first",
            pytrace=False,
        )
    return tmp_path_factory.mktemp("icefloe-state")


@pytest.fixture(scope="session")
def _services(state_dir):
    """The broker and the registry, started side by side (their start-up times overlap) once per test session."""
    from icefloe_dev.demo import local_services

    with local_services(state_dir) as services:
        yield services


@pytest.fixture(scope="session")
def broker(_services):
    return _services[0]


@pytest.fixture(scope="session")
def registry(_services):
    return _services[1]


@pytest.fixture(scope="session")
def _local_spark(state_dir):
    from icefloe.session import spark_session

    # It maps the class-data-sharing archive if one is there; the runs the tests start write it (class_sharing).
    session = spark_session(CatalogSpec(), state_dir, write_class_archive=False)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def rest_catalog_server(state_dir):
    """Apache Iceberg's own REST catalog server (JDBC on SQLite, warehouse on local files), once per session."""
    from icefloe_dev.rest_catalog import RestCatalogServer

    with RestCatalogServer(state_dir / "rest-catalog") as server:
        yield server


def _catalog_session(local_spark, catalog: dict | CatalogSpec, state_dir: Path | None = None):
    """A session of the same local Spark whose `icefloe` catalog is `catalog` (a stack file's `icefloe:catalog`;
    `state_dir`: a local catalog's): catalogs are per session."""
    from icefloe.table.catalog import CATALOG, spark_catalog_conf
    from icefloe.table.local_catalog import release_read_lock

    session = local_spark.newSession()
    prefix = f"spark.sql.catalog.{CATALOG}"
    for key in [k for k, _ in session.sparkContext.getConf().getAll() if k.startswith(prefix + ".")]:
        session.conf.unset(key)  # the JDBC catalog's settings
    spec = CatalogSpec.model_validate(catalog)
    for key, value in spark_catalog_conf(spec, state_dir).items():
        if key.startswith(prefix):
            session.conf.set(key, value)
    if spec.type == "local":  # as a run's session does: else it holds the file's read lock for the worker's life
        release_read_lock(session)
    return session


@contextmanager
def _made_active(session, local_spark, aws: bool):
    """`session` the JVM's active and default session (Iceberg's actions and procedures use the active one), the
    worker's local session again after. `aws`: a Glue catalog on the moto server, whose credentials the JVM's AWS SDK
    takes as system properties (the JVM started before the moto server)."""
    jvm = session._jvm
    jvm_session = jvm.org.apache.spark.sql.SparkSession
    jvm_session.setActiveSession(session._jsparkSession)
    jvm_session.setDefaultSession(session._jsparkSession)
    if aws:
        from icefloe_dev.moto_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY

        jvm.java.lang.System.setProperty("aws.accessKeyId", ACCESS_KEY_ID)
        jvm.java.lang.System.setProperty("aws.secretAccessKey", SECRET_ACCESS_KEY)
    try:
        yield session
    finally:
        if aws:
            jvm.java.lang.System.clearProperty("aws.accessKeyId")
            jvm.java.lang.System.clearProperty("aws.secretAccessKey")
        jvm_session.setActiveSession(local_spark._jsparkSession)
        jvm_session.setDefaultSession(local_spark._jsparkSession)


@pytest.fixture(scope="session")
def _rest_spark(_local_spark, rest_catalog_server):
    return _catalog_session(_local_spark, rest_catalog_server.catalog())


@pytest.fixture(scope="session")
def glue_on_moto(moto_aws) -> dict:
    """A Glue catalog on the session's moto server, its warehouse in a bucket of its own: the `icefloe:catalog`
    block of `support.ANY_CATALOG`'s "glue"."""
    bucket = "icefloe-any-catalog"
    moto_aws.client("s3").create_bucket(Bucket=bucket)
    return {"type": "glue", "warehouse": f"s3://{bucket}/warehouse", "endpoints": moto_aws.catalog_endpoints()}


@pytest.fixture(scope="session")
def _glue_spark(_local_spark, glue_on_moto):
    return _catalog_session(_local_spark, glue_on_moto)


def catalog_kind(request) -> str:
    """The catalog a test runs against: "glue" or "rest" when parametrized so (`support.ANY_CATALOG`), else "local"."""
    callspec = getattr(request.node, "callspec", None)
    return callspec.params.get("catalog", "local") if callspec else "local"


def catalog_block(request) -> dict | None:
    """The test's `icefloe:catalog` block: None for the local default."""
    kind = catalog_kind(request)
    if kind == "rest":
        return request.getfixturevalue("rest_catalog_server").catalog()
    if kind == "glue":
        return request.getfixturevalue("glue_on_moto")
    return None


@pytest.fixture
def spark(request, _local_spark):
    """The local SparkSession; for a test parametrized with catalog "glue" or "rest", a session writing through that
    catalog, made the JVM's active and default session for the test (Iceberg's actions and procedures use the active
    one)."""
    kind = catalog_kind(request)
    if kind == "local":
        yield _local_spark
        return
    session = request.getfixturevalue(f"_{kind}_spark")
    with _made_active(session, _local_spark, aws=kind == "glue"):
        yield session


@pytest.fixture
def run_in_worker(_local_spark):
    """What `icefloe run --once --config PATH --state-dir DIR` runs (each table's batch, then its maintenance when
    due, its heartbeat: `runner._attempt`), in the worker's warm Spark, through the stack file's catalog. For a batch
    whose process is not what the test checks (e.g. one that only makes the table the test's runs then race on): a
    fresh run's cold JVM costs about 23 CPU-s, a batch in the warm one about 2. Returns the tables' results; fails
    where the command would exit non-zero (a table failed, or is waiting)."""
    from icefloe.operate.runner import Outcome, _attempt
    from icefloe.spec import load_config

    def run(config_path: Path, state_dir: Path) -> list:
        config = load_config(str(config_path))
        session = _catalog_session(_local_spark, config.catalog, state_dir)
        results: list = []
        with _made_active(session, _local_spark, aws=config.catalog.type == "glue"):
            for table in config.select(None):
                outcome, why, _ = _attempt(session, config, table, state_dir, results.append, metrics=False)
                assert outcome in (Outcome.OK, Outcome.YIELDED), f"{config.identifier(table)}: {why}"
        return results

    return run


@pytest.fixture
def catalog(request, monkeypatch) -> dict | None:
    """The test's `icefloe:catalog` block (None: the local default). With "glue" or "rest", `support.read_pyiceberg`
    and `support.read_duckdb` read from that catalog too, so a test's assertions read back from where it wrote; with
    "glue", a process the test starts (`icefloe run`) has the moto server's credentials in its environment."""
    kind = getattr(request, "param", "local")
    if kind == "local":
        return None
    import support

    block = catalog_block(request)
    if kind == "rest":
        server = request.getfixturevalue("rest_catalog_server")
        monkeypatch.setattr(support, "pyiceberg_catalog", lambda _state_dir: server.pyiceberg_catalog())
    else:
        from icefloe_dev.readers import duckdb_over_s3_copy

        moto = request.getfixturevalue("moto_aws")
        warehouse = block["warehouse"]
        bucket = warehouse.removeprefix("s3://").split("/")[0]
        monkeypatch.setattr(support, "pyiceberg_catalog", lambda _: moto.pyiceberg_catalog(warehouse=warehouse))
        # DuckDB has no S3 client here: it reads copies of the bucket's objects, taken when it is asked
        monkeypatch.setattr(support, "duckdb_connect", lambda: duckdb_over_s3_copy(moto.client("s3"), bucket))
        for key, value in moto.aws_env().items():
            monkeypatch.setenv(key, value)
    return block


@pytest.fixture
def topic(request, broker) -> str:
    """A fresh topic name per test (3 partitions), so tests share the broker without sharing data."""
    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())
    if len(name) > 80:  # cut, but kept apart from its siblings: parameters sit at the end of a test's name
        name = f"{name[:71]}_{zlib.crc32(name.encode()):08x}"
    return name


@pytest.fixture
def make_config(request, broker, registry):
    def build(*tables: dict, registry_url: str | None = None, bootstrap: str | None = None) -> IcefloeConfig:
        cluster = {
            "name": "local",
            "bootstrapServers": bootstrap or broker.bootstrap_servers,
            "schemaRegistry": {"url": registry_url or registry.url},
        }
        raw = {"sourceClusters": [cluster], "tables": [{"sourceCluster": "local", **t} for t in tables]}
        block = catalog_block(request)
        if block is not None:
            raw["catalog"] = block
        return parse_config(raw)

    return build


@pytest.fixture(scope="session")
def moto_aws(state_dir):
    """A moto server (Glue, S3, STS) that refuses stale Glue table versions as AWS does (icefloe_dev.moto_server)."""
    from icefloe_dev.moto_server import MotoServer

    with MotoServer(state_dir / "moto") as server:
        yield server


@pytest.fixture
def glue_registry(moto_aws, topic):
    """The name of a Glue schema registry of the test's own on the moto server, deleted after it: moto, like AWS by
    default, allows only 10 registries."""
    name, client = f"reg-{topic}"[:60], moto_aws.client("glue")
    client.create_registry(RegistryName=name)
    yield name
    client.delete_registry(RegistryId={"RegistryName": name})


@pytest.fixture(params=["jvm", "python"])
def read_path(request, monkeypatch) -> str:
    """Runs a test on both read paths of an Avro table: the Python path is forced by replacing the path choice; on
    the JVM path no record may need the Python decoder."""
    from icefloe.materialize import batch as materializer
    from icefloe.materialize.read_paths import _EXACT, PYTHON, JvmBatch, ReadPath

    if request.param == PYTHON:
        monkeypatch.setattr(
            materializer, "choose_read_path", lambda spark, decoder: ReadPath(PYTHON, "forced by the test")
        )
    else:
        kept = JvmBatch.kept

        def all_exact(self):
            assert self._decoded().where(f"NOT {_EXACT}").count() == 0, "a record needed the Python decoder"
            return kept(self)

        monkeypatch.setattr(JvmBatch, "kept", all_exact)
    return request.param


@pytest.fixture(scope="session")
def postgres(state_dir):
    """A private PostgreSQL cluster (wal_level=logical) for the change-data tests; each test module makes its own
    database in it."""
    from icefloe_dev.postgres import PostgresCluster

    with PostgresCluster(state_dir / "postgres") as cluster:
        yield cluster
