"""TLS material of secured clusters in a deployed stack (issue 32): the job role reads exactly the referenced secrets
(and, through Secrets Manager only, their KMS keys); the job's config, `icefloe plan` and the policy pack hold
references only, and the pack refuses a private key or password in plain text in config, arguments or Spark
parameters. Pulumi mocks, as tests/test_infra.py."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from icefloe.errors import ConfigError
from icefloe_policies.runner import Resource, run_pack
from pulumi_mocks import fake_jar_dir, run_program
from test_infra import policy_of
from test_policies import SAFE_ARGUMENTS, SCHEDULE, replace, safe_stack, schedule_props

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = ROOT / "examples" / "Pulumi.minimal.yaml"
ICEFLOE = Path(sys.executable).with_name("icefloe")
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:icefloe/{}-AbCdEf"
PEM_KEY = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQI\n-----END ENCRYPTED PRIVATE KEY-----\n"


@pytest.fixture(autouse=True)
def _collect_after_programs():
    yield
    gc.collect()


def _tls_stack(tmp_path: Path, tls: dict, registry_tls: dict | None = None) -> Path:
    document = yaml.safe_load(MINIMAL.read_text())
    cluster = document["config"]["icefloe:sourceClusters"][0]
    cluster |= {"securityProtocol": "SSL", "tls": tls}
    if registry_tls is not None:
        cluster["schemaRegistry"]["tls"] = registry_tls
    path = tmp_path / "Pulumi.tls.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _refs(*names: str) -> dict:
    keys = ("caCertificate", "clientCertificate", "clientKey", "clientKeyPassword")
    return {key: {"secretArn": ARN.format(name)} for key, name in zip(keys, names)}


@pytest.fixture(scope="module")
def tls_program(tmp_path_factory):
    path = _tls_stack(tmp_path_factory.mktemp("tls"), _refs("ca", "cert", "key", "keypass"), _refs("registry-ca"))
    return run_program(path)


def test_the_job_role_reads_exactly_the_tls_secrets_and_their_keys_through_secrets_manager(tls_program):
    job = policy_of(tls_program, "icefloe-job-role")
    expected = [ARN.format(name) for name in ("ca", "cert", "key", "keypass", "registry-ca")]
    assert job["KafkaCredentials"]["Resource"] == expected
    assert job["KafkaCredentialKeys"] == {
        "Sid": "KafkaCredentialKeys",
        "Effect": "Allow",
        "Action": ["kms:Decrypt"],
        "Resource": ["arn:aws:kms:us-east-1:123456789012:key/*"],
        "Condition": {
            "StringEquals": {"kms:ViaService": ["secretsmanager.us-east-1.amazonaws.com"]},
            "ForAnyValue:StringEquals": {"kms:EncryptionContext:SecretARN": expected},
        },
    }


def test_the_job_config_holds_the_references_and_the_pack_passes(tls_program):
    (config,) = [r for r in tls_program.of_type("aws:s3/bucketObjectv2:BucketObjectv2") if "content" in r.inputs]
    cluster = json.loads(config.inputs["content"])["config"]["icefloe:sourceClusters"][0]
    assert cluster["tls"]["clientKey"] == {"secretArn": ARN.format("key")}
    assert cluster["tls"]["endpointIdentification"] is True
    assert run_pack(tls_program) == [], "the whole pack passes: the config object's references are no credentials"


@pytest.mark.parametrize(
    "ref, message",
    [
        ({"name": "kafka-ca"}, "references TLS material by secretArn"),
        ({"env": "KAFKA_CA"}, "references TLS material by secretArn"),
    ],
)
def test_tls_references_a_deployed_stack_cannot_resolve_are_refused(tmp_path, ref, message):
    with pytest.raises(Exception) as raised:
        run_program(_tls_stack(tmp_path, {"caCertificate": ref}))
    assert message in str(raised.value) and "tls.caCertificate" in str(raised.value)


def test_a_plaintext_key_in_the_config_is_refused_by_the_spec(tmp_path):
    with pytest.raises(Exception) as raised:
        run_program(_tls_stack(tmp_path, {"clientCertificate": PEM_KEY, "clientKey": PEM_KEY}))
    assert "tls.clientKey" in str(raised.value) and "MIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQI" not in str(
        raised.value
    )


def test_icefloe_plan_shows_references_never_values(tmp_path):
    lib = tmp_path / "jvm-lib"
    fake_jar_dir(lib / "spark")
    path = _tls_stack(tmp_path, _refs("ca", "cert", "key", "keypass"))
    done = subprocess.run(
        [str(ICEFLOE), "plan", "--config", str(path), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "ICEFLOE_JVM_LIB": str(lib)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert ARN.format("key") in done.stdout and "PRIVATE KEY" not in done.stdout
    assert json.loads(done.stdout)["violations"] == []


# -- the policy pack


def _config_object(content: dict) -> Resource:
    return Resource(
        "aws:s3/bucketObjectv2:BucketObjectv2",
        "job-config",
        {"bucket": "lake", "key": "icefloe/config/x.json", "content": json.dumps(content)},
    )


@pytest.mark.parametrize(
    "case, resource",
    [
        (
            "a PEM key in the job's config object",
            _config_object({"config": {"icefloe:sourceClusters": [{"name": "c", "tls": {"clientKey": PEM_KEY}}]}}),
        ),
        (
            "a key password in the job's config object",
            _config_object(
                {"config": {"icefloe:sourceClusters": [{"name": "c", "tls": {"clientKeyPassword": "hunter2!"}}]}}
            ),
        ),
        (
            "a key in a job argument",
            Resource(SCHEDULE, "stock-trades", schedule_props([*SAFE_ARGUMENTS, "--ssl-key", PEM_KEY])),
        ),
        (
            "a key password in a Spark parameter",
            Resource(
                SCHEDULE,
                "stock-trades",
                schedule_props([*SAFE_ARGUMENTS, "--conf", "spark.kafka.ssl.key.password=hunter2!"]),
            ),
        ),
        (
            "a keystore password in a Spark parameter",
            Resource(
                SCHEDULE,
                "stock-trades",
                schedule_props([*SAFE_ARGUMENTS, "--conf", "spark.kafka.ssl.keystore.password=hunter2!"]),
            ),
        ),
    ],
)
def test_the_pack_refuses_private_keys_and_passwords_in_plain_text(case, resource):
    stack = (
        replace(safe_stack(), "stock-trades", resource)
        if resource.name == "stock-trades"
        else [*safe_stack(), resource]
    )
    violations = run_pack(stack)
    assert {v.policy for v in violations} == {"no-plaintext-credentials"}, case
    assert not any("hunter2" in v.message or "MIIFHDBOB" in v.message for v in violations)


def test_the_pack_lets_a_config_object_of_references_pass():
    refs = {
        "config": {
            "icefloe:sourceClusters": [
                {
                    "name": "c",
                    "credentialsSecret": {"secretArn": ARN.format("k")},
                    "tls": _refs("ca", "cert", "key", "keypass") | {"endpointIdentification": True},
                }
            ]
        }
    }
    assert run_pack([*safe_stack(), _config_object(refs)]) == []


def test_spec_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="clientCertificate and clientKey go together"):
        from icefloe.spec import parse_config

        parse_config(
            {
                "sourceClusters": [
                    {
                        "name": "c",
                        "bootstrapServers": "b:1",
                        "securityProtocol": "SSL",
                        "tls": {"clientKey": {"env": "K"}},
                    }
                ]
            }
        )
