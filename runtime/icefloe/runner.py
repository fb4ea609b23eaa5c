"""Running the declared tables: config, session, one writer per table, retries, and per-table reporting."""

from __future__ import annotations

import fcntl
import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .errors import CommitConflict, ConfigError, IcefloeError, RecordError, SourceError
from .materializer import BatchResult, materialize_once
from .session import spark_session
from .spec import IcefloeConfig, TableSpec, load_config

log = logging.getLogger(__name__)
COMMIT_ATTEMPTS = 3
SOURCE_ATTEMPTS = 3
SOURCE_BACKOFF_S = 2.0


@contextmanager
def table_lock(state_dir: Path, identifier: str, local: bool) -> Iterator[None]:
    """One writer per table on this machine. The commit protocol stays safe without it; this avoids wasted work."""
    if not local:
        yield
        return
    locks = state_dir / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{identifier}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CommitConflict(f"table {identifier}: another icefloe run on this machine is writing it") from None
        yield


def run_table(spark, config: IcefloeConfig, table: TableSpec, state_dir: Path) -> BatchResult:
    """One batch with retries: a commit conflict re-plans at once, an unreachable source backs off."""
    identifier = config.identifier(table)
    commit_tries = source_tries = 0
    with table_lock(state_dir, identifier, config.catalog.type == "local"):
        while True:
            try:
                return materialize_once(spark, config, table)
            except CommitConflict:
                commit_tries += 1
                if commit_tries >= COMMIT_ATTEMPTS:
                    raise
                log.warning("%s: commit conflict, re-planning (attempt %d)", identifier, commit_tries + 1)
            except SourceError as error:
                source_tries += 1
                if source_tries >= SOURCE_ATTEMPTS:
                    raise
                delay = SOURCE_BACKOFF_S * 2 ** (source_tries - 1)
                log.warning("%s: %s; retrying in %.0fs", identifier, error, delay)
                time.sleep(delay)


def run_tables(
    config_path: str,
    table_names: list[str],
    state_dir: Path,
    continuous: bool,
    on_result: Callable[[BatchResult], None],
) -> int:
    """Materialize the chosen tables once; returns the number of tables that failed."""
    config = load_config(config_path)
    tables = config.select(table_names)
    if not tables:
        raise ConfigError(f"{config_path}: no enabled tables to run")
    if continuous:
        raise ConfigError("--continuous is not available in this version; use --once on a schedule")
    spark = spark_session(config.catalog, state_dir)
    failures = 0
    for table in tables:
        identifier = config.identifier(table)
        try:
            on_result(run_table(spark, config, table, state_dir))
        except RecordError as error:
            failures += 1
            log.error("table %s (topic %s): %s; nothing at or after offset %d of partition %d was committed",
                      identifier, table.topic, error, error.offset, error.partition)  # fmt: skip
        except IcefloeError as error:
            failures += 1
            log.error("table %s (topic %s): %s", identifier, table.topic, error)
    return failures


def maintain_tables(config_path: str, table_names: list[str], state_dir: Path, on_result: Callable) -> int:
    raise ConfigError("icefloe maintain is not available in this version")
