"""Upsert benchmark: a batch of changes as the materializer takes it, beside an append table taking the same records.

(1) Throughput (the default): a table of N keys (default 1,000,000) in upsert mode on the Kafka key; each round a
    batch of C changes (default 200,000: 80% updates of existing keys, 10% new keys, 10% tombstones) goes to its
    topic (Avro, Confluent framing, a local Apache Kafka broker and Apicurio registry, 4 partitions), and the same C
    records to a second topic read by an append table. Each batch runs as a scheduled job does: a fresh process
    (`--job`: a new Python driver and Spark JVM, `run_table`), Spark's start timed apart. Rounds alternate the two
    tables, so load from other users hits both alike; medians are reported, with changes/s, changes/s per core, the
    Spark JVM's CPU seconds and the ratio upsert/append of the same run. The table's N base rows are written by Spark
    directly under icefloe's first checkpoint (a Kafka topic of 10M records would take longer to produce than to
    measure), with positions older than every change. `--large` adds the same batch into a table of 10N keys.
(2) Reads (`--reads`): after B upsert batches, a full scan + aggregate with DuckDB and with pyiceberg, against an
    append-only table holding the same final rows, and again after `maintain`.
(3) The cost of the upsert order (review F2, `--cost-only`): the same batch merged (a) as before it, ranked by
    timestamp and merged unconditionally (`merge_before`, the code of 552f38b), (b) as now, (c) as now with no
    deletes in the batch (no markers commit).
(4) Memory (`--memory`): one batch of M changes (default 1M, 2.5M and 5M, each into a table of N keys of its
    own; 80% updates of existing keys, 10% new keys, 10% tombstones, keys drawn with repeats), each in a fresh
    process with the local default heap (no ICEFLOE_DRIVER_MEMORY; `--memory-heap`: another), sampled every
    MEMORY_SAMPLE_S: the JVM's heap in use and its old generation after each collection (what stays live), the
    resident memory of the JVM and of the Python driver. The table's rows after the batch are checked against the
    keys the changes leave.
Results: bench/results/upsert.{json,md} (and upsert_order_cost.*, upsert_memory.*). Run: `.venv/bin/python bench/upsert.py`.
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
from icefloe.commit.checkpoint import Checkpoint, committed_state
from icefloe.formats.columns import METADATA_FIELDS, table_struct
from icefloe.materialize.upsert import merge_batch, positioned
from icefloe.operate.maintenance import maintain
from icefloe.session import spark_session
from icefloe.spec import CatalogSpec, TableSpec
from icefloe.table.iceberg import IcebergTable, format_properties
from icefloe.table.refs import new_run_id
from icefloe_dev.producer import produce_avro_quickly
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


def create(spark, identifier: str, format_version: int = 2) -> IcebergTable:
    table = IcebergTable(spark, identifier)
    spark.sql(f"DROP TABLE IF EXISTS {table.full_name} PURGE")
    spark.sql(f"DROP TABLE IF EXISTS {table.full_name}_deletes PURGE")
    properties = format_properties(format_version)
    table.ensure(STRUCT, (), 128, Checkpoint("bench").to_summary(), properties)
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


PARTITIONS = 4
ACCOUNT = {"type": "record", "name": "Account", "namespace": "bench", "fields": [
    {"name": "account", "type": "string"}, {"name": "balance", "type": "long"}, {"name": "currency", "type": "string"},
    {"name": "updated_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": "string"}]}  # fmt: skip
NOTE = "standing order 42; branch 0815; overdraft limit reviewed; statements monthly by post and email. " * 2
BASE_CLOCK_MS = 1_577_836_800_000  # 2020-01-01: the base rows' positions, older than every change


def account_key(index: int) -> bytes:
    return f"acct-{index:09d}".encode()


def change_batch(keys: int, changes: int, round_: int, seed: int = 17) -> list[tuple[bytes, dict | None]]:
    """80% updates of existing keys, 10% new keys (after those of earlier rounds), 10% tombstones of existing keys;
    shuffled, each key once."""
    import random

    rng = random.Random(seed + round_)
    new = changes // 10
    existing = rng.sample(range(keys), changes - new)
    deleted = set(existing[: changes // 10])
    now_ms = int(time.time() * 1000)
    batch: list[tuple[bytes, dict | None]] = []
    for index in [*existing, *range(keys + round_ * new, keys + (round_ + 1) * new)]:
        value = None if index in deleted else {
            "account": f"acct-{index:09d}", "balance": rng.randint(0, 10**9), "currency": rng.choice(["EUR", "USD"]),
            "updated_at": now_ms, "note": NOTE[: 120 + index % 60]}  # fmt: skip
        batch.append((account_key(index), value))
    rng.shuffle(batch)
    return batch


def produce(bootstrap: str, registry_url: str, topic: str, records) -> int:
    """Key and value bytes of `records` produced to `topic` (ACCOUNT values, None: a tombstone)."""
    return produce_avro_quickly(bootstrap, registry_url, topic, ACCOUNT, records)[1]


def job_config(bootstrap: str, registry_url: str, tables: list[dict]) -> dict:
    return {"sourceClusters": [{"name": "bench", "bootstrapServers": bootstrap, "schemaRegistry": {"url": registry_url}}],
            "tables": [{"sourceCluster": "bench", "format": "avro", **t} for t in tables]}  # fmt: skip


def run_job(
    state: Path,
    config: dict,
    table: str,
    base_keys: int = 0,
    profile: bool = False,
    runtime: Path | None = None,
    memory: bool = False,
    heap: str | None = None,
    java_options: str | None = None,
) -> dict:
    """One batch of `table` in a fresh process (a new driver and Spark JVM, as a scheduled job); `base_keys`: write
    that many base rows under the table's first checkpoint after the batch (`write_base`); `runtime`: run icefloe
    from that directory (another version's `runtime/`) instead of this checkout's; `memory`: with the local default
    heap (`heap`: that heap instead), its memory sampled (`MemorySampler`); `java_options`: the driver JVM's
    options (`SPARK_SUBMIT_OPTS`) instead of the environment's."""
    import subprocess
    import sys

    env = dict(os.environ)
    if runtime is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(runtime), *env.get("PYTHONPATH", "").split(os.pathsep)])
    if java_options is not None:
        env["SPARK_SUBMIT_OPTS"] = java_options
    if memory:
        env.pop("ICEFLOE_DRIVER_MEMORY", None)
        if heap:
            env["ICEFLOE_DRIVER_MEMORY"] = heap
    job = {"state": str(state), "config": config, "table": table, "base_keys": base_keys, "profile": profile,
           "memory": memory}  # fmt: skip
    done = subprocess.run([sys.executable, __file__, "--job", json.dumps(job)], capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"job for {table} failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(lines[-1])


def job(spec: dict) -> None:
    """The `--job` process: Spark's start, then one `run_table` timed with the JVM's CPU seconds."""
    from process_stats import cpu_seconds

    from icefloe.operate.runner import run_table
    from icefloe.spec import parse_config

    jvm: list[int] = []  # the Spark JVM's pid, once started: the profile's CPU seconds per step
    timings, cpu_timings = profile_hooks(jvm) if spec.get("profile") else (None, None)
    config = parse_config(spec["config"])
    table = next(t for t in config.tables if config.identifier(t).endswith(spec["table"]))
    started = time.monotonic()
    spark = spark_session(config.catalog, Path(spec["state"]), short_lived=True)  # as `run --once`
    spark_start_s = time.monotonic() - started
    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    jvm.append(jvm_pid)
    identifier = config.identifier(table)
    versions = catalog_versions(spark, identifier)
    existing = IcebergTable(spark, identifier)
    before = committed_state(existing, table.topic).offsets if existing.exists() else {}
    memory = MemorySampler(spark, jvm_pid) if spec.get("memory") else None
    cpu, load = cpu_seconds(jvm_pid), os.getloadavg()[0]
    started = time.monotonic()
    result = run_table(spark, config, table, Path(spec["state"]))
    seconds = time.monotonic() - started
    found = {"seconds": round(seconds, 2), "spark_start_s": round(spark_start_s, 1), "rows": result.rows_written,
             "spark_cpu_s": round(cpu_seconds(jvm_pid) - cpu, 1), "load_1m": round(max(load, os.getloadavg()[0]), 1),
             "read_path": result.read_path,
             "records_read": sum(result.offsets.values()) - sum(before.values()),
             "max_heap_mib": round(spark._jvm.java.lang.Runtime.getRuntime().maxMemory() / MIB)}  # fmt: skip
    if memory is not None:
        found["memory"] = memory.stop()
        found["table_rows"] = spark.table(f"icefloe.{identifier}").count()
    after = catalog_versions(spark, identifier)
    found["catalog_commits"] = {name: after[name] - versions.get(name, 0) for name in after}
    if timings is not None and cpu_timings is not None:
        found["profile_s"] = {name: round(t, 2) for name, t in timings.items()}
        found["profile_cpu_s"] = {name: round(t, 2) for name, t in cpu_timings.items()}
    if spec["base_keys"]:
        write_base(spark, config.identifier(table), spec["base_keys"])
    spark.stop()
    print(json.dumps(found), flush=True)


MEMORY_SAMPLE_S = 0.5
MIB = 2**20


class MemorySampler:
    """The Spark JVM's memory every MEMORY_SAMPLE_S while a batch runs (a thread of the driver, through py4j): heap in
    use, the old generation as the last collection left it (what stays live), the JVM's resident memory."""

    def __init__(self, spark, jvm_pid: int):
        import threading

        from process_stats import status_kib

        management = spark._jvm.java.lang.management.ManagementFactory
        self.heap, self.pools = management.getMemoryMXBean(), list(management.getMemoryPoolMXBeans())
        self.old = next(p for p in self.pools if "Old Gen" in p.getName())
        self.max_heap = spark._jvm.java.lang.Runtime.getRuntime().maxMemory()
        self.jvm_pid, self.status_kib = jvm_pid, status_kib
        self.peaks = {"heap_used": 0, "old_gen_after_gc": 0, "jvm_rss_kib": 0}
        self.samples = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        after_gc = self.old.getCollectionUsage()
        found = {"heap_used": self.heap.getHeapMemoryUsage().getUsed(),
                 "old_gen_after_gc": after_gc.getUsed() if after_gc is not None else 0,
                 "jvm_rss_kib": self.status_kib(self.jvm_pid, "VmRSS")}  # fmt: skip
        for name, value in found.items():
            self.peaks[name] = max(self.peaks[name], value)
        self.samples += 1

    def _run(self) -> None:
        while not self.done.wait(MEMORY_SAMPLE_S):
            self._sample()

    def stop(self) -> dict:
        self.done.set()
        self.thread.join()
        self._sample()
        return {"max_heap_mib": round(self.max_heap / MIB), "heap_used_peak_mib": round(self.peaks["heap_used"] / MIB),
                "old_gen_after_gc_peak_mib": round(self.peaks["old_gen_after_gc"] / MIB),
                "jvm_rss_peak_mib": round(self.status_kib(self.jvm_pid, "VmHWM") / 1024),
                "python_driver_rss_peak_mib": round(self.status_kib(os.getpid(), "VmHWM") / 1024),
                "samples": self.samples}  # fmt: skip


def catalog_versions(spark, identifier: str) -> dict[str, int]:
    """The catalog's version (one metadata file per commit) of the table and of each table a batch commits to beside
    it that exists: a batch's commits are the difference."""
    found = {}
    for name in (identifier, f"{identifier}_deletes", f"{identifier}_dlq"):
        table = IcebergTable(spark, name)
        if table.exists():
            found[name.split(".")[-1]] = int(Path(table.metadata_location()).name.split("-", 1)[0])
    return found


def profile_hooks(jvm: list[int]) -> tuple[dict[str, float], dict[str, float]]:
    """Wall seconds and the Spark JVM's CPU seconds (`jvm`: its pid, once started) spent in the steps of a batch
    (`--profile`): each step wrapped where the batch calls it (nested steps count in their callers too)."""
    from process_stats import cpu_seconds
    from pyspark.sql import DataFrame, SparkSession

    from icefloe.materialize import batch, read_paths, upsert

    timings: dict[str, float] = {}
    cpu_timings: dict[str, float] = {}

    def cpu() -> float:
        return cpu_seconds(jvm[0]) if jvm else 0.0

    def timed(owner, name: str, label: str | None = None, by_statement: bool = False) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            started, cpu_started = time.monotonic(), cpu()
            try:
                return original(*args, **kwargs)
            finally:
                key = label or name
                if by_statement:  # the statement and its table; the run's branch by that name, whatever the run
                    target = str(args[1]).split()[2].split(".")[-1]
                    target = "the run's branch" if target.startswith("branch_icefloe_run_") else target[:40]
                    key = f"sql {str(args[1]).split()[0]} {target}"
                timings[key] = timings.get(key, 0.0) + time.monotonic() - started
                cpu_timings[key] = cpu_timings.get(key, 0.0) + cpu() - cpu_started

        setattr(owner, name, wrapper)

    timed(read_paths.JvmBatch, "kept")
    timed(batch, "_apply_error_mode")
    timed(batch, "positioned")
    timed(batch, "commit_on_branch", "commit_on_branch (all of the write)")
    timed(upsert, "_commit_delete_markers")
    timed(upsert, "merge_batch")
    timed(upsert, "_truncate_marker")
    timed(SparkSession, "sql", by_statement=True)
    timed(DataFrame, "count", "DataFrame.count")
    timed(DataFrame, "isEmpty", "DataFrame.isEmpty")
    timed(DataFrame, "collect", "DataFrame.collect")
    return timings, cpu_timings


def write_base(spark, identifier: str, keys: int) -> None:
    """`keys` rows (keys 0..keys-1) appended by Spark, positioned before every change (clock 2020)."""
    full = f"icefloe.{identifier}"
    columns = {
        "account": F.format_string("acct-%09d", F.col("id")), "balance": F.col("id") * 7,
        "currency": F.lit("EUR"), "updated_at": F.timestamp_millis(F.lit(BASE_CLOCK_MS)),
        "note": F.expr(f"substr('{NOTE}', 1, 120 + id % 60)"), "kafka_topic": F.lit("base"),
        "kafka_partition": (F.col("id") % PARTITIONS).cast("int"), "kafka_offset": F.col("id"),
        "kafka_timestamp": F.timestamp_millis(F.lit(BASE_CLOCK_MS)), "kafka_timestamp_type": F.lit(0),
        "kafka_key": F.encode(F.format_string("acct-%09d", F.col("id")), "utf-8"),
        "kafka_clock": F.timestamp_millis(F.lit(BASE_CLOCK_MS)),
    }  # fmt: skip
    schema = spark.table(full).schema
    frame = spark.range(0, keys, numPartitions=max(1, keys // 1_000_000)).select(
        *[(columns[f.name] if f.name in columns else F.lit(None)).cast(f.dataType).alias(f.name) for f in schema]
    )
    frame.writeTo(full).append()


def throughput(
    work: Path,
    keys_list: list[int],
    changes: int,
    rounds: int,
    profile: bool = False,
    base: Path | None = None,
    jvm_variants: dict[str, str] | None = None,
) -> dict:
    """`base`: another version's `runtime/`, whose upsert batches run beside this one's on a table of their own
    reading the same topic (mode "upsertbase"): the two versions compared in the same run. `jvm_variants`: name ->
    the driver JVM's options; each variant's upsert and append batches run beside the others' on tables of their own
    reading the same topics (modes "upsert_NAME", "append_NAME"), its options in `SPARK_SUBMIT_OPTS`."""
    from icefloe_dev.kafka_broker import KafkaBroker
    from icefloe_dev.processes import start_together
    from icefloe_dev.schema_registry import SchemaRegistry

    broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
    start_together(broker, registry)
    state, cores = work / "state", os.cpu_count() or 1
    try:
        bootstrap, url = broker.bootstrap_servers, registry.url
        sizes = []
        for keys in keys_list:
            upsert_topic, append_topic = f"upserts_{keys}", f"appends_{keys}"
            for topic in (upsert_topic, append_topic):
                broker.create_topic(topic, PARTITIONS)
            # mode -> (runtime, JVM options): the table f"{mode}_{keys}" in that mode ("upsert..." or "append...")
            modes: dict[str, tuple[Path | None, str | None]] = {
                "upsert": (None, None), **({"upsertbase": (base, None)} if base else {}), "append": (None, None)}  # fmt: skip
            for name, options in (jvm_variants or {}).items():
                modes |= {f"upsert_{name}": (None, options), f"append_{name}": (None, options)}
            config = job_config(bootstrap, url, [
                {"topic": append_topic if mode.startswith("append") else upsert_topic, "table": f"{mode}_{keys}",
                 **({} if mode.startswith("append") else {"mode": "upsert"})} for mode in modes])  # fmt: skip
            # First batches (not measured): one record each creates the tables; the upsert table gets its base rows.
            produce(bootstrap, url, upsert_topic, [(account_key(keys + 10**8), None)])
            produce(bootstrap, url, append_topic, [(account_key(keys + 10**8), None)])
            started = time.monotonic()
            for mode, (runtime, options) in modes.items():
                base_keys = 0 if mode.startswith("append") else keys
                run_job(state, config, f"{mode}_{keys}", base_keys=base_keys, runtime=runtime, java_options=options)
            print(f"{keys:,} keys: tables ready in {time.monotonic() - started:.0f} s", flush=True)
            runs: dict[str, list[dict]] = {mode: [] for mode in modes}
            for round_ in range(rounds):
                batch = change_batch(keys, changes, round_)
                size = produce(bootstrap, url, upsert_topic, batch)
                produce(bootstrap, url, append_topic, batch)
                order = list(modes)[::-1] if round_ % 2 else list(modes)
                for mode in order:
                    runtime, options = modes[mode]
                    found = run_job(state, config, f"{mode}_{keys}", profile=profile and mode.startswith("upsert"),
                                    runtime=runtime, java_options=options)  # fmt: skip
                    assert found["rows"] > 0, found
                    runs[mode].append(found)
                print(
                    f"{keys:,} keys round {round_}: " + ", ".join(f"{m} {r[-1]}" for m, r in runs.items()), flush=True
                )
            sizes.append({"keys": keys, "changes": changes, "mib": round(size / 2**20, 1),
                          **{mode: summarize(found, changes, cores) for mode, found in runs.items()}})  # fmt: skip
            sizes[-1]["ratio_upsert_to_append"] = round(sizes[-1]["upsert"]["seconds"] and
                                                        sizes[-1]["append"]["seconds"] / sizes[-1]["upsert"]["seconds"], 3)  # fmt: skip
            for name in jvm_variants or {}:
                size = sizes[-1]
                size[f"ratio_upsert_to_append_{name}"] = round(size[f"append_{name}"]["seconds"] /
                                                               size[f"upsert_{name}"]["seconds"], 3)  # fmt: skip
            if base:
                sizes[-1]["ratio_base_to_append"] = round(sizes[-1]["append"]["seconds"] /
                                                          sizes[-1]["upsertbase"]["seconds"], 3)  # fmt: skip
                sizes[-1]["cpu_upsert_to_base"] = round(sizes[-1]["upsert"]["spark_cpu_s"] /
                                                        sizes[-1]["upsertbase"]["spark_cpu_s"], 3)  # fmt: skip
    finally:
        registry.stop()
        broker.stop()
    return {"cores": cores, "sizes": sizes, "jvm_variants": jvm_variants or {}}


def large_batch(keys: int, changes: int, expected: list[int], seed: int = 30):
    """`changes` changes streamed (nothing of the batch held): 80% updates of existing keys, 10% new keys, 10%
    tombstones of existing keys, keys drawn with repeats. `expected` gets the number of rows they leave."""
    import random

    rng, new = random.Random(seed), 0
    alive = bytearray(b"\x01" * keys) + bytearray(changes // 5 + 1)
    now_ms = int(time.time() * 1000)
    for _ in range(changes):
        pick = rng.random()
        if pick < 0.1:
            index, new = keys + new, new + 1
        else:
            index = rng.randrange(keys + new)
        if pick >= 0.9:
            alive[index] = 0
            yield account_key(index), None
            continue
        alive[index] = 1
        yield account_key(index), {"account": f"acct-{index:09d}", "balance": rng.randint(0, 10**9), "currency": "EUR",
                                   "updated_at": now_ms, "note": NOTE[: 120 + index % 60]}  # fmt: skip
    expected.append(sum(alive))


def memory(work: Path, keys: int, sizes: list[int], heap: str | None = None) -> dict:
    """(4): one batch of each of `sizes` changes into a table of `keys` rows of its own, its memory sampled; `heap`:
    the driver's heap instead of the local default."""
    from icefloe_dev.kafka_broker import KafkaBroker
    from icefloe_dev.processes import start_together
    from icefloe_dev.schema_registry import SchemaRegistry

    broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
    start_together(broker, registry)
    state, batches = work / "state", []
    try:
        bootstrap, url = broker.bootstrap_servers, registry.url
        for changes in sizes:
            topic = table = f"upsert_{changes}"
            broker.create_topic(topic, PARTITIONS)
            config = job_config(bootstrap, url, [{"topic": topic, "table": table, "mode": "upsert"}])
            produce(bootstrap, url, topic, [(account_key(10**8), None)])
            run_job(state, config, table, base_keys=keys)
            expected: list[int] = []
            started = time.monotonic()
            size = produce(bootstrap, url, topic, large_batch(keys, changes, expected))
            print(
                f"produced {changes:,} changes ({size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f} s",
                flush=True,
            )
            found = run_job(state, config, table, memory=True, heap=heap)
            batches.append({"changes": changes, "mib": round(size / 2**20, 1), "expected_rows": expected[0], **found})
            print(json.dumps(batches[-1]), flush=True)
    finally:
        registry.stop()
        broker.stop()
    return {"keys": keys, "cores": os.cpu_count(), "heap": heap or "the local default", "batches": batches}


def render_memory(report: dict) -> str:
    lines = [
        f"# Upsert: one batch of changes into {report['keys']:,} keys, heap: {report['heap']}", "",
        f"Each batch a fresh process as a scheduled job, into a table of its own; "
        f"{report['cores']} cores shared; load average (1, 5, 15 min) at start {report['load_avg_at_start']}, at end "
        f"{report['load_avg_at_end']}. Memory sampled every {MEMORY_SAMPLE_S} s. Changes: 80% updates of existing "
        "keys, 10% new keys, 10% tombstones, keys drawn with repeats. Table rows: counted after the batch, against "
        "the keys the changes leave.", "",
        "| changes | MiB | records read | seconds | changes/s | Spark CPU s | max heap MiB | heap in use, peak MiB | old gen after GC, peak MiB | JVM RSS peak MiB | Python driver RSS peak MiB | table rows |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for b in report["batches"]:
        m = b["memory"]
        read = "all, one batch" if b["records_read"] == b["changes"] else f"{b['records_read']:,}"
        rows = "as expected" if b["table_rows"] == b["expected_rows"] else f"expected {b['expected_rows']:,}"
        lines.append(
            f"| {b['changes']:,} | {b['mib']} | {read} ({b['read_path']}) | {b['seconds']} | "
            f"{round(b['changes'] / b['seconds']):,} | {b['spark_cpu_s']} | {m['max_heap_mib']} | "
            f"{m['heap_used_peak_mib']} | {m['old_gen_after_gc_peak_mib']} | {m['jvm_rss_peak_mib']} | "
            f"{m['python_driver_rss_peak_mib']} | {b['table_rows']:,} ({rows}) |"
        )
    return "\n".join([*lines, ""])


def summarize(runs: list[dict], changes: int, cores: int) -> dict:
    import statistics

    seconds = statistics.median(r["seconds"] for r in runs)
    cpu = round(statistics.median(r["spark_cpu_s"] for r in runs), 1)
    return {"seconds": round(seconds, 2), "seconds_all": [r["seconds"] for r in runs],
            "changes_per_s": round(changes / seconds), "changes_per_s_per_core": round(changes / seconds / cores),
            "spark_cpu_s": cpu, "changes_per_spark_cpu_s": round(changes / cpu) if cpu else None,
            "spark_start_s": [r["spark_start_s"] for r in runs], "load_1m": [r["load_1m"] for r in runs],
            "read_path": sorted({r["read_path"] for r in runs}), "rows": [r["rows"] for r in runs],
            "max_heap_mib": sorted({r.get("max_heap_mib") for r in runs}, key=str),
            **{name: {step: round(statistics.median(r[name].get(step, 0.0) for r in runs), 2) for step in runs[0][name]}
               for name in ("profile_s", "profile_cpu_s") if all(name in r for r in runs)}}  # fmt: skip


def render_throughput(report: dict) -> list[str]:
    runs = [m for size in report["sizes"] for m in size.values() if isinstance(m, dict)]
    heaps = sorted({heap for m in runs for heap in m.get("max_heap_mib", [])}, key=str)
    lines = [
        f"## Throughput: one batch of {report['changes']:,} changes (80% updates, 10% new keys, 10% tombstones)",
        "",
        f"Each batch a fresh process as a scheduled job (Spark's start excluded, listed apart), {report['cores']} cores "
        f"shared with other users; load average (1, 5, 15 min) at start {report['load_avg_at_start']}, at end "
        f"{report['load_avg_at_end']}; median of {report['rounds']} rounds, upsert and append alternating. The append "
        "table takes the same records from a topic of its own. Per core = changes/s / cores. The Spark JVM's heap "
        f"(MiB): {heaps}.",
        "",
        "| table keys | mode | seconds (median) | all | changes/s | changes/s per core | Spark CPU s | changes per Spark CPU-s | Spark start s | load (1 min) |",
        "|---:|---|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for size in report["sizes"]:
        for mode, m in size.items():
            if not isinstance(m, dict):
                continue
            lines.append(f"| {size['keys']:,} | {mode} | {m['seconds']} | {m['seconds_all']} | {m['changes_per_s']:,} | "
                         f"{m['changes_per_s_per_core']:,} | {m['spark_cpu_s']} | {m['changes_per_spark_cpu_s']:,} | "
                         f"{m['spark_start_s']} | {m['load_1m']} |")  # fmt: skip
    for size in report["sizes"]:
        for mode, m in size.items():
            if isinstance(m, dict) and "profile_s" in m:
                lines += ["", f"Steps of `{mode}` at {size['keys']:,} keys (`--profile`, medians; nested steps count in "
                          "their callers too): seconds / Spark CPU seconds", "", "| step | s | CPU s |", "|---|---:|---:|",
                          *[f"| {step} | {t} | {m['profile_cpu_s'].get(step)} |" for step, t in m["profile_s"].items()]]  # fmt: skip
    lines += ["", "Upsert / append rate, same run: " + ", ".join(
        f"{s['keys']:,} keys {s['ratio_upsert_to_append']}" for s in report["sizes"]) + "."]  # fmt: skip
    for name, options in report.get("jvm_variants", {}).items():
        lines.append(f"JVM variant `{name}` (`SPARK_SUBMIT_OPTS={options}`), upsert / append rate: " + ", ".join(
            f"{s['keys']:,} keys {s[f'ratio_upsert_to_append_{name}']}" for s in report["sizes"]) + ".")  # fmt: skip
    for s in report["sizes"]:
        if "upsertbase" in s:
            lines.append(f"Base version (`upsertbase`, {report['base']}) / append rate, same run: {s['keys']:,} keys "
                         f"{s['ratio_base_to_append']}; Spark CPU this version / base: {s['cpu_upsert_to_base']}.")  # fmt: skip
    if len(report["sizes"]) > 1:
        small, large = report["sizes"][0], report["sizes"][-1]
        for mode in (m for m in large if m.startswith("upsert") and isinstance(large[m], dict)):
            lines.append(f"Cost of `{mode}` at {large['keys']:,} keys / at {small['keys']:,} keys: "
                         f"x{round(large[mode]['seconds'] / small[mode]['seconds'], 2)} (seconds), "
                         f"x{round(large[mode]['spark_cpu_s'] / small[mode]['spark_cpu_s'], 2)} (Spark CPU s).")  # fmt: skip
    return [*lines, ""]


READ_REPEATS = 3


def read_cost(spark, state: Path, table: IcebergTable) -> dict:
    """Seconds of a full scan + aggregate and of a point lookup by key, with DuckDB, pyiceberg and Spark: each the
    median of READ_REPEATS reads."""
    from pyiceberg.expressions import EqualTo

    query = "SELECT count(*), sum(balance), count(DISTINCT account) FROM {scan}"
    key = "acct-123457"
    timings: dict = {}

    def timed(name: str, action):  # the median of READ_REPEATS (a single read is mostly a reader's first-use cost)
        seconds = []
        for _ in range(READ_REPEATS):
            started = time.monotonic()
            found = action()
            seconds.append(round(time.monotonic() - started, 3))
        timings[name] = sorted(seconds)[len(seconds) // 2]
        timings.setdefault("each", {})[name] = seconds
        return found

    scan = f"iceberg_scan('{table.metadata_location()}')"
    duck = timed("duckdb_scan_s", lambda: duckdb_connect().execute(query.format(scan=scan)).fetchone())
    timed(
        "duckdb_lookup_s", lambda: duckdb_connect().execute(f"SELECT * FROM {scan} WHERE account = '{key}'").fetchall()
    )
    loaded = pyiceberg_catalog(state).load_table(table.identifier)
    arrow = timed("pyiceberg_scan_s", lambda: loaded.scan(selected_fields=("account", "balance")).to_arrow())
    timed("pyiceberg_lookup_s", lambda: loaded.scan(row_filter=EqualTo("account", key)).to_arrow())
    spark_rows = timed("spark_scan_s", lambda: spark.sql(query.format(scan=table.full_name)).first())
    timed("spark_lookup_s", lambda: spark.sql(f"SELECT * FROM {table.full_name} WHERE account = '{key}'").collect())
    files = spark.sql(f"SELECT content, count(*) AS n FROM {table.full_name}.files GROUP BY content").collect()
    assert int(duck[0]) == arrow.num_rows == spark_rows[0], (duck, arrow.num_rows, spark_rows)
    return {**timings, "rows": int(duck[0]), "files": {str(r.content): r.n for r in files}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="N: the table's keys")
    parser.add_argument("--changes", type=int, default=200_000, help="the batch of changes")
    parser.add_argument("--rounds", type=int, default=3, help="(1): batches per table (the median counts)")
    parser.add_argument("--large", action="store_true", help="(1): also a table of 10N keys (slow)")
    parser.add_argument("--reads", action="store_true", help="only (2), reads after --batches upserts")
    parser.add_argument("--batches", type=int, default=10, help="(2): upsert batches before the read comparison")
    parser.add_argument("--format-version", type=int, default=3, help="the upserted table's formatVersion (2 or 3)")
    parser.add_argument("--cost-only", action="store_true", help="only (3), the cost of the upsert order")
    parser.add_argument("--repeats", type=int, default=2, help="(3): merges per variant (the best counts)")
    parser.add_argument("--profile", action="store_true", help="(1): seconds per step of the upsert batches")
    parser.add_argument("--base", type=Path, help="(1): another version's runtime/ dir, its upserts run beside")
    parser.add_argument("--memory", action="store_true", help="only (4), one large batch's memory")
    parser.add_argument("--memory-changes", default="1000000,2500000,5000000", help="(4): batch sizes, comma-separated")
    parser.add_argument("--memory-heap", help="(4): the driver's heap (ICEFLOE_DRIVER_MEMORY), else the default")
    parser.add_argument(
        "--jvm",
        action="append",
        default=[],
        metavar="NAME=OPTIONS",
        help="(1): also upsert and append tables whose batches run with these driver JVM options (SPARK_SUBMIT_OPTS; "
        "the runtime's short-lived JIT options come after them: a -XX:FreqInlineSize here is overridden, "
        "ICEFLOE_SHORT_LIVED_JIT changes that one)",
    )
    parser.add_argument("--output", help="(1), (4): results file name (bench/results/NAME.*; upsert, upsert_memory)")
    parser.add_argument("--job", help=argparse.SUPPRESS)  # the fresh process of one batch (`run_job`)
    args = parser.parse_args()
    if args.job:
        job(json.loads(args.job))
        return
    work = Path(tempfile.mkdtemp(prefix="icefloe-upsert-"))
    RESULTS.mkdir(exist_ok=True)
    if args.memory:
        load = [round(x, 1) for x in os.getloadavg()]
        try:
            report = memory(work, args.keys, [int(n) for n in args.memory_changes.split(",")], args.memory_heap)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report.update(load_avg_at_start=load, load_avg_at_end=[round(x, 1) for x in os.getloadavg()])
        output = args.output or "upsert_memory"
        (RESULTS / f"{output}.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / f"{output}.md").write_text(render_memory(report))
        print(render_memory(report))
        return
    if not args.cost_only and not args.reads:
        load = [round(x, 1) for x in os.getloadavg()]
        try:
            report = throughput(
                work,
                [args.keys, *([10 * args.keys] if args.large else [])],
                args.changes,
                args.rounds,
                args.profile,
                args.base,
                dict(variant.split("=", 1) for variant in args.jvm),
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report.update(changes=args.changes, rounds=args.rounds, load_avg_at_start=load, base=str(args.base or ""),
                      load_avg_at_end=[round(x, 1) for x in os.getloadavg()])  # fmt: skip
        output = args.output or "upsert"
        (RESULTS / f"{output}.json").write_text(json.dumps(report, indent=2) + "\n")
        text = "\n".join(["# Upsert benchmark", "", *render_throughput(report)])
        (RESULTS / f"{output}.md").write_text(text)
        print(text)
        return
    spark = spark_session(CatalogSpec(), work)
    if args.cost_only:
        try:
            cost = order_cost(spark, args.keys, args.changes, args.repeats)
        finally:
            spark.stop()
            shutil.rmtree(work, ignore_errors=True)
        (RESULTS / "upsert_order_cost.json").write_text(json.dumps(cost, indent=2) + "\n")
        (RESULTS / "upsert_order_cost.md").write_text(render_cost(cost, os.cpu_count()))
        print(render_cost(cost, os.cpu_count()))
        return
    report: dict = {"keys": args.keys, "changes": args.changes, "batches": args.batches, "cores": os.cpu_count(),
                    "format_version": args.format_version,
                    "load_avg_at_start": [round(x, 1) for x in os.getloadavg()]}  # fmt: skip
    try:
        upserted = create(spark, "bench.after_upserts", args.format_version)
        rows(spark, 0, args.keys, seed=0).drop("icefloe_tombstone").writeTo(upserted.full_name).append()
        per_batch = args.changes
        for batch in range(1, args.batches + 1):
            changes = rows(spark, (batch * per_batch) % args.keys, per_batch, seed=batch, tombstone_every=10).persist()
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
    report["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    name = f"upsert_reads_v{args.format_version}"
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    reads = report["reads"]
    lines = [
        f"# Upsert: reads after {args.batches} upsert batches of {args.changes:,} changes on {args.keys:,} keys, "
        f"format v{args.format_version}",
        "",
        f"Full scan + aggregate, and a point lookup by key (seconds, the median of {READ_REPEATS} reads); load "
        f"average at start {report['load_avg_at_start']}, at end {report['load_avg_at_end']} ({report['cores']} cores, shared).",
        "",
        "| table | rows | data/delete files | DuckDB scan | DuckDB lookup | pyiceberg scan | pyiceberg lookup | Spark scan | Spark lookup |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        *[f"| {name} | {r['rows']:,} | {r['files']} | {r['duckdb_scan_s']} | {r['duckdb_lookup_s']} | {r['pyiceberg_scan_s']} | "
          f"{r['pyiceberg_lookup_s']} | {r['spark_scan_s']} | {r['spark_lookup_s']} |" for name, r in reads.items()],
        "",
        "After upserts / append-only, same rows: " + ", ".join(
            f"{k[:-2]} x{round(reads['after_upserts'][k] / max(reads['append_only_same_rows'][k], 0.001), 2)}"
            for k in reads["after_upserts"] if k.endswith("_s")) + ".",
    ]  # fmt: skip
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def render_cost(cost: dict, cores: int | None) -> str:
    best = cost["best_s"]
    return "\n".join(
        [
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
        ]
    )


if __name__ == "__main__":
    main()
