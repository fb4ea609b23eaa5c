"""The program's resource inputs replayed against the AWS APIs (moto, in-process), so botocore checks their shapes.

Each call takes the exact values the program registered under Pulumi's mocks (trust and permission policies,
encryption, lifecycle, the Glue database, the EMR application, the schedules and, per schedule, its payload as a
real StartJobRun). Besides botocore's own validation, `check_constraints` holds every string and number to the
length, pattern and range limits of the service model, which botocore does not enforce on the client.
"""

from __future__ import annotations

import gc
import json
import re
from pathlib import Path

import pytest

try:  # the service models' patterns are Java regexes (\p{...} classes); `regex` reads them, `re` mostly does
    import regex as pattern_engine
except ImportError:  # pragma: no cover
    pattern_engine = re

from icefloe.spec import load_config
from icefloe_infra.jobs import EXECUTION_ID
from pulumi_mocks import REGION, run_program

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "Pulumi.example.yaml"
SCHEDULER_EXECUTION_ID = "d32c5kddcf5bb8c3"  # the shape of an ID the Scheduler puts in <aws.scheduler.execution-id>

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")


@pytest.fixture(autouse=True)
def _collect():
    yield
    gc.collect()


@pytest.fixture(scope="module")
def program():
    return run_program(EXAMPLE)


