"""`icefloe plan --config Pulumi.<stack>.yaml`: what `pulumi up` would do, without AWS and without the Pulumi CLI.

Runs the real program under Pulumi's mocks (`dry_run`), then reports the resources it would create with the
settings that matter for safety and cost, each table's job (schedule, mode, Spark parameters), and the policy
pack's verdict on the lot. Exit 0 when the pack passes, 1 on a mandatory violation, 2 when the stack file is
invalid (the error names the key). Secret values are never printed: they are placeholders here anyway.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from icefloe.errors import ConfigError

from .dry_run import ACCOUNT_ID, BundleBuilder, ProgramRun, RecordedResource, run_program, source_bundle

SECRET = "[secret]"
# Names that mean a credential (Spark settings, tags): their values are never printed. The program puts no
# credential in either; the policy pack reports one that got there.
_SECRET_NAME = re.compile(r"password|passwd|secret|token|credential|private[._-]?key|access[._-]?key", re.I)


@dataclass
class PlannedResource:
    type: str
    name: str
    settings: dict[str, Any]


@dataclass
class PlannedTable:
    table: str
    run: str  # "batch", "continuous" or "disabled"
    schedule: str | None = None  # the Scheduler expression
    timeout_minutes: int | None = None
    spark: dict[str, str] = field(default_factory=dict)


@dataclass
class Plan:
    stack: str
    source: str
    resources: list[PlannedResource]
    tables: list[PlannedTable]
    violations: list[dict[str, str | None]]  # policy, level, message, resource (URN)

    @property
    def mandatory(self) -> int:
        return sum(1 for v in self.violations if v["level"] == "mandatory")


def _document(value: Any) -> dict:
    return json.loads(value) if isinstance(value, str) else (value or {})


def _statements(value: Any) -> list[dict]:
    statements = _document(value).get("Statement", [])
    return statements if isinstance(statements, list) else [statements]


def _list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _trust(inputs: dict) -> dict[str, Any]:
    """Who may assume the role and on what condition; an ExternalId is named, never shown."""
    trusted = []
    for statement in _statements(inputs.get("assumeRolePolicy")):
        principal = statement.get("Principal", {})
        if isinstance(principal, dict):
            who = [f"{kind}:{p}" for kind, ps in principal.items() for p in _list(ps)]
        else:
            who = [str(principal)]  # "*"
        conditions = [
            f"{key} required" if key == "sts:ExternalId" else f"{key}={value}"
            for test in statement.get("Condition", {}).values()
            for key, value in test.items()
        ]
        trusted.append(" ".join(who) + (f" ({', '.join(conditions)})" if conditions else ""))
    return {"trusts": trusted}


def _permissions(inputs: dict) -> dict[str, Any]:
    return {
        statement.get("Sid", f"#{i}"): f"{statement['Effect']} {', '.join(_list(statement['Action']))} on "
        f"{', '.join(_list(statement.get('Resource', '*')))}"
        for i, statement in enumerate(_statements(inputs.get("policy")))
    }


def _bucket_policy(inputs: dict) -> dict[str, Any]:
    return {
        statement.get("Sid", f"#{i}"): f"{statement['Effect']} {', '.join(_list(statement['Action']))}"
        + (f" when {json.dumps(statement['Condition'])}" if "Condition" in statement else "")
        for i, statement in enumerate(_statements(inputs.get("policy")))
    }


def _schedule(inputs: dict) -> dict[str, Any]:
    target = inputs.get("target", {})
    retry = target.get("retryPolicy", {})
    return {
        "expression": inputs.get("scheduleExpression"),
        "state": inputs.get("state"),
        "retries": f"{retry.get('maximumRetryAttempts')} within {retry.get('maximumEventAgeInSeconds')}s",
        "deadLetters": "yes" if target.get("deadLetterConfig") else "none",
    }


def _picked(*paths: str) -> Callable[[dict], dict[str, Any]]:
    """The inputs at these dotted paths, under the path's last part."""

    def pick(inputs: dict) -> dict[str, Any]:
        settings = {}
        for path in paths:
            value: Any = inputs
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value is not None:
                settings[path.rsplit(".", 1)[-1]] = value
        return settings

    return pick


