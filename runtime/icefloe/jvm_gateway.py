"""The SparkSession's Py4J view of the JVM, typed for the layers that call Iceberg, Avro or Spark Java APIs, and
icefloe's own jar on that JVM."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

# icefloe's own JVM functions (jvm/src: the Protobuf decoder of the JVM read path), compiled by scripts/setup.sh
# against the installed Spark into jvm/lib/spark/, beside the pinned jars; every job ships it (icefloe_infra.jars).
ICEFLOE_JAR = "icefloe-jvm.jar"


def jvm_gateway(spark: SparkSession) -> Any:
    """The session's Py4J view of the JVM (pyspark types it Optional: it is None only before a session starts)."""
    return spark._jvm
