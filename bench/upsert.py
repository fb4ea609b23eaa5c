"""Upsert benchmark: merge cost as the table grows tenfold, and read cost after many upserts vs. append-only.

(1) Merge: a fixed batch of changes (updates, inserts, deletes) merged with icefloe's own merge (`merge_batch` on
    a run branch, merge-on-read) into tables of N and 10N keys.
(2) Reads: after B upsert batches, a full scan + aggregate with DuckDB and with pyiceberg, against an append-only
    table holding the same final rows, and again after `maintain` (compaction folds the delete files away).
(3) The cost of the upsert order (review F2): the same batch merged into the same table (a) as before it, ranked by
    timestamp and merged unconditionally (`merge_before`, the code of 552f38b), (b) as now: each change's clock
    (`upsert.positioned`, a second aggregation and a window over the batch), the conditional MERGE and the delete
    markers' commit to `<table>_deletes`, (c) as now with no deletes in the batch (no markers commit).
    `--cost-only` runs this part alone.
Tables are built with Spark directly (the Kafka path is measured by bench/throughput.py).
Results: bench/results/upsert.{json,md}. Run: `.venv/bin/python bench/upsert.py [--keys 1000000 --changes 100000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icefloe.commit.branch import commit_on_branch
from icefloe.commit.checkpoint import Checkpoint
from icefloe.formats.columns import METADATA_FIELDS, table_struct
from icefloe.materialize.upsert import merge_batch, positioned
from icefloe.operate.maintenance import maintain
from icefloe.session import spark_session
from icefloe.spec import CatalogSpec, TableSpec
from icefloe.table.iceberg import IcebergTable
from icefloe.table.refs import new_run_id
from icefloe_dev.readers import duckdb_connect, pyiceberg_catalog

RESULTS = Path(__file__).parent / "results"
VALUE_FIELDS = [T.StructField("account", T.StringType()), T.StructField("balance", T.LongType()),
                T.StructField("note", T.StringType())]  # fmt: skip
STRUCT = table_struct(VALUE_FIELDS, True)  # an upsert table: with each row's clock


def rows(spark, first: int, count: int, seed: int, tombstone_every: int = 0):
    """Rows shaped like icefloe's (value fields + Kafka metadata); key = kafka_key = account bytes."""
    frame = spark.range(first, first + count).select(
        F.concat(F.lit("acct-"), F.col("id").cast("string")).alias("account"),
        (F.col("id") * 7 + seed).alias("balance"),
        F.lit("some reasonably sized note about this account").alias("note"),
        F.lit("bench").alias("kafka_topic"),
        (F.col("id") % 4).cast("int").alias("kafka_partition"),
        (F.col("id") + seed * 10_000_000).alias("kafka_offset"),
        F.current_timestamp().alias("kafka_timestamp"),
        F.lit("CreateTime").alias("kafka_timestamp_type"),
        F.encode(F.concat(F.lit("acct-"), F.col("id").cast("string")), "utf-8").alias("kafka_key"),
        F.lit(None).cast(METADATA_FIELDS[-1].dataType).alias("kafka_headers"),
    )
    tombstone = (F.col("balance") % tombstone_every == 0) if tombstone_every else F.lit(False)
    return frame.withColumn("kafka_clock", F.col("kafka_timestamp")).withColumn("icefloe_tombstone", tombstone)


def create(spark, identifier: str) -> IcebergTable:
    table = IcebergTable(spark, identifier)
    spark.sql(f"DROP TABLE IF EXISTS {table.full_name} PURGE")
    table.ensure(STRUCT, (), 128, Checkpoint("bench").to_summary())
    return table


def upsert(spark, table: IcebergTable, changes, batch: int) -> float:
    """As a batch is upserted now: each change's clock (`positioned`), the merge, the delete markers' commit."""
    checkpoint = Checkpoint("bench", {0: batch}, new_run_id())
    started = time.monotonic()
    clocked, clocks = positioned(changes, {})
    commit_on_branch(table, table.main_snapshot_id(), Checkpoint("bench", {0: batch}, checkpoint.run_id, clocks=clocks),
                     lambda branch: merge_batch(clocked, branch, STRUCT, ["kafka_key"], 3600.0))  # fmt: skip
    return time.monotonic() - started


