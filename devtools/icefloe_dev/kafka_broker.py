"""Apache Kafka as the local broker: one single-node KRaft process (broker and controller) on loopback ports.

The jars come from jvm/pom.xml (scripts/setup.sh puts them in jvm/lib/kafka). Each start formats a fresh log
directory under the state directory (a directory formatted for another cluster id cannot be reused), so a broker
starts empty; its log is `kafka.log` beside the data and is quoted in every start-up error.

For tests of secured clusters, `security=BrokerSecurity(...)` adds two listeners beside the plaintext one (which the
tests and the readiness probe keep using to create topics and produce): SASL_SSL with SCRAM-SHA-512 users (created
at format time) and PLAIN users, and SSL that requires a client certificate signed by the test CA. The demo stays
plaintext.
"""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from .processes import JvmService, ServiceError, free_ports, java, lib_dir, retry

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = warn
"""


def new_cluster_id() -> str:
    """A KRaft cluster id: base64url of 16 random bytes, no padding, not starting with '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class BrokerSecurity:
    """The secured listeners' settings: the CA that clients trust and that signs client certificates, the broker's
    own certificate and key (PEM files), and the SASL users by mechanism."""

    ca_certificate: Path
    certificate: Path
    key: Path
    scram_users: dict[str, str] = field(default_factory=dict)  # SCRAM-SHA-512
    plain_users: dict[str, str] = field(default_factory=dict)


def _jaas_quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


