"""The Pulumi program under Pulumi's mocks (the CLI and AWS provider cannot run here), and its inputs replayed
against moto so botocore checks the AWS API shapes."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from icefloe.cli import build_parser
from icefloe.errors import ConfigError
from icefloe.spec import load_config
from icefloe_infra import emr as emr_module
from icefloe_infra import iam as iam_module
from icefloe_infra.bundle import build_bundle
from icefloe_infra.deployment import load_stack_config
from icefloe_infra.testing import ACCOUNT_ID, run_program, stack_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "Pulumi.example.yaml"
PASSWORD = "registry-password-set-with-pulumi-config-secret"


@pytest.fixture(scope="module")
def program():
    return run_program(EXAMPLE)


def doc(value):
    return json.loads(value) if isinstance(value, str) else value


def statements(resource) -> list[dict]:
    policy = doc(resource.inputs.get("policy") or resource.inputs.get("assumeRolePolicy"))
    return policy["Statement"]


def test_lakehouse_bucket_is_encrypted_private_versioned_and_tls_only(program):
    bucket = program.one("aws:s3/bucket:Bucket")
    key = program.one("aws:kms/key:Key")
    assert key.inputs["enableKeyRotation"] is True
    rule = program.one("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration").inputs["rules"][0]
    assert rule["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": key.outputs["arn"]}
    assert rule["bucketKeyEnabled"] is True
    block = program.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    assert program.one("aws:s3/bucketVersioning:BucketVersioning").inputs["versioningConfiguration"]["status"] == "Enabled"
    (deny,) = statements(program.one("aws:s3/bucketPolicy:BucketPolicy"))
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == [bucket.outputs["arn"], bucket.outputs["arn"] + "/*"]
    rules = {r["id"]: r for r in program.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]}
    assert rules["abort-incomplete-multipart-uploads"]["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 7
    assert rules["expire-old-versions"]["noncurrentVersionExpiration"]["noncurrentDays"] == 30
    assert bucket.inputs["tags"]["icefloe:stack"] == "example" and bucket.inputs["tags"]["icefloe:owner"]


def test_glue_database_per_cluster_points_at_the_warehouse(program):
    (database,) = program.of_type("aws:glue/catalogDatabase:CatalogDatabase")
    assert database.inputs["name"] == "main"
    assert database.inputs["locationUri"] == program.outputs["warehouseUri"] + "/main.db"
    assert database.inputs["tags"]["icefloe:stack"] == "example"


def test_external_roles_trust_exactly_the_principal_and_require_the_external_id(program):
    roles = {r.name: r for r in program.of_type("aws:iam/role:Role")}
    (snowflake,) = statements(roles["icefloe-snowflake-role"])
    assert snowflake == {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::210987654321:user/snowflake-integration"},
                         "Action": "sts:AssumeRole", "Condition": {"StringEquals": {"sts:ExternalId": "MYORG_SFCRole=2_abcdefg"}}}
    (athena,) = statements(roles["icefloe-athena-analytics-role"])
    generated = program.outputs["externalIds"]["athena-analytics"]
    assert athena["Principal"] == {"AWS": "arn:aws:iam::111122223333:role/analytics-athena"}
    assert athena["Condition"] == {"StringEquals": {"sts:ExternalId": generated}} and len(generated) >= 16
    (job,) = statements(roles["icefloe-job-role"])
    assert job["Principal"] == {"Service": "emr-serverless.amazonaws.com"}
    assert job["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT_ID}}


def test_no_statement_grants_wildcard_actions_and_every_resource_is_scoped(program):
    bucket_arn = program.one("aws:s3/bucket:Bucket").outputs["arn"]
    for policy in program.of_type("aws:iam/rolePolicy:RolePolicy"):
        for statement in statements(policy):
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert all("*" not in action for action in actions), (policy.name, actions)
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            assert "*" not in resources, (policy.name, statement)
            for arn in resources:
                if arn.startswith("arn:aws:s3"):
                    assert arn == bucket_arn or arn.startswith(bucket_arn + "/"), arn
    job = {s["Sid"]: s for s in statements(next(p for p in program.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == "icefloe-job-policy"))}
    assert job["WarehouseReadWrite"]["Resource"] == [f"{bucket_arn}/warehouse/*"]
    assert job["KafkaCredentials"]["Resource"][0].startswith("arn:aws:secretsmanager:eu-west-1:123456789012:secret:icefloe/kafka-main")
    assert job["JobLogs"]["Resource"][0].startswith("arn:aws:logs:")
    external = statements(next(p for p in program.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == "icefloe-snowflake-read"))
    assert all(not a.startswith(("s3:Put", "s3:Delete", "glue:Create", "glue:Update", "glue:Delete"))
               for s in external for a in s["Action"])  # fmt: skip


def test_emr_application_is_bounded_and_logs_to_the_bucket_and_cloudwatch(program):
    app = program.one("aws:emrserverless/application:Application").inputs
    assert app["type"] == "spark" and re.match(r"emr-7\.\d+\.\d+$", app["releaseLabel"]) and app["architecture"] == "X86_64"
    assert app["autoStartConfiguration"]["enabled"] and app["autoStopConfiguration"] == {"enabled": True, "idleTimeoutMinutes": 15}
    assert app["maximumCapacity"] == {"cpu": "16 vCPU", "memory": "64 GB", "disk": "200 GB"}
    monitoring = app["monitoringConfiguration"]
    assert monitoring["s3MonitoringConfiguration"]["logUri"] == f"s3://{program.outputs['bucket']}/logs/"
    assert monitoring["cloudwatchLoggingConfiguration"]["enabled"] is True
    assert program.one("aws:cloudwatch/logGroup:LogGroup").inputs["retentionInDays"] == 30


def test_one_schedule_per_enabled_table_with_a_job_the_runtime_accepts(program, tmp_path):
    schedules = {s.inputs["description"].split()[-1]: s for s in program.of_type("aws:scheduler/schedule:Schedule")}
    assert set(schedules) == {"main.stock_trades", "main.accounts", "main.clickstream"}  # audit_log is disabled
    assert schedules["main.stock_trades"].inputs["scheduleExpression"] == "rate(15 minutes)"
    assert schedules["main.accounts"].inputs["scheduleExpression"] == "rate(5 minutes)"
    config_object = next(o for o in program.of_type("aws:s3/bucketObjectv2:BucketObjectv2") if o.name == "icefloe-job-config")
    for identifier, schedule in schedules.items():
        target = schedule.inputs["target"]
        assert target["arn"] == "arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun"
        assert target["retryPolicy"] == {"maximumRetryAttempts": 3, "maximumEventAgeInSeconds": 3600}
        assert target["deadLetterConfig"]["arn"].startswith("arn:aws:sqs:")
        request = json.loads(target["input"])
        assert request["ClientToken"] == "<aws.scheduler.execution-id>"
        assert request["ExecutionRoleArn"] == program.outputs["jobRoleArn"]
        assert request["ApplicationId"] == program.outputs["applicationId"]
        driver = request["JobDriver"]["SparkSubmit"]
        args = build_parser().parse_args(driver["EntryPointArguments"])  # the runtime's own parser accepts it
        assert args.command == "run" and args.table == [identifier] and args.json
        assert args.config == f"s3://{program.outputs['bucket']}/{config_object.inputs['key']}"
        assert args.continuous == (identifier == "main.clickstream") and request["Mode"] == ("STREAMING" if args.continuous else "BATCH")
        assert driver["EntryPoint"].endswith(f"/icefloe/bundle/{program.outputs['bundleDigest']}/main.py")
        assert "spark.sql.catalog.icefloe.type=glue" in driver["SparkSubmitParameters"]
        assert f"deps.tar.gz#deps" in driver["SparkSubmitParameters"]
    # The config the job reads is the validated spec on Glue, with the stack-created secret referenced by ARN.
    path = tmp_path / "job.json"
    path.write_text(config_object.inputs["content"])
    job_config = load_config(str(path))
    assert job_config.catalog.type == "glue" and job_config.catalog.warehouse == program.outputs["warehouseUri"]
    registry_ref = job_config.source_clusters[0].schema_registry.credentials_secret
    assert registry_ref.secret_arn and registry_ref.secret_arn.startswith("arn:aws:secretsmanager:")
    assert config_object.inputs["key"].startswith("icefloe/config/") and config_object.inputs["key"].endswith(".json")


def test_secrets_never_appear_in_plain_text_outside_the_secret_version(program):
    created = program.of_type("aws:secretsmanager/secretVersion:SecretVersion")
    assert len(created) == 1 and PASSWORD in created[0].inputs["secretString"]
    for resource in program:
        if resource is not created[0]:
            assert PASSWORD not in json.dumps(resource.inputs), resource.name
    assert PASSWORD not in json.dumps(program.outputs)


def test_outputs_name_everything_a_user_needs(program):
    outputs = program.outputs
    assert outputs["tables"] == ["main.stock_trades", "main.accounts", "main.clickstream", "main.audit_log"]
    assert outputs["glueDatabases"] == ["main"] and outputs["warehouseUri"].startswith("s3://")
    assert set(outputs["externalRoleArns"]) == {"snowflake", "athena-analytics"}
    snippets = outputs["snippets"]
    assert 'FROM "main"."stock_trades"' in snippets["athena"] and "iceberg_scan" in snippets["duckdb"]
    assert outputs["externalRoleArns"]["snowflake"] in snippets["snowflake"]


def test_bad_stack_config_fails_with_the_key_named(tmp_path):
    _, config = stack_config(EXAMPLE)
    raw = {k.split(":", 1)[1]: json.loads(v) if v[:1] in "[{" else v for k, v in config.items() if k.startswith("icefloe:")}
    broken = {**raw, "emr": {**raw["emr"], "releaseLabel": "emr-6.15.0"}}
    with pytest.raises(ConfigError, match=r"icefloe:emr\.releaseLabel: String should match pattern"):
        load_stack_config(broken)
    broken = {**raw, "tables": [{**raw["tables"][0], "partitonBy": ["day(x)"]}]}
    with pytest.raises(ConfigError, match=r"icefloe:tables\[0\] \(stock_trades\)\.partitonBy: Extra inputs"):
        load_stack_config(broken)
    broken = {**raw, "secrets": {}}
    with pytest.raises(ConfigError, match="names secret 'registry', which icefloe:secrets does not declare"):
        load_stack_config(broken)
    bad_file = tmp_path / "Pulumi.bad.yaml"
    bad_file.write_text(EXAMPLE.read_text().replace("format: avro", "format: avr", 1))
    with pytest.raises(Exception, match=r"icefloe:tables\[0\] \(stock_trades\)\.format"):
        run_program(bad_file)


def test_bundle_is_deterministic_and_has_the_entry_point(tmp_path):
    first = build_bundle(requirements=[], out_dir=tmp_path / "a")
    second = build_bundle(requirements=[], out_dir=tmp_path / "b")
    assert first.digest == second.digest, "same inputs, same bytes, same S3 key"
    with tarfile.open(first.archive) as tar:
        names = set(tar.getnames())
    assert {"./icefloe/cli.py", "./icefloe/materializer.py", "./icefloe/spec.py"} <= names
    assert not any("__pycache__" in n for n in names)
    entry = first.entry_point.read_text()
    assert 'sys.path.insert(0, "./deps")' in entry and "from icefloe.cli import main" in entry
    compile(entry, "main.py", "exec")


@pytest.mark.bundle
def test_real_bundle_holds_manylinux_cp311_wheels_for_the_architecture(tmp_path):
    bundle = build_bundle("X86_64", "3.11", out_dir=tmp_path)
    with tarfile.open(bundle.archive) as tar:
        names = tar.getnames()
    extensions = [n for n in names if n.endswith(".so")]
    assert any(n.startswith("./confluent_kafka/") for n in extensions)
    assert any(n.startswith("./pyarrow/") for n in extensions)
    assert any("pydantic_core" in n and "cpython-311-x86_64-linux-gnu" in n for n in extensions)
    wheels = [n for n in names if n.endswith(".dist-info/WHEEL")]
    with tarfile.open(bundle.archive) as tar:
        tags = {line for w in wheels for line in tar.extractfile(w).read().decode().splitlines() if line.startswith("Tag:")}
    assert any("cp311" in t and "manylinux" in t and "x86_64" in t for t in tags)
    assert not any("aarch64" in t or "macosx" in t or "win" in t for t in tags)
    assert not any(n.startswith("./pyspark/") for n in names), "EMR provides Spark"


def test_unsafe_variants_are_rejected_by_the_rule_that_names_them(monkeypatch):
    from icefloe_policies.runner import run_pack

    assert [v for v in run_pack(run_program(EXAMPLE)) if v.level == "mandatory"] == []

    def violations():
        return {v.policy for v in run_pack(run_program(EXAMPLE)) if v.level == "mandatory"}

    with monkeypatch.context() as patch:  # an external role without the ExternalId condition
        patch.setattr(iam_module, "external_trust", lambda principal, _id: iam_module.policy(
            {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": "sts:AssumeRole"}))  # fmt: skip
        assert "iam-external-trust-requires-external-id" in violations()
    with monkeypatch.context() as patch:  # a public bucket
        import pulumi_aws as aws

        real = aws.s3.BucketPublicAccessBlock
        patch.setattr(aws.s3, "BucketPublicAccessBlock", lambda name, **kw: real(name, **{**kw, "block_public_policy": False, "restrict_public_buckets": False}))
        assert "s3-bucket-public-access-block" in violations()
    with monkeypatch.context() as patch:  # a plaintext password in a job argument
        real_request = emr_module.start_job_run_request

        def leaky(**kw):
            request = real_request(**kw)
            request["JobDriver"]["SparkSubmit"]["EntryPointArguments"] += ["--sasl-password", "Tr0ub4dor&3xyz!"]
            return request

        patch.setattr("icefloe_infra.stack.start_job_run_request", leaky)
        assert "no-plaintext-credentials" in violations()


def test_program_inputs_replay_against_moto(program):
    """Feed the exact inputs the program declares to the AWS APIs (moto), so botocore checks their shapes."""
    boto3 = pytest.importorskip("boto3")
    from moto import mock_aws

    region = "eu-west-1"
    with mock_aws():
        kms = boto3.client("kms", region_name=region)
        key_arn = kms.create_key(Description=program.one("aws:kms/key:Key").inputs["description"])["KeyMetadata"]["Arn"]
        kms.enable_key_rotation(KeyId=key_arn)
        s3 = boto3.client("s3", region_name=region)
        bucket = program.outputs["bucket"]
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
        rule = program.one("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration").inputs["rules"][0]
        s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [{
            "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"],
                                                   "KMSMasterKeyID": key_arn},
            "BucketKeyEnabled": rule["bucketKeyEnabled"]}]})  # fmt: skip
        block = program.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
        s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
            "BlockPublicAcls": block["blockPublicAcls"], "IgnorePublicAcls": block["ignorePublicAcls"],
            "BlockPublicPolicy": block["blockPublicPolicy"], "RestrictPublicBuckets": block["restrictPublicBuckets"]})  # fmt: skip
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        s3.put_bucket_policy(Bucket=bucket, Policy=program.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
        assert s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]["BucketKeyEnabled"]

        iam = boto3.client("iam", region_name=region)
        policies = {p.inputs["role"]: p for p in program.of_type("aws:iam/rolePolicy:RolePolicy")}
        for role in program.of_type("aws:iam/role:Role"):
            iam.create_role(RoleName=role.name, AssumeRolePolicyDocument=role.inputs["assumeRolePolicy"])
            attached = policies[role.id]
            iam.put_role_policy(RoleName=role.name, PolicyName=attached.name, PolicyDocument=attached.inputs["policy"])
        for role in program.of_type("aws:iam/role:Role"):
            trust = iam.get_role(RoleName=role.name)["Role"]["AssumeRolePolicyDocument"]
            assert trust == json.loads(role.inputs["assumeRolePolicy"])

        glue = boto3.client("glue", region_name=region)
        for database in program.of_type("aws:glue/catalogDatabase:CatalogDatabase"):
            glue.create_database(DatabaseInput={"Name": database.inputs["name"], "LocationUri": database.inputs["locationUri"],
                                                "Description": database.inputs["description"]})  # fmt: skip
        assert glue.get_database(Name="main")["Database"]["LocationUri"].endswith("/main.db")

        emr = boto3.client("emr-serverless", region_name=region)
        app = program.one("aws:emrserverless/application:Application").inputs
        created = emr.create_application(
            # The provider documents lowercase "spark" (the service accepts either case); moto knows only "SPARK".
            name="icefloe", releaseLabel=app["releaseLabel"], type=app["type"].upper(), architecture=app["architecture"],
            autoStartConfiguration=app["autoStartConfiguration"],
            autoStopConfiguration={"enabled": app["autoStopConfiguration"]["enabled"],  # mocks hand numbers over as floats
                                   "idleTimeoutMinutes": int(app["autoStopConfiguration"]["idleTimeoutMinutes"])},
            maximumCapacity=app["maximumCapacity"], clientToken="replay",
        )  # fmt: skip
        scheduler = boto3.client("scheduler", region_name=region)
        for schedule in program.of_type("aws:scheduler/schedule:Schedule"):
            target = schedule.inputs["target"]
            request = json.loads(target["input"])
            request["ApplicationId"] = created["applicationId"]
            request["ClientToken"] = "execution-1234"  # what the Scheduler substitutes per firing
            run = emr.start_job_run(
                applicationId=request["ApplicationId"], executionRoleArn=request["ExecutionRoleArn"],
                clientToken=request["ClientToken"], name=request["Name"], executionTimeoutMinutes=request["ExecutionTimeoutMinutes"],
                jobDriver={"sparkSubmit": {"entryPoint": request["JobDriver"]["SparkSubmit"]["EntryPoint"],
                                           "entryPointArguments": request["JobDriver"]["SparkSubmit"]["EntryPointArguments"],
                                           "sparkSubmitParameters": request["JobDriver"]["SparkSubmit"]["SparkSubmitParameters"]}},
                configurationOverrides={"monitoringConfiguration": {"s3MonitoringConfiguration": {
                    "logUri": request["ConfigurationOverrides"]["MonitoringConfiguration"]["S3MonitoringConfiguration"]["LogUri"]}}},
            )  # fmt: skip
            assert run["jobRunId"]
            scheduler.create_schedule(
                Name=schedule.name[:64], ScheduleExpression=schedule.inputs["scheduleExpression"],
                FlexibleTimeWindow={"Mode": schedule.inputs["flexibleTimeWindow"]["mode"]},
                Target={"Arn": target["arn"], "RoleArn": target["roleArn"], "Input": target["input"],
                        "RetryPolicy": {"MaximumRetryAttempts": int(target["retryPolicy"]["maximumRetryAttempts"]),
                                        "MaximumEventAgeInSeconds": int(target["retryPolicy"]["maximumEventAgeInSeconds"])},
                        "DeadLetterConfig": {"Arn": target["deadLetterConfig"]["arn"]}},
            )  # fmt: skip
        assert len(scheduler.list_schedules()["Schedules"]) == 3


def test_bring_your_own_bucket_creates_no_bucket_and_scopes_roles_to_it(tmp_path):
    byo = tmp_path / "Pulumi.byo.yaml"
    byo.write_text((ROOT / "examples" / "Pulumi.minimal.yaml").read_text() + (
        "  icefloe:storage:\n    existingBucket: corp-lake\n"
        "    existingKmsKeyArn: arn:aws:kms:us-east-1:123456789012:key/1111-2222\n"
    ))  # fmt: skip
    program = run_program(byo)
    assert program.of_type("aws:s3/bucket:Bucket") == [] and program.of_type("aws:kms/key:Key") == []
    assert program.outputs["warehouseUri"] == "s3://corp-lake/warehouse"
    job = {s["Sid"]: s for s in statements(next(p for p in program.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == "icefloe-job-policy"))}
    assert job["WarehouseReadWrite"]["Resource"] == ["arn:aws:s3:::corp-lake/warehouse/*"]
    assert job["DataKey"]["Resource"] == ["arn:aws:kms:us-east-1:123456789012:key/1111-2222"]
    assert len(program.of_type("aws:scheduler/schedule:Schedule")) == 1
