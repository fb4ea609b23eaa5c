"""Reading resource properties as the engine hands them over.

The engine wraps properties in read-only proxies (Mapping/Sequence, not dict/list) that raise
`UnknownValueError` when a value is not known yet (during preview). Resource rules let that error
propagate: the engine then reports "can't run policy during preview" and runs the rule again, with
known values, right before it creates the resource. Stack rules see the whole stack at once, so they
read through `known()` and skip what cannot be decided yet instead of giving up on every resource.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from pulumi_policy.proxy import UnknownValueError

UNKNOWN = object()
"""Stands for a value that is not known during preview."""


def is_mapping(value: Any) -> TypeGuard[Mapping]:
    return isinstance(value, Mapping)


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def get(value: Any, *path: str | int, default: Any = None) -> Any:
    """Follow `path` through mappings and lists; `default` where a step is missing. Unknowns raise."""
    for step in path:
        if isinstance(step, int):
            if not is_list(value) or step >= len(value):
                return default
            value = value[step]
        else:
            if not is_mapping(value) or step not in value:
                return default
            value = value[step]
        if value is None:
            return default
    return value


def known(value: Any, *path: str | int, default: Any = None) -> Any:
    """Like `get`, but returns `UNKNOWN` instead of raising when the value is not known yet."""
    try:
        return get(value, *path, default=default)
    except UnknownValueError:
        return UNKNOWN


def as_list(value: Any) -> list:
    """IAM and AWS APIs accept a single value or a list; always give a list."""
    if value is None:
        return []
    if is_list(value):
        return list(value)
    return [value]


def plain(value: Any) -> Any:
    """Copy proxies into plain dicts/lists (raises on unknowns), e.g. to run json.dumps on them."""
    if is_mapping(value):
        return {str(k): plain(value[k]) for k in value}
    if is_list(value):
        return [plain(v) for v in value]
    return value


def json_or_value(value: Any) -> Any:
    """Policy documents and some payloads arrive as JSON strings or as objects; give plain objects.

    Raises ValueError for a string that is not JSON.
    """
    if isinstance(value, str):
        return json.loads(value)
    return plain(value)


def tag_map(value: Any) -> dict[str, Any]:
    """A tags property (or a provider's `defaultTags.tags`, which may arrive JSON-encoded) as a dict.

    Unknown tag values map to UNKNOWN; a wholly unknown or malformed property gives {}.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not is_mapping(value):
        return {}
    return {key: known(value, key) for key in value}


def effective_tags(props: Any, provider: Any = None) -> dict[str, Any]:
    """Tags a resource ends up with: the provider's default tags, its own `tags`, and `tagsAll`
    (an output that already merges both, present when the engine passes outputs)."""
    tags: dict[str, Any] = {}
    if provider is not None:
        default_tags = known(provider.props, "defaultTags")
        if isinstance(default_tags, str):
            try:
                default_tags = json.loads(default_tags)
            except ValueError:
                default_tags = None
        tags.update(tag_map(known(default_tags, "tags")))
    tags.update(tag_map(known(props, "tags")))
    tags.update(tag_map(known(props, "tagsAll")))
    return tags