class KafkaBroker(JvmService):
    """A single-node Apache Kafka 4.x broker. Use as a context manager, or `start()` / `stop()`."""

    name = "kafka"

    def __init__(
        self,
        state_dir: Path,
        heap: str = "512m",
        startup_timeout: float = 90.0,
        log_level: str = "warn",
        security: BrokerSecurity | None = None,
    ):
        super().__init__(state_dir, startup_timeout)
        self.security = security
        self.sasl_ssl_port: int | None = None
        self.ssl_port: int | None = None
        self.heap = heap
        self.log_level = log_level
        self.port: int | None = None
        self.controller_port: int | None = None
        self.cluster_id = new_cluster_id()
        self._admin: AdminClient | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise ServiceError("the broker has not been started")
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl_servers(self) -> str:
        """The SASL_SSL listener (SCRAM-SHA-512 and PLAIN), with `security`."""
        if self.sasl_ssl_port is None:
            raise ServiceError("the broker has no SASL_SSL listener (start it with security=...)")
        return f"127.0.0.1:{self.sasl_ssl_port}"

    @property
    def ssl_servers(self) -> str:
        """The SSL listener that requires a client certificate, with `security`."""
        if self.ssl_port is None:
            raise ServiceError("the broker has no SSL listener (start it with security=...)")
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            raise ServiceError("the broker is not running")
        return self._admin

    def _properties(self, data_dir: Path) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data_dir),
            "num.partitions": 1,
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # Tests of compaction and retention should not wait minutes for the cleaner.
            "log.cleaner.backoff.ms": 1000,
            "log.retention.check.interval.ms": 1000,
        }
        if self.security is not None:
            settings |= self._secured_listeners(data_dir)
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _secured_listeners(self, data_dir: Path) -> dict[str, str | int]:
        security = self.security
        assert security is not None
        # One PEM keystore file: the broker's key, its certificate, then the CA (Kafka reads them in that order).
        keystore = data_dir.parent / "broker-keystore.pem"
        keystore.write_text(security.key.read_text() + security.certificate.read_text())
        plain = " ".join(f'user_{name}="{_jaas_quoted(pw)}"' for name, pw in security.plain_users.items())
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},SASL_SSL://127.0.0.1:{self.sasl_ssl_port},"
            f"SSL://127.0.0.1:{self.ssl_port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},SASL_SSL://127.0.0.1:{self.sasl_ssl_port},"
            f"SSL://127.0.0.1:{self.ssl_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(security.ca_certificate),
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};"
            ),
        }

    def _scram_arguments(self) -> list[str]:
        """`StorageTool format` creates the SCRAM users (no admin call needed after start)."""
        users = self.security.scram_users if self.security else {}
        return [
            arg
            for name, password in users.items()
            for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")
        ]

    def command(self) -> list[str]:
        """Format a fresh log directory on the first start; a later start (after `stop()`) is a restart on the same
        ports with the same data, as a broker coming back from an outage."""
        libs = lib_dir("kafka")
        config = self.state_dir / "server.properties"
        log4j = self.state_dir / "log4j2.properties"
        # As Kafka Connect's worker: C1 only and the serial collector start a test's broker in about half the CPU
        # time (the optimizing compiler's threads would compete with Spark on a 2-core machine for little gain).
        base = [java(), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Dlog4j2.configurationFile={log4j}"]
        base += ["-cp", f"{libs}/*"]
        if self.port is None:
            if self.security is None:
                self.port, self.controller_port = free_ports(2)
            else:
                self.port, self.controller_port, self.sasl_ssl_port, self.ssl_port = free_ports(4)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            data_dir = self.state_dir / f"data-{self.cluster_id}"
            config.write_text(self._properties(data_dir))
            log4j.write_text(LOG4J2.format(level=self.log_level.upper()))
            formatted = subprocess.run(
                [
                    *base,
                    "-Xmx256m",
                    "kafka.tools.StorageTool",
                    "format",
                    "--config",
                    str(config),
                    "--cluster-id",
                    self.cluster_id,
                    "--standalone",
                    *self._scram_arguments(),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if formatted.returncode != 0:
                raise ServiceError(f"formatting {data_dir} failed: {formatted.stdout}{formatted.stderr}")
        return [*base, f"-Xmx{self.heap}", "kafka.Kafka", str(config)]

    def probe(self) -> str | None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=1.0)
        except KafkaException as error:
            return f"the broker did not answer on {self.bootstrap_servers} ({error.args[0].str()})"
        if metadata.cluster_id != self.cluster_id:
            return f"another broker (cluster id {metadata.cluster_id!r}) answers on {self.bootstrap_servers}"
        self._admin = admin
        return None

    def stop(self, grace: float = 15.0) -> None:
        self._admin = None
        super().stop(grace)

    # -- topics
    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 30.0):
        """Create a topic and return once metadata shows all its partitions with a leader."""
        futures = self.admin.create_topics(
            [NewTopic(name, partitions, 1, config=config or {})], operation_timeout=timeout
        )
        try:
            futures[name].result(timeout)
        except KafkaException as error:
            raise ServiceError(f"could not create topic {name!r}: {error}") from error
        self.wait_for_partitions(name, partitions, timeout)

    def add_partitions(self, name: str, total: int, timeout: float = 30.0) -> None:
        self.admin.create_partitions([NewPartitions(name, total)])[name].result(timeout)
        self.wait_for_partitions(name, total, timeout)

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        self.admin.delete_topics([name], operation_timeout=timeout)[name].result(timeout)

        def gone() -> None:
            if name in self.admin.list_topics(timeout=5).topics:
                raise ServiceError(f"topic {name!r} still listed")

        retry(gone, timeout, f"deleting topic {name!r}")

    def wait_for_partitions(self, name: str, partitions: int, timeout: float = 30.0) -> None:
        def ready() -> None:
            topic = self.admin.list_topics(topic=name, timeout=5).topics.get(name)
            if (
                topic is None
                or topic.error is not None
                or len(topic.partitions) != partitions
                or not all(p.leader >= 0 for p in topic.partitions.values())
            ):
                raise ServiceError(f"topic {name!r} does not show {partitions} partitions with a leader yet")

        retry(ready, timeout, f"topic {name!r}")
        time.sleep(0.1)  # leaders are known to metadata slightly before they accept produce requests
