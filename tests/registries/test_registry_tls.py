"""A Confluent-compatible registry reachable only over HTTPS with a private CA, requiring basic auth (Apicurio, its
own for this module), and the same registry behind a front that requires a client certificate
(`icefloe_dev.tls_front`: Apicurio cannot require one itself). Avro (the JVM read path; the driver asks the registry)
and JSON Schema (the Python path: every executor asks it for the writer's schema) materialize through it; a CA that
did not sign the registry's certificate, and a wrong password, fail at once naming the registry; no password, key or
certificate is shown.

Topics live on the session's plaintext broker: only the registry is secured here."""

from __future__ import annotations

import json
import logging

import pytest
import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icefloe import cli
from icefloe.errors import SourceAuthError
from icefloe.operate.runner import run_table
from icefloe.spec import parse_config
from icefloe_dev.certificates import PrivateCa
from icefloe_dev.schema_registry import RegistryTls, SchemaRegistry
from icefloe_dev.tls_front import TlsFront
from support import produce, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]

REGISTRY_PASSWORD = "registry-Pa55word-5e1f"
KEY_PASSWORD = "regkey-Pa55word-77aa"
AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Reading",
    "type": "object",
    # `minLength`: a rule the JVM path does not check, so the table reads on the Python path, whose executors ask
    # the registry for the writer's schema
    "properties": {"id": {"type": "integer"}, "name": {"type": "string", "minLength": 1}},
    "required": ["id", "name"],
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = PrivateCa(tmp_path_factory.mktemp("registry-pki"))
    return {
        "ca": ca,
        "server": ca.server("registry"),
        "client": ca.client("registry-client", password=KEY_PASSWORD),  # PBES2, as openssl 3 writes it
        "other_ca": PrivateCa(tmp_path_factory.mktemp("registry-other-pki"), name="another CA"),
    }


@pytest.fixture(scope="module")
def https_registry(pki, tmp_path_factory):
    tls = RegistryTls(
        pki["ca"].certificate, pki["server"].certificate, pki["server"].key, users={"registry-user": REGISTRY_PASSWORD}
    )
    with SchemaRegistry(tmp_path_factory.mktemp("https-registry"), heap="384m", tls=tls) as registry:
        yield registry


@pytest.fixture(scope="module")
def mtls_front(pki, https_registry):
    with TlsFront(pki["ca"].certificate, pki["server"], https_registry.url) as front:
        yield front


