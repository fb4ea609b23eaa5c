"""Formats benchmark: the same logical records in every format icefloe reads, through icefloe, in one run.

The `trades` shape of bench/throughput.py (stock trades with a ~160-character memo: 8 columns, a timestamp among
them) is produced N times per format, each to its own topic (4 partitions, lz4 batches), the records identical:
  avro         Avro in Confluent framing (the registry's schema), read on the JVM path
  json         JSON text, the table's columns given inline (`schema`), `event_time` an ISO-8601 string
  json-spaced  the same JSON as Python's `json.dumps` writes it by default (a space after `,` and `:`)
  json-schema  the same JSON in Confluent framing, its JSON Schema in the registry (draft 7, every field required)
  schemaless   the `json` topic's bytes again, the table's columns inferred per batch (no `schema`), into a new
               table: its first batch, every record's types inferred in Python
  schemaless-known  the same, into a table whose columns earlier batches (its first SEED_RECORDS records in two
               batches, not timed) already set and kept: the columns assumed, each record checked as it is written
  protobuf     Protobuf in Confluent framing (the registry's .proto, `event_time` a google.protobuf.Timestamp)
Then, in one warm SparkSession (`local[*]`), R rounds interleave the formats (so load from other users hits every
format alike), each `run_table` into a fresh Iceberg table after a warm-up round per format that is reported apart.
MiB = key + value bytes as each format writes them (JSON records are larger than Avro's); per core = MiB/s / the
machine's cores. Records/s compares the formats on the logical records instead. Ratios are to Avro in the same run.
Results: bench/results/formats.{json,md}. Run: `.venv/bin/python bench/formats.py [--records N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext
from throughput import PARTITIONS, TRADES, Stage, trades

from icefloe.operate.runner import run_table
from icefloe.session import spark_session
from icefloe.spec import parse_config
from icefloe_dev import stock_trades
from icefloe_dev.kafka_broker import KafkaBroker
from icefloe_dev.processes import start_together
from icefloe_dev.producer import BATCHING, produce_avro_quickly, value_serializer
from icefloe_dev.protos import compile_protos, message_class
from icefloe_dev.schema_registry import SchemaRegistry

RESULTS = Path(__file__).parent / "results"
FORMATS = ("avro", "json", "json-spaced", "json-schema", "schemaless", "schemaless-known", "protobuf")
SEED_RECORDS = 1_000  # schemaless-known: the records of the untimed batches that set the table's columns
# The trades' columns as an inline schema: what the Avro schema maps to (the enum a string, timestamp-millis an
# instant), every field required as in Avro.
INLINE_SCHEMA = {
    "fields": [
        {"name": "side", "type": "string", "optional": False},
        {"name": "quantity", "type": "int", "optional": False},
        {"name": "symbol", "type": "string", "optional": False},
        {"name": "price", "type": "int", "optional": False},
        {"name": "account", "type": "string", "optional": False},
        {"name": "userid", "type": "string", "optional": False},
        {"name": "event_time", "type": "timestamptz", "optional": False},
        {"name": "memo", "type": "string", "optional": False},
    ]
}
PROTO = stock_trades.PROTO.replace("event_time = 7;", "event_time = 7;\n  string memo = 8;")
JSON_SCHEMA = json.loads(stock_trades.JSON_SCHEMA)
JSON_SCHEMA["properties"]["memo"] = {"type": "string"}
JSON_SCHEMA["required"] = [*JSON_SCHEMA["required"], "memo"]


def produce_raw(bootstrap: str, topic: str, records) -> tuple[int, int]:
    """(key bytes, value bytes) pairs in large lz4 batches; returns (records, key and value bytes)."""
    producer = Producer({"bootstrap.servers": bootstrap, **BATCHING})
    count = size = 0
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.1)
        producer.poll(0)
        count, size = count + 1, size + len(key) + len(value)
    if producer.flush(120) != 0:
        raise RuntimeError(f"records were not delivered to {topic} within 120 s")
    return count, size


def json_trades(count: int, separators: tuple[str, str] = (",", ":")):
    """The trades as compact JSON text, `event_time` ISO-8601 with milliseconds (as stock_trades.as_json)."""
    for key, value in trades(count):
        yield key, json.dumps(stock_trades.as_json(value), separators=separators).encode()


def protobuf_trades(registry_url: str, topic: str, count: int):
    """The trades as Protobuf messages in Confluent framing, the schema registered by confluent-kafka's serializer."""
    with tempfile.TemporaryDirectory(prefix="icefloe-formats-proto-") as work:
        trade = message_class(
            compile_protos({stock_trades.PROTO_FILE: PROTO}, Path(work)), "io.icefloe.demo.StockTrade"
        )
    serializer = value_serializer(registry_url, "protobuf", trade)
    context = SerializationContext(topic, MessageField.VALUE)
    for key, value in trades(count):
        yield key, serializer(stock_trades.as_protobuf(trade, value), context)


