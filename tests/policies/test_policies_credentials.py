"""The plaintext-credential detector behind `no-plaintext-credentials`: what it must catch, and the
ARNs, names, paths and URIs it must leave alone."""

from __future__ import annotations

import pytest

from icefloe_policies.credentials import Finding, is_reference, is_sensitive_name, scan, scan_args, scan_pair, scan_text

SECRET_ARN = "arn:aws:secretsmanager:us-east-1:111122223333:secret:kafka-password-AbCd"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    "text, kind",
    [
        ("jdbc:postgresql://db:5432/lake?user=icefloe&password=hunter2!", "password"),
        ("jdbc:sqlserver://db:1433;databaseName=lake;user=icefloe;password=hunter2!;", "password"),
        (
            'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p@ss w";',
            "password",
        ),
        ("--conf spark.hadoop.fs.s3a.secret.key=abcDEF123", "secret key"),
        ("--conf spark.hadoop.fs.s3a.access.key=AKIAIOSFODNN7EXAMPLE", "AWS access key id"),
        ("--kafka-password hunter2", "password"),
        ("--db-password=hunter2", "password"),
        ("aws_secret_access_key=" + AWS_SECRET, "access key"),
        (AWS_SECRET, "AWS secret access key"),
        ("sasl.oauthbearer.token=abc.def", "token"),
        ("https://icefloe:hunter2@registry.example.com:8081", "password in URL"),
        ("kafka://user:pa55@broker:9092", "password in URL"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----", "private key (PEM)"),
        ("-----BEGIN PRIVATE KEY-----", "private key (PEM)"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijKLMNOP", "JSON web token"),
        ("ghp_" + "a" * 36, "GitHub token"),
        ("api_key=0123456789abcdef", "api key"),
    ],
)
def test_credentials_in_text_are_found(text, kind):
    assert kind in {f.kind for f in scan_text(text, "x")}


@pytest.mark.parametrize(
    "text",
    [
        SECRET_ARN,
        f"--credentials-secret-arn {SECRET_ARN}",
        f"--conf spark.icefloe.kafka.password.secret.arn={SECRET_ARN}",
        f"password={SECRET_ARN}",
        "s3://icefloe-dev-lake/warehouse/kafka.db/stock_trades/metadata/00001-abc.metadata.json",
        "s3://lake/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCd",  # a 40-character object key
        "s3://lake/secrets/token.json",
        "cluster:AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCd",  # a 40-character id inside an ARN-like value
        "https://registry.example.com:8081",
        "kafka://user@broker:9092",
        "--conf spark.sql.catalog.glue.token-refresh-enabled=true",
        "--conf spark.kafka.sasl.mechanism=SCRAM-SHA-512 --conf spark.executor.memory=4g",
        "password=${KAFKA_PASSWORD}",
        "https://icefloe:{{resolve:secretsmanager:icefloe/dev/registry}}@registry:8081",
        "password=<from secrets manager>",
        "--secret-name icefloe/dev/kafka",
        "--password-secret kafka-password",
        "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "0123456789abcdef0123456789abcdef01234567",  # a git sha: hex, one case
        "emr-7.5.0",
        "",
    ],
)
def test_references_and_ordinary_values_are_not_credentials(text):
    assert scan_text(text, "x") == []


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "DB_PASSWORD",
        "kafkaSaslPassword",
        "spark.hadoop.fs.s3a.secret.key",
        "secretAccessKey",
        "AWS_SECRET_ACCESS_KEY",
        "api-key",
        "apiKey",
        "SESSION_TOKEN",
        "client_secret",
        "ssh-private-key",
        "pwd",
    ],
)
def test_sensitive_names(name):
    assert is_sensitive_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "passwordSecretArn",
        "KAFKA_SECRET_ID",
        "kmsKeyId",
        "secretName",
        "tokenEndpoint",
        "clientToken",
        "ClientToken",
        "nextToken",
        "username",
        "sasl.mechanism",
        "keyUsage",
        "primaryKey",
    ],
)
def test_names_that_only_refer_to_credentials(name):
    assert not is_sensitive_name(name)


