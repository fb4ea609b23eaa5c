"""CDC benchmark: a Debezium mirror table's change rate vs plain upserts, in one process on the same broker.

N Debezium-shaped Avro change events (self-contained schema, PostgreSQL source positions) over K keys: mostly
updates, some leaving a TOAST column unchanged (the placeholder), creates, deletes with their tombstones; and N plain
Avro upserts over the same K keys (`mode: upsert` on the Kafka key). Each round produces N of each, then runs one
batch of each table (icefloe's `run_table`; both on the JVM read path: the mirror's envelope through
formats.debezium.jvm, `read_path` in the results), timed.
Round 1 builds the tables; later rounds merge into K existing rows. Besides wall time, each batch's CPU time (the
Spark JVM's and this process's; the broker's is left out) and the load average at the start and end: on a shared
machine the CPU ratio is the steadier figure.
`--steps`: each batch's wall and CPU seconds in its main steps too (`STEPS`; the error mode's pass over the batch,
the merge and, inside it, the delete markers and the MERGE statement), printed and kept in cdc.json.
Results: bench/results/cdc.{json,md} (`--output`: another name); the table replaces the top of the page, the sections
(`## `) below it are kept.
`--moved N`: N primary-key changes per round after the first (`produce`), so the mirror resolves moved rows'
unchanged columns from the table; `--first-changes`: a bigger round 1, for a bigger table.
At the end the JVM's metaspace and how many generated classes Spark compiled in the run are reported.
Run: `.venv/bin/python bench/cdc.py [--changes 100000 --keys 20000 --rounds 3] [--steps] [--moved N]
[--first-changes N] [--output NAME]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from process_stats import cpu_seconds
from pyspark.sql import DataFrame

import icefloe.materialize.batch as batch_module
import icefloe.materialize.upsert as upsert_module
from icefloe.commit.branch import Branch
from icefloe.operate.runner import run_table
from icefloe.session import spark_session
from icefloe.spec import parse_config
from icefloe_dev.kafka_broker import KafkaBroker
from icefloe_dev.processes import start_together
from icefloe_dev.schema_registry import SchemaRegistry

RESULTS = Path(__file__).parent / "results"
PARTITIONS = 4
PLACEHOLDER = "__debezium_unavailable_value"
ROW = {"type": "record", "name": "Value", "namespace": "pg.public.accounts", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]}, {"name": "balance", "type": "long"},
    {"name": "notes", "type": ["null", "string"]}]}  # fmt: skip
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "connector", "type": "string"}, {"name": "ts_ms", "type": "long"}, {"name": "lsn", "type": ["null", "long"]},
    {"name": "sequence", "type": ["null", "string"]}]}  # fmt: skip
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "pg.public.accounts", "fields": [
    {"name": "before", "type": ["null", ROW]}, {"name": "after", "type": ["null", "Value"]}, {"name": "source", "type": SOURCE},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"]}]}  # fmt: skip
KEY = {"type": "record", "name": "Key", "namespace": "pg.public.accounts", "fields": [{"name": "id", "type": "long"}]}
# The steps `--steps` times: (module or class, function, label)
# and the Spark jobs the driver waits on by their action (`df_*`: nested in the steps above too).
STEPS = [(batch_module, "_apply_error_mode", "error_mode_pass"), (batch_module, "merge_batch", "merge"),
         (upsert_module, "_commit_delete_markers", "delete_markers"), (Branch, "sql", "merge_statement"),
         (upsert_module, "_truncate_marker", "truncate_marker"), (upsert_module, "positioned", "positioned"),
         (batch_module, "commit_on_branch", "commit_on_branch"), (DataFrame, "first", "df_first"),
         (DataFrame, "collect", "df_collect"), (DataFrame, "isEmpty", "df_isEmpty"),
         (DataFrame, "localCheckpoint", "df_localCheckpoint")]  # fmt: skip


def time_steps(cpu: Callable[[], float]) -> dict[str, list[float]]:
    """Wrap the `STEPS` in timers; returns their totals (wall s, CPU s), which the caller clears per batch."""
    totals: dict[str, list[float]] = {}
    for owner, name, label in STEPS:
        step = getattr(owner, name)

        def timed(*args, _step=step, _label=label, **kwargs):
            spent, started = cpu(), time.monotonic()
            try:
                return _step(*args, **kwargs)
            finally:
                total = totals.setdefault(_label, [0.0, 0.0])
                total[0] += time.monotonic() - started
                total[1] += cpu() - spent

        setattr(owner, name, functools.wraps(step)(timed))
    return totals


def produce(
    bootstrap: str,
    registry_url: str,
    cdc: str,
    plain: str,
    count: int,
    keys: int,
    rng: random.Random,
    lsn: list[int],
    moves: int = 0,
    new_keys: list[int] | None = None,
) -> None:
    """`count` changes of each table, then `moves` primary-key changes: a key's row moves to a new key (`new_keys`:
    the next one), its TOAST column unchanged (Debezium's delete of the old key, its tombstone and a create of the new
    one under the `__debezium.oldkey` header; the plain table deletes the old key and writes the new one)."""
    client = SchemaRegistryClient({"url": registry_url})
    value, key = AvroSerializer(client, json.dumps(ENVELOPE)), AvroSerializer(client, json.dumps(KEY))
    row = AvroSerializer(client, json.dumps(ROW))
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "enable.idempotence": True}
    )
    vctx, kctx = SerializationContext(cdc, MessageField.VALUE), SerializationContext(cdc, MessageField.KEY)
    pctx = SerializationContext(plain, MessageField.VALUE)
    notes = "x" * 300
    for _ in range(count):
        lsn[0] += 8
        ident = rng.randrange(keys)
        partition = zlib.crc32(str(ident).encode()) % PARTITIONS
        pick = rng.random()
        after = {"id": ident, "name": f"name-{ident}", "balance": rng.randrange(10**6),
                 "notes": PLACEHOLDER if pick < 0.3 else notes}  # fmt: skip
        op = "d" if pick > 0.9 else "c" if pick > 0.8 else "u"
        envelope = {"before": {**after, "notes": None} if op == "d" else None, "after": None if op == "d" else after,
                    "source": {"connector": "postgresql", "ts_ms": int(time.time() * 1000), "lsn": lsn[0],
                               "sequence": json.dumps([str(lsn[0] - 4), str(lsn[0])])}, "op": op, "ts_ms": None}  # fmt: skip
        kbytes = key({"id": ident}, kctx)
        producer.produce(cdc, key=kbytes, value=value(envelope, vctx), partition=partition)
        if op == "d":
            producer.produce(cdc, key=kbytes, value=None, partition=partition)
        plain_value = None if op == "d" else row({**after, "notes": notes}, pctx)
        producer.produce(plain, key=str(ident).encode(), value=plain_value, partition=partition)
        producer.poll(0)
    for _ in range(moves):
        lsn[0] += 8
        old, new = rng.randrange(keys), (new_keys or [keys]).pop()
        at = {"connector": "postgresql", "ts_ms": int(time.time() * 1000), "lsn": lsn[0], "sequence": json.dumps([str(lsn[0] - 4), str(lsn[0])])}  # fmt: skip
        after = {"id": new, "name": f"name-{new}", "balance": rng.randrange(10**6), "notes": PLACEHOLDER}
        gone = {"before": {**after, "id": old, "notes": None}, "after": None, "source": at, "op": "d", "ts_ms": None}
        created = {"before": None, "after": after, "source": at, "op": "c", "ts_ms": None}
        old_at, new_at = (zlib.crc32(str(k).encode()) % PARTITIONS for k in (old, new))
        old_key = key({"id": old}, kctx)
        producer.produce(cdc, key=old_key, value=value(gone, vctx), partition=old_at)
        producer.produce(cdc, key=old_key, value=None, partition=old_at)
        header = [("__debezium.oldkey", json.dumps({"id": old}).encode())]
        producer.produce(cdc, key=key({"id": new}, kctx), value=value(created, vctx), partition=new_at, headers=header)
        producer.produce(plain, key=str(old).encode(), value=None, partition=old_at)
        plain_value = row({**after, "notes": notes}, pctx)
        producer.produce(plain, key=str(new).encode(), value=plain_value, partition=new_at)
        producer.poll(0)
    assert producer.flush(60) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", action="store_true", help="time each batch's main steps too (STEPS)")
    parser.add_argument(
        "--first-changes", type=int, help="changes of round 1, which builds the tables (default: --changes)"
    )
    parser.add_argument("--moved", type=int, default=0, help="primary-key changes in each round after the first")
    parser.add_argument("--output", default="cdc", help="results as bench/results/OUTPUT.{json,md}")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefloe-bench-cdc-"))
    rounds = []
    try:
        broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
        start_together(broker, registry)
        try:
            for name in ("pg.public.accounts", "accounts_plain"):
                broker.create_topic(name, PARTITIONS)
            cluster = {
                "name": "local",
                "bootstrapServers": broker.bootstrap_servers,
                "schemaRegistry": {"url": registry.url},
            }
            config = parse_config({"sourceClusters": [cluster], "catalog": {"type": "local"}, "tables": [
                {"sourceCluster": "local", "topic": "pg.public.accounts", "format": "avro", "envelope": "debezium", "mode": "upsert"},
                {"sourceCluster": "local", "topic": "accounts_plain", "format": "avro", "mode": "upsert"}]})  # fmt: skip
            spark = spark_session(config.catalog, work / "state")
            jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]  # local mode: the launched JVM

            def cpu() -> float:  # the Spark JVM (and anything it started) and this Python process itself
                return cpu_seconds(jvm) + sum(os.times()[:2])

            steps = time_steps(cpu) if args.steps else None
            rng, lsn = random.Random(29), [1000]
            new_keys = list(range(args.keys + args.moved * args.rounds, args.keys, -1))  # popped from the end
            for number in range(1, args.rounds + 1):
                first = number == 1
                produce(
                    broker.bootstrap_servers,
                    registry.url,
                    "pg.public.accounts",
                    "accounts_plain",
                    (args.first_changes or args.changes) if first else args.changes,
                    args.keys,
                    rng,
                    lsn,
                    0 if first else args.moved,
                    new_keys,
                )
                measured = {"round": number}
                for label, table in (("plain_upsert", config.tables[1]), ("cdc_mirror", config.tables[0])):
                    if steps is not None:
                        steps.clear()
                    load, spent, started = os.getloadavg()[0], cpu(), time.monotonic()
                    result = run_table(spark, config, table, work / "state")
                    seconds = time.monotonic() - started
                    records = sum(result.offsets.values())
                    measured[label] = {
                        "seconds": round(seconds, 1),
                        "cpu_s": round(cpu() - spent, 1),
                        "load_1m": [round(load, 1), round(os.getloadavg()[0], 1)],
                        "records_to_date": records,
                        "read_path": result.read_path,
                    }
                    if steps is not None:  # wall s, CPU s
                        measured[label]["steps"] = {k: [round(v, 1) for v in t] for k, t in steps.items()}
                rounds.append(measured)
                print(json.dumps(measured), flush=True)
            pools = spark._jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
            metaspace = next(p.getUsage().getUsed() for p in pools if p.getName() == "Metaspace")
            compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()
            spark.stop()
        finally:
            registry.stop()
            broker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for measured in rounds:  # changes per second of each batch (the CDC topic also holds the deletes' tombstones)
        changes = (args.first_changes or args.changes) if measured["round"] == 1 else args.changes + args.moved
        for label in ("plain_upsert", "cdc_mirror"):
            measured[label]["changes_per_s"] = round(changes / measured[label]["seconds"])
    report = {"machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, shared",
              "changes_per_round": args.changes, "first_round_changes": args.first_changes or args.changes,
              "moved_per_round": args.moved, "keys": args.keys, "partitions": PARTITIONS, "rounds": rounds,
              "metaspace_mib_at_end": round(metaspace / 2**20), "classes_compiled": compiled}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.output}.json").write_text(json.dumps(report, indent=2) + "\n")
    shape = f"{args.changes} changes per round over {args.keys} keys"
    if args.first_changes:
        shape += f" ({args.first_changes} in round 1)"
    if args.moved:
        shape += f", and {args.moved} primary-key changes per round after the first (the row moves to a new key, its TOAST column unchanged)"
    lines = ["# CDC benchmark (bench/cdc.py)", "", f"{report['machine']}; {shape}, "
             f"{PARTITIONS} partitions; one batch per table per round, same process. Mirror/plain: the mirror's rate "
             "over the plain upsert's (plain time over mirror time), by wall and by CPU time; load: 1-minute load "
             "average at the start of the plain batch and the end of the mirror's. At the end: the JVM's metaspace "
             f"{report['metaspace_mib_at_end']} MiB, {report['classes_compiled']} generated classes compiled in all.", "",
             "| round | plain upsert s | plain CPU s | CDC mirror s | mirror CPU s | mirror/plain, wall | mirror/plain, CPU | load |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in rounds:
        p, c = m["plain_upsert"], m["cdc_mirror"]
        wall, spent = p["seconds"] / c["seconds"], p["cpu_s"] / c["cpu_s"]
        lines.append(
            f"| {m['round']} | {p['seconds']} | {p['cpu_s']} | {c['seconds']} | {c['cpu_s']} | {wall:.2f} | "
            f"{spent:.2f} | {p['load_1m'][0]} -> {c['load_1m'][1]} |"
        )
    page = RESULTS / f"{args.output}.md"
    kept = page.read_text() if page.exists() else ""
    history = kept[kept.index("\n## ") :] if "\n## " in kept else ""
    page.write_text("\n".join(lines) + "\n" + history)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
