"""The runtime against a real schema registry (Apicurio, Confluent API, BACKWARD compatibility): refused
evolutions and unknown schema ids get clear errors that name the subject, the id and the record's position."""

from __future__ import annotations

import json
import struct

import pytest

from icefloe.errors import RecordError
from icefloe.materialize.batch import materialize_once
from icefloe_dev.producer import SchemaRefused, produce_avro
from support import produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
V1 = {
    "type": "record",
    "name": "Account",
    "fields": [{"name": "id", "type": "long"}, {"name": "owner", "type": "string"}],
}


def test_incompatible_version_is_refused_and_the_table_keeps_going(
    spark, broker, registry, state_dir, topic, make_config
):
    broker.create_topic(topic, 1)
    produce_avro(broker.bootstrap_servers, registry.url, topic, json.dumps(V1), [(None, {"id": 1, "owner": "a"})])
    config = make_config({"topic": topic})
    materialize_once(spark, config, config.tables[0])

    # A new required field without a default cannot read old records: BACKWARD refuses it, as Confluent's would.
    breaking = {**V1, "fields": [*V1["fields"], {"name": "balance", "type": "long"}]}
    with pytest.raises(
        SchemaRefused, match=rf"refused the schema for subject '{topic}-value' \(HTTP 409, incompatible"
    ):
        produce_avro(
            broker.bootstrap_servers,
            registry.url,
            topic,
            json.dumps(breaking),
            [(None, {"id": 2, "owner": "b", "balance": 5})],
        )

    compatible = {**V1, "fields": [*V1["fields"], {"name": "balance", "type": ["null", "long"], "default": None}]}
    produce_avro(
        broker.bootstrap_servers,
        registry.url,
        topic,
        json.dumps(compatible),
        [(None, {"id": 3, "owner": "c", "balance": 7})],
    )
    result = materialize_once(spark, config, config.tables[0])
    rows = sorted(read_pyiceberg(state_dir, result.identifier), key=lambda r: r["id"])
    assert [(r["id"], r["owner"], r["balance"]) for r in rows] == [(1, "a", None), (3, "c", 7)]


def test_unknown_schema_id_names_the_id_and_the_record(spark, broker, registry, state_dir, topic, make_config):
    broker.create_topic(topic, 1)
    produce_avro(broker.bootstrap_servers, registry.url, topic, json.dumps(V1), [(None, {"id": 1, "owner": "a"})])
    produce(
        broker.bootstrap_servers, topic, [{"value": b"\x00" + struct.pack(">I", 987654) + b"\x02\x02a", "partition": 0}]
    )
    config = make_config({"topic": topic})
    with pytest.raises(
        RecordError, match=r"partition 0 offset 1: DecodeError: schema id 987654 is not known to the schema registry"
    ):
        materialize_once(spark, config, config.tables[0])
    assert [r["id"] for r in read_pyiceberg(state_dir, config.identifier(config.tables[0]))] == [1], (
        "committed up to the bad record"
    )


def test_a_later_batch_lists_the_versions_and_asks_only_for_the_latest(registry, topic, monkeypatch):
    """Continuous runs plan a batch every `refresh`: the subject's versions are fetched again only when the version
    list or the latest's id changed, so a new registration, and a hard-deleted version's number given to another
    schema, are both seen."""
    from icefloe.registries import confluent
    from icefloe_dev.schema_registry import _request

    subject, calls = f"{topic}-value", counted_registry_calls(monkeypatch)

    def register(extra: str) -> int:
        fields = [*V1["fields"], *({"name": name, "type": ["null", "string"], "default": None} for name in extra)]
        body = {"schema": json.dumps({**V1, "fields": fields})}
        return _request("POST", f"{registry.url}/subjects/{subject}/versions", body)[1]["id"]

    def batch() -> dict[int, str]:
        calls.clear()
        found = confluent.subject_schemas({"url": registry.url}, subject, 100)
        return {schema_id: json.loads(text)["fields"][-1]["name"] for schema_id, (text, _) in found.items()}

    ids = [register(""), register("a"), register("ab")]
    assert batch() == dict(zip(ids, ["owner", "a", "b"])) and len(calls) == 4  # the list, then each version
    assert batch() == dict(zip(ids, ["owner", "a", "b"])) and len(calls) == 2  # the list and the latest only
    ids.append(register("abc"))  # registered between two batches
    assert batch() == dict(zip(ids, ["owner", "a", "b", "c"])) and len(calls) == 5  # all again
    for permanent in ("", "?permanent=true"):  # version 4 hard-deleted, its number given to another schema
        assert _request("DELETE", f"{registry.url}/subjects/{subject}/versions/4{permanent}")[0] == 200
    replacement = register("abd")
    assert batch() == dict(zip([*ids[:3], replacement], ["owner", "a", "b", "d"])) and len(calls) == 5


