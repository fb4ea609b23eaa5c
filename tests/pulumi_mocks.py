"""Running the real Pulumi program under Pulumi's mocks, from a stack file, and recording what it declares.

The Pulumi CLI and the AWS provider cannot run everywhere (not in this project's CI), so tests, the policy-pack
tests and anyone curious can see exactly which resources and inputs `pulumi up` would send to the engine:

    from icefloe_infra.testing import run_program
    run = run_program("examples/Pulumi.example.yaml")   # a list of RecordedResource, plus run.outputs
    run.one("aws:emrserverless/application:Application").inputs["releaseLabel"]

The stack file is read the way the CLI reads it: the project's `Pulumi.yaml` config defaults are applied and a
declared key without a default is required; `secure:` values (from `pulumi config set --secret`) cannot be
decrypted here, so each becomes `decrypted_value(ciphertext)` and its top-level key is marked secret.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

ACCOUNT_ID = "123456789012"
REGION = "eu-west-1"
PROJECT_FILE = Path(__file__).resolve().parents[2] / "Pulumi.yaml"
_SIG, _SECRET = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"  # Pulumi's wire markers


@dataclass
class RecordedResource:
    type: str
    name: str
    inputs: dict[str, Any]
    id: str
    outputs: dict[str, Any]
    custom: bool
    urn: str = ""


class ProgramRun(list):
    """The recorded resources (a list of RecordedResource), plus the stack outputs the program exported."""

    outputs: dict[str, Any]
    secret_outputs: set[str]  # names of the outputs marked secret (shown as [secret], encrypted in state)
    stack: str
    config: dict[str, str]  # the config map the program ran with (secure values decrypted as in the docstring)

    def of_type(self, token: str) -> list[RecordedResource]:
        return [r for r in self if r.type == token]

    def one(self, token: str) -> RecordedResource:
        found = self.of_type(token)
        assert len(found) == 1, f"expected one {token}, found {len(found)}"
        return found[0]

    def named(self, name: str) -> RecordedResource:
        found = [r for r in self if r.name == name]
        assert len(found) == 1, f"expected one resource named {name}, found {len(found)}"
        return found[0]


def decrypted_value(ciphertext: str) -> str:
    """What a `secure:` value stands for in tests: deterministic, and recognizable wherever it leaks."""
    return "test-secret-" + hashlib.sha256(ciphertext.encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """Inputs as the engine would serialize them: secrets unwrapped (policies see values), assets as their path."""
    if isinstance(value, dict):
        if value.get(_SIG) == _SECRET:
            return _plain(value["value"])
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (pulumi.Asset, pulumi.Archive)):
        return {"asset": getattr(value, "path", None) or getattr(value, "text", None)}
    return value


def _arn(token: str, name: str, resource_id: str) -> str:
    """ARNs shaped like AWS's, so policies built from them look like the real ones."""
    service, kind = token.split(":")[1].split("/")[0], token.split(":")[-1]
    shapes = {
        "iam": f"arn:aws:iam::{ACCOUNT_ID}:{kind.lower()}/{name}",
        "kms": f"arn:aws:kms:{REGION}:{ACCOUNT_ID}:key/{hashlib.md5(name.encode()).hexdigest()[:8]}-0000-4000-8000-000000000000",
        "sqs": f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{name}",
        "secretsmanager": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT_ID}:secret:{name}-AbCdEf",
        "emrserverless": f"arn:aws:emr-serverless:{REGION}:{ACCOUNT_ID}:/applications/{resource_id}",
        "scheduler": f"arn:aws:scheduler:{REGION}:{ACCOUNT_ID}:schedule/default/{name}",
        "cloudwatch": f"arn:aws:logs:{REGION}:{ACCOUNT_ID}:log-group:/icefloe/{name}",
        "glue": f"arn:aws:glue:{REGION}:{ACCOUNT_ID}:database/{name}",
    }
    return shapes.get(service, f"arn:aws:{service}:{REGION}:{ACCOUNT_ID}:{kind.lower()}/{name}")


