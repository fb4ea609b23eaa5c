"""Ready-to-paste snippets for querying the tables from Athena, DuckDB and Snowflake (stack outputs)."""

from __future__ import annotations


def query_snippets(region: str, tables: list[str], warehouse_uri: str, external_role_arns: dict[str, str]) -> dict[str, str]:
    table = tables[0] if tables else "<database>.<table>"
    database, name = table.split(".") if "." in table else ("<database>", table)
    snowflake_role = next(iter(external_role_arns.values()), "<external access role ARN>")
    return {
        "athena": f'SELECT * FROM "{database}"."{name}" LIMIT 10;  -- Athena engine v3, region {region}',
        "duckdb": (
            "INSTALL iceberg; LOAD iceberg; CREATE SECRET (TYPE s3, PROVIDER credential_chain); "
            f"SELECT count(*) FROM iceberg_scan('{warehouse_uri}/{database}.db/{name}');"
        ),
        "snowflake": (
            f"CREATE CATALOG INTEGRATION icefloe_glue CATALOG_SOURCE = GLUE CATALOG_NAMESPACE = '{database}' "
            f"TABLE_FORMAT = ICEBERG GLUE_AWS_ROLE_ARN = '{snowflake_role}' GLUE_CATALOG_ID = '<account id>' "
            f"GLUE_REGION = '{region}' ENABLED = TRUE;  -- then CREATE ICEBERG TABLE ... CATALOG_TABLE_NAME = '{name}'"
        ),
    }
