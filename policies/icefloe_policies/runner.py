"""Run the whole pack over a list of resources, the way the Pulumi engine would.

Meant for resources recorded from the icefloe program under Pulumi's mocks
(`icefloe_infra.dry_run`, or `tests/pulumi_mocks.run_program`), or built by hand in tests. A recorded resource is any object with
`type` (token), `name`, `inputs` (camelCase dict) and optionally `urn`, `id`, `outputs`, `parent` (URN),
`dependencies` (URNs), `property_dependencies` ({input name: [URNs]}) and `provider` (another recorded
resource, e.g. the AWS provider with defaultTags).

Like the engine, resource rules see each resource's inputs and stack rules see its outputs (inputs plus
`id` when no outputs were recorded); properties travel through a protobuf Struct (so ints become floats)
and are wrapped in the engine's unknown-checking proxies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from inspect import isawaitable
from typing import Any

from google.protobuf import json_format, struct_pb2
from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyCustomTimeouts,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.deserialize import deserialize_properties
from pulumi_policy.proxy import UnknownValueError, unknown_checking_proxy

from .pack import DEFAULT_ENFORCEMENT, all_policies, resolve_config


@dataclass(frozen=True)
class Violation:
    policy: str
    level: str  # "mandatory" or "advisory", after config
    message: str
    urn: str | None


@dataclass(frozen=True)
class Resource:
    """A minimal recorded resource, for hand-built stacks."""

    type: str
    name: str
    inputs: Mapping[str, Any]
    urn: str = ""
    id: str | None = None
    parent: str | None = None
    dependencies: list[str] | None = None
    outputs: Mapping[str, Any] | None = None
    property_dependencies: Mapping[str, list[str]] | None = None
    provider: Any = None


def default_urn(type_token: str, name: str, stack: str = "dev", project: str = "icefloe") -> str:
    return f"urn:pulumi:{stack}::{project}::{type_token}::{name}"


def engine_props(props: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Properties as a policy sees them: through a protobuf Struct, deserialized, unknown-checking."""
    struct = struct_pb2.Struct()
    struct.update(dict(props or {}))
    return unknown_checking_proxy(deserialize_properties(json_format.MessageToDict(struct)))


def _urn(recorded: Any) -> str:
    return getattr(recorded, "urn", "") or default_urn(recorded.type, recorded.name)


def _options(recorded: Any) -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=False,
        ignore_changes=[],
        delete_before_replace=None,
        aliases=[],
        custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
        additional_secret_outputs=[],
        parent=getattr(recorded, "parent", None),
    )


def _provider(recorded: Any) -> PolicyProviderResource | None:
    provider = getattr(recorded, "provider", None)
    if provider is None:
        return None
    return PolicyProviderResource(provider.type, engine_props(provider.inputs), _urn(provider), provider.name)


def _stack_props(recorded: Any) -> Mapping[str, Any]:
    outputs = getattr(recorded, "outputs", None)
    props = dict(outputs if outputs is not None else recorded.inputs)
    if getattr(recorded, "id", None) and "id" not in props:
        props["id"] = recorded.id
    return engine_props(props)


def resource_args(
    recorded: Any, config: Mapping[str, Any] | None = None, stack_tags: Mapping[str, str] | None = None
) -> ResourceValidationArgs:
    """What Analyze hands a resource rule: the resource's inputs."""
    return ResourceValidationArgs(
        recorded.type,
        engine_props(recorded.inputs),
        _urn(recorded),
        recorded.name,
        _options(recorded),
        _provider(recorded),
        config,
        stack_tags,
    )


def stack_resources(recorded: Iterable[Any]) -> list[PolicyResource]:
    """PolicyResources with parents and dependencies linked, as AnalyzeStack builds them."""
    recorded = list(recorded)
    resources = [
        PolicyResource(r.type, _stack_props(r), _urn(r), r.name, _options(r), _provider(r), None, [], {})
        for r in recorded
    ]
    by_urn = {r.urn: r for r in resources}
    for rec, resource in zip(recorded, resources):
        resource.parent = by_urn.get(getattr(rec, "parent", None) or "")
        resource.dependencies = [by_urn[u] for u in getattr(rec, "dependencies", None) or [] if u in by_urn]
        for key, urns in (getattr(rec, "property_dependencies", None) or {}).items():
            resource.property_dependencies[key] = [by_urn[u] for u in urns if u in by_urn]
    return resources


def _run(policy: ResourceValidationPolicy | StackValidationPolicy, args: Any, report) -> str | None:
    """Validate like the engine: await coroutines; an unknown value becomes an advisory diagnostic."""
    try:
        result = policy.validate(args, report)
        if isawaitable(result):
            asyncio.run(result)  # type: ignore[arg-type]  # a rule's awaitable result is its coroutine
    except UnknownValueError as error:
        return f"can't run policy '{policy.name}' during preview: {error.message}"
    return None


def _reporter(violations: list[Violation], policy: str, level: EnforcementLevel, resource_urn: str | None = None):
    def report(msg: str, urn: str | None = None) -> None:
        violations.append(Violation(policy, level.value, msg, resource_urn or urn))

    return report


def run_pack(
    recorded: Iterable[Any],
    pack_config: Mapping[str, Any] | None = None,
    stack_tags: Mapping[str, str] | None = None,
    policies: list[Policy] | None = None,
) -> list[Violation]:
    """Every violation the pack reports for these resources (resource rules, then stack rules).

    `pack_config` has the shape of a `--policy-pack-config` file; disabled rules do not run.
    """
    recorded = list(recorded)
    policies = policies if policies is not None else all_policies()
    settings = resolve_config(policies, pack_config, DEFAULT_ENFORCEMENT)
    violations: list[Violation] = []

    for policy in policies:
        level = settings[policy.name].level
        if level == EnforcementLevel.DISABLED:
            continue
        if level == EnforcementLevel.REMEDIATE:  # the engine reports remediable violations as mandatory
            level = EnforcementLevel.MANDATORY
        config = settings[policy.name].properties

        if isinstance(policy, ResourceValidationPolicy):
            for rec in recorded:
                args = resource_args(rec, config, stack_tags)
                urn = args.urn
                # The engine files every violation of a resource rule under the resource's own URN.
                diagnostic = _run(policy, args, _reporter(violations, policy.name, level, urn))
                if diagnostic:
                    violations.append(Violation(policy.name, EnforcementLevel.ADVISORY.value, diagnostic, urn))
        elif isinstance(policy, StackValidationPolicy):
            stack_args = StackValidationArgs(stack_resources(recorded), config, stack_tags)
            diagnostic = _run(policy, stack_args, _reporter(violations, policy.name, level))
            if diagnostic:
                violations.append(Violation(policy.name, EnforcementLevel.ADVISORY.value, diagnostic, None))
    return violations
