"""Avro named types (records, enums, fixed): full names from namespaces, and references by name resolved to what
was defined before them. One rule for every walk over an Avro schema (the JVM codec, named unions, the table
columns, Debezium's Connect schemas): a name with a dot is full; otherwise it is in its own `namespace`, else in the
enclosing one; a reference looks up its full name, then the name as written (a type defined outside any namespace)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = ("record", "enum", "fixed")
V = TypeVar("V")


def full_name(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def defined_name(schema: dict, namespace: str) -> str:
    """The full name of a named type's definition (its own namespace, else the enclosing one)."""
    return full_name(schema["name"], schema.get("namespace", namespace))


def namespace_of(full: str) -> str:
    return full.rpartition(".")[0]


def candidates(reference: str, namespace: str) -> tuple[str, str]:
    """The names a reference by name may be known by, in look-up order."""
    return full_name(reference, namespace), reference


def lookup(known: Mapping[str, V], reference: str, namespace: str) -> tuple[str, V] | None:
    """(the name it is known by, what is known) for a reference by name, or None."""
    for name in candidates(reference, namespace):
        if name in known:
            return name, known[name]
    return None


class Names:
    """The named types of one schema seen so far, so references by name resolve to their definitions. `unknown`:
    the error a reference to no defined type raises (the caller's: a config error, or a plan the JVM drops)."""

    def __init__(self, unknown: type[Exception] = ValueError) -> None:
        self.known: dict[str, dict] = {}
        self.unknown = unknown

    def resolve(self, schema: Any, namespace: str) -> tuple[Any, str, str | None]:
        """(the definition, its namespace, its full name if named); a definition is remembered by its full name."""
        if isinstance(schema, str) and schema not in PRIMITIVES:
            found = lookup(self.known, schema, namespace)
            if found is None:
                raise self.unknown(f"unknown Avro type {schema!r}")
            name, definition = found
            return definition, namespace_of(name), name
        if isinstance(schema, dict) and schema.get("type") in NAMED:
            full = defined_name(schema, namespace)
            self.known.setdefault(full, schema)
            return schema, namespace_of(full), full
        return schema, namespace, None
