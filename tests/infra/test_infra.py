"""The Pulumi program under Pulumi's mocks (the CLI and AWS provider cannot run here), from the example stack files:
every resource `pulumi up` would create, with the inputs that matter for safety and for the runtime."""

from __future__ import annotations

import gc
import hashlib
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from icefloe.cli import build_parser
from icefloe.errors import ConfigError
from icefloe.jvm_gateway import ICEFLOE_JAR
from icefloe.session import jvm_lib
from icefloe.spec import load_config
from icefloe.table.catalog import EMR_ICEBERG_JAR
from icefloe_infra import iam as iam_module
from icefloe_infra import jobs as jobs_module
from icefloe_infra.deployment import DEFAULT_RELEASE
from icefloe_infra.jars import EMR_PROVIDED, ONLY_FOR_MSK_IAM, job_jars, pinned_spark_jars
from pulumi_mocks import ACCOUNT_ID, REGION, decrypted_value, fake_jar_dir, run_program, small_bundle

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "Pulumi.example.yaml"
MINIMAL = ROOT / "examples" / "Pulumi.minimal.yaml"
BUCKET = "aws:s3/bucket:Bucket"
ROLE, ROLE_POLICY = "aws:iam/role:Role", "aws:iam/rolePolicy:RolePolicy"
SCHEDULE = "aws:scheduler/schedule:Schedule"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"


@pytest.fixture(autouse=True)
def _collect_after_failed_programs():
    yield
    gc.collect()


@pytest.fixture(scope="module")
def program():
    return run_program(EXAMPLE)


def document(value):
    return json.loads(value) if isinstance(value, str) else value


def statements(resource) -> list[dict]:
    return document(resource.inputs.get("policy") or resource.inputs.get("assumeRolePolicy"))["Statement"]


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def policy_of(program, role_name: str) -> dict[str, dict]:
    role = program.named(role_name)
    (attached,) = [p for p in program.of_type(ROLE_POLICY) if p.inputs["role"] == role.id]
    return {s["Sid"]: s for s in statements(attached)}