@pytest.fixture
def aws(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        yield


def client(service: str):
    return boto3.client(service, region_name=REGION)


def check_constraints(shape, value, where: str = "") -> None:
    """Lengths, patterns and ranges from the service model (botocore validates types and minimums only)."""
    meta = shape.metadata
    if shape.type_name == "structure":
        for key, item in value.items():
            check_constraints(shape.members[key], item, f"{where}.{key}")
    elif shape.type_name == "list":
        assert len(value) <= meta.get("max", len(value)), where
        for index, item in enumerate(value):
            check_constraints(shape.member, item, f"{where}[{index}]")
    elif shape.type_name == "map":
        for key, item in value.items():
            check_constraints(shape.value, item, f"{where}[{key}]")
    elif shape.type_name == "string":
        assert meta.get("min", 0) <= len(value) <= meta.get("max", len(value)), (where, len(value))
        if "pattern" in meta:
            try:
                compiled = pattern_engine.compile(meta["pattern"], pattern_engine.DOTALL)
            except Exception:  # a pattern this engine cannot read is left to the service
                compiled = None
            assert compiled is None or compiled.fullmatch(value), (where, meta["pattern"], value[:80])
        if shape.enum:
            assert value in shape.enum, (where, value)
    elif shape.type_name in ("integer", "long"):
        assert meta.get("min", value) <= value <= meta.get("max", value), (where, value)


def call(service_client, operation: str, **params):
    """Check the parameters against the model, then make the call (botocore validates again and sends it)."""
    model = service_client.meta.service_model
    name = next(op for op in model.operation_names if service_client.meta.method_to_api_mapping.get(operation) == op)
    check_constraints(model.operation_model(name).input_shape, params, operation)
    return getattr(service_client, operation)(**params)


def api_shape(value):
    """Scheduler universal-target input (API member names, PascalCase) to boto3's parameters (camelCase here)."""
    if isinstance(value, dict):
        return {key[0].lower() + key[1:]: api_shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [api_shape(item) for item in value]
    return value


def monitoring_api_shape(monitoring: dict) -> dict:
    """The provider spells CloudWatch `cloudwatch`; the API `cloudWatch`."""
    renamed = {"cloudwatchLoggingConfiguration": "cloudWatchLoggingConfiguration"}
    return {renamed.get(key, key): value for key, value in monitoring.items()}


def ints(value):
    """Pulumi's mocks hand numbers over as floats; the APIs want integers."""
    if isinstance(value, dict):
        return {k: ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [ints(v) for v in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def test_storage_glue_logs_and_secrets_are_accepted(program, aws):
    key_arn = call(client("kms"), "create_key", Description=program.one("aws:kms/key:Key").inputs["description"])[
        "KeyMetadata"
    ]["Arn"]
    client("kms").enable_key_rotation(KeyId=key_arn)
    assert client("kms").get_key_rotation_status(KeyId=key_arn)["KeyRotationEnabled"]

    s3 = client("s3")
    bucket = program.outputs["bucket"]
    tags = program.one("aws:s3/bucket:Bucket").inputs["tags"]
    call(s3, "create_bucket", Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    call(s3, "put_bucket_tagging", Bucket=bucket, Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]})
    (rule,) = program.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs["rules"]
    call(
        s3,
        "put_bucket_encryption",
        Bucket=bucket,
        ServerSideEncryptionConfiguration={
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {
                        "SSEAlgorithm": rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"],
                        "KMSMasterKeyID": key_arn,
                    },
                    "BucketKeyEnabled": rule["bucketKeyEnabled"],
                }
            ]
        },
    )
    block = program.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    call(
        s3,
        "put_public_access_block",
        Bucket=bucket,
        PublicAccessBlockConfiguration={
            k[0].upper() + k[1:]: block[k]
            for k in ("blockPublicAcls", "ignorePublicAcls", "blockPublicPolicy", "restrictPublicBuckets")
        },
    )
    versioning = program.one("aws:s3/bucketVersioning:BucketVersioning").inputs["versioningConfiguration"]
    call(s3, "put_bucket_versioning", Bucket=bucket, VersioningConfiguration={"Status": versioning["status"]})
    call(
        s3, "put_bucket_policy", Bucket=bucket, Policy=program.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"]
    )
    lifecycle = program.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    rules = []
    for item in lifecycle:
        rule_ = {"ID": item["id"], "Status": item["status"], "Filter": {"Prefix": item["filter"]["prefix"]}}
        if "abortIncompleteMultipartUpload" in item:
            rule_["AbortIncompleteMultipartUpload"] = {
                "DaysAfterInitiation": int(item["abortIncompleteMultipartUpload"]["daysAfterInitiation"])
            }
        if "noncurrentVersionExpiration" in item:
            rule_["NoncurrentVersionExpiration"] = {
                "NoncurrentDays": int(item["noncurrentVersionExpiration"]["noncurrentDays"])
            }
        rules.append(rule_)
    call(s3, "put_bucket_lifecycle_configuration", Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    stored = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert stored["ApplyServerSideEncryptionByDefault"]["KMSMasterKeyID"] == key_arn and stored["BucketKeyEnabled"]
    assert json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])["Statement"][0]["Effect"] == "Deny"
    assert {r["ID"] for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]} == {
        "abort-incomplete-multipart-uploads",
        "expire-old-versions",
    }

    glue = client("glue")
    for database in program.of_type("aws:glue/catalogDatabase:CatalogDatabase"):
        call(
            glue,
            "create_database",
            DatabaseInput={
                "Name": database.inputs["name"],
                "Description": database.inputs["description"],
                "LocationUri": database.inputs["locationUri"],
            },
            Tags=database.inputs["tags"],
        )
    assert glue.get_database(Name="main")["Database"]["LocationUri"] == program.outputs["warehouseUri"] + "/main.db"

    logs = client("logs")
    group = program.one("aws:cloudwatch/logGroup:LogGroup")
    call(logs, "create_log_group", logGroupName=group.outputs["name"], tags=group.inputs["tags"])
    call(
        logs,
        "put_retention_policy",
        logGroupName=group.outputs["name"],
        retentionInDays=int(group.inputs["retentionInDays"]),
    )

    secrets = client("secretsmanager")
    secret = program.one("aws:secretsmanager/secret:Secret").inputs
    version = program.one("aws:secretsmanager/secretVersion:SecretVersion").inputs
    created = call(
        secrets,
        "create_secret",
        Name="icefloe-registry",
        Description=secret["description"],
        KmsKeyId=key_arn,
        SecretString=version["secretString"],
        Tags=[{"Key": k, "Value": v} for k, v in secret["tags"].items()],
    )
    assert json.loads(secrets.get_secret_value(SecretId=created["ARN"])["SecretString"]).keys() == {
        "username",
        "password",
    }


