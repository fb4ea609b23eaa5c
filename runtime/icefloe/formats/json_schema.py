"""JSON Schema values through a schema registry: schemas to table types, records validated and shaped.

Two framings carry them: a Confluent-compatible registry's (`JsonSchemaDecoder`, schema ids, references resolved
through the registry) and the AWS Glue Schema Registry's (`glue_payload_decoder` and `glue_value_fields`, called by
glue_registry for versions whose DataFormat is JSON; Glue's JSON schemas have no registry references).

Mapping (the table's columns are the top-level object's `properties`):
  string -> string (`format: date-time` -> timestamp with zone, `date` -> date, `uuid` -> string), integer -> long,
  number -> double, boolean -> boolean, object with `properties` -> struct, object with only an
  `additionalProperties` schema -> map<string, T>, array with `items` -> list, a string `enum` -> string;
  `type: [T, "null"]` and `oneOf`/`anyOf` of `{"type": "null"}` and one schema -> nullable T; `$ref` to `$defs`,
  `definitions` or a registry reference (by its name) -> the schema it names. Anything else (several non-null
  types, free-form objects and arrays, `{}`) -> the value as a JSON string. An object whose `additionalProperties`
  is given and not false gets a string column `additional_properties` holding the properties it does not declare,
  as a JSON object (null when there are none). Every column is nullable; `required` is enforced by validation.

Each record is validated against its writer's schema (the version it was written with, not the table's). A
record that fails is a bad record; the error names the rule and where it failed, never the value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from icefloe.errors import BadRecord, ConfigError
from icefloe.formats import decoding, glue_framed, json_schema_jvm
from icefloe.formats.base import CONFLUENT, GLUE, Decoder, DecoderSpec, ValueRules
from icefloe.formats.json import parse_json
from icefloe.formats.json_jvm import JsonJvmCodec
from icefloe.formats.json_schema_quick import quick_check
from icefloe.registries import confluent
from icefloe.spec import SourceCluster, TableSpec

EXTRA_COLUMN = "additional_properties"
_STRING_FORMATS = {"date-time": T.TimestampType(), "date": T.DateType()}
_PRIMITIVES = {"integer": T.LongType(), "number": T.DoubleType(), "boolean": T.BooleanType(), "string": T.StringType()}


def resolve_schema(client, schema) -> str:
    """A registered JSON schema and its references (recursively), as one JSON document: {"schema", "references"}."""
    references: dict[str, Any] = {}

    def collect(refs) -> None:
        for ref in refs or []:
            if ref.name in references:
                continue
            registered = client.get_version(ref.subject, ref.version)
            references[ref.name] = _parse(registered.schema.schema_str, f"reference {ref.name!r}")
            collect(registered.schema.references)

    collect(schema.references)
    return json.dumps({"schema": _parse(schema.schema_str, "schema"), "references": references})


def _parse(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"JSON Schema {what} is not valid JSON: {error}") from None


# --- schemas to a shape: the table type, and how a value becomes a row value --------------------------------------
# A shape is ("scalar", type) | ("json",) | ("list", shape) | ("map", shape) | ("struct", [(name, shape)], extra).


class _Shapes:
    def __init__(self, bundle: dict):
        self.main, self.references = bundle["schema"], bundle["references"]

    def resolve(self, node: Any, document: Any, path: str, seen: tuple[str, ...]) -> tuple[Any, Any]:
        """Follow `$ref`s: (the schema they name, the document it lives in)."""
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if ref in seen:
                raise ConfigError(f"{path}: recursive $ref {ref!r} cannot be a table column")
            seen = (*seen, ref)
            name, _, pointer = ref.partition("#")
            if name:
                if name not in self.references:
                    raise ConfigError(f"{path}: $ref {ref!r} is neither local nor a registry reference of the schema")
                document = self.references[name]
            node = document
            for part in [p for p in pointer.split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(node, dict) or part not in node:
                    raise ConfigError(f"{path}: $ref {ref!r} names nothing in its schema")
                node = node[part]
        return node, document

    def shape(self, node: Any, document: Any, path: str, seen: tuple[str, ...] = ()) -> tuple:
        node, document = self.resolve(node, document, path, seen)
        if not isinstance(node, dict):
            return ("json",)
        for combinator in ("oneOf", "anyOf"):
            if combinator in node:
                branches = [b for b in node[combinator] if self.resolve(b, document, path, seen)[0] != {"type": "null"}]
                if len(branches) == 1:
                    return self.shape(branches[0], document, path, seen)
                return ("json",)
        kind = node.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"]
            kind = kinds[0] if len(kinds) == 1 else None
        if kind is None and "enum" in node and all(isinstance(v, str) for v in node["enum"]):
            kind = "string"
        if kind is None and "properties" in node:
            kind = "object"
        if kind == "string":
            return ("scalar", _STRING_FORMATS.get(node.get("format"), T.StringType()))  # type: ignore[arg-type]  # no format (None) finds none
        if kind in _PRIMITIVES:
            return ("scalar", _PRIMITIVES[kind])
        if kind == "array" and isinstance(node.get("items"), dict):
            return ("list", self.shape(node["items"], document, f"{path}[]", seen))
        if kind == "object":
            extra = node.get("additionalProperties")
            if "properties" in node:
                fields = [
                    (name, self.shape(sub, document, f"{path}.{name}", seen))
                    for name, sub in node["properties"].items()
                ]
                keep_extra = "additionalProperties" in node and extra is not False
                if keep_extra and EXTRA_COLUMN in node["properties"]:
                    raise ConfigError(
                        f"{path}: property {EXTRA_COLUMN!r} clashes with the column for additional properties"
                    )
                if not fields and not keep_extra:
                    return ("json",)
                return ("struct", fields, keep_extra)
            if isinstance(extra, dict):
                return ("map", self.shape(extra, document, f"{path}{{}}", seen))
        return ("json",)


def _spark_type(shape: tuple) -> T.DataType:
    kind = shape[0]
    if kind == "scalar":
        return shape[1]
    if kind == "list":
        return T.ArrayType(_spark_type(shape[1]), True)
    if kind == "map":
        return T.MapType(T.StringType(), _spark_type(shape[1]), True)
    if kind == "struct":
        fields = [T.StructField(name, _spark_type(sub), True) for name, sub in shape[1]]
        if shape[2]:
            fields.append(T.StructField(EXTRA_COLUMN, T.StringType(), True))
        return T.StructType(fields)
    return T.StringType()


def _table_shape(bundle_json: str, subject: str) -> tuple:
    bundle = json.loads(bundle_json)
    shape = _Shapes(bundle).shape(bundle["schema"], bundle["schema"], subject)
    if shape[0] != "struct":
        raise ConfigError(f"{subject}: the value schema must be an object with properties")
    return shape


def value_fields(bundle_json: str, subject: str) -> list[T.StructField]:
    """The table columns for a resolved JSON schema (`resolve_schema`)."""
    return list(_spark_type(_table_shape(bundle_json, subject)).fields)  # type: ignore[attr-defined]  # a table's shape is an object: a StructType


def _json_text_path(shape: tuple, path: str) -> str | None:
    """The first value of `shape` kept as its JSON text (a free-form schema), or None."""
    kind = shape[0]
    if kind == "json":
        return path
    if kind in ("list", "map"):
        return _json_text_path(shape[1], f"{path}[]" if kind == "list" else f"{path}{{}}")
    if kind == "struct":
        return next((found for name, sub in shape[1] if (found := _json_text_path(sub, f"{path}.{name}"))), None)
    return None


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def shaper(shape: tuple) -> Callable[[Any], Any]:
    """How a validated JSON value becomes the row value of its shape (types are checked by the table's converter);
    compiled once per table, as it runs for every record."""
    kind = shape[0]
    if kind == "scalar":
        return _same
    if kind == "json":
        return lambda value: None if value is None else _json_text(value)
    if kind == "list":
        element = shaper(shape[1])
        if element is _same:
            return _same
        return lambda value: [element(v) for v in value] if isinstance(value, list) else value
    if kind == "map":
        item = shaper(shape[1])
        if item is _same:
            return _same
        return lambda value: {k: item(v) for k, v in value.items()} if isinstance(value, dict) else value
    fields = [(name, shaper(sub)) for name, sub in shape[1]]
    names = [name for name, _ in fields]
    nested = [(name, field) for name, field in fields if field is not _same]
    declared = frozenset(names)
    keep_extra = shape[2]

    def struct(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {name: value.get(name) for name in names}
        for name, field in nested:
            out[name] = field(out[name])
        if keep_extra:
            extra = {k: v for k, v in value.items() if k not in declared}
            out[EXTRA_COLUMN] = _json_text(extra) if extra else None
        return out

    return struct


def _same(value: Any) -> Any:
    return value


# --- records -------------------------------------------------------------------------------------------------------


def failed_rule(error) -> str:
    """A validation error as the rule that failed and where, without the value (records may hold personal data)."""
    where = "value" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    rule = error.validator
    if rule == "required":
        missing = [
            name for name in error.validator_value if isinstance(error.instance, dict) and name not in error.instance
        ]
        return f"{where}: required property {missing[0] if missing else error.validator_value!r} is missing"
    if rule in ("additionalProperties", "unevaluatedProperties") and error.validator_value is False:
        return f"{where}: additional properties are not allowed ({rule}: false)"
    expected = json.dumps(error.validator_value)
    return f"{where}: fails {rule} {expected[:120]}"


class JsonSchemaDecoder:
    """Decodes framed JSON values: validated against the writer's schema (by id), shaped for the table (values).

    Registry errors are the client's own (the caller classifies them); a bad record raises ValueError."""

    def __init__(self, client, table_bundle: str | None):
        self.client = client
        self.shape = shaper(_table_shape(table_bundle, "value")) if table_bundle else _same  # keys: kept as they are
        self._validators: dict[int, Any] = {}

    def __call__(self, data: bytes) -> dict[str, Any]:
        if len(data) < 5 or data[0] != 0:
            raise BadRecord("not Confluent wire format (magic byte 0 and a schema id expected)")
        schema_id = int.from_bytes(data[1:5], "big")
        value = _checked(data[5:], self._validator(schema_id), f"schema id {schema_id}", 5)
        return self.shape(value)

    def _validator(self, schema_id: int):
        if schema_id not in self._validators:
            schema = self.client.get_schema(schema_id)
            bundle = json.loads(resolve_schema(self.client, schema))
            self._validators[schema_id] = record_validator(bundle, f"schema id {schema_id}")
        return self._validators[schema_id]


class RecordValidator:
    """A writer schema's validator: the quick check (`json_schema_quick`) accepts most records, jsonschema decides
    and words the failure for the rest."""

    def __init__(self, validator, quick: Callable[[Any], bool] | None):
        self.validator, self.quick = validator, quick

    def first_failure(self, value: Any):
        """The failure of the first path (jsonschema's error), or None for a valid value."""
        if self.quick is not None and self.quick(value):
            return None
        return next(iter(sorted(self.validator.iter_errors(value), key=lambda e: list(e.absolute_path))), None)


def _checked(payload: bytes, validator: RecordValidator, writer: str, offset: int) -> dict[str, Any]:
    """A JSON payload parsed and validated against its writer's schema; `offset` is where it starts in the value."""
    value = parse_json(payload, offset)
    failure = validator.first_failure(value)
    if failure is not None:
        raise BadRecord(f"JSON Schema ({writer}) {failed_rule(failure)}")
    if not isinstance(value, dict):
        raise BadRecord(f"JSON value must be an object, got {type(value).__name__}")
    return value


# --- the AWS Glue Schema Registry (glue_registry calls these for versions whose DataFormat is JSON) ---------------


def _glue_bundle(definition: str, what: str) -> dict:
    """A Glue JSON schema definition as a resolved bundle (Glue has no registry references)."""
    return {"schema": _parse(definition, what), "references": {}}


def glue_value_fields(definition: str, subject: str) -> list[T.StructField]:
    try:
        bundle = _glue_bundle(definition, "definition")
    except ValueError as error:
        raise ConfigError(f"{subject}: {error}") from None
    return value_fields(json.dumps(bundle), subject)


def glue_payload_decoder(writer: str, table: str | None) -> Callable[[bytes], dict[str, Any]]:
    """A Glue JSON payload validated against its writer's version, shaped for the table's (latest) version (no
    table version: a key, kept as it is)."""
    validator = record_validator(_glue_bundle(writer, "writer version"), "the Glue writer version")
    if table is None:
        return lambda payload: _checked(payload, validator, "Glue writer version", 0)
    shape = shaper(_table_shape(json.dumps(_glue_bundle(table, "table version")), "value"))
    return lambda payload: shape(_checked(payload, validator, "Glue writer version", 0))


def validator_for_bundle(bundle: dict, what: str = "the schema"):
    """A jsonschema validator for a resolved schema, its registry references reachable by name."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    main = bundle["schema"]
    resources = [
        (name, Resource.from_contents(doc, default_specification=DRAFT7)) for name, doc in bundle["references"].items()
    ]
    cls = jsonschema.validators.validator_for(main, default=jsonschema.Draft7Validator)
    try:
        cls.check_schema(main)
    except jsonschema.SchemaError as error:
        raise ValueError(f"{what} is not a valid JSON Schema: {error.message[:200]}") from None
    # Every format jsonschema knows, whatever the draft: draft 7's own checker does not know `uuid`.
    return cls(main, registry=Registry().with_resources(resources), format_checker=jsonschema.FormatChecker())


def record_validator(bundle: dict, what: str = "the schema") -> RecordValidator:
    """`validator_for_bundle`'s validator with the quick check of its schema (none where the schema's keywords are
    not all covered, or it has registry references: those are reached by `$ref`, which the check does not cover)."""
    validator = validator_for_bundle(bundle, what)
    return RecordValidator(validator, quick_check(bundle["schema"], type(validator), validator.format_checker))


class JsonSchemaFormat:
    """`format: json-schema`: through a Confluent-compatible registry (the subject's latest version, references
    resolved) or the AWS Glue Schema Registry; each record validated against its writer's schema, on the JVM path
    where `json_schema_jvm` covers the schema and the record's writer is the table's schema, else in Python."""

    name = "json-schema"

    def resolve(self, table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
        if decoding.uses_glue(cluster):
            return decoding.glue_spec(table, cluster, keys)

        def build(client, latest, registry: dict[str, str]) -> DecoderSpec:
            schema = resolve_schema(client, latest.schema)
            return DecoderSpec(self.name, CONFLUENT, table.topic, schema, registry, schema_id=latest.schema_id, **keys)

        return decoding.registry_spec(table, cluster, keys, "JSON", build)

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[T.StructField] | None:
        if spec.schema_from == GLUE:
            return glue_value_fields(spec.schema, f"{identifier} (Glue schema {spec.registry['schema']})")
        return value_fields(spec.schema, f"{identifier} (subject {table.topic}-value)")

    def for_batch(self, spark, spec, batch):
        raise NotImplementedError

    def registry_schema(self, spec: DecoderSpec) -> bool:
        return True

    def rules(self, spec: DecoderSpec, table: TableSpec) -> ValueRules:
        return ValueRules(strict=True, framed=spec.schema_from == CONFLUENT)

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> JsonJvmCodec | str:
        if spec.schema_from == GLUE:
            return "JSON Schema values from the AWS Glue Schema Registry are validated in Python"
        shape = _table_shape(spec.schema, f"subject {spec.topic}-value")
        as_text = _json_text_path(shape, "value")
        if as_text:  # Python writes the value's JSON text; the JVM reads a string's text
            return f"JSON Schema values are validated in Python: {as_text} is kept as its JSON text"
        return json_schema_jvm.codec_for(spec, cast(T.StructType, _spark_type(shape)))  # a table shape is a struct

    def decoder(self, spec: DecoderSpec) -> Decoder:
        if spec.schema_from == GLUE:
            return glue_framed.decoder(spec.registry, _glue_payload, spec.schema, spec.message_type)
        return decoding.registry_checked(spec, JsonSchemaDecoder(confluent.registry_client(spec.registry), spec.schema))

    def key_decoder(self, spec: DecoderSpec) -> Decoder:
        if spec.key_conf is not None:
            return glue_framed.decoder(spec.key_conf, _glue_payload)
        decoding.needs_registry(spec)
        return decoding.registry_checked(spec, JsonSchemaDecoder(confluent.registry_client(spec.registry), None))


def _glue_payload(writer: str, table: str | None, message_type: str | None) -> Decoder:
    return glue_payload_decoder(writer, table)


JSON_SCHEMA = JsonSchemaFormat()
