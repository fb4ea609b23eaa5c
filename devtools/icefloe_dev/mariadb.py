"""A private MariaDB server (Debian's `mariadb-server` package) for the change-data tests.

`mariadb-install-db` into a fresh directory, then `mariadbd` on a free loopback port with what Debezium's MariaDB
connector needs: the binary log in ROW format with full row images, a server id (GTIDs are MariaDB's own, always
on). No grant tables are skipped: the connector logs in as `debezium` (password `debezium`) with the replication
privileges. Statements go through the `mariadb` client over the server's socket (no Python driver needed).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from .processes import DataDirService, ServiceError, free_port

USER, PASSWORD = "debezium", "debezium"
GRANTS = "SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT, LOCK TABLES"


def os_user() -> str:
    """The user the server runs as: whoever runs the tests (`--user=root` made a user's `mariadb-install-db` fail:
    "Cannot change ownership of the database directories to the 'root' user")."""
    return pwd.getpwuid(os.getuid()).pw_name


def mariadb_bin(program: str) -> str:
    found = shutil.which(program) or (f"/usr/sbin/{program}" if Path(f"/usr/sbin/{program}").exists() else None)
    if found is None:
        raise ServiceError(
            f"MariaDB's {program} is missing: run scripts/setup.sh (it installs Debian's mariadb-server)"
        )
    return found


class MariaDBServer(DataDirService):
    """One MariaDB server on a free loopback port, its data directory made fresh at the first start and removed on
    leaving the context. `stop()` then `start()` restarts the same server."""

    name = "mariadb"

    def __init__(self, state_dir: Path, startup_timeout: float = 60.0) -> None:
        super().__init__(state_dir, startup_timeout)
        self.user, self.password = USER, PASSWORD
        self.port: int | None = None

    @property
    def socket(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / "mariadb.sock"

    def _install(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="icefloe-mariadb-"))
        done = subprocess.run(
            [mariadb_bin("mariadb-install-db"), "--no-defaults", f"--datadir={self.data_dir / 'data'}",
             f"--user={os_user()}", "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, text=True, timeout=120, cwd="/",
        )  # fmt: skip
        if done.returncode != 0:
            raise ServiceError(f"mariadb-install-db {self.data_dir} failed: {done.stdout}{done.stderr}")
        self.port = free_port()

    def command(self) -> list[str]:
        if self.data_dir is None:
            self._install()
        assert self.data_dir is not None
        return [
            mariadb_bin("mariadbd"), "--no-defaults", f"--datadir={self.data_dir / 'data'}", f"--socket={self.socket}",
            f"--port={self.port}", "--bind-address=127.0.0.1", f"--user={os_user()}", "--server-id=1",
            f"--log-bin={self.data_dir / 'binlog'}", "--binlog-format=ROW", "--binlog-row-image=FULL",
            "--innodb-flush-log-at-trx-commit=0", "--innodb-buffer-pool-size=32M", "--skip-name-resolve",
            "--default-time-zone=+00:00",
        ]  # fmt: skip

    def probe(self) -> str | None:
        done = subprocess.run(
            [mariadb_bin("mariadb"), f"--socket={self.socket}", "-uroot", "-e", "SELECT 1"],
            capture_output=True,
            text=True,
        )
        return None if done.returncode == 0 else f"MariaDB does not accept connections on {self.socket}"

    def on_ready(self) -> None:
        self.sql(
            f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; GRANT {GRANTS} ON *.* TO '{USER}'@'%';"
        )

    def sql(self, script: str, database: str | None = None, timeout: float = 300.0) -> str:
        """Run a script of statements (stopping at the first error); returns the client's tab-separated output."""
        done = subprocess.run(
            [mariadb_bin("mariadb"), f"--socket={self.socket}", "-uroot", "-N", "-B", "-r", *([database] if database else [])],
            input=script, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise ServiceError(
                f"mariadb on {self.socket} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        return done.stdout

    def rows(self, table: str, columns: list[str], database: str) -> list[dict[str, Any]]:
        """`SELECT columns FROM table` as MariaDB's JSON of each row (`JSON_OBJECT`): decimals as Decimal (never
        float), dates and datetimes as their text."""
        pairs = ", ".join(f"'{c}', `{c}`" for c in columns)
        out = self.sql(f"SELECT JSON_OBJECT({pairs}) FROM `{table}`;", database=database)
        return [json.loads(line, parse_float=Decimal) for line in out.splitlines() if line]
