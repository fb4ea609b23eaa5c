"""Upsert mode: the newest record per key wins, a tombstone deletes its key's row.

The batch is reduced to one change per key (highest offset; within one partition offsets are Kafka's order) and
merged with `MERGE INTO` on the run's branch (merge-on-read: position deletes, cheap to write, folded away by
compaction). The offsets then ride on an empty append on the same branch, so the fast-forward publishes the merge
and the offsets together.
"""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from .iceberg_table import append_with_properties


def merge_batch(spark, frame, target: str, struct, key_columns: list[str], properties: dict[str, str]) -> int:
    """Merge one batch into `target` (a branch); returns the number of changes applied (upserts + deletes)."""
    columns = [f.name for f in struct.fields]
    newest_first = Window.partitionBy(*key_columns).orderBy(F.col("kafka_partition").desc(), F.col("kafka_offset").desc())
    changes = (
        frame.withColumn("icefloe_rank", F.row_number().over(newest_first))
        .where("icefloe_rank = 1")
        .select(*columns, "icefloe_tombstone")
    )
    view = f"icefloe_changes_{properties['icefloe.run-id']}"
    changes.createOrReplaceTempView(view)
    matches = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key_columns)
    updates = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
    names = ", ".join(f"`{c}`" for c in columns)
    values = ", ".join(f"s.`{c}`" for c in columns)
    spark.sql(
        f"MERGE INTO {target} t USING {view} s ON {matches} "
        "WHEN MATCHED AND s.icefloe_tombstone THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {updates} "
        f"WHEN NOT MATCHED AND NOT s.icefloe_tombstone THEN INSERT ({names}) VALUES ({values})"
    )
    applied = changes.count()
    spark.catalog.dropTempView(view)
    append_with_properties(spark.createDataFrame([], struct), target, properties)
    return applied
