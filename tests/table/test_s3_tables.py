"""S3 Tables as the catalog kind: the Spark and pyiceberg settings checked against AWS's documentation of the
S3 Tables Iceberg REST endpoint, the table bucket, namespaces and job permissions under Pulumi's mocks, and their
inputs replayed against moto's s3tables (what it serves, and what it does not).

No local end-to-end: no Iceberg REST catalog that speaks for S3 Tables runs here (moto serves the s3tables control
plane API but not its `/iceberg` REST endpoint): the runtime's writes through the endpoint run only on AWS.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from icefloe.errors import ConfigError
from icefloe.spec import CatalogSpec, parse_config
from icefloe.table.catalog import CATALOG, rest_properties, spark_catalog_conf
from test_infra import policy_of

ROOT = Path(__file__).resolve().parents[2]
AWS_NATIVE = ROOT / "examples" / "Pulumi.aws-native.yaml"
BUCKET_ARN = "arn:aws:s3tables:eu-west-1:123456789012:bucket/icefloe-tables-eu"
TABLE_BUCKET, NAMESPACE = "aws:s3tables/tableBucket:TableBucket", "aws:s3tables/namespace:Namespace"
MOTO_REGION = "us-east-1"  # moto 5.2.5 serves s3tables in us-east-1, us-east-2 and us-west-2 only


def s3_tables() -> CatalogSpec:
    return CatalogSpec(type="s3tables", warehouse=BUCKET_ARN)


# --- the runtime's settings, against the documentation ----------------------------------------------------------


def test_spark_settings_are_the_ones_aws_documents_for_the_iceberg_rest_endpoint():
    conf = spark_catalog_conf(s3_tables())
    prefix = f"spark.sql.catalog.{CATALOG}"
    catalog = {k.removeprefix(prefix + "."): v for k, v in conf.items() if k.startswith(prefix + ".")}
    # "Accessing tables using the Amazon S3 Tables Iceberg REST endpoint" (Amazon S3 user guide), its Spark example:
    # the endpoint as uri, the table bucket's ARN as warehouse, SigV4 signed for s3tables in the bucket's region,
    # S3FileIO for the data, no metrics reporting; plus icefloe's own cache-enabled=false (offsets are in snapshots).
    assert catalog == {
        "type": "rest",
        "uri": "https://s3tables.eu-west-1.amazonaws.com/iceberg",
        "warehouse": BUCKET_ARN,
        "rest.sigv4-enabled": "true",
        "rest.signing-name": "s3tables",
        "rest.signing-region": "eu-west-1",
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "rest-metrics-reporting-enabled": "false",
        "cache-enabled": "false",
    }
    assert conf[prefix] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.extensions"] == "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def test_pyiceberg_settings_are_the_ones_aws_documents():
    # The same page's PyIceberg example (`icefloe status` reads the tables with it).
    assert rest_properties(s3_tables()) == {
        "type": "rest",
        "uri": "https://s3tables.eu-west-1.amazonaws.com/iceberg",
        "warehouse": BUCKET_ARN,
        "rest.sigv4-enabled": "true",
        "rest.signing-name": "s3tables",
        "rest.signing-region": "eu-west-1",
    }


class FakeEndpoint:
    """A local stand-in for the S3 Tables Iceberg REST endpoint that records each request and refuses it (403), so
    the client's request line and SigV4 signature can be read; it implements no catalog."""

    def __init__(self):
        import http.server
        import threading

        requests = self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                requests.append((self.path, dict(self.headers)))
                body = json.dumps(
                    {"error": {"message": "refused by the test endpoint", "type": "ForbiddenException", "code": 403}}
                ).encode()
                self.send_response(403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/iceberg"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    fake = FakeEndpoint()
    yield fake
    fake.close()


def assert_signed_config_request(requests) -> None:
    """The catalog's first request: GET <endpoint>/v1/config?warehouse=<bucket ARN>, SigV4-signed for s3tables."""
    path, headers = requests[0]
    assert path == "/iceberg/v1/config?warehouse=" + BUCKET_ARN.replace(":", "%3A").replace("/", "%2F")
    authorization = {k.lower(): v for k, v in headers.items()}["authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/")
    assert "/eu-west-1/s3tables/aws4_request" in authorization.split(",")[0]
    assert "testing-secret" not in json.dumps(headers)


def test_pyiceberg_signs_its_catalog_requests_for_s3_tables(endpoint, monkeypatch):
    import icefloe.spec
    import icefloe.table.catalog

    monkeypatch.setattr(icefloe.spec, "s3_tables_endpoint", lambda region: endpoint.url)
    with pytest.raises(Exception, match="refused by the test endpoint"):
        icefloe.table.catalog.pyiceberg_catalog(s3_tables())
    assert_signed_config_request(endpoint.requests)


def test_status_names_a_catalog_it_cannot_open_per_table(endpoint, monkeypatch, tmp_path):
    """pyiceberg's REST catalog asks the endpoint for its config when opened (Glue's does not): a refusal there is
    the table's `catalog:` error in `icefloe status`, not a crash of the command."""
    import icefloe.spec
    import icefloe.table.catalog
    from icefloe.operate.status import open_catalog, read_table_facts

    monkeypatch.setattr(icefloe.spec, "s3_tables_endpoint", lambda region: endpoint.url)
    config = parse_config(
        {
            "sourceClusters": [{"name": "orders", "bootstrapServers": "b:9092"}],
            "catalog": {"type": "s3tables", "warehouse": BUCKET_ARN},
        }
    )
    catalog = open_catalog(config, tmp_path)
    with pytest.raises(Exception, match="refused by the test endpoint"):
        read_table_facts(catalog, "orders.orders", "orders")


@pytest.mark.spark
def test_sparks_iceberg_signs_its_catalog_requests_for_s3_tables(spark, endpoint):
    """The runtime's Spark settings on the local session's jars (Iceberg 1.10.1 and its AWS bundle): the REST catalog
    initializes with SigV4 for s3tables in the bucket's region, the endpoint being the only change."""
    prefix = f"spark.sql.catalog.{CATALOG}"
    probe = "s3tables_probe"
    for key, value in spark_catalog_conf(s3_tables()).items():
        if key.startswith(prefix):
            spark.conf.set(key.replace(prefix, f"spark.sql.catalog.{probe}", 1), value)
    spark.conf.set(f"spark.sql.catalog.{probe}.uri", endpoint.url)
    # The JVM started before this test's environment: its AWS SDK takes the credentials as system properties.
    system = spark._jvm.java.lang.System
    system.setProperty("aws.accessKeyId", "AKIAIOSFODNN7EXAMPLE")
    system.setProperty("aws.secretAccessKey", "testing-secret")
    try:
        with pytest.raises(Exception, match="refused by the test endpoint|Forbidden|403"):
            spark.sql(f"SHOW NAMESPACES IN {probe}").collect()
    finally:
        system.clearProperty("aws.accessKeyId")
        system.clearProperty("aws.secretAccessKey")
    assert_signed_config_request(endpoint.requests)


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        ({"type": "s3tables", "warehouse": "s3://bucket/warehouse"}, "warehouse is its table bucket's ARN"),
        ({"type": "s3tables"}, "warehouse is its table bucket's ARN"),
        ({"type": "s3tables", "warehouse": BUCKET_ARN.replace("icefloe-tables-eu", "Bad_Name")}, "table bucket's ARN"),
        (
            {"type": "s3tables", "warehouse": BUCKET_ARN, "endpoints": {"glue": "http://h:1", "s3": "http://h:1"}},
            "endpoints apply to a glue or rest catalog only",
        ),
    ],
)
def test_an_s3_tables_catalog_needs_its_bucket_arn(catalog, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"sourceClusters": [{"name": "c", "bootstrapServers": "b:9092"}], "catalog": catalog})


