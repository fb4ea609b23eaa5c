"""A private PostgreSQL cluster (Debian's `postgresql` package) for the change-data tests and `icefloe demo --cdc`.

`initdb` into a fresh directory, `wal_level=logical` so that Debezium can read changes through `pgoutput`, trust
authentication on loopback only, `fsync=off` (a test database), the server's time zone UTC. PostgreSQL refuses to run
as root: as root the cluster runs as the `postgres` user, in a directory of its own under the system temp directory
(the state directory may not be reachable by that user); the server's log stays in the state directory. Statements
go through `psql` (no Python driver needed): `sql()` runs a script, `rows()` returns a query's rows as JSON values.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from .processes import DataDirService, ServiceError, free_port

SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "timezone": "'UTC'",
    "shared_buffers": "'32MB'",
}


def postgres_bin(program: str) -> str:
    """A PostgreSQL program from Debian's versioned directory (newest version), else from PATH."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"), key=lambda p: int(p.parts[-3]))
    if found:
        return str(found[-1])
    on_path = shutil.which(program)
    if on_path is None:
        raise ServiceError(f"PostgreSQL's {program} is missing: run scripts/setup.sh (it installs Debian's postgresql)")
    return on_path


class PostgresCluster(DataDirService):
    """One PostgreSQL server on a free loopback port, its cluster made fresh at the first start and removed by
    `remove()` (or leaving the context). `stop()` then `start()` restarts the same cluster."""

    name = "postgres"

    def __init__(self, state_dir: Path, startup_timeout: float = 60.0, database: str = "icefloe") -> None:
        super().__init__(state_dir, startup_timeout)
        self.database = database
        self.user = "postgres"
        self.port: int | None = None
        self._run_as = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def _as_server_user(self) -> dict:
        if self._run_as is None:
            return {}
        return {"user": self._run_as.pw_uid, "group": self._run_as.pw_gid, "extra_groups": []}

    def popen_options(self) -> dict:
        return self._as_server_user()

    def _initdb(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="icefloe-postgres-"))
        if self._run_as is not None:
            os.chown(self.data_dir, self._run_as.pw_uid, self._run_as.pw_gid)
        done = subprocess.run(
            [postgres_bin("initdb"), "-D", str(self.data_dir), "-U", self.user, "-A", "trust", "-E", "UTF8",
             "--locale=C", "--no-sync"],
            capture_output=True, text=True, timeout=120, cwd="/", **self._as_server_user(),
        )  # fmt: skip
        if done.returncode != 0:
            raise ServiceError(f"initdb {self.data_dir} failed: {done.stdout}{done.stderr}")
        self.port = free_port()
        settings = {**SERVER_SETTINGS, "port": self.port, "unix_socket_directories": f"'{self.data_dir}'"}
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("".join(f"{key} = {value}\n" for key, value in settings.items()))

    def command(self) -> list[str]:
        if self.data_dir is None:
            self._initdb()
        return [postgres_bin("postgres"), "-D", str(self.data_dir)]

    def probe(self) -> str | None:
        done = subprocess.run(
            [postgres_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-t", "1"],
            capture_output=True, text=True,
        )  # fmt: skip
        return None if done.returncode == 0 else f"PostgreSQL does not accept connections on port {self.port}"

    def on_ready(self) -> None:
        self.create_database(self.database)

    def create_database(self, name: str) -> str:
        """Create a database unless it exists (a test module's own, on the shared cluster); returns its name."""
        exists = self.sql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'", database="postgres")
        if not exists.strip():
            self.sql(f'CREATE DATABASE "{name}"', database="postgres")
        return name

    def stop(self, grace: float = 15.0) -> None:
        """A fast shutdown (SIGINT): SIGTERM would wait for every client, and a replication client never leaves."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        super().stop(grace)

    # -- statements
    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def sql(self, script: str, database: str | None = None, timeout: float = 300.0) -> str:
        """Run a script of statements through psql (stopping at the first error); returns psql's unaligned output."""
        done = subprocess.run(
            ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", self.user, "-d", database or self.database],
            input=script, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise ServiceError(f"psql on {self.dsn} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        return done.stdout

    def rows(self, query: str, database: str | None = None) -> list[dict[str, Any]]:
        """A query's rows as PostgreSQL's own JSON of them (`row_to_json`): numbers as Decimal (never float),
        timestamps, dates and UUIDs as their ISO text, arrays as lists, json/jsonb as the JSON value."""
        out = self.sql(f"SELECT row_to_json(q) FROM ({query}) AS q", database=database)
        return [json.loads(line, parse_float=Decimal) for line in out.splitlines() if line]
