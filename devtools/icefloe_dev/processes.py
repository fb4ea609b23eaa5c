"""A local service as a child process: free loopback ports, a log file, readiness, a clean stop.

The Kafka broker and the schema registry (JVMs) and the moto server (Python) run this way for the demo, the tests and
the benchmarks.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from icefloe.errors import IcefloeError
from icefloe.session import jvm_lib


def _die_with_parent() -> None:
    """In the child, before exec: Linux sends it SIGTERM when the process that started it dies, so a killed test
    run or demo leaves no broker or registry behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: stop() still runs on every normal exit


class ServiceError(IcefloeError):
    """A local service could not be found, started or used."""


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports: the sockets stay bound until all are chosen, so no port repeats (two
    calls in a row may get the same port back, and Kafka refuses one port for two listeners)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


def java() -> str:
    found = shutil.which("java")
    if found is None:
        raise ServiceError("Java 17 is needed for the local broker and registry: run scripts/setup.sh")
    return found


def lib_dir(name: str, test_only: bool = False) -> Path:
    """A directory under jvm/lib/ (or, `test_only`, jvm/test-lib/: jvm/test-pom.xml) that scripts/setup.sh fills; a
    clear error when it has not run."""
    path = (jvm_lib().parent / "test-lib" if test_only else jvm_lib()) / name
    if not path.is_dir() or not any(path.iterdir()):
        pom = "jvm/test-pom.xml" if test_only else "jvm/pom.xml"
        raise ServiceError(f"{path} is missing or empty: run scripts/setup.sh (it fetches {pom} with Maven)")
    return path


class LocalService:
    """One child process whose output goes to `log_path`. Subclasses say how to start it and when it is ready."""

    name = "service"

    def __init__(self, state_dir: Path, startup_timeout: float) -> None:
        self.state_dir = Path(state_dir)
        self.startup_timeout = startup_timeout
        self.log_path = self.state_dir / f"{self.name}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0

    # -- what a subclass provides
    def command(self) -> list[str]:
        raise NotImplementedError

    def probe(self) -> str | None:
        """None when ready, else what is still missing (said in the error if startup times out)."""
        raise NotImplementedError

    def on_ready(self) -> None:
        """Set-up after the service answers (e.g. configuration)."""

    def popen_options(self) -> dict:
        """Extra `subprocess.Popen` arguments (e.g. `user=` for a server that refuses to run as root)."""
        return {}

    def environment(self) -> dict[str, str]:
        """Variables the child gets on top of this process's environment (e.g. its configuration)."""
        return {}

    # -- lifecycle
    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def launch(self) -> None:
        """Start the process without waiting (so several services can start side by side)."""
        if self._process is not None:
            raise ServiceError(f"the {self.name} is already running")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        command = self.command()
        with open(self.log_path, "ab") as log:  # appended: a restarted service keeps its earlier log
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env=os.environ.copy() | self.environment(),
                start_new_session=True,
                preexec_fn=_die_with_parent,
                **self.popen_options(),
            )
        self._started_at = time.monotonic()

    def wait_until_ready(self) -> None:
        deadline = self._started_at + self.startup_timeout
        try:
            while True:
                self._check_alive()
                problem = self.probe()
                if problem is None:
                    self.on_ready()
                    return
                if time.monotonic() > deadline:
                    raise self.error(f"{problem} after {self.startup_timeout:g}s")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def start(self):
        self.launch()
        self.wait_until_ready()
        return self

    def _check_alive(self) -> None:
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            raise self.error(f"the {self.name} exited with code {code} while starting")

    def error(self, problem: str) -> ServiceError:
        return ServiceError(f"{problem}\n--- last lines of {self.log_path} ---\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds. Safe to call twice."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self):
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class DataDirService(LocalService):
    """A service whose data directory (`data_dir`: a fresh temporary directory the subclass makes at the first start)
    outlives `stop()`, so `stop()` then `start()` restarts it on the same data; `remove()` (or leaving the context)
    stops it and deletes the directory."""

    def __init__(self, state_dir: Path, startup_timeout: float) -> None:
        super().__init__(state_dir, startup_timeout)
        self.data_dir: Path | None = None

    def remove(self) -> None:
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


# The broker and the registry subclass it under this name.
JvmService = LocalService


def start_together(*services: LocalService) -> None:
    """Launch every service, then wait for each: start-up times overlap instead of adding up."""
    launched: list[LocalService] = []
    try:
        for service in services:
            service.launch()
            launched.append(service)
        for service in services:
            service.wait_until_ready()
    except BaseException:
        for service in launched:
            service.stop()
        raise


def retry(action: Callable[[], object], timeout: float, what: str) -> object:
    """Call `action` until it returns without raising (metadata is eventually consistent right after changes)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except Exception as error:
            if time.monotonic() > deadline:
                raise ServiceError(f"{what}: {error}") from error
            time.sleep(0.1)
