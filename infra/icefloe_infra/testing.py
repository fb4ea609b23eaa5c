"""Running the real Pulumi program under Pulumi's mocks, from a stack file, and recording what it declares.

The Pulumi CLI and the AWS provider cannot run everywhere (not in this project's CI), so tests, the policy-pack
tests and anyone curious can see exactly which resources and inputs `pulumi up` would send to the engine.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

ACCOUNT_ID = "123456789012"
_SIG, _SECRET = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"  # Pulumi's wire markers
REGION = "eu-west-1"


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
    """The recorded resources (a list), plus the stack outputs the program returned."""

    outputs: dict[str, Any]

    def of_type(self, token: str) -> list[RecordedResource]:
        return [r for r in self if r.type == token]

    def one(self, token: str) -> RecordedResource:
        found = self.of_type(token)
        assert len(found) == 1, f"expected one {token}, found {len(found)}"
        return found[0]


def _plain(value: Any) -> Any:
    """Inputs as the engine would serialize them: assets and archives become their path (JSON-able values only)."""
    if isinstance(value, dict):
        if value.get(_SIG) == _SECRET:  # a secret: the engine would encrypt it in state; policies see the value
            return _plain(value["value"])
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (pulumi.Asset, pulumi.Archive)):
        return {"asset": getattr(value, "path", None) or getattr(value, "text", None)}
    return value


@dataclass
class _Recorder(pulumi.runtime.Mocks):
    resources: list[RecordedResource] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        service = args.typ.split(":")[1].split("/")[0] if ":" in args.typ else "x"
        physical = args.inputs.get("name") or args.inputs.get("bucket") or f"{args.name}-0001"
        inputs = _plain(dict(args.inputs))
        outputs = dict(inputs)
        if args.typ == "aws:s3/bucket:Bucket":
            outputs |= {"bucket": physical, "arn": f"arn:aws:s3:::{physical}"}
            resource_id = physical
        else:
            resource_id = f"{args.name}-id"
            where = "" if service == "iam" else REGION  # IAM ARNs carry no region
            outputs.setdefault("arn", f"arn:aws:{service}:{where}:{ACCOUNT_ID}:{args.typ.split(':')[-1].lower()}/{args.name}")
        if args.typ == "random:index/randomPassword:RandomPassword":
            outputs["result"] = "generated0external0id0for0tests"
        if args.typ == "aws:cloudwatch/logGroup:LogGroup":
            outputs["name"] = f"/icefloe/{args.name}"
            outputs["arn"] = f"arn:aws:logs:{REGION}:{ACCOUNT_ID}:log-group:/icefloe/{args.name}"
        if args.typ == "aws:emrserverless/application:Application":
            resource_id = "00fabcdefghij123"
        outputs.setdefault("id", resource_id)
        with self.lock:
            self.resources.append(RecordedResource(args.typ, args.name, inputs, resource_id, outputs,
                                                   bool(args.custom)))  # fmt: skip
        return resource_id, outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT_ID, "arn": f"arn:aws:iam::{ACCOUNT_ID}:user/test", "userId": "test", "id": ACCOUNT_ID}
        if args.token == "aws:index/getRegion:getRegion":
            return {"name": REGION, "region": REGION, "id": REGION, "description": "Europe (Ireland)", "endpoint": ""}
        return {}


def stack_config(path: Path) -> tuple[str, dict[str, str]]:
    """(stack name, Pulumi config map) from a `Pulumi.<stack>.yaml`, structured values as JSON like the CLI."""
    document = yaml.safe_load(Path(path).read_text()) or {}
    stack = Path(path).name.removeprefix("Pulumi.").removesuffix(".yaml")
    config = {
        key: value if isinstance(value, str) else json.dumps(value)
        for key, value in (document.get("config") or {}).items()
    }
    return stack, config


def small_bundle(architecture: str, python_version: str):
    """A bundle of icefloe alone (no dependency wheels): fast, for programs under mocks."""
    from .bundle import build_bundle

    return build_bundle(architecture, python_version, requirements=[], out_dir=Path.home() / ".cache" / "icefloe" / "test-bundles")


def run_program(stack_file: str | Path, build=small_bundle) -> ProgramRun:
    """Run the icefloe program under mocks with a stack file's config; returns every registered resource."""
    from .program import run

    stack, config = stack_config(Path(stack_file))
    recorder = _Recorder()
    pulumi.runtime.set_mocks(recorder, project="icefloe", stack=stack, preview=False)
    pulumi.runtime.set_all_config(config)
    captured: dict[str, Any] = {}

    @pulumi.runtime.test
    def program():
        outputs = run(build)
        return pulumi.Output.from_input(outputs).apply(captured.update)

    program()
    result = ProgramRun(recorder.resources)
    result.outputs = captured
    for resource in result:
        resource.urn = f"urn:pulumi:{stack}::icefloe::{resource.type}::{resource.name}"
    return result
