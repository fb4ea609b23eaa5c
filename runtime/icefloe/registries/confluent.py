"""A Confluent-compatible schema registry (Confluent's, Apicurio's ccompat API): the client's settings (credentials,
TLS material as private files), subjects (TopicNameStrategy), the latest Avro schema, the window of a subject's
newest versions (cached per process), and its failures as icefloe's: a missing subject is a config error; a refusal
(HTTP 401/403, a certificate that does not verify, a handshake the registry refuses) an authentication failure
(`SourceAuthError`, not retried: `refusal`); anything else the environment's (`SourceError`), the HTTP libraries'
exceptions by their types (`transport_errors`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from icefloe.credentials import resolve_credentials, resolve_tls
from icefloe.errors import ConfigError, IcefloeError, SourceAuthError, SourceError
from icefloe.spec import SchemaRegistrySpec


def registry_config(registry: SchemaRegistrySpec, cluster: str) -> dict[str, str]:
    conf = {"url": registry.url}
    if registry.credentials_secret:
        user, password = resolve_credentials(registry.credentials_secret, f"sourceCluster {cluster} schemaRegistry")
        conf["basic.auth.user.info"] = f"{user}:{password}"
    if registry.tls is not None:
        # PEM texts under icefloe's own keys: the client takes files, written where it is built (`registry_client`).
        tls = resolve_tls(registry.tls, f"sourceCluster {cluster} schemaRegistry")
        conf |= {f"icefloe.{key}": value for key, value in tls.items()}
    return conf  # type: ignore[return-value]  # a Confluent-compatible registry has a url (SchemaRegistrySpec)


# Per process: the PEM files of a registry's TLS material, by their content's hash (written once).
_PEM_FILES: dict[str, str] = {}


def _pem_file(text: str) -> str:
    """`text` in a file only this user can read, in a private directory on the local temp disk (never S3 or the
    table), removed when the process exits. The registry client (httpx) reads certificates and keys from files."""
    import atexit
    import hashlib
    import os
    import shutil
    import tempfile

    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest not in _PEM_FILES:
        directory = tempfile.mkdtemp(prefix="icefloe-tls-")  # mode 0700
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "material.pem")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        _PEM_FILES[digest] = path
    return _PEM_FILES[digest]


def registry_client_conf(conf: dict[str, str]) -> dict[str, Any]:
    """SchemaRegistryClient's settings for `registry_config`'s: TLS material as files (see `_pem_file`)."""
    client: dict[str, Any] = {k: v for k, v in conf.items() if not k.startswith("icefloe.")}
    if "icefloe.ssl.ca.pem" in conf:
        client["ssl.ca.location"] = _pem_file(conf["icefloe.ssl.ca.pem"])
    if "icefloe.ssl.certificate.pem" in conf:
        client["ssl.certificate.location"] = _pem_file(conf["icefloe.ssl.certificate.pem"])
        client["ssl.key.location"] = _pem_file(conf["icefloe.ssl.key.pem"])
    if "icefloe.ssl.key.password" in conf:
        client["ssl.key.password"] = conf["icefloe.ssl.key.password"]
    return client


def subject_for(topic: str) -> str:
    """Confluent's default TopicNameStrategy."""
    return f"{topic}-value"


def latest_schema(conf: dict[str, str], subject: str) -> str:
    with registry_errors(conf, subject):
        registered = registry_client(conf).get_latest_version(subject)
    if registered.schema.schema_type not in (None, "AVRO"):
        raise ConfigError(f"subject {subject!r} holds a {registered.schema.schema_type} schema, not Avro")
    return registered.schema.schema_str


