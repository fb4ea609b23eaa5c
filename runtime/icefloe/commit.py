"""The exactly-once commit protocol: data and offsets land in main together, or not at all.

A batch is written to a private branch created at the snapshot whose offsets it started from; main is then
fast-forwarded to the branch. Iceberg refuses the fast-forward when main has moved since (another writer
committed), so two runs can never both commit the same offsets: the loser gets `CommitConflict`, its data never
becomes visible, and the next run re-plans from what main holds. The catalog's atomic metadata swap makes the
fast-forward the single commit point; a crash before it leaves main untouched.
"""

from __future__ import annotations

import logging
from typing import Callable

from .catalog import CATALOG
from .errors import CommitConflict
from .iceberg_table import IcebergTable

log = logging.getLogger(__name__)
BRANCH_PREFIX = "icefloe_run_"


def drop_stale_branches(table: IcebergTable) -> None:
    """Branches left by runs that crashed before their fast-forward hold nothing visible: drop them."""
    for branch in table.branches(BRANCH_PREFIX):
        log.info("%s: dropping branch %s left by an interrupted run", table.identifier, branch)
        table.spark.sql(f"ALTER TABLE {table.full_name} DROP BRANCH IF EXISTS `{branch}`")


def commit_on_branch(table: IcebergTable, base_snapshot_id: int, run_id: str, write: Callable[[str], None]) -> int:
    """Run `write(branch_identifier)` on a branch at `base_snapshot_id`, then publish it; returns main's new snapshot."""
    branch = f"{BRANCH_PREFIX}{run_id}"
    spark = table.spark
    spark.sql(f"ALTER TABLE {table.full_name} CREATE BRANCH `{branch}` AS OF VERSION {int(base_snapshot_id)}")
    try:
        write(f"{table.full_name}.branch_{branch}")
        try:
            result = spark.sql(
                f"CALL {CATALOG}.system.fast_forward('{table.identifier}', 'main', '{branch}')"
            ).collect()
        except Exception as error:
            if "not an ancestor" in str(error):
                raise CommitConflict(
                    f"table {table.identifier}: another writer committed while this batch was written; "
                    "nothing was committed, the batch will be re-planned"
                ) from None
            raise
        return result[0].updated_ref
    finally:
        try:
            spark.sql(f"ALTER TABLE {table.full_name} DROP BRANCH IF EXISTS `{branch}`")
        except Exception as error:  # best effort: a leftover branch is dropped by the next run
            log.warning("%s: could not drop branch %s: %s", table.identifier, branch, error)