# The settings shown per resource type; other types show none. Values come from the registered inputs.
SUMMARIES: dict[str, Callable[[dict], dict[str, Any]]] = {
    "aws:kms/key:Key": _picked("enableKeyRotation", "deletionWindowInDays"),
    "aws:s3/bucket:Bucket": _picked("forceDestroy", "tags"),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": lambda i: {
        "sseAlgorithm": i["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"],
        "bucketKeyEnabled": i["rules"][0].get("bucketKeyEnabled"),
    },
    "aws:s3/bucketVersioning:BucketVersioning": _picked("versioningConfiguration.status"),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": _picked(
        "blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"
    ),
    "aws:s3/bucketPolicy:BucketPolicy": _bucket_policy,
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": lambda i: {
        "rules": [r["id"] for r in i.get("rules", [])]
    },
    "aws:s3/bucketObjectv2:BucketObjectv2": _picked("key"),
    "aws:glue/catalogDatabase:CatalogDatabase": _picked("name", "locationUri"),
    "aws:s3tables/tableBucket:TableBucket": _picked("name", "forceDestroy", "maintenanceConfiguration"),
    "aws:s3tables/namespace:Namespace": _picked("namespace"),
    "aws:cloudwatch/logGroup:LogGroup": _picked("retentionInDays"),
    "aws:cloudwatch/metricAlarm:MetricAlarm": _picked(
        "metricName", "statistic", "threshold", "period", "treatMissingData", "alarmActions"
    ),
    "aws:secretsmanager/secret:Secret": _picked("kmsKeyId", "recoveryWindowInDays"),
    "aws:iam/role:Role": _trust,
    "aws:iam/rolePolicy:RolePolicy": _permissions,
    "random:index/randomPassword:RandomPassword": _picked("length"),
    "aws:emrserverless/application:Application": lambda i: {
        "releaseLabel": i.get("releaseLabel"),
        "architecture": i.get("architecture"),
        "image": (i.get("imageConfiguration") or {}).get("imageUri", "the release's own"),
        "maximumCapacity": i.get("maximumCapacity"),
        "autoStop": i.get("autoStopConfiguration"),
        "network": i.get("networkConfiguration", "none (public endpoints)"),
    },
    "aws:sqs/queue:Queue": _picked("messageRetentionSeconds", "sqsManagedSseEnabled"),
    "aws:scheduler/schedule:Schedule": _schedule,
}


