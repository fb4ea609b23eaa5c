"""KMS keys rotate their key material."""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy, Severity

from . import tokens
from .props import get
from .remedy import message


def _validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != tokens.KMS_KEY:
        return
    spec = get(args.props, "customerMasterKeySpec", default="SYMMETRIC_DEFAULT")
    if spec != "SYMMETRIC_DEFAULT":
        return  # AWS rotates only symmetric encryption keys; asymmetric and HMAC keys cannot rotate.
    if get(args.props, "enableKeyRotation") is not True:
        report(
            message(
                f"KMS key '{args.name}' does not rotate its key material.",
                "set enable_key_rotation=True on the aws.kms.Key (optionally rotation_period_in_days).",
            )
        )


KEY_ROTATION = ResourceValidationPolicy(
    name="kms-key-rotation",
    description="Symmetric KMS keys have automatic key rotation enabled (enableKeyRotation).",
    validate=_validate,
    severity=Severity.MEDIUM,
    remediation_steps="Set enable_key_rotation=True on the aws.kms.Key.",
)

POLICIES = [KEY_ROTATION]
