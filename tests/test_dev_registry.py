"""The development Schema Registry, exercised through confluent-kafka's own client, serializers and deserializers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from icefloe.local.dev_registry import CONTENT_TYPE, DevSchemaRegistry

USER_V1 = {"type": "record", "name": "User", "namespace": "demo", "fields": [{"name": "id", "type": "long"}]}
USER_V2 = {
    "type": "record", "name": "User", "namespace": "demo",
    "fields": [{"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None}],
}  # fmt: skip
USER_NEEDS_AGE = {
    "type": "record", "name": "User", "namespace": "demo",
    "fields": [{"name": "id", "type": "long"}, {"name": "age", "type": "int"}],
}  # fmt: skip


@pytest.fixture
def registry():
    """A fresh registry per test (this overrides the shared session fixture), so ids start at 1."""
    with DevSchemaRegistry() as running:
        yield running


@pytest.fixture
def client(registry) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url})


def avro(schema: dict) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def http(method: str, url: str, body: dict | None = None) -> tuple[int, str, object]:
    """(status, content type, decoded JSON) of one raw request."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": CONTENT_TYPE})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, response.headers["Content-Type"], json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], json.loads(error.read())


def test_avro_round_trip_and_evolution(registry, client):
    ctx = SerializationContext("users", MessageField.VALUE)
    first = AvroSerializer(client, json.dumps(USER_V1))({"id": 7}, ctx)
    second = AvroSerializer(client, json.dumps(USER_V2))({"id": 8, "email": "a@b.c"}, ctx)
    # Confluent framing: magic byte 0, then the 4-byte schema id.
    assert first[:5] == b"\x00\x00\x00\x00\x01"
    assert second[:5] == b"\x00\x00\x00\x00\x02"

    # A deserializer with its own client (no shared cache) fetches both writer schemas from the server.
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))
    assert deserialize(first, ctx) == {"id": 7}
    assert deserialize(second, ctx) == {"id": 8, "email": "a@b.c"}
    # Reading old data with the new schema fills the default.
    as_v2 = AvroDeserializer(SchemaRegistryClient({"url": registry.url}), json.dumps(USER_V2))
    assert as_v2(first, ctx) == {"id": 7, "email": None}

    fresh = SchemaRegistryClient({"url": registry.url})
    assert fresh.get_subjects() == ["users-value"]
    assert fresh.get_versions("users-value") == [1, 2]
    latest = fresh.get_latest_version("users-value")
    assert (latest.version, latest.schema_id) == (2, 2)
    assert json.loads(latest.schema.schema_str) == USER_V2
    assert fresh.get_version("users-value", 1).schema_id == 1
    assert [(v.subject, v.version) for v in fresh.get_schema_versions(1)] == [("users-value", 1)]


def test_same_schema_keeps_its_id_within_and_across_subjects(registry, client):
    assert client.register_schema("a-value", avro(USER_V1)) == 1
    # Different whitespace and key order is the same schema.
    reordered = Schema(json.dumps(dict(reversed(list(USER_V1.items()))), indent=2), "AVRO")
    assert SchemaRegistryClient({"url": registry.url}).register_schema("a-value", reordered) == 1
    assert client.register_schema("b-value", avro(USER_V1)) == 1
    assert client.get_versions("a-value") == [1]
    assert client.register_schema("a-value", avro(USER_V2)) == 2
    assert client.get_subjects_by_schema_id(1) == ["a-value", "b-value"]


def test_lookup_schema_under_subject(client):
    client.register_schema("users-value", avro(USER_V1))
    client.register_schema("users-value", avro(USER_V2))
    found = client.lookup_schema("users-value", avro(USER_V1))
    assert (found.subject, found.version, found.schema_id) == ("users-value", 1, 1)

    with pytest.raises(SchemaRegistryError) as missing_schema:
        client.lookup_schema("users-value", avro(USER_NEEDS_AGE))
    assert (missing_schema.value.http_status_code, missing_schema.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as missing_subject:
        client.lookup_schema("nobody-value", avro(USER_V1))
    assert (missing_subject.value.http_status_code, missing_subject.value.error_code) == (404, 40401)


def test_unknown_ids_and_versions(registry, client):
    ctx = SerializationContext("users", MessageField.VALUE)
    with pytest.raises(SchemaRegistryError) as unknown_id:
        AvroDeserializer(client)(b"\x00\x00\x00\x00\x63\x02", ctx)  # schema id 99
    assert (unknown_id.value.http_status_code, unknown_id.value.error_code) == (404, 40403)

    client.register_schema("users-value", avro(USER_V1))
    with pytest.raises(SchemaRegistryError) as unknown_version:
        client.get_version("users-value", 5)
    assert unknown_version.value.error_code == 40402
    with pytest.raises(SchemaRegistryError) as unknown_subject:
        client.get_latest_version("nobody-value")
    assert unknown_subject.value.error_code == 40401


def test_invalid_schema_is_rejected(client):
    for bad in ['{"type": "record", "name": "X", "fields": [{"name": "a", "type": "Nope"}]}', "{not json"]:
        with pytest.raises(SchemaRegistryError) as invalid:
            client.register_schema("bad-value", Schema(bad, "AVRO"))
        assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42201)
        assert invalid.value.error_message.startswith("Invalid schema")
    assert client.get_subjects() == []


