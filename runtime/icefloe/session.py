"""The SparkSession a run uses: a local one with the pinned Maven jars, or the one EMR Serverless provides."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from py4j.java_gateway import java_import  # type: ignore[import-untyped]  # py4j ships no types

from icefloe import class_sharing
from icefloe.spec import CatalogSpec
from icefloe.table.catalog import spark_catalog_conf, spark_secret_conf
from icefloe.table.local_catalog import release_read_lock

SQLITE_JDBC_JAR = "/usr/share/java/sqlite-jdbc.jar"
# A continuous run issues thousands of small queries: keep Spark's UI and listener bookkeeping bounded.
BOUNDED_BOOKKEEPING = {
    "spark.sql.ui.retainedExecutions": "20",
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.ui.retainedTasks": "1000",
    "spark.ui.dagGraph.retainedRootRDDs": "20",
}
# The driver JVM's JIT in a process that runs its batches and exits (`spark_session(short_lived=True)`). In a fresh
# run of 1M Avro trades the C2 compiler thread took 4.1-4.9 of the JVM's 12.2-13.9 CPU-seconds, about as much as the
# tasks that read, decoded and wrote the batch. Inlining only callees of at most 100 bytecodes into hot methods (the
# JVM's default 325) gives C2 smaller methods to compile: 2.4-2.8 CPU-s, the tasks no slower; a 5M-trade batch still
# 0.95x the CPU (bench/results/jit_short_lived.md). A C2 option: JVMs running C1 alone (the tests') ignore it. A
# long-lived process (`--continuous`) keeps the JVM's defaults, where the steady state's code is what counts.
SHORT_LIVED_JIT = "-XX:FreqInlineSize=100"
SHORT_LIVED_JIT_ENV = "ICEFLOE_SHORT_LIVED_JIT"  # other options instead (empty: none)
# A batch kept on disk while the error mode and the writer read it (read_paths.KeptBatch, the Python path's read) is
# read back once or twice, right away: the columnar cache's encodings (dictionaries, run lengths), whose statistics
# cost 7-10% of an upsert batch's CPU (a JFR profile, bench/cdc.py), save nothing worth that.
BATCH_CACHE = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}
# Spark compiles each query's generated Java once per JVM and keeps the classes by their source, 100 by default. A
# batch compiles about that many (an upsert or change-data batch 90-100: projections, the sort, the window, the joins,
# the MERGE's), so in a long-lived process (`run --continuous`, several tables in one run) each batch evicted what the
# next needed and compiled it all again. Kept, a warm batch takes 0.65-0.85x the CPU (bench/results/cdc_codegen.md).
CODEGEN_CACHE = {"spark.sql.codegen.cache.maxEntries": "2000"}
# The SQL semantics the runtime's expressions are written and tested for. ANSI mode (Spark 4's default, a cluster's
# spark-defaults may set it) refuses some of them (a long cast to binary: `formats.debezium.jvm._u64`) and raises
# where they rely on null (a string cast to a number, an overflow): pinned off, a run computes what the tests prove.
SQL_SEMANTICS = {"spark.sql.ansi.enabled": "false"}

# Data source options Spark shows as *********(redacted) in plans and the UI: its default (URLs) and the Kafka
# source's inline TLS material (`source.spark_kafka.tls_options`); SASL's JAAS line holds `password`, which Spark's
# own pattern (spark.redaction.regex) already catches.
# Spark's default redaction plus `credential`: a REST catalog's OAuth2 client credentials (`...icefloe.credential`)
# are then masked wherever Spark shows its settings (UI, event logs, `spark.conf` dumps), as its token is.
REDACTION_REGEX = r"(?i)secret|password|token|access[.]key|credential"
REDACTED_OPTIONS = {
    "spark.sql.redaction.options.regex": r"(?i)url|ssl[.](truststore[.]certificates|keystore[.](key|certificate[.]chain))"
}


def jvm_lib() -> Path:
    """The directory `scripts/setup.sh` fills from jvm/pom.xml (override with ICEFLOE_JVM_LIB)."""
    configured = os.environ.get("ICEFLOE_JVM_LIB")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "jvm" / "lib"


def local_jars(msk_iam: bool = False) -> list[str]:
    """The pinned Spark-side jars from Maven (Iceberg runtime + AWS bundle, Kafka source, Avro), icefloe's own
    (jvm_gateway.ICEFLOE_JAR) and SQLite JDBC;
    aws-msk-iam-auth only with `msk_iam`, last, so Iceberg's own AWS SDK classes come first."""
    from icefloe.errors import ConfigError
    from icefloe.source.msk_iam import JAR_PREFIX

    spark_lib = jvm_lib() / "spark"
    found = sorted(str(p) for p in spark_lib.glob("*.jar"))
    msk = [jar for jar in found if Path(jar).name.startswith(JAR_PREFIX)]
    jars = [jar for jar in found if jar not in msk] + (msk if msk_iam else [])
    if msk_iam and not msk:
        raise ConfigError(f"MSK IAM needs the aws-msk-iam-auth jar in {spark_lib}: run scripts/setup.sh")
    if not any("iceberg-spark-runtime" in jar for jar in jars):
        raise ConfigError(f"local mode needs the JVM jars in {spark_lib}: run scripts/setup.sh")
    if not Path(SQLITE_JDBC_JAR).exists():
        raise ConfigError(
            f"local mode needs {SQLITE_JDBC_JAR} (Debian libxerial-sqlite-jdbc-java): run scripts/setup.sh"
        )
    return [*jars, SQLITE_JDBC_JAR]