def merge_before(frame, branch, struct, key_columns: list[str]) -> int:
    """The upsert merge before the F2 order (552f38b): newest Kafka timestamp first, applied unconditionally."""
    spark = branch.spark
    columns = [f.name for f in struct.fields if f.name != "kafka_clock"]
    newest_first = Window.partitionBy(*key_columns).orderBy(
        F.col("kafka_timestamp").desc(), F.col("kafka_partition").desc(), F.col("kafka_offset").desc()
    )
    changes = (
        frame.withColumn("icefloe_rank", F.row_number().over(newest_first))
        .where("icefloe_rank = 1")
        .select(*columns, "icefloe_tombstone")
    )
    view = f"icefloe_changes_{branch.name}"
    changes.createOrReplaceTempView(view)
    matches = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key_columns)
    updates = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
    names = ", ".join(f"`{c}`" for c in columns)
    values = ", ".join(f"s.`{c}`" for c in columns)
    spark.sql(
        f"MERGE INTO {branch.identifier} t USING {view} s ON {matches} "
        "WHEN MATCHED AND s.icefloe_tombstone THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {updates} "
        f"WHEN NOT MATCHED AND NOT s.icefloe_tombstone THEN INSERT ({names}) VALUES ({values})"
    )
    branch.wrote()
    applied = changes.count()
    spark.catalog.dropTempView(view)
    return applied


