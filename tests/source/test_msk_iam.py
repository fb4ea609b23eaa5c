"""Amazon MSK IAM as a source cluster's authentication: the spec, the token librdkafka sends (signed from fixed
test credentials, decoded and its SigV4 signature recomputed here), the Spark options the JVM side gets, and the
job role's Kafka permissions under Pulumi's mocks.

What only AWS can show: an MSK broker accepting the token and the Java login module, and IAM evaluating the role's
statements (no MSK IAM broker runs here; Apache Kafka has no server side for AWS_MSK_IAM).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import os
import pickle
import shutil
import string
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import pytest

from icefloe.errors import ConfigError, SourceError
from icefloe.source.kafka import client_config
from icefloe.source.spark_kafka import kafka_options
from icefloe.spec import parse_config
from test_infra import policy_of

ROOT = Path(__file__).resolve().parents[2]
AWS_NATIVE = ROOT / "examples" / "Pulumi.aws-native.yaml"
CLUSTER_ARN = "arn:aws:kafka:eu-west-1:123456789012:cluster/orders/0f3c1d2e-aaaa-bbbb-cccc-1234567890ab-2"
MSK = {
    "name": "orders",
    "bootstrapServers": "b-1.orders.kafka.eu-west-1.amazonaws.com:9098",
    "securityProtocol": "SASL_SSL",
    "saslMechanism": "AWS_MSK_IAM",
    "clusterArn": CLUSTER_ARN,
}
# AWS's documentation example credentials: fixed, so the signature can be recomputed here.
ACCESS_KEY, SECRET_KEY = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "FQoGZXIvYXdzEXAMPLE"


def msk_cluster(**changes):
    return parse_config({"sourceClusters": [{**MSK, **changes}]}).source_clusters[0]


@pytest.fixture
def credentials(monkeypatch, tmp_path):
    """Only these credentials: no profile, no shared files, no instance metadata."""
    for key in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    return monkeypatch


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def expected_signature(url: str) -> str:
    """SigV4 of a presigned GET, computed as aws-msk-iam-auth's README spells it out for `kafka-cluster`."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("X-Amz-Signature", "User-Agent")]
    canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query))
    canonical = "\n".join(
        ["GET", parts.path or "/", canonical_query, f"host:{parts.hostname}\n", "host", hashlib.sha256(b"").hexdigest()]
    )
    params = dict(query)
    day, region, service, _ = params["X-Amz-Credential"].split("/", 1)[1].split("/")
    scope = f"{day}/{region}/{service}/aws4_request"
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    to_sign = "\n".join(["AWS4-HMAC-SHA256", params["X-Amz-Date"], scope, digest])
    return hmac.new(signing_key(SECRET_KEY, day, region, service), to_sign.encode(), hashlib.sha256).hexdigest()


def decoded(token: str) -> tuple[str, dict[str, str]]:
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    return url, dict(parse_qsl(urlsplit(url).query))


# --- the spec ------------------------------------------------------------------------------------------------------


def test_msk_iam_names_the_cluster_and_derives_its_region_and_topic_arns():
    cluster = msk_cluster()
    assert cluster.msk_region == "eu-west-1" and cluster.credentials_secret is None
    assert cluster.msk_topic_arn("orders") == (
        "arn:aws:kafka:eu-west-1:123456789012:topic/orders/0f3c1d2e-aaaa-bbbb-cccc-1234567890ab-2/orders"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"securityProtocol": "SASL_PLAINTEXT"}, "AWS_MSK_IAM needs securityProtocol SASL_SSL"),
        ({"credentialsSecret": {"env": "KAFKA"}}, "signs in with the job's AWS credentials: remove credentialsSecret"),
        ({"clusterArn": None}, "AWS_MSK_IAM needs clusterArn"),
        ({"clusterArn": "arn:aws:kafka:eu-west-1:123456789012:topic/o/x/t"}, "clusterArn: String should match pattern"),
        (
            {"saslMechanism": "SCRAM-SHA-512", "credentialsSecret": {"env": "KAFKA"}},
            "clusterArn is only used with saslMechanism AWS_MSK_IAM",
        ),
        ({"saslMechanism": "AWS_MSK_IAM_TYPO"}, "saslMechanism: Input should be"),
    ],
)
def test_msk_iam_misconfigurations_fail_naming_the_key(changes, message):
    cluster = {key: value for key, value in {**MSK, **changes}.items() if value is not None}
    with pytest.raises(ConfigError) as caught:
        parse_config({"sourceClusters": [cluster]}, source="Pulumi.dev.yaml")
    assert "icefloe:sourceClusters[0]" in str(caught.value) and message in str(caught.value)


