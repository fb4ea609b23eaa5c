"""Freshness benchmark: produce-to-queryable latency of continuous mode, and file counts before/after maintenance.

A producer writes at a steady rate while `icefloe run --continuous` runs in its own process. An independent reader
(pyiceberg on the same catalog) polls the table: when a new snapshot appears, every record below the offsets it
commits has become queryable, and its latency is (first poll that sees it) - (producer's delivery time).
Results: bench/results/freshness.{json,md}. Run: `.venv/bin/python bench/freshness.py [--seconds 60 --rate 500]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from confluent_kafka import Producer
from process_stats import tree_rss_kib

from icefloe_dev.kafka_broker import KafkaBroker
from icefloe_dev.readers import pyiceberg_catalog

RESULTS = Path(__file__).parent / "results"
TOPIC = "bench_fresh"


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants (the Python driver and Spark's JVM)."""
    return tree_rss_kib(pid) / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rate", type=int, default=500, help="records per second")
    parser.add_argument("--refresh", default="2s")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefloe-fresh-"))
    delivered: dict[tuple[int, int], float] = {}
    try:
        with KafkaBroker(work / "kafka") as broker:
            broker.create_topic(TOPIC, 2)
            config = work / "Pulumi.fresh.yaml"
            config.write_text(yaml.safe_dump({"config": {
                "icefloe:sourceClusters": [{"name": "bench", "bootstrapServers": broker.bootstrap_servers}],
                "icefloe:tables": [{"sourceCluster": "bench", "topic": TOPIC, "format": "json", "refresh": args.refresh,
                                    "continuous": True, "maintenance": {"enabled": False},
                                    "schema": {"fields": [{"name": "n", "type": "long"}, {"name": "note", "type": "string"}]}}],
            }}))  # fmt: skip
            job = subprocess.Popen(
                [sys.executable, "-m", "icefloe.cli", "run", "--config", str(config), "--continuous", "--state-dir", str(work)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "ICEFLOE_SPARK_MASTER": "local[2]"},
            )  # fmt: skip
            producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})

            def on_delivery(error, msg) -> None:
                if error is None:
                    delivered[(msg.partition(), msg.offset())] = time.time()

            # Wait for the job's first (empty) commit: Spark start is not part of freshness.
            table_name = f"bench.{TOPIC}"
            while not pyiceberg_catalog(work).table_exists(table_name):
                time.sleep(0.5)
            samples, latencies, seen, stop = [], [], {}, threading.Event()

            def poll() -> None:
                last = None
                while not stop.is_set():
                    table = pyiceberg_catalog(work).load_table(table_name)
                    snapshot = table.current_snapshot()
                    if snapshot is not None and snapshot.snapshot_id != last:
                        last, now = snapshot.snapshot_id, time.time()
                        offsets = json.loads(snapshot.summary.additional_properties.get("icefloe.offsets", "{}"))
                        for partition, end in offsets.items():
                            for offset in range(seen.get(int(partition), 0), end):
                                if (int(partition), offset) in delivered:
                                    latencies.append(now - delivered[(int(partition), offset)])
                            seen[int(partition)] = max(seen.get(int(partition), 0), end)
                        summary = snapshot.summary.additional_properties
                        samples.append({"t": round(now - started, 1), "data_files": int(summary.get("total-data-files", 0)),
                                        "bytes": int(summary.get("total-files-size", 0)),
                                        "job_rss_mib": round(tree_rss_mib(job.pid))})  # fmt: skip
                    time.sleep(0.2)

            started = time.time()
            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            sent = 0
            while time.time() - started < args.seconds:
                due = int((time.time() - started) * args.rate)
                while sent < due:
                    producer.produce(
                        TOPIC, value=json.dumps({"n": sent, "note": "x" * 100}).encode(), on_delivery=on_delivery
                    )
                    sent += 1
                producer.poll(0.01)
            producer.flush(30)
            deadline = time.time() + 60
            while sum(seen.values()) < sent and time.time() < deadline:
                time.sleep(0.5)
            stop.set()
            poller.join()
            job.send_signal(signal.SIGTERM)
            job.wait(120)

            before = samples[-1] if samples else {}
            maintained = subprocess.run(
                [sys.executable, "-m", "icefloe.cli", "maintain", "--config", str(config), "--json", "--state-dir", str(work)],
                capture_output=True, text=True, env={**os.environ, "ICEFLOE_SPARK_MASTER": "local[2]"},
            )  # fmt: skip
            maintenance = json.loads(maintained.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report = {
        "rate_records_per_s": args.rate,
        "seconds": args.seconds,
        "refresh": args.refresh,
        "records": sent,
        "records_seen": sum(seen.values()),
        "latency_s": {
            "p50": round(percentile(latencies, 0.50), 2),
            "p95": round(percentile(latencies, 0.95), 2),
            "p99": round(percentile(latencies, 0.99), 2),
            "max": round(max(latencies), 2),
            "mean": round(statistics.fmean(latencies), 2),
        },
        "files_over_time": samples,
        "before_maintenance": {"data_files": before.get("data_files"), "bytes": before.get("bytes")},
        "after_maintenance": {
            "data_files": maintenance["data_files_after"],
            "snapshots": maintenance["snapshots_after"],
        },
        "job_rss_mib": {
            "first_commit": samples[0]["job_rss_mib"] if samples else None,
            "last_commit": samples[-1]["job_rss_mib"] if samples else None,
            "max": max((s["job_rss_mib"] for s in samples), default=None),
        },
        "machine": f"{os.cpu_count()} cores shared by broker, producer, Spark and the reader",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "freshness.json").write_text(json.dumps(report, indent=2) + "\n")
    lat = report["latency_s"]
    lines = [
        "# Freshness benchmark",
        "",
        f"{sent:,} JSON records at {args.rate}/s for {args.seconds}s into 2 partitions, continuous mode with refresh "
        f"{args.refresh}; {report['machine']}.",
        "",
        "| produce -> queryable | p50 | p95 | p99 | max |",
        "|---|---:|---:|---:|---:|",
        f"| seconds | {lat['p50']} | {lat['p95']} | {lat['p99']} | {lat['max']} |",
        "",
        f"Data files: {report['before_maintenance']['data_files']} before maintenance, "
        f"{report['after_maintenance']['data_files']} after (snapshots after: {report['after_maintenance']['snapshots']}).",
        "",
        "File count over time (seconds since start: data files): "
        + ", ".join(f"{s['t']}: {s['data_files']}" for s in samples[:: max(1, len(samples) // 12)]),
        "",
        f"Continuous job memory (driver + JVM RSS, MiB): {report['job_rss_mib']['first_commit']} at the first commit, "
        f"{report['job_rss_mib']['last_commit']} at the last, max {report['job_rss_mib']['max']} "
        f"(a {args.seconds}s run: a trend, not an hours-long soak).",
    ]
    (RESULTS / "freshness.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