def order_cost(spark, keys: int, changes_count: int, repeats: int) -> dict:
    """(3): seconds to merge one batch before the F2 order and now, with and without deletes (best of `repeats`)."""
    found: dict[str, list[float]] = {"before": [], "now": [], "now_without_deletes": []}
    for attempt in range(repeats):
        for variant in found:
            table = create(spark, f"bench.order_{variant}")
            spark.sql(f"DROP TABLE IF EXISTS {table.full_name}_deletes PURGE")
            rows(spark, 0, keys, seed=1).drop("icefloe_tombstone").writeTo(table.full_name).append()
            every = 0 if variant == "now_without_deletes" else 20
            changes = rows(spark, keys - changes_count // 2, changes_count, seed=2 + attempt, tombstone_every=every)
            changes = changes.persist()
            changes.count()
            if variant == "before":
                started = time.monotonic()
                commit_on_branch(table, table.main_snapshot_id(), Checkpoint("bench", {0: 1}, new_run_id()),
                                 lambda branch, batch=changes: merge_before(batch, branch, STRUCT, ["kafka_key"]))  # fmt: skip
                found[variant].append(time.monotonic() - started)
            else:
                found[variant].append(upsert(spark, table, changes, 1))
            changes.unpersist()
    best = {variant: round(min(seconds), 2) for variant, seconds in found.items()}
    return {"keys": keys, "changes": changes_count, "repeats": repeats, "seconds": found, "best_s": best,
            "now_vs_before": round(best["now"] / best["before"], 2),
            "markers_commit_s": round(best["now"] - best["now_without_deletes"], 2)}  # fmt: skip


def read_cost(spark, state: Path, table: IcebergTable) -> dict:
    query = "SELECT count(*), sum(balance), count(DISTINCT account) FROM {scan}"
    started = time.monotonic()
    duck = duckdb_connect().execute(query.format(scan=f"iceberg_scan('{table.metadata_location()}')")).fetchone()
    duck_s = time.monotonic() - started
    started = time.monotonic()
    arrow = pyiceberg_catalog(state).load_table(table.identifier).scan(selected_fields=("account", "balance")).to_arrow()
    pyiceberg_s = time.monotonic() - started
    files = spark.sql(f"SELECT content, count(*) AS n FROM {table.full_name}.files GROUP BY content").collect()
    return {"duckdb_s": round(duck_s, 3), "pyiceberg_s": round(pyiceberg_s, 3), "rows": int(duck[0]),
            "pyiceberg_rows": arrow.num_rows, "files": {str(r.content): r.n for r in files}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="N: the small table; the large one has 10N")
    parser.add_argument("--changes", type=int, default=100_000, help="the fixed batch merged into each")
    parser.add_argument("--batches", type=int, default=10, help="upsert batches before the read comparison")
    parser.add_argument("--cost-only", action="store_true", help="only (3), the cost of the upsert order")
    parser.add_argument("--repeats", type=int, default=2, help="(3): merges per variant (the best counts)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefloe-upsert-"))
    spark = spark_session(CatalogSpec(), work)
    if args.cost_only:
        try:
            cost = order_cost(spark, args.keys, args.changes, args.repeats)
        finally:
            spark.stop()
            shutil.rmtree(work, ignore_errors=True)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "upsert_order_cost.json").write_text(json.dumps(cost, indent=2) + "\n")
        (RESULTS / "upsert_order_cost.md").write_text(render_cost(cost, os.cpu_count()))
        print(render_cost(cost, os.cpu_count()))
        return
    report: dict = {"keys": args.keys, "changes": args.changes, "batches": args.batches, "cores": os.cpu_count()}
    try:
        merges = []
        for size in (args.keys, 10 * args.keys):
            table = create(spark, f"bench.upsert_{size}")
            rows(spark, 0, size, seed=1).drop("icefloe_tombstone").writeTo(table.full_name).append()
            # Half the changes update existing keys, half insert new ones, 5% of them are deletes.
            changes = rows(spark, size - args.changes // 2, args.changes, seed=2, tombstone_every=20).persist()
            changes.count()
            seconds = upsert(spark, table, changes, 1)
            changes.unpersist()
            merges.append({"table_keys": size, "changes": args.changes, "merge_s": round(seconds, 2),
                           "changes_per_s": round(args.changes / seconds)})  # fmt: skip
        report["merge"] = merges
        report["merge_growth"] = round(merges[1]["merge_s"] / merges[0]["merge_s"], 2)

        upserted = create(spark, "bench.after_upserts")
        rows(spark, 0, args.keys, seed=0).drop("icefloe_tombstone").writeTo(upserted.full_name).append()
        per_batch = args.changes
        for batch in range(1, args.batches + 1):
            changes = rows(spark, (batch * per_batch) % args.keys, per_batch, seed=batch, tombstone_every=50).persist()
            upsert(spark, upserted, changes, batch)
            changes.unpersist()
        final = spark.table(upserted.full_name)
        appended = create(spark, "bench.append_only")
        final.writeTo(appended.full_name).append()
        report["reads"] = {
            "after_upserts": read_cost(spark, work, upserted),
            "append_only_same_rows": read_cost(spark, work, appended),
        }
        maintain(upserted, TableSpec(source_cluster="bench", topic="bench", maintenance={"snapshotRetention": "1s",
                                                                                         "orphanFileAge": "1d"}))  # fmt: skip
        report["reads"]["after_upserts_and_maintenance"] = read_cost(spark, work, upserted)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "upsert.json").write_text(json.dumps(report, indent=2) + "\n")
    reads = report["reads"]
    lines = [
        "# Upsert benchmark",
        "",
        f"Merge of a fixed batch of {args.changes:,} changes (50% updates, 50% inserts, 5% deletes), merge-on-read, "
        f"{report['cores']} cores:",
        "",
        "| table keys | merge s | changes/s |",
        "|---:|---:|---:|",
        *[f"| {m['table_keys']:,} | {m['merge_s']} | {m['changes_per_s']:,} |" for m in report["merge"]],
        "",
        f"Table 10x larger -> merge time x{report['merge_growth']}.",
        "",
        f"Reads after {args.batches} upsert batches of {args.changes:,} changes on {args.keys:,} keys (full scan + aggregate):",
        "",
        "| table | rows | data/delete files | DuckDB s | pyiceberg s |",
        "|---|---:|---|---:|---:|",
        *[f"| {name} | {r['rows']:,} | {r['files']} | {r['duckdb_s']} | {r['pyiceberg_s']} |" for name, r in reads.items()],
    ]  # fmt: skip
    (RESULTS / "upsert.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))



def render_cost(cost: dict, cores: int | None) -> str:
    best = cost["best_s"]
    return "\n".join([
        "# Upsert: the cost of the change order (review F2)",
        "",
        f"One batch of {cost['changes']:,} changes (half updates, half inserts; 5% deletes unless said) merged into a "
        f"table of {cost['keys']:,} keys, merge-on-read, on a run branch and published, {cores} cores shared with "
        f"other work; best of {cost['repeats']} (`bench/upsert.py --cost-only`).",
        "",
        "| variant | seconds |",
        "|---|---:|",
        f"| before F2 (timestamp order, unconditional MERGE) | {best['before']} |",
        f"| now (clock per change, conditional MERGE, delete markers committed) | {best['now']} |",
        f"| now, no deletes in the batch (no markers commit) | {best['now_without_deletes']} |",
        "",
        f"Now / before: x{cost['now_vs_before']}; the delete markers' commit: ~{cost['markers_commit_s']} s "
        "(now minus now without deletes; the batches differ only in their deletes).",
        "",
    ])


if __name__ == "__main__":
    main()
