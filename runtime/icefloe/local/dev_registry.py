"""A *development* Schema Registry: a small in-memory HTTP server speaking the Confluent Schema Registry REST API.

NOT FOR PRODUCTION. It exists because no Confluent-compatible registry server can be installed on a developer
machine without Java downloads, and confluent-kafka's `mock://` client keeps its state inside one process, so a
producer and the runtime's Spark executors could not share it. State lives in memory and is gone when it stops.

What it implements (the subset that confluent-kafka's `SchemaRegistryClient` and its Avro, JSON Schema and
Protobuf serializers and deserializers use, plus the usual admin calls):

- `POST /subjects/{s}/versions` registers (`schemaType` AVRO by default, JSON, PROTOBUF; `references`). Identical
  schemas (same type, same JSON after normalising key order and whitespace, same references) share one global id
  across subjects; registering one again under the same subject returns the existing id.
- `POST /subjects/{s}` looks a schema up; `GET /schemas/ids/{id}` (+ `/versions`, `/subjects`),
  `GET /schemas/guids/{guid}`, `GET /schemas/types`, `GET /subjects`, `GET /subjects/{s}/versions`,
  `GET /subjects/{s}/versions/{v|latest}` (+ `/referencedby`), `DELETE /subjects/{s}` and
  `DELETE /subjects/{s}/versions/{v}` (soft delete, then `?permanent=true`), `GET|PUT|DELETE /config[/{s}]`,
  `POST /compatibility/subjects/{s}/versions[/{v}]`, `GET /contexts`, `GET /`.
- Everything else, including `/associations/...` and `/mode`, answers 404 `{"error_code": 404, ...}`, which the
  serializers treat as "no associations".

Validation and compatibility:

- AVRO schemas must parse with fastavro (named types from `references` included), else 42201 "Invalid schema".
  Compatibility levels (BACKWARD by default, FORWARD, FULL, their _TRANSITIVE forms, NONE) are really checked for
  AVRO, both on register (409 when incompatible) and by the compatibility endpoints, using the Avro specification's
  schema-resolution rules (field defaults, type promotions, unions, enum symbols, fixed sizes, names and aliases).
- JSON schemas must be valid JSON Schema documents; PROTOBUF schemas must be the base64 serialized
  `FileDescriptorProto` that confluent-kafka's ProtobufSerializer sends (`.proto` text is not parsed here). For these
  two types there is NO compatibility check: any new version is accepted and the compatibility endpoints answer
  `is_compatible: true` (with `verbose=true`, a message says that nothing was checked). A change of schema type
  within a subject is reported incompatible.
- `normalize`, `format`, metadata and rule sets are accepted; metadata and rule sets are stored and returned as
  given. Protobuf schemas are returned as stored for every `format`.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import signal
import sys
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

import fastavro

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
COMPATIBILITY_LEVELS = (
    "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE",
)  # fmt: skip
DEFAULT_COMPATIBILITY = "BACKWARD"


class RegistryError(Exception):
    """An API error: `error_code` is the Confluent code; the HTTP status follows from its first three digits."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    @property
    def status(self) -> int:
        return self.error_code if self.error_code < 1000 else self.error_code // 100


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(40401, f"Subject '{subject}' not found.")


def _invalid_schema(detail: str) -> RegistryError:
    return RegistryError(42201, f"Invalid schema: {detail}")


# --- Avro schema resolution (https://avro.apache.org/docs/1.11.1/specification/#schema-resolution) -------------

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
# What a reader of each type may read besides its own type (writer type -> reader types).
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


def _short_name(fullname: str) -> str:
    return fullname.rsplit(".", 1)[-1]


