"""`bench/cold_start.py --small N`: the fixed cost of a fresh `icefloe run --once` on a small batch and on none.

Per round and runtime (this tree's, and `--base-runtime`'s when given, alternating), one new table takes three fresh
runs: `new` (its first N records: the table is created, maintenance is due), `small` (the next N), `empty` (nothing
new). Each run's CPU seconds are its cpuacct cgroup's (the Python process, spark-submit's JVMs and the Python workers);
its Spark event log gives the jobs it ran; its log's timestamps split its wall time into phases:
  start     process start to the batch's first planning line (imports, JVM and SparkSession, catalog, registry,
            Kafka offsets, sizing; for `empty` up to the up-to-date result)
  write     to "publishing branch" (the Spark write and its job)
  publish   to "published branch" (the checks and main's fast-forward)
  rest      to the process's exit (maintenance when due, the JVM's shutdown)
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml
from throughput import PARTITIONS, TRADES, trades

HERE = Path(__file__).resolve().parent
KINDS = ("new", "small", "empty")
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
# The log lines that end the phases (`icefloe.materialize.batch`, `icefloe.commit.branch`)
MARKS = (
    ("start", (" records from ", "up to date")),
    ("write", ("publishing branch",)),
    ("publish", ("published branch",)),
)


def stack(path: Path, bootstrap: str, registry: str, topic: str, table: str, records: int) -> Path:
    path.write_text(yaml.safe_dump({"config": {
        "icefloe:sourceClusters": [{"name": "bench", "bootstrapServers": bootstrap, "schemaRegistry": {"url": registry}}],
        "icefloe:tables": [{"sourceCluster": "bench", "topic": topic, "table": table, "maxRecordsPerRun": records,
                            "runTimeout": "3d"}],
    }}))  # fmt: skip
    return path


def cgroup_cpu_s(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


def fresh_run(config: Path, state: Path, runtime: Path, group: Path, events: Path, jvm: str) -> dict:
    """One `icefloe run --once --json` in `group`: wall and CPU seconds, its result, phases and Spark jobs."""
    shutil.rmtree(events, ignore_errors=True)
    events.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(runtime), os.environ.get("PYTHONPATH", "")]),
           "SPARK_SUBMIT_OPTS": jvm,
           "PYSPARK_SUBMIT_ARGS": f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={events.as_uri()} "
                                  "pyspark-shell"}  # fmt: skip
    command = [sys.executable, "-m", "icefloe.cli", "run", "--once", "--json", "--config", str(config),
               "--state-dir", str(state)]  # fmt: skip
    cpu, load, started_at, started = cgroup_cpu_s(group), os.getloadavg()[0], time.time(), time.monotonic()
    process = subprocess.run(["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *command], env=env,
                             capture_output=True, text=True, timeout=1800)  # fmt: skip
    seconds = time.monotonic() - started
    time.sleep(0.5)  # a JVM thread or Python worker still exiting
    cpu = cgroup_cpu_s(group) - cpu
    if process.returncode != 0:
        raise RuntimeError(f"icefloe run exited {process.returncode}: {process.stderr[-3000:]}")
    result = json.loads(process.stdout.strip().splitlines()[-1])
    return {"seconds": round(seconds, 2), "cpu_s": round(cpu, 2), "load_1m": round(load, 1),
            "status": result["status"], "rows_written": result["rows_written"],
            "phases": phases(process.stderr, started_at, seconds), "jobs": spark_jobs(events)}  # fmt: skip


def phases(log: str, started_at: float, seconds: float) -> dict[str, float]:
    """Seconds per phase (see the module's docstring) from the log lines' timestamps."""
    found, last = {}, started_at
    for name, markers in MARKS:
        for line in log.splitlines():
            if any(marker in line for marker in markers) and line[:4].isdigit():
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found[name], last = round(at - last, 2), at
                break
    found["rest"] = round(started_at + seconds - last, 2)
    return found


def spark_jobs(events: Path) -> list[dict]:
    """The jobs of the run's event log: what each is for (its first stage's name, or its description) and ms."""
    jobs: dict[int, dict] = {}
    for path in events.iterdir():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerJobStart":
                stage = event["Stage Infos"][0]["Stage Name"]
                description = (event.get("Properties") or {}).get("spark.job.description") or ""
                jobs[event["Job ID"]] = {"job": description.split(" (")[0] or stage, "stage": stage,
                                         "started": event["Submission Time"]}  # fmt: skip
            elif event["Event"] == "SparkListenerJobEnd" and event["Job ID"] in jobs:
                job = jobs[event["Job ID"]]
                job["ms"] = event["Completion Time"] - job.pop("started")
    return [jobs[key] for key in sorted(jobs)]


def bench_small(records: int, rounds: int, base_runtime: str | None, jvm: str, results: Path, result_name: str) -> None:
    from icefloe_dev.kafka_broker import KafkaBroker
    from icefloe_dev.processes import start_together
    from icefloe_dev.producer import produce_avro_quickly
    from icefloe_dev.schema_registry import SchemaRegistry

    runtimes = {"this": HERE.parent / "runtime"} | ({"base": Path(base_runtime).resolve()} if base_runtime else {})
    work = Path(tempfile.mkdtemp(prefix="icefloe-cold-small-"))
    group = CGROUP_ROOT / f"icefloe-bench-{os.getpid()}"
    group.mkdir()
    load_before = os.getloadavg()
    report: dict = {"records": records, "rounds": rounds, "jvm": jvm, "runtimes": {}}
    runs: dict[str, dict[str, list[dict]]] = {name: {kind: [] for kind in KINDS} for name in runtimes}
    try:
        broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
        start_together(broker, registry)
        try:
            broker.create_topic("small", PARTITIONS)
            produce_avro_quickly(broker.bootstrap_servers, registry.url, "small", TRADES, trades(2 * records))
            for round_ in range(rounds):
                order = list(runtimes) if round_ % 2 == 0 else list(runtimes)[::-1]
                for name in order:
                    table = f"small_{name}_{round_}"
                    config = stack(work / f"{table}.yaml", broker.bootstrap_servers, registry.url, "small", table,
                                   records)  # fmt: skip
                    for kind in KINDS:
                        run = fresh_run(config, work / "state", runtimes[name], group, work / "events", jvm)
                        expected = 0 if kind == "empty" else records
                        assert run["rows_written"] == expected, (kind, run)
                        runs[name][kind].append(run)
                        print(f"round {round_ + 1} {name} {kind}: {run['seconds']:.1f} s, {run['cpu_s']:.1f} CPU s "
                              f"(load {run['load_1m']}), {len(run['jobs'])} Spark jobs, {run['phases']}", flush=True)  # fmt: skip
        finally:
            registry.stop()
            broker.stop()
    finally:
        group.rmdir()
        shutil.rmtree(work, ignore_errors=True)
    for name, kinds in runs.items():
        report["runtimes"][name] = {kind: summary(found) for kind, found in kinds.items()}
    report |= {
        "runtime_dirs": {name: str(path) for name, path in runtimes.items()},
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, shared",
        "java": subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0],
        "load_avg_at_start": [round(x, 1) for x in load_before],
        "load_avg_at_end": [round(x, 1) for x in os.getloadavg()],
    }
    (results / f"{result_name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (results / f"{result_name}.md").write_text(markdown(report))
    print(markdown(report))


def summary(runs: list[dict]) -> dict:
    return {
        "seconds": [r["seconds"] for r in runs],
        "cpu_s": [r["cpu_s"] for r in runs],
        "load_1m": [r["load_1m"] for r in runs],
        "seconds_median": round(statistics.median(r["seconds"] for r in runs), 1),
        "cpu_s_median": round(statistics.median(r["cpu_s"] for r in runs), 1),
        "phases_median": {
            phase: round(statistics.median(r["phases"].get(phase, 0.0) for r in runs), 1) for phase in runs[0]["phases"]
        },
        "spark_jobs": [len(r["jobs"]) for r in runs],
        "jobs_of_first_run": runs[0]["jobs"],
    }


def markdown(report: dict) -> str:
    names = list(report["runtimes"])
    lines = [
        "# Cold start of a small batch: the fixed cost of a fresh `icefloe run --once`",
        "",
        f"{report['machine']}; {report['java']}. Load average (1, 5, 15 min) at start {report['load_avg_at_start']}, "
        f"at end {report['load_avg_at_end']}. Run niced beside other users' work: compare the runtimes of this run "
        "(they alternate within each round); CPU seconds are the steadier figure.",
        "",
        f"Per round, a new table takes three fresh runs of {report['records']:,} trades (~200 B Avro, 4 partitions): "
        "`new` (its first batch: the table is created and maintenance is due), `small` (the next batch), `empty` "
        f"(nothing new). {report['rounds']} rounds, medians; JVM options `{report['jvm'] or '-'}`; each run writes a "
        "Spark event log (how its jobs are counted). Runtimes: "
        + ", ".join(f"`{name}` {report['runtime_dirs'][name]}" for name in names)
        + ".",
        "",
        "| run | runtime | wall s | CPU s | Spark jobs | phases s (start / write / publish / rest) | load (1 min) |",
        "|---|---|---:|---:|---|---|---|",
    ]
    for kind in KINDS:
        for name in names:
            found = report["runtimes"][name][kind]
            phases = " / ".join(str(found["phases_median"].get(p, "-")) for p in ("start", "write", "publish", "rest"))
            lines.append(
                f"| {kind} | {name} | {found['seconds_median']} | {found['cpu_s_median']} | {found['spark_jobs']} | "
                f"{phases} | {found['load_1m']} |"
            )
    if len(names) == 2:
        lines += ["", "This runtime against the base, medians:", ""]
        for kind in KINDS:
            this, base = report["runtimes"]["this"][kind], report["runtimes"]["base"][kind]
            lines.append(
                f"- {kind}: wall {this['seconds_median'] / base['seconds_median']:.2f}x, CPU "
                f"{this['cpu_s_median'] / base['cpu_s_median']:.2f}x ({base['cpu_s_median']} -> "
                f"{this['cpu_s_median']} CPU s)"
            )
    lines += ["", "Spark jobs of each runtime's first `new` run (what each is for, ms):", ""]
    for name in names:
        jobs = report["runtimes"][name]["new"]["jobs_of_first_run"]
        lines.append(f"- {name}: " + "; ".join(f"{j['job']} ({j.get('ms', '?')})" for j in jobs))
    return "\n".join(lines) + "\n"
