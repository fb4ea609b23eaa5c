"""Finds values that look like credentials in job arguments, Spark settings, environments and tags.

A value is suspicious when its *shape* is a credential (PEM private key, AWS access key id, AWS secret
access key, JWT, GitHub/Slack token, `user:password@` in a URL) or when it is assigned to a *name* that
means a credential (`password=...`, `--db-password x`, `spark.hadoop.fs.s3a.secret.key=...`, an env var
`DB_PASSWORD`). References to credentials are fine and never reported: ARNs (including Secrets Manager
ARNs such as `...:secret:kafka-password-AbCd`), placeholders (`${X}`, `{{resolve:...}}`, `<x>`), URIs
without a password, secret names and paths (`icefloe/dev/kafka`, `kafka-password`).

Findings never carry the value itself, so a violation message cannot leak the secret it found.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .props import is_list, is_mapping


@dataclass(frozen=True)
class Finding:
    where: str  # path to the value, e.g. "target.input.jobDriver.sparkSubmit.entryPointArguments[3]"
    kind: str  # what it looks like, e.g. "password", "AWS secret access key"


# --- values whose shape alone is a credential -------------------------------------------------------

_SHAPES = [
    ("private key (PEM)", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("AWS access key id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("JSON web token", re.compile(r"\beyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]{8,}")),
    ("GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
]

# 40 characters of base64 standing alone. Runs that continue a path, ARN or identifier (preceded by
# ':', '/', '.', '-', '_') are not candidates, which keeps S3 URIs and ARNs out.
_AWS_SECRET_KEY = re.compile(r"(?<![\w/+:.\-])[A-Za-z0-9/+]{40}(?![\w/+=.\-])")

_URL_PASSWORD = re.compile(r"\b[a-zA-Z][\w+.-]*://[^\s/:@]+:(?P<password>[^\s/@]+)@")


def _looks_like_aws_secret_key(token: str) -> bool:
    # Mixed case and a digit: rules out hex digests, words and paths that happen to be 40 long.
    return (
        len(token) == 40
        and "//" not in token
        and any(c.islower() for c in token)
        and any(c.isupper() for c in token)
        and any(c.isdigit() for c in token)
    )


# --- names that mean "the value is a credential" -------------------------------------------------------

_SENSITIVE_ENDINGS = [
    ("password",),
    ("passwd",),
    ("pwd",),
    ("passphrase",),
    ("secret",),
    ("token",),
    ("apikey",),
    ("api", "key"),
    ("secret", "key"),
    ("access", "key"),
    ("private", "key"),
    ("credentials",),
    ("credential",),  # an Iceberg REST catalog's OAuth2 `client_id:client_secret` (spark.sql.catalog.<c>.credential)
]
# Names ending in "token" that are not secrets (StartJobRun's idempotency token, paging tokens).
_NOT_SENSITIVE = {"clienttoken", "idempotencytoken", "nexttoken", "continuationtoken", "pagetoken"}


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def is_sensitive_name(name: str) -> bool:
    """True when a key/flag/variable name says its value is a credential (`DB_PASSWORD`,
    `secretAccessKey`, `spark.hadoop.fs.s3a.secret.key`); false for references to one
    (`passwordSecretArn`, `KAFKA_SECRET_ID`, `kmsKeyId`)."""
    words = _words(name)
    if "".join(words) in _NOT_SENSITIVE:
        return False
    return any(tuple(words[-len(end) :]) == end for end in _SENSITIVE_ENDINGS)


# --- values that refer to a credential instead of being one ---------------------------------------------

_PLACEHOLDER = re.compile(r"^(\$\{.*\}|\$[A-Za-z_]\w*|\{\{.*\}\}|<[^<>]*>|%\(\w+\)s|\*+|REDACTED)$", re.I)
_ARN = re.compile(r"^arn:aws[\w-]*:")
_URI = re.compile(r"^[a-zA-Z][\w+.-]*://")
_PATH = re.compile(r"^/?[\w.\-]+(/[\w.\-]+)+/?$")
_NAME = re.compile(r"^[A-Za-z0-9][\w.\-/]*$")
_NAME_WORDS = {"password", "passwd", "secret", "secrets", "token", "key", "creds", "credentials", "apikey"}
_NOT_A_SECRET = {"", "true", "false", "yes", "no", "none", "null"}


def is_reference(value: str) -> bool:
    """True for values that point at a credential or are not one at all."""
    value = value.strip()
    if value.lower() in _NOT_A_SECRET or _PLACEHOLDER.match(value) or _ARN.match(value):
        return True
    if _looks_like_aws_secret_key(value):
        return False
    if _URI.match(value) and not _URL_PASSWORD.search(value):
        return True
    if _PATH.match(value):  # Secrets Manager / SSM names are paths by convention
        return True
    # A name such as "kafka-password" or "icefloe_dev_secret": the credential word is one of its parts.
    return bool(_NAME.match(value)) and bool(_NAME_WORDS & set(re.split(r"[^a-z0-9]+", value.lower())))


def _kind_of(name: str) -> str:
    words = _words(name)
    if words and words[-1] in {"password", "passwd", "pwd", "passphrase"}:
        return "password"
    return " ".join(words[-2:]) if words[-1:] == ["key"] else (words[-1] if words else "credential")


# --- scanning ----------------------------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][\w.\-]*)\s*=\s*(?P<value>\"[^\"]*\"|'[^']*'|<[^<>]*>|[^\s;&,\"')]+)")
_FLAG = re.compile(r"(?:^|\s)--?(?P<name>[A-Za-z][\w.\-]*)\s+(?P<value>[^\s\-]\S*)")


def scan_text(text: str, where: str) -> list[Finding]:
    """Credentials inside a free-form string: command lines, JDBC/JAAS strings, URLs."""
    found = [Finding(where, kind) for kind, pattern in _SHAPES if pattern.search(text)]
    if any(_looks_like_aws_secret_key(m.group(0)) for m in _AWS_SECRET_KEY.finditer(text)):
        found.append(Finding(where, "AWS secret access key"))
    if any(not is_reference(m.group("password")) for m in _URL_PASSWORD.finditer(text)):
        found.append(Finding(where, "password in URL"))
    for pattern in (_ASSIGNMENT, _FLAG):
        for match in pattern.finditer(text):
            value = match.group("value").strip("\"'")
            if is_sensitive_name(match.group("name")) and not is_reference(value):
                found.append(Finding(where, _kind_of(match.group("name"))))
    return _unique(found)


def scan_pair(name: str, value: Any, where: str) -> list[Finding]:
    """A named value: an env var, a tag, a Spark property, a JSON field."""
    if not isinstance(value, str):
        return scan(value, where)
    found = scan_text(value, where)
    if is_sensitive_name(name) and not is_reference(value):
        found.append(Finding(where, _kind_of(name)))
    return _unique(found)


def scan_args(args: list[Any], where: str) -> list[Finding]:
    """An argument list, where `["--password", "x"]` names the value in the previous element."""
    found: list[Finding] = []
    for i, arg in enumerate(args):
        here = f"{where}[{i}]"
        previous = args[i - 1] if i else None
        if isinstance(previous, str) and previous.startswith("-") and "=" not in previous and isinstance(arg, str):
            found += scan_pair(previous.lstrip("-"), arg, here)
        else:
            found += scan(arg, here)
    return _unique(found)


def scan(value: Any, where: str) -> list[Finding]:
    """Walk any structure (mappings, lists, JSON strings) and report credential-looking values."""
    if is_mapping(value):
        # {"name": "DB_PASSWORD", "value": "..."} (ECS environment) and {"Key": ..., "Value": ...} (tag
        # lists) name their value in a sibling field.
        lowered = {str(k).lower(): k for k in value}
        for name_key, value_key in (("name", "value"), ("key", "value")):
            if set(lowered) == {name_key, value_key} and isinstance(value[lowered[name_key]], str):
                return scan_pair(value[lowered[name_key]], value[lowered[value_key]], where)
        found: list[Finding] = []
        for key in value:
            found += scan_pair(str(key), value[key], f"{where}.{key}" if where else str(key))
        return _unique(found)
    if is_list(value):
        return scan_args(list(value), where)
    if isinstance(value, str):
        parsed = _json_container(value)
        return scan(parsed, where) if parsed is not None else scan_text(value, where)
    return []


def _json_container(text: str) -> Any:
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        return json.loads(stripped)
    except ValueError:
        return None


def _unique(findings: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))
