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