# --- infra under Pulumi's mocks -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def program():
    from pulumi_mocks import run_program

    return run_program(AWS_NATIVE)


def test_the_stack_creates_the_table_bucket_and_a_namespace_per_database_instead_of_glue(program):
    bucket = program.one(TABLE_BUCKET)
    assert bucket.inputs["name"] == "icefloe-tables-eu" and bucket.inputs["forceDestroy"] is False
    assert bucket.inputs["maintenanceConfiguration"] == {
        "icebergUnreferencedFileRemoval": {
            "status": "enabled",
            "settings": {"unreferencedDays": 3, "nonCurrentDays": 10},
        }
    }
    assert bucket.inputs["tags"]["icefloe:stack"] == "aws-native"
    (namespace,) = program.of_type(NAMESPACE)
    assert namespace.inputs == {"namespace": "orders", "tableBucketArn": bucket.outputs["arn"]}
    assert program.of_type("aws:glue/catalogDatabase:CatalogDatabase") == []
    assert program.outputs["tableBucketArn"] == bucket.outputs["arn"] == BUCKET_ARN
    assert program.outputs["glueDatabases"] == []


def test_the_job_writes_through_the_table_bucket_and_nowhere_else(program):
    statements = policy_of(program, "icefloe-job-role")
    assert statements["TableBucket"]["Resource"] == [BUCKET_ARN]
    assert statements["TableBucket"]["Action"] == [
        "s3tables:GetTableBucket",
        "s3tables:ListNamespaces",
        "s3tables:GetNamespace",
        "s3tables:ListTables",
        "s3tables:CreateTable",
    ]
    assert statements["Tables"]["Resource"] == [BUCKET_ARN + "/table/*"]
    assert statements["Tables"]["Action"] == [
        "s3tables:GetTable",
        "s3tables:GetTableMetadataLocation",
        "s3tables:UpdateTableMetadataLocation",
        "s3tables:GetTableData",
        "s3tables:PutTableData",
    ]
    # No warehouse prefix, no Glue, no namespace or table deletion, nothing on other buckets.
    assert not {"WarehouseReadWrite", "ListWarehouse", "GlueTables"} & set(statements)
    actions = {a for s in statements.values() for a in s["Action"]}
    assert not {"s3tables:DeleteTable", "s3tables:CreateNamespace", "s3tables:DeleteNamespace"} & actions
    assert not [a for a in actions if a.endswith("*")]