def spark_conf(parameters: str) -> dict[str, str]:
    words = shlex.split(parameters)
    assert words[::2] == ["--conf"] * (len(words) // 2), parameters
    return dict(word.split("=", 1) for word in words[1::2])


# --- storage ------------------------------------------------------------------------------------------------


def test_lakehouse_bucket_is_encrypted_private_versioned_and_tls_only(program):
    bucket = program.one(BUCKET)
    key = program.one("aws:kms/key:Key")
    assert key.inputs["enableKeyRotation"] is True and key.inputs["deletionWindowInDays"] == 30
    encryption = program.one("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    (rule,) = encryption.inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"] == {
        "sseAlgorithm": "aws:kms",
        "kmsMasterKeyId": key.outputs["arn"],
    }
    assert rule["bucketKeyEnabled"] is True and encryption.inputs["bucket"] == bucket.id
    block = program.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert [
        block[k] for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    ] == [True] * 4
    assert program.one("aws:s3/bucketVersioning:BucketVersioning").inputs["versioningConfiguration"] == {
        "status": "Enabled"
    }
    (deny,) = statements(program.one("aws:s3/bucketPolicy:BucketPolicy"))
    assert deny == {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket.outputs["arn"], bucket.outputs["arn"] + "/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    lifecycle = program.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    rules = {r["id"]: r for r in lifecycle}
    assert rules["abort-incomplete-multipart-uploads"]["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 7}
    assert rules["expire-old-versions"]["noncurrentVersionExpiration"] == {"noncurrentDays": 30}
    assert all(r["status"] == "Enabled" for r in lifecycle)
    assert bucket.inputs["forceDestroy"] is False
    assert bucket.inputs["tags"] == {
        "icefloe:stack": "example",
        "icefloe:owner": "data-platform@example.com",
        "cost-center": "analytics",
        "icefloe:role": "lakehouse",
    }


def test_bring_your_own_bucket_creates_no_bucket_and_scopes_roles_to_it(tmp_path):
    document_ = yaml.safe_load(MINIMAL.read_text())
    document_["config"]["icefloe:storage"] = {
        "existingBucket": "corp-lake",
        "existingKmsKeyArn": "arn:aws:kms:us-east-1:123456789012:key/1111-2222",
    }
    byo = tmp_path / "Pulumi.byo.yaml"
    byo.write_text(yaml.safe_dump(document_))
    run = run_program(byo)
    assert run.of_type(BUCKET) == [] and run.of_type("aws:kms/key:Key") == []
    assert run.of_type("aws:s3/bucketPolicy:BucketPolicy") == []  # the user's bucket policy is theirs
    assert run.outputs["warehouseUri"] == "s3://corp-lake/warehouse"
    job = policy_of(run, "icefloe-job-role")
    assert job["WarehouseReadWrite"]["Resource"] == ["arn:aws:s3:::corp-lake/warehouse/*"]
    assert job["DataKey"]["Resource"] == ["arn:aws:kms:us-east-1:123456789012:key/1111-2222"]
    assert {o.inputs["bucket"] for o in run.of_type(OBJECT)} == {"corp-lake"}


# --- Glue ----------------------------------------------------------------------------------------------------


def test_one_glue_database_per_cluster_at_the_warehouse_kept_on_destroy(program, tmp_path):
    (database,) = program.of_type("aws:glue/catalogDatabase:CatalogDatabase")
    assert database.inputs["name"] == "main" and program.outputs["glueDatabases"] == ["main"]
    assert database.inputs["locationUri"] == program.outputs["warehouseUri"] + "/main.db"
    assert database.inputs["tags"]["icefloe:stack"] == "example"
    assert database.inputs["tags"]["icefloe:owner"] == "data-platform@example.com"
    # Tables are the runtime's: nothing in the program declares one, so `pulumi destroy` cannot delete them.
    assert program.of_type("aws:glue/catalogTable:CatalogTable") == []


def retained_on_delete(path: Path, classes: list[tuple[object, str]]) -> dict[str, bool]:
    """Run the program and record retainOnDelete per resource: resource options never reach the mocks."""
    seen: dict[str, bool] = {}

    def spying_on(real):
        def spy(resource_name, *args, opts=None, **kwargs):
            seen[resource_name] = bool(opts and opts.retain_on_delete)
            return real(resource_name, *args, opts=opts, **kwargs)

        return spy

    with pytest.MonkeyPatch.context() as patch:
        for module, name in classes:
            patch.setattr(module, name, spying_on(getattr(module, name)))
        run_program(path)
    return seen


def test_data_outlives_destroy_unless_the_user_opts_in(tmp_path):
    import pulumi_aws as aws

    classes = [
        (aws.glue, "CatalogDatabase"),
        (aws.kms, "Key"),
        (aws.s3, "Bucket"),
        (aws.s3, "BucketServerSideEncryptionConfiguration"),
        (aws.s3, "BucketPublicAccessBlock"),
        (aws.s3, "BucketVersioning"),
        (aws.s3, "BucketPolicy"),
        (aws.s3, "BucketLifecycleConfiguration"),
        (aws.s3, "BucketOwnershipControls"),
        (aws.emrserverless, "Application"),
    ]
    results = {}
    for opt_in in (False, True):
        document_ = yaml.safe_load(MINIMAL.read_text())
        document_["config"]["icefloe:glue"] = {"deleteTablesOnDestroy": opt_in}
        document_["config"]["icefloe:storage"] = {"forceDestroy": opt_in}
        path = tmp_path / f"Pulumi.destroy{int(opt_in)}.yaml"
        path.write_text(yaml.safe_dump(document_))
        results[opt_in] = retained_on_delete(path, classes)
    data = {
        "icefloe-glue-events",
        "icefloe-lakehouse-key",
        "icefloe-lakehouse-bucket",
        "icefloe-lakehouse-encryption",
        "icefloe-lakehouse-public-access",
        "icefloe-lakehouse-versioning",
        "icefloe-lakehouse-tls-only",
        "icefloe-lakehouse-lifecycle",
        "icefloe-lakehouse-ownership",
    }
    assert set(results[False]) == data | {"icefloe-emr-spark"}
    assert all(results[False][n] for n in data) and not any(results[True][n] for n in data)
    assert results[False]["icefloe-emr-spark"] is False  # compute goes with the stack


# --- IAM ----------------------------------------------------------------------------------------------------


def test_external_roles_trust_exactly_the_principal_and_require_the_external_id(program):
    (snowflake,) = statements(program.named("icefloe-snowflake-role"))
    assert snowflake == {
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::210987654321:user/snowflake-integration"},
        "Action": "sts:AssumeRole",
        "Condition": {"StringEquals": {"sts:ExternalId": "MYORG_SFCRole=2_abcdefg"}},
    }
    (athena,) = statements(program.named("icefloe-athena-analytics-role"))
    generated = program.outputs["externalIds"]["athena-analytics"]
    assert athena == {
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::111122223333:role/analytics-athena"},
        "Action": "sts:AssumeRole",
        "Condition": {"StringEquals": {"sts:ExternalId": generated}},
    }
    password = program.one("random:index/randomPassword:RandomPassword").inputs
    assert password["length"] >= 32 and password["special"] is False  # ExternalId allows [\w+=,.@:/-]
    assert "externalIds" in program.secret_outputs


def test_service_roles_trust_their_service_for_this_account_only(program):
    for role, service in (
        ("icefloe-job-role", "emr-serverless.amazonaws.com"),
        ("icefloe-schedules-role", "scheduler.amazonaws.com"),
    ):
        (trust,) = statements(program.named(role))
        assert trust == {
            "Effect": "Allow",
            "Principal": {"Service": service},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": ACCOUNT_ID}},
        }
    assert len(program.of_type(ROLE)) == 4  # job, scheduler, two external readers


def test_no_statement_grants_wildcard_actions_and_every_resource_is_scoped(program):
    bucket_arn = program.one(BUCKET).outputs["arn"]
    own = {ACCOUNT_ID}
    for attached in program.of_type(ROLE_POLICY):
        for statement in statements(attached):
            assert statement["Effect"] == "Allow"
            for action in as_list(statement["Action"]):
                assert "*" not in action, (attached.name, action)
            for arn in as_list(statement["Resource"]):
                assert arn != "*" and arn.startswith("arn:aws:"), (attached.name, arn)
                service, region, account = arn.split(":")[2:5]
                if service == "s3":
                    assert arn == bucket_arn or arn.startswith(bucket_arn + "/"), arn
                else:
                    assert account in own and region in ("", REGION), arn


def test_job_role_reaches_its_prefixes_key_tables_secrets_and_logs(program):
    bucket_arn = program.one(BUCKET).outputs["arn"]
    job = policy_of(program, "icefloe-job-role")
    assert job["WarehouseReadWrite"]["Resource"] == [f"{bucket_arn}/warehouse/*"]
    assert job["ReadBundleAndConfig"] == {
        "Sid": "ReadBundleAndConfig",
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": [f"{bucket_arn}/icefloe/*"],
    }
    assert job["WriteJobLogs"]["Action"] == ["s3:PutObject"] and job["WriteJobLogs"]["Resource"] == [
        f"{bucket_arn}/logs/*"
    ]
    assert job["ListWarehouse"]["Condition"] == {"StringLike": {"s3:prefix": ["warehouse/*", "warehouse"]}}
    assert job["DataKey"]["Resource"] == [program.outputs["kmsKeyArn"]]
    glue = f"arn:aws:glue:{REGION}:{ACCOUNT_ID}"
    assert job["GlueTables"]["Resource"] == [f"{glue}:catalog", f"{glue}:database/main", f"{glue}:table/main/*"]
    created = program.one("aws:secretsmanager/secret:Secret").outputs["arn"]
    assert job["KafkaCredentials"]["Resource"] == [
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:icefloe/kafka-main-AbCdEf",
        created,
    ]
    log_group = program.one("aws:cloudwatch/logGroup:LogGroup").outputs["arn"]
    assert job["JobLogs"]["Resource"] == [f"{log_group}:*"]


def test_a_glue_schema_registry_is_readable_by_the_job_role_and_nothing_more(program, tmp_path):
    assert "GlueSchemaRegistry" not in policy_of(program, "icefloe-job-role"), "no Glue registry, no permission"
    document_ = yaml.safe_load(MINIMAL.read_text())
    document_["config"]["icefloe:sourceClusters"][0]["schemaRegistry"] = {
        "type": "glue",
        "registryName": "payments",
        "region": "eu-central-1",
        "schemaName": "{topic}",
    }
    stack = tmp_path / "Pulumi.glue-registry.yaml"
    stack.write_text(yaml.safe_dump(document_))
    job = policy_of(run_program(stack), "icefloe-job-role")
    account = f"arn:aws:glue:eu-central-1:{ACCOUNT_ID}"
    assert job["GlueSchemaRegistry"] == {
        "Sid": "GlueSchemaRegistry",
        "Effect": "Allow",
        "Action": ["glue:GetSchemaVersion", "glue:GetSchema", "glue:GetSchemaByDefinition", "glue:GetRegistry"],
        "Resource": [f"{account}:registry/payments", f"{account}:schema/payments/*"],
    }
    assert not any(
        a.startswith("glue:") and ("Create" in a or "Register" in a or "Put" in a) and "Table" not in a
        for s in job.values()
        for a in as_list(s["Action"])
    ), "the job never registers schemas"


def test_external_roles_only_read(program):
    for name in ("icefloe-snowflake-role", "icefloe-athena-analytics-role"):
        read = policy_of(program, name)
        actions = {a for s in read.values() for a in as_list(s["Action"])}
        assert actions == {
            "s3:GetObject",
            "s3:GetObjectVersion",
            "s3:ListBucket",
            "s3:GetBucketLocation",
            "kms:Decrypt",
            "kms:DescribeKey",
            "glue:GetCatalog",
            "glue:GetDatabase",
            "glue:GetDatabases",
            "glue:GetTable",
            "glue:GetTables",
            "glue:GetPartitions",
        }
        assert read["ReadWarehouse"]["Resource"] == [program.one(BUCKET).outputs["arn"] + "/warehouse/*"]


def test_scheduler_role_starts_jobs_on_this_application_and_passes_only_the_job_role(program):
    policy = policy_of(program, "icefloe-schedules-role")
    app_arn = program.one("aws:emrserverless/application:Application").outputs["arn"]
    assert policy["StartTableJobs"]["Resource"] == [app_arn, f"{app_arn}/jobruns/*"]
    assert policy["PassJobRole"]["Resource"] == [program.outputs["jobRoleArn"]]
    assert policy["PassJobRole"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "emr-serverless.amazonaws.com"}
    }
    assert policy["DeadLetters"]["Resource"] == [program.one("aws:sqs/queue:Queue").outputs["arn"]]


# --- EMR and the bundle ----------------------------------------------------------------------------------------


def test_emr_application_is_bounded_and_logs_to_the_bucket_and_cloudwatch(program):
    app = program.one("aws:emrserverless/application:Application").inputs
    assert app["type"] == "spark" and app["releaseLabel"] == DEFAULT_RELEASE == "emr-7.12.0"
    assert app["architecture"] == "X86_64"
    assert app["autoStartConfiguration"] == {"enabled": True}
    assert app["autoStopConfiguration"] == {"enabled": True, "idleTimeoutMinutes": 15}
    assert app["maximumCapacity"] == {"cpu": "16 vCPU", "memory": "64 GB", "disk": "200 GB"}
    assert "imageConfiguration" not in app  # the release's own image: its Python 3.11 runs the jobs
    assert "networkConfiguration" not in app
    monitoring = app["monitoringConfiguration"]
    assert monitoring["s3MonitoringConfiguration"] == {
        "logUri": f"s3://{program.outputs['bucket']}/logs/",
        "encryptionKeyArn": program.outputs["kmsKeyArn"],
    }
    assert monitoring["cloudwatchLoggingConfiguration"] == {
        "enabled": True,
        "logGroupName": program.outputs["logGroup"],
        "logStreamNamePrefix": "icefloe",
    }
    assert program.one("aws:cloudwatch/logGroup:LogGroup").inputs["retentionInDays"] == 30


def test_vpc_subnets_and_security_groups_reach_the_application(tmp_path):
    document_ = yaml.safe_load(MINIMAL.read_text())
    document_["config"]["icefloe:emr"] = {
        "subnetIds": ["subnet-0a1b", "subnet-0c2d"],
        "securityGroupIds": ["sg-0123"],
        "architecture": "ARM64",
    }
    path = tmp_path / "Pulumi.vpc.yaml"
    path.write_text(yaml.safe_dump(document_))
    built = []

    def build(architecture, python_version):
        built.append((architecture, python_version))
        return small_bundle(architecture, python_version)

    run = run_program(path, build=build)
    app = run.one("aws:emrserverless/application:Application").inputs
    assert app["networkConfiguration"] == {"subnetIds": ["subnet-0a1b", "subnet-0c2d"], "securityGroupIds": ["sg-0123"]}
    assert app["architecture"] == "ARM64" and built == [("ARM64", "3.11")]  # the bundle follows the application


def test_bundle_entry_point_and_config_are_content_addressed_objects(program):
    objects = {o.name: o.inputs for o in program.of_type(OBJECT)}
    digest = program.outputs["bundleDigest"]
    assert objects["icefloe-runtime-bundle"]["key"] == f"icefloe/bundle/{digest}/deps.tar.gz"
    assert objects["icefloe-runtime-entry-point"]["key"] == f"icefloe/bundle/{digest}/main.py"
    assert Path(objects["icefloe-runtime-bundle"]["source"]["asset"]).name.startswith("icefloe-deps-" + digest[:16])
    config = objects["icefloe-runtime-job-config"]
    assert config["key"] == f"icefloe/config/{hashlib.sha256(config['content'].encode()).hexdigest()}.json"
    assert program.outputs["jobConfigUri"] == f"s3://{program.outputs['bucket']}/{config['key']}"


def test_your_own_image_and_python_override_the_release_defaults(tmp_path):
    document_ = yaml.safe_load(MINIMAL.read_text())
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/icefloe-emr:7.12.0-py311"
    document_["config"]["icefloe:emr"] = {
        "imageUri": image,
        "releaseLabel": "emr-7.1.0",
        "python": "/opt/py/bin/python3",
    }
    path = tmp_path / "Pulumi.image.yaml"
    path.write_text(yaml.safe_dump(document_))
    run = run_program(path)
    app = run.one("aws:emrserverless/application:Application").inputs
    assert app["imageConfiguration"] == {"imageUri": image} and app["releaseLabel"] == "emr-7.1.0"
    conf = spark_conf(
        json.loads(run.one(SCHEDULE).inputs["target"]["input"])["JobDriver"]["SparkSubmit"]["SparkSubmitParameters"]
    )
    for key in (
        "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON",
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON",
        "spark.executorEnv.PYSPARK_PYTHON",
    ):
        assert conf[key] == "/opt/py/bin/python3"


# --- the JVM jars ---------------------------------------------------------------------------------------------

SHIPPED = [
    ICEFLOE_JAR,
    "spark-sql-kafka-0-10_2.12-3.5.7.jar",
    "spark-token-provider-kafka-0-10_2.12-3.5.7.jar",
    "kafka-clients-3.4.1.jar",
    "commons-pool2-2.11.1.jar",
    "spark-avro_2.12-3.5.9.jar",
]


def jar_objects(run) -> dict[str, dict]:
    return {o.name: o.inputs for o in run.of_type(OBJECT) if o.name.startswith("icefloe-runtime-jar-")}


def test_the_pom_pins_what_emr_lacks_and_the_jobs_ship_exactly_that(program):
    pinned = {jar.coordinate: jar.file_name for jar in pinned_spark_jars()}
    assert EMR_PROVIDED < set(pinned)  # Iceberg (runtime and AWS bundle) comes with the release
    assert [p.name for p in job_jars(fake_jar_dir()).values()] == SHIPPED
    assert sorted([*(pinned[c] for c in set(pinned) - EMR_PROVIDED - ONLY_FOR_MSK_IAM), ICEFLOE_JAR]) == sorted(SHIPPED)
    # aws-msk-iam-auth (shaded, classifier `all`) only for stacks with an MSK IAM cluster: see test_infra_aws.py
    assert pinned["software.amazon.msk:aws-msk-iam-auth"] == "aws-msk-iam-auth-2.3.9-all.jar"
    objects = jar_objects(program)
    assert sorted(Path(o["source"]["asset"]).name for o in objects.values()) == sorted(SHIPPED)
    for inputs in objects.values():
        source = Path(inputs["source"]["asset"])
        assert source.parent == fake_jar_dir()
        assert inputs["key"] == f"icefloe/jars/{hashlib.sha256(source.read_bytes()).hexdigest()}/{source.name}"
        assert inputs["bucket"] == program.outputs["bucket"] and inputs["contentType"] == "application/java-archive"


def test_a_changed_jar_is_a_new_object_under_the_same_resource(program, tmp_path):
    rebuilt = run_program(MINIMAL, jar_dir=fake_jar_dir(tmp_path / "jars", content=b"another build"))
    before, after = jar_objects(program), jar_objects(rebuilt)
    assert set(before) == set(after)  # same logical resources: `pulumi up` replaces the objects
    for name in before:
        assert before[name]["key"] != after[name]["key"]
        assert before[name]["key"].rsplit("/", 1)[1] == after[name]["key"].rsplit("/", 1)[1]
    request = json.loads(rebuilt.one(SCHEDULE).inputs["target"]["input"])
    jars = spark_conf(request["JobDriver"]["SparkSubmit"]["SparkSubmitParameters"])["spark.jars"].split(",")
    assert jars[1:] == [f"s3://{rebuilt.outputs['bucket']}/{after[n]['key']}" for n in after]


def test_missing_jars_fail_the_program_naming_them_and_the_fix(tmp_path):
    jars = fake_jar_dir(tmp_path / "jars")
    (jars / "kafka-clients-3.4.1.jar").unlink()
    with pytest.raises(ConfigError, match=r"missing from .*jars: kafka-clients-3\.4\.1\.jar; run scripts/setup\.sh"):
        run_program(MINIMAL, jar_dir=jars)


def test_a_pom_without_an_artifact_emr_is_said_to_provide_is_an_error(tmp_path):
    pom = tmp_path / "pom.xml"
    pom.write_text(
        (ROOT / "jvm" / "pom.xml")
        .read_text()
        .replace("<artifactId>iceberg-aws-bundle</artifactId>", "<artifactId>iceberg-aws-bundle-renamed</artifactId>")
    )
    with pytest.raises(ConfigError, match="org.apache.iceberg:iceberg-aws-bundle is listed in jars.py but not pinned"):
        job_jars(fake_jar_dir(), pom)


@pytest.mark.skipif(not (jvm_lib() / "spark").is_dir(), reason="jvm/lib/spark is filled by scripts/setup.sh (Maven)")
def test_the_files_maven_fetched_are_the_ones_the_pom_names():
    fetched = {p.name for p in (jvm_lib() / "spark").glob("*.jar")}
    assert {jar.file_name for jar in pinned_spark_jars()} <= fetched
    assert all(path.is_file() for path in job_jars(jvm_lib() / "spark").values())


# --- schedules ----------------------------------------------------------------------------------------------


def scheduled(program) -> dict[str, dict]:
    return {s.inputs["description"].removeprefix("icefloe: materialize "): s.inputs for s in program.of_type(SCHEDULE)}


def test_one_schedule_per_enabled_table_at_its_refresh(program):
    schedules = scheduled(program)
    assert set(schedules) == {"main.stock_trades", "main.accounts", "main.clickstream"}  # audit_log is disabled
    assert schedules["main.stock_trades"]["scheduleExpression"] == "rate(15 minutes)"
    assert schedules["main.accounts"]["scheduleExpression"] == "rate(5 minutes)"
    assert schedules["main.clickstream"]["scheduleExpression"] == "rate(60 minutes)"  # restarts the streaming job
    for schedule in schedules.values():
        assert schedule["state"] == "ENABLED" and schedule["flexibleTimeWindow"] == {"mode": "OFF"}
        target = schedule["target"]
        assert target["arn"] == "arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun"
        assert target["roleArn"] == program.outputs["schedulerRoleArn"]
        assert target["retryPolicy"] == {"maximumRetryAttempts": 3, "maximumEventAgeInSeconds": 3600}
        assert target["deadLetterConfig"] == {"arn": program.one("aws:sqs/queue:Queue").outputs["arn"]}
    assert program.one("aws:sqs/queue:Queue").inputs["messageRetentionSeconds"] == 14 * 86400


def test_each_schedule_starts_a_job_the_runtime_entry_point_accepts(program, tmp_path):
    bucket = program.outputs["bucket"]
    for identifier, schedule in scheduled(program).items():
        request = json.loads(schedule["target"]["input"])
        assert set(request) == {
            "ApplicationId",
            "ExecutionRoleArn",
            "ClientToken",
            "Name",
            "Mode",
            "ExecutionTimeoutMinutes",
            "JobDriver",
            "ConfigurationOverrides",
        }
        assert request["ClientToken"] == "<aws.scheduler.execution-id>"  # unique per firing
        assert request["ApplicationId"] == program.outputs["applicationId"]
        assert request["ExecutionRoleArn"] == program.outputs["jobRoleArn"]
        driver = request["JobDriver"]["SparkSubmit"]
        args = build_parser().parse_args(driver["EntryPointArguments"])  # the runtime's own parser
        assert args.command == "run" and args.table == [identifier] and args.json
        assert args.config == program.outputs["jobConfigUri"]
        continuous = identifier == "main.clickstream"
        assert (args.continuous, args.once) == (continuous, not continuous)
        assert request["Mode"] == ("STREAMING" if continuous else "BATCH")
        assert (
            request["ExecutionTimeoutMinutes"]
            == {"main.stock_trades": 60, "main.accounts": 30, "main.clickstream": 60}[identifier]
        )
        assert driver["EntryPoint"] == f"s3://{bucket}/icefloe/bundle/{program.outputs['bundleDigest']}/main.py"
        logs = request["ConfigurationOverrides"]["MonitoringConfiguration"]["S3MonitoringConfiguration"]
        assert logs == {"LogUri": f"s3://{bucket}/logs/", "EncryptionKeyArn": program.outputs["kmsKeyArn"]}


def test_spark_parameters_come_from_the_runtime_catalog_settings(program):
    from icefloe.spec import CatalogSpec
    from icefloe.table.catalog import spark_catalog_conf

    request = json.loads(next(iter(scheduled(program).values()))["target"]["input"])
    conf = spark_conf(request["JobDriver"]["SparkSubmit"]["SparkSubmitParameters"])
    expected_catalog = spark_catalog_conf(CatalogSpec(type="glue", warehouse=program.outputs["warehouseUri"]))
    assert conf.items() >= expected_catalog.items()
    bucket, digest = program.outputs["bucket"], program.outputs["bundleDigest"]
    shipped = [o.inputs["key"] for o in program.of_type(OBJECT) if o.inputs["key"].startswith("icefloe/jars/")]
    uris = conf["spark.jars"].split(",")
    assert uris[0] == EMR_ICEBERG_JAR
    # Every uploaded jar, in the pom's order (Spark's classpath order); the mocks see the uploads in no fixed order.
    assert sorted(uris[1:]) == sorted(f"s3://{bucket}/{key}" for key in shipped)
    pom_order = [ICEFLOE_JAR, *(jar.file_name for jar in pinned_spark_jars())]  # icefloe's own first
    names = [uri.rsplit("/", 1)[1] for uri in uris[1:]]
    assert names == sorted(names, key=pom_order.index)
    assert conf["spark.archives"] == f"s3://{bucket}/icefloe/bundle/{digest}/deps.tar.gz#deps"
    for key in (
        "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON",
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON",
        "spark.executorEnv.PYSPARK_PYTHON",
    ):
        assert conf[key] == "/usr/bin/python3.11"
    assert conf["spark.executorEnv.PYTHONPATH"] == conf["spark.emr-serverless.driverEnv.PYTHONPATH"] == "./deps"
    assert conf["spark.executor.instances"] == "1" and conf["spark.dynamicAllocation.maxExecutors"] == "4"


def test_short_refreshes_run_continuously_and_schedule_settings_apply(tmp_path):
    document_ = yaml.safe_load(MINIMAL.read_text())
    document_["config"]["icefloe:tables"] = [
        {"sourceCluster": "events", "topic": "orders", "refresh": "2m"},
        {"sourceCluster": "events", "topic": "payments", "refresh": "90s"},
        {"sourceCluster": "events", "topic": "daily", "refresh": "1d"},
    ]
    document_["config"]["icefloe:schedule"] = {
        "continuousBelow": "100s",
        "maximumRetryAttempts": 0,
        "maximumEventAge": "5m",
        "state": "DISABLED",
    }
    path = tmp_path / "Pulumi.short.yaml"
    path.write_text(yaml.safe_dump(document_))
    run = run_program(path)
    schedules = scheduled(run)
    modes = {k: json.loads(s["target"]["input"])["Mode"] for k, s in schedules.items()}
    assert modes == {"events.orders": "BATCH", "events.payments": "STREAMING", "events.daily": "BATCH"}
    assert schedules["events.orders"]["scheduleExpression"] == "rate(2 minutes)"
    assert schedules["events.daily"]["scheduleExpression"] == "rate(1440 minutes)"
    assert json.loads(schedules["events.daily"]["target"]["input"])["ExecutionTimeoutMinutes"] == 720
    assert all(s["state"] == "DISABLED" for s in schedules.values())
    assert all(
        s["target"]["retryPolicy"] == {"maximumRetryAttempts": 0, "maximumEventAgeInSeconds": 300}
        for s in schedules.values()
    )
    assert run.outputs["scheduledTables"] == {
        "events.orders": "rate(2 minutes)",
        "events.payments": "continuous",
        "events.daily": "rate(1440 minutes)",
    }


def test_every_job_passes_its_time_limit_and_its_batches_fit_inside_it(tmp_path):
    """EMR Serverless stops a job at ExecutionTimeoutMinutes (a continuous job at streamingJobMinutes): the runtime is
    told that limit, and a batch is planned to end well inside it, also where runTimeout (12h here) is far longer."""
    document_ = yaml.safe_load(MINIMAL.read_text())
    document_["config"]["icefloe:tables"] = [
        {"sourceCluster": "events", "topic": "orders"},  # refresh 15m: stopped after 60 minutes
        {"sourceCluster": "events", "topic": "payments", "refresh": "5m"},  # 30 minutes
        {
            "sourceCluster": "events",
            "topic": "daily",
            "refresh": "1d",
            "runTimeout": "1d",
            "maintenance": {"orphanFileAge": "3d"},
        },  # 720 minutes
        {"sourceCluster": "events", "topic": "clicks", "refresh": "10s", "continuous": True},  # streamingJobMinutes
    ]
    document_["config"]["icefloe:emr"] = {"streamingJobMinutes": 45}
    path = tmp_path / "Pulumi.deadline.yaml"
    path.write_text(yaml.safe_dump(document_))
    run = run_program(path)
    config = load_config(str(path))
    timeouts = {}
    for identifier, schedule in scheduled(run).items():
        request = json.loads(schedule["target"]["input"])
        args = build_parser().parse_args(request["JobDriver"]["SparkSubmit"]["EntryPointArguments"])
        minutes = request["ExecutionTimeoutMinutes"]
        assert args.deadline_minutes == minutes, identifier
        timeouts[identifier] = minutes
        from icefloe.materialize.budget import Deadline, seconds_for_batch

        (table,) = config.select([identifier])
        deadline = Deadline.after_minutes(args.deadline_minutes, started=0.0)
        planned = seconds_for_batch(table.run_timeout_seconds, deadline, now=0.0)
        assert 0 < planned <= 0.5 * minutes * 60, (
            f"{identifier}: a batch planned for {planned:.0f}s in a {minutes} min job"
        )
    assert timeouts == {"events.orders": 60, "events.payments": 30, "events.daily": 720, "events.clicks": 45}


# --- the job's config and secrets ---------------------------------------------------------------------------------


def test_job_config_is_the_validated_spec_on_glue_with_secrets_by_arn(program, tmp_path):
    body = next(o for o in program.of_type(OBJECT) if o.name == "icefloe-runtime-job-config").inputs["content"]
    assert set(json.loads(body)) == {"config"}
    path = tmp_path / "job.json"
    path.write_text(body)
    config = load_config(str(path))  # the runtime's own loader
    assert config.catalog.type == "glue" and config.catalog.warehouse == program.outputs["warehouseUri"]
    cluster = config.source_clusters[0]
    assert (
        cluster.credentials_secret.secret_arn
        == "arn:aws:secretsmanager:eu-west-1:123456789012:secret:icefloe/kafka-main-AbCdEf"
    )
    assert (
        cluster.schema_registry.credentials_secret.secret_arn
        == program.one("aws:secretsmanager/secret:Secret").outputs["arn"]
    )
    assert [config.identifier(t) for t in config.tables] == program.outputs["tables"]
    assert [t.enabled for t in config.tables] == [True, True, True, False]


def test_secret_values_appear_only_in_the_secret_version(program):
    password = json.loads(program.config["icefloe:secrets"])["registry"]["password"]
    assert password == decrypted_value(
        yaml.safe_load(EXAMPLE.read_text())["config"]["icefloe:secrets"]["registry"]["password"]["secure"]
    )
    (version,) = program.of_type("aws:secretsmanager/secretVersion:SecretVersion")
    assert json.loads(version.inputs["secretString"]) == {"username": "icefloe", "password": password}
    for resource in program:
        if resource is not version:
            assert password not in json.dumps(resource.inputs), resource.name
    assert password not in json.dumps(program.outputs)
    secret = program.one("aws:secretsmanager/secret:Secret").inputs
    assert secret["kmsKeyId"] == program.outputs["kmsKeyArn"]


def test_outputs_name_everything_a_user_needs(program):
    outputs = program.outputs
    assert outputs["tables"] == ["main.stock_trades", "main.accounts", "main.clickstream", "main.audit_log"]
    assert outputs["warehouseUri"] == f"s3://{outputs['bucket']}/warehouse"
    assert outputs["applicationId"] == program.one("aws:emrserverless/application:Application").id
    assert set(outputs["externalRoleArns"]) == {"snowflake", "athena-analytics"}
    assert set(outputs["externalIds"]) == {"snowflake", "athena-analytics"} and program.secret_outputs == {
        "externalIds"
    }
    snippets = outputs["snippets"]
    assert 'FROM "main"."stock_trades"' in snippets["athena"]
    assert f"ATTACH '{ACCOUNT_ID}' AS icefloe (TYPE iceberg, ENDPOINT_TYPE glue)" in snippets["duckdb"]
    assert "FROM icefloe.main.stock_trades" in snippets["duckdb"]
    assert outputs["externalRoleArns"]["snowflake"] in snippets["snowflake"]
    assert "MYORG_SFCRole" not in json.dumps(snippets)  # ExternalIds only in the secret output


# --- the program against the policy pack -------------------------------------------------------------------------


def mandatory(run) -> set[str]:
    from icefloe_policies.runner import run_pack

    return {v.policy for v in run_pack(run) if v.level == "mandatory"}


def test_examples_pass_the_pack_and_unsafe_variants_are_caught(monkeypatch):
    assert mandatory(run_program(EXAMPLE)) == set() and mandatory(run_program(MINIMAL)) == set()
    with monkeypatch.context() as patch:  # an external role without the ExternalId condition
        patch.setattr(
            iam_module,
            "external_trust",
            lambda principal, _id: iam_module.policy(
                {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": "sts:AssumeRole"}
            ),
        )
        assert "iam-external-trust-requires-external-id" in mandatory(run_program(EXAMPLE))
    with monkeypatch.context() as patch:  # a plaintext password in a job argument
        real = jobs_module.TableJob.arguments
        patch.setattr(
            jobs_module.TableJob,
            "arguments",
            lambda self, uri: real(self, uri) + ["--sasl-password", "Tr0ub4dor&3xyz!"],
        )
        assert "no-plaintext-credentials" in mandatory(run_program(EXAMPLE))


def test_resource_names_are_stable(program):
    # Renaming a logical resource makes `pulumi up` replace it (a new bucket, new roles): catch it in review.
    names = sorted(r.name for r in program if r.custom)
    assert names == sorted(
        [
            "icefloe-lakehouse-key",
            "icefloe-lakehouse-bucket",
            "icefloe-lakehouse-encryption",
            "icefloe-lakehouse-versioning",
            "icefloe-lakehouse-public-access",
            "icefloe-lakehouse-tls-only",
            "icefloe-lakehouse-lifecycle",
            "icefloe-lakehouse-ownership",
            "icefloe-glue-main",
            "icefloe-logs",
            "icefloe-secrets-registry",
            "icefloe-secrets-registry-value",
            "icefloe-job-role",
            "icefloe-job-policy",
            "icefloe-snowflake-role",
            "icefloe-snowflake-read",
            "icefloe-athena-analytics-external-id",
            "icefloe-athena-analytics-role",
            "icefloe-athena-analytics-read",
            "icefloe-runtime-bundle",
            "icefloe-runtime-entry-point",
            "icefloe-runtime-job-config",
            "icefloe-runtime-jar-icefloe-jvm",
            "icefloe-runtime-jar-spark-sql-kafka-0-10-2-12",
            "icefloe-runtime-jar-spark-token-provider-kafka-0-10-2-12",
            "icefloe-runtime-jar-kafka-clients",
            "icefloe-runtime-jar-commons-pool2",
            "icefloe-runtime-jar-spark-avro-2-12",
            "icefloe-emr-spark",
            "icefloe-schedules-dlq",
            "icefloe-schedules-role",
            "icefloe-schedules-start-jobs",
            "icefloe-schedules-main-stock-trades",
            "icefloe-schedules-main-accounts",
            "icefloe-schedules-main-clickstream",
            "icefloe-alarms-main-stock-trades-lag",
            "icefloe-alarms-main-stock-trades-bad-records",
            "icefloe-alarms-main-accounts-lag",
            "icefloe-alarms-main-clickstream-lag",
        ]
    )
    assert all(re.fullmatch(r"[a-z0-9-]+", n) for n in names)
