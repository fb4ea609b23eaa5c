"""Kafka Connect standalone running Debezium's PostgreSQL connector: change data into the local broker.

The jars come from jvm/cdc/*.xml (scripts/setup.sh puts them in jvm/cdc-lib/): Connect 4.3.1 (Debezium 3.6.1.Final
cannot run on 4.4; it writes to the 4.4 broker all the same), the Debezium plugin folder and Apicurio's AvroConverter
folder. One worker runs any number of connectors, each with its own converter (the converters are set per connector),
topic prefix, replication slot and publication, so one workload on one database yields one topic per converter.
Offsets go to a file in the state directory: `kill()` (SIGKILL) then `start()` is a connector crash and restart, and
re-emits every event since the last offset flush (`offset_flush_ms`), as Debezium does in the field.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from icefloe.session import jvm_lib

from .processes import LocalService, ServiceError, free_port, java
from .schema_registry import CCOMPAT_PATH

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %X{connector.context}%m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
logger.debezium.name = io.debezium
logger.debezium.level = INFO
logger.worker.name = org.apache.kafka.connect.runtime.Worker
logger.worker.level = INFO
logger.connect.name = org.apache.kafka.connect.runtime.Connect
logger.connect.level = INFO
logger.rest.name = org.apache.kafka.connect.runtime.rest.RestServer
logger.rest.level = INFO
logger.herder.name = org.apache.kafka.connect.runtime.standalone.StandaloneHerder
logger.herder.level = INFO
"""

# What a connector's converter is called here -> how Connect is configured for it (key and value alike).
CONVERTERS = ("avro", "avro-dereferenced", "json", "json-schemaless")
# Logged by Debezium once a connector's snapshot is over and it streams the replication slot.
STREAMING = "Starting streaming"


def cdc_lib(name: str) -> Path:
    """A folder under jvm/cdc-lib/ that scripts/setup.sh fills from jvm/cdc/<name>.xml."""
    path = jvm_lib().parent / "cdc-lib" / name
    if not path.is_dir() or not any(path.glob("*.jar")):
        raise ServiceError(f"{path} is missing or empty: run scripts/setup.sh (it fetches jvm/cdc/{name}.xml)")
    return path


def converter_settings(converter: str, registry_url: str | None) -> dict[str, str]:
    """Connector-level key and value converter settings. `registry_url` is the registry's Confluent-compatible URL
    (the local registry's `url`); Apicurio's converter talks to its native v3 API beside it and writes Confluent's
    wire format (magic byte, 4-byte id) with the id the Confluent-compatible API serves."""
    if converter in ("avro", "avro-dereferenced"):
        if registry_url is None:
            raise ServiceError(f"the {converter} converter needs a schema registry")
        base = registry_url.removesuffix(CCOMPAT_PATH)
        common = {
            "apicurio.registry.url": f"{base}/apis/registry/v3",
            "apicurio.registry.auto-register": "true",
            "apicurio.registry.find-latest": "true",
        }
        if converter == "avro-dereferenced":
            common["apicurio.registry.dereference-schema"] = "true"
        kind = "io.apicurio.registry.utils.converter.AvroConverter"
    elif converter == "json":
        kind, common = "org.apache.kafka.connect.json.JsonConverter", {"schemas.enable": "true"}
    elif converter == "json-schemaless":
        # Without a schema, decimals must be JSON numbers: the default base64 bytes would carry no scale.
        kind = "org.apache.kafka.connect.json.JsonConverter"
        common = {"schemas.enable": "false", "decimal.format": "NUMERIC"}
    else:
        raise ServiceError(f"unknown converter {converter!r}: one of {', '.join(CONVERTERS)}")
    settings = {"key.converter": kind, "value.converter": kind}
    for side in ("key", "value"):
        settings.update({f"{side}.converter.{name}": value for name, value in common.items()})
    return settings