def produce_all(bootstrap: str, registry_url: str, records: int) -> dict[str, dict]:
    """Each format's topic with the same records: {format: {topic, records, bytes, produce_s}}."""
    produced = {}
    for name in FORMATS:
        if name in ("schemaless", "schemaless-known"):  # the json topic's bytes, read without a schema
            produced[name] = {**produced["json"], "produce_s": 0.0}
            continue
        topic = f"formats_{name.replace('-', '_')}"
        started = time.monotonic()
        if name == "avro":
            count, size = produce_avro_quickly(bootstrap, registry_url, topic, TRADES, trades(records))
        elif name == "json":
            count, size = produce_raw(bootstrap, topic, json_trades(records))
        elif name == "json-spaced":
            count, size = produce_raw(bootstrap, topic, json_trades(records, (", ", ": ")))
        elif name == "protobuf":
            count, size = produce_raw(bootstrap, topic, protobuf_trades(registry_url, topic, records))
        else:
            schema_id = SchemaRegistryClient({"url": registry_url}).register_schema(
                f"{topic}-value", Schema(json.dumps(JSON_SCHEMA), "JSON")
            )
            header = b"\x00" + struct.pack(">I", schema_id)
            count, size = produce_raw(bootstrap, topic, ((k, header + v) for k, v in json_trades(records)))
        produced[name] = {"topic": topic, "records": count, "bytes": size, "produce_s": time.monotonic() - started}
        print(f"{name}: produced {count:,} records, {size / count:.0f} B each", flush=True)
    return produced


def table_config(bootstrap: str, registry_url: str, name: str, topic: str, table: str, max_records: int):
    spec = {"sourceCluster": "bench", "topic": topic, "table": table, "maxRecordsPerRun": max_records}
    if name in ("json", "json-spaced", "schemaless", "schemaless-known"):
        spec["format"] = "json"
    if name in ("json", "json-spaced"):
        spec["schema"] = INLINE_SCHEMA
    if name in ("json-schema", "protobuf"):
        spec["format"] = name
    return parse_config({
        "sourceClusters": [{"name": "bench", "bootstrapServers": bootstrap, "schemaRegistry": {"url": registry_url}}],
        "tables": [spec],
    })  # fmt: skip


