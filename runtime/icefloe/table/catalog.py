"""The Iceberg catalog icefloe writes to, as Spark configuration.

One function builds the `spark.sql.catalog.icefloe.*` settings for both places a job runs: locally (a SQLite JDBC
catalog that pyiceberg's SqlCatalog reads too) and on EMR Serverless (AWS Glue with S3FileIO, any Iceberg REST
catalog, or an S3 table bucket: a preset of REST). The Pulumi program renders the AWS variant into the job's Spark
parameters, so the two never drift apart. The Glue variant also runs off AWS (against a moto server) with the same
settings plus the catalog's `endpoints`. A REST catalog's credential or token is never in those settings: the run
resolves its secret reference when it opens the catalog (`rest_secret_properties`), in memory only.
"""

from __future__ import annotations

from pathlib import Path

from icefloe.spec import CatalogSpec

CATALOG = "icefloe"
# EMR 7.x ships Iceberg in the image; enabling it puts this jar on the classpath.
EMR_ICEBERG_JAR = "/usr/share/aws/iceberg/lib/iceberg-spark3-runtime.jar"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def local_paths(state_dir: Path) -> tuple[Path, Path]:
    """(SQLite catalog file, warehouse directory) under the local state directory."""
    state_dir = state_dir.resolve()
    return state_dir / "catalog.db", state_dir / "warehouse"


