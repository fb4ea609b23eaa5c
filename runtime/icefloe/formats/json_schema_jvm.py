"""JSON Schema values on the JVM read path: a record framed with the table's own schema id (the subject's latest
version, `DecoderSpec.schema_id`) is decoded by `json_jvm`'s codec, and is exact when that codec proves it decodes
as in Python and the schema's rules, checked as Spark expressions, accept it as `jsonschema` would.

The rules the JVM checks are a subset where both answers are certain (anything outside it keeps the table, or the
record, on Python, which validates it against its writer's schema as before):
  - `type` (one type, or one type and "null"): the round trip already proves the JSON type, the table's column being
    of the schema's type; "null" allowed decides whether a null written is valid;
  - `properties` and `required` (a missing property is valid only where it is not required), `additionalProperties`
    absent or false (the round trip refuses a property the table has no column for);
  - `items` given one schema; `enum` of strings (the value one of them, null refused);
  - `format` `date-time`, `date` and `uuid` on a string: `json_jvm` accepts only text every checker of the format
    accepts;
  - `$ref` to a path of the schema's own document (`#/...`), alone in its object; `oneOf`/`anyOf` of
    `{"type": "null"}` and one schema that does not itself allow null (a nullable property, as generators write it).
Keywords `jsonschema` does not know for the schema's draft are annotations (`title`, `description`, `$defs`...).
A schema with registry references, another `format`, or any other validation keyword (`pattern`, `minimum`,
`allOf`...) keeps the table on Python; so do records framed with another schema id (older versions).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from pyspark.sql import types as T

from icefloe.formats.base import DecoderSpec
from icefloe.formats.json_jvm import JsonJvmCodec, Presence, unsupported_type

_COVERED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "format",
    "$ref",
    "oneOf",
    "anyOf",
}
_TYPES = {"string", "integer", "number", "boolean", "object", "array", "null"}
_FORMATS = {"date-time", "date"}  # the shapes `json_jvm` checks for timestamp and date columns
# Formats of a string column, as a regular expression (SQL text) of text every checker of the format accepts:
# jsonschema's `uuid` is Python's UUID() of the text with dashes at 8, 13, 18 and 23.
_PATTERNS = {"uuid": "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\\\\z"}


class _NotCovered(Exception):
    """The schema uses a rule the JVM path does not check."""


def codec_for(spec: DecoderSpec, struct: T.StructType) -> JsonJvmCodec | str:
    """The JVM codec of a JSON Schema table (`struct`: its value columns), or why its values stay on Python."""
    if spec.schema_id is None:
        return "JSON Schema values are validated in Python: the JVM path reads Confluent framing only"
    bundle = json.loads(spec.schema)
    if bundle["references"]:
        return "JSON Schema values are validated in Python: the schema has registry references"
    import jsonschema

    root = bundle["schema"]
    known = set(jsonschema.validators.validator_for(root, default=jsonschema.Draft7Validator).VALIDATORS)
    if "extends" in known:
        return "JSON Schema values are validated in Python: draft 3 schemas are not read on the JVM"
    try:
        rules = _Rules(root, known).of(root, "value", ())
    except _NotCovered as why:
        return f"JSON Schema values are validated in Python: {why}"
    unsupported = unsupported_type(struct)
    if unsupported:
        return f"JSON Schema values are validated in Python: the JVM path does not read {unsupported}"
    frame = b"\x00" + spec.schema_id.to_bytes(4, "big")
    return JsonJvmCodec(struct, rules, frame, f"records of schema id {spec.schema_id}, validated")


class _Rules:
    """A schema's rules as `Presence` trees, or `_NotCovered`."""

    def __init__(self, root: Any, known: set[str]):
        self.root, self.known = root, known

    def of(self, node: Any, path: str, seen: tuple[str, ...]) -> Presence:
        node, seen = self._resolved(node, path, seen)
        if not isinstance(node, dict) or node is not self.root and "$id" in node:
            raise _NotCovered(f"{path}: the JVM path reads schemas that are objects, with no nested $id")
        used = {keyword for keyword in node if keyword in self.known}
        if used - _COVERED:
            raise _NotCovered(f"{path}: the JVM path does not check {', '.join(sorted(used - _COVERED))}")
        combinators = used & {"oneOf", "anyOf"}
        if combinators:
            return self._nullable(node, combinators.pop(), used, path, seen)
        kinds = node.get("type", [])
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not all(isinstance(k, str) and k in _TYPES for k in kinds) or len([k for k in kinds if k != "null"]) > 1:
            raise _NotCovered(f"{path}: the JVM path reads one type (and null)")
        kind = next((k for k in kinds if k != "null"), None)
        members = node.get("enum")
        if members is not None and not (
            kind in (None, "string") and isinstance(members, list) and all(isinstance(m, str) for m in members)
        ):
            raise _NotCovered(f"{path}: the JVM path checks an enum of strings only")
        if "format" in used and not (node["format"] in {*_FORMATS, *_PATTERNS} and kind == "string"):
            raise _NotCovered(f"{path}: the JVM path checks format date-time, date and uuid of a string only")
        if used & {"properties", "required", "additionalProperties"} and kind not in (None, "object"):
            raise _NotCovered(f"{path}: object keywords on a {kind}")
        element = None
        if "items" in used:
            if not isinstance(node["items"], dict) or kind != "array":
                raise _NotCovered(f"{path}: the JVM path checks `items` given one schema, of an array")
            element = self.of(node["items"], f"{path}[]", seen)
        return Presence(
            null="null" in kinds and members is None,  # a schema without a type accepts null: not sure, Python
            fields=self._fields(node, used, path, seen),
            element=element,
            members=None if members is None else tuple(members),
            pattern=_PATTERNS.get(node["format"]) if "format" in used else None,
        )

    def _fields(self, node: dict, used: set[str], path: str, seen: tuple[str, ...]) -> tuple[tuple[str, Presence], ...]:
        properties = node.get("properties", {}) if "properties" in used else {}
        required = node.get("required", []) if "required" in used else []
        if not isinstance(properties, dict) or not isinstance(required, list) or set(required) - set(properties):
            raise _NotCovered(f"{path}: the JVM path checks `required` of declared properties only")
        if node.get("additionalProperties", False) is not False:  # a column of its own (Python keeps them)
            raise _NotCovered(f"{path}: additional properties are kept in Python")
        return tuple(
            (name, replace(self.of(sub, f"{path}.{name}", seen), missing=name not in required))
            for name, sub in properties.items()
        )

    def _nullable(self, node: dict, combinator: str, used: set[str], path: str, seen: tuple[str, ...]) -> Presence:
        """`oneOf`/`anyOf` of null and one schema that does not accept null: that schema, or null."""
        branches = node[combinator]
        if used != {combinator} or not isinstance(branches, list) or len(branches) != 2:
            raise _NotCovered(f"{path}: the JVM path checks {combinator} of null and one schema only")
        nulls = [b for b in branches if self._is_null(b, path, seen)]
        if len(nulls) != 1:
            raise _NotCovered(f"{path}: the JVM path checks {combinator} of null and one schema only")
        other = next(b for b in branches if b is not nulls[0])
        rules = self.of(other, path, seen)
        if rules.null or "type" not in self._resolved(other, path, seen)[0]:  # without a type it accepts null
            raise _NotCovered(f"{path}: {combinator}'s other schema must have a type that is not null")
        return replace(rules, null=True)

    def _is_null(self, node: Any, path: str, seen: tuple[str, ...]) -> bool:
        node, _ = self._resolved(node, path, seen)
        return isinstance(node, dict) and node.get("type") == "null" and not ({*node} & self.known) - {"type"}

    def _resolved(self, node: Any, path: str, seen: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """A `$ref` followed in the schema's own document (alone in its object: drafts differ on its siblings)."""
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if {*node} & self.known != {"$ref"} or not isinstance(ref, str) or not ref.startswith("#/") or ref in seen:
                raise _NotCovered(f"{path}: the JVM path follows a $ref alone, to a path of its own document")
            seen = (*seen, ref)
            node = self.root
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(node, dict) or part not in node:
                    raise _NotCovered(f"{path}: $ref {ref!r} names nothing in its schema")
                node = node[part]
        return node, seen