def summary(name: str, runs: list[dict], topic: dict, cores: int) -> dict:
    if runs[0]["records"] != topic["records"]:  # schemaless-known: the records after the seed (sizes are uniform)
        topic = {
            **topic,
            "records": runs[0]["records"],
            "bytes": topic["bytes"] * runs[0]["records"] / topic["records"],
        }
    seconds = statistics.median(r["seconds"] for r in runs)
    spark_cpu = statistics.median(r["spark_cpu_s"] for r in runs)
    mib = topic["bytes"] / 2**20
    return {
        "format": name,
        "records": topic["records"],
        "avg_record_bytes": round(topic["bytes"] / topic["records"], 1),
        "mib": round(mib, 1),
        "read_path": sorted({r["read_path"] for r in runs}),
        "runs": len(runs),
        "seconds_median": round(seconds, 2),
        "seconds_all": [round(r["seconds"], 2) for r in runs],
        "mib_per_s": round(mib / seconds, 2),
        "mib_per_s_per_core": round(mib / seconds / cores, 2),
        "records_per_s": round(topic["records"] / seconds),
        "spark_cpu_s": round(spark_cpu, 2),
        "mib_per_spark_cpu_s": round(mib / spark_cpu, 2) if spark_cpu else None,
        "load_1m": [r["load_1m"] for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500_000, help="records per format")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per format, after one warm-up round")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of " + ", ".join(FORMATS))
    parser.add_argument("--output", default="formats", help="results file name (bench/results/NAME.{json,md})")
    args = parser.parse_args()
    chosen = [f for f in FORMATS if f in args.formats.split(",")]
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="icefloe-formats-"))
    load_before = os.getloadavg()
    try:
        broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
        start_together(broker, registry)
        try:
            for name in FORMATS:
                if not name.startswith("schemaless"):
                    broker.create_topic(f"formats_{name.replace('-', '_')}", PARTITIONS)
            produced = produce_all(broker.bootstrap_servers, registry.url, args.records)
            config = table_config(broker.bootstrap_servers, registry.url, "avro", "none", "none", 1)
            spark = spark_session(config.catalog, work / "state")
            jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
            stage = Stage(jvm_pid, broker.pid, spark._jvm.java.lang.System.gc)
            runs: dict[str, list[dict]] = {name: [] for name in chosen}
            for round_ in range(args.rounds + 1):  # round 0 warms each format's code paths up: reported apart
                for name in chosen:
                    topic = produced[name]
                    table = f"{name.replace('-', '_')}_{round_}"
                    config = table_config(
                        broker.bootstrap_servers, registry.url, name, topic["topic"], table, args.records
                    )
                    seeded = 0
                    if name == "schemaless-known":  # earlier batches set the table's columns (not timed)
                        seed = table_config(
                            broker.bootstrap_servers, registry.url, name, topic["topic"], table, SEED_RECORDS // 2
                        )
                        for _ in range(2):  # then one that keeps them: a table in its steady state
                            seeded += run_table(spark, seed, seed.tables[0], work / "state").rows_written
                    run = stage.run(lambda config=config: run_table(spark, config, config.tables[0], work / "state"))
                    result = run["result"]
                    rows = topic["records"] - seeded
                    assert result.rows_written == rows and result.records_failed == 0, result.describe()
                    runs[name].append({**run, "read_path": result.read_path, "records": rows})
                print(f"round {round_}/{args.rounds}: " + ", ".join(f"{k} {v[-1]['seconds']:.1f} s" for k, v in runs.items()), flush=True)  # fmt: skip
            spark.stop()
        finally:
            registry.stop()
            broker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    warm_up = {name: round(items.pop(0)["seconds"], 2) for name, items in runs.items()}
    formats = [summary(name, runs[name], produced[name], cores) for name in chosen]
    by_name = {f["format"]: f for f in formats}
    avro = by_name.get("avro")
    for item in formats:
        if avro:
            item["vs_avro_mib_per_s"] = round(item["mib_per_s"] / avro["mib_per_s"], 3)
            item["vs_avro_records_per_s"] = round(item["records_per_s"] / avro["records_per_s"], 3)
    report = {
        "machine": f"{platform.machine()} {platform.system()}, {cores} cores, shared: broker, registry, Spark and "
                   "other users' processes run on them",
        "cores": cores,
        "load_avg_at_start": [round(x, 1) for x in load_before],
        "load_avg_at_end": [round(x, 1) for x in os.getloadavg()],
        "partitions": PARTITIONS,
        "formats": formats,
        "warm_up_round_seconds": warm_up,
    }  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.output}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{args.output}.md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    lines = [
        "# Formats benchmark",
        "",
        f"{report['machine']}. Load average (1, 5, 15 min) at start {report['load_avg_at_start']}, at end "
        f"{report['load_avg_at_end']}. The `trades` records of bench/throughput.py in each format (bench/formats.py "
        f"says how each is written), {report['partitions']} partitions, lz4-compressed batches; icefloe `run_table` "
        "into a fresh table per round in one warm SparkSession, the formats interleaved round by round. MiB = key + "
        "value bytes as each format writes them; per core = MiB/s / cores; Spark CPU = CPU seconds of Spark's JVM and "
        "its Python workers. Ratios are to Avro in the same run.",
        "",
        "| format | read path | records | B/record | runs | seconds (median) | MiB/s | MiB/s per core | records/s | "
        "vs Avro (MiB/s) | vs Avro (records/s) | Spark CPU s | MiB per Spark CPU-s | load (1 min) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *[f"| {f['format']} | {', '.join(f['read_path'])} | {f['records']:,} | {f['avg_record_bytes']:.0f} | {f['runs']} | "
          f"{f['seconds_median']} | {f['mib_per_s']} | {f['mib_per_s_per_core']} | {f['records_per_s']:,} | "
          f"{f.get('vs_avro_mib_per_s', '')} | {f.get('vs_avro_records_per_s', '')} | {f['spark_cpu_s']} | "
          f"{f['mib_per_spark_cpu_s']} | {f['load_1m']} |" for f in report["formats"]],
        "",
        "Warm-up round before these (not in the medians): "
        + ", ".join(f"{k} {v} s" for k, v in report["warm_up_round_seconds"].items()) + ".",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
