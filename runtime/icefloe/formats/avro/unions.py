"""Avro unions of several types (beyond `[null, T]`): a struct with one nullable field per branch, on both read paths.

The convention is Spark's `from_avro` (its SchemaConverters), so the JVM path needs no conversion: the branches in
schema order with `null` left out, named `member0`, `member1`, ...; a value sets its branch's field and leaves the
others null. As Spark does, a union of exactly `int` and `long` is a long, of `float` and `double` a double.

On the Python path the decoders (fastavro) hand over the branch's plain value; `rewriter` tells its branch from the
value's Python type, and from the record name where a union has several records, or a record and a map (then the
decoder is asked for record names: `needs_record_names`). Unions whose branches Python cannot tell apart (a string
and an enum, bytes and a fixed, two enums, two fixed, `int`/`long` with a logical type) are refused with the field
named, on both paths, so a table is the same whichever path reads it.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from icefloe.errors import BadRecord, ConfigError
from icefloe.formats.avro.names import Names

Rewrite = Callable[[Any], Any]
# Python type of a decoded value -> the kind of branch it comes from (order matters: bool is an int, datetime a date)
_VALUE_KINDS: list[tuple[type, str]] = [
    (bool, "boolean"),
    (int, "int"),
    (float, "float"),
    (str, "string"),
    (bytes, "bytes"),
    (list, "array"),
    (dict, "dict"),
    (Decimal, "decimal"),
    (dt.datetime, "datetime"),
    (dt.date, "date"),
    (dt.time, "time"),
    (uuid.UUID, "uuid"),
]
_LOGICAL_KINDS = {
    "decimal": "decimal",
    "date": "date",
    "timestamp-millis": "datetime",
    "timestamp-micros": "datetime",
    "local-timestamp-millis": "datetime",
    "local-timestamp-micros": "datetime",
    "time-millis": "time",
    "time-micros": "time",
    "uuid": "uuid",
}
_BASE_KINDS = {
    "boolean": "boolean",
    "int": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "string": "string",
    "enum": "string",
    "bytes": "bytes",
    "fixed": "bytes",
    "array": "array",
    "map": "dict",
    "record": "dict",
}


def member_name(index: int) -> str:
    return f"member{index}"


def branches(union: list) -> list:
    """The branches that become struct fields: all but null, in schema order."""
    return [b for b in union if b != "null"]


def collapsed(members: list) -> str | None:
    """`long` for a union of exactly int and long, `double` for float and double (Spark's rule), else None."""
    kinds = {m if isinstance(m, str) else m.get("type") for m in members}
    if len(members) == 2 and kinds in ({"int", "long"}, {"float", "double"}):
        if any(isinstance(m, dict) and "logicalType" in m for m in members):
            return "ambiguous"
        return "long" if "long" in kinds else "double"
    return None


class _Schemas(Names):
    """Named Avro types seen so far; a type given as `{"type": <schema>}` is that schema."""

    def __init__(self) -> None:
        super().__init__(unknown=ConfigError)

    def resolve(self, schema: Any, namespace: str) -> tuple[Any, str, str | None]:
        if isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
            return self.resolve(schema["type"], namespace)
        return super().resolve(schema, namespace)


def _kind(schema: Any) -> str:
    return schema if isinstance(schema, str) else schema.get("type")


class _Compiler:
    def __init__(self, names: bool):
        self.names = names  # the decoder returns (record name, value) for every record inside a union
        self.schemas = _Schemas()
        self.needs_names = False

    def compile(self, schema: Any, namespace: str, path: str) -> Rewrite | None:
        if isinstance(schema, list):
            members = branches(schema)
            if len(members) == 1:
                return self._single(members[0], namespace, path)
            return self._union(members, namespace, path)
        schema, namespace, _ = self.schemas.resolve(schema, namespace)
        kind = _kind(schema)
        if kind == "record":
            compiled = [
                (f["name"], self.compile(f["type"], namespace, f"{path}.{f['name']}")) for f in schema["fields"]
            ]
            fields = [(name, rewrite) for name, rewrite in compiled if rewrite is not None]
            if not fields:
                return None

            def record(value: Any) -> Any:
                out = dict(value)
                for name, rewrite in fields:
                    if out.get(name) is not None:
                        out[name] = rewrite(out[name])
                return out

            return record
        if kind == "array":
            inner = self.compile(schema["items"], namespace, f"{path}[]")
            return None if inner is None else (lambda value: [None if v is None else inner(v) for v in value])  # type: ignore[misc]  # inner is not None in this branch
        if kind == "map":
            inner = self.compile(schema["values"], namespace, f"{path}{{}}")
            return (
                None
                if inner is None
                else (lambda value: {k: None if v is None else inner(v) for k, v in value.items()})
            )
        return None

    def _single(self, member: Any, namespace: str, path: str) -> Rewrite | None:
        inner = self.compile(member, namespace, path)
        resolved, _, _ = self.schemas.resolve(member, namespace)
        if not (self.names and _kind(resolved) == "record"):
            return inner
        inner = inner or _same
        return lambda value: inner(value[1] if isinstance(value, tuple) else value)

    def _union(self, members: list, namespace: str, path: str) -> Rewrite:
        collapse = collapsed(members)
        if collapse == "ambiguous":
            raise ConfigError(
                f"{path}: an Avro union of int and long (or float and double) with a logical type is not supported"
            )
        if collapse:
            return _same
        kinds: dict[str, int] = {}
        inners: list[Rewrite] = []
        dict_branches = 0
        for index, member in enumerate(members):
            member_path = f"{path}.{member_name(index)}"
            resolved, _, full = self.schemas.resolve(member, namespace)
            logical = resolved.get("logicalType") if isinstance(resolved, dict) else None
            kind = _LOGICAL_KINDS.get(logical) or _BASE_KINDS[_kind(resolved)]  # type: ignore[arg-type]  # no logicalType (None) finds none
            if _kind(resolved) == "record":
                dict_branches += 1
                kind = f"record:{full}"
            if kind in kinds:
                raise ConfigError(
                    f"{path}: the Avro union {json.dumps(members)[:200]} has branches {kinds[kind]} and {index} that "
                    "decode to the same Python type; icefloe cannot tell them apart"
                )
            kinds[kind] = index
            inners.append(self.compile(member, namespace, member_path) or _same)
        if dict_branches > 1 or (dict_branches and "dict" in kinds):
            self.needs_names = True
        size = len(members)
        names = self.names

        def union(value: Any) -> dict:
            if isinstance(value, tuple):  # (record name, record) when the decoder gives record names
                index = kinds.get(f"record:{value[0]}")
                value = value[1]
            else:
                kind = next((k for t, k in _VALUE_KINDS if isinstance(value, t)), type(value).__name__)
                index = kinds.get(kind)
                if index is None and kind == "dict" and not names:
                    index = next((i for k, i in kinds.items() if k.startswith("record:")), None)
            if index is None:
                raise BadRecord(f"{path}: a {type(value).__name__} value matches no branch of the union")
            out = dict.fromkeys((member_name(i) for i in range(size)), None)
            out[member_name(index)] = inners[index](value)
            return out

        return union


def _same(value: Any) -> Any:
    return value


def needs_record_names(schema_str: str) -> bool:
    """Whether the decoder must give (record name, value) for records in unions: a union has several records, or a
    record and a map. Raises ConfigError for a union icefloe cannot map."""
    compiler = _Compiler(names=False)
    compiler.compile(json.loads(schema_str), "", "value")
    return compiler.needs_names


def rewriter(schema_str: str, names: bool) -> Rewrite | None:
    """A function turning decoded values of `schema_str` (decoded with record names if `names`) into the table's
    shape, or None when the schema has no union of several types."""
    rewrite = _Compiler(names).compile(json.loads(schema_str), "", "value")
    return rewrite
