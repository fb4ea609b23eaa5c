"""Secured clusters against a real broker: SASL_SSL with SCRAM-SHA-512 and PLAIN, mutual TLS with a private CA (and
a client key encrypted as openssl 3 writes it, PBES2), on both read paths (JSON: Python; raw: Spark's Kafka source);
failures that name what failed and fail fast; no password, key or certificate in any log, error, --json or plan.

One secured broker for the module (its own CA, made with openssl), beside the session's plaintext one; its plaintext
listener creates the topics and produces."""

from __future__ import annotations

import json
import logging
import time

import pytest
import yaml

from icefloe import cli
from icefloe.errors import ConfigError, SourceAuthError, SourceError, is_transient
from icefloe.operate.runner import run_table
from icefloe.source.kafka import client_config, close_admin_clients, list_partitions
from icefloe.source.spark_kafka import kafka_options, read_ranges, source_failure, unencrypted_key
from icefloe.spec import parse_config
from icefloe_dev.certificates import PrivateCa
from icefloe_dev.kafka_broker import BrokerSecurity, KafkaBroker
from support import produce, read_pyiceberg

SCRAM_PASSWORD = "scram-Pa55word-7f3e"
PLAIN_PASSWORD = "plain-Pa55word-91ac"
KEY_PASSWORD = "key-Pa55word-c0de"
# The float column keeps the JSON tables on the Python path (formats.json_jvm leaves floats to Python): their
# executors read with librdkafka, the raw tables with Spark's Kafka source.
SCHEMA = {
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "score", "type": "float"}]
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = PrivateCa(tmp_path_factory.mktemp("pki"))
    return {
        "ca": ca,
        "server": ca.server(),
        "client": ca.client("icefloe-client"),
        "pbes2": ca.client("icefloe-pbes2", password=KEY_PASSWORD),
        "other_ca": PrivateCa(tmp_path_factory.mktemp("other-pki"), name="another CA"),
    }


@pytest.fixture(scope="module")
def secured(pki, tmp_path_factory):
    security = BrokerSecurity(
        pki["ca"].certificate,
        pki["server"].certificate,
        pki["server"].key,
        scram_users={"scram-user": SCRAM_PASSWORD},
        plain_users={"plain-user": PLAIN_PASSWORD},
    )
    with KafkaBroker(tmp_path_factory.mktemp("secured-kafka"), heap="256m", security=security) as broker:
        yield broker
    close_admin_clients()


def _secret_env(monkeypatch, pki, auth: str) -> None:
    """The secrets as a local run has them: environment variables the config's references name."""
    monkeypatch.setenv("SEC_CA", pki["ca"].certificate.read_text())
    monkeypatch.setenv("SEC_USERNAME", {"plain": "plain-user"}.get(auth, "scram-user"))
    monkeypatch.setenv("SEC_PASSWORD", {"plain": PLAIN_PASSWORD}.get(auth, SCRAM_PASSWORD))
    pem = pki["pbes2" if auth == "mtls-pbes2" else "client"]
    monkeypatch.setenv("SEC_CERT", pem.certificate_text)
    monkeypatch.setenv("SEC_KEY", pem.key_text)
    monkeypatch.setenv("SEC_KEY_PASSWORD", KEY_PASSWORD)


def _cluster(secured, auth: str) -> dict:
    tls = {"caCertificate": {"env": "SEC_CA"}}
    if auth in ("scram", "plain"):
        mechanism = "SCRAM-SHA-512" if auth == "scram" else "PLAIN"
        return {
            "name": "secured",
            "bootstrapServers": secured.sasl_ssl_servers,
            "securityProtocol": "SASL_SSL",
            "saslMechanism": mechanism,
            "credentialsSecret": {"env": "SEC"},
            "tls": tls,
        }
    tls |= {"clientCertificate": {"env": "SEC_CERT"}, "clientKey": {"env": "SEC_KEY"}}
    if auth == "mtls-pbes2":
        tls["clientKeyPassword"] = {"env": "SEC_KEY_PASSWORD"}
    return {"name": "secured", "bootstrapServers": secured.ssl_servers, "securityProtocol": "SSL", "tls": tls}


def _config(secured, auth: str, *tables: dict):
    return parse_config(
        {"sourceClusters": [_cluster(secured, auth)], "tables": [{"sourceCluster": "secured", **t} for t in tables]}
    )


