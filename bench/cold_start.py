"""Cold start: what a fresh JVM costs a scheduled job (`icefloe run --once`) over a warm one, and what closes the gap.

One batch of N `trades` records (~200 B Avro, bench/throughput.py's shape and producer) runs
  fresh   as `icefloe run --once` (a new Python, a new Spark JVM in local mode) into a table that exists (an earlier,
          unmeasured 1,000-record batch created it); the same process with nothing new right after it is the idle
          start-up (Python, JVM, Spark, catalog, planning), measured apart and subtracted: data s = run - idle
  warm    in one process that keeps its JVM: a first batch of N (JIT warm-up), then the measured second batch of N
for a baseline (no JVM options: the job's defaults, no archive) and for each candidate JVM setting, the variants
alternating within a round so load from other users hits all alike; the first variant named is the one whose warm
process the others are compared with. CPU = the process tree's CPU seconds (/proc). Candidates:
  cds       an AppCDS archive (`-XX:SharedArchiveFile`) that a training run (`-XX:ArchiveClassesAtExit`, same JDK,
            same class path) wrote. AppCDS archives only classes from the boot and app class path: Spark's own jars
            (spark-submit's -cp) are archived, the jars `spark.jars` adds (Iceberg, Kafka, Avro) are loaded by a
            URLClassLoader and are not
  cds-cp    the same with `spark.jars` also on the driver class path (`--driver-class-path`), so they are archived too
  c1        `-XX:TieredStopAtLevel=1`: C1 only (cheap compiles; slower code in long batches: see --big-records)
  pargc     `-XX:+UseParallelGC`
  shipped   what a local run does by itself: the archive `icefloe.class_sharing` keeps in jvm/cds/ (written by the
            first run that finds none), the jars on the driver's class path; `shipped+c1`, `shipped+pargc` add those
and combinations. How many classes came from the archive is checked once per archive (`-Xlog:class+load`).
Results: bench/results/cold_start.{json,md}. Run: `.venv/bin/python bench/cold_start.py [--records N] [--rounds R]`.

`--small N` measures instead the fixed cost of a fresh run, what a scheduled job on a quiet topic and each of the test
suite's `icefloe run` processes pay: per round, one new table taking three fresh runs (`new`: its first N records, so
the table is created and maintenance is due; `small`: the next N; `empty`: nothing new), for this tree's runtime and,
with `--base-runtime DIR` (e.g. `git archive <commit> runtime | tar -x -C DIR`), for another one, alternating. CPU is
the run's cgroup's (cpuacct), with the JVM and every process it starts. Each run writes a Spark event log (the jobs it
ran) and its log's timestamps split the wall time into phases. Results: bench/results/cold_start_small.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
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
from pathlib import Path

from process_stats import cpu_seconds
from throughput import PARTITIONS, TRADES, icefloe_process, stack_file, table_config, trades

RESULTS = Path(__file__).parent / "results"
SEED = 1000
JVM_LOG = "-Xlog:disable -Xlog:all=warning:stderr"
SHIPPED = "shipped"  # a variant's archive: the one the runtime maps by itself, not one of this benchmark's
# name -> (JVM options, jars on the driver class path, archive it uses: None or the name of the archive)
VARIANTS = {
    "baseline": ("", False, None),
    "cds": ("", False, "app"),
    "cds-cp": ("", True, "app-cp"),
    "c1": ("-XX:TieredStopAtLevel=1", False, None),
    "pargc": ("-XX:+UseParallelGC", False, None),
    "cds-cp+c1": ("-XX:TieredStopAtLevel=1", True, "app-cp"),
    # Spark reads spark.* system properties into the driver's conf: whole-stage code generation off (fewer, smaller
    # classes for Janino to compile in a cold JVM; each operator's expressions are still compiled)
    "no-wholestage": ("-Dspark.sql.codegen.wholeStage=false", False, None),
    # The runtime's own choices (session.py, class_sharing.py): the archive in jvm/cds/ and the class path
    "shipped": ("", False, SHIPPED),
    "shipped+c1": ("-XX:TieredStopAtLevel=1", False, SHIPPED),
    "shipped+pargc": ("-XX:+UseParallelGC", False, SHIPPED),
    "shipped+c1+pargc": ("-XX:TieredStopAtLevel=1 -XX:+UseParallelGC", False, SHIPPED),
}


def jar_class_path() -> str:
    from icefloe.session import local_jars

    return ":".join(local_jars())


def variant_env(name: str, archives: Path, extra: str = "") -> dict[str, str]:
    """The environment a process of this variant starts with: its JVM options through SPARK_SUBMIT_OPTS (the
    driver JVM's options in local mode), the class path through PYSPARK_SUBMIT_ARGS."""
    options, class_path, archive = VARIANTS[name]
    if archive == SHIPPED:  # the runtime's own settings, its JVM's log among them
        return {"SPARK_SUBMIT_OPTS": f"{options} {extra}".strip()}
    if archive:
        options += f" -XX:SharedArchiveFile={archives / (archive + '.jsa')}"
    # The JVM's own messages (CDS's at exit among them) to stderr: stdout carries the run's --json line.
    # No default archive (icefloe.class_sharing): each variant's options alone decide what the JVM maps.
    env = {"SPARK_SUBMIT_OPTS": f"{JVM_LOG} {options} {extra}".strip(), "ICEFLOE_CDS_ARCHIVE": "off"}
    if class_path:
        env["PYSPARK_SUBMIT_ARGS"] = f"--driver-class-path {jar_class_path()} pyspark-shell"
    return env


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """icefloe_process (bench/throughput.py) starts its process with this process's environment: each variable a
    variant may set is the variant's alone (a `shipped` variant after `baseline` must not inherit its archive off)."""
    saved = {key: os.environ.get(key) for key in ("SPARK_SUBMIT_OPTS", "PYSPARK_SUBMIT_ARGS", "ICEFLOE_CDS_ARCHIVE")}
    for key in saved:
        os.environ.pop(key, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def child(spec: dict) -> None:
    """Runs batches in one process (one JVM): prints each batch's seconds, the tree's CPU seconds and rows."""
    from icefloe.operate.runner import run_table
    from icefloe.session import spark_session

    state = Path(spec["state"])
    config = table_config(spec["bootstrap"], spec["registry"], spec["topic"], "none", 1)
    spark = spark_session(config.catalog, state)
    done = []
    for table, records in spec["batches"]:
        config = table_config(spec["bootstrap"], spec["registry"], spec["topic"], table, records)
        cpu, started = cpu_seconds(os.getpid()), time.monotonic()
        result = run_table(spark, config, config.tables[0], state)
        done.append({"seconds": time.monotonic() - started, "cpu_s": cpu_seconds(os.getpid()) - cpu,
                     "rows_written": result.rows_written, "load_1m": round(os.getloadavg()[0], 1)})  # fmt: skip
    spark.stop()
    print(json.dumps(done), flush=True)


def in_one_process(env: dict[str, str], spec: dict) -> list[dict]:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env={**os.environ, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True, timeout=3600)  # fmt: skip
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def archived_classes(env: dict[str, str], stack: Path, state: Path, log: Path) -> dict:
    """One idle run logging where each class came from: how many the archive served."""
    with environment({**env, "SPARK_SUBMIT_OPTS": env["SPARK_SUBMIT_OPTS"] + f" -Xlog:class+load=info:file={log}"}):
        icefloe_process(stack, state)
    lines = log.read_text().splitlines()
    loaded = [line for line in lines if "source:" in line]
    shared = [line for line in loaded if "shared objects file" in line]
    iceberg = [line for line in loaded if re.search(r"org\.apache\.iceberg\.", line)]
    return {"classes_loaded": len(loaded), "from_archive": len(shared),
            "iceberg_classes": len(iceberg), "iceberg_from_archive": sum("shared objects file" in x for x in iceberg)}  # fmt: skip


def summary(runs: list[dict], idle: list[dict] | None = None) -> dict:
    idle = idle or [{"seconds": 0.0, "cpu_s": 0.0}] * len(runs)
    data_s = [r["seconds"] - i["seconds"] for r, i in zip(runs, idle, strict=True)]
    data_cpu = [r["cpu_s"] - i["cpu_s"] for r, i in zip(runs, idle, strict=True)]
    return {
        "run_s": [round(r["seconds"], 1) for r in runs],
        "idle_s": [round(i["seconds"], 1) for i in idle],
        "run_cpu_s": [round(r["cpu_s"], 1) for r in runs],
        "idle_cpu_s": [round(i["cpu_s"], 1) for i in idle],
        "data_s": [round(x, 1) for x in data_s],
        "data_cpu_s": [round(x, 1) for x in data_cpu],
        "run_s_median": round(statistics.median(r["seconds"] for r in runs), 1),
        "idle_s_median": round(statistics.median(i["seconds"] for i in idle), 1),
        "run_cpu_s_median": round(statistics.median(r["cpu_s"] for r in runs), 1),
        "idle_cpu_s_median": round(statistics.median(i["cpu_s"] for i in idle), 1),
        "data_s_median": round(statistics.median(data_s), 1),
        "data_cpu_s_median": round(statistics.median(data_cpu), 1),
        "load_1m": [r.get("load_1m") for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="the batch (trades, ~200 B)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--big-records", type=int, default=1_000_000, help="a big fresh batch; 0: none")
    parser.add_argument("--big-variants", default="baseline,c1", help="the big batch's variants, comma-separated")
    parser.add_argument("--big-rounds", type=int, default=1, help="the big batch's rounds, variants alternating")
    parser.add_argument("--name", default="cold_start", help="results file name (bench/results/<name>.{json,md})")
    parser.add_argument("--small", type=int, default=0, help="fixed-cost mode: batches of N records (see above)")
    parser.add_argument("--base-runtime", help="--small: a runtime directory to compare this tree's with")
    parser.add_argument("--jvm", default="", help="--small: SPARK_SUBMIT_OPTS of the fresh runs")
    parser.add_argument("--shipped-with", action="append", default=[], metavar="NAME=OPTIONS",
                        help="one more variant: the runtime's own settings (shipped) with these JVM options")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--markdown", action="store_true", help="only rewrite cold_start.md from cold_start.json")
    args = parser.parse_args()
    for variant in args.shipped_with:
        name, options = variant.split("=", 1)
        VARIANTS[name] = (options, False, SHIPPED)
    if args.markdown:
        (RESULTS / f"{args.name}.md").write_text(markdown(json.loads((RESULTS / f"{args.name}.json").read_text())))
        return
    if args.child:
        return child(json.loads(args.child))
    if args.small:
        from cold_start_small import bench_small

        name = "cold_start_small" if args.name == "cold_start" else args.name
        return bench_small(args.small, args.rounds, args.base_runtime, args.jvm, RESULTS, name)
    from icefloe_dev.kafka_broker import KafkaBroker
    from icefloe_dev.processes import start_together
    from icefloe_dev.producer import produce_avro_quickly
    from icefloe_dev.schema_registry import SchemaRegistry

    variants = args.variants.split(",")
    work = Path(tempfile.mkdtemp(prefix="icefloe-cold-"))
    archives, state = work / "archives", work / "state"
    archives.mkdir()
    load_before = os.getloadavg()
    report: dict = {"records": args.records, "rounds": args.rounds, "variants": {}}
    try:
        broker, registry = KafkaBroker(work / "kafka", heap="1g"), SchemaRegistry(work / "registry")
        start_together(broker, registry)
        try:
            bootstrap = broker.bootstrap_servers
            # A topic per round (its seed and one batch: the idle run after the batch finds nothing new), each
            # variant a table per round; the warm process's tables take a seed and two batches from one more topic.
            for topic, records in [*((f"cold_{r}", SEED + args.records) for r in range(args.rounds)),
                                   ("cold_warm", SEED + 2 * args.records)]:  # fmt: skip
                broker.create_topic(topic, PARTITIONS)
                count, size = produce_avro_quickly(bootstrap, registry.url, topic, TRADES, trades(records))
            report["mib"] = round(size / count * args.records / 2**20, 1)
            spec = {"bootstrap": bootstrap, "registry": registry.url, "state": str(state)}

            def stack(table: str, records: int, round_: int = 0) -> Path:
                # No maintenance in the measured runs: the in-process seed left the table never maintained, so it
                # was due in the fresh run (a compaction of seed and batch among it) and in no warm batch; a
                # scheduled run on a table maintained within the interval finds it not due.
                topic = f"cold_{round_}"
                return stack_file(work / f"{table}-{records}.yaml", bootstrap, registry.url, topic, table, records,
                                  maintenance=False)  # fmt: skip

            def table_of(variant: str, round_: int) -> str:
                return f"cold_{variant.replace('-', '_').replace('+', '_')}_{round_}"

            # The archives: a training run each (a seed batch, so it loads the write and commit paths' classes).
            for name in {VARIANTS[v][2] for v in variants if VARIANTS[v][2] not in (None, SHIPPED)}:
                cp = name.endswith("-cp")
                env = variant_env("cds-cp" if cp else "cds", archives)
                env["SPARK_SUBMIT_OPTS"] = f"{JVM_LOG} -XX:ArchiveClassesAtExit={archives / (name + '.jsa')}"
                with environment(env):
                    icefloe_process(stack(f"train_{name.replace('-', '_')}", SEED), state)
                report.setdefault("archive_mib", {})[name] = round((archives / f"{name}.jsa").stat().st_size / 2**20, 1)
            for round_ in range(args.rounds):  # the seeds, unmeasured
                seeds = [[table_of(v, round_), SEED] for v in variants]
                in_one_process({}, {**spec, "topic": f"cold_{round_}", "batches": seeds})

            fresh: dict[str, list] = {v: [] for v in variants}
            idle: dict[str, list] = {v: [] for v in variants}
            warm: dict[str, list] = {variants[0]: []}
            for round_ in range(args.rounds):
                order = variants if round_ % 2 == 0 else variants[::-1]
                for v in order:
                    with environment(variant_env(v, archives)):
                        run = icefloe_process(stack(table_of(v, round_), args.records, round_), state)
                        run["load_1m"] = round(os.getloadavg()[0], 1)
                        assert run["rows_written"] == args.records, run
                        nothing = icefloe_process(stack(table_of(v, round_), args.records, round_), state)
                        assert nothing["rows_written"] == 0, nothing
                    fresh[v].append(run)
                    idle[v].append(nothing)
                    print(f"round {round_ + 1} {v}: run {run['seconds']:.1f} s ({run['cpu_s']:.1f} CPU s), "
                          f"idle {nothing['seconds']:.1f} s ({nothing['cpu_s']:.1f} CPU s)", flush=True)  # fmt: skip
                for v in warm:  # the warm process: a first batch, then the measured second one
                    table = f"warm_{round_}"
                    done = in_one_process(variant_env(v, archives), {
                        **spec, "topic": "cold_warm", "batches": [[table, SEED], [table, args.records], [table, args.records]]})  # fmt: skip
                    warm[v].append(done[2])
                    print(f"round {round_ + 1} warm {v}: first {done[1]['seconds']:.1f} s, second "
                          f"{done[2]['seconds']:.1f} s ({done[2]['cpu_s']:.1f} CPU s)", flush=True)  # fmt: skip
            for v in variants:
                report["variants"][v] = {"jvm": variant_env(v, archives)["SPARK_SUBMIT_OPTS"].replace(str(archives), "<archives>"),
                                         "jars_on_class_path": VARIANTS[v][1], **summary(fresh[v], idle[v])}  # fmt: skip
            for v in warm:
                report["variants"][v]["warm"] = summary(warm[v])
            for name in {VARIANTS[v][2] for v in variants if VARIANTS[v][2] not in (None, SHIPPED)}:  # an idle run
                v = "cds-cp" if name.endswith("-cp") else "cds"
                report.setdefault("archive_check", {})[name] = archived_classes(
                    variant_env(v, archives), stack(table_of(variants[0], 0), args.records), state, work / f"{name}.log"
                )

            if args.big_records:  # C1 only on a batch long enough for C2's code to pay off
                broker.create_topic("cold_big", PARTITIONS)
                count, size = produce_avro_quickly(
                    bootstrap, registry.url, "cold_big", TRADES, trades(SEED + args.big_records)
                )
                report["big"] = {"records": args.big_records, "mib": round(size / count * args.big_records / 2**20, 1),
                                 "rounds": args.big_rounds, "variants": {}}  # fmt: skip
                big_variants = args.big_variants.split(",")
                for round_ in range(args.big_rounds):
                    for v in big_variants if round_ % 2 == 0 else big_variants[::-1]:
                        table = f"big_{table_of(v, round_)}"
                        in_one_process({}, {**spec, "topic": "cold_big", "batches": [[table, SEED]]})
                        path = stack_file(work / f"{table}.yaml", bootstrap, registry.url, "cold_big", table,
                                          args.big_records, maintenance=False)  # fmt: skip
                        with environment(variant_env(v, archives)):
                            run = icefloe_process(path, state)
                        assert run["rows_written"] == args.big_records, run
                        report["big"]["variants"].setdefault(v, []).append(
                            {"seconds": round(run["seconds"], 1), "cpu_s": round(run["cpu_s"], 1),
                             "load_1m": round(os.getloadavg()[0], 1)})  # fmt: skip
                        print(f"big {v}: {run['seconds']:.1f} s ({run['cpu_s']:.1f} CPU s)", flush=True)
        finally:
            registry.stop()
            broker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report |= {
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, shared",
        "java": subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0],
        "load_avg_at_start": [round(x, 1) for x in load_before],
        "load_avg_at_end": [round(x, 1) for x in os.getloadavg()],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    """The results page: per variant the fresh run, its idle start-up and the data part; the warm batch; the gap."""
    first = next(iter(report["variants"]))
    base = report["variants"][first]
    warm = base.get("warm")
    lines = [
        "# Cold start: a fresh `icefloe run --once` against a warm process",
        "",
        f"{report['machine']}; {report['java']}. Load average (1, 5, 15 min) at start {report['load_avg_at_start']}, "
        f"at end {report['load_avg_at_end']}. Run niced (`nice -n 19`) beside other users' work: absolute seconds are "
        "inflated, compare the variants of this run (they alternate within each round).",
        "",
        f"Batch: {report['records']:,} trades (~200 B Avro, {report['mib']} MiB), {report['rounds']} rounds; medians. "
        "Fresh: `icefloe run --once` into a table that exists; idle: the same process with nothing new right after "
        "(Python, JVM, Spark, catalog, planning); data = run - idle. Warm: the second batch of the same size in one "
        "process (`bench/cold_start.py`).",
        "",
        "| variant | JVM options | run s | idle s | data s | run CPU s | idle CPU s | data CPU s | load (1 min) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, v in report["variants"].items():
        lines.append(
            f"| {name} | `{v['jvm'] or '-'}`{' + jars on the class path' if v['jars_on_class_path'] else ''} | "
            f"{v['run_s_median']} | {v['idle_s_median']} | {v['data_s_median']} | {v['run_cpu_s_median']} | "
            f"{v['idle_cpu_s_median']} | {v['data_cpu_s_median']} | {v['load_1m']} |"
        )
    if warm:
        lines += [
            f"| warm ({first} JVM, 2nd batch) | - | {warm['run_s_median']} | - | {warm['run_s_median']} | "
            f"{warm['run_cpu_s_median']} | - | {warm['run_cpu_s_median']} | {warm['load_1m']} |",
            "",
            "Gap over the warm batch (fresh run's data part - warm batch), seconds / CPU seconds, and how much of "
            f"the {first} variant's gap each variant closes:",
            "",
            "| variant | gap s | gap CPU s | closed (s) | closed (CPU s) |",
            "|---|---:|---:|---:|---:|",
        ]
        base_gap = base["data_s_median"] - warm["run_s_median"]
        base_cpu = base["data_cpu_s_median"] - warm["run_cpu_s_median"]
        for name, v in report["variants"].items():
            gap, cpu = v["data_s_median"] - warm["run_s_median"], v["data_cpu_s_median"] - warm["run_cpu_s_median"]
            lines.append(f"| {name} | {gap:.1f} | {cpu:.1f} | {1 - gap / base_gap:.0%} | {1 - cpu / base_cpu:.0%} |")
    if report.get("archive_check"):
        lines += ["", "Archives (built by a training run of a 1,000-record batch; classes an idle run loaded):", ""]
        for name, c in report["archive_check"].items():
            lines.append(
                f"- `{name}` ({report['archive_mib'][name]} MiB): {c['from_archive']:,} of {c['classes_loaded']:,} "
                f"classes from the archive; Iceberg's: {c['iceberg_from_archive']} of {c['iceberg_classes']}"
            )
    if report.get("big") and "variants" in report["big"]:
        big = report["big"]
        lines += [
            "",
            f"A big batch, fresh (`run --once`, start-up included) into a table an earlier batch created: "
            f"{big['records']:,} trades ({big['mib']} MiB), {big['rounds']} round(s), the variants alternating; "
            "seconds and CPU seconds of each run, medians:",
            "",
            "| variant | run s | median | CPU s | median | load (1 min) |",
            "|---|---|---:|---|---:|---|",
        ]
        for name, runs in big["variants"].items():
            seconds, cpu = [r["seconds"] for r in runs], [r["cpu_s"] for r in runs]
            lines.append(f"| {name} | {seconds} | {statistics.median(seconds):.1f} | {cpu} | "
                         f"{statistics.median(cpu):.1f} | {[r['load_1m'] for r in runs]} |")  # fmt: skip
    elif report.get("big"):  # before --big-variants: baseline and C1 only, once each
        big = report["big"]
        lines += [
            "",
            f"A big batch, fresh, once each: {big['records']:,} trades ({big['mib']} MiB): baseline "
            f"{big['baseline']['seconds']} s ({big['baseline']['cpu_s']} CPU s, load {big['baseline']['load_1m']}), "
            f"C1 only {big['c1']['seconds']} s ({big['c1']['cpu_s']} CPU s, load {big['c1']['load_1m']}).",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