# --- the Python client: OAUTHBEARER with a signed token -----------------------------------------------------------


def test_the_token_is_a_presigned_kafka_cluster_connect_signed_with_the_jobs_credentials(credentials):
    conf = client_config(msk_cluster())
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "OAUTHBEARER"
    assert "sasl.username" not in conf and "sasl.password" not in conf
    before = time.time()
    token, expiry = conf["oauth_cb"]("")
    url, params = decoded(token)
    assert set(token) <= set(string.ascii_letters + string.digits + "-_")  # base64url, padding stripped
    assert url.startswith("https://kafka.eu-west-1.amazonaws.com/?")
    assert params["Action"] == "kafka-cluster:Connect"
    signed_at = dt.datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    assert params["X-Amz-Credential"] == f"{ACCESS_KEY}/{signed_at:%Y%m%d}/eu-west-1/kafka-cluster/aws4_request"
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and params["X-Amz-SignedHeaders"] == "host"
    assert params["X-Amz-Expires"] == "900" and params["X-Amz-Security-Token"] == SESSION_TOKEN
    assert params["X-Amz-Signature"] == expected_signature(url)
    assert SECRET_KEY not in url
    # Seconds since the epoch, as confluent-kafka's oauth_cb wants them (the signer hands out milliseconds).
    assert expiry == signed_at.timestamp() + 900
    assert before - 1 + 900 <= expiry <= time.time() + 900


def test_a_real_librdkafka_client_takes_the_token(credentials):
    from confluent_kafka.admin import AdminClient

    conf = client_config(msk_cluster(bootstrapServers="127.0.0.1:1"))
    calls = []
    sign = conf["oauth_cb"]
    conf["oauth_cb"] = lambda config: calls.append(config) or sign(config)
    started = time.monotonic()
    # librdkafka asks for the token when the client is made and refuses an expired one ("OAuth token not set within
    # 10 seconds"): an expiry in the wrong unit one way fails here, the other way the bounds above.
    AdminClient({**conf, "security.protocol": "SASL_PLAINTEXT", "error_cb": lambda error: None})
    assert len(calls) == 1 and time.monotonic() - started < 5


def test_the_config_travels_to_executors_and_signs_there(credentials):
    conf = pickle.loads(pickle.dumps(client_config(msk_cluster())))
    _, params = decoded(conf["oauth_cb"](None)[0])
    assert params["X-Amz-Credential"].startswith(ACCESS_KEY + "/")


def test_without_credentials_the_error_says_so(credentials):
    credentials.delenv("AWS_ACCESS_KEY_ID")
    credentials.delenv("AWS_SECRET_ACCESS_KEY")
    credentials.delenv("AWS_SESSION_TOKEN")
    with pytest.raises(SourceError, match=r"MSK IAM authentication \(eu-west-1\): no AWS credentials found"):
        client_config(msk_cluster())["oauth_cb"](None)


# --- the JVM client: aws-msk-iam-auth --------------------------------------------------------------------------