def _secrets(pki) -> list[str]:
    """What must never be shown: passwords, keys (as given and as decrypted for Java), certificates' bodies."""
    pieces = [SCRAM_PASSWORD, PLAIN_PASSWORD, KEY_PASSWORD]
    for name in ("client", "pbes2"):
        pem = pki[name]
        pieces += [_body(pem.key_text), _body(pem.certificate_text)]
    pieces.append(_body(unencrypted_key(pki["pbes2"].key_text, KEY_PASSWORD)))
    pieces.append(_body(pki["ca"].certificate.read_text()))
    return pieces


def _body(pem: str) -> str:
    """A distinctive line from the middle of a PEM's base64 body."""
    lines = [line for line in pem.splitlines() if line and not line.startswith("-----")]
    return lines[len(lines) // 2]


# -- config


@pytest.mark.parametrize(
    "cluster, message",
    [
        ({"securityProtocol": "SSL", "tls": {"caCertificat": {"env": "X"}}}, "caCertificat"),
        (
            {"securityProtocol": "SSL", "tls": {"clientCertificate": {"env": "X"}}},
            "clientCertificate and clientKey go together",
        ),
        (
            {"securityProtocol": "SSL", "tls": {"caCertificate": {"env": "X"}, "clientKeyPassword": {"env": "Y"}}},
            "clientKeyPassword only applies with clientKey",
        ),
        ({"tls": {"caCertificate": {"env": "X"}}}, "tls needs securityProtocol SSL or SASL_SSL"),
        ({"securityProtocol": "SSL", "tls": {"caCertificate": "-----BEGIN CERTIFICATE-----"}}, "caCertificate"),
        ({"schemaRegistry": {"url": "http://r:8081", "tls": {"caCertificate": {"env": "X"}}}}, "https:// url only"),
        (
            {"schemaRegistry": {"type": "glue", "registryName": "r", "region": "eu-west-1", "tls": {}}},
            "takes no url, credentialsSecret or tls",
        ),
    ],
)
def test_tls_config_mistakes_are_named(cluster, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"sourceClusters": [{"name": "c", "bootstrapServers": "b:9093", **cluster}]})


