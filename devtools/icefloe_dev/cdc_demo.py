"""`icefloe demo --cdc`: change data capture on one machine, the way a newcomer first sees it.

PostgreSQL (a private cluster) -> Debezium in Kafka Connect (Avro through the registry) -> the broker -> icefloe
(`envelope: debezium, mode: upsert`) -> an Iceberg mirror table, read back with DuckDB and printed next to the
database's own rows. Everything is stopped at the end; the table stays in the state directory.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from icefloe.operate.runner import run_table
from icefloe.spec import load_config

from .cdc_workload import DDL, MARKER_TABLE, TABLE, Workload, mark, mirror_differences, typed_rows, wait_for_marker
from .demo import local_services, local_spark, write_stack_config
from .kafka_connect import KafkaConnect, debezium_postgres
from .postgres import PostgresCluster
from .readers import duckdb_connect

CONNECTOR = "demo"  # topics demo.public.<table>
DATABASE = "shop"
SEED = 7


@contextmanager
def local_postgres(state_dir: Path) -> Iterator[PostgresCluster]:
    with PostgresCluster(state_dir / "postgres") as cluster:
        yield cluster


def write_cdc_config(path: Path, bootstrap: str, registry_url: str, topic: str) -> Path:
    """The table a user declares for a Debezium topic (`Pulumi.<stack>.yaml`)."""
    table = {
        "topic": topic,
        "table": "customers",
        "format": "avro",
        "envelope": "debezium",
        "mode": "upsert",
        "errors": "fail",
    }
    return write_stack_config(path, bootstrap, registry_url, table)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and len(value) > 24:
        return f"<{len(value):,} chars>"  # the TOASTed notes
    if isinstance(value, list):
        return "[" + ",".join("null" if v is None else str(v) for v in value) + "]"
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat(timespec="seconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    return "null" if value is None else str(value)


SHOWN = ["id", "name", "notes", "balance", "updated_at", "active", "tags"]


def _print_rows(say, title: str, rows: list[dict]) -> None:
    cells = [[_cell(row[c]) for c in SHOWN] for row in sorted(rows, key=lambda r: r["id"])]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(SHOWN)]
    say(f"      {title}")
    say("      " + "  ".join(c.ljust(w) for c, w in zip(SHOWN, widths)))
    for row in cells:
        say("      " + "  ".join(v.ljust(w) for v, w in zip(row, widths)))


def run_cdc_demo(state_dir: Path, as_json: bool = False) -> int:
    state_dir = (state_dir / "demo-cdc").resolve()
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)

    def say(text: str) -> None:
        print(text, file=sys.stderr if as_json else sys.stdout, flush=True)

    say(f"icefloe demo --cdc: state directory {state_dir}")
    say("[1/5] starting Apache Kafka, Apicurio Registry and PostgreSQL")
    workload = Workload(SEED)
    with local_services(state_dir) as (broker, registry), local_postgres(state_dir) as postgres:
        database = postgres.create_database(DATABASE)
        postgres.sql(DDL + workload.initial_rows(6), database=database)
        say(f"      PostgreSQL at {postgres.dsn.rsplit('/', 1)[0]}/{database}: table {TABLE} with 6 rows")
        say("[2/5] starting Kafka Connect with Debezium's PostgreSQL connector (Avro through the registry)")
        connector = debezium_postgres(
            CONNECTOR, postgres, [f"public.{TABLE}", f"public.{MARKER_TABLE}"], "avro", registry.url, 3, database
        )
        topic = f"{CONNECTOR}.public.{TABLE}"
        worker = KafkaConnect(state_dir / "connect", broker.bootstrap_servers, [connector])
        try:
            started = time.monotonic()
            worker.start()
            worker.wait_streaming()
            say(f"      snapshot taken in {time.monotonic() - started:.1f}s; change events go to '{topic}'")
            say("[3/5] changing the database: inserts, updates, deletes, a primary-key change, transactions")
            before = dict(workload.counts)
            postgres.sql(workload.changes(14), database=database)
            mark(postgres, 1, database)
            wait_for_marker(broker.bootstrap_servers, {f"{CONNECTOR}.public.{MARKER_TABLE}": "avro"}, 1, registry.url)
            done = {k: v - before.get(k, 0) for k, v in workload.counts.items() if v - before.get(k, 0)}
            say("      " + ", ".join(f"{what}: {n}" for what, n in done.items()))
        finally:
            worker.stop()
        config_path = write_cdc_config(state_dir / "Pulumi.local.yaml", broker.bootstrap_servers, registry.url, topic)
        config = load_config(str(config_path))
        say("[4/5] materializing the mirror table with Spark (envelope: debezium, mode: upsert)")
        with local_spark(config.catalog, state_dir) as spark:
            result = run_table(spark, config, config.tables[0], state_dir)
            say(f"      {result.describe()}")
        source = typed_rows(postgres.rows(f"SELECT * FROM {TABLE}", database=database))
    say("[5/5] the database's rows, and the mirror table's (DuckDB, iceberg_scan)")
    metadata = result.metadata_location
    table_rows: list[dict] = []
    if metadata:
        cursor = duckdb_connect().execute(f"SELECT * FROM iceberg_scan('{metadata}')")
        names = [d[0] for d in cursor.description]
        table_rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    differences = mirror_differences(source, table_rows)
    _print_rows(say, f"PostgreSQL: SELECT * FROM {TABLE}", source)
    _print_rows(say, f"Iceberg: {result.identifier}", [dict(r) for r in table_rows])
    say(f"      the mirror equals the source: {'yes' if not differences else 'NO'}")
    for line in differences[:20]:
        say(f"        {line}")
    say(
        "\nQuery it again (the services have stopped; the table stays in the state directory):\n"
        f'  {sys.executable} -c "from icefloe_dev.readers import duckdb_connect; '
        f'print(duckdb_connect().sql(\\"SELECT * FROM iceberg_scan(\'{metadata}\')\\"))"\n'
        f"  the table's config: {config_path}"
    )
    if as_json:
        summary = {
            "table": result.identifier,
            "topic": topic,
            "metadata_location": metadata,
            "changes": dict(workload.counts),
            "source_rows": len(source),
            "table_rows": len(table_rows),
            "equal": not differences,
            "differences": len(differences),
        }
        print(json.dumps(summary, sort_keys=True), flush=True)
    return 0 if not differences else 1
