"""Finding resources in a stack, the per-bucket resources that belong to each bucket, and the lakehouse bucket."""

from __future__ import annotations

from collections.abc import Iterable

from pulumi_policy import PolicyResource

from .constants import ROLE_LAKEHOUSE, TAG_ROLE
from .props import UNKNOWN, effective_tags, known


def of_type(resources: Iterable[PolicyResource], types: Iterable[str]) -> list[PolicyResource]:
    types = frozenset(types)
    return [r for r in resources if r.resource_type in types]


def _identifiers(bucket: PolicyResource) -> set[str]:
    """What a per-bucket resource may put in its `bucket` input: the bucket's name, id or ARN."""
    values = (known(bucket.props, key) for key in ("bucket", "id", "arn"))
    return {v for v in values if isinstance(v, str) and v}


def belongs_to(resource: PolicyResource, bucket: PolicyResource) -> bool:
    """True if `resource` (an encryption config, policy, ...) configures `bucket`.

    During preview a new bucket's id is unknown, so the link comes from the engine's property
    dependencies (`bucket` input depends on the bucket resource); once deployed, from the values.
    """
    if any(dep.urn == bucket.urn for dep in resource.property_dependencies.get("bucket", [])):
        return True
    value = known(resource.props, "bucket")
    return value is not UNKNOWN and value in _identifiers(bucket)


def attached(resources: Iterable[PolicyResource], types: Iterable[str], bucket: PolicyResource) -> list[PolicyResource]:
    return [r for r in of_type(resources, types) if belongs_to(r, bucket)]


def is_lakehouse(bucket: PolicyResource) -> bool:
    """Every bucket counts as the lakehouse unless tagged with another role, so forgetting the tag fails safe."""
    role = effective_tags(bucket.props, bucket.provider).get(TAG_ROLE)
    return not isinstance(role, str) or role == ROLE_LAKEHOUSE