def test_roles_and_policies_are_accepted_verbatim(program, aws):
    iam = client("iam")
    for role in program.of_type("aws:iam/role:Role"):
        call(
            iam,
            "create_role",
            RoleName=role.name,
            AssumeRolePolicyDocument=role.inputs["assumeRolePolicy"],
            MaxSessionDuration=int(role.inputs.get("maxSessionDuration", 3600)),
            Tags=[{"Key": k, "Value": v} for k, v in role.inputs["tags"].items()],
        )
    for attached in program.of_type("aws:iam/rolePolicy:RolePolicy"):
        call(
            iam,
            "put_role_policy",
            RoleName=attached.inputs["role"],
            PolicyName=attached.name,
            PolicyDocument=attached.inputs["policy"],
        )
    for role in program.of_type("aws:iam/role:Role"):
        stored = iam.get_role(RoleName=role.name)["Role"]["AssumeRolePolicyDocument"]
        assert stored == json.loads(role.inputs["assumeRolePolicy"])
    assert len(iam.list_role_policies(RoleName="icefloe-job-role")["PolicyNames"]) == 1


def test_emr_application_schedules_and_every_job_run_are_accepted(program, aws):
    app = ints(program.one("aws:emrserverless/application:Application").inputs)
    emr = client("emr-serverless")
    created = call(
        emr,
        "create_application",
        name="icefloe",
        clientToken="replay",
        # The provider documents lowercase "spark" and the service takes either case; moto knows only "SPARK".
        type=app["type"].upper(),
        releaseLabel=app["releaseLabel"],
        architecture=app["architecture"],
        autoStartConfiguration=app["autoStartConfiguration"],
        autoStopConfiguration=app["autoStopConfiguration"],
        maximumCapacity=app["maximumCapacity"],
        monitoringConfiguration=monitoring_api_shape(app["monitoringConfiguration"]),
        tags=app["tags"],
    )
    application_id = created["applicationId"]
    assert emr.get_application(applicationId=application_id)["application"]["autoStopConfiguration"] == {
        "enabled": True,
        "idleTimeoutMinutes": 15,
    }

    sqs = client("sqs")
    queue = ints(program.one("aws:sqs/queue:Queue").inputs)
    call(
        sqs,
        "create_queue",
        QueueName="icefloe-schedules-dlq",
        Attributes={"MessageRetentionPeriod": str(queue["messageRetentionSeconds"]), "SqsManagedSseEnabled": "true"},
    )

    scheduler = client("scheduler")
    for schedule in program.of_type("aws:scheduler/schedule:Schedule"):
        inputs = ints(schedule.inputs)
        target = inputs["target"]
        call(
            scheduler,
            "create_schedule",
            Name=schedule.name,
            Description=inputs["description"],
            ScheduleExpression=inputs["scheduleExpression"],
            State=inputs["state"],
            FlexibleTimeWindow={"Mode": inputs["flexibleTimeWindow"]["mode"]},
            Target={
                "Arn": target["arn"],
                "RoleArn": target["roleArn"],
                "Input": target["input"],
                "RetryPolicy": {
                    "MaximumRetryAttempts": target["retryPolicy"]["maximumRetryAttempts"],
                    "MaximumEventAgeInSeconds": target["retryPolicy"]["maximumEventAgeInSeconds"],
                },
                "DeadLetterConfig": {"Arn": target["deadLetterConfig"]["arn"]},
            },
        )

        # What the Scheduler does at each firing: fill in the context attribute, call StartJobRun with the input.
        assert target["input"].count(EXECUTION_ID) == 1
        request = api_shape(json.loads(target["input"].replace(EXECUTION_ID, SCHEDULER_EXECUTION_ID)))
        request["applicationId"] = application_id  # moto's, in place of the mocks'
        run = call(emr, "start_job_run", **request)
        job = emr.get_job_run(applicationId=application_id, jobRunId=run["jobRunId"])["jobRun"]
        assert (
            job["jobDriver"]["sparkSubmit"]["entryPointArguments"]
            == request["jobDriver"]["sparkSubmit"]["entryPointArguments"]
        )
        again = call(emr, "start_job_run", **request)  # a retried delivery of the same firing: same token
        assert again["jobRunId"]
    assert {s["Name"] for s in scheduler.list_schedules()["Schedules"]} == {
        s.name for s in program.of_type("aws:scheduler/schedule:Schedule")
    }