class _AvroResolution:
    """Lists why data written with one parsed Avro schema could not be read with another (empty: it can)."""

    def __init__(self, reader_names: dict[str, Any], writer_names: dict[str, Any]) -> None:
        self.reader_names = reader_names
        self.writer_names = writer_names
        self._in_progress: set[tuple[str, str]] = set()  # named pairs on the recursion stack (recursive types)

    @staticmethod
    def _expand(schema: Any, names: dict[str, Any]) -> Any:
        if isinstance(schema, str):
            return names.get(schema, schema)
        if isinstance(schema, dict) and schema["type"] not in ("record", "error", "enum", "fixed", "array", "map"):
            # A primitive with a logical type (which does not change how data resolves), or a wrapped reference.
            return _AvroResolution._expand(schema["type"], names)
        return schema

    def problems(self, reader: Any, writer: Any, path: str = "") -> list[str]:
        reader = self._expand(reader, self.reader_names)
        writer = self._expand(writer, self.writer_names)
        if isinstance(writer, list):
            return [p for branch in writer for p in self.problems(reader, branch, path)]
        if isinstance(reader, list):
            if any(not self.problems(branch, writer, path) for branch in reader):
                return []
            return [f"{_at(path)}: reader union {_describe(reader)} has no branch for writer type {_describe(writer)}"]
        reader_type = reader if isinstance(reader, str) else reader["type"]
        writer_type = writer if isinstance(writer, str) else writer["type"]
        if reader_type != writer_type:
            if reader_type in _PROMOTIONS.get(writer_type, ()):
                return []
            return [f"{_at(path)}: writer type {writer_type} cannot be read as {reader_type}"]
        if reader_type in _PRIMITIVES:
            return []
        if reader_type == "array":
            return self.problems(reader["items"], writer["items"], f"{path}[]")
        if reader_type == "map":
            return self.problems(reader["values"], writer["values"], f"{path}{{}}")
        if not _names_match(reader, writer):
            return [f"{_at(path)}: writer name {writer['name']} does not match reader name {reader['name']}"]
        if reader_type == "fixed":
            if reader["size"] != writer["size"]:
                return [f"{_at(path)}: fixed size changed from {writer['size']} to {reader['size']}"]
            return []
        if reader_type == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                return [f"{_at(path)}: reader enum {reader['name']} lacks writer symbols {missing} and has no default"]
            return []
        return self._record_problems(reader, writer, path)

    def _record_problems(self, reader: dict, writer: dict, path: str) -> list[str]:
        pair = (reader["name"], writer["name"])
        if pair in self._in_progress:
            return []  # a recursive reference back to a pair being checked further up
        self._in_progress.add(pair)
        try:
            writer_fields = {f["name"]: f for f in writer["fields"]}
            problems = []
            for reader_field in reader["fields"]:
                candidates = [reader_field["name"], *reader_field.get("aliases", ())]
                writer_field = next((writer_fields[n] for n in candidates if n in writer_fields), None)
                field_path = f"{path}.{reader_field['name']}" if path else reader_field["name"]
                if writer_field is not None:
                    problems += self.problems(reader_field["type"], writer_field["type"], field_path)
                elif "default" not in reader_field:
                    problems.append(f"{_at(field_path)}: the reader's field has no default and the writer lacks it")
            return problems
        finally:
            self._in_progress.discard(pair)


def _at(path: str) -> str:
    return f"field {path}" if path else "top level"


def _names_match(reader: dict, writer: dict) -> bool:
    # Like Java Avro's SchemaCompatibility: unqualified names, or the writer's full name among the reader's aliases.
    if _short_name(reader["name"]) == _short_name(writer["name"]):
        return True
    namespace = reader["name"].rpartition(".")[0]
    aliases = {a if "." in a or not namespace else f"{namespace}.{a}" for a in reader.get("aliases", ())}
    return writer["name"] in aliases


def _describe(schema: Any) -> str:
    if isinstance(schema, list):
        return "[" + ", ".join(_describe(s) for s in schema) + "]"
    if isinstance(schema, dict):
        return schema.get("name", schema["type"])
    return schema


# --- registry state ------------------------------------------------------------------------------------------


@dataclass
class _Schema:
    id: int
    guid: str
    schema_type: str
    schema: str
    references: list[dict]
    extra: dict[str, Any]  # metadata and ruleSet, stored and returned as given

    def body(self) -> dict[str, Any]:
        # Like Confluent's registry: schemaType and references only when they say something.
        result: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            result["schemaType"] = self.schema_type
        if self.references:
            result["references"] = self.references
        return result | self.extra


@dataclass
class _Version:
    version: int
    schema: _Schema
    deleted: bool = False