@dataclass
class _Recorder(pulumi.runtime.Mocks):
    resources: list[RecordedResource] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        inputs = _plain(dict(args.inputs))
        outputs = dict(inputs)
        resource_id = f"{args.name}-id"
        if args.typ == "aws:s3/bucket:Bucket":  # no auto-naming under mocks: the logical name plays the bucket
            resource_id = inputs.get("bucket") or f"{args.name}-0001"
            outputs |= {"bucket": resource_id, "arn": f"arn:aws:s3:::{resource_id}"}
        elif args.typ == "aws:iam/role:Role":  # the provider's id of a role is its name
            resource_id = args.name
        elif args.typ == "aws:emrserverless/application:Application":
            resource_id = "00fabcdefghij123"
        elif args.typ == "aws:cloudwatch/logGroup:LogGroup":
            outputs["name"] = f"/icefloe/{args.name}"
        elif args.typ == "aws:sqs/queue:Queue":
            outputs["url"] = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/{args.name}"
        elif args.typ == "random:index/randomPassword:RandomPassword":
            outputs["result"] = "generated0external0id0" + hashlib.sha256(args.name.encode()).hexdigest()[:10]
        if args.custom and "arn" not in outputs:
            outputs["arn"] = _arn(args.typ, args.name, resource_id)
        outputs.setdefault("id", resource_id)
        with self.lock:  # mocks are called from worker threads
            self.resources.append(RecordedResource(args.typ, args.name, inputs, resource_id, outputs, bool(args.custom)))
        return resource_id, outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT_ID, "arn": f"arn:aws:iam::{ACCOUNT_ID}:user/test", "userId": "test", "id": ACCOUNT_ID}
        if args.token == "aws:index/getRegion:getRegion":
            return {"name": REGION, "region": REGION, "id": REGION, "description": "Europe (Ireland)", "endpoint": ""}
        return {}


def _decrypt(value: Any) -> tuple[Any, bool]:
    """Replace `{secure: ...}` leaves by their test plaintext; report whether there were any."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            return decrypted_value(str(value["secure"])), True
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
    document = yaml.safe_load(Path(path).read_text()) or {}
    stack = Path(path).name.removeprefix("Pulumi.").removesuffix(".yaml")
    _, declared = project_config(project_file)
    values: dict[str, Any] = dict(document.get("config") or {})
    missing = sorted(k for k, d in declared.items() if k not in values and "default" not in d and "value" not in d)
    if missing:
        raise ValueError(f"Stack '{stack}' is missing configuration value(s) {', '.join(missing)}")
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


def small_bundle(architecture: str, python_version: str):
    """A bundle of icefloe alone (no dependency wheels): fast, for programs under mocks."""
    from .bundle import build_bundle

    return build_bundle(architecture, python_version, requirements=[],
                        out_dir=Path.home() / ".cache" / "icefloe" / "test-bundles")  # fmt: skip


def run_program(stack_config_path: str | Path, build=small_bundle) -> ProgramRun:
    """Run the icefloe program under mocks with a stack file's config; every registered resource, and the outputs.

    `build` makes the runtime bundle (architecture, python version) -> Bundle; the default skips the dependency
    wheels so a run takes about a second. Raises what the program raises (e.g. ConfigError for a bad stack file).
    """
    from .program import run

    stack, config, secret_keys = stack_config(Path(stack_config_path))
    recorder = _Recorder()
    pulumi.runtime.set_mocks(recorder, project="icefloe", stack=stack, preview=False)
    pulumi.runtime.set_all_config(config, secret_keys)
    captured: dict[str, Any] = {}
    secret_outputs: set[str] = set()

    @pulumi.runtime.test
    def program():
        outputs = run(build)

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
        pulumi.runtime.set_all_config({}, [])  # config is process-wide: leave none behind for the next test
    result = ProgramRun(recorder.resources)
    result.outputs, result.secret_outputs, result.stack, result.config = captured, secret_outputs, stack, config
    for resource in result:
        resource.urn = f"urn:pulumi:{stack}::icefloe::{resource.type}::{resource.name}"
    return result
