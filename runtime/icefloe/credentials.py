"""Resolving credential references (`SecretRef`) to values, only in memory and only when a connection needs them."""

from __future__ import annotations

import json
import os

from icefloe.errors import ConfigError
from icefloe.spec import SecretRef, TlsSpec


def resolve_credentials(ref: SecretRef, what: str) -> tuple[str, str]:
    """(username, password) for a credential reference. The values are never logged or stored."""
    if ref.env:
        user, password = os.environ.get(f"{ref.env}_USERNAME"), os.environ.get(f"{ref.env}_PASSWORD")
        if not user or not password:
            raise ConfigError(f"{what}: credentials missing: set {ref.env}_USERNAME and {ref.env}_PASSWORD")
        return user, password
    if ref.name:
        raise ConfigError(
            f"{what}: secret {ref.name!r} is created by the Pulumi stack; run the job the stack deployed "
            "(it references the secret by ARN), or use credentialsSecret.env locally"
        )
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        payload = boto3.client("secretsmanager").get_secret_value(SecretId=ref.secret_arn)["SecretString"]
    except (BotoCoreError, ClientError) as error:
        raise ConfigError(f"{what}: cannot read secret {ref.secret_arn}: {error}") from None
    try:
        document = json.loads(payload)
        return document["username"], document["password"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{what}: secret {ref.secret_arn} must be JSON with 'username' and 'password'") from None


def resolve_secret_text(ref: SecretRef, what: str) -> str:
    """The text a reference holds whole (a PEM certificate or key, a key's password): a secretArn secret's
    SecretString, or the environment variable `env` names. Never logged or stored."""
    if ref.env:
        value = os.environ.get(ref.env)
        if not value:
            raise ConfigError(f"{what}: set the environment variable {ref.env}")
        return value
    if ref.name:
        raise ConfigError(
            f"{what}: secret {ref.name!r} is created by the Pulumi stack; run the job the stack deployed "
            "(it references the secret by ARN), or use env locally"
        )
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        value = boto3.client("secretsmanager").get_secret_value(SecretId=ref.secret_arn)["SecretString"]
    except (BotoCoreError, ClientError) as error:
        raise ConfigError(f"{what}: cannot read secret {ref.secret_arn}: {error}") from None
    return str(value)


def resolve_tls(tls: TlsSpec, what: str) -> dict[str, str]:
    """The PEM texts (and the key's password) of a TLS spec, keyed like librdkafka's inline settings."""
    names = {
        "caCertificate": "ssl.ca.pem",
        "clientCertificate": "ssl.certificate.pem",
        "clientKey": "ssl.key.pem",
        "clientKeyPassword": "ssl.key.password",
    }
    return {names[key]: resolve_secret_text(ref, f"{what} tls.{key}") for key, ref in tls.references().items()}
