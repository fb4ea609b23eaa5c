"""Stack config: Pulumi.yaml's declarations, and the program's validation of `icefloe:*` keys with the key named."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import yaml

from icefloe.errors import ConfigError
from icefloe.spec import CONFIG_KEYS, DEPLOYMENT_KEYS
from icefloe_infra.deployment import load_stack_config
from pulumi_mocks import PROJECT_FILE, decrypted_value, run_program, stack_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "Pulumi.example.yaml"
MINIMAL = ROOT / "examples" / "Pulumi.minimal.yaml"
# Pulumi's project schema (sdk/go/common/workspace/project.json): config types and their items.
PULUMI_CONFIG_TYPES = {"string", "integer", "boolean", "array"}
PULUMI_DECLARATION_KEYS = {"type", "items", "description", "secret", "default", "value"}


@pytest.fixture(autouse=True)
def _collect_after_failed_programs():
    yield
    gc.collect()  # an expected registration failure leaves coroutines behind; collect them here, not in a later test


def raw_config(path: Path = EXAMPLE) -> dict:
    """The `icefloe:*` keys of a stack file as the program receives them (defaults applied, JSON decoded)."""
    _, config, _ = stack_config(path)
    return {
        k.split(":", 1)[1]: json.loads(v) if v[:1] in "[{" else v for k, v in config.items() if k.startswith("icefloe:")
    }


def write_stack(tmp_path: Path, name: str, base: Path, **changes) -> Path:
    document = yaml.safe_load(base.read_text())
    for key, value in changes.items():
        if value is None:
            document["config"].pop(f"icefloe:{key}", None)
        else:
            document["config"][f"icefloe:{key}"] = value
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_pulumi_yaml_declares_every_key_in_a_shape_pulumi_accepts():
    project = yaml.safe_load(PROJECT_FILE.read_text())
    assert project["main"] == "infra/" and project["runtime"]["name"] == "python"
    assert project["runtime"]["options"] == {"toolchain": "pip", "virtualenv": ".venv"}
    declared = project["config"]
    # Every key the program reads is declared, and nothing else (icefloe:catalog belongs to the stack).
    assert {k.removeprefix("icefloe:") for k in declared} == (set(CONFIG_KEYS) - {"catalog"}) | set(DEPLOYMENT_KEYS)
    for key, declaration in declared.items():
        assert set(declaration) <= PULUMI_DECLARATION_KEYS, key
        assert declaration.get("description"), key
        if "type" in declaration:  # Pulumi rejects "object", and arrays without items
            assert declaration["type"] in PULUMI_CONFIG_TYPES, key
            assert declaration["type"] != "array" or "items" in declaration, key
    required = {k for k, d in declared.items() if "default" not in d}
    assert required == {"icefloe:sourceClusters", "icefloe:owner"}


def test_typed_declarations_accept_the_example_values():
    declared = yaml.safe_load(PROJECT_FILE.read_text())["config"]
    for path in (EXAMPLE, MINIMAL):
        values = yaml.safe_load(path.read_text())["config"]
        for key, declaration in declared.items():
            if key in values and declaration.get("type") == "string":
                assert isinstance(values[key], str), (path.name, key)
            if key in values and declaration.get("type") == "integer":
                assert isinstance(values[key], int), (path.name, key)


def test_project_defaults_are_applied_and_required_keys_enforced(tmp_path):
    _, config, secret_keys = stack_config(MINIMAL)
    assert config["icefloe:logRetentionDays"] == "30"
    assert json.loads(config["icefloe:externalAccess"]) == [] and secret_keys == []
    no_owner = write_stack(tmp_path, "noowner", MINIMAL, owner=None)
    with pytest.raises(ConfigError, match=r"Stack 'noowner' is missing configuration value\(s\) icefloe:owner"):
        stack_config(no_owner)


def test_secure_values_arrive_decrypted_and_their_key_secret():
    _, config, secret_keys = stack_config(EXAMPLE)
    assert secret_keys == ["icefloe:secrets"]
    ciphertext = yaml.safe_load(EXAMPLE.read_text())["config"]["icefloe:secrets"]["registry"]["password"]["secure"]
    assert json.loads(config["icefloe:secrets"])["registry"]["password"] == decrypted_value(ciphertext)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"emr": {"releaseLabel": "emr-6.15.0"}},
            r"icefloe:emr\.releaseLabel: 'emr-6\.15\.0' is not a release icefloe runs on: use emr-7\.1\.0 or a later emr-7\.x",
        ),
        (
            {"emr": {"releaseLabel": "emr-7.0.0"}},
            r"icefloe:emr\.releaseLabel: 'emr-7\.0\.0' is not a release icefloe runs on",
        ),
        ({"emr": {"imageUri": "docker.io/me/spark:latest"}}, r"icefloe:emr\.imageUri: String should match pattern"),
        ({"tabels": []}, r"unknown key\(s\) icefloe:tabels"),
        ({"catalog": {"type": "glue", "warehouse": "s3://b/w"}}, r"icefloe:catalog is set by the stack"),
        ({"owner": ""}, r"icefloe:owner: String should have at least 1 character"),
        ({"logRetentionDays": 31}, r"icefloe:logRetentionDays: CloudWatch Logs accepts one of"),
        (
            {"schedule": {"maximumEventAge": "10s"}},
            r"icefloe:schedule\.maximumEventAge: maximumEventAge must be between 60s",
        ),
        ({"storage": {"existingBucket": "corp-lake"}}, r"icefloe:storage: existingBucket needs existingKmsKeyArn"),
        (
            {"externalAccess": [{"name": "x", "principalArn": "arn:aws:iam::1:root"}]},
            r"icefloe:externalAccess\[0\]\.principalArn",
        ),
        (
            {"secrets": {}},
            r"icefloe:sourceClusters\[0\] \(main\)\.schemaRegistry\.credentialsSecret: names secret 'registry'",
        ),
    ],
)
def test_bad_stack_config_fails_naming_the_key(change, message):
    raw = raw_config()
    for key, value in change.items():
        if value is None:
            raw.pop(key)
        else:
            raw[key] = {**raw[key], **value} if key in ("emr",) and value else value
    with pytest.raises(ConfigError, match=message):
        load_stack_config(raw)


def test_a_table_typo_is_named_by_the_shared_model():
    raw = raw_config()
    raw["tables"] = [{**raw["tables"][0], "partitonBy": ["day(x)"]}]
    with pytest.raises(ConfigError, match=r"icefloe:tables\[0\] \(stock_trades\)\.partitonBy: Extra inputs"):
        load_stack_config(raw)


def test_without_emr_settings_the_stack_runs_on_the_release_python():
    raw = raw_config(MINIMAL)
    assert raw["emr"] == {}  # the stack sets none: Pulumi.yaml's default
    _, deployment = load_stack_config(raw)
    emr = deployment.emr
    assert (emr.release_label, emr.image_uri, emr.python) == ("emr-7.12.0", None, "/usr/bin/python3.11")
    # Continuous tables need EMR Serverless streaming jobs (7.1.0 and later): every accepted release has them.
    raw["emr"] = {"releaseLabel": "emr-7.1.0"}
    raw["tables"] = [{**raw["tables"][0], "continuous": True}]
    assert load_stack_config(raw)[1].emr.release_label == "emr-7.1.0"


def test_the_program_itself_rejects_a_bad_stack_file(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("format: avro", "format: avr", 1))
    with pytest.raises(
        ConfigError, match=r"Pulumi\.bad\.yaml: invalid icefloe config:\n.*icefloe:tables\[0\] \(stock_trades\)\.format"
    ):
        run_program(bad)
    typo = write_stack(tmp_path, "typo", MINIMAL, tabels=[{"sourceCluster": "events", "topic": "x"}])
    with pytest.raises(ConfigError, match=r"unknown key\(s\) icefloe:tabels"):
        run_program(typo)


def test_the_password_never_shows_in_the_validated_model():
    _, deployment = load_stack_config(raw_config())
    secret = deployment.secrets["registry"]
    assert secret.password.get_secret_value() == decrypted_value(
        yaml.safe_load(EXAMPLE.read_text())["config"]["icefloe:secrets"]["registry"]["password"]["secure"]
    )
    assert secret.password.get_secret_value() not in repr(deployment) + str(secret)


def test_the_jobs_jvm_option_goes_to_the_driver_and_executors_and_is_one_option():
    """`job.javaOption` (e.g. C1 only, bench/results/cold_start.md): one option, since EMR Serverless takes the Spark
    settings as one space-separated string; none by default, so EMR's own extraJavaOptions stand."""
    from pydantic import ValidationError

    from icefloe.spec import CatalogSpec
    from icefloe_infra.deployment import EmrSpec
    from icefloe_infra.jobs import spark_submit_parameters

    glue = CatalogSpec(type="glue", warehouse="s3://b/w")

    def conf(job: dict) -> str:
        return spark_submit_parameters(glue, "s3://b/bundle.tar.gz", [], EmrSpec.model_validate({"job": job}))

    assert "extraJavaOptions" not in conf({})
    parameters = conf({"javaOption": "-XX:TieredStopAtLevel=1"})
    assert "--conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1" in parameters
    assert "--conf spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1" in parameters
    for bad in ("-XX:TieredStopAtLevel=1 -XX:+UseParallelGC", "-Dx=$(id)", "TieredStopAtLevel=1"):
        with pytest.raises(ValidationError, match="javaOption"):
            conf({"javaOption": bad})
