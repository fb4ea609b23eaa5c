"""The SparkSession a run uses: a local one with the bundled Iceberg jar, or the one EMR Serverless provides."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .catalog import spark_catalog_conf
from .spec import CatalogSpec

SQLITE_JDBC_JAR = "/usr/share/java/sqlite-jdbc.jar"
# A continuous run issues thousands of small queries: keep Spark's UI and listener bookkeeping bounded.
BOUNDED_BOOKKEEPING = {
    "spark.sql.ui.retainedExecutions": "20",
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.ui.retainedTasks": "1000",
    "spark.ui.dagGraph.retainedRootRDDs": "20",
}


def local_jars() -> list[str]:
    """The Iceberg Spark runtime (from the snowpark-connect-deps-iceberg wheel) and the SQLite JDBC driver."""
    from .errors import ConfigError

    try:
        import snowpark_connect_deps_iceberg
    except ImportError:
        raise ConfigError("local mode needs the 'local' extra: pip install 'icefloe[local]'") from None
    iceberg = Path(snowpark_connect_deps_iceberg.get_jars_dir()) / "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
    missing = [str(p) for p in (iceberg, Path(SQLITE_JDBC_JAR)) if not p.exists()]
    if missing:
        raise ConfigError(f"local mode jars missing: {missing} (run scripts/setup.sh)")
    return [str(iceberg), SQLITE_JDBC_JAR]


def spark_session(catalog: CatalogSpec, state_dir: Path):
    """A local session (2 cores here) for a local catalog; otherwise the cluster's session, configured for Glue."""
    from pyspark.sql import SparkSession

    conf = spark_catalog_conf(catalog, state_dir) | BOUNDED_BOOKKEEPING
    if catalog.type == "local":
        # Executors must run this interpreter, which has icefloe's dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(os.environ.get("ICEFLOE_SPARK_MASTER", "local[*]")).appName("icefloe")
        conf |= {
            "spark.jars": ",".join(local_jars()),
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.memory": os.environ.get("ICEFLOE_DRIVER_MEMORY", "2g"),
            "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
        }
    else:
        builder = SparkSession.builder.appName("icefloe")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