def test_java_options_carry_pem_inline_and_a_pbes2_key_decrypted_in_memory(pki, monkeypatch):
    """Java 17 refuses PBES2 keys: the JVM path gets the key decrypted (unencrypted PKCS#8), and no password."""
    _secret_env(monkeypatch, pki, "mtls-pbes2")
    config = parse_config({"sourceClusters": [_cluster_for_unit("mtls-pbes2")]})
    conf = client_config(config.source_clusters[0])
    assert conf["ssl.key.pem"] == pki["pbes2"].key_text and "ENCRYPTED" in conf["ssl.key.pem"]
    assert conf["ssl.key.password"] == KEY_PASSWORD and conf["ssl.endpoint.identification.algorithm"] == "https"
    options = kafka_options(conf)
    assert options["kafka.ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert options["kafka.ssl.truststore.certificates"] == pki["ca"].certificate.read_text()
    assert options["kafka.ssl.keystore.certificate.chain"] == pki["pbes2"].certificate_text
    assert "kafka.ssl.key.password" not in options and options["kafka.ssl.keystore.type"] == "PEM"
    with pytest.raises(ConfigError, match="tls.clientKey cannot be read") as refused:
        unencrypted_key(pki["pbes2"].key_text, "wrong")
    assert KEY_PASSWORD not in str(refused.value) and "wrong" not in str(refused.value)


def _cluster_for_unit(auth: str) -> dict:
    class Listeners:
        sasl_ssl_servers = ssl_servers = "127.0.0.1:1"

    return _cluster(Listeners, auth)


# -- end to end

AUTHS = ["scram", "plain", "mtls", "mtls-pbes2"]


@pytest.mark.spark
@pytest.mark.parametrize("auth", AUTHS)
def test_append_and_upsert_on_both_read_paths(spark, secured, pki, state_dir, monkeypatch, auth):
    """JSON (the Python path, executors read with librdkafka) and raw (Spark's Kafka source), each in append and
    upsert, through the secured listener; the tables read back with pyiceberg."""
    _secret_env(monkeypatch, pki, auth)
    topic = f"secure_{auth.replace('-', '_')}"
    secured.create_topic(topic, 2)
    records = [
        {"key": b"k%d" % (i % 3), "value": json.dumps({"id": i % 3, "name": f"n{i}"}).encode(), "partition": 0}
        for i in range(9)
    ]
    produce(secured.bootstrap_servers, topic, records)
    tables = [
        {"topic": topic, "table": f"{topic}_json_append", "format": "json", "schema": SCHEMA},
        {
            "topic": topic,
            "table": f"{topic}_json_upsert",
            "format": "json",
            "schema": SCHEMA,
            "mode": "upsert",
            "key": ["id"],
        },
        {"topic": topic, "table": f"{topic}_raw_append", "format": "raw"},
        {"topic": topic, "table": f"{topic}_raw_upsert", "format": "raw", "mode": "upsert"},
    ]
    if auth == "mtls-pbes2":  # the key is what differs: append on each path shows both clients read it
        tables = [t for t in tables if "mode" not in t]
    config = _config(secured, auth, *tables)
    results = {t.table_name: run_table(spark, config, t, state_dir) for t in config.tables}
    paths = {name: result.read_path for name, result in results.items()}
    assert paths == {t["table"]: "jvm" if t["format"] == "raw" else "python" for t in tables}
    rows = {name: read_pyiceberg(state_dir, result.identifier) for name, result in results.items()}
    assert sorted(r["name"] for r in rows[f"{topic}_json_append"]) == sorted(f"n{i}" for i in range(9))
    assert sorted(r["value"] for r in rows[f"{topic}_raw_append"]) == sorted(r["value"] for r in records)
    if auth != "mtls-pbes2":
        assert sorted((r["id"], r["name"]) for r in rows[f"{topic}_json_upsert"]) == [(0, "n6"), (1, "n7"), (2, "n8")]
        assert sorted((r["kafka_key"], json.loads(r["value"])["name"]) for r in rows[f"{topic}_raw_upsert"]) == [
            (b"k0", "n6"),
            (b"k1", "n7"),
            (b"k2", "n8"),
        ]


# -- failures


def _fails_fast(call, expected: type[Exception], *messages: str) -> Exception:
    started = time.monotonic()
    with pytest.raises(expected) as raised:
        call()
    # Fail fast, not the metadata timeout (15 s) and not for ever: librdkafka retries these without end.
    assert time.monotonic() - started < 10, f"took {time.monotonic() - started:.1f}s"
    for message in messages:
        assert message in str(raised.value)
    return raised.value


def test_wrong_password_names_the_cluster_and_fails_fast(secured, pki, monkeypatch):
    _secret_env(monkeypatch, pki, "scram")
    monkeypatch.setenv("SEC_PASSWORD", "not-the-password")
    conf = client_config(parse_config({"sourceClusters": [_cluster(secured, "scram")]}).source_clusters[0])
    error = _fails_fast(
        lambda: list_partitions(conf, "any"), SourceAuthError, "sourceCluster secured", "authentication failed"
    )
    assert "not-the-password" not in str(error)


def test_unknown_ca_says_certificate_verify_failed(secured, pki, monkeypatch):
    _secret_env(monkeypatch, pki, "scram")
    monkeypatch.setenv("SEC_CA", pki["other_ca"].certificate.read_text())
    conf = client_config(parse_config({"sourceClusters": [_cluster(secured, "scram")]}).source_clusters[0])
    _fails_fast(
        lambda: list_partitions(conf, "any"), SourceAuthError, "sourceCluster secured", "certificate verify failed"
    )


@pytest.mark.parametrize("refused", ["other-ca", "expired"])
def test_a_refused_client_certificate_says_so(secured, pki, monkeypatch, refused):
    """A client certificate the broker does not accept (from a CA it does not trust, or expired): the broker ends the
    handshake with an alert, which librdkafka reports as a transport error (as any broken connection) and retries
    for ever. The alert in its text makes it an authentication failure naming the cluster, not retried, and raised
    before the metadata timeout (a `SourceError` would be that timeout's)."""
    stranger = pki["other_ca"].client("stranger") if refused == "other-ca" else pki["ca"].client("old", expired=True)
    _secret_env(monkeypatch, pki, "mtls")
    monkeypatch.setenv("SEC_CERT", stranger.certificate_text)
    monkeypatch.setenv("SEC_KEY", stranger.key_text)
    conf = client_config(parse_config({"sourceClusters": [_cluster(secured, "mtls")]}).source_clusters[0])
    with pytest.raises(
        SourceAuthError, match="sourceCluster secured: the broker refused the client certificate"
    ) as raised:
        list_partitions(conf, "any")
    assert not is_transient(raised.value)
    assert _body(stranger.key_text) not in str(raised.value) and _body(stranger.certificate_text) not in str(
        raised.value
    )


def test_an_outage_of_a_tls_broker_stays_transient(pki, monkeypatch):
    """Nothing listening where the mutual-TLS cluster should be: an outage, not a refusal, so it is retried."""
    from icefloe_dev.processes import free_port

    class Gone:
        sasl_ssl_servers = ssl_servers = f"127.0.0.1:{free_port()}"

    _secret_env(monkeypatch, pki, "mtls")
    conf = client_config(parse_config({"sourceClusters": [_cluster(Gone, "mtls")]}).source_clusters[0])
    with pytest.raises(SourceError) as raised:
        list_partitions(conf, "any")
    assert not isinstance(raised.value, SourceAuthError) and is_transient(raised.value)


@pytest.mark.spark
def test_java_client_failures_are_classified(spark, secured, pki, monkeypatch):
    """Spark's Kafka source with a wrong password, an untrusted CA and a client certificate the broker refuses: not
    retried, the cluster named."""
    from icefloe.source.kafka import OffsetRange

    secured.create_topic("secure_java_failures", 1)
    stranger = pki["other_ca"].client("java-stranger")
    for auth, env, message in [
        ("scram", {"SEC_PASSWORD": "not-the-password"}, "authentication failed"),
        ("mtls", {"SEC_CA": pki["other_ca"].certificate.read_text()}, "TLS handshake failed"),
        ("mtls", {"SEC_CERT": stranger.certificate_text, "SEC_KEY": stranger.key_text}, "TLS handshake failed"),
    ]:
        _secret_env(monkeypatch, pki, auth)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        conf = client_config(parse_config({"sourceClusters": [_cluster(secured, auth)]}).source_clusters[0])
        with pytest.raises(Exception) as raised:
            read_ranges(spark, conf, [OffsetRange("secure_java_failures", 0, 0, 1)]).count()
        failure = source_failure(raised.value, "secure_java_failures", "secured")
        assert isinstance(failure, SourceAuthError), str(raised.value)[-2000:]
        assert message in str(failure) and "sourceCluster secured" in str(failure)
        assert "not-the-password" not in str(failure)


# -- no secret shown


@pytest.mark.spark
def test_no_secret_in_logs_errors_json_or_spark_plans(
    spark, secured, pki, state_dir, monkeypatch, tmp_path, capfd, caplog
):
    """`icefloe run --json` and `status --json` over mutual TLS with the PBES2 key and over SCRAM, a failing run
    (wrong password), the JVM read's plans, the session's conf: none shows a password, key or certificate."""
    from icefloe.source.kafka import OffsetRange

    caplog.set_level(logging.DEBUG)
    topic = "secure_leaks"
    secured.create_topic(topic, 1)
    produce(secured.bootstrap_servers, topic, [{"value": b"x%d" % i} for i in range(3)])
    shown: list[str] = []
    for auth in ("mtls-pbes2", "scram"):
        _secret_env(monkeypatch, pki, auth)
        document = {
            "config": {
                "icefloe:sourceClusters": [_cluster(secured, auth)],
                "icefloe:tables": [
                    {
                        "sourceCluster": "secured",
                        "topic": topic,
                        "table": f"leaks_{auth.replace('-', '_')}",
                        "format": "raw",
                    }
                ],
            }
        }
        path = tmp_path / f"Pulumi.{auth}.yaml"
        path.write_text(yaml.safe_dump(document))
        assert cli.main(["-v", "run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir)]) == 0
        assert cli.main(["status", "--config", str(path), "--json", "--state-dir", str(state_dir)]) == 0
        conf = client_config(parse_config({"sourceClusters": [_cluster(secured, auth)]}).source_clusters[0])
        frame = read_ranges(spark, conf, [OffsetRange(topic, 0, 0, 3)])
        for mode in ("simple", "extended", "formatted", "cost"):
            spark.sql("SELECT 1")  # keeps the session busy like a run
            frame.explain(mode)
        shown.append(frame._jdf.queryExecution().toString())
        shown.append(str(spark.sparkContext.getConf().getAll()))
        shown.append(str(spark.sql("SET -v").collect()))
        monkeypatch.setenv("SEC_PASSWORD", "wrong-but-secret-too")
        if auth == "scram":
            assert cli.main(["run", "--config", str(path), "--once", "--json", "--state-dir", str(state_dir)]) != 0
    out, err = capfd.readouterr()
    shown += [out, err, *(record.getMessage() for record in caplog.records)]
    text = "\n".join(shown)
    assert "sourceCluster secured: authentication failed" in text, "the failing run says what failed"
    for secret in [*_secrets(pki), "wrong-but-secret-too"]:
        assert secret not in text, f"a secret ({secret[:6]}...) was shown"


def test_registry_tls_material_goes_to_private_local_files(pki, monkeypatch):
    """The registry client (httpx) reads certificates from files: written once per process, 0600 in a 0700 temporary
    directory, never in the client's config as text; basic auth beside it."""
    import os
    import stat

    from icefloe.registries.confluent import registry_client_conf, registry_config

    _secret_env(monkeypatch, pki, "mtls-pbes2")
    registry = (
        parse_config(
            {
                "sourceClusters": [
                    {
                        "name": "c",
                        "bootstrapServers": "b:1",
                        "schemaRegistry": {
                            "url": "https://registry.example:8081",
                            "credentialsSecret": {"env": "SEC"},
                            "tls": {
                                "caCertificate": {"env": "SEC_CA"},
                                "clientCertificate": {"env": "SEC_CERT"},
                                "clientKey": {"env": "SEC_KEY"},
                                "clientKeyPassword": {"env": "SEC_KEY_PASSWORD"},
                            },
                        },
                    }
                ]
            }
        )
        .source_clusters[0]
        .schema_registry
    )
    conf = registry_client_conf(registry_config(registry, "c"))
    assert conf["basic.auth.user.info"] == f"scram-user:{SCRAM_PASSWORD}" and conf["ssl.key.password"] == KEY_PASSWORD
    for key, text in (
        ("ssl.ca.location", pki["ca"].certificate.read_text()),
        ("ssl.certificate.location", pki["pbes2"].certificate_text),
        ("ssl.key.location", pki["pbes2"].key_text),
    ):
        path = conf[key]
        assert open(path).read() == text
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert not any("BEGIN" in str(value) for value in conf.values())
    assert registry_client_conf(registry_config(registry, "c"))["ssl.key.location"] == conf["ssl.key.location"]


def test_no_secret_in_sparks_event_log(secured, pki, state_dir, monkeypatch, tmp_path):
    """Spark's event log (EMR Serverless writes one for every job) holds the session's settings, every SQL
    execution's plans and each job's properties: `icefloe run` over mutual TLS with the PBES2 key and over SCRAM, both
    read paths (raw: Spark's Kafka source; JSON: executors' librdkafka), writes none of the password, key or
    certificate into it. A subprocess: the event log is set when a SparkContext starts (the session's is running)."""
    import os
    import subprocess
    import sys

    _secret_env(monkeypatch, pki, "mtls-pbes2")  # both clusters' secrets: SCRAM's user and password, the PBES2 key
    topic = "secure_event_log"
    secured.create_topic(topic, 1)
    produce(
        secured.bootstrap_servers, topic, [{"value": json.dumps({"id": i, "name": f"n{i}"}).encode()} for i in range(3)]
    )
    clusters, tables = [], []
    for auth in ("mtls-pbes2", "scram"):
        name = f"secured_{auth.replace('-', '_')}"
        clusters.append({**_cluster(secured, auth), "name": name})
        tables += [
            {"sourceCluster": name, "topic": topic, "table": f"eventlog_{name}_raw", "format": "raw"},
            {
                "sourceCluster": name,
                "topic": topic,
                "table": f"eventlog_{name}_json",
                "format": "json",
                "schema": SCHEMA,
            },
        ]
    path = tmp_path / "Pulumi.eventlog.yaml"
    path.write_text(yaml.safe_dump({"config": {"icefloe:sourceClusters": clusters, "icefloe:tables": tables}}))
    events = tmp_path / "spark-events"
    events.mkdir()
    env = {
        **os.environ,
        "ICEFLOE_SPARK_MASTER": "local[2]",
        "PYSPARK_SUBMIT_ARGS": (
            f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{events} pyspark-shell"
        ),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "icefloe.cli",
            "run",
            "--config",
            str(path),
            "--once",
            "--json",
            "--state-dir",
            str(state_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["read_path"] for r in results) == ["jvm", "jvm", "python", "python"], done.stdout
    logged = "\n".join(p.read_text(errors="replace") for p in events.rglob("*") if p.is_file())
    # The log holds what a leak would be in: the settings, the Kafka reads' plans, the Python path's plan.
    for part in (
        "SparkListenerEnvironmentUpdate",
        "SparkListenerSQLExecutionStart",
        "KafkaRelation",
        "PythonMapInArrow",
    ):
        assert part in logged, part
    for secret in _secrets(pki):
        assert secret not in logged, f"a secret ({secret[:6]}...) is in Spark's event log"
        assert secret not in done.stdout + done.stderr, f"a secret ({secret[:6]}...) is in the run's output"