def spark_catalog_conf(catalog: CatalogSpec, state_dir: Path | None = None) -> dict[str, str]:
    prefix = f"spark.sql.catalog.{CATALOG}"
    conf = {
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        # Always read the latest table state: offsets in the snapshot are the source of truth.
        f"{prefix}.cache-enabled": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    if catalog.type == "local":
        if state_dir is None:
            raise ValueError("a local catalog needs a state directory")
        db_file, warehouse = local_paths(state_dir)
        warehouse.mkdir(parents=True, exist_ok=True)
        conf |= {
            f"{prefix}.type": "jdbc",
            f"{prefix}.uri": f"jdbc:sqlite:{db_file}",
            f"{prefix}.jdbc.schema-version": "V1",
            f"{prefix}.warehouse": catalog.warehouse or warehouse.as_uri(),
        }
    elif catalog.type in ("rest", "s3tables"):
        conf |= {f"{prefix}.{key}": value for key, value in rest_properties(catalog).items()}
        if catalog.type == "s3tables":
            # Data through S3FileIO (iceberg-aws-bundle); the endpoint does not take Iceberg's metrics reports.
            conf |= {
                f"{prefix}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                f"{prefix}.rest-metrics-reporting-enabled": "false",
            }
    else:
        if not catalog.warehouse:
            raise ValueError("a glue catalog needs a warehouse (s3://bucket/prefix)")
        conf |= {
            f"{prefix}.type": "glue",
            f"{prefix}.warehouse": catalog.warehouse,
            f"{prefix}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            # Glue keeps an archived table version per commit unless told not to (a known Glue limit).
            f"{prefix}.glue.skip-archive": "true",
        }
        if catalog.endpoints is not None:
            # Off AWS only (e.g. a moto server): the EMR job's settings never carry endpoints (see CatalogEndpoints).
            conf |= {
                f"{prefix}.glue.endpoint": catalog.endpoints.glue or "",  # set for a glue catalog (validated)
                f"{prefix}.s3.endpoint": catalog.endpoints.s3,
                f"{prefix}.s3.path-style-access": "true",  # an endpoint like 127.0.0.1:port has no bucket subdomains
            }
            if catalog.endpoints.region:
                conf[f"{prefix}.client.region"] = catalog.endpoints.region
    return conf


def rest_properties(catalog: CatalogSpec) -> dict[str, str]:
    """An Iceberg REST catalog's properties, the same keys for Iceberg Java (Spark) and pyiceberg, without secrets.

    S3 Tables (a preset, `CatalogSpec.as_rest`) as AWS documents it for both ("Accessing tables using the Amazon S3
    Tables Iceberg REST endpoint"). Iceberg 1.10 reads `rest.sigv4-enabled` still (with a deprecation warning for
    `rest.auth.type=sigv4`), pyiceberg only that key: the documented key is kept."""
    rest = catalog.as_rest()
    properties = {"type": "rest", "uri": rest.uri or ""}
    if rest.warehouse:
        properties["warehouse"] = rest.warehouse
    if rest.scope:
        properties["scope"] = rest.scope
    if rest.oauth2_server_uri:
        properties["oauth2-server-uri"] = rest.oauth2_server_uri
    headers = dict(rest.headers)
    if rest.access_delegation:  # the server vends storage credentials (or signs requests) for the tables it serves
        headers["X-Iceberg-Access-Delegation"] = rest.access_delegation
    properties |= {f"header.{name}": value for name, value in headers.items()}
    if rest.signing is not None:
        properties |= {
            "rest.sigv4-enabled": "true",
            "rest.signing-name": rest.signing.service,
            "rest.signing-region": rest.signing.region,
        }
    if rest.endpoints is not None:  # off AWS only (a moto server): the S3 holding the server's tables
        properties |= {"s3.endpoint": rest.endpoints.s3, "s3.path-style-access": "true"}
        if rest.endpoints.region:
            properties["client.region"] = rest.endpoints.region
    return properties


def rest_secret_properties(catalog: CatalogSpec) -> dict[str, str]:
    """The REST catalog's `credential` (OAuth2 `client_id:client_secret`) or `token`, resolved from its secret
    reference now: for the run's own session only, never rendered into job parameters or logged."""
    from icefloe.credentials import resolve_client_credential, resolve_token

    what = f"catalog {catalog.uri}"
    if catalog.type != "rest":
        return {}
    if catalog.credential is not None:
        return {"credential": ":".join(resolve_client_credential(catalog.credential, f"{what}: credential"))}
    if catalog.token is not None:
        return {"token": resolve_token(catalog.token, f"{what}: token")}
    return {}


def spark_secret_conf(catalog: CatalogSpec) -> dict[str, str]:
    """`rest_secret_properties` as Spark settings of the catalog."""
    return {f"spark.sql.catalog.{CATALOG}.{key}": value for key, value in rest_secret_properties(catalog).items()}


def pyiceberg_catalog(catalog: CatalogSpec, state_dir: Path | None = None, read_only: bool = True):
    """The same catalog for pyiceberg (no Spark): reading tables' metadata from the command line (`icefloe status`).

    Locally pyiceberg's SqlCatalog over the SQLite file Spark's JDBC catalog writes, opened read-only unless asked
    (a missing file is then an error, not a new empty catalog); for Glue pyiceberg's GlueCatalog with the default
    credentials and region (and the catalog's endpoints off AWS); for a REST catalog (S3 Tables too) pyiceberg's REST
    catalog with the same properties as Spark's. Needs pyiceberg (the `local` extra).
    """
    try:
        from pyiceberg.catalog.glue import GlueCatalog
        from pyiceberg.catalog.sql import SqlCatalog
    except ImportError:
        from icefloe.errors import ConfigError

        raise ConfigError("reading tables without Spark needs pyiceberg: pip install 'icefloe[local]'") from None
    if catalog.type == "local":
        if state_dir is None:
            raise ValueError("a local catalog needs a state directory")
        db_file, warehouse = local_paths(state_dir)
        uri = f"sqlite:///file:{db_file}?mode=ro&uri=true" if read_only else f"sqlite:///{db_file}"
        return SqlCatalog(
            CATALOG,
            uri=uri,
            warehouse=catalog.warehouse or warehouse.as_uri(),
            init_catalog_tables=str(not read_only).lower(),
        )
    if catalog.type in ("rest", "s3tables"):
        from pyiceberg.catalog import load_catalog

        return load_catalog(CATALOG, **rest_properties(catalog), **rest_secret_properties(catalog))
    if not catalog.warehouse:
        raise ValueError("a glue catalog needs a warehouse (s3://bucket/prefix)")
    properties = {"warehouse": catalog.warehouse}
    if catalog.endpoints is not None:  # off AWS (a moto server); credentials still come from the environment
        properties |= {"glue.endpoint": catalog.endpoints.glue or "", "s3.endpoint": catalog.endpoints.s3}
        if catalog.endpoints.region:
            properties["client.region"] = catalog.endpoints.region
    return GlueCatalog(CATALOG, **properties)
