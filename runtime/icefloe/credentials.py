"""Resolving credential references (`SecretRef`) to values, only in memory and only when a connection needs them:
Kafka and registry logins and TLS material, a REST catalog's OAuth2 client credentials or bearer token."""

from __future__ import annotations

import json
import os

from icefloe.errors import ConfigError
from icefloe.spec import SecretRef, TlsSpec


def resolve_credentials(ref: SecretRef, what: str) -> tuple[str, str]:
    """(username, password) for a credential reference. The values are never logged or stored."""
    if ref.env:
        return _env_pair(f"{ref.env}_USERNAME", f"{ref.env}_PASSWORD", what)
    document = _secret_document(ref, what)
    try:
        return document["username"], document["password"]
    except (KeyError, TypeError):
        raise ConfigError(f"{what}: secret {ref.secret_arn} must be JSON with 'username' and 'password'") from None


def resolve_client_credential(ref: SecretRef, what: str) -> tuple[str, str]:
    """(client id, client secret) of OAuth2 client credentials: env `<ENV>_CLIENT_ID` and `<ENV>_CLIENT_SECRET`, or a
    secret with JSON {"clientId": ..., "clientSecret": ...} (or a stack-created one: username, password)."""
    if ref.env:
        return _env_pair(f"{ref.env}_CLIENT_ID", f"{ref.env}_CLIENT_SECRET", what)
    document = _secret_document(ref, what)
    for id_key, secret_key in (("clientId", "clientSecret"), ("username", "password")):
        if isinstance(document, dict) and document.get(id_key) and document.get(secret_key):
            return document[id_key], document[secret_key]
    raise ConfigError(f"{what}: secret {ref.secret_arn} must be JSON with 'clientId' and 'clientSecret'")


def resolve_token(ref: SecretRef, what: str) -> str:
    """A bearer token: env `<ENV>_TOKEN`, or a secret holding JSON {"token": ...} (a stack-created one: its password)
    or the token itself."""
    if ref.env:
        token = os.environ.get(f"{ref.env}_TOKEN")
        if not token:
            raise ConfigError(f"{what}: token missing: set {ref.env}_TOKEN")
        return token
    document = _secret_document(ref, what)
    if isinstance(document, str) and document:
        return document
    if isinstance(document, dict) and (document.get("token") or document.get("password")):
        return document.get("token") or document["password"]
    raise ConfigError(f"{what}: secret {ref.secret_arn} must hold the token, or JSON with 'token'")


def _env_pair(first: str, second: str, what: str) -> tuple[str, str]:
    """The values of the environment variables `first` and `second` (the two halves of a credential): both set."""
    first_value, second_value = os.environ.get(first), os.environ.get(second)
    if not first_value or not second_value:
        raise ConfigError(f"{what}: credentials missing: set {first} and {second}")
    return first_value, second_value


def _secret_string(ref: SecretRef, what: str, local: str) -> str:
    """The SecretString of a secretArn reference (`local`: what to use instead when running outside the stack)."""
    if ref.name:
        raise ConfigError(
            f"{what}: secret {ref.name!r} is created by the Pulumi stack; run the job the stack deployed "
            f"(it references the secret by ARN), or use {local} locally"
        )
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(boto3.client("secretsmanager").get_secret_value(SecretId=ref.secret_arn)["SecretString"])
    except (BotoCoreError, ClientError) as error:
        raise ConfigError(f"{what}: cannot read secret {ref.secret_arn}: {error}") from None


def _secret_document(ref: SecretRef, what: str):
    """The secret's JSON document (or its plain text) from Secrets Manager."""
    payload = _secret_string(ref, what, "credentialsSecret.env")
    try:
        return json.loads(payload)
    except ValueError:
        return payload


def resolve_secret_text(ref: SecretRef, what: str) -> str:
    """The text a reference holds whole (a PEM certificate or key, a key's password): a secretArn secret's
    SecretString, or the environment variable `env` names. Never logged or stored."""
    if ref.env:
        value = os.environ.get(ref.env)
        if not value:
            raise ConfigError(f"{what}: set the environment variable {ref.env}")
        return value
    return _secret_string(ref, what, "env")


def resolve_tls(tls: TlsSpec, what: str) -> dict[str, str]:
    """The PEM texts (and the key's password) of a TLS spec, keyed like librdkafka's inline settings."""
    names = {
        "caCertificate": "ssl.ca.pem",
        "clientCertificate": "ssl.certificate.pem",
        "clientKey": "ssl.key.pem",
        "clientKeyPassword": "ssl.key.password",
    }
    return {names[key]: resolve_secret_text(ref, f"{what} tls.{key}") for key, ref in tls.references().items()}
