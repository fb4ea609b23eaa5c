"""Apicurio Registry as the local schema registry, reached at its Confluent-compatible API (`/apis/ccompat/v7`).

Pinned at 3.0.9 in jvm/pom.xml (3.3.x needs Java 21 and breaks confluent-kafka's Protobuf). Storage is in memory,
so every start is empty. Apicurio's default compatibility is NONE; Confluent's is BACKWARD, and that is what users
run with, so the registry is switched to BACKWARD once it answers.

With `tls` (`RegistryTls`) it serves HTTPS only, with a certificate from a private CA (Quarkus reads the PEM files),
and with `users` it requires HTTP basic auth on every path (Quarkus's embedded users). Apicurio 3.0.9 cannot require
a client certificate: Quarkus fixes `quarkus.http.ssl.client-auth` at build time (NONE); `icefloe_dev.tls_front`
puts a front that requires one before it.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .processes import JvmService, ServiceError, free_port, java, lib_dir

CCOMPAT_PATH = "/apis/ccompat/v7"
DEFAULT_COMPATIBILITY = "BACKWARD"


@dataclass(frozen=True)
class RegistryTls:
    """HTTPS for the registry: the CA that signed `certificate` (clients trust it), the server's PEM certificate and
    key, and basic-auth users (name -> password; none: no authentication)."""

    ca: Path
    certificate: Path
    key: Path
    users: dict[str, str] = field(default_factory=dict)

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def _request(
    method: str,
    url: str,
    body: dict | None = None,
    timeout: float = 5.0,
    tls: RegistryTls | None = None,
) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
    if tls is not None and tls.users:
        user, password = next(iter(tls.users.items()))
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        context = tls.context() if tls is not None else None
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


class SchemaRegistry(JvmService):
    """One Apicurio Registry process on a free loopback port. `url` is the Confluent-compatible base URL."""

    name = "registry"

    def __init__(
        self,
        state_dir: Path,
        heap: str = "512m",
        startup_timeout: float = 120.0,
        compatibility: str = DEFAULT_COMPATIBILITY,
        tls: RegistryTls | None = None,
    ):
        super().__init__(state_dir, startup_timeout)
        self.heap = heap
        self.compatibility = compatibility
        self.tls = tls
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServiceError("the schema registry has not been started")
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def command(self) -> list[str]:
        runners = sorted(lib_dir("registry").glob("*/apicurio-registry-app-*-runner.jar"))
        if not runners:
            raise ServiceError(f"no Apicurio runner jar under {lib_dir('registry')}: run scripts/setup.sh")
        self.port = free_port()
        return [
            java(),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",  # as the broker's: a start-up in about half the CPU time
            "-XX:TieredStopAtLevel=1",
            "-Dquarkus.http.host=127.0.0.1",
            *(self._tls_options() if self.tls else [f"-Dquarkus.http.port={self.port}"]),
            "-Dquarkus.log.level=WARN",
            "-Dquarkus.banner.enabled=false",
            # No usage reports, no UI: nothing leaves the machine and start-up stays short.
            "-Dquarkus.analytics.disabled=true",
            "-Dapicurio.ui.enabled=false",
            "-jar",
            str(runners[-1]),
        ]

    def _tls_options(self) -> list[str]:
        tls = self.tls
        assert tls is not None
        options = [
            "-Dquarkus.http.port=0",  # bound, but refused: no plaintext requests
            f"-Dquarkus.http.ssl-port={self.port}",
            "-Dquarkus.http.insecure-requests=disabled",
            f"-Dquarkus.http.ssl.certificate.files={tls.certificate}",
            f"-Dquarkus.http.ssl.certificate.key-files={tls.key}",
        ]
        if tls.users:  # Quarkus's embedded users (enabled in Apicurio's build); every path needs one
            options += [
                "-Dquarkus.http.auth.basic=true",
                "-Dquarkus.security.users.embedded.plain-text=true",
                "-Dquarkus.http.auth.permission.all.paths=/*",
                "-Dquarkus.http.auth.permission.all.policy=authenticated",
            ]
            for user, password in tls.users.items():
                options += [
                    f"-Dquarkus.security.users.embedded.users.{user}={password}",
                    f"-Dquarkus.security.users.embedded.roles.{user}=sr-admin",
                ]
        return options

    def probe(self) -> str | None:
        try:
            status, _ = _request("GET", f"{self.url}/subjects", timeout=1.0, tls=self.tls)
        except OSError as error:
            return f"the schema registry did not answer at {self.url} ({error})"
        return None if status == 200 else f"the schema registry answered {status} at {self.url}/subjects"

    def on_ready(self) -> None:
        self.set_compatibility(self.compatibility)

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        path = f"{self.url}/config" + (f"/{subject}" if subject else "")
        status, body = _request("PUT", path, {"compatibility": level}, tls=self.tls)
        if status != 200:
            raise ServiceError(f"setting compatibility {level} at {path} failed: {status} {body}")
