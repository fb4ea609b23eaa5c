"""Schemaless JSON: what a batch that adds a column costs beside one of known shapes, in one warm process.

Two topics of the same 201,000 `trades` as compact JSON (4 partitions); in the second, the last record carries one
key more. Each round, for each topic, a fresh table takes the first 1,000 records in two batches (its columns set,
then kept; untimed), then the other 200,000 in one timed batch: the known table's batch, and the batch whose last record adds a column (a table
whose columns are assumed writes the batch once, finds the new key among the records left to Python, drops that
attempt and reads the batch the checked way). Results: bench/results/NAME.{json,md}. To compare with other code,
run it with that checkout's `runtime` on PYTHONPATH (this file imports only bench/ and devtools/ beside it).
Run: `.venv/bin/python bench/schemaless_new_column.py [--rounds R] [--output NAME]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from throughput import Stage

from formats import json_trades, produce_raw, table_config
from icefloe.operate.runner import run_table
from icefloe.session import spark_session
from icefloe_dev.kafka_broker import KafkaBroker
from icefloe_dev.processes import start_together
from icefloe_dev.schema_registry import SchemaRegistry

RESULTS = Path(__file__).parent / "results"
RECORDS, SEED = 200_000, 1_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds, after one warm-up round")
    parser.add_argument("--output", default="schemaless_new_column", help="results file name")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefloe-new-column-"))
    broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
    start_together(broker, registry)
    runs: dict[str, list[dict]] = {"known": [], "new_column": []}
    load = [os.getloadavg()[0]]
    try:
        for kind in runs:
            broker.create_topic(f"t_{kind}", 4)
            records = list(json_trades(RECORDS + SEED))
            if kind == "new_column":
                key, value = records[-1]
                records[-1] = (key, json.dumps({**json.loads(value), "venue": "XNYS"}).encode())
            produce_raw(broker.bootstrap_servers, f"t_{kind}", records)
        spark = spark_session(
            table_config(broker.bootstrap_servers, registry.url, "avro", "none", "none", 1).catalog, work
        )
        stage = Stage(
            int(spark._jvm.java.lang.ProcessHandle.current().pid()), broker.pid, spark._jvm.java.lang.System.gc
        )
        for round_ in range(args.rounds + 1):  # round 0 warms the code paths up: not reported
            for kind, measured in runs.items():
                table = f"{kind}_{round_}"
                seed = table_config(broker.bootstrap_servers, registry.url, "schemaless", f"t_{kind}", table, SEED // 2)
                for _ in range(2):  # the columns set, then kept: a table in its steady state
                    run_table(spark, seed, seed.tables[0], work)
                config = table_config(broker.bootstrap_servers, registry.url, "schemaless", f"t_{kind}", table, RECORDS)
                run = stage.run(lambda config=config: run_table(spark, config, config.tables[0], work))
                assert run["result"].rows_written == RECORDS, run["result"].describe()
                if round_:
                    measured.append({"seconds": round(run["seconds"], 2), "spark_cpu_s": round(run["spark_cpu_s"], 2)})
        spark.stop()
    finally:
        registry.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    load.append(os.getloadavg()[0])
    medians = {kind: statistics.median(r["seconds"] for r in measured) for kind, measured in runs.items()}
    report = {"records": RECORDS, "runs": runs, "median_seconds": medians, "load_1m": [round(x, 1) for x in load],
              "new_column_vs_known": round(medians["new_column"] / medians["known"], 2)}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.output}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Schemaless JSON: a batch that adds a column beside one of known shapes (bench/schemaless_new_column.py)",
        "",
        f"{RECORDS:,} trades a batch into a table with columns, warm process, load (1 min) {report['load_1m']}.",
        "",
        "| batch | seconds / Spark CPU s, each round | median s |",
        "|---|---|---:|",
        *[f"| {kind} | {_rounds(runs[kind])} | {medians[kind]} |" for kind in runs],
        "",
        f"A batch that adds a column takes {report['new_column_vs_known']}x the known table's batch.",
    ]  # fmt: skip
    (RESULTS / f"{args.output}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _rounds(measured: list[dict]) -> str:
    return ", ".join(f"{r['seconds']} / {r['spark_cpu_s']}" for r in measured)


if __name__ == "__main__":
    main()