def _producer_client(pki, url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient(
        {
            "url": url,
            "ssl.ca.location": str(pki["ca"].certificate),
            "basic.auth.user.info": f"registry-user:{REGISTRY_PASSWORD}",
        }
    )


def _secret_env(monkeypatch, pki) -> None:
    monkeypatch.setenv("REG_USERNAME", "registry-user")
    monkeypatch.setenv("REG_PASSWORD", REGISTRY_PASSWORD)
    monkeypatch.setenv("REG_CA", pki["ca"].certificate.read_text())
    monkeypatch.setenv("REG_CERT", pki["client"].certificate_text)
    monkeypatch.setenv("REG_KEY", pki["client"].key_text)
    monkeypatch.setenv("REG_KEY_PASSWORD", KEY_PASSWORD)


def _cluster(broker, url: str, client_certificate: bool) -> dict:
    tls = {"caCertificate": {"env": "REG_CA"}}
    if client_certificate:
        tls |= {
            "clientCertificate": {"env": "REG_CERT"},
            "clientKey": {"env": "REG_KEY"},
            "clientKeyPassword": {"env": "REG_KEY_PASSWORD"},
        }
    return {
        "name": "local",
        "bootstrapServers": broker.bootstrap_servers,
        "schemaRegistry": {"url": url, "credentialsSecret": {"env": "REG"}, "tls": tls},
    }


def _secrets(pki) -> list[str]:
    def body(pem: str) -> str:
        lines = [line for line in pem.splitlines() if line and not line.startswith("-----")]
        return lines[len(lines) // 2]

    return [
        REGISTRY_PASSWORD,
        KEY_PASSWORD,
        body(pki["client"].key_text),
        body(pki["client"].certificate_text),
        body(pki["ca"].certificate.read_text()),
    ]


@pytest.mark.parametrize("client_certificate", [False, True], ids=["https-basic-auth", "mutual-tls"])
def test_avro_and_json_schema_through_an_https_registry(
    spark, broker, pki, https_registry, mtls_front, state_dir, monkeypatch, caplog, capfd, client_certificate
):
    """Both read paths through a registry reachable only over HTTPS, its CA given by `tls.caCertificate`, basic
    auth by `credentialsSecret`; behind the front, also the client certificate and its PBES2-encrypted key."""
    caplog.set_level(logging.DEBUG)
    _secret_env(monkeypatch, pki)
    url = mtls_front.url if client_certificate else https_registry.url
    name = "registry_mtls" if client_certificate else "registry_https"
    client = _producer_client(pki, https_registry.url)
    avro, json_schema = (
        SerializationContext(f"{name}_avro", MessageField.VALUE),
        SerializationContext(f"{name}_json", MessageField.VALUE),
    )
    to_avro = AvroSerializer(client, json.dumps(AVRO))
    to_json = JSONSerializer(json.dumps(JSON_SCHEMA), client)
    for context, serialize in ((avro, to_avro), (json_schema, to_json)):
        broker.create_topic(context.topic, 1)
        values = [serialize({"id": i, "name": f"n{i}"}, context) for i in range(5)]
        produce(broker.bootstrap_servers, context.topic, [{"value": v, "partition": 0} for v in values])
    config = parse_config(
        {
            "sourceClusters": [_cluster(broker, url, client_certificate)],
            "tables": [
                {"sourceCluster": "local", "topic": avro.topic, "table": avro.topic, "format": "avro"},
                {
                    "sourceCluster": "local",
                    "topic": json_schema.topic,
                    "table": json_schema.topic,
                    "format": "json-schema",
                },
            ],
        }
    )
    results = {t.table_name: run_table(spark, config, t, state_dir) for t in config.tables}
    assert {n: r.read_path for n, r in results.items()} == {avro.topic: "jvm", json_schema.topic: "python"}
    for table, result in results.items():
        rows = sorted((r["id"], r["name"]) for r in read_pyiceberg(state_dir, result.identifier))
        assert rows == [(i, f"n{i}") for i in range(5)], table
    out, err = capfd.readouterr()
    text = "\n".join([out, err, *(record.getMessage() for record in caplog.records)])
    for secret in _secrets(pki):
        assert secret not in text, f"a secret ({secret[:6]}...) was shown"


def test_a_client_certificate_is_required_behind_the_front(pki, mtls_front):
    """The front refuses a client without a certificate: the mutual-TLS case above is not passing by accident."""
    with pytest.raises(Exception, match="disconnected|alert|certificate"):
        _producer_client(pki, mtls_front.url).get_subjects()


@pytest.mark.parametrize("failure", ["unknown-ca", "wrong-password"])
def test_registry_refusals_name_the_registry_and_are_not_retried(
    spark, broker, pki, https_registry, state_dir, monkeypatch, caplog, capfd, tmp_path, failure
):
    """A CA that did not sign the registry's certificate says "certificate verify failed", a wrong password
    "authentication failed"; both name the registry, fail the table without the run's retries, and `icefloe run
    --json` shows the cause, never a secret."""
    caplog.set_level(logging.DEBUG)
    _secret_env(monkeypatch, pki)
    if failure == "unknown-ca":
        monkeypatch.setenv("REG_CA", pki["other_ca"].certificate.read_text())
        expected = "certificate verify failed"
    else:
        monkeypatch.setenv("REG_PASSWORD", "wrong-registry-secret")
        expected = "authentication failed"
    topic = f"registry_refused_{failure.replace('-', '_')}"
    broker.create_topic(topic, 1)
    produce(broker.bootstrap_servers, topic, [{"value": b"\x00\x00\x00\x00\x01\x02", "partition": 0}])
    cluster = _cluster(broker, https_registry.url, client_certificate=False)
    table = {"sourceCluster": "local", "topic": topic, "table": topic, "format": "avro"}
    config = parse_config({"sourceClusters": [cluster], "tables": [table]})
    with pytest.raises(SourceAuthError) as raised:
        run_table(spark, config, config.tables[0], state_dir)
    assert f"schema registry {https_registry.url}" in str(raised.value) and expected in str(raised.value)
    assert not [r for r in caplog.records if "retrying" in r.getMessage()], "an authentication failure was retried"
    shown = [str(raised.value), *(record.getMessage() for record in caplog.records)]
    caplog.clear()
    path = tmp_path / "Pulumi.registry.yaml"
    path.write_text(yaml.safe_dump({"config": {"icefloe:sourceClusters": [cluster], "icefloe:tables": [table]}}))
    assert cli.main(["run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir)]) != 0
    out, err = capfd.readouterr()
    cli_text = "\n".join([out, err, *(record.getMessage() for record in caplog.records)])
    assert f"schema registry {https_registry.url}: {expected}" in cli_text
    text = "\n".join([*shown, cli_text])
    for secret in [*_secrets(pki), "wrong-registry-secret"]:
        assert secret not in text, f"a secret ({secret[:6]}...) was shown"


@pytest.mark.parametrize("failure", ["unknown-ca", "wrong-password"])
def test_an_executors_registry_refusal_is_not_retried(broker, pki, https_registry, monkeypatch, failure):
    """The Python path's decoders ask the registry from executors: a refusal there is an authentication failure too,
    carried to the driver as one (`python_tasks` marks it), so the run is not retried."""
    from types import SimpleNamespace

    from icefloe.formats import decoding
    from icefloe.formats.json_schema import JsonSchemaDecoder
    from icefloe.materialize.python_tasks import _marked, unmark

    _secret_env(monkeypatch, pki)
    if failure == "unknown-ca":
        monkeypatch.setenv("REG_CA", pki["other_ca"].certificate.read_text())
    else:
        monkeypatch.setenv("REG_PASSWORD", "wrong-registry-secret")
    cluster = parse_config({"sourceClusters": [_cluster(broker, https_registry.url, False)]}).source_clusters[0]
    conf = decoding.confluent_conf(cluster)
    spec = SimpleNamespace(registry=conf, data_format="json-schema")
    decode = decoding.registry_checked(spec, JsonSchemaDecoder(decoding.confluent.registry_client(conf), None))
    with pytest.raises(SourceAuthError, match=f"schema registry {https_registry.url}") as raised:
        decode(b"\x00\x00\x00\x00\x01{}")
    assert isinstance(unmark(_marked(raised.value)), SourceAuthError)