def test_spark_options_are_exactly_what_aws_msk_iam_auth_documents(credentials):
    options = kafka_options(client_config(msk_cluster()))
    security = {k: v for k, v in options.items() if k.startswith(("kafka.sasl.", "kafka.security."))}
    # aws-msk-iam-auth's README, "Configuring a Kafka client to use AWS IAM", each as a Kafka source option.
    assert security == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "AWS_MSK_IAM",
        "kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
        "kafka.sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
    }
    assert options["kafka.bootstrap.servers"] == MSK["bootstrapServers"]
    assert all(isinstance(value, str) for value in options.values())  # nothing of the Python callback leaks in
    with pytest.raises(ConfigError, match="OAUTHBEARER token callback other than MSK IAM"):
        kafka_options({"bootstrap.servers": "b", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": lambda _: ("t", 0)})


@pytest.mark.process
@pytest.mark.skipif(shutil.which("java") is None, reason="needs a JDK")
def test_the_java_login_module_signs_with_the_jobs_credentials_on_the_jobs_classpath(credentials):
    """aws-msk-iam-auth's SASL client (tests/jvm/MskIamProbe.java) on the local session's classpath, in its order:
    Iceberg's AWS bundle (AWS SDK 2.33) before the shaded MSK jar (its own unrelocated SDK 2.51)."""
    from icefloe.session import jvm_lib, local_jars

    if not list((jvm_lib() / "spark").glob("aws-msk-iam-auth-*.jar")):
        pytest.skip("jvm/lib/spark has no aws-msk-iam-auth jar yet: run scripts/setup.sh")
    import pyspark

    slf4j = sorted((Path(pyspark.__file__).parent / "jars").glob("slf4j-api-*.jar"))
    classpath = os.pathsep.join([*local_jars(msk_iam=True), *map(str, slf4j)])
    broker = "b-1.orders.a1b2c3.c2.kafka.eu-west-1.amazonaws.com"
    result = subprocess.run(
        ["java", "-cp", classpath, str(ROOT / "tests" / "jvm" / "MskIamProbe.java"), broker],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["version"] == "2020_10_22" and payload["host"] == broker
    assert payload["action"] == "kafka-cluster:Connect"
    assert payload["x-amz-credential"].startswith(ACCESS_KEY + "/") and payload["x-amz-credential"].endswith(
        "/eu-west-1/kafka-cluster/aws4_request"
    )
    assert payload["x-amz-security-token"] == SESSION_TOKEN
    assert "aws-sdk-java/2.33.0" in payload["user-agent"]  # Iceberg's SDK served it: first on the classpath
    query = {
        "Action": payload["action"],
        "X-Amz-Algorithm": payload["x-amz-algorithm"],
        "X-Amz-Credential": payload["x-amz-credential"],
        "X-Amz-Date": payload["x-amz-date"],
        "X-Amz-Expires": payload["x-amz-expires"],
        "X-Amz-Security-Token": payload["x-amz-security-token"],
        "X-Amz-SignedHeaders": payload["x-amz-signedheaders"],
    }
    assert payload["x-amz-signature"] == expected_signature(f"https://{broker}/?{urlencode(query)}")
    assert SECRET_KEY not in result.stdout + result.stderr


def test_local_sessions_load_the_msk_jar_only_for_msk_iam_and_last(monkeypatch, tmp_path):
    from icefloe import session

    spark = tmp_path / "spark"
    spark.mkdir()
    jars = (
        "aws-msk-iam-auth-2.3.9-all.jar",
        "iceberg-aws-bundle-1.10.1.jar",
        "iceberg-spark-runtime-3.5_2.12-1.10.1.jar",
    )
    for name in jars:
        (spark / name).write_bytes(b"")
    monkeypatch.setenv("ICEFLOE_JVM_LIB", str(tmp_path))
    monkeypatch.setattr(session, "SQLITE_JDBC_JAR", str(spark / "iceberg-aws-bundle-1.10.1.jar"))  # any existing file
    names = [Path(jar).name for jar in session.local_jars()]
    assert "aws-msk-iam-auth-2.3.9-all.jar" not in names
    # Its unrelocated AWS SDK comes after Iceberg's bundle on the classpath.
    with_msk = [Path(jar).name for jar in session.local_jars(msk_iam=True)]
    assert with_msk.index("aws-msk-iam-auth-2.3.9-all.jar") > with_msk.index("iceberg-aws-bundle-1.10.1.jar")
    (spark / "aws-msk-iam-auth-2.3.9-all.jar").unlink()
    with pytest.raises(ConfigError, match="MSK IAM needs the aws-msk-iam-auth jar"):
        session.local_jars(msk_iam=True)


# --- infra: the job role's Kafka permissions, the shipped jar ------------------------------------------------------


@pytest.fixture(scope="module")
def aws_native():
    from pulumi_mocks import run_program

    return run_program(AWS_NATIVE)


def test_the_job_role_may_read_exactly_the_declared_topics_of_the_cluster(aws_native):
    statements = policy_of(aws_native, "icefloe-job-role")
    topic = "arn:aws:kafka:eu-west-1:123456789012:topic/orders/0f3c1d2e-aaaa-bbbb-cccc-1234567890ab-2/"
    assert statements["KafkaConnect"] == {
        "Sid": "KafkaConnect",
        "Effect": "Allow",
        "Action": ["kafka-cluster:Connect"],
        "Resource": [CLUSTER_ARN],
    }
    assert statements["KafkaReadTopics"] == {
        "Sid": "KafkaReadTopics",
        "Effect": "Allow",
        "Action": ["kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"],
        "Resource": [topic + "order_status", topic + "orders"],
    }
    assert statements["KafkaConsumerGroup"]["Action"] == ["kafka-cluster:DescribeGroup"]
    assert statements["KafkaConsumerGroup"]["Resource"] == [topic.replace(":topic/", ":group/") + "icefloe"]
    kafka_actions = {a for s in statements.values() for a in s["Action"] if a.startswith("kafka")}
    assert kafka_actions == {
        "kafka-cluster:Connect",
        "kafka-cluster:DescribeTopic",
        "kafka-cluster:ReadData",
        "kafka-cluster:DescribeGroup",
    }  # no writes, no topic or group changes, no wildcards
    assert "KafkaCredentials" not in statements  # no secret to read: the role itself signs in


def test_stacks_without_msk_iam_grant_no_kafka_actions_and_ship_no_msk_jar():
    from pulumi_mocks import run_program

    run = run_program(ROOT / "examples" / "Pulumi.example.yaml")
    statements = policy_of(run, "icefloe-job-role").values()
    assert not [s for s in statements if any(a.startswith("kafka") for a in s["Action"])]
    assert not [o for o in run.of_type("aws:s3/bucketObjectv2:BucketObjectv2") if "msk" in o.name]


def test_the_msk_jar_ships_with_the_job_and_comes_last_in_spark_jars(aws_native):
    (jar,) = [o for o in aws_native.of_type("aws:s3/bucketObjectv2:BucketObjectv2") if "msk" in o.name]
    assert Path(jar.inputs["source"]["asset"]).name == "aws-msk-iam-auth-2.3.9-all.jar"
    (schedule, *_) = aws_native.of_type("aws:scheduler/schedule:Schedule")
    request = json.loads(schedule.inputs["target"]["input"])
    parameters = request["JobDriver"]["SparkSubmit"]["SparkSubmitParameters"]
    jars = next(w.split("=", 1)[1] for w in parameters.split() if w.startswith("spark.jars="))
    assert jars.split(",")[-1].endswith("/aws-msk-iam-auth-2.3.9-all.jar")


def test_the_aws_native_stack_passes_the_policy_pack(aws_native):
    from icefloe_policies.runner import run_pack

    assert [v for v in run_pack(aws_native) if v.level == "mandatory"] == []


def test_the_pack_rejects_kafka_reads_on_every_topic():
    from icefloe_policies.runner import Resource, run_pack

    broad = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["kafka-cluster:ReadData", "kafka-cluster:WriteData"],
                    "Resource": ["arn:aws:kafka:eu-west-1:123456789012:topic/*/*/*"],
                }
            ],
        }
    )
    violations = run_pack([Resource("aws:iam/rolePolicy:RolePolicy", "job", {"role": "r", "policy": broad})])
    assert [v.policy for v in violations] == ["iam-no-unscoped-data-writes"]
