"""The real Pulumi program run under Pulumi's mocks from a stack file: every resource `pulumi up` would declare.

Nothing is sent to AWS and no Pulumi CLI is needed. `icefloe plan` reports from it, and the tests assert on it:

    run = run_program("Pulumi.dev.yaml")             # a list of RecordedResource, plus run.outputs
    run.one("aws:emrserverless/application:Application").inputs["releaseLabel"]

The stack file is read the way the CLI reads it: the project's `Pulumi.yaml` config defaults are applied and a
declared key without a default is required. What only AWS or the CLI knows is a placeholder: the account is
`ACCOUNT_ID`, ARNs, ids and bucket names are made up in AWS's shapes, and a `secure:` value (from `pulumi config
set --secret`), which only the stack's secrets provider can decrypt, becomes `placeholder_secret(ciphertext)`, with
its top-level key marked secret.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from icefloe.errors import ConfigError
from icefloe.spec import read_stack_file

from .bundle import CACHE, Bundle, build_bundle

ACCOUNT_ID = "123456789012"  # AWS's documentation account: obviously not yours
DEFAULT_REGION = "us-east-1"  # when the stack sets no aws:region
PROJECT_FILE = Path(__file__).resolve().parents[2] / "Pulumi.yaml"
_SIG, _SECRET = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"  # Pulumi's wire markers


@dataclass
class RecordedResource:
    type: str
    name: str
    inputs: dict[str, Any]  # secrets unwrapped (the policy pack sees values), assets as {"asset": path}
    id: str
    outputs: dict[str, Any]
    custom: bool
    urn: str = ""
    secret_inputs: frozenset[str] = frozenset()  # top-level inputs that carry a secret: never print them


class ProgramRun(list):
    """The recorded resources (a list of RecordedResource), plus the stack outputs the program exported."""

    outputs: dict[str, Any]
    secret_outputs: set[str]  # names of the outputs marked secret (shown as [secret], encrypted in state)
    stack: str
    config: dict[str, str]  # the config map the program ran with (secure values as placeholders)

    def of_type(self, token: str) -> list[RecordedResource]:
        return [r for r in self if r.type == token]

    def one(self, token: str) -> RecordedResource:
        found = self.of_type(token)
        if len(found) != 1:
            raise LookupError(f"expected one {token}, found {len(found)}")
        return found[0]

    def named(self, name: str) -> RecordedResource:
        found = [r for r in self if r.name == name]
        if len(found) != 1:
            raise LookupError(f"expected one resource named {name}, found {len(found)}")
        return found[0]


def placeholder_secret(ciphertext: str) -> str:
    """What a `secure:` value stands for in a dry run: deterministic, and recognizable wherever it would leak."""
    return "dry-run-secret-" + hashlib.sha256(ciphertext.encode()).hexdigest()[:16]


def _is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(_SIG) == _SECRET


def _carries_secret(value: Any) -> bool:
    if _is_secret(value):
        return True
    if isinstance(value, dict):
        return any(_carries_secret(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_carries_secret(v) for v in value)


def _plain(value: Any) -> Any:
    """Inputs as the engine would serialize them: secrets unwrapped (policies see values), assets as their path."""
    if _is_secret(value):
        return _plain(value["value"])
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (pulumi.Asset, pulumi.Archive)):
        return {"asset": getattr(value, "path", None) or getattr(value, "text", None)}
    return value


@dataclass
class _Recorder(pulumi.runtime.Mocks):
    """Answers the engine's calls like AWS would, in AWS's shapes, and records every registration."""

    region: str
    resources: list[RecordedResource] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _arn(self, token: str, name: str, resource_id: str) -> str:
        """ARNs shaped like AWS's, so policies built from them look like the real ones."""
        service, kind = token.split(":")[1].split("/")[0], token.split(":")[-1]
        region, account = self.region, ACCOUNT_ID
        shapes = {
            "iam": f"arn:aws:iam::{account}:{kind.lower()}/{name}",
            "kms": f"arn:aws:kms:{region}:{account}:key/{hashlib.md5(name.encode()).hexdigest()[:8]}-0000-4000-8000-000000000000",
            "sqs": f"arn:aws:sqs:{region}:{account}:{name}",
            "secretsmanager": f"arn:aws:secretsmanager:{region}:{account}:secret:{name}-AbCdEf",
            "emrserverless": f"arn:aws:emr-serverless:{region}:{account}:/applications/{resource_id}",
            "scheduler": f"arn:aws:scheduler:{region}:{account}:schedule/default/{name}",
            "cloudwatch": f"arn:aws:logs:{region}:{account}:log-group:/icefloe/{name}",
            "glue": f"arn:aws:glue:{region}:{account}:database/{name}",
        }
        return shapes.get(service, f"arn:aws:{service}:{region}:{account}:{kind.lower()}/{name}")

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        raw = dict(args.inputs)
        inputs = _plain(raw)
        outputs = dict(inputs)
        resource_id = f"{args.name}-id"
        if args.typ == "aws:s3/bucket:Bucket":  # no auto-naming under mocks: the logical name plays the bucket
            resource_id = inputs.get("bucket") or f"{args.name}-0001"
            outputs |= {"bucket": resource_id, "arn": f"arn:aws:s3:::{resource_id}"}
        elif args.typ == "aws:s3tables/tableBucket:TableBucket":  # arn:...:s3tables:<region>:<account>:bucket/<name>
            outputs["arn"] = f"arn:aws:s3tables:{self.region}:{ACCOUNT_ID}:bucket/{inputs['name']}"
        elif args.typ == "aws:iam/role:Role":  # the provider's id of a role is its name
            resource_id = args.name
        elif args.typ == "aws:emrserverless/application:Application":
            resource_id = "00fabcdefghij123"
        elif args.typ == "aws:cloudwatch/logGroup:LogGroup":
            outputs["name"] = f"/icefloe/{args.name}"
        elif args.typ == "aws:sqs/queue:Queue":
            outputs["url"] = f"https://sqs.{self.region}.amazonaws.com/{ACCOUNT_ID}/{args.name}"
        elif args.typ == "random:index/randomPassword:RandomPassword":
            outputs["result"] = "generated0external0id0" + hashlib.sha256(args.name.encode()).hexdigest()[:10]
        if args.custom and "arn" not in outputs:
            outputs["arn"] = self._arn(args.typ, args.name, resource_id)
        outputs.setdefault("id", resource_id)
        secret = frozenset(k for k, v in raw.items() if _carries_secret(v))
        recorded = RecordedResource(
            args.typ, args.name, inputs, resource_id, outputs, bool(args.custom), secret_inputs=secret
        )
        with self.lock:  # mocks are called from worker threads
            self.resources.append(recorded)
        return resource_id, outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": ACCOUNT_ID,
                "arn": f"arn:aws:iam::{ACCOUNT_ID}:user/dry-run",
                "userId": "dry-run",
                "id": ACCOUNT_ID,
            }
        if args.token == "aws:index/getRegion:getRegion":
            return {"name": self.region, "region": self.region, "id": self.region, "description": "", "endpoint": ""}
        return {}


