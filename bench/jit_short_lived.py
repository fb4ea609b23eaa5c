"""Where a fresh `icefloe run --once` spends its JVM's CPU, by thread: the JIT's compiler threads against the tasks.

A scheduled job is a fresh process: its driver JVM compiles the code a batch runs while running it. Each round runs,
for each variant, `icefloe run --once` into a table an earlier run created (1,000 trades), on a topic of its own, as
a fresh process, and reads the JVM's per-thread CPU (/proc/<pid>/task/*/stat) around the batch (`run_table`, so the
JVM's start is left out): C2 and C1 compiler threads, the tasks ("Executor task launch worker"), the driver's py4j
thread, GC. Variants alternate in each round:
  - `short-lived`: the runtime's own setting for such a process (`session.SHORT_LIVED_JIT`);
  - `jvm-defaults`: `ICEFLOE_SHORT_LIVED_JIT=` (empty), the JVM's defaults, as before it.
Results: bench/results/jit_short_lived.{json,md} (`--output`: another name).
Run: `.venv/bin/python bench/jit_short_lived.py [--records 1000000] [--rounds 2] [--output NAME]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from throughput import PARTITIONS, TRADES, stack_file, trades

RESULTS = Path(__file__).parent / "results"
VARIANTS = {"short-lived": None, "jvm-defaults": ""}  # ICEFLOE_SHORT_LIVED_JIT: None leaves the runtime's own
GROUPS = {"C2 compiler": "C2 CompilerThre", "C1 compiler": "C1 CompilerThre", "tasks": "Executor task l",
          "driver (py4j)": "Thread-N", "GC": "GC Thread#N"}  # fmt: skip


def thread_cpu(pid: int) -> Counter:
    """CPU seconds of each of the process's threads, by name (digits as N)."""
    ticks, found = os.sysconf("SC_CLK_TCK"), Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        name = name if "Compiler" in name else re.sub(r"\d+", "N", name)  # C1 and C2 apart, the rest by kind
        fields = stat[stat.rindex(")") + 2 :].split()
        found[name] += (int(fields[11]) + int(fields[12])) / ticks
    return found


def child(argv: list[str]) -> int:
    """`icefloe` with each `run_table` wrapped: its JVM's CPU per thread printed to stderr as a `THREADS` line."""
    from icefloe import cli
    from icefloe.operate import runner

    original = runner.run_table

    def measured(spark, *args, **kwargs):
        pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        before = thread_cpu(pid)
        try:
            return original(spark, *args, **kwargs)
        finally:
            spent = {name: round(cpu - before.get(name, 0.0), 2) for name, cpu in thread_cpu(pid).items()}
            print("THREADS " + json.dumps({k: v for k, v in spent.items() if v > 0}), file=sys.stderr, flush=True)

    runner.run_table = measured
    return cli.main(argv)


def fresh_run(stack: Path, state: Path, jit: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "runtime"),
                                                        str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    env.pop("ICEFLOE_SHORT_LIVED_JIT", None)
    if jit is not None:
        env["ICEFLOE_SHORT_LIVED_JIT"] = jit
    started = time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--child", "run", "--once", "--json", "--config", str(stack),
                           "--state-dir", str(state)], capture_output=True, text=True, env=env)  # fmt: skip
    seconds = time.monotonic() - started
    lines = [line for line in done.stderr.splitlines() if line.startswith("THREADS ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"run failed ({done.returncode}): {done.stderr[-3000:]}")
    threads = json.loads(lines[-1][len("THREADS ") :])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    grouped = {group: round(sum(v for k, v in threads.items() if k == name), 2) for group, name in GROUPS.items()}
    return {"process_s": round(seconds, 2), "rows": result["rows_written"], "jvm_cpu_s": round(sum(threads.values()), 2),
            "threads": grouped, "load_1m": round(os.getloadavg()[0], 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default="jit_short_lived")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        sys.exit(child(args.child))
    from icefloe_dev.kafka_broker import KafkaBroker
    from icefloe_dev.processes import start_together
    from icefloe_dev.producer import produce_avro_quickly
    from icefloe_dev.schema_registry import SchemaRegistry

    work = Path(tempfile.mkdtemp(prefix="icefloe-bench-jit-"))
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    load = os.getloadavg()
    try:
        broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
        start_together(broker, registry)
        try:
            for round_ in range(args.rounds):
                for name, jit in VARIANTS.items():
                    topic = f"jit_{name.replace('-', '_')}_{round_}"
                    broker.create_topic(topic, PARTITIONS)
                    produce_avro_quickly(broker.bootstrap_servers, registry.url, topic, TRADES,
                                         trades(1000 + args.records, seed=round_))  # fmt: skip
                    bootstrap, state = broker.bootstrap_servers, work / "state"
                    seed = stack_file(work / f"seed-{topic}.yaml", bootstrap, registry.url, topic, topic, 1000)
                    fresh_run(seed, state, jit)  # creates the table
                    stack = stack_file(work / f"{topic}.yaml", bootstrap, registry.url, topic, topic, args.records,
                                       maintenance=False)  # fmt: skip
                    measured = fresh_run(stack, state, jit)
                    assert measured["rows"] == args.records, measured
                    runs[name].append(measured)
                    print(name, json.dumps(measured), flush=True)
        finally:
            registry.stop()
            broker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, shared",
              "records": args.records, "rounds": args.rounds, "load_start": [round(x, 1) for x in load],
              "load_end": [round(x, 1) for x in os.getloadavg()], "runs": runs}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.output}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{args.output}.md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    median = statistics.median
    lines = ["# A fresh run's JVM CPU by thread (bench/jit_short_lived.py)", "",
             f"{report['machine']}; load average (1, 5, 15 min) at start {report['load_start']}, at end "
             f"{report['load_end']}. Each run a fresh `icefloe run --once` of {report['records']:,} Avro trades (~200 B) "
             "into a table an earlier run created, maintenance off; the JVM's CPU seconds per thread around the batch "
             "(its start left out); variants alternate in each round; medians of "
             f"{report['rounds']} rounds (all runs in brackets).", "",
             "| variant | JVM CPU s | all | " + " | ".join(GROUPS) + " | process s |",
             "|---|---:|---|" + "---:|" * len(GROUPS) + "---:|"]  # fmt: skip
    for name, runs in report["runs"].items():
        cells = [str(round(median(r["threads"][g] for r in runs), 2)) for g in GROUPS]
        lines.append(
            f"| {name} | {median(r['jvm_cpu_s'] for r in runs):.2f} | {[r['jvm_cpu_s'] for r in runs]} | "
            + " | ".join(cells)
            + f" | {median(r['process_s'] for r in runs):.2f} |"
        )
    short, default = (median(r["jvm_cpu_s"] for r in report["runs"][n]) for n in ("short-lived", "jvm-defaults"))
    lines += ["", f"short-lived / jvm-defaults, JVM CPU: **{short / default:.2f}**", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
