"""A quick acceptance check for JSON Schema validation: the common keywords compiled into plain Python closures.

`jsonschema` walks a schema per record through generic machinery (a validator object and a resource per keyword
and property: ~250 µs for an 8-property record). Most records are valid, so a check compiled from the schema
answers "certainly valid" for them in a few µs, and jsonschema itself runs only for the rest, where it finds the
failure (or none) and words the error exactly as before.

The check may only ever be stricter than jsonschema, never more lenient: it returns True only for a value
jsonschema accepts. It covers `type`, `properties`, `required`, `additionalProperties`, `enum` of strings,
`items` given one schema, and `format` (asked of the same format checker jsonschema uses, but for the common
`date-time`s its own checker accepts); keywords jsonschema does not know are ignored, as jsonschema ignores them. A schema using any other validation keyword (`$ref`, `oneOf`,
`pattern`, `minimum`...) gets no quick check (None): each of its records is validated by jsonschema alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

# Where a value passes as the type in every draft; stricter than jsonschema where drafts differ (a float such as
# 1.0 is an "integer" from draft 6 on: such a value gets jsonschema's answer).
_TYPES: dict[str, Check] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "null": lambda v: v is None,
}
_COVERED = {"type", "properties", "required", "additionalProperties", "enum", "items", "format"}


class _NotCovered(Exception):
    """The schema uses a keyword the quick check does not cover."""


def quick_check(schema: Any, validator_class: Any, format_checker: Any) -> Check | None:
    """A check accepting only values that `validator_class(schema, format_checker=...)` accepts, or None when the
    schema uses a keyword it does not cover. Draft 3 (its `required` is a boolean) is not covered."""
    known = set(validator_class.VALIDATORS)
    if "extends" in known:  # draft 3
        return None
    try:
        return _compile(schema, known, format_checker)
    except _NotCovered:
        return None


def _compile(node: Any, known: set[str], format_checker: Any) -> Check:
    if node is True or node == {}:
        return _always
    if not isinstance(node, dict):  # the schema `false`
        raise _NotCovered
    used = {keyword for keyword in node if keyword in known}  # jsonschema ignores the others (annotations)
    if used - _COVERED:
        raise _NotCovered
    checks: list[Check] = []
    if "type" in used:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not all(isinstance(kind, str) and kind in _TYPES for kind in kinds):
            raise _NotCovered
        tests = [_TYPES[kind] for kind in kinds]
        checks.append(tests[0] if len(tests) == 1 else lambda v: any(test(v) for test in tests))
    if "enum" in used:
        members = node["enum"]
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise _NotCovered
        strings = frozenset(members)
        checks.append(lambda v: type(v) is str and v in strings)
    if "format" in used:
        name = node["format"]
        if format_checker is not None:
            plain = _plain_date_time(format_checker) if name == "date-time" else None
            if plain is not None:
                checks.append(lambda v: plain(v) or format_checker.conforms(v, name))
            else:
                checks.append(lambda v: format_checker.conforms(v, name))
    if "items" in used:
        if not isinstance(node["items"], (dict, bool)):  # a list: positional items
            raise _NotCovered
        item = _compile(node["items"], known, format_checker)
        checks.append(lambda v: type(v) is not list or all(item(x) for x in v))
    if used & {"properties", "required", "additionalProperties"}:
        checks.append(_object(node, known, format_checker))
    return _all_of(checks)


def _all_of(checks: list[Check]) -> Check:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    first, rest = checks[0], _all_of(checks[1:])
    return lambda v: first(v) and rest(v)


def _object(node: dict, known: set[str], format_checker: Any) -> Check:
    properties = node.get("properties", {}) if "properties" in known else {}
    required = node.get("required", []) if "required" in known else []
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise _NotCovered
    fields = [(name, _compile(sub, known, format_checker)) for name, sub in properties.items()]
    fields = [(name, check) for name, check in fields if check is not _always]
    extra_schema = node.get("additionalProperties", True)
    closed = extra_schema is False
    extra = None if closed or extra_schema is True else _compile(extra_schema, known, format_checker)
    declared = frozenset(properties)

    def check(value: Any) -> bool:
        if type(value) is not dict:
            return not isinstance(value, dict)  # object keywords apply to objects only (a dict subclass: unsure)
        for name in required:
            if name not in value:
                return False
        for name, field in fields:
            if name in value and not field(value[name]):
                return False
        if closed or extra is not None:
            for key in value:
                if key not in declared and (closed or not extra(value[key])):  # type: ignore[misc]  # set when not closed
                    return False
        return True

    return check


# RFC 3339 date-times every checker of the format accepts: rfc3339_validator's own pattern, uppercase `T` and `Z`
# only (it checks the text uppercased), a day no month lacks, year 0 excluded.
_PLAIN_DATE_TIME = re.compile(
    r"(?!0000)\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?"
    r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)",
    re.ASCII,
)


def _plain_date_time(format_checker: Any) -> Check | None:
    """A quick acceptance of common date-times, where the checker's `date-time` is jsonschema's own over
    rfc3339_validator (what the pattern above was read from); None for any other checker. A string it does not
    accept is asked of the checker."""
    from jsonschema import _format

    checker = format_checker.checkers.get("date-time", (None,))[0]
    validate = getattr(_format, "validate_rfc3339", None)
    if checker is not getattr(_format, "is_datetime", None) or validate is None:
        return None
    if f"{validate.__module__}.{validate.__name__}" != "rfc3339_validator.validate_rfc3339":
        return None
    match = _PLAIN_DATE_TIME.fullmatch
    return lambda v: type(v) is str and match(v) is not None


def _always(value: Any) -> bool:
    return True
