"""Apache Iceberg's Kafka Connect sink, the peer users would pick instead of icefloe, run as a user would run it.

Kafka Connect 4.4.0 standalone with `org.apache.iceberg:iceberg-kafka-connect` 1.10.1 and Apicurio's AvroConverter
3.0.9 (Confluent framing), the jars from jvm/bench/*.xml (`scripts/setup_bench.sh`, bench-only: CI never needs them).
The fair configuration measured in ../shared/PLATFORM.md: one task per core, a 1 s commit interval, a 1 s offset
flush (else the tail of a drained backlog waits for Connect's 60 s tick), service-loaded plugins, a Hadoop catalog on
a directory, the table created by the sink with icefloe's table properties (zstd Parquet).
Done = the table's current snapshot holds every record (read from the Hadoop catalog's metadata files). CPU = the
worker JVM's CPU time up to that moment, sampled from /proc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from process_stats import cpu_seconds

from icefloe_dev.processes import free_port, java

ROOT = Path(__file__).resolve().parents[1]
BENCH_LIB = ROOT / "jvm" / "bench-lib"
NAMESPACE = "bench"
COMMIT_INITIATED = "Commit "  # the coordinator's "Commit <id> initiated": the sink's first commit cycle began
LOG4J2 = """\
status = warn
appender.out.type = File
appender.out.name = out
appender.out.fileName = {log}
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
logger.coordinator.name = org.apache.iceberg.connect.channel.Coordinator
logger.coordinator.level = INFO
"""


class SinkError(RuntimeError):
    pass


def available() -> str | None:
    """None when the peer's jars are in place, else why not."""
    for folder in ("connect", "plugins/iceberg-sink", "plugins/apicurio-converter"):
        if not any((BENCH_LIB / folder).glob("*.jar")):
            return f"{BENCH_LIB / folder} is missing or empty: run scripts/setup_bench.sh"
    return None


def connector(name: str, topic: str, table: str, registry_url: str, warehouse: Path, tasks: int, properties: dict):
    """One Iceberg sink connector writing `topic` into `bench.<table>` (created by the sink at its first record)."""
    base = registry_url.split("/apis/")[0]
    return {
        "name": name,
        "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
        "tasks.max": str(tasks),
        "topics": topic,
        "iceberg.tables": f"{NAMESPACE}.{table}",
        "iceberg.tables.auto-create-enabled": "true",
        **{f"iceberg.tables.auto-create-props.{k}": v for k, v in properties.items()},
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.hadoop.HadoopCatalog",
        "iceberg.catalog.warehouse": f"file://{warehouse}",
        "iceberg.control.commit.interval-ms": "1000",
        "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
        "value.converter.apicurio.registry.url": f"{base}/apis/registry/v3",
    }


def table_records(warehouse: Path, table: str) -> int:
    """Records in the table's current snapshot (0 before the sink created it or committed to it)."""
    metadata = warehouse / NAMESPACE / table / "metadata"
    versions = sorted(metadata.glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
    if not versions:
        return 0
    try:
        document = json.loads(versions[-1].read_text())
    except (OSError, ValueError):  # being written: read the next poll
        return 0
    current = document.get("current-snapshot-id")
    for snapshot in document.get("snapshots", []):
        if snapshot["snapshot-id"] == current:
            return int(snapshot["summary"].get("total-records", 0))
    return 0


def data_files(warehouse: Path, table: str) -> int:
    return sum(1 for _ in (warehouse / NAMESPACE / table / "data").rglob("*.parquet"))


class Worker:
    """One Connect standalone worker (a fresh JVM) running the given connectors."""

    def __init__(self, work: Path, bootstrap: str, connectors: list[dict], heap: str = "2g"):
        self.work, self.bootstrap, self.connectors, self.heap = work, bootstrap, connectors, heap
        self.port = free_port()
        self.log = work / "connect.log"
        self.process: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> None:
        why = available()
        if why:
            raise SinkError(why)
        self.work.mkdir(parents=True, exist_ok=True)
        worker = {
            "bootstrap.servers": self.bootstrap,
            "listeners": f"http://127.0.0.1:{self.port}",
            "offset.storage.file.filename": self.work / "offsets.dat",
            "offset.flush.interval.ms": 1000,
            "plugin.path": BENCH_LIB / "plugins",
            "plugin.discovery": "service_load",
            "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
            "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        }
        files = [self._write("worker.properties", worker)]
        files += [self._write(f"connector-{c['name']}.properties", c) for c in self.connectors]
        (self.work / "log4j2.properties").write_text(LOG4J2.format(log=self.log))
        # What connect-standalone.sh runs: its heap (-Xms256M -Xmx2G), the JVM's default collector (G1).
        command = [java(), "-Xms256m", f"-Xmx{self.heap}", f"-Dlog4j2.configurationFile={self.work / 'log4j2.properties'}",
                   "-cp", f"{BENCH_LIB / 'connect'}/*", "org.apache.kafka.connect.cli.ConnectStandalone", *files]  # fmt: skip
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=open(self.work / "stdout.log", "ab"), stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip

    def _write(self, name: str, settings: dict) -> str:
        path = self.work / name
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return str(path)

    def cpu(self) -> float:
        assert self.process is not None
        return cpu_seconds(self.process.pid)

    def wait(self, done, timeout: float, what: str) -> tuple[float, float]:
        """Poll `done()` every 50 ms; (seconds since launch, CPU seconds of the worker) when it holds."""
        deadline = time.monotonic() + timeout
        while True:
            cpu = self.cpu()
            if done():
                return time.monotonic() - self.started, cpu
            if self.process is None or self.process.poll() is not None:
                raise SinkError(f"Kafka Connect exited before {what}: see {self.log} and {self.work / 'stdout.log'}")
            if time.monotonic() > deadline:
                raise SinkError(f"Kafka Connect did not reach {what} within {timeout:g}s: see {self.log}")
            time.sleep(0.05)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def add_connector(self, settings: dict) -> float:
        """A connector more in the running (warm) worker, through Connect's REST API; when it was created."""
        body = json.dumps({"name": settings["name"], "config": settings}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/connectors", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
        return started

    def wait_rest(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/connectors", timeout=2) as response:
                    response.read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SinkError(f"Kafka Connect's REST API did not answer within {timeout:g}s") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the measured part is over: no clean shutdown needed
            self.process.wait()
        self.process = None


class CpuSampler(threading.Thread):
    """The highest CPU time seen for a process tree (a tree whose processes exit loses at most one interval)."""

    def __init__(self, pid: int, interval: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak, self.stop = pid, interval, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, cpu_seconds(self.pid))
