"""`icefloe demo`: the whole path on one machine, the way a newcomer first sees icefloe work.

Apache Kafka broker + Apicurio Registry (started side by side) -> 100k stock trades (Avro, or with `--format`
Protobuf or JSON Schema, each through confluent-kafka's own serializer) -> Spark -> Iceberg table -> read back
through DuckDB. The broker and the registry are stopped when the demo ends; the table stays in
the state directory and can be queried again afterwards.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from icefloe.operate.runner import run_table
from icefloe.session import spark_session
from icefloe.source.kafka import close_admin_clients
from icefloe.spec import load_config

from . import stock_trades
from .kafka_broker import KafkaBroker
from .processes import start_together
from .producer import produce_avro
from .readers import duckdb_connect
from .schema_registry import SchemaRegistry

TOPIC = "stock_trades"


FORMATS = {"avro": "Avro", "protobuf": "Protobuf", "json-schema": "JSON Schema"}


def write_stack_config(path: Path, bootstrap: str, registry_url: str, table: dict) -> Path:
    """A stack config in the exact shape a user writes (`Pulumi.<stack>.yaml`): the local cluster and one table."""
    document = {
        "config": {
            "icefloe:sourceClusters": [
                {"name": "local", "bootstrapServers": bootstrap, "schemaRegistry": {"url": registry_url}}
            ],
            "icefloe:tables": [{"sourceCluster": "local", **table}],
        }
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def write_local_config(path: Path, bootstrap: str, registry_url: str, format: str = "avro") -> Path:
    """The demo's table: the stock trades, appended."""
    table = {
        "topic": TOPIC,
        "format": format,
        "mode": "append",
        "partitionBy": ["day(event_time)"],
        "errors": "fail",
        "startingOffsets": "earliest",
    }
    return write_stack_config(path, bootstrap, registry_url, table)


def _say(text: str) -> None:
    print(text, flush=True)


def _trades(format: str, records: int, work: Path):
    """(schema for the serializer, (key, value) pairs) of the demo trades in a format."""
    if format == "protobuf":
        from .protos import compile_protos, message_class

        trade = message_class(
            compile_protos({stock_trades.PROTO_FILE: stock_trades.PROTO}, work), "io.icefloe.demo.StockTrade"
        )
        return trade, ((k, stock_trades.as_protobuf(trade, v)) for k, v in stock_trades.trades(records))
    if format == "json-schema":
        return stock_trades.JSON_SCHEMA, ((k, stock_trades.as_json(v)) for k, v in stock_trades.trades(records))
    return stock_trades.SCHEMA, stock_trades.trades(records)


@contextmanager
def local_services(state_dir: Path) -> Iterator[tuple[KafkaBroker, SchemaRegistry]]:
    """A broker and a registry under `state_dir`, started side by side (their start-up times overlap), stopped at the
    end (the demo's, and the test session's)."""
    broker, registry = KafkaBroker(state_dir / "kafka"), SchemaRegistry(state_dir / "registry")
    start_together(broker, registry)
    try:
        yield broker, registry
    finally:
        close_admin_clients()  # the runtime's cached admin clients would reconnect to the stopped broker
        registry.stop()
        broker.stop()


@contextmanager
def local_spark(catalog, state_dir: Path) -> Iterator:
    spark = spark_session(catalog, state_dir, short_lived=True)  # a run of a few batches, as `run --once`
    try:
        yield spark
    finally:
        spark.stop()


def run_demo(records: int, partitions: int, state_dir: Path, format: str = "avro") -> int:
    # The demo broker and registry start empty each time, so each demo starts with an empty table too.
    state_dir = (state_dir / "demo").resolve()
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    _say(f"icefloe demo: state directory {state_dir}")
    _say("[1/4] starting Apache Kafka and Apicurio Registry")
    with local_services(state_dir) as (broker, registry):
        _say(f"      broker (Apache Kafka, KRaft) at {broker.bootstrap_servers}, log {broker.log_path}")
        _say(f"      schema registry (Apicurio, Confluent API) at {registry.url}, log {registry.log_path}")
        broker.create_topic(TOPIC, partitions)
        _say(f"[2/4] producing {records:,} {FORMATS[format]} stock trades to '{TOPIC}' ({partitions} partitions)")
        started = time.monotonic()
        schema, trades = _trades(format, records, state_dir)
        produce_avro(
            broker.bootstrap_servers,
            registry.url,
            TOPIC,
            schema,
            trades,
            total=records,
            progress=True,
            format=format,
        )
        _say(f"      done in {time.monotonic() - started:.1f}s")
        config_path = write_local_config(
            state_dir / "Pulumi.local.yaml", broker.bootstrap_servers, registry.url, format
        )
        config = load_config(str(config_path))
        _say("[3/4] materializing with Spark into Iceberg (Spark start takes a few seconds)")
        with local_spark(config.catalog, state_dir) as spark:
            result = run_table(spark, config, config.tables[0], state_dir)
            _say(f"      {result.describe()}")
            rerun = run_table(spark, config, config.tables[0], state_dir)
            _say(f"      second run: {rerun.describe()}")
    metadata = result.metadata_location or rerun.metadata_location
    _say("[4/4] reading the table back with DuckDB (iceberg_scan)")
    con = duckdb_connect()
    scan = f"iceberg_scan('{metadata}')"
    total = con.execute(f"SELECT count(*) FROM {scan}").fetchone()[0]
    _say(f"      rows in {result.identifier}: {total:,}")
    rows = con.execute(
        f"SELECT symbol, count(*) AS trades, sum(quantity) AS shares, round(avg(price), 2) AS avg_price "
        f"FROM {scan} GROUP BY symbol ORDER BY symbol"
    ).fetchall()
    _say(f"      {'symbol':<8}{'trades':>9}{'shares':>13}{'avg_price':>11}")
    for symbol, trades, shares, price in rows:
        _say(f"      {symbol:<8}{trades:>9,}{shares:>13,}{price:>11}")
    _say(
        "\nQuery it again (the table stays in the state directory; the demo's broker and registry have stopped):\n"
        f'  {sys.executable} -c "from icefloe_dev.readers import duckdb_connect; '
        f'print(duckdb_connect().sql(\\"SELECT side, count(*) FROM iceberg_scan(\'{metadata}\') GROUP BY side\\"))"\n'
        f"  or with pyiceberg: icefloe_dev.readers.pyiceberg_catalog(Path('{state_dir}'))"
        f".load_table('{result.identifier}').scan().to_arrow()\n"
        f"  materialize again against your own broker: icefloe run --config {config_path} --once"
    )
    return 0 if total >= records else 1