def off_aws(catalog: CatalogSpec) -> bool:
    """A catalog that can only be reached from this machine: a Glue catalog with endpoint overrides, a REST catalog
    on loopback (a local REST server)."""
    from urllib.parse import urlsplit

    loopback = catalog.type == "rest" and urlsplit(catalog.uri or "").hostname in ("127.0.0.1", "localhost", "::1")
    return catalog.endpoints is not None or loopback


def spark_session(
    catalog: CatalogSpec,
    state_dir: Path,
    msk_iam: bool = False,
    write_class_archive: bool = True,
    short_lived: bool = False,
):
    """A local session (2 cores here) for a local catalog or a Glue catalog off AWS; else the cluster's session.
    `msk_iam`: a source cluster uses MSK IAM, so a local session loads the aws-msk-iam-auth jar.
    `write_class_archive`: with no class-data-sharing archive yet, this JVM writes one as it exits (class_sharing);
    False for a session that lives long and ends late (the tests' own), where that would only delay its end.
    `short_lived`: the process runs its batches and exits (`run --once`, a scheduled job): a local driver JVM gets
    `SHORT_LIVED_JIT` (or `$ICEFLOE_SHORT_LIVED_JIT`)."""
    from pyspark.sql import SparkSession

    conf = (
        spark_catalog_conf(catalog, state_dir)
        | spark_secret_conf(catalog)
        | BOUNDED_BOOKKEEPING
        | BATCH_CACHE
        | CODEGEN_CACHE
        | SQL_SEMANTICS
        | REDACTED_OPTIONS
        | {"spark.redaction.regex": REDACTION_REGEX}
    )
    # A Glue catalog runs on a local master too when it is off AWS: endpoint overrides (a moto server), a REST
    # catalog on loopback, or ICEFLOE_SPARK_MASTER set. On EMR Serverless none is and the cluster's session is used.
    if catalog.type == "local" or off_aws(catalog) or os.environ.get("ICEFLOE_SPARK_MASTER"):
        # Executors must run this interpreter, which has icefloe's dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, no DNS lookup of the host name
        master = os.environ.get("ICEFLOE_SPARK_MASTER", "local[*]")
        builder = SparkSession.builder.master(master).appName("icefloe")
        jars = local_jars(msk_iam)
        if master.startswith("local"):
            # Driver and executor are one JVM: the jars go on its class path. Given as `spark.jars`, the executor
            # fetched a copy of each (121 MiB) from the driver's file server into its local directory at its first
            # task, in every fresh run (bench/results/cold_start_small.md).
            conf["spark.driver.extraClassPath"] = ":".join(jars)
            archive = class_sharing.archive_path(jvm_lib().parent / "cds", jars)
            # The JVM's own messages (a flight recording's start among them) off --json's stdout, archive or not.
            conf["spark.driver.extraJavaOptions"] = class_sharing.JVM_LOG_TO_STDERR
            if archive is not None:
                conf |= class_sharing.driver_settings(archive, jars, write_class_archive)
            if short_lived:  # after SPARK_SUBMIT_OPTS on the JVM's command line: set apart to change it
                conf["spark.driver.extraJavaOptions"] += " " + os.environ.get(SHORT_LIVED_JIT_ENV, SHORT_LIVED_JIT)
        else:
            conf["spark.jars"] = ",".join(jars)
        conf |= {
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.ui.enabled": "false",
            # No console progress bar: a thread redrawing it on stderr every 200 ms, between the run's log lines
            # (`materialize.progress` logs the batch's progress).
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            # Driver and executor are one JVM here. With 2 GiB, G1's concurrent marking ran almost throughout a
            # batch (1.3 of a nested batch's 7.3 CPU-s, taken from the tasks' two cores); with 4 GiB (2 per core;
            # EMR's executors get 4 per core by default) it did not run: 15% less CPU (bench/throughput.py).
            "spark.driver.memory": os.environ.get("ICEFLOE_DRIVER_MEMORY", "4g"),
            "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
        }
    else:
        builder = SparkSession.builder.appName("icefloe")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # Each `pyspark.sql.functions` call finds the JVM's `functions` by its bare name through py4j's imports: five
    # wildcard packages before org.apache.spark.sql, each a failed class lookup through every jar on the class path
    # (261 here): 1.2 ms of JVM CPU a call, and a batch's expressions make hundreds. A single-type import is tried
    # before the wildcards: 0.3 ms (docs/benchmarks.md).
    java_import(spark.sparkContext._jvm, "org.apache.spark.sql.functions")
    if catalog.type == "local":
        release_read_lock(spark)
    return spark