def _whole_numbers(value: Any) -> Any:
    """Inputs arrive through protobuf, so 30 comes back as 30.0: show it as it was written."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _redacted(value: Any) -> Any:
    """Values under a name that means a credential (a tag `db-password`, say) are not printed, secret or not."""
    if isinstance(value, dict):
        return {k: SECRET if _SECRET_NAME.search(k) else _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def _settings(resource: RecordedResource) -> dict[str, Any]:
    summary = SUMMARIES.get(resource.type)
    if summary is None:
        return dict.fromkeys(sorted(resource.secret_inputs), SECRET)
    settings = summary(_whole_numbers(resource.inputs))  # the names are the summary's; the values may be the user's
    # Derived views (a trust policy's principals) are fine; a secret input itself is never shown.
    return {key: SECRET if key in resource.secret_inputs else _redacted(value) for key, value in settings.items()}


def spark_settings(parameters: str) -> dict[str, str]:
    """`--conf k=v ...` as a dict, settings that name a credential shown as [secret]."""
    words = shlex.split(parameters)
    pairs = [word.split("=", 1) for flag, word in zip(words[::2], words[1::2]) if flag == "--conf"]
    return {key: SECRET if _SECRET_NAME.search(key) else value for key, value in pairs}


def _tables(run: ProgramRun) -> list[PlannedTable]:
    planned = {}
    for schedule in run.of_type("aws:scheduler/schedule:Schedule"):
        request = json.loads(schedule.inputs["target"]["input"])
        driver = request["JobDriver"]["SparkSubmit"]
        arguments = driver["EntryPointArguments"]
        table = arguments[arguments.index("--table") + 1]
        planned[table] = PlannedTable(
            table,
            "continuous" if request["Mode"] == "STREAMING" else "batch",
            schedule.inputs["scheduleExpression"],
            request["ExecutionTimeoutMinutes"],
            spark_settings(driver["SparkSubmitParameters"]),
        )
    return [planned.get(table) or PlannedTable(table, "disabled") for table in run.outputs["tables"]]


def make_plan(
    stack_file: str | Path,
    build: BundleBuilder = source_bundle,
    jar_dir: Path | None = None,
    pack_config: dict | None = None,
) -> Plan:
    """Run the program under mocks and the policy pack over what it declared. Raises ConfigError for a bad stack."""
    from icefloe_policies.runner import run_pack

    run = run_program(stack_file, build, jar_dir)
    resources = [
        PlannedResource(r.type, r.name, _settings(r)) for r in sorted(run, key=lambda r: (r.type, r.name)) if r.custom
    ]
    violations = [
        {"policy": v.policy, "level": v.level, "message": v.message, "resource": v.urn}
        for v in run_pack(run, pack_config)
    ]
    return Plan(run.stack, str(stack_file), resources, _tables(run), violations)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "; ".join(value)
    return json.dumps(value, sort_keys=True)


def _spark_lines(settings: dict[str, str], indent: str) -> list[str]:
    lines = []
    for key, value in settings.items():
        if key == "spark.jars":  # one jar a line
            lines += [f"{indent}{key}="] + [f"{indent}    {jar}" for jar in value.split(",")]
        else:
            lines.append(f"{indent}{key}={value}")
    return lines


def render(plan: Plan) -> str:
    lines = [
        f"icefloe plan: stack '{plan.stack}' from {plan.source}",
        "A dry run of the Pulumi program under Pulumi's mocks: nothing was sent to AWS. Values AWS assigns are",
        f"placeholders (account {ACCOUNT_ID}, ARNs, bucket name), and so are `secure:` config values; the runtime",
        "bundle is icefloe's source alone (`pulumi up` adds its dependency wheels, so its digest differs).",
        "",
        f"Resources `pulumi up` would create ({len(plan.resources)}):",
    ]
    for resource in plan.resources:
        lines.append(f"  {resource.type}  {resource.name}")
        lines += [f"      {key}: {_value(value)}" for key, value in resource.settings.items()]
    lines += ["", f"Tables ({len(plan.tables)}):"]
    scheduled = [table.spark for table in plan.tables if table.run != "disabled"]
    common = {k: v for k, v in scheduled[0].items() if all(s.get(k) == v for s in scheduled)} if scheduled else {}
    for table in plan.tables:
        if table.run == "disabled":
            lines.append(f"  {table.table}: disabled, no schedule")
            continue
        lines.append(
            f"  {table.table}: {table.run}, {table.schedule}, each job stopped after {table.timeout_minutes} min"
        )
        lines += _spark_lines({k: v for k, v in table.spark.items() if k not in common}, "      ")
    if common:
        lines += ["", "Spark parameters of every table's job:"] + _spark_lines(common, "  ")
    verdict = "FAILED" if plan.mandatory else "passed"
    lines += [
        "",
        f"Policy pack: {verdict} ({plan.mandatory} mandatory, {len(plan.violations) - plan.mandatory} "
        "advisory violations)",
    ]
    for violation in plan.violations:
        where = f" [{violation['resource'].rsplit('::', 1)[-1]}]" if violation["resource"] else ""
        lines.append(f"  {violation['level']} {violation['policy']}{where}: {violation['message']}")
    return "\n".join(lines) + "\n"


def main(config_path: str, as_json: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The `icefloe plan` command: 0 when the pack passes, 1 on a mandatory violation, 2 for an invalid stack."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        plan = make_plan(config_path)
    except ConfigError as error:
        print(f"icefloe plan: invalid stack: {error}", file=err)
        return 2
    out.write(json.dumps(asdict(plan), indent=1, sort_keys=True) + "\n" if as_json else render(plan))
    return 1 if plan.mandatory else 0