def debezium_postgres(
    name: str,
    postgres,
    tables: list[str],
    converter: str = "avro",
    registry_url: str | None = None,
    partitions: int = 1,
    database: str | None = None,
    **overrides: str,
) -> dict[str, str]:
    """The settings of one Debezium PostgreSQL connector: topics `<name>.<schema>.<table>`, slot and publication
    named after it, TRUNCATE captured (the default skips it), a tombstone after each delete."""
    slot = name.replace("-", "_").replace(".", "_")
    return {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(postgres.port),
        "database.user": postgres.user,
        "database.password": "unused",  # trust authentication
        "database.dbname": database or postgres.database,
        "topic.prefix": name,
        "table.include.list": ",".join(tables),
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": slot,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        "skipped.operations": "none",
        "tombstones.on.delete": "true",
        # The local broker creates no topic by itself: Connect creates the connector's topics.
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": str(partitions),
        **converter_settings(converter, registry_url),
        **overrides,
    }


def debezium_mariadb(
    name: str, mariadb, database: str, tables: list[str], history: Path, partitions: int = 1, **overrides: str
) -> dict[str, str]:
    """The settings of one Debezium MariaDB connector (JsonConverter with schemas): topics `<name>.<db>.<table>`,
    the schema history in the file `history`, TRUNCATE captured, a tombstone after each delete."""
    return {
        "name": name,
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(mariadb.port),
        "database.user": mariadb.user,
        "database.password": mariadb.password,
        "database.server.id": "5400",
        "topic.prefix": name,
        "database.include.list": database,
        "table.include.list": ",".join(f"{database}.{t}" for t in tables),
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(history),
        "snapshot.mode": "initial",
        "skipped.operations": "none",
        "tombstones.on.delete": "true",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": str(partitions),
        **converter_settings("json", None),
        **overrides,
    }


