"""Apache Iceberg's own REST catalog server as the local `type: rest` catalog, and a fault-injecting proxy for it.

The server is `org.apache.iceberg.rest.RESTCatalogServer` (what the project's `iceberg-rest-fixture` image runs), from
the jars jvm/test-pom.xml pins into jvm/test-lib/rest-catalog/ (test-only, never shipped). Every `CATALOG_*`
environment variable becomes a property of the catalog behind it (`__` -> `-`, `_` -> `.`): here an Iceberg JDBC
catalog on SQLite under the state directory, the warehouse on local files (or `s3://` through a moto server). The
server listens on all interfaces (it takes no host): only the port is chosen, a free one.

`CommitProxy` stands between clients and the server: it can hold a table's next commits until several have arrived
(two writers' commits based on the same metadata, the race a test wants), and answer a commit with a server error
after the server applied it (the response lost: the client cannot tell whether it committed).
"""

from __future__ import annotations

import http.client
import http.server
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .processes import LocalService, ServiceError, free_port, java, lib_dir

SERVER_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
# POST .../v1/[<prefix>/]namespaces/<namespace>/tables/<table>: a table's commit (create is POST .../tables).
COMMIT_PATH = re.compile(r"/v1/(?:.+/)?namespaces/([^/]+)/tables/([^/?]+)$")