def test_incompatible_schema_is_refused_unless_compatibility_allows(client):
    client.register_schema("users-value", avro(USER_V1))
    assert client.test_compatibility("users-value", avro(USER_V2)) is True
    assert client.test_compatibility("users-value", avro(USER_NEEDS_AGE)) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("users-value", avro(USER_NEEDS_AGE))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    assert "age" in refused.value.error_message

    # FORWARD: old readers must read new data, so adding a required field is fine but dropping one is not.
    client.set_compatibility("users-value", "FORWARD")
    assert client.get_compatibility("users-value") == "FORWARD"
    assert client.register_schema("users-value", avro(USER_NEEDS_AGE)) == 2
    assert client.test_compatibility("users-value", avro(USER_V1)) is False

    client.set_compatibility("users-value", "NONE")
    assert client.test_compatibility("users-value", Schema('{"type": "string"}', "AVRO")) is True
    assert client.get_compatibility() == "BACKWARD"  # the global level is unchanged


def test_avro_promotions_enums_and_transitive_checks(client):
    def record(field_type, default=None) -> Schema:
        field = {"name": "f", "type": field_type} | ({"default": default} if default is not None else {})
        return avro({"type": "record", "name": "R", "fields": [field]})

    client.register_schema("p-value", record("int"))
    assert client.test_compatibility("p-value", record("long")) is True  # int promotes to long
    assert client.test_compatibility("p-value", record("string")) is False
    assert client.test_compatibility("p-value", record(["null", "int"])) is True

    enum = {"type": "enum", "name": "Side", "symbols": ["BUY", "SELL"]}
    client.register_schema("e-value", record(enum))
    assert client.test_compatibility("e-value", record(enum | {"symbols": ["BUY"]})) is False
    with_default = enum | {"symbols": ["BUY", "OTHER"], "default": "OTHER"}
    assert client.test_compatibility("e-value", record(with_default)) is True

    # BACKWARD checks only the latest version; BACKWARD_TRANSITIVE checks them all.
    client.register_schema("t-value", avro(USER_NEEDS_AGE))
    client.register_schema("t-value", avro(USER_V1))  # dropping a field is backward compatible
    id_field = {"name": "id", "type": "long"}
    with_age_as_string = USER_V1 | {"fields": [id_field, {"name": "age", "type": "string", "default": ""}]}
    with_age_default = USER_V1 | {"fields": [id_field, {"name": "age", "type": "int", "default": 0}]}
    assert client.test_compatibility_all_versions("t-value", avro(with_age_as_string)) is True
    client.set_compatibility("t-value", "BACKWARD_TRANSITIVE")
    assert client.test_compatibility_all_versions("t-value", avro(with_age_as_string)) is False
    assert client.test_compatibility_all_versions("t-value", avro(with_age_default)) is True


def test_references_resolve_named_types(registry, client):
    address = {
        "type": "record", "name": "Address", "namespace": "demo", "fields": [{"name": "city", "type": "string"}],
    }  # fmt: skip
    client.register_schema("address", avro(address))
    person = {
        "type": "record", "name": "Person", "namespace": "demo", "fields": [{"name": "home", "type": "demo.Address"}],
    }  # fmt: skip
    with pytest.raises(SchemaRegistryError) as unresolved:
        client.register_schema("person-value", avro(person))
    assert unresolved.value.error_code == 42201

    reference = SchemaReference("demo.Address", "address", 1)
    schema = Schema(json.dumps(person), "AVRO", [reference])
    assert client.register_schema("person-value", schema) == 2
    ctx = SerializationContext("person", MessageField.VALUE)
    serializer = AvroSerializer(client, schema, conf={"auto.register.schemas": False, "use.latest.version": True})
    data = serializer({"home": {"city": "Oslo"}}, ctx)
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))
    assert deserialize(data, ctx) == {"home": {"city": "Oslo"}}
    assert client.get_referenced_by("address", 1) == [2]


