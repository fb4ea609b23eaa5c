"""Upsert mode: the newest record per key wins, a tombstone deletes its key's row.

The batch is reduced to one change per key and merged with `MERGE INTO` on the run's branch (merge-on-read: position deletes, cheap to write, folded away by
compaction). The commit protocol then puts the offsets on the same branch (an empty append carrying them), so the
fast-forward publishes the merge and the offsets together.

Which change of a key is the newest: Kafka orders records only within a partition, and a key's records may span
partitions (`key:` value fields, or partitions added to the topic). So the record timestamp decides, then the
partition, then the offset (within one partition offsets are Kafka's order).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .batch_columns import TOMBSTONE
from .commit import Branch
from .errors import ConfigError


def key_columns(key: tuple[str, ...] | None, value_fields: list[T.StructField], where: str) -> list[str]:
    """The columns an upsert matches rows on: the `key:` value fields, else the raw Kafka key. A key field the
    value schema lacks (a registry schema is only known at run time) is a config error."""
    if not key:
        return ["kafka_key"]
    names = [f.name for f in value_fields]
    missing = [name for name in key if name not in names]
    if missing:
        raise ConfigError(f"{where}: key names field(s) {missing} that the value schema does not have (fields: {names})")
    return list(key)


def merge_batch(frame: DataFrame, branch: Branch, struct: T.StructType, key_columns: list[str]) -> int:
    """Merge one batch into the run's branch; returns the number of changes applied (upserts + deletes)."""
    spark = branch.spark
    columns = [f.name for f in struct.fields]
    newest_first = Window.partitionBy(*key_columns).orderBy(
        F.col("kafka_timestamp").desc(), F.col("kafka_partition").desc(), F.col("kafka_offset").desc()
    )
    changes = (
        frame.withColumn("icefloe_rank", F.row_number().over(newest_first))
        .where("icefloe_rank = 1")
        .select(*columns, TOMBSTONE)
    )
    view = f"icefloe_changes_{branch.name}"
    changes.createOrReplaceTempView(view)
    matches = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key_columns)
    updates = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
    names = ", ".join(f"`{c}`" for c in columns)
    values = ", ".join(f"s.`{c}`" for c in columns)
    spark.sql(
        f"MERGE INTO {branch.identifier} t USING {view} s ON {matches} "
        f"WHEN MATCHED AND s.{TOMBSTONE} THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {updates} "
        f"WHEN NOT MATCHED AND NOT s.{TOMBSTONE} THEN INSERT ({names}) VALUES ({values})"
    )
    branch.wrote()
    applied = changes.count()
    spark.catalog.dropTempView(view)
    return applied
