"""Independent readers of icefloe's local tables: DuckDB (offline extensions) and pyiceberg (same SQLite catalog)."""

from __future__ import annotations

from pathlib import Path


def _extension(package: str, name: str) -> str:
    module = __import__(package)
    found = sorted(Path(module.__file__).parent.glob(f"extensions/*/{name}.duckdb_extension"))
    if not found:
        raise RuntimeError(f"{package} ships no {name}.duckdb_extension")
    return str(found[-1])


def duckdb_connect():
    """An in-memory DuckDB that can `iceberg_scan('<metadata.json>')` without downloading anything."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    # Iceberg manifests are Avro files: the Avro extension must be loaded first.
    con.execute(f"LOAD '{_extension('duckdb_extension_avro', 'avro')}'")
    con.execute(f"LOAD '{_extension('duckdb_extension_iceberg', 'iceberg')}'")
    return con


def pyiceberg_catalog(state_dir: Path):
    """pyiceberg's SqlCatalog over the SQLite file Spark's JDBC catalog writes (same catalog name: `icefloe`)."""
    from icefloe.spec import CatalogSpec
    from icefloe.table.catalog import pyiceberg_catalog as runtime_catalog

    return runtime_catalog(CatalogSpec(), state_dir, read_only=False)


def duckdb_over_s3_copy(client, bucket: str, prefix: str = ""):
    """A `duckdb_connect()` whose `s3://<bucket>/...` paths read copies of the bucket's objects under `prefix`, taken
    through `client` (boto3's S3 client of a moto server) when called: DuckDB's own S3 client (the httpfs extension)
    is not installed, so its Iceberg reader is given the files, at their own s3:// paths, through an fsspec
    filesystem in memory."""
    from fsspec.implementations.memory import MemoryFileSystem

    class S3Copy(MemoryFileSystem):
        protocol = ("s3",)
        store: dict = {}
        pseudo_dirs = [""]

        @classmethod
        def _strip_protocol(cls, path):
            return "/" + str(path).removeprefix("s3://").strip("/")

    files = S3Copy(skip_instance_cache=True)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            files.pipe(f"s3://{bucket}/{item['Key']}", body)
    con = duckdb_connect()
    con.register_filesystem(files)
    return con