@dataclass
class _Subject:
    versions: list[_Version] = field(default_factory=list)
    compatibility: str | None = None

    def live(self) -> list[_Version]:
        return [v for v in self.versions if not v.deleted]

    def visible(self, deleted: bool) -> list[_Version]:
        return self.versions if deleted else self.live()


@dataclass
class _Request:
    method: str
    parts: list[str]  # decoded path segments
    query: dict[str, str]
    body: Any

    def flag(self, name: str) -> bool:
        return self.query.get(name, "false").lower() == "true"


class _State:
    """All registry data; every public method runs under one lock, so handler threads see consistent state."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.subjects: dict[str, _Subject] = {}
        self.schemas_by_key: dict[str, _Schema] = {}
        self.schemas_by_id: dict[int, _Schema] = {}
        self.compatibility = DEFAULT_COMPATIBILITY

    # -- helpers (caller holds the lock) --

    def subject(self, name: str, deleted: bool = False) -> _Subject:
        subject = self.subjects.get(name)
        if subject is None or not subject.visible(deleted):
            raise _subject_not_found(name)
        return subject

    def version(self, subject_name: str, version: str, deleted: bool = False) -> _Version:
        latest = version in ("latest", "-1")
        number = None if latest else _parse_version(version)  # a bad version is reported before a missing subject
        candidates = self.subject(subject_name, deleted).visible(deleted)
        if latest:
            return candidates[-1]
        for candidate in candidates:
            if candidate.version == number:
                return candidate
        raise RegistryError(40402, f"Version {number} not found.")

    def schema_by_id(self, schema_id: str) -> _Schema:
        try:
            found = self.schemas_by_id.get(int(schema_id))
        except ValueError:
            found = None
        if found is None or not self.versions_with(found, deleted=True):
            raise RegistryError(40403, f"Schema {schema_id} not found")
        return found

    def versions_with(self, schema: _Schema, deleted: bool) -> list[tuple[str, _Version]]:
        return [
            (name, v) for name, subject in self.subjects.items() for v in subject.visible(deleted) if v.schema is schema
        ]

    def level(self, subject_name: str) -> str:
        subject = self.subjects.get(subject_name)
        return (subject.compatibility if subject else None) or self.compatibility

    def parse_avro(self, schema: _Schema | dict) -> tuple[Any, dict[str, Any]]:
        """(parsed schema, named types) for a stored schema or a request body, with referenced types loaded first."""
        text = schema.schema if isinstance(schema, _Schema) else schema["schema"]
        references = schema.references if isinstance(schema, _Schema) else schema.get("references") or []
        names: dict[str, Any] = {}
        self._load_references(references, names, seen=set())
        try:
            return fastavro.parse_schema(json.loads(text), named_schemas=names, _write_hint=False), names
        except Exception as error:  # fastavro raises several types for bad schemas
            raise _invalid_schema(f"{type(error).__name__}: {error}") from error

    def _load_references(self, references: list[dict], names: dict[str, Any], seen: set[int]) -> None:
        for reference in references:
            try:
                referenced = self.version(reference["subject"], str(reference["version"])).schema
            except (KeyError, RegistryError) as error:
                raise _invalid_schema(f"reference {reference!r} cannot be resolved") from error
            if referenced.id in seen:
                continue
            seen.add(referenced.id)
            self._load_references(referenced.references, names, seen)
            try:
                fastavro.parse_schema(json.loads(referenced.schema), named_schemas=names, _write_hint=False)
            except Exception as error:
                raise _invalid_schema(f"referenced schema {referenced.id}: {error}") from error

    def validate(self, request: dict) -> None:
        schema_type = request["schemaType"]
        if schema_type == "AVRO":
            self.parse_avro(request)
        elif schema_type == "JSON":
            _validate_json_schema(request["schema"])
        else:
            _validate_protobuf(request["schema"])

    def incompatibilities(self, request: dict, level: str, against: list[_Version]) -> list[str]:
        """Why `request` breaks `level` against the given existing versions (all of them are checked)."""
        if level == "NONE":
            return []
        if request["schemaType"] == "AVRO":
            new, new_names = self.parse_avro(request)
        problems = []
        for existing in against:
            if existing.schema.schema_type != request["schemaType"]:
                problems.append(
                    f"version {existing.version} is {existing.schema.schema_type}, not {request['schemaType']}"
                )
            elif request["schemaType"] == "AVRO":
                old, old_names = self.parse_avro(existing.schema)
                if level.startswith(("BACKWARD", "FULL")):
                    problems += [
                        f"version {existing.version}, reading old data: {p}"
                        for p in _AvroResolution(new_names, old_names).problems(new, old)
                    ]
                if level.startswith(("FORWARD", "FULL")):
                    problems += [
                        f"version {existing.version}, old readers: {p}"
                        for p in _AvroResolution(old_names, new_names).problems(old, new)
                    ]
        return problems

    def versions_to_check(self, subject_name: str, level: str) -> list[_Version]:
        subject = self.subjects.get(subject_name)
        live = subject.live() if subject else []
        return live if level.endswith("_TRANSITIVE") else live[-1:]


def _parse_version(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise RegistryError(
            42202, f"The specified version '{text}' is not a valid version id. Allowed values are between "
            "[1, 2^31-1] and the string \"latest\""
        )  # fmt: skip
    return number


def _validate_json_schema(text: str) -> None:
    import jsonschema  # installed with confluent-kafka[json]

    try:
        document = json.loads(text)
        jsonschema.validators.validator_for(document).check_schema(document)
    except (ValueError, jsonschema.exceptions.SchemaError) as error:
        raise _invalid_schema(f"not a valid JSON Schema: {error}") from error


def _validate_protobuf(text: str) -> None:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        descriptor_pb2.FileDescriptorProto().ParseFromString(base64.b64decode(text, validate=True))
    except (binascii.Error, DecodeError, ValueError) as error:
        raise _invalid_schema(
            "the development registry accepts Protobuf schemas only as the base64 serialized FileDescriptorProto "
            f"that confluent-kafka's ProtobufSerializer sends, not .proto text ({error})"
        ) from error


def _schema_request(body: Any) -> dict[str, Any]:
    """The schema part of a register, lookup or compatibility body, with defaults filled in."""
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryError(42201, "Invalid schema: the request needs a 'schema' string")
    schema_type = (body.get("schemaType") or "AVRO").upper()
    if schema_type not in SCHEMA_TYPES:
        raise RegistryError(42201, f"Invalid schema: unknown schemaType {body.get('schemaType')!r}")
    references = body.get("references") or []
    extra = {k: body[k] for k in ("metadata", "ruleSet") if body.get(k) is not None}
    return {"schema": body["schema"], "schemaType": schema_type, "references": references, "extra": extra}


def _identity(request: dict) -> str:
    """Two requests with equal identity are the same schema (and get the same id)."""
    text = request["schema"]
    if request["schemaType"] != "PROTOBUF":
        text = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    return json.dumps([request["schemaType"], text, request["references"], request["extra"]], sort_keys=True)


# --- request handlers --------------------------------------------------------------------------------------


class _Api:
    """Routes decoded requests to handlers; each returns a JSON-able value or raises RegistryError."""

    def __init__(self) -> None:
        self.state = _State()
        self.routes = self._routes()

    def dispatch(self, request: _Request) -> Any:
        for method, pattern, handler in self.routes:
            if _matches(pattern, request.parts) and method == request.method:
                with self.state.lock:
                    return handler(request, *[p for p, want in zip(request.parts, pattern) if want == "*"])
        if any(_matches(pattern, request.parts) for _, pattern, _ in self.routes):
            raise RegistryError(405, "HTTP 405 Method Not Allowed")
        raise RegistryError(404, "HTTP 404 Not Found")

    def _routes(self) -> list[tuple[str, list[str], Callable[..., Any]]]:
        return [
            ("GET", [], lambda r: {}),
            ("GET", ["schemas", "types"], lambda r: list(SCHEMA_TYPES)),
            ("GET", ["schemas", "ids", "*"], self.get_schema),
            ("GET", ["schemas", "ids", "*", "versions"], self.get_schema_versions),
            ("GET", ["schemas", "ids", "*", "subjects"], self.get_schema_subjects),
            ("GET", ["schemas", "guids", "*"], self.get_schema_by_guid),
            ("GET", ["subjects"], self.list_subjects),
            ("POST", ["subjects", "*"], self.lookup),
            ("DELETE", ["subjects", "*"], self.delete_subject),
            ("GET", ["subjects", "*", "versions"], self.list_versions),
            ("POST", ["subjects", "*", "versions"], self.register),
            ("GET", ["subjects", "*", "versions", "*"], self.get_version),
            ("DELETE", ["subjects", "*", "versions", "*"], self.delete_version),
            ("GET", ["subjects", "*", "versions", "*", "referencedby"], self.referenced_by),
            ("GET", ["config"], lambda r: {"compatibilityLevel": self.state.compatibility}),
            ("PUT", ["config"], self.put_global_config),
            ("DELETE", ["config"], self.delete_global_config),
            ("GET", ["config", "*"], self.get_subject_config),
            ("PUT", ["config", "*"], self.put_subject_config),
            ("DELETE", ["config", "*"], self.delete_subject_config),
            ("POST", ["compatibility", "subjects", "*", "versions"], self.check_all_versions),
            ("POST", ["compatibility", "subjects", "*", "versions", "*"], self.check_version),
            ("GET", ["contexts"], lambda r: ["."]),
        ]

    # -- schemas --

    def get_schema(self, request: _Request, schema_id: str) -> dict:
        schema = self.state.schema_by_id(schema_id)
        return schema.body() | {"guid": schema.guid}

    def get_schema_by_guid(self, request: _Request, guid: str) -> dict:
        for schema in self.state.schemas_by_id.values():
            if schema.guid == guid and self.state.versions_with(schema, deleted=True):
                return schema.body() | {"id": schema.id, "guid": guid}
        raise RegistryError(40403, f"Schema {guid} not found")

    def get_schema_versions(self, request: _Request, schema_id: str) -> list[dict]:
        schema = self.state.schema_by_id(schema_id)
        pairs = self.state.versions_with(schema, request.flag("deleted"))
        return _page(request, [{"subject": s, "version": v.version} for s, v in pairs])

    def get_schema_subjects(self, request: _Request, schema_id: str) -> list[str]:
        schema = self.state.schema_by_id(schema_id)
        subjects = dict.fromkeys(s for s, _ in self.state.versions_with(schema, request.flag("deleted")))
        return _page(request, list(subjects))

    # -- subjects and versions --

    def list_subjects(self, request: _Request) -> list[str]:
        prefix = request.query.get("subjectPrefix", "")
        deleted, deleted_only = request.flag("deleted"), request.flag("deleted_only")
        names = []
        for name, subject in sorted(self.state.subjects.items()):
            has_live = bool(subject.live())
            wanted = (not has_live) if deleted_only else (has_live or deleted)
            # Subjects that only hold a config have no versions and are not listed.
            if subject.versions and wanted and name.startswith(prefix):
                names.append(name)
        return _page(request, names)

    def list_versions(self, request: _Request, subject: str) -> list[int]:
        found = self.state.subject(subject, request.flag("deleted"))
        return _page(request, [v.version for v in found.visible(request.flag("deleted"))])

    def get_version(self, request: _Request, subject: str, version: str) -> dict:
        found = self.state.version(subject, version, request.flag("deleted"))
        return _version_body(subject, found)

    def referenced_by(self, request: _Request, subject: str, version: str) -> list[int]:
        target = self.state.version(subject, version)
        ids = set()
        for name, other in self.state.subjects.items():
            for candidate in other.live():
                for reference in candidate.schema.references:
                    if reference.get("subject") == subject and reference.get("version") == target.version:
                        ids.add(candidate.schema.id)
        return sorted(ids)

    def register(self, request: _Request, subject_name: str) -> dict:
        schema_request = _schema_request(request.body)
        self.state.validate(schema_request)
        key = _identity(schema_request)
        subject = self.state.subjects.get(subject_name)
        existing = self.state.schemas_by_key.get(key)
        if subject is not None and existing is not None:
            for version in subject.live():
                if version.schema is existing:
                    return {"id": existing.id, "guid": existing.guid}
        level = self.state.level(subject_name)
        problems = self.state.incompatibilities(
            schema_request, level, self.state.versions_to_check(subject_name, level)
        )
        if problems:
            raise RegistryError(
                409,
                f"Schema being registered is incompatible with an earlier schema for subject \"{subject_name}\" "
                f"({level}), details: {problems}",
            )
        if existing is None:
            schema_id = max(self.state.schemas_by_id, default=0) + 1
            existing = _Schema(
                schema_id, str(uuid.uuid4()), schema_request["schemaType"], schema_request["schema"],
                schema_request["references"], schema_request["extra"],
            )  # fmt: skip
            self.state.schemas_by_key[key] = existing
            self.state.schemas_by_id[schema_id] = existing
        if subject is None:
            subject = self.state.subjects[subject_name] = _Subject()
        next_version = max((v.version for v in subject.versions), default=0) + 1
        subject.versions.append(_Version(next_version, existing))
        return {"id": existing.id, "guid": existing.guid}

    def lookup(self, request: _Request, subject_name: str) -> dict:
        deleted = request.flag("deleted")
        subject = self.state.subject(subject_name, deleted)
        schema_request = _schema_request(request.body)
        try:
            key = _identity(schema_request)
        except ValueError as error:
            raise _invalid_schema(str(error)) from error
        schema = self.state.schemas_by_key.get(key)
        for version in reversed(subject.visible(deleted)):
            if version.schema is schema:
                return _version_body(subject_name, version)
        raise RegistryError(40403, "Schema not found")

    def delete_subject(self, request: _Request, subject_name: str) -> list[int]:
        subject = self.state.subjects.get(subject_name)
        if subject is None or not subject.versions:
            raise _subject_not_found(subject_name)
        if request.flag("permanent"):
            if subject.live():
                raise RegistryError(
                    40405, f"Subject '{subject_name}' was not deleted first before being permanently deleted"
                )
            del self.state.subjects[subject_name]
            return [v.version for v in subject.versions]
        if not subject.live():
            raise RegistryError(
                40404, f"Subject '{subject_name}' was soft deleted. Set permanent=true to delete permanently"
            )
        deleted = [v.version for v in subject.live()]
        for version in subject.versions:
            version.deleted = True
        return deleted

    def delete_version(self, request: _Request, subject_name: str, version: str) -> int:
        target = self.state.version(subject_name, version, deleted=True)
        subject = self.state.subjects[subject_name]
        if request.flag("permanent"):
            if not target.deleted:
                raise RegistryError(
                    40407,
                    f"Subject '{subject_name}' Version {target.version} was not deleted first before being "
                    "permanently deleted",
                )
            subject.versions.remove(target)
            if not subject.versions:
                del self.state.subjects[subject_name]
        elif target.deleted:
            raise RegistryError(
                40406,
                f"Subject '{subject_name}' Version {target.version} was soft deleted. "
                "Set permanent=true to delete permanently",
            )
        else:
            target.deleted = True
        return target.version

    # -- config --

    def put_global_config(self, request: _Request) -> dict:
        self.state.compatibility = _level_from(request.body)
        return {"compatibility": self.state.compatibility}

    def delete_global_config(self, request: _Request) -> dict:
        previous, self.state.compatibility = self.state.compatibility, DEFAULT_COMPATIBILITY
        return {"compatibilityLevel": previous}

    def get_subject_config(self, request: _Request, subject_name: str) -> dict:
        subject = self.state.subjects.get(subject_name)
        if subject is not None and subject.compatibility is not None:
            return {"compatibilityLevel": subject.compatibility}
        if request.flag("defaultToGlobal"):
            return {"compatibilityLevel": self.state.compatibility}
        raise RegistryError(
            40408, f"Subject '{subject_name}' does not have subject-level compatibility configured"
        )

    def put_subject_config(self, request: _Request, subject_name: str) -> dict:
        level = _level_from(request.body)
        self.state.subjects.setdefault(subject_name, _Subject()).compatibility = level
        return {"compatibility": level}

    def delete_subject_config(self, request: _Request, subject_name: str) -> dict:
        subject = self.state.subjects.get(subject_name)
        if subject is None:
            raise _subject_not_found(subject_name)
        previous, subject.compatibility = subject.compatibility or self.state.compatibility, None
        if not subject.versions:
            del self.state.subjects[subject_name]
        return {"compatibilityLevel": previous}

    # -- compatibility --

    def check_version(self, request: _Request, subject_name: str, version: str) -> dict:
        target = self.state.version(subject_name, version)
        return self._check(request, subject_name, [target])

    def check_all_versions(self, request: _Request, subject_name: str) -> dict:
        level = self.state.level(subject_name)
        return self._check(request, subject_name, self.state.versions_to_check(subject_name, level))

    def _check(self, request: _Request, subject_name: str, against: list[_Version]) -> dict:
        schema_request = _schema_request(request.body)
        self.state.validate(schema_request)
        problems = self.state.incompatibilities(schema_request, self.state.level(subject_name), against)
        result: dict[str, Any] = {"is_compatible": not problems}
        if request.flag("verbose"):
            messages = list(problems)
            if schema_request["schemaType"] != "AVRO" and not problems:
                messages.append("the development registry does not check JSON or PROTOBUF compatibility")
            result["messages"] = messages
        return result


def _level_from(body: Any) -> str:
    level = (body.get("compatibility") or body.get("compatibilityLevel")) if isinstance(body, dict) else None
    if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
        raise RegistryError(42203, f"Invalid compatibility level. Valid values are {list(COMPATIBILITY_LEVELS)}")
    return level.upper()


def _version_body(subject: str, version: _Version) -> dict:
    return {
        "subject": subject, "version": version.version, "id": version.schema.id, "guid": version.schema.guid,
    } | version.schema.body()  # fmt: skip


def _matches(pattern: list[str], parts: list[str]) -> bool:
    return len(pattern) == len(parts) and all(want in ("*", got) for want, got in zip(pattern, parts))


def _page(request: _Request, items: list) -> list:
    offset = max(0, int(request.query.get("offset", "0")))
    limit = int(request.query.get("limit", "-1"))
    return items[offset:] if limit < 0 else items[offset : offset + limit]


# --- HTTP server ----------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no idle keep-alive connection outlives stop().
    server: _Server

    def _handle(self) -> None:
        split = urlsplit(self.path)
        # Split before decoding: subjects may contain an encoded "/".
        parts = [unquote(p) for p in split.path.strip("/").split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            try:
                body = json.loads(raw) if raw else None
            except ValueError as error:
                raise RegistryError(400, f"Unparseable request body: {error}") from error
            status, payload = 200, self.server.api.dispatch(_Request(self.command, parts, query, body))
        except RegistryError as error:
            status, payload = error.status, {"error_code": error.error_code, "message": error.message}
        except Exception as error:  # a bug here must still answer in the API's error format
            status = 500
            payload = {"error_code": 50001, "message": f"Error in the development registry: {error!r}"}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests and the demo print their own progress


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # many Spark tasks may fetch schemas at once

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.api = _Api()


class DevSchemaRegistry:
    """A development Schema Registry (not for production) on a loopback port, served from a background thread.

    Use as a context manager, or call `start()` and `stop()`. `port=None` picks a free port.
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the development schema registry has not been started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> DevSchemaRegistry:
        if self._server is not None:
            raise RuntimeError(f"the development schema registry is already running at {self.url}")
        self._server = _Server((self.host, self.port or 0))
        self.port = self._server.server_address[1]
        # A short poll interval makes stop() quick: shutdown() waits for the serving loop's next poll.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="dev-schema-registry", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        assert thread is not None
        thread.join()

    def __enter__(self) -> DevSchemaRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m icefloe.local.dev_registry",
        description="In-memory development Schema Registry (Confluent REST API subset). Not for production.",
    )
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    args = parser.parse_args(argv)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        registry = DevSchemaRegistry(args.port or None, args.host).start()
    except OSError as error:
        print(f"cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    print("development schema registry: in memory, not for production", file=sys.stderr, flush=True)
    print(registry.url, flush=True)
    stopping.wait()
    registry.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