def subject_schemas(conf: dict[str, str], subject: str, newest: int) -> dict[int, tuple[str, list]]:
    """Schema id -> (Avro schema, its references) for the subject's `newest` versions (driver side).

    A schema id's text never changes, but a version's id can: a hard-deleted version's number goes to the next
    registration. So each batch lists the versions and asks for the latest (two calls), and the window is fetched
    again only when either changed since this process's previous batch (`_SUBJECTS`). (Deleting versions below the
    latest and registering as many again, the latest's schema last, goes unseen: their records are decoded in Python,
    as any id not planned, from their id's own schema.)"""
    client = registry_client(conf)
    found: dict[int, tuple[str, list]] = {}
    with registry_errors(conf, subject):
        versions = sorted(client.get_versions(subject))[-newest:]
        if not versions:
            return found
        latest = client.get_version(subject, versions[-1])
        seen = (tuple(versions), latest.schema_id)
        cached = _SUBJECTS.get((conf["url"], subject))
        if cached is not None and cached[0] == seen:
            return dict(cached[1])
        for version in versions:
            registered = latest if version == versions[-1] else client.get_version(subject, version)
            if registered.schema.schema_type in (None, "AVRO"):
                found[registered.schema_id] = (registered.schema.schema_str, list(registered.schema.references or []))
    _SUBJECTS[(conf["url"], subject)] = (seen, dict(found))
    return found


# Per process: (registry URL, subject) -> ((version numbers, the latest's schema id), what subject_schemas found)
_SUBJECTS: dict[tuple[str, str], tuple[tuple, dict[int, tuple[str, list]]]] = {}


def registry_client(conf: dict[str, str]):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(registry_client_conf(conf))


@contextmanager
def registry_errors(conf: dict[str, str], subject: str) -> Iterator[None]:
    """Registry failures as icefloe errors: a missing subject is a config error, anything else the environment's."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        yield
    except IcefloeError:
        raise
    except ValueError as error:  # a registered schema this runtime cannot parse
        raise ConfigError(f"subject {subject!r} at {conf['url']}: {error}") from None
    except SchemaRegistryError as error:
        if error.http_status_code == 404:
            raise ConfigError(f"no schema registered under subject {subject!r} at {conf['url']}") from None
        raise refusal(conf["url"], error) or SourceError(f"schema registry {conf['url']}: {error}") from None
    except Exception as error:  # connection failures surface as the HTTP library's own types
        raise refusal(conf["url"], error) or SourceError(
            f"schema registry {conf['url']} unreachable: {error}"
        ) from None


def refusal(url: str, error: BaseException) -> SourceAuthError | None:
    """The registry's refusal of icefloe's credentials or TLS, as an authentication failure naming it (retrying gives
    the same answer), else None: HTTP 401/403, a registry certificate that does not verify against the CA icefloe
    trusts (`tls.caCertificate`, else the system's), a handshake the registry ends with an alert (a client certificate
    it does not accept, with TLS 1.2; with TLS 1.3 it only closes the connection, which reads as any lost connection).
    Found in the HTTP library's cause chain (the ssl module's own exceptions); their text holds no secret."""
    import ssl

    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(error, SchemaRegistryError) and error.http_status_code in (401, 403):
        what = "authentication failed" if error.http_status_code == 401 else "access denied"
        return SourceAuthError(
            f"schema registry {url}: {what} (HTTP {error.http_status_code}; check its credentialsSecret)"
        )
    seen: BaseException | None = error
    for _ in range(10):  # the HTTP library's error, its transport's, the ssl module's
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError):
            return SourceAuthError(
                f"schema registry {url}: certificate verify failed ({seen.verify_message}; check its tls.caCertificate)"
            )
        if isinstance(seen, ssl.SSLError) and "ALERT" in str(seen.reason or ""):
            return SourceAuthError(f"schema registry {url}: TLS handshake refused by the registry ({seen.reason})")
        seen = seen.__cause__ or seen.__context__
    return None


def transport_errors() -> tuple[type[BaseException], ...]:
    """The exception types of the HTTP libraries a registry client may use (confluent-kafka: httpx2 or httpx, over
    httpcore; older clients requests and urllib3): their failures are the network's, never the record's."""
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx", "httpcore2", "httpcore", "requests.exceptions", "urllib3.exceptions"):
        module = sys.modules.get(name)  # a library the client did not import raised nothing
        library = name.split(".")[0]
        for value in (
            vars(module) if module else {}
        ).values():  # the library's own types, not those it re-exports (JSONDecodeError)
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__.startswith(library):
                found.append(value)
    return tuple(found)
