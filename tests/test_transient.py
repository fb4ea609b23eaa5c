"""Which failures a run retries (runner.run_table backs off and re-plans) and which it reports at once."""

from __future__ import annotations

import pytest

from icefloe.errors import ConfigError, RecordError, is_transient

# What the local JDBC catalog raises when another run holds SQLite's write lock (seen with two overlapping writers).
SQLITE_BUSY = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling o123.commit.\n"
    ": org.apache.iceberg.jdbc.UncheckedSQLException: Failed to execute: ...\n"
    "Caused by: org.sqlite.SQLiteException: [SQLITE_BUSY] The database file is locked (database is locked)"
)


# What a schema change that lost a Glue commit race raises (tests/test_glue_catalog.py races two for real).
LOST_COMMIT = ": org.apache.iceberg.exceptions.CommitFailedException: Table metadata refresh is required"


@pytest.mark.parametrize("text", [SQLITE_BUSY, LOST_COMMIT, "Connection refused: localhost/127.0.0.1:9092", "ThrottlingException: Rate exceeded"])
def test_a_busy_or_unreachable_catalog_or_source_is_retried(text):
    assert is_transient(RuntimeError(text))


def test_bad_records_bad_config_and_plain_failures_are_not_retried():
    assert not is_transient(RecordError(0, 5, "value is not valid UTF-8", "InvalidValue"))
    assert not is_transient(ConfigError("table x: unknown setting 'formt'"))
    assert not is_transient(RuntimeError("NullPointerException in the writer"))
