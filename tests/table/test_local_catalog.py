"""The local catalog: Iceberg's JDBC catalog on one SQLite file under the state directory."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from icefloe.table.catalog import CATALOG, local_paths

HELD_S = 5.0  # longer than SQLite's default busy timeout (3 s)


@pytest.mark.spark
def test_a_catalog_change_waits_for_another_process_holding_the_local_catalog(spark, state_dir):
    """Runs on one machine share the catalog's file (two tables' runs at once, a run beside maintenance or a reader):
    a commit that finds it locked waits for it, instead of failing with SQLITE_BUSY after the driver's default 3 s
    (a busy machine holds the lock longer than that: runs of the test suite failed on it)."""
    namespace = f"{CATALOG}.waits_for_the_lock"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    holder = sqlite3.connect(local_paths(state_dir)[0], timeout=30, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(HELD_S, holder.execute, ["COMMIT"])
    started = time.monotonic()
    release.start()
    try:
        spark.sql(f"CREATE TABLE {namespace}.t (x int) USING iceberg")
    finally:
        release.join()
        holder.close()
    assert time.monotonic() - started >= HELD_S
    assert spark.table(f"{namespace}.t").count() == 0
    spark.sql(f"DROP TABLE {namespace}.t")