@pytest.mark.parametrize(
    "value",
    [
        SECRET_ARN,
        "icefloe/dev/kafka",
        "/icefloe/dev/kafka",
        "kafka-password",
        "icefloe_dev_secret",
        "${PASS}",
        "$PASS",
        "{{resolve:secretsmanager:x}}",
        "<your password>",
        "****",
        "true",
        "s3://bucket/creds.json",
        "",
    ],
)
def test_references(value):
    assert is_reference(value)


@pytest.mark.parametrize("value", ["hunter2", "password123", AWS_SECRET, "Tr0ub4dor&3", "https://u:p@h"])
def test_not_references(value):
    assert not is_reference(value)


def test_pair_named_like_a_credential():
    assert scan_pair("DB_PASSWORD", "hunter2", "env.DB_PASSWORD") == [Finding("env.DB_PASSWORD", "password")]
    assert scan_pair("DB_PASSWORD", SECRET_ARN, "env.DB_PASSWORD") == []
    assert scan_pair("DB_HOST", "db.internal", "env.DB_HOST") == []


def test_flag_and_value_in_separate_arguments():
    args = ["--topic", "trades", "--sasl-password", "hunter2", "--secret-arn", SECRET_ARN]
    assert scan_args(args, "args") == [Finding("args[3]", "password")]


def test_flag_with_equals_in_one_argument():
    assert scan_args(["--sasl-password=hunter2"], "args") == [Finding("args[0]", "password")]


def test_json_strings_are_walked_with_their_paths():
    payload = '{"jobDriver": {"sparkSubmit": {"entryPointArguments": ["--token", "abc123"]}}}'
    assert scan(payload, "input") == [Finding("input.jobDriver.sparkSubmit.entryPointArguments[1]", "token")]


def test_client_token_of_start_job_run_is_not_a_credential():
    assert scan('{"clientToken": "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"}', "input") == []


def test_name_value_lists_name_their_values():
    env = [{"name": "DB_PASSWORD", "value": "hunter2"}, {"name": "DB_HOST", "value": "db"}]
    assert scan(env, "environment") == [Finding("environment[0]", "password")]
    tags = [{"Key": "api_key", "Value": "k-123456"}]
    assert scan(tags, "tags") == [Finding("tags[0]", "api key")]


def test_findings_never_carry_the_value():
    [finding] = scan({"DB_PASSWORD": "hunter2"}, "env")
    assert "hunter2" not in repr(finding)


@pytest.mark.parametrize(
    "text, kind",
    [
        # An Iceberg REST catalog's OAuth2 client credentials or bearer token in the job's Spark parameters.
        ("--conf spark.sql.catalog.icefloe.credential=client-7:s3cr3t-value", "credential"),
        ("--conf spark.sql.catalog.icefloe.token=dapi0123456789abcdef", "token"),
        (
            '{"icefloe:catalog": {"type": "rest", "uri": "https://h", "credential": "client-7:s3cr3t-value"}}',
            "credential",
        ),
    ],
)
def test_a_rest_catalog_credential_in_plain_text_is_found(text, kind):
    assert kind in {f.kind for f in scan(text, "x")}


@pytest.mark.parametrize(
    "text",
    [
        f'{{"icefloe:catalog": {{"type": "rest", "uri": "https://h", "credential": {{"secretArn": "{SECRET_ARN}"}}}}}}',
        '{"icefloe:catalog": {"type": "rest", "uri": "https://h", "token": {"name": "unity-token"}}}',
        "--conf spark.sql.catalog.icefloe.uri=https://polaris.example/api/catalog",
    ],
)
def test_a_rest_catalog_credential_by_reference_is_not_reported(text):
    assert scan(text, "x") == []
