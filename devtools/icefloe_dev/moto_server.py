"""moto as the local AWS control plane: one `moto_server` child process serving Glue, S3 and STS on loopback.

This is how the EMR job's catalog code path (Iceberg `GlueCatalog` + `S3FileIO`) runs on one machine: the job's own
Glue catalog settings plus endpoint overrides that point at this server (`icefloe:catalog.endpoints`).

Plain moto ignores the `VersionId` of Glue's `UpdateTable`, so concurrent commits to one table are silently lost
(both writers see success), where real Glue refuses a stale `VersionId` with `ConcurrentModificationException` and
Iceberg (Java and pyiceberg) retries the commit. A concurrency test on plain moto would fail for moto's reason, so this
module is also the child's entry point (`python -m icefloe_dev.moto_server --port N`): it wraps moto's Glue
`UpdateTable` handler so that, under one lock, a request whose `VersionId` is not the table's current one is refused
with Glue's error. The wrapper relies on moto internals (`GlueResponse.update_table`, `FakeTable._current_version`),
hence moto is pinned (`MOTO_VERSION`, pyproject's dev extra) and the child refuses any other version. The child also
moves an S3 object's LastModified back on request (`MotoServer.backdate_object`): a test plants a file "left by a
crashed run" older than `orphanFileAge` (at least a minute) without waiting for it to age. And it can hold a table's
next Glue `UpdateTable` requests until a given number of them have arrived (`MotoServer.gate_updates`): two writers
stopped just before their commits then send them based on the same version, the race a test wants to show.
"""

from __future__ import annotations

import argparse
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .processes import LocalService, ServiceError, free_port

MOTO_VERSION = "5.2.5"
REGION = "us-east-1"
# moto accepts any credentials; these only have to exist so that no client looks for real ones.
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"
BACKDATE_PATH = "/moto-api/icefloe/backdate"
GATE_PATH = "/moto-api/icefloe/gate-updates"


class MotoServer(LocalService):
    """One moto server on a free loopback port; `enforce_glue_versions=False` runs plain moto (to show its losses)."""

    name = "moto"

    def __init__(self, state_dir: Path, enforce_glue_versions: bool = True, startup_timeout: float = 60.0) -> None:
        super().__init__(state_dir, startup_timeout)
        self.enforce_glue_versions = enforce_glue_versions
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise ServiceError("the moto server has not been started")
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        self.port = free_port()
        plain = [] if self.enforce_glue_versions else ["--plain"]
        return [sys.executable, "-m", "icefloe_dev.moto_server", "--port", str(self.port), *plain]

    def probe(self) -> str | None:
        url = f"{self.endpoint}/moto-api/data.json"
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return None
        except urllib.error.HTTPError as error:
            return f"the moto server answered {error.code} at {url}"
        except OSError as error:
            return f"the moto server did not answer at {url} ({error})"

    # -- what clients need to reach it
    def aws_env(self) -> dict[str, str]:
        """Environment for a process whose AWS clients (JVM SDK, boto3) must use this server's fake account.

        Credentials and region come from the environment (the Glue client of Iceberg Java ignores
        `s3.access-key-id`); the endpoints come from the catalog settings (`catalog_endpoints`).
        """
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_REGION": REGION,  # the JVM SDK
            "AWS_DEFAULT_REGION": REGION,  # boto3
        }

    def catalog_endpoints(self) -> dict[str, str]:
        """The `icefloe:catalog.endpoints` block (stack-file spelling) for a Glue catalog served by this server."""
        return {"glue": self.endpoint, "s3": self.endpoint, "region": REGION}

    def backdate_object(self, bucket: str, key: str, seconds: float) -> None:
        """Move an S3 object's LastModified `seconds` into the past (`allow_backdating_objects`): a file a crashed
        run left behind long ago, without waiting for it to age."""
        query = urllib.parse.urlencode({"bucket": bucket, "key": key, "seconds": seconds})
        request = urllib.request.Request(f"{self.endpoint}{BACKDATE_PATH}?{query}", method="POST")
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as error:
            raise ServiceError(
                f"the moto server did not backdate s3://{bucket}/{key}: {error.code} {error.read().decode()}"
            ) from None

    def gate_updates(self, identifier: str, count: int, timeout: float = 120) -> None:
        """Hold the next `count` Glue `UpdateTable` requests of table `identifier` (`database.table`) until all `count`
        have arrived (at most `timeout` seconds), then let them through together: each was sent with the version its
        writer read, so all but the first are stale (refused when versions are enforced, lost on plain moto)."""
        query = urllib.parse.urlencode({"table": identifier, "count": count, "timeout": timeout})
        request = urllib.request.Request(f"{self.endpoint}{GATE_PATH}?{query}", method="POST")
        urllib.request.urlopen(request, timeout=10).close()

    def client(self, service: str):
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
        )

    def pyiceberg_catalog(self, name: str = "icefloe", warehouse: str | None = None):
        """pyiceberg's Glue catalog (Glue and S3 through this server): an independent reader and writer."""
        from pyiceberg.catalog.glue import GlueCatalog

        properties = {
            "glue.endpoint": self.endpoint,
            "s3.endpoint": self.endpoint,
            "client.region": REGION,
            "client.access-key-id": ACCESS_KEY_ID,
            "client.secret-access-key": SECRET_ACCESS_KEY,
        }
        if warehouse:
            properties["warehouse"] = warehouse
        return GlueCatalog(name, **properties)


# -- the child process ---------------------------------------------------------------------------------------------


