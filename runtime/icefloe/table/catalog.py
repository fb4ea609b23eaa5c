"""The Iceberg catalog icefloe writes to, as Spark configuration.

One function builds the `spark.sql.catalog.icefloe.*` settings for both places a job runs: locally (a SQLite JDBC
catalog that pyiceberg's SqlCatalog reads too) and on EMR Serverless (AWS Glue with S3FileIO, or an S3 table bucket
through its Iceberg REST endpoint). The Pulumi program renders the AWS variant into the job's Spark parameters, so
the two never drift apart. The Glue variant also runs
off AWS (against a moto server) with the same settings plus the catalog's `endpoints`.
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
    elif catalog.type == "s3tables":
        conf |= s3_tables_conf(prefix, catalog)
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
                f"{prefix}.glue.endpoint": catalog.endpoints.glue,
                f"{prefix}.s3.endpoint": catalog.endpoints.s3,
                f"{prefix}.s3.path-style-access": "true",  # an endpoint like 127.0.0.1:port has no bucket subdomains
            }
            if catalog.endpoints.region:
                conf[f"{prefix}.client.region"] = catalog.endpoints.region
    return conf


def s3_tables_endpoint(region: str) -> str:
    return f"https://s3tables.{region}.amazonaws.com/iceberg"


def s3_tables_conf(prefix: str, catalog: CatalogSpec) -> dict[str, str]:
    """An S3 table bucket through its Iceberg REST endpoint, as AWS documents it for Spark ("Accessing tables using
    the Amazon S3 Tables Iceberg REST endpoint"): requests signed with SigV4 for `s3tables`, the bucket's ARN as
    the warehouse, data read and written with S3FileIO (iceberg-aws-bundle), metrics reporting off (the endpoint
    does not take Iceberg's metrics reports). Iceberg 1.10 reads `rest.sigv4-enabled` still, with a deprecation
    warning for `rest.auth.type=sigv4`: the documented key is kept."""
    region = catalog.region
    return {
        f"{prefix}.type": "rest",
        f"{prefix}.uri": s3_tables_endpoint(region),  # type: ignore[arg-type]  # an S3 Tables catalog has region and warehouse (CatalogSpec)
        f"{prefix}.warehouse": catalog.warehouse,  # type: ignore[dict-item]  # an S3 Tables catalog has region and warehouse (CatalogSpec)
        f"{prefix}.rest.sigv4-enabled": "true",
        f"{prefix}.rest.signing-name": "s3tables",
        f"{prefix}.rest.signing-region": region,  # type: ignore[dict-item]  # an S3 Tables catalog has region and warehouse (CatalogSpec)
        f"{prefix}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        f"{prefix}.rest-metrics-reporting-enabled": "false",
    }


def pyiceberg_catalog(catalog: CatalogSpec, state_dir: Path | None = None, read_only: bool = True):
    """The same catalog for pyiceberg (no Spark): reading tables' metadata from the command line (`icefloe status`).

    Locally pyiceberg's SqlCatalog over the SQLite file Spark's JDBC catalog writes, opened read-only unless asked
    (a missing file is then an error, not a new empty catalog); for Glue pyiceberg's GlueCatalog with the default
    credentials and region (and the catalog's endpoints off AWS); for S3 Tables pyiceberg's REST catalog signed as
    AWS documents it. Needs pyiceberg (the `local` extra).
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
    if catalog.type == "s3tables":
        return _pyiceberg_s3_tables(catalog)
    if not catalog.warehouse:
        raise ValueError("a glue catalog needs a warehouse (s3://bucket/prefix)")
    properties = {"warehouse": catalog.warehouse}
    if catalog.endpoints is not None:  # off AWS (a moto server); credentials still come from the environment
        properties |= {"glue.endpoint": catalog.endpoints.glue, "s3.endpoint": catalog.endpoints.s3}
        if catalog.endpoints.region:
            properties["client.region"] = catalog.endpoints.region
    return GlueCatalog(CATALOG, **properties)


def pyiceberg_s3_tables_properties(catalog: CatalogSpec) -> dict[str, str]:
    """pyiceberg's REST catalog properties for an S3 table bucket (AWS's PyIceberg example for the endpoint)."""
    return {
        "type": "rest",
        "uri": s3_tables_endpoint(catalog.region),  # type: ignore[arg-type]  # an S3 Tables catalog has region and warehouse (CatalogSpec)
        "warehouse": catalog.warehouse,  # type: ignore[dict-item]  # an S3 Tables catalog has region and warehouse (CatalogSpec)
        "rest.sigv4-enabled": "true",
        "rest.signing-name": "s3tables",
        "rest.signing-region": catalog.region,  # type: ignore[dict-item]  # an S3 Tables catalog has region and warehouse (CatalogSpec)
    }


def _pyiceberg_s3_tables(catalog: CatalogSpec):
    from pyiceberg.catalog import load_catalog

    return load_catalog(CATALOG, **pyiceberg_s3_tables_properties(catalog))
