"""Ready-to-paste snippets for querying the tables from Athena, DuckDB and Snowflake (a stack output).

They name the first declared table; every table works the same way. No secret goes in here (the output is plain):
where an ExternalId is needed, the snippet says where to read it.
"""

from __future__ import annotations

from icefloe.spec import CatalogSpec


def query_snippets(
    account_id: str,
    region: str,
    tables: list[str],
    warehouse_uri: str,
    external_role_arns: dict[str, str],
    rest: CatalogSpec | None = None,
) -> dict[str, str]:
    """`rest`: the stack's tables are in this Iceberg REST catalog, which Snowflake then reads through a REST catalog
    integration (Athena and DuckDB's Glue attach do not apply)."""
    if rest is not None:
        return {"snowflake": snowflake_rest_snippet(rest, tables)}
    database, table = tables[0].split(".", 1) if tables else ("<database>", "<table>")
    bucket_url = warehouse_uri.rsplit("/", 1)[0] + "/"
    role = external_role_arns.get("snowflake") or next(iter(external_role_arns.values()), "<external access role ARN>")
    athena = (
        f"-- Athena (engine v3) in {region}, workgroup of your choice\n"
        f'SELECT count(*), max(kafka_timestamp) FROM "{database}"."{table}";\n'
        f'SELECT committed_at, summary FROM "{database}"."{table}$snapshots" ORDER BY committed_at DESC LIMIT 5;'
    )
    duckdb = (
        "-- DuckDB 1.3+ with your AWS credentials (the iceberg, aws and httpfs extensions)\n"
        "INSTALL aws; INSTALL httpfs; INSTALL iceberg;\n"
        f"CREATE SECRET (TYPE s3, PROVIDER credential_chain, REGION '{region}');\n"
        f"ATTACH '{account_id}' AS icefloe (TYPE iceberg, ENDPOINT_TYPE glue);\n"
        f"SELECT count(*) FROM icefloe.{database}.{table};"
    )
    snowflake = (
        "-- Snowflake: read through the Glue catalog with the external access role. Create the catalog\n"
        "-- integration, run DESCRIBE CATALOG INTEGRATION icefloe_glue, and put GLUE_AWS_IAM_USER_ARN and\n"
        "-- GLUE_AWS_EXTERNAL_ID into icefloe:externalAccess (principalArn, externalId); `pulumi up`.\n"
        f"CREATE CATALOG INTEGRATION icefloe_glue CATALOG_SOURCE = GLUE CATALOG_NAMESPACE = '{database}'\n"
        f"  TABLE_FORMAT = ICEBERG GLUE_AWS_ROLE_ARN = '{role}' GLUE_CATALOG_ID = '{account_id}'\n"
        f"  GLUE_REGION = '{region}' ENABLED = TRUE;\n"
        "-- STORAGE_AWS_EXTERNAL_ID: the same ExternalId (pulumi stack output externalIds --show-secrets)\n"
        "CREATE EXTERNAL VOLUME icefloe_lake STORAGE_LOCATIONS = ((NAME = 'icefloe' STORAGE_PROVIDER = 'S3'\n"
        f"  STORAGE_BASE_URL = '{bucket_url}' STORAGE_AWS_ROLE_ARN = '{role}'\n"
        "  STORAGE_AWS_EXTERNAL_ID = '<externalId>'));\n"
        f"CREATE ICEBERG TABLE {table} EXTERNAL_VOLUME = 'icefloe_lake' CATALOG = 'icefloe_glue'\n"
        f"  CATALOG_TABLE_NAME = '{table}' AUTO_REFRESH = TRUE;\n"
        f"SELECT count(*) FROM {table};"
    )
    return {"athena": athena, "duckdb": duckdb, "snowflake": snowflake}


def snowflake_rest_snippet(rest: CatalogSpec, tables: list[str]) -> str:
    """Snowflake reading the tables through its Iceberg REST catalog integration (CATALOG_SOURCE = ICEBERG_REST)."""
    database, table = tables[0].split(".", 1) if tables else ("<database>", "<table>")
    if rest.token is not None:
        auth = "TYPE = BEARER BEARER_TOKEN = '<the token in your secret>'"
    else:
        scopes = f" OAUTH_ALLOWED_SCOPES = ('{rest.scope}')" if rest.scope else ""
        auth = f"TYPE = OAUTH OAUTH_CLIENT_ID = '<client id>' OAUTH_CLIENT_SECRET = '<client secret>'{scopes}"
    vended = rest.access_delegation == "vended-credentials"
    delegation = " ACCESS_DELEGATION_MODE = VENDED_CREDENTIALS" if vended else ""
    volume = "" if vended else " EXTERNAL_VOLUME = '<external volume on the catalog's storage>'"
    return (
        "-- Snowflake: read through the Iceberg REST catalog the job writes to. The credentials are the catalog's\n"
        "-- own (its secret in Secrets Manager; a read-only principal is better): they are not shown here.\n"
        f"CREATE CATALOG INTEGRATION icefloe_rest CATALOG_SOURCE = ICEBERG_REST TABLE_FORMAT = ICEBERG\n"
        f"  CATALOG_NAMESPACE = '{database}'\n"
        f"  REST_CONFIG = (CATALOG_URI = '{rest.uri}' CATALOG_NAME = '{rest.warehouse or '<warehouse>'}'{delegation})\n"
        f"  REST_AUTHENTICATION = ({auth})\n"
        "  ENABLED = TRUE;\n"
        f"CREATE ICEBERG TABLE {table} CATALOG = 'icefloe_rest' CATALOG_TABLE_NAME = '{table}'{volume}\n"
        "  AUTO_REFRESH = TRUE;\n"
        f"SELECT count(*) FROM {table};"
    )