def _decrypt(value: Any) -> tuple[Any, bool]:
    """Replace `{secure: ...}` leaves by their placeholder; report whether there were any."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            return placeholder_secret(str(value["secure"])), True
        pairs = {k: _decrypt(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(s for _, s in pairs.values())
    if isinstance(value, list):
        items = [_decrypt(v) for v in value]
        return [v for v, _ in items], any(s for _, s in items)
    return value, False


def project_config(project_file: Path = PROJECT_FILE) -> tuple[str, dict[str, dict]]:
    """(project name, declared config keys with their namespace) from Pulumi.yaml."""
    document = yaml.safe_load(project_file.read_text())
    name = document["name"]
    declared = {}
    for key, declaration in (document.get("config") or {}).items():
        full = key if ":" in key else f"{name}:{key}"
        declared[full] = declaration if isinstance(declaration, dict) else {"default": declaration}
    return name, declared


def stack_config(path: Path, project_file: Path = PROJECT_FILE) -> tuple[str, dict[str, str], list[str]]:
    """(stack name, config map, secret keys) as the CLI hands them to the program.

    Structured values become JSON text like the CLI's; project defaults fill keys the stack leaves out; a declared
    key without a default that the stack leaves out fails like `pulumi up` does.
    """
    stack = Path(path).name.removeprefix("Pulumi.").removesuffix(".yaml")
    values: dict[str, Any] = dict(read_stack_file(str(path)))
    _, declared = project_config(project_file)
    missing = sorted(k for k, d in declared.items() if k not in values and "default" not in d and "value" not in d)
    if missing:
        raise ConfigError(f"Stack '{stack}' is missing configuration value(s) {', '.join(missing)}")
    for key, declaration in declared.items():
        if key not in values:
            values[key] = declaration.get("default", declaration.get("value"))
    config, secret_keys = {}, []
    for key, raw in values.items():
        value, secret = _decrypt(raw)
        if secret:
            secret_keys.append(key)
        config[key] = value if isinstance(value, str) else json.dumps(value)
    return stack, config, secret_keys


def source_bundle(architecture: str, python_version: str) -> Bundle:
    """A bundle of icefloe alone, without its dependency wheels: built in a second, offline."""
    return build_bundle(architecture, python_version, requirements=[], out_dir=CACHE.parent / "dry-run-bundles")


BundleBuilder = Callable[[str, str], Bundle]


def run_program(
    stack_file: str | Path, build: BundleBuilder = source_bundle, jar_dir: Path | None = None
) -> ProgramRun:
    """Run the icefloe program under mocks with a stack file's config; every registered resource, and the outputs.

    `build` makes the runtime bundle ((architecture, python version) -> Bundle); `jar_dir` replaces jvm/lib/spark.
    Raises what the program raises (ConfigError for a bad stack file, or for jars setup.sh has not fetched).
    Pulumi's mocks and config are process-wide: one run at a time.
    """
    from .program import run

    stack, config, secret_keys = stack_config(Path(stack_file))
    recorder = _Recorder(region=config.get("aws:region") or DEFAULT_REGION)
    pulumi.runtime.set_mocks(recorder, project="icefloe", stack=stack, preview=False)
    pulumi.runtime.set_all_config(config, secret_keys)
    captured: dict[str, Any] = {}
    secret_outputs: set[str] = set()

    @pulumi.runtime.test
    def program():
        outputs = run(build, jar_dir)

        async def collect():  # the values, and which outputs Pulumi would store and show as secrets
            for key, value in outputs.items():
                output = pulumi.Output.from_input(value)
                if await output.is_secret():
                    secret_outputs.add(key)
                captured[key] = await output.future()

        return collect()

    try:
        program()
    finally:
        pulumi.runtime.set_all_config({}, [])  # config is process-wide: leave none behind for the next run
    result = ProgramRun(recorder.resources)
    result.outputs, result.secret_outputs, result.stack, result.config = captured, secret_outputs, stack, config
    for resource in result:
        resource.urn = f"urn:pulumi:{stack}::icefloe::{resource.type}::{resource.name}"
    return result
