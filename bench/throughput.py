"""Throughput benchmark: how close icefloe gets to its source limit (Kafka consume) and sink limit (Parquet write).

Produces N Avro records of about 200 bytes to the local Apache Kafka broker, then measures in one run:
  (a) consume-only with confluent-kafka, one Python consumer: the source limit;
  (b) icefloe end to end (plan, read, decode, convert, Spark write to Iceberg, commit), Spark start excluded;
  (c) pyarrow writing the same decoded rows to zstd Parquet: the sink limit.
Results go to bench/results/throughput.json and .md. Run: `.venv/bin/python bench/throughput.py [--records N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, TopicPartition

from icefloe.conversion import BatchBuilder, ValueConverter
from icefloe.decoding import build_decoder, decoder_spec
from icefloe_dev import stock_trades
from icefloe_dev.kafka_broker import KafkaBroker
from icefloe_dev.processes import start_together
from icefloe_dev.schema_registry import SchemaRegistry
from icefloe_dev.producer import produce_avro
from icefloe.runner import run_table
from icefloe.schema_mapping import avro_value_fields, batch_struct, table_struct
from icefloe.session import spark_session
from icefloe.spec import parse_config

RESULTS = Path(__file__).parent / "results"
TOPIC = "bench_trades"
# Stock trades plus a memo, so a record is ~200 bytes on the wire like a typical business event.
SCHEMA = json.dumps(
    {**json.loads(stock_trades.SCHEMA), "fields": [*json.loads(stock_trades.SCHEMA)["fields"], {"name": "memo", "type": "string"}]}
)


def records(count: int):
    memo = "settlement T+2; venue XNAS; algo VWAP; desk equities-emea; " * 4
    for key, value in stock_trades.trades(count):
        yield key, {**value, "memo": memo[: 150 + value["quantity"] % 20]}


def consume_all(bootstrap: str, partitions: int) -> tuple[int, int, list]:
    """Every record, raw: the most a single Python consumer can pull from this broker."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.partition.eof": True,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    done, count, size, payloads = set(), 0, 0, []
    while len(done) < partitions:
        for msg in consumer.consume(10_000, timeout=1.0):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition())
                continue
            value = msg.value()
            count += 1
            size += len(value) + len(msg.key() or b"")
            payloads.append(value)
    consumer.close()
    return count, size, payloads


def figure(name: str, count: int, size: int, seconds: float, cores: int) -> dict:
    return {
        "stage": name,
        "records": count,
        "seconds": round(seconds, 3),
        "records_per_s": round(count / seconds),
        "mib_per_s": round(size / seconds / 2**20, 2),
        "records_per_s_per_core": round(count / seconds / cores),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="icefloe-bench-"))
    try:
        broker, registry = KafkaBroker(work / "kafka"), SchemaRegistry(work / "registry")
        start_together(broker, registry)
        try:
            broker.create_topic(TOPIC, args.partitions)
            started = time.monotonic()
            produce_avro(broker.bootstrap_servers, registry.url, TOPIC, SCHEMA, records(args.records),
                         total=args.records, progress=True)  # fmt: skip
            produce_s = time.monotonic() - started

            started = time.monotonic()
            count, size, payloads = consume_all(broker.bootstrap_servers, args.partitions)
            source = figure("(a) consume only (confluent-kafka, 1 consumer)", count, size, time.monotonic() - started, cores)
            assert count == args.records, f"consumed {count} of {args.records}"

            config = parse_config({
                "sourceClusters": [{"name": "bench", "bootstrapServers": broker.bootstrap_servers,
                                    "schemaRegistry": {"url": registry.url}}],
                "tables": [{"sourceCluster": "bench", "topic": TOPIC}],
            })  # fmt: skip
            table = config.tables[0]
            started = time.monotonic()
            spark = spark_session(config.catalog, work / "state")
            spark_start_s = time.monotonic() - started
            started = time.monotonic()
            result = run_table(spark, config, table, work / "state")
            icefloe = figure("(b) icefloe end to end (Spark start excluded)", result.rows_written, size, time.monotonic() - started, cores)
            assert result.rows_written == args.records
            spark.stop()

            # (c) decode once (untimed), then time only the Parquet write of the same rows.
            spec = decoder_spec(table, config.cluster(table.source_cluster))
            fields = avro_value_fields(spec.schema_str, TOPIC)
            decode, struct = build_decoder(spec), table_struct(fields)
            convert = ValueConverter(type(struct)(fields), strict=False)
            builder = BatchBuilder(batch_struct(struct), [f.name for f in fields])
            batches = []
            started = time.monotonic()
            for offset, payload in enumerate(payloads):
                builder.add(convert(decode(payload)), TOPIC, 0, offset, 0, "CreateTime", None, None)
                if len(builder) == 50_000:
                    batches.append(builder.build())
            if len(builder):
                batches.append(builder.build())
            decode_only = figure("(d) decode + convert + Arrow, one Python process (per-core ceiling)", len(payloads), size,
                                 time.monotonic() - started, 1)  # fmt: skip
            arrow_table = pa.Table.from_batches(batches).select(struct.fieldNames())  # the table's columns
            started = time.monotonic()
            pq.write_table(arrow_table, work / "sink.parquet", compression="zstd")
            sink = figure("(c) pyarrow Parquet write, zstd (sink limit)", arrow_table.num_rows, size, time.monotonic() - started, cores)
        finally:
            registry.stop()
            broker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report = {
        "records": args.records,
        "partitions": args.partitions,
        "avg_record_bytes": round(size / count, 1),
        "cores": cores,
        "machine": f"{platform.machine()} {platform.system()}, {cores} cores; broker, producer and reader share them",
        "produce_s": round(produce_s, 2),
        "spark_start_s": round(spark_start_s, 2),
        "stages": [source, icefloe, sink, decode_only],
        "ratios": {
            "icefloe_vs_source": round(icefloe["records_per_s"] / source["records_per_s"], 3),
            "icefloe_vs_sink": round(icefloe["records_per_s"] / sink["records_per_s"], 3),
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "throughput.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Throughput benchmark",
        "",
        f"{args.records:,} Avro records, ~{report['avg_record_bytes']} B each, {args.partitions} partitions, "
        f"{report['machine']}. Spark session start {report['spark_start_s']} s (excluded).",
        "",
        "| stage | records/s | MiB/s | records/s per core | seconds |",
        "|---|---:|---:|---:|---:|",
        *[f"| {s['stage']} | {s['records_per_s']:,} | {s['mib_per_s']} | {s['records_per_s_per_core']:,} | {s['seconds']} |"
          for s in report["stages"]],
        "",
        f"icefloe / source limit: {report['ratios']['icefloe_vs_source']}; icefloe / sink limit: "
        f"{report['ratios']['icefloe_vs_sink']}. Stage (d) runs on one core, so its per-core figure is its rate.",
    ]  # fmt: skip
    (RESULTS / "throughput.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