def counted_registry_calls(monkeypatch) -> list[str]:
    """The paths the driver's registry clients GET, in order."""
    from icefloe.registries import confluent

    calls, real_client = [], confluent.registry_client

    def counted(conf):
        client = real_client(conf)
        get = client._rest_client.get
        client._rest_client.get = lambda url, query=None: calls.append(url) or get(url, query)
        return client

    monkeypatch.setattr(confluent, "registry_client", counted)
    return calls


def test_the_second_of_two_batches_asks_the_registry_only_what_can_change(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    broker.create_topic(topic, 1)
    calls, schema = counted_registry_calls(monkeypatch), V1
    for i, name in enumerate(["balance", "note", "memo"]):
        schema = {**schema, "fields": [*schema["fields"], {"name": name, "type": ["null", "string"], "default": None}]}
        produce_avro(
            broker.bootstrap_servers, registry.url, topic, json.dumps(schema), [(None, {"id": i, "owner": "a"})]
        )
    config = make_config({"topic": topic})
    materialize_once(spark, config, config.tables[0])
    assert f"subjects/{topic}-value/versions/1" in calls  # every version, on the first batch
    produce_avro(broker.bootstrap_servers, registry.url, topic, json.dumps(schema), [(None, {"id": 3, "owner": "b"})])
    calls.clear()
    result = materialize_once(spark, config, config.tables[0])
    subject = f"subjects/{topic}-value/versions"
    # the table's schema (before and after planning), then the JVM plan's version list and its latest version's id
    assert sorted(calls) == [subject, f"{subject}/3", f"{subject}/latest", f"{subject}/latest"]
    assert sorted(r["id"] for r in read_pyiceberg(state_dir, result.identifier)) == [0, 1, 2, 3]


class LaggingRegistry:
    """An HTTP proxy in front of the registry that answers 404 the first time a schema id is asked for, as a
    registry follower that has not caught up with its leader yet."""

    def __init__(self, upstream: str):
        import http.server
        import threading
        import urllib.error
        import urllib.request

        self.missed: list[str] = []
        proxy = self
        base = upstream.split("/apis/")[0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, method: str) -> None:
                if "/schemas/ids/" in self.path and self.path.split("?")[0] not in proxy.missed:
                    proxy.missed.append(self.path.split("?")[0])
                    body = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode()
                    self.send_response(404)
                else:
                    length = int(self.headers.get("Content-Length") or 0)
                    request = urllib.request.Request(
                        base + self.path,
                        data=self.rfile.read(length) if length else None,
                        method=method,
                        headers={"Content-Type": self.headers.get("Content-Type") or "application/json"},
                    )
                    try:
                        with urllib.request.urlopen(request, timeout=30) as answer:
                            status, body = answer.status, answer.read()
                    except urllib.error.HTTPError as error:
                        status, body = error.code, error.read()
                    self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/apis/{upstream.split('/apis/')[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_schema_id_the_registry_does_not_know_yet_is_retried_not_skipped(
    spark, broker, registry, state_dir, topic, make_config, monkeypatch
):
    from icefloe.materialize import batch as materializer
    from icefloe.materialize.read_paths import PYTHON, ReadPath

    broker.create_topic(topic, 1)
    produce_avro(
        broker.bootstrap_servers,
        registry.url,
        topic,
        json.dumps(V1),
        [(None, {"id": i, "owner": "a"}) for i in range(3)],
    )
    lagging = LaggingRegistry(registry.url)
    # The Python path asks the registry for each writer id (the JVM path sends it the records of ids it lacks).
    monkeypatch.setattr(materializer, "choose_read_path", lambda spark, decoder: ReadPath(PYTHON, "forced by the test"))
    config = make_config({"topic": topic, "errors": "skip"}, registry_url=lagging.url)
    try:
        result = materialize_once(spark, config, config.tables[0])
    finally:
        lagging.server.shutdown()
    assert lagging.missed, "the registry answered 404 for the writer's id once"
    assert result.records_failed == 0 and result.rows_written == 3
    assert sorted(r["id"] for r in read_pyiceberg(state_dir, result.identifier)) == [0, 1, 2]
