"""All icefloe policies and their enforcement levels.

Levels, from weakest to strongest say:
1. the pack default, DEFAULT_ENFORCEMENT (mandatory);
2. a policy's own level (the scheduler rules and s3-bucket-ownership-declared are advisory);
3. the policy pack config file (`--policy-pack-config policy-config.json`): `"all": "<level>"` for every
   rule, then `"<rule name>": "<level>"` or `{"enforcementLevel": "<level>", ...properties}` per rule.
The Pulumi CLI applies (3); `resolve_config` does the same for local runs and tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pulumi_policy import EnforcementLevel, Policy

from . import emr, escalation, iam, iam_users, kms, logs, resource_policies, s3, s3_acls, scheduler, secrets, tagging

DEFAULT_ENFORCEMENT = EnforcementLevel.MANDATORY


def all_policies() -> list[Policy]:
    return [
        *s3.POLICIES,
        *s3_acls.POLICIES,
        *resource_policies.POLICIES,
        *kms.POLICIES,
        *iam.POLICIES,
        *escalation.POLICIES,
        *iam_users.POLICIES,
        *emr.POLICIES,
        *scheduler.POLICIES,
        *secrets.POLICIES,
        *logs.POLICIES,
        *tagging.POLICIES,
    ]


@dataclass(frozen=True)
class PolicySettings:
    level: EnforcementLevel
    properties: dict[str, Any] = field(default_factory=dict)


def default_level(policy: Policy, pack_default: EnforcementLevel = DEFAULT_ENFORCEMENT) -> EnforcementLevel:
    return policy.enforcement_level or pack_default


def resolve_config(
    policies: list[Policy],
    pack_config: Mapping[str, Any] | None = None,
    pack_default: EnforcementLevel = DEFAULT_ENFORCEMENT,
) -> dict[str, PolicySettings]:
    """Per-policy level and properties, reconciled like the Pulumi CLI does for a policy pack config file."""
    pack_config = dict(pack_config or {})
    names = {p.name for p in policies}
    unknown = set(pack_config) - names - {"all"}
    if unknown:
        raise ValueError(f"policy config names unknown rules: {sorted(unknown)}")

    settings = {}
    for policy in policies:
        schema = policy.config_schema.properties if policy.config_schema else {}
        level = default_level(policy, pack_default)
        if "all" in pack_config:
            level = EnforcementLevel(pack_config["all"])
        given = pack_config.get(policy.name, {})
        if isinstance(given, str):
            given = {"enforcementLevel": given}
        given = dict(given)
        if "enforcementLevel" in given:
            level = EnforcementLevel(given.pop("enforcementLevel"))
        properties = {k: v["default"] for k, v in schema.items() if "default" in v}
        properties.update(given)
        settings[policy.name] = PolicySettings(level, properties)
    return settings