def test_soft_and_permanent_delete(registry, client):
    client.register_schema("users-value", avro(USER_V1))
    client.register_schema("users-value", avro(USER_V2))
    assert client.delete_version("users-value", 1) == 1
    assert client.get_versions("users-value") == [2]
    assert client.get_schema(1).schema_str is not None  # soft-deleted schemas stay readable by id

    assert client.delete_subject("users-value") == [2]
    assert client.get_subjects() == []
    assert client.get_subjects(deleted=True) == ["users-value"]
    with pytest.raises(SchemaRegistryError) as gone:
        client.get_latest_version("users-value")
    assert gone.value.error_code == 40401

    assert client.delete_subject("users-value", permanent=True) == [1, 2]
    with pytest.raises(SchemaRegistryError) as erased:
        SchemaRegistryClient({"url": registry.url}).get_schema(1)
    assert erased.value.error_code == 40403
    # Registering again starts a new subject, and the identical schema keeps its id.
    assert client.register_schema("users-value", avro(USER_V2)) == 2
    assert client.get_versions("users-value") == [1]


def test_json_schema_round_trip(registry, client):
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
        "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}, "required": ["id"],
    }  # fmt: skip
    ctx = SerializationContext("orders", MessageField.VALUE)
    data = JSONSerializer(json.dumps(schema), client)({"id": 5, "note": "hi"}, ctx)
    assert data[:5] == b"\x00\x00\x00\x00\x01"
    deserializer = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": registry.url}))
    assert deserializer(data, ctx) == {"id": 5, "note": "hi"}
    assert client.get_latest_version("orders-value").schema.schema_type == "JSON"

    with pytest.raises(SchemaRegistryError) as invalid:
        client.register_schema("orders-value", Schema('{"type": 12}', "JSON"))
    assert invalid.value.error_code == 42201


def test_protobuf_round_trip(registry, client):
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="devtest/trade.proto", package="devtest", syntax="proto3")
    message = file.message_type.add(name="Trade")
    message.field.add(name="symbol", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    message.field.add(name="qty", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    trade = message_factory.GetMessageClass(pool.FindMessageTypeByName("devtest.Trade"))

    ctx = SerializationContext("trades", MessageField.VALUE)
    conf = {"use.deprecated.format": False}
    data = ProtobufSerializer(trade, client, conf)(trade(symbol="ABC", qty=7), ctx)
    decoded = ProtobufDeserializer(trade, conf, SchemaRegistryClient({"url": registry.url}))(data, ctx)
    assert (decoded.symbol, decoded.qty) == ("ABC", 7)

    with pytest.raises(SchemaRegistryError) as proto_text:
        client.register_schema("trades-value", Schema('syntax = "proto3"; message T {}', "PROTOBUF"))
    assert proto_text.value.error_code == 42201


def test_config_endpoints(client):
    assert client.get_compatibility() == "BACKWARD"
    with pytest.raises(SchemaRegistryError) as no_subject_level:
        client.get_compatibility("users-value")
    assert no_subject_level.value.error_code == 40408
    assert client.set_compatibility(level="FULL") == {"compatibility": "FULL"}
    assert client.get_compatibility() == "FULL"
    with pytest.raises(SchemaRegistryError) as invalid_level:
        client.set_compatibility(level="SOMETIMES")
    assert (invalid_level.value.http_status_code, invalid_level.value.error_code) == (422, 42203)


def test_http_shape_of_errors_and_unknown_paths(registry):
    status, content_type, body = http("GET", f"{registry.url}/associations/resources/-/orders?resourceType=topic")
    assert (status, content_type, body) == (404, CONTENT_TYPE, {"error_code": 404, "message": "HTTP 404 Not Found"})
    assert http("GET", f"{registry.url}/no/such/path")[0] == 404
    unknown_id = {"error_code": 40403, "message": "Schema 1 not found"}
    assert http("GET", f"{registry.url}/schemas/ids/1") == (404, CONTENT_TYPE, unknown_id)
    assert http("DELETE", f"{registry.url}/schemas/types")[2]["error_code"] == 405
    assert http("GET", f"{registry.url}/subjects/x/versions/zero")[:2] == (422, CONTENT_TYPE)
    status, _, body = http("POST", f"{registry.url}/subjects/a%2Fb-value/versions", {"schema": '"string"'})
    assert (status, body) == (200, {"id": 1, "guid": body["guid"]})
    assert http("GET", f"{registry.url}/subjects")[2] == ["a/b-value"]  # an encoded "/" stays inside the subject


def test_stop_closes_the_port(registry):
    url = registry.url
    assert http("GET", f"{url}/subjects")[:1] == (200,)
    registry.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/subjects", timeout=2)


def test_runs_as_its_own_process():
    process = subprocess.Popen(
        [sys.executable, "-m", "icefloe.local.dev_registry", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert SchemaRegistryClient({"url": url}).register_schema("p-value", avro(USER_V1)) == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
        assert "not for production" in process.stderr.read()
    finally:
        process.kill()
        process.wait()
