"""Throughput of the deployed job on a Spark standalone cluster (two workers of one core each) against `local[2]`.

The job is the one `pulumi up` deploys (icefloe_dev.spark_cluster.DeployedStack: the real bundle and jars, the job
config on a moto server, Glue on the moto server as the catalog), submitted with `spark-submit` either to the
cluster (driver, and two executor JVMs each with its own Python workers) or to `local[2]` (driver and executor one
JVM, the same two cores). The difference is what crossing processes costs: task results, shuffles and broadcasts
serialized between JVMs, Python workers per executor, and the archive unpacked per executor.

For each shape (`avro`: trades through the JVM read path; `json`: the same trades as JSON through the Python read
path) N records go to a 4-partition topic; then rounds alternate cluster and local[2], each run into a fresh table
(one per run, all reading the same topic), so load from other users hits both alike. Reported per run: the batch's
own seconds (the runtime's `seconds`: plan, read, decode, write, commit; Spark start excluded), the whole
submission's wall seconds, and the load average. Ratios are cluster / local[2] medians of the same run.
Results: bench/results/cluster.{json,md}. Run: `.venv/bin/python bench/cluster.py [--records N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from confluent_kafka import Producer

from icefloe.session import jvm_lib
from icefloe_dev import stock_trades
from icefloe_dev.demo import local_services
from icefloe_dev.moto_server import REGION, MotoServer
from icefloe_dev.producer import produce_avro
from icefloe_dev.spark_cluster import DeployedStack, SparkCluster

RESULTS = Path(__file__).parent / "results"
PARTITIONS = 4
JSON_SCHEMA = {
    "fields": [
        {"name": "side", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "symbol", "type": "string"},
        {"name": "price", "type": "int"},
        {"name": "account", "type": "string"},
        {"name": "userid", "type": "string"},
        {"name": "event_time", "type": "timestamptz"},
    ]
}
SHAPES = {"avro": {}, "json": {"format": "json", "schema": JSON_SCHEMA}}
MASTERS = ("cluster", "local[2]")
LOCAL_DRIVER_MEMORY = "2g"  # local[2]'s one JVM holds what the cluster's driver (1g) and executors (2 x 768m) do


def produce(shape: str, broker, registry, topic: str, records: int) -> None:
    if shape == "avro":
        produce_avro(broker.bootstrap_servers, registry.url, topic, stock_trades.SCHEMA, stock_trades.trades(records))
        return
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 20, "compression.type": "lz4"})
    for key, trade in stock_trades.trades(records):
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=json.dumps(stock_trades.as_json(trade)).encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def run_job(stack: DeployedStack, table: str, master: str) -> dict:
    extra = {"spark.driver.memory": LOCAL_DRIVER_MEMORY} if master.startswith("local") else {}
    job = stack.submit(table, master, extra)
    load = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(job.command, cwd=job.cwd, env=job.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=1800)  # fmt: skip
    wall = time.monotonic() - started
    (job.cwd / "output.log").write_text(done.stdout)
    job.remove_copies()
    if done.returncode != 0:
        raise SystemExit(f"{table} on {master} failed:\n{done.stdout[-4000:]}")
    result = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"data_lost"'))
    return {"table": table, "master": master, "status": result["status"], "rows": result["rows_written"],
            "batch_seconds": round(result["seconds"], 2), "wall_seconds": round(wall, 2),
            "load_1min": [round(load, 1), round(os.getloadavg()[0], 1)]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from icefloe_infra.bundle import build_bundle
    from icefloe_infra.dry_run import run_program

    started_load = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-cluster-"))
    runs: list[dict] = []
    with local_services(root) as (broker, registry), MotoServer(root / "moto") as moto:
        topics = {shape: f"bench_cluster_{shape}" for shape in SHAPES}
        for shape, topic in topics.items():
            broker.create_topic(topic, PARTITIONS)
            produce(shape, broker, registry, topic, args.records)
        tables = [
            {"sourceCluster": "local", "topic": topic, "table": f"{shape}_{master[:5]}_{r}".replace("[", ""),
             "maintenance": {"enabled": False}, **SHAPES[shape]}
            for shape, topic in topics.items() for r in range(args.rounds) for master in MASTERS
        ]  # fmt: skip
        path = root / "Pulumi.bench.yaml"
        path.write_text(yaml.safe_dump({"config": {
            "aws:region": REGION, "icefloe:owner": "bench@example.com", "icefloe:tables": tables,
            "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers,
                                        "schemaRegistry": {"url": registry.url}}],
        }}))  # fmt: skip
        program = run_program(path, build_bundle, jvm_lib() / "spark")
        stack = DeployedStack(program, moto, root)
        with SparkCluster(root / "spark", workers=2, cores=1, env=moto.aws_env()) as cluster:
            for shape in SHAPES:
                for r in range(args.rounds):
                    for master in MASTERS:
                        table = f"local.{shape}_{master[:5]}_{r}".replace("[", "")
                        run = run_job(stack, table, cluster.url if master == "cluster" else master)
                        cluster.remove_finished_applications()
                        run |= {"shape": shape, "master": master}
                        print(json.dumps(run), flush=True)
                        runs.append(run)
                        write_results(runs, args, started_load, os.getloadavg())  # kept if a later run fails
    shutil.rmtree(root)  # the broker's log, the tables, the jobs' outputs: kept only when a run failed


def write_results(runs: list[dict], args, started_load, ended_load) -> None:
    summary = {}
    for shape in SHAPES:
        medians = {}
        if {r["master"] for r in runs if r["shape"] == shape} != set(MASTERS):
            continue  # not measured on both yet
        for master in MASTERS:
            mine = [r for r in runs if r["shape"] == shape and r["master"] == master]
            medians[master] = {
                key: statistics.median(r[key] for r in mine) for key in ("batch_seconds", "wall_seconds")
            }
            medians[master]["records_per_second"] = round(args.records / medians[master]["batch_seconds"])
        summary[shape] = {
            "medians": medians,
            "cluster_vs_local_batch_seconds": round(medians["cluster"]["batch_seconds"] / medians["local[2]"]["batch_seconds"], 2),
            "cluster_vs_local_wall_seconds": round(medians["cluster"]["wall_seconds"] / medians["local[2]"]["wall_seconds"], 2),
        }  # fmt: skip
    document = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, shared",
        "load_average_start": [round(v, 1) for v in started_load],
        "load_average_end": [round(v, 1) for v in ended_load],
        "records": args.records,
        "rounds": args.rounds,
        "partitions": PARTITIONS,
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cluster.json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [
        "# The deployed job on a standalone cluster vs local[2]",
        "",
        f"{document['machine']}; load average (1, 5, 15 min) at start {document['load_average_start']}, at end "
        f"{document['load_average_end']}. {args.records:,} `stock_trades` records per shape, {PARTITIONS} partitions, "
        "one fresh table per run. Cluster: a master and two workers of one core each, executors of 1 core / 768 MiB, "
        f"driver 1 GiB; local[2]: one JVM of {LOCAL_DRIVER_MEMORY}. Batch seconds: the runtime's own (plan, read, "
        "decode, write, commit); wall: the whole spark-submit (JVM and Python start, executors, the archive).",
        "",
        "| shape | master | runs | batch s (median) | records/s | wall s (median) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for shape, data in summary.items():
        for master, median in data["medians"].items():
            lines.append(f"| {shape} | {master} | {args.rounds} | {median['batch_seconds']} | "
                         f"{median['records_per_second']:,} | {median['wall_seconds']} |")  # fmt: skip
    lines += ["", "Ratios cluster / local[2] (same run):", ""]
    for shape, data in summary.items():
        lines.append(
            f"- {shape}: batch {data['cluster_vs_local_batch_seconds']}, wall {data['cluster_vs_local_wall_seconds']}"
        )
    lines += ["", "Runs in order (load = 1-minute load average before and after):", ""]
    for run in runs:
        lines.append(f"- {run['shape']} {run['master']}: batch {run['batch_seconds']} s, wall {run['wall_seconds']} s, "
                     f"{run['rows']} rows, load {run['load_1min']}")  # fmt: skip
    (RESULTS / "cluster.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
