"""EMR Serverless applications: bounded capacity, auto-stop, a supported release."""

from __future__ import annotations

import re

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy, Severity

from . import tokens
from .props import get
from .remedy import message

# The releases icefloe runs on, and the Pulumi program accepts (icefloe_infra.deployment uses the same function):
# EMR 7.x is Spark 3.5 on Scala 2.12, like the jars the jobs ship; from 7.1.0 the release image has Python 3.11,
# which the runtime bundle is built for, and EMR Serverless runs streaming jobs (continuous tables).
SUPPORTED_RELEASES = "emr-7.1.0 or a later emr-7.x release"
MINIMUM_RELEASE = (7, 1)


def _is_application(args: ResourceValidationArgs) -> bool:
    return args.resource_type == tokens.EMR_SERVERLESS_APPLICATION


def _validate_capacity(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if not _is_application(args):
        return
    capacity = get(args.props, "maximumCapacity", default={})
    if not get(capacity, "cpu") or not get(capacity, "memory"):
        report(
            message(
                f"EMR Serverless application '{args.name}' has no maximum capacity, so a runaway job can scale "
                "without limit and cost.",
                "set maximum_capacity with cpu and memory (e.g. cpu='16 vCPU', memory='64 GB').",
            )
        )


def _validate_auto_stop(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if not _is_application(args):
        return
    # Omitting autoStopConfiguration is fine: AWS then enables auto-stop (15 idle minutes).
    # Only an explicit `enabled: false` keeps idle workers running.
    if get(args.props, "autoStopConfiguration", "enabled") is False:
        report(
            message(
                f"EMR Serverless application '{args.name}' has auto-stop disabled, so idle pre-initialized "
                "workers keep running and billing.",
                "set auto_stop_configuration enabled=True (with idle_timeout_minutes) or omit it.",
            )
        )


def supported_release(label: str) -> bool:
    """Whether icefloe runs on this EMR release label (emr-MAJOR.MINOR.PATCH)."""
    match = re.fullmatch(r"emr-(\d+)\.(\d+)\.(\d+)", label)
    return match is not None and int(match.group(1)) == MINIMUM_RELEASE[0] and int(match.group(2)) >= MINIMUM_RELEASE[1]


def _validate_release(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if not _is_application(args):
        return
    label = str(get(args.props, "releaseLabel", default=""))
    if not supported_release(label):
        report(
            message(
                f"EMR Serverless application '{args.name}' uses release '{label}'; icefloe runs on {SUPPORTED_RELEASES} "
                "(Spark 3.5 with Scala 2.12, Python 3.11 in the release image, streaming jobs).",
                "set release_label to 'emr-7.1.0' or a later emr-7.x release.",
            )
        )


MAXIMUM_CAPACITY = ResourceValidationPolicy(
    name="emr-maximum-capacity",
    description="EMR Serverless applications set maximumCapacity (cpu and memory).",
    validate=_validate_capacity,
    severity=Severity.MEDIUM,
    remediation_steps="Set maximum_capacity with cpu and memory.",
)
AUTO_STOP = ResourceValidationPolicy(
    name="emr-auto-stop",
    description="EMR Serverless applications do not disable auto-stop (absent autoStopConfiguration means "
    "AWS enables it).",
    validate=_validate_auto_stop,
    severity=Severity.LOW,
    remediation_steps="Set auto_stop_configuration enabled=True or omit it.",
)
RELEASE_LABEL = ResourceValidationPolicy(
    name="emr-release-label",
    description=f"EMR Serverless applications use {SUPPORTED_RELEASES}.",
    validate=_validate_release,
    severity=Severity.MEDIUM,
    remediation_steps=f"Set release_label to {SUPPORTED_RELEASES}.",
)

POLICIES = [MAXIMUM_CAPACITY, AUTO_STOP, RELEASE_LABEL]