def test_external_access_reads_the_table_bucket_only(tmp_path):
    from pulumi_mocks import run_program

    document = yaml.safe_load(AWS_NATIVE.read_text())
    document["config"]["icefloe:externalAccess"] = [
        {"name": "athena", "principalArn": "arn:aws:iam::111122223333:role/analytics", "externalId": "ext-1234"}
    ]
    stack = tmp_path / "Pulumi.aws-native.yaml"
    stack.write_text(yaml.safe_dump(document))
    statements = policy_of(run_program(stack), "icefloe-athena-role")
    assert statements == {
        "ReadTableBucket": {
            "Sid": "ReadTableBucket",
            "Effect": "Allow",
            "Resource": [BUCKET_ARN],
            "Action": [
                "s3tables:GetTableBucket",
                "s3tables:ListNamespaces",
                "s3tables:GetNamespace",
                "s3tables:ListTables",
            ],
        },
        "ReadTables": {
            "Sid": "ReadTables",
            "Effect": "Allow",
            "Resource": [BUCKET_ARN + "/table/*"],
            "Action": ["s3tables:GetTable", "s3tables:GetTableMetadataLocation", "s3tables:GetTableData"],
        },
    }


def test_the_job_runs_with_the_s3_tables_catalog(program, tmp_path):
    from icefloe.spec import load_config

    body = program.named("icefloe-runtime-job-config").inputs["content"]
    assert json.loads(body)["config"]["icefloe:catalog"] == {"type": "s3tables", "warehouse": BUCKET_ARN}
    (tmp_path / "job.json").write_text(body)
    assert load_config(str(tmp_path / "job.json")).catalog == s3_tables()  # what the job itself validates
    (schedule, *_) = program.of_type("aws:scheduler/schedule:Schedule")
    parameters = json.loads(schedule.inputs["target"]["input"])["JobDriver"]["SparkSubmit"]["SparkSubmitParameters"]
    conf = dict(word.split("=", 1) for word in parameters.split() if word != "--conf")
    prefix = f"spark.sql.catalog.{CATALOG}"
    expected = {k: v for k, v in spark_catalog_conf(s3_tables()).items() if k.startswith(prefix)}
    assert {k: v for k, v in conf.items() if k.startswith(prefix)} == expected