def test_an_application_on_your_own_image_is_accepted(aws, tmp_path):
    import yaml

    document = yaml.safe_load(EXAMPLE.read_text())
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/icefloe-emr:7.12.0-py311"
    document["config"]["icefloe:emr"] = {"imageUri": image}
    path = tmp_path / "Pulumi.image.yaml"
    path.write_text(yaml.safe_dump(document))
    app = ints(run_program(path).one("aws:emrserverless/application:Application").inputs)
    emr = client("emr-serverless")
    created = call(
        emr,
        "create_application",
        name="icefloe",
        clientToken="replay",
        type=app["type"].upper(),
        releaseLabel=app["releaseLabel"],
        imageConfiguration=app["imageConfiguration"],
        maximumCapacity=app["maximumCapacity"],
    )
    assert app["imageConfiguration"] == {"imageUri": image}  # checked against the model's pattern by `call`
    assert emr.get_application(applicationId=created["applicationId"])["application"]["releaseLabel"] == "emr-7.12.0"


def test_the_runtime_reads_its_config_object_from_s3(program, aws):
    s3 = client("s3")
    bucket = program.outputs["bucket"]
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    for obj in program.of_type("aws:s3/bucketObjectv2:BucketObjectv2"):
        body = obj.inputs.get("content") or Path(obj.inputs["source"]["asset"]).read_bytes()
        call(
            s3,
            "put_object",
            Bucket=obj.inputs["bucket"],
            Key=obj.inputs["key"],
            Body=body,
            ContentType=obj.inputs["contentType"],
        )
    config = load_config(program.outputs["jobConfigUri"])  # the runtime's loader, through boto3 against moto
    assert config.catalog.warehouse == program.outputs["warehouseUri"]
    assert [config.identifier(t) for t in config.tables] == program.outputs["tables"]
    entry = json.loads(program.of_type("aws:scheduler/schedule:Schedule")[0].inputs["target"]["input"])
    entry_point = entry["JobDriver"]["SparkSubmit"]["EntryPoint"].removeprefix(f"s3://{bucket}/")
    assert b"from icefloe.cli import main" in s3.get_object(Bucket=bucket, Key=entry_point)["Body"].read()


def test_the_constraint_check_catches_what_botocore_lets_through(program, aws):
    request = api_shape(json.loads(program.of_type("aws:scheduler/schedule:Schedule")[0].inputs["target"]["input"]))
    shape = client("emr-serverless").meta.service_model.operation_model("StartJobRun").input_shape
    # Unsubstituted, the placeholder is no valid client token: only the Scheduler's substitution makes it one.
    with pytest.raises(AssertionError, match="clientToken"):
        check_constraints(shape, request, "StartJobRun")
    with pytest.raises(AssertionError, match="executionTimeoutMinutes"):
        check_constraints(shape, {**request, "clientToken": "x", "executionTimeoutMinutes": -1}, "StartJobRun")
    check_constraints(shape, {**request, "clientToken": SCHEDULER_EXECUTION_ID}, "StartJobRun")
