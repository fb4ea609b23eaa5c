"""The local catalog: Iceberg's JDBC catalog on one SQLite file, shared by every run on the machine.

Iceberg 1.10's `JdbcCatalog`, opening a catalog file that already has the views column (`iceberg_type`: any file an
earlier run or pyiceberg wrote), never closes the `DatabaseMetaData.getColumns` result of that schema check
(`updateSchemaIfRequired`). The open statement keeps SQLite's read lock on the file for as long as its connection
lives, which is the catalog's life: until the run exited, no other process could commit to the catalog (two tables'
runs at once, maintenance beside a run, another writer). A continuous run held it for ever. Each such commit waited
for SQLite's busy timeout and failed with SQLITE_BUSY. `release_read_lock` swaps that connection for a new one.
"""

from __future__ import annotations

from icefloe.table.catalog import CATALOG

JDBC_CATALOG = "org.apache.iceberg.jdbc.JdbcCatalog"


def release_read_lock(spark) -> None:
    """Open the session's `icefloe` catalog and, if it is a JDBC catalog (the local one: SQLite), replace its pooled
    connections (the one that ran the schema check holds the leaked statement) with new ones. Call it before the session's
    catalog is in use by other threads: the pool is changed without its lock."""
    jvm = spark._jvm
    catalog = spark._jsparkSession.sessionState().catalogManager().catalog(CATALOG).icebergCatalog()
    if catalog.getClass().getName() != JDBC_CATALOG:
        return
    gateway = spark.sparkContext._gateway
    loader = catalog.getClass().getClassLoader()  # Iceberg's: the driver's class path, or `spark.jars`' loader

    def declared(class_name: str):
        return jvm.java.lang.Class.forName(class_name, True, loader)

    pool = _accessible(declared(JDBC_CATALOG).getDeclaredField("connections")).get(catalog)
    clients = _accessible(declared("org.apache.iceberg.ClientPoolImpl").getDeclaredField("clients")).get(pool)
    parameter_types = gateway.new_array(jvm.java.lang.Class, 1)
    parameter_types[0] = declared("java.sql.Connection")
    reconnect = _accessible(
        declared("org.apache.iceberg.jdbc.JdbcClientPool").getDeclaredMethod("reconnect", parameter_types)
    )
    for connection in list(clients.toArray()):
        arguments = gateway.new_array(jvm.java.lang.Object, 1)
        arguments[0] = connection
        fresh = reconnect.invoke(pool, arguments)  # closes the connection (finalizing its statements), opens anew
        clients.remove(connection)
        clients.addFirst(fresh)


def _accessible(member):
    """A private field or protected method of Iceberg's, made usable (Iceberg is on the class path, not a module)."""
    member.setAccessible(True)
    return member
