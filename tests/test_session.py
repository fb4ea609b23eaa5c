"""The local SparkSession's start-up: a class-data-sharing archive for a scheduled run's fresh JVM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from icefloe import class_sharing
from icefloe.session import SHORT_LIVED_JIT, jvm_lib, local_jars
from icefloe_dev import stock_trades
from icefloe_dev.producer import produce_avro
from support import by_position, read_pyiceberg

ICEFLOE = [sys.executable, "-m", "icefloe.cli"]
DEAD_PID = 4_194_304 + 1  # above Linux's highest pid_max: never a live process


@pytest.mark.spark
@pytest.mark.broker
def test_the_first_runs_write_one_cds_archive_by_default_and_the_next_maps_icebergs_classes_from_it(
    broker, registry, state_dir, topic, tmp_path
):
    """With no archive yet, two runs at once each have their JVM write one as it exits and move it into place: one
    archive in jvm/cds (under a folder whose name has a blank), no half-written file left (nor a killed run's). The next
    run loads its classes from it, Iceberg's among them, and writes its batch as without it; --json stays parseable."""
    broker.create_topic(topic, 2)
    produce_avro(broker.bootstrap_servers, registry.url, topic, stock_trades.SCHEMA, stock_trades.trades(3000))
    # The real jars under a jvm/ of the test's own, so jvm/cds is the test's too; in a folder whose name has a blank,
    # as a checkout under `My Projects/` (the archive's path, a JVM option, was split there and the JVM did not start).
    checkout = tmp_path / "My Projects"
    lib = checkout / "jvm" / "lib"
    lib.mkdir(parents=True)
    for folder in jvm_lib().iterdir():
        (lib / folder.name).symlink_to(folder)
    cds = checkout / "jvm" / "cds"
    cds.mkdir()
    killed = cds / f"icefloe-0123456789abcdef.jsa.{DEAD_PID}.tmp"
    killed.write_bytes(b"a run killed while writing its archive")
    env = {key: value for key, value in os.environ.items() if key != class_sharing.ARCHIVE_ENV}
    env |= {"ICEFLOE_JVM_LIB": str(lib), "ICEFLOE_SPARK_MASTER": "local[2]"}

    def command(table: str) -> list[str]:
        path = tmp_path / f"Pulumi.{table}.yaml"
        path.write_text(yaml.safe_dump({"config": {
            "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers,
                                        "schemaRegistry": {"url": registry.url}}],
            "icefloe:tables": [{"sourceCluster": "local", "topic": topic, "table": table, "maxRecordsPerRun": 1000}],
        }}))  # fmt: skip
        # A state (catalog) of its own: the two runs at once share only the archive's folder
        return [*ICEFLOE, "run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir / table)]

    first = [
        subprocess.Popen(command(t), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for t in "ab"
    ]
    for process in first:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, "\n".join(line for line in err.splitlines() if "[cds]" not in line)[-3000:]
        assert "[cds]" not in err  # the dump's many warnings (classes it skips) are not the run's business
        assert json.loads(out.strip().splitlines()[-1])["rows_written"] == 1000
    archives = list(cds.iterdir())
    assert len(archives) == 1 and archives[0].suffix == ".jsa", archives
    assert archives[0].stat().st_size > 10_000_000

    classes = tmp_path / "classes.log"
    env["SPARK_SUBMIT_OPTS"] = f"{env.get('SPARK_SUBMIT_OPTS', '')} -Xlog:class+load=info:file={classes}"
    second = subprocess.run(command("a"), env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads(second.stdout.strip().splitlines()[-1])["rows_written"] == 1000
    iceberg = [line for line in classes.read_text().splitlines() if " org.apache.iceberg." in line]
    shared = [line for line in iceberg if "shared objects file" in line]
    assert iceberg and len(shared) > len(iceberg) / 2, (len(shared), len(iceberg))
    assert list(cds.iterdir()) == archives
    assert len(by_position(read_pyiceberg(state_dir / "a", "local.a"))) == 2000

    # A JVM given a flight recording from its start (or a Java agent) runs without the archive: Java 17 crashed
    # mapping it (SIGSEGV in KlassFactory::check_shared_class_file_load_hook) and the run failed before its JVM was up.
    recorded = env | {"JAVA_TOOL_OPTIONS": f"-XX:StartFlightRecording=filename={tmp_path / 'run.jfr'}"}
    third = subprocess.run(command("a"), env=recorded, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    assert json.loads(third.stdout.strip().splitlines()[-1])["rows_written"] == 1000
    assert "no class-data-sharing archive for this run" in third.stderr
    assert "-XX:StartFlightRecording in JAVA_TOOL_OPTIONS" in third.stderr
    assert list(cds.iterdir()) == archives
    assert len(by_position(read_pyiceberg(state_dir / "a", "local.a"))) == 3000


def test_the_default_archive_is_named_by_the_jdk_and_the_jars(tmp_path, monkeypatch):
    """An archive is valid only for the JDK and the class path that wrote it: another jar (or the same one
    rebuilt) names another archive, so a run never maps a stale one; `off` and an explicit file are honoured."""
    monkeypatch.delenv(class_sharing.ARCHIVE_ENV, raising=False)
    jars = local_jars()
    name = class_sharing.archive_path(tmp_path, jars)
    assert name is not None and name.parent == tmp_path and name.name.startswith("icefloe-")
    assert class_sharing.archive_path(tmp_path, jars) == name
    extra = tmp_path / "extra.jar"
    extra.write_bytes(b"PK")
    with_extra = class_sharing.archive_path(tmp_path, [*jars, str(extra)])
    os.utime(extra, (1, 1))
    assert len({name, with_extra, class_sharing.archive_path(tmp_path, [*jars, str(extra)])}) == 3
    monkeypatch.setenv(class_sharing.ARCHIVE_ENV, "off")
    assert class_sharing.archive_path(tmp_path, jars) is None
    monkeypatch.setenv(class_sharing.ARCHIVE_ENV, str(tmp_path / "mine.jsa"))
    assert class_sharing.archive_path(tmp_path, jars) == tmp_path / "mine.jsa"


@pytest.mark.parametrize("variable", class_sharing.OPTION_VARIABLES)
def test_a_jvm_given_an_agent_or_a_flight_recording_from_its_start_gets_no_archive(tmp_path, monkeypatch, variable):
    """Java 17 crashes mapping a dynamic archive while a Java agent or JFR transforms classes as they load, and will
    not start writing one then (measured: SIGSEGV, and "Must enable AllowArchivingWithJavaAgent")."""
    for name in class_sharing.OPTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(class_sharing.ARCHIVE_ENV, str(tmp_path / "mine.jsa"))
    jars: list[str] = []
    for harmless in ("", "-Xmx1g -XX:+FlightRecorder -Xlog:class+load=info:file=/tmp/x"):
        monkeypatch.setenv(variable, harmless)
        assert class_sharing.instrumenting_option() is None
        assert class_sharing.archive_path(tmp_path, jars) == tmp_path / "mine.jsa"
    for option in ("-javaagent:/opt/otel.jar=x", "-agentlib:jdwp=transport=dt_socket", "-agentpath:/a.so",
                   "-XX:StartFlightRecording=filename=r.jfr", "'-XX:StartFlightRecording:settings=profile'"):  # fmt: skip
        monkeypatch.setenv(variable, f"-Xmx1g {option}")
        found = class_sharing.instrumenting_option()
        assert found is not None and found.endswith(f" in {variable}") and found.split()[0] in option, found
        assert class_sharing.archive_path(tmp_path, jars) is None


def test_a_session_that_must_not_write_an_archive_maps_one_only_where_it_exists(tmp_path):
    archive, jars = tmp_path / "icefloe-x.jsa", ["a.jar"]
    assert "spark.driver.extraJavaOptions" not in class_sharing.driver_settings(archive, jars, write=False)
    archive.write_bytes(b"")
    options = class_sharing.driver_settings(archive, jars, write=False)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive}" in options


def test_publishing_an_archive_removes_dead_runs_files_and_all_but_the_newest_archives(tmp_path, monkeypatch):
    monkeypatch.delenv(class_sharing.ARCHIVE_ENV, raising=False)
    archives = [tmp_path / f"icefloe-{i}.jsa" for i in range(class_sharing.KEPT_ARCHIVES + 2)]
    for age, path in enumerate(reversed(archives)):  # archives[0] the newest
        path.write_bytes(b"")
        os.utime(path, (1000 + age, 1000 + age))
    writing = tmp_path / f"icefloe-new.jsa.{os.getpid()}.tmp"
    dead = tmp_path / f"icefloe-bbbb.jsa.{DEAD_PID}.tmp"
    unrelated = tmp_path / "notes.txt"
    for path in (writing, dead, unrelated):
        path.write_bytes(b"")
    class_sharing._remove_stale(archives[0])
    kept = [path.name for path in archives[: class_sharing.KEPT_ARCHIVES]]
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == sorted([*kept, writing.name, unrelated.name])


def _java_options(pid: int) -> list[str] | None:
    """The JVM options of the Spark driver JVM under process `pid` (its arguments before the main class), or None
    while there is none."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop()
        pending += children.get(child, [])
        try:
            arguments = (Path("/proc") / str(child) / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        launcher = "org.apache.spark.launcher.Main" in arguments  # spark-class's JVM that builds the driver's command
        if Path(arguments[0]).name == "java" and "org.apache.spark.deploy.SparkSubmit" in arguments and not launcher:
            return arguments[: arguments.index("org.apache.spark.deploy.SparkSubmit")]
    return None


@pytest.mark.spark
@pytest.mark.broker
def test_a_run_once_jvm_inlines_less_and_a_continuous_one_keeps_the_jvms_defaults(
    broker, registry, state_dir, topic, tmp_path
):
    """A process that runs its batch and exits (a scheduled job) spends much of its CPU compiling: its driver JVM
    gets SHORT_LIVED_JIT (docs/benchmarks.md#the-jit-of-a-fresh-run); a continuous one, whose steady state counts,
    does not."""
    broker.create_topic(topic, 1)
    produce_avro(broker.bootstrap_servers, registry.url, topic, stock_trades.SCHEMA, stock_trades.trades(100))
    stack = tmp_path / "Pulumi.local.yaml"
    stack.write_text(yaml.safe_dump({"config": {
        "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": broker.bootstrap_servers,
                                    "schemaRegistry": {"url": registry.url}}],
        "icefloe:tables": [{"sourceCluster": "local", "topic": topic, "table": "t", "refresh": "2s",
                            "maintenance": {"enabled": False}}],
    }}))  # fmt: skip
    for mode, short_lived in (("--once", True), ("--continuous", False)):
        command = [*ICEFLOE, "run", "--config", str(stack), mode, "--json", "--state-dir", str(state_dir)]
        env = {**os.environ, "ICEFLOE_SPARK_MASTER": "local[2]"}
        log = tmp_path / f"run{mode}.log"  # a file, not a pipe: stdout is read while the run goes on
        with log.open("w") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        try:
            deadline = time.monotonic() + 300
            while (options := _java_options(process.pid)) is None and process.poll() is None:
                assert time.monotonic() < deadline, "no Spark driver JVM started"
                time.sleep(0.05)
            assert options is not None, log.read_text()[-3000:]
            assert (SHORT_LIVED_JIT in options) is short_lived, (mode, options)
            if mode == "--once":
                assert json.loads(process.stdout.readline())["rows_written"] == 100
            else:  # its first batch (nothing new), then SIGTERM: the loop stops cleanly
                assert json.loads(process.stdout.readline())["rows_written"] == 0
        finally:
            if mode == "--continuous":
                process.send_signal(signal.SIGTERM)
            process.communicate(timeout=300)
        assert process.returncode == 0, log.read_text()[-3000:]
    assert len(by_position(read_pyiceberg(state_dir, "local.t"))) == 100