class RestCatalogServer(LocalService):
    """One Iceberg REST catalog server on a free port. `warehouse`: `file:` under the state directory by default;
    an `s3://` warehouse needs `s3` (a moto server: its endpoint and credentials for the server's S3FileIO).

    `vend_credentials`: the server hands its S3 credentials to clients in every table it loads (the `config` of
    LoadTableResponse, as `s3.access-key-id`...): the fixture's `include-credentials`. It vends them whatever the
    request's `X-Iceberg-Access-Delegation` says (the fixture reads no such header), as static keys, not the
    short-lived, table-scoped ones a vendor's server gives."""

    name = "rest-catalog"

    def __init__(
        self,
        state_dir: Path,
        warehouse: str | None = None,
        s3=None,
        vend_credentials: bool = False,
        heap: str = "384m",
        startup_timeout: float = 60.0,
    ) -> None:
        super().__init__(state_dir, startup_timeout)
        self.warehouse = warehouse or (Path(state_dir).resolve() / "rest-warehouse").as_uri()
        self.s3 = s3
        self.vend_credentials = vend_credentials
        self.heap = heap
        self.port: int | None = None

    @property
    def uri(self) -> str:
        if self.port is None:
            raise ServiceError("the REST catalog server has not been started")
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        self.port = free_port()
        classpath = f"{lib_dir('rest-catalog', test_only=True)}/*"
        return [java(), f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-cp", classpath, SERVER_CLASS]

    def environment(self) -> dict[str, str]:
        db = Path(self.state_dir).resolve() / "rest-catalog.db"
        env = {
            "CATALOG_REST_PORT": str(self.port),
            "CATALOG_URI": f"jdbc:sqlite:file:{db}",
            "CATALOG_JDBC_SCHEMA__VERSION": "V1",  # branches and views need the V1 schema of the JDBC catalog
            "CATALOG_WAREHOUSE": self.warehouse,
        }
        if self.warehouse.startswith("s3://"):
            if self.s3 is None:
                raise ServiceError(f"an s3:// warehouse ({self.warehouse}) needs an S3 endpoint (a moto server)")
            env |= self.s3.aws_env() | {
                "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
                "CATALOG_S3_ENDPOINT": self.s3.endpoint,
                "CATALOG_S3_PATH__STYLE__ACCESS": "true",
            }
            if self.vend_credentials:
                aws = self.s3.aws_env()
                env |= {
                    "CATALOG_INCLUDE__CREDENTIALS": "true",
                    "CATALOG_S3_ACCESS__KEY__ID": aws["AWS_ACCESS_KEY_ID"],
                    "CATALOG_S3_SECRET__ACCESS__KEY": aws["AWS_SECRET_ACCESS_KEY"],
                }
        return env

    def probe(self) -> str | None:
        url = f"{self.uri}/v1/config"
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return None
        except urllib.error.HTTPError as error:
            return f"the REST catalog server answered {error.code} at {url}"
        except OSError as error:
            return f"the REST catalog server did not answer at {url} ({error})"

    def catalog(self, uri: str | None = None) -> dict:
        """The `icefloe:catalog` block (stack-file spelling) for this server (or a proxy of it at `uri`); with an
        `s3://` warehouse, the S3 endpoint clients write the data to, and (vending) the access-delegation ask."""
        block = {"type": "rest", "uri": uri or self.uri, "warehouse": self.warehouse}
        if self.warehouse.startswith("s3://"):
            block["endpoints"] = {key: value for key, value in self.s3.catalog_endpoints().items() if key != "glue"}
            if self.vend_credentials:
                block["accessDelegation"] = "vended-credentials"
        return block

    def pyiceberg_catalog(self, name: str = "icefloe"):
        """pyiceberg's REST catalog on this server: an independent reader (an `s3://` warehouse's credentials from
        the server when it vends them, else the moto server's)."""
        from pyiceberg.catalog.rest import RestCatalog

        properties = {}
        if self.warehouse.startswith("s3://"):
            endpoints = self.s3.catalog_endpoints()
            properties = {"s3.endpoint": endpoints["s3"], "client.region": endpoints["region"]}
            if not self.vend_credentials:
                aws = self.s3.aws_env()
                properties |= {
                    "s3.access-key-id": aws["AWS_ACCESS_KEY_ID"],
                    "s3.secret-access-key": aws["AWS_SECRET_ACCESS_KEY"],
                }
        return RestCatalog(name, uri=self.uri, warehouse=self.warehouse, **properties)


class CommitProxy:
    """An HTTP proxy in this process in front of a REST catalog server (`upstream`), at `uri`; every table commit it
    passes is noted in `events` as (table, what happened)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.events: list[tuple[str, str]] = []
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization's scheme)
        self.delegations: list[tuple[str, str, str | None]] = []  # (method, path, X-Iceberg-Access-Delegation)
        self._lock = threading.Condition()
        self._gates: dict[str, list] = {}  # table -> [count, arrived, timeout]
        self._failures: dict[str, list[int]] = {}  # table -> statuses to answer after forwarding
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 (the stdlib's name)
                proxy._handle(self)

            do_POST = do_DELETE = do_HEAD = do_PUT = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> CommitProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def gate_commits(self, table: str, count: int, timeout: float = 120) -> None:
        """Hold table `table`'s (`namespace.table`) next `count` commits until all have arrived (at most `timeout`
        seconds), then pass them on one at a time: each was based on the metadata its writer read."""
        with self._lock:
            self._gates[table] = [count, 0, timeout]
            self.events.append((table, f"the next {count} commits held"))

    def fail_commits(self, table: str, statuses: list[int]) -> None:
        """Answer `table`'s next commits with these HTTP statuses, after passing each to the server (which applies
        it): the client sees a server error for a commit that happened."""
        with self._lock:
            self._failures[table] = list(statuses)

    def commits(self, table: str) -> list[str]:
        return [what for name, what in self.events if name == table]

    def _handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        authorization = request.headers.get("Authorization")
        self.requests.append((request.command, request.path, authorization.split(" ")[0] if authorization else None))
        self.delegations.append((request.command, request.path, request.headers.get("X-Iceberg-Access-Delegation")))
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else None
        match = COMMIT_PATH.search(request.path.split("?")[0])
        table = f"{match.group(1)}.{match.group(2)}" if match and request.command == "POST" else None
        if table is not None:
            self._wait_at_gate(table)
            with self._lock:  # one commit at a time through a gate: the server sees them in order
                status, headers, payload = self._forward(request, body)
                fail = self._failures.get(table)
                if fail:
                    injected = fail.pop(0)
                    self.events.append((table, f"{status}, answered {injected}"))
                    status, payload = injected, _error(injected)
                    headers = {"Content-Type": "application/json"}
                else:
                    self.events.append((table, str(status)))
        else:
            status, headers, payload = self._forward(request, body)
        request.send_response(status)
        for key, value in headers.items():
            request.send_header(key, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(payload)

    def _wait_at_gate(self, table: str) -> None:
        with self._lock:
            gate = self._gates.get(table)
            if gate is None:
                return
            gate[1] += 1
            if gate[1] == gate[0]:
                del self._gates[table]
                self.events.append((table, f"{gate[0]} commits held, released together"))
                self._lock.notify_all()
                return
            if not self._lock.wait_for(lambda: table not in self._gates, gate[2]):
                self._gates.pop(table, None)
                self.events.append((table, f"gate timed out with {gate[1]} of {gate[0]} commits"))
                self._lock.notify_all()

    def _forward(self, request, body: bytes | None) -> tuple[int, dict[str, str], bytes]:
        target = urllib.parse.urlsplit(self.upstream)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
        try:
            skip = {"host", "content-length", "connection", "transfer-encoding"}
            headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
            connection.request(request.command, request.path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in skip}
            return response.status, kept, payload
        finally:
            connection.close()


def _error(status: int) -> bytes:
    kind = {500: "InternalServerError", 502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}
    return json.dumps(
        {"error": {"message": "injected by the test proxy", "type": kind.get(status, "ServerError"), "code": status}}
    ).encode()