class KafkaConnect(LocalService):
    """One Kafka Connect standalone worker with the given connectors (`debezium_postgres(...)` settings). Ready when
    every connector and its task run; `wait_streaming()` waits until each has finished its snapshot."""

    name = "connect"

    def __init__(
        self,
        state_dir: Path,
        bootstrap_servers: str,
        connectors: list[dict[str, str]],
        heap: str = "512m",
        offset_flush_ms: int = 60_000,
        startup_timeout: float = 300.0,
        plugins: str = "postgres",
    ) -> None:
        super().__init__(state_dir, startup_timeout)
        self.bootstrap_servers = bootstrap_servers
        self.connectors = connectors
        self.plugins = plugins  # "postgres": Debezium's PostgreSQL plugin and Apicurio's converter; "mariadb"
        self.heap = heap
        self.offset_flush_ms = offset_flush_ms
        self.port: int | None = None
        self._log_start = 0  # where this launch's lines begin in the (appended) log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        connect = cdc_lib("connect")
        if self.plugins == "mariadb":  # a plugin.path of its own (another Debezium version: jvm/cdc/*.xml)
            plugins = cdc_lib("plugins-mariadb/debezium-mariadb").parent
        else:
            plugins = cdc_lib("plugins/debezium-postgres").parent  # each folder in it is one plugin
            cdc_lib("plugins/apicurio-converter")
        if self.port is None:
            self.port = free_port()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        worker = {
            "bootstrap.servers": self.bootstrap_servers,
            "listeners": self.url,
            "offset.storage.file.filename": self.state_dir / "offsets.dat",
            "offset.flush.interval.ms": self.offset_flush_ms,
            "plugin.path": plugins,
            "plugin.discovery": "service_load",
            # A connector's own converters override these.
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        }
        files = [self._write("worker.properties", worker)]
        files += [self._write(f"connector-{c['name']}.properties", c) for c in self.connectors]
        log4j = self.state_dir / "log4j2.properties"
        log4j.write_text(LOG4J2)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        return [
            java(),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",  # a small heap on a shared machine: no parallel GC threads
            "-XX:TieredStopAtLevel=1",  # starts faster; a few thousand events need no optimizing compiler
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            f"{connect}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            *map(str, files),
        ]

    def _write(self, name: str, settings: dict) -> str:
        path = self.state_dir / name
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return str(path)

    def _request(self, path: str) -> object:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30.0) as response:
            body = response.read()
            return json.loads(body) if body else None

    def restart_cleanly(self, grace: float = 120.0) -> None:
        """A clean stop and start of the worker: on SIGTERM Connect stops every task, which commits its offsets to the
        offsets file, as in an orderly shutdown; returns once each connector streams again. (Stopping and resuming the
        connectors over REST instead now and then hung the standalone herder's resume for minutes.)"""
        offsets = self.state_dir / "offsets.dat"
        before = offsets.stat().st_mtime_ns if offsets.exists() else None
        process, dump = self._process, self.state_dir / "threads-at-stop.txt"
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:  # where its shutdown hangs, for the error (seen once in CI)
                with dump.open("w") as out:
                    try:
                        subprocess.run(
                            [str(Path(java()).with_name("jcmd")), str(process.pid), "Thread.print"],
                            stdout=out,
                            stderr=out,
                            timeout=60,
                        )
                    except (OSError, subprocess.TimeoutExpired) as failed:  # the hang's error below matters more
                        out.write(f"no thread dump: {failed}\n")
        self.stop(grace)
        if process is not None and process.returncode != 143:  # 128 + SIGTERM: the JVM ran its shutdown hooks
            raise self.error(
                f"Kafka Connect did not shut down cleanly within {grace:g}s (exit {process.returncode}; its threads "
                f"then: {dump})"
            )
        if not offsets.exists() or offsets.stat().st_mtime_ns == before:
            raise self.error("Kafka Connect did not write its offsets on a clean shutdown")
        self.start()
        self.wait_streaming()

    def status(self, connector: str) -> dict:
        return self._request(f"/connectors/{connector}/status")  # type: ignore[return-value]

    def probe(self) -> str | None:
        for connector in self.connectors:
            try:
                status = self.status(connector["name"])
            except (OSError, urllib.error.HTTPError) as error:
                return f"Kafka Connect has no status of connector {connector['name']} at {self.url} ({error})"
            states = [status["connector"]["state"], *(task["state"] for task in status.get("tasks", []))]
            if "FAILED" in states:
                traces = [t.get("trace", "") for t in [status["connector"], *status["tasks"]] if t.get("trace")]
                raise self.error(f"connector {connector['name']} failed: {traces[0][:3000] if traces else states}")
            if not status.get("tasks") or set(states) != {"RUNNING"}:
                return f"connector {connector['name']} is {states}"
        return None

    def this_launch_log(self) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    def wait_streaming(self, timeout: float = 300.0) -> None:
        """Wait until every connector, since this launch, has finished its snapshot (if it takes one) and
        streams."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            self.probe()  # raises if a connector failed
            text = self.this_launch_log()
            # Debezium's MariaDB connector logs it without the task's context: a worker's only connector needs none.
            alone = len(self.connectors) == 1 and f"INFO {STREAMING}" in text
            waiting = [
                c["name"] for c in self.connectors if f"[{c['name']}|task-0] {STREAMING}" not in text and not alone
            ]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise self.error(f"connectors {waiting} did not start streaming within {timeout:g}s")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: no offset flush, no clean close of the replication connections, as in a crash."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def _check_alive(self) -> None:
        if self._process is None:
            raise self.error("Kafka Connect is not running")
        super()._check_alive()


def run_connect(state_dir: Path, bootstrap_servers: str, connectors: list[dict[str, str]], **options) -> KafkaConnect:
    """Start a worker and wait until every connector streams (the snapshot is over)."""
    worker = KafkaConnect(state_dir, bootstrap_servers, connectors, **options)
    worker.start()
    worker.wait_streaming()
    return worker
