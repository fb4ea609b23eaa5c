"""The SparkSession's Py4J view of the JVM, typed for the layers that call Iceberg, Avro or Spark Java APIs."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


def jvm_gateway(spark: SparkSession) -> Any:
    """The session's Py4J view of the JVM (pyspark types it Optional: it is None only before a session starts)."""
    return spark._jvm
