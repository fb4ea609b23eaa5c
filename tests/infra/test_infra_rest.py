"""A stack whose tables live in an Iceberg REST catalog (`icefloe:catalog: {type: rest}`), under Pulumi's mocks: the
job reads the catalog's URI and its credential's secret by ARN, and its role may read exactly that secret."""

from __future__ import annotations

import json

import pytest
import yaml

from icefloe.errors import ConfigError
from icefloe.spec import load_config
from pulumi_mocks import run_program
from test_infra import MINIMAL, OBJECT, policy_of, spark_conf

CREDENTIAL_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:icefloe/polaris-AbCdEf"
POLARIS = {
    "type": "rest",
    "uri": "https://acme.snowflakecomputing.com/polaris/api/catalog",
    "warehouse": "lake",
    "credential": {"secretArn": CREDENTIAL_ARN},
    "scope": "PRINCIPAL_ROLE:ALL",
}


def stack_with(tmp_path, catalog: dict, **extra):
    document = yaml.safe_load(MINIMAL.read_text())
    document["config"]["icefloe:catalog"] = catalog
    document["config"].update(extra)
    path = tmp_path / "Pulumi.rest.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_a_rest_catalog_reaches_the_job_by_uri_and_secret_arn(tmp_path):
    run = run_program(stack_with(tmp_path, POLARIS))
    body = next(o for o in run.of_type(OBJECT) if o.name == "icefloe-runtime-job-config").inputs["content"]
    (tmp_path / "job.json").write_text(body)
    catalog = load_config(str(tmp_path / "job.json")).catalog  # the runtime's own loader
    assert catalog.type == "rest" and catalog.uri == POLARIS["uri"] and catalog.warehouse == "lake"
    assert catalog.credential.secret_arn == CREDENTIAL_ARN
    assert run.of_type("aws:glue/catalogDatabase:CatalogDatabase") == []  # the REST catalog owns its namespaces
    job = policy_of(run, "icefloe-job-role")
    readable = [s for s in job.values() if s["Action"] == ["secretsmanager:GetSecretValue"]]
    assert [CREDENTIAL_ARN] == [arn for s in readable for arn in s["Resource"] if "polaris" in arn]
    # The job's Spark settings name the catalog, never its secret.
    schedules = run.of_type("aws:scheduler/schedule:Schedule")
    assert schedules
    for schedule in schedules:
        target = json.loads(schedule.inputs["target"]["input"])
        conf = spark_conf(target["JobDriver"]["SparkSubmit"]["SparkSubmitParameters"])
        assert conf["spark.sql.catalog.icefloe.uri"] == POLARIS["uri"]
        assert not any(k.endswith((".credential", ".token")) for k in conf)
    # Snowflake reads the tables through a REST catalog integration on the same catalog, the credential left out.
    snowflake = run.outputs["snippets"]["snowflake"]
    assert "CATALOG_SOURCE = ICEBERG_REST" in snowflake and f"CATALOG_URI = '{POLARIS['uri']}'" in snowflake
    assert "CATALOG_NAME = 'lake'" in snowflake and "OAUTH_ALLOWED_SCOPES = ('PRINCIPAL_ROLE:ALL')" in snowflake
    assert CREDENTIAL_ARN not in snowflake and set(run.outputs["snippets"]) == {"snowflake"}


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        (POLARIS | {"credential": {"env": "POLARIS"}}, r"icefloe:catalog\.credential: env is for local runs"),
        (POLARIS | {"credential": {"name": "nope"}}, r"icefloe:catalog\.credential: names secret 'nope'"),
        ({"type": "glue", "warehouse": "s3://b/w"}, r"icefloe:catalog is set by the stack"),
    ],
)
def test_rest_credentials_in_a_stack_are_secret_references(tmp_path, catalog, message):
    from icefloe.spec import namespaced, read_stack_file
    from icefloe_infra.deployment import load_stack_config

    with pytest.raises(ConfigError, match=message):
        load_stack_config(namespaced(read_stack_file(str(stack_with(tmp_path, catalog)))))