class UpdateGates:
    """Tables whose next Glue `UpdateTable` requests wait for each other (`MotoServer.gate_updates`)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._gates: dict[str, dict] = {}  # "database.table" -> {"count", "arrived", "timeout"}

    def arm(self, identifier: str, count: int, timeout: float) -> None:
        with self._changed:
            self._gates[identifier] = {"count": count, "arrived": 0, "timeout": timeout}
        _say(f"glue UpdateTable {identifier}: the next {count} requests wait for each other")

    def pass_through(self, identifier: str) -> None:
        """Wait, if `identifier` is gated, until the gate's count of requests have arrived (or its timeout)."""
        with self._changed:
            gate = self._gates.get(identifier)
            if gate is None:
                return
            gate["arrived"] += 1
            if gate["arrived"] >= gate["count"]:
                del self._gates[identifier]
                _say(f"glue UpdateTable {identifier}: {gate['count']} requests held, released together")
                self._changed.notify_all()
                return
            if not self._changed.wait_for(lambda: self._gates.get(identifier) is not gate, gate["timeout"]):
                self._gates.pop(identifier, None)
                _say(
                    f"glue UpdateTable {identifier}: gate timed out with {gate['arrived']} of {gate['count']} requests"
                )


GATES = UpdateGates()


def gate_glue_table_updates() -> None:
    """Serve `POST /moto-api/icefloe/gate-updates?table=&count=&timeout=` and make moto's Glue `UpdateTable` pass
    `GATES` first, outside the version check's lock (moto 5.2.5 internals)."""
    from moto.glue.responses import GlueResponse
    from moto.moto_api._internal import urls

    def gate(request, full_url, headers):
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(full_url).query))
        GATES.arm(query["table"], int(query["count"]), float(query["timeout"]))
        return 200, {}, "{}"

    urls.url_paths["{0}" + GATE_PATH] = gate

    original = GlueResponse.update_table

    def update_table(self: GlueResponse):
        database = self.parameters.get("DatabaseName")
        name = (self.parameters.get("TableInput") or {}).get("Name")
        GATES.pass_through(f"{database}.{name}")
        return original(self)

    GlueResponse.update_table = update_table


def enforce_glue_table_versions() -> None:
    """Make moto's Glue `UpdateTable` refuse a stale `VersionId`, as Glue does (moto 5.2.5 internals).

    moto's counter starts at 1 where Glue's starts at 0; clients only echo the `VersionId` that `GetTable` gave them,
    so the request is compared with moto's own counter, never with a number computed here. A request without a
    `VersionId` is not checked (Glue does not check it either; Iceberg Java omits it when a `lock-impl` is set).
    """
    import moto
    from moto.glue.exceptions import GlueClientError
    from moto.glue.responses import GlueResponse

    if moto.__version__ != MOTO_VERSION:
        raise SystemExit(
            f"icefloe_dev.moto_server wraps moto {MOTO_VERSION} internals, found moto {moto.__version__}: "
            f"install moto[server]=={MOTO_VERSION} (pyproject's dev extra)"
        )

    class ConcurrentModificationException(GlueClientError):
        def __init__(self, message: str) -> None:
            super().__init__("ConcurrentModificationException", message)

    original = GlueResponse.update_table
    lock = threading.Lock()  # the server is threaded: compare and update must be one step

    def update_table(self: GlueResponse):
        database = self.parameters.get("DatabaseName")
        name = (self.parameters.get("TableInput") or {}).get("Name")
        sent = self.parameters.get("VersionId")
        with lock:
            if sent is None:
                _say(f"glue UpdateTable {database}.{name}: no VersionId, not checked")
                return original(self)
            current = str(self.glue_backend.get_table(database, name)._current_version)
            if sent != current:
                _say(f"glue UpdateTable {database}.{name}: VersionId {sent} is stale (current {current}), refused")
                raise ConcurrentModificationException(
                    f"Update table failed due to concurrent modifications: table {database}.{name} is at version "
                    f"{current}, the update was based on version {sent}"
                )
            result = original(self)
            _say(f"glue UpdateTable {database}.{name}: VersionId {sent} is current, accepted")
            return result

    GlueResponse.update_table = update_table


def allow_backdating_objects() -> None:
    """Serve `POST /moto-api/icefloe/backdate?bucket=&key=&seconds=`, which moves an S3 object's LastModified back
    (moto 5.2.5 internals: moto's API routes are read from `url_paths` when the app is built)."""
    from datetime import timedelta

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.moto_api._internal import urls
    from moto.s3.models import s3_backends

    def backdate(request, full_url, headers):
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(full_url).query))
        stored = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(query["bucket"], query["key"])
        if stored is None:
            return 404, {}, f"no object s3://{query['bucket']}/{query['key']}"
        stored.last_modified -= timedelta(seconds=float(query["seconds"]))
        _say(f"s3 {query['bucket']}/{query['key']}: LastModified moved back {query['seconds']}s")
        return 200, {}, "{}"

    urls.url_paths["{0}" + BACKDATE_PATH] = backdate


def _say(line: str) -> None:
    print(line, flush=True)  # stdout is the server's log file


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m icefloe_dev.moto_server", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--plain", action="store_true", help="plain moto: Glue UpdateTable's VersionId is ignored")
    args = parser.parse_args(argv)
    from moto.server import main as moto_main

    allow_backdating_objects()
    if args.plain:
        _say("plain moto: Glue UpdateTable VersionId is NOT enforced")
    else:
        enforce_glue_table_versions()
        _say("Glue UpdateTable VersionId enforced (stale versions get ConcurrentModificationException)")
    gate_glue_table_updates()  # outermost: a held request is checked when it is let through
    moto_main(["--host", "127.0.0.1", "--port", str(args.port)])


if __name__ == "__main__":
    main()