def test_names_s3_tables_refuses_fail_at_preview(tmp_path):
    from pulumi_mocks import run_program

    document = yaml.safe_load(AWS_NATIVE.read_text())
    document["config"]["icefloe:tables"][0]["table"] = "_orders"  # a valid Glue name, not an S3 Tables name
    stack = tmp_path / "Pulumi.bad.yaml"
    stack.write_text(yaml.safe_dump(document))
    with pytest.raises(
        ConfigError, match=r"icefloe:tables\[0\] \(orders\): table '_orders' is not a valid S3 Tables name"
    ):
        run_program(stack)
    document["config"]["icefloe:storage"] = {"tableBucketName": "icefloe-tables-eu"}
    stack.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError, match="tableBucketName is only used with type: s3tables"):
        run_program(stack)


def test_the_bucket_name_defaults_to_the_stack(tmp_path):
    from pulumi_mocks import run_program

    document = yaml.safe_load(AWS_NATIVE.read_text())
    del document["config"]["icefloe:storage"]["tableBucketName"]
    stack = tmp_path / "Pulumi.Dev_EU.yaml"
    stack.write_text(yaml.safe_dump(document))
    assert run_program(stack).one(TABLE_BUCKET).inputs["name"] == "icefloe-dev-eu"


def test_the_pack_rejects_table_writes_on_every_bucket():
    from icefloe_policies.runner import Resource, run_pack

    broad = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": ["s3tables:PutTableData"], "Resource": ["arn:aws:s3tables:*:*:bucket/*"]}
            ],
        }
    )
    violations = run_pack([Resource("aws:iam/rolePolicy:RolePolicy", "job", {"role": "r", "policy": broad})])
    assert [v.policy for v in violations] == ["iam-no-unscoped-data-writes"]


# --- replayed against moto -----------------------------------------------------------------------------------


@pytest.fixture
def s3tables(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": MOTO_REGION,
    }.items():
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        yield boto3.client("s3tables", region_name=MOTO_REGION)


def test_the_table_bucket_and_namespaces_are_accepted_by_the_s3tables_api(program, s3tables):
    from test_infra_moto import call, check_constraints

    bucket = program.one(TABLE_BUCKET).inputs
    arn = call(s3tables, "create_table_bucket", name=bucket["name"])["arn"]
    assert arn == f"arn:aws:s3tables:{MOTO_REGION}:123456789012:bucket/{bucket['name']}"
    CatalogSpec(type="s3tables", warehouse=arn)  # the ARN the API hands back is one the catalog takes
    for namespace in program.of_type(NAMESPACE):
        call(s3tables, "create_namespace", tableBucketARN=arn, namespace=[namespace.inputs["namespace"]])
    assert [n["namespace"] for n in s3tables.list_namespaces(tableBucketARN=arn)["namespaces"]] == [["orders"]]
    # The job's control-plane calls, as the REST endpoint makes them: find the bucket and namespace, create a
    # table, read its metadata location (where S3 Tables keeps the table's data: its own bucket).
    assert s3tables.get_table_bucket(tableBucketARN=arn)["name"] == bucket["name"]
    assert s3tables.get_namespace(tableBucketARN=arn, namespace="orders")["namespace"] == ["orders"]
    call(s3tables, "create_table", tableBucketARN=arn, namespace="orders", name="orders", format="ICEBERG")
    location = s3tables.get_table_metadata_location(tableBucketARN=arn, namespace="orders", name="orders")
    assert location["warehouseLocation"].startswith("s3://") and location["warehouseLocation"].endswith("--table-s3")
    # Maintenance configuration: moto does not implement PutTableBucketMaintenanceConfiguration; the provider's
    # input, in the API's shape, is held to the service model instead.
    removal = bucket["maintenanceConfiguration"]["icebergUnreferencedFileRemoval"]
    request = {
        "tableBucketARN": arn,
        "type": "icebergUnreferencedFileRemoval",
        "value": {
            "status": removal["status"],
            "settings": {"icebergUnreferencedFileRemoval": {k: int(v) for k, v in removal["settings"].items()}},
        },
    }
    model = s3tables.meta.service_model.operation_model("PutTableBucketMaintenanceConfiguration")
    from botocore.validate import validate_parameters

    validate_parameters(request, model.input_shape)
    check_constraints(model.input_shape, request)
    with pytest.raises(NotImplementedError):
        s3tables.put_table_bucket_maintenance_configuration(**request)
