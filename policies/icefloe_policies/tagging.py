"""Every bucket and Glue database carries the icefloe stack and owner tags.

A stack rule, because tags may come from the provider's default tags: outputs (`tagsAll`) and the
provider are only both visible in stack analysis.
"""

from __future__ import annotations

from pulumi_policy import ReportViolation, Severity, StackValidationArgs, StackValidationPolicy

from . import tokens
from .constants import TAG_OWNER, TAG_STACK
from .props import UNKNOWN, effective_tags
from .remedy import message
from .stack import of_type

REQUIRED_TAGS = (TAG_STACK, TAG_OWNER)
TAGGED_TYPES = tokens.BUCKET | {tokens.GLUE_DATABASE}


def _has_value(value: object) -> bool:
    return value is UNKNOWN or (isinstance(value, str) and value.strip() != "")


def _validate(args: StackValidationArgs, report: ReportViolation) -> None:
    for resource in of_type(args.resources, TAGGED_TYPES):
        tags = effective_tags(resource.props, resource.provider)
        missing = [key for key in REQUIRED_TAGS if not _has_value(tags.get(key))]
        if missing:
            report(
                message(
                    f"'{resource.name}' ({resource.resource_type.split(':')[-1]}) is missing the tag(s) "
                    f"{', '.join(missing)}, so it cannot be traced to its stack and owner.",
                    f"tag it with {TAG_STACK}=<stack name> and {TAG_OWNER}=<team or person> (import the keys from "
                    "icefloe_policies), or set them in the AWS provider's default_tags.",
                ),
                resource.urn,
            )


OWNERSHIP_TAGS = StackValidationPolicy(
    name="icefloe-ownership-tags",
    description=f"Every S3 bucket and Glue database is tagged with {TAG_STACK} and {TAG_OWNER}.",
    validate=_validate,
    severity=Severity.LOW,
    remediation_steps=f"Add the {TAG_STACK} and {TAG_OWNER} tags (or provider default_tags).",
)

POLICIES = [OWNERSHIP_TAGS]
