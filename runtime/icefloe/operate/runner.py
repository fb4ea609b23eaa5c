"""Running the declared tables: config, session, one writer per table, retries, and per-table reporting."""

from __future__ import annotations

import fcntl
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from icefloe.errors import (
    CommitConflict,
    ConfigError,
    IcefloeError,
    RecordError,
    RunTimedOut,
    SourceError,
    clock_skew,
    is_transient,
)
from icefloe.materialize import progress
from icefloe.materialize.batch import BatchResult, materialize_once
from icefloe.materialize.budget import Deadline
from icefloe.materialize.dead_letters import dead_letter_identifier
from icefloe.materialize.upsert import delete_markers_identifier
from icefloe.operate.heartbeat import RUNNING, STOPPED, Heartbeat, write_heartbeat
from icefloe.operate.lag import measure_lag
from icefloe.operate.maintenance import bound_snapshots, is_due, maintain
from icefloe.operate.metrics import BatchMetrics, emit
from icefloe.session import spark_session
from icefloe.source.kafka import client_config, plan_ranges
from icefloe.spec import IcefloeConfig, TableSpec, load_config
from icefloe.table.iceberg import IcebergTable

log = logging.getLogger(__name__)
COMMIT_ATTEMPTS = 3
SOURCE_ATTEMPTS = 3
SOURCE_BACKOFF_S = 2.0
# Continuous mode: a table whose source, registry or catalog is away waits with exponential backoff from this,
# capped at the table's `refresh` (so it resumes within one refresh of the source coming back).
OUTAGE_FIRST_RETRY_S = 1.0


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


def run_table(
    spark: SparkSession, config: IcefloeConfig, table: TableSpec, state_dir: Path, deadline: Deadline | None = None
) -> BatchResult:
    """One batch with retries: a commit conflict re-plans at once; an unreachable source, registry or catalog
    (or any failure that reads as transient: throttling, timeouts, refused connections) backs off. Each attempt is
    sized to publish before `deadline` (the job's time limit) and `runTimeout`; after an attempt that took longer
    than `runTimeout` (not published), the retry plans at most half the records of that attempt."""
    identifier = config.identifier(table)
    commit_tries = source_tries = 0
    at_most: int | None = None
    with table_lock(state_dir, identifier, config.catalog.type == "local"), progress.watch(spark, identifier):
        while True:
            try:
                return materialize_once(spark, config, table, deadline, at_most)
            except CommitConflict as conflict:
                commit_tries += 1
                if commit_tries >= COMMIT_ATTEMPTS:
                    raise
                if isinstance(conflict, RunTimedOut) and conflict.records:
                    at_most = max(1, conflict.records // 2)
                log.warning(
                    "%s: commit conflict, re-planning (attempt %d%s)",
                    identifier,
                    commit_tries + 1,
                    f", at most {at_most} records after runTimeout" if at_most else "",
                )
            except Exception as error:
                skew = clock_skew(error, identifier)
                if skew is not None:
                    raise skew from None
                if isinstance(error, (RecordError, ConfigError)) or not is_transient(error):
                    raise
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
    stop: threading.Event | None = None,
    metrics: bool = False,
    deadline: Deadline | None = None,
) -> int:
    """Materialize the chosen tables (once, or until stopped); returns the number of tables that failed.
    With `metrics`, an EMF line per table follows every batch attempt (`icefloe.operate.metrics`). `deadline`: when the job
    is stopped (`--deadline-minutes`); batches are sized to publish before it, and a continuous run ends before it."""
    config = load_config(config_path)
    tables = config.select(table_names)
    if not tables:
        raise ConfigError(f"{config_path}: no enabled tables to run")
    spark = spark_session(config.catalog, state_dir, config.uses_msk_iam, short_lived=not continuous)
    if continuous:
        return run_continuously(
            spark, config, tables, state_dir, on_result, stop or stop_on_signals(), metrics=metrics, deadline=deadline
        )
    failures = 0
    for table in tables:
        outcome, _, _ = _attempt(spark, config, table, state_dir, on_result, metrics, deadline=deadline)
        if outcome not in (Outcome.OK, Outcome.YIELDED):
            failures += 1
    return failures


class Outcome:
    OK = "ok"
    # Other runs committed before each of this run's attempts (runs of one table overlap on AWS): they made the
    # progress, nothing of this run's was lost; the next run reads on from what they committed. Not a failure.
    YIELDED = "yielded"
    WAITING = "waiting"  # the environment failed (source, registry, catalog, Spark): try again later
    FAILED = "failed"  # a bad record or a bad config: trying again gives the same answer


def _attempt(
    spark: SparkSession,
    config: IcefloeConfig,
    table: TableSpec,
    state_dir: Path,
    on_result: Callable[[BatchResult], None],
    metrics: bool,
    known: dict[int, int] | None = None,
    deadline: Deadline | None = None,
    continuous: bool = False,
) -> tuple[str, str, BatchResult | None]:
    """One batch and its maintenance (`_run_and_maintain`), the table's heartbeat written before and after it, and
    with `metrics` an EMF line after it. `known`: the table's offsets from an earlier batch, for the lag when this
    one fails."""
    identifier = config.identifier(table)
    started = time.monotonic()
    _beat(state_dir, Heartbeat(identifier, time.time(), RUNNING, offsets=_keyed(known or {})))
    results: list[BatchResult] = []

    def keep(result: BatchResult) -> None:
        results.append(result)
        on_result(result)

    outcome, why = _run_and_maintain(spark, config, table, state_dir, keep, deadline, continuous)
    result = results[-1] if results else None
    status = result.status if result is not None and outcome == Outcome.OK else outcome
    offsets = result.offsets if result is not None and result.offsets else (known or {})
    _beat(state_dir, Heartbeat(identifier, time.time(), status, _seen(result) if result else why, _keyed(offsets)))
    if metrics:
        emit(_batch_metrics(spark, config, table, status, why, result, offsets, time.monotonic() - started))
    return outcome, why, result


def _seen(result: BatchResult) -> str:
    """What a batch saw, in a few words (the heartbeat's detail)."""
    failed = f"; maintenance failed: {result.maintenance_error}" if result.maintenance_error else ""
    if result.status == "up-to-date":
        return "nothing new" + failed
    if result.status == "yielded":
        return "other runs committed first"
    lost = sum(r["end"] - r["start"] for r in result.data_lost)
    return (
        f"{result.rows_written} rows, {result.records_failed} bad records" + (f", {lost} lost" if lost else "") + failed
    )


def _keyed(offsets: dict[int, int]) -> dict[str, int]:
    return {str(p): o for p, o in sorted(offsets.items())}


def _beat(state_dir: Path, beat: Heartbeat) -> None:
    try:
        write_heartbeat(state_dir, beat)
    except OSError as error:  # the heartbeat is for operators: a full or read-only disk must not stop the table
        log.warning("%s: cannot write its heartbeat: %s", beat.table, error)


def _batch_metrics(
    spark: SparkSession,
    config: IcefloeConfig,
    table: TableSpec,
    status: str,
    why: str,
    result: BatchResult | None,
    offsets: dict[int, int],
    seconds: float,
) -> BatchMetrics:
    """The attempt's metrics; the lag (after the batch) and the bytes its commit added when they can be read."""
    identifier = config.identifier(table)
    lag = added_bytes = None
    if offsets:
        try:
            lag = measure_lag(
                client_config(config.cluster(table.source_cluster)), table.topic, offsets, table.starting_offsets
            )
        except Exception as error:  # the broker may be the reason the batch failed
            log.debug("%s: lag not measured: %s", identifier, error)
    if result is not None and result.status == "committed" and result.snapshot_id is not None:
        try:
            summary = IcebergTable(spark, identifier).snapshot_summary(result.snapshot_id)
            added_bytes = int(summary.get("added-files-size") or 0)
        except Exception as error:
            log.debug("%s: bytes written not read: %s", identifier, error)
    return BatchMetrics(
        table=identifier,
        topic=table.topic,
        status=status,
        duration_s=seconds,
        records_committed=result.rows_written if result else 0,
        bad_records=result.records_failed if result else 0,
        records_lost=sum(r["end"] - r["start"] for r in result.data_lost) if result else 0,
        lag_records=lag.records if lag else None,
        lag_seconds=lag.seconds if lag else None,
        bytes_written=added_bytes,
        run_id=result.run_id if result else "",
        error=why,
        maintenance_error=result.maintenance_error if result else "",
    )


def _run_and_maintain(
    spark: SparkSession,
    config: IcefloeConfig,
    table: TableSpec,
    state_dir: Path,
    on_result: Callable[[BatchResult], None],
    deadline: Deadline | None = None,
    continuous: bool = False,
) -> tuple[str, str]:
    """One batch, then maintenance if it is due (else, `continuous`, the bound on snapshots); (outcome, why) after
    logging any failure. The batch's result is reported once maintenance is over, with maintenance's result or
    failure: a failure there does not undo the batch, so it does not fail the run (it is logged, reported apart and
    tried again when next due)."""
    identifier = config.identifier(table)
    try:
        result = run_table(spark, config, table, state_dir, deadline)
        if table.maintenance.enabled:
            result.maintenance, result.maintenance_error = _maintain_after_batch(
                spark, config, table, state_dir, continuous
            )
        on_result(result)
        return Outcome.OK, ""
    except CommitConflict as error:
        # Only ever raised with nothing committed; after the last attempt it means other runs kept committing first.
        log.warning(
            "table %s (topic %s): yielded to other runs of the table after %d attempts (%s); nothing was "
            "committed by this run, and the next run reads on from what they committed",
            identifier,
            table.topic,
            COMMIT_ATTEMPTS,
            str(error).split(";")[0],
        )
        on_result(BatchResult(identifier, table.topic, Outcome.YIELDED))
        return Outcome.YIELDED, str(error)
    except RecordError as error:
        log.error(
            "table %s (topic %s): %s; nothing at or after offset %d of partition %d was committed",
            identifier,
            table.topic,
            error,
            error.offset,
            error.partition,
        )
        return Outcome.FAILED, str(error)
    except ConfigError as error:
        log.error("table %s (topic %s): %s", identifier, table.topic, error)
        return Outcome.FAILED, str(error)
    except IcefloeError as error:
        log.error("table %s (topic %s): %s", identifier, table.topic, error)
        return Outcome.WAITING, str(error)
    except Exception as error:  # Spark, Py4J, Arrow, AWS SDK: one table's failure must not end the others
        skew = clock_skew(error, identifier)  # e.g. a maintenance commit
        if skew is not None:
            log.error("table %s (topic %s): %s", identifier, table.topic, skew)
            return Outcome.WAITING, str(skew)
        log.exception("table %s (topic %s): unexpected %s", identifier, table.topic, type(error).__name__)
        return Outcome.WAITING, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _maintain_after_batch(
    spark: SparkSession, config: IcefloeConfig, table: TableSpec, state_dir: Path, continuous: bool = False
) -> tuple[dict | None, str]:
    """Maintenance if it is due (else, `continuous`, the bound on snapshots): (its result, or None when not due; why
    it failed, or "")."""
    identifier = config.identifier(table)
    try:
        with table_lock(state_dir, identifier, config.catalog.type == "local"):
            iceberg = IcebergTable(spark, identifier)
            loaded = iceberg.java()
            if not is_due(iceberg, table, loaded):
                if continuous and not config.catalog.managed_maintenance:
                    bound_snapshots(iceberg, table, loaded)
                    # The tables a micro-batch may commit to beside it: their snapshots pile up just the same.
                    for side in (IcebergTable(spark, name) for name in side_tables(identifier, table)):
                        if side.exists():
                            bound_snapshots(side, table)
                return None, ""
            return maintain(iceberg, table, config.catalog.managed_maintenance, only_if_due=True).as_dict(), ""
    except CommitConflict as error:  # another run on this machine holds the table (local catalog)
        log.info("table %s: maintenance skipped: %s", identifier, error)
        return None, ""
    except Exception as error:  # the batch is committed: report this apart, never as the batch's failure
        log.warning(
            "table %s (topic %s): maintenance failed (the batch stands; tried again when next due): %s",
            identifier,
            table.topic,
            type(error).__name__,
            exc_info=True,
        )
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]


def side_tables(identifier: str, table: TableSpec) -> list[str]:
    """The tables a batch of `table` commits to beside it: upsert's delete markers, the dead letters."""
    sides = [delete_markers_identifier(identifier)] if table.mode == "upsert" else []
    return sides + ([dead_letter_identifier(identifier)] if table.errors == "dlq" else [])


def stop_on_signals() -> threading.Event:
    """SIGTERM/SIGINT finish the batch in flight, then stop (a SIGKILL is safe too: nothing half-committed)."""
    stop = threading.Event()

    def request_stop(signum, _frame) -> None:
        log.info("received %s: stopping after the batch in flight", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


def pending_records(config: IcefloeConfig, table: TableSpec, committed: dict[int, int]) -> int:
    conf = client_config(config.cluster(table.source_cluster))
    plan = plan_ranges(conf, table.topic, committed, table.starting_offsets, None, on_data_loss="warn", quiet=True)
    return sum(r.count for r in plan.ranges)


@dataclass
class _Outage:
    """A table waiting for its environment: since when, why, and when to try again."""

    since: float
    reason: str
    delay: float
    retry_at: float


def run_continuously(
    spark: SparkSession,
    config: IcefloeConfig,
    tables: list[TableSpec],
    state_dir: Path,
    on_result: Callable[[BatchResult], None],
    stop: threading.Event,
    poll_s: float = 1.0,
    metrics: bool = False,
    deadline: Deadline | None = None,
) -> int:
    """Micro-batches per table: commit when `refresh` has elapsed or `commitRecords` are waiting, whichever first.

    A table whose broker, registry or catalog is away waits and retries with capped exponential backoff for as long
    as it takes (the state change is logged once, not every retry), while the other tables go on. Only a bad record
    (per `errors`) or a bad config suspends a table; the loop ends when stopped or when all are suspended.
    """
    # Never ran: due at once. Not 0.0: `time.monotonic` counts from the machine's boot, and a worker booted less than
    # `refresh` ago would wait out the rest of it before the first batch.
    last_batch = {config.identifier(t): float("-inf") for t in tables}
    committed: dict[str, dict[int, int]] = {}
    suspended: set[str] = set()
    outages: dict[str, _Outage] = {}
    while not stop.is_set() and len(suspended) < len(tables):
        if deadline is not None and deadline.left() <= 0:  # a batch started now could be stopped with the job
            log.info("the job's time limit is %.0fs away: stopping before it; the next job goes on", deadline.margin)
            break
        for table in tables:
            identifier = config.identifier(table)
            if stop.is_set() or identifier in suspended:
                continue
            now = time.monotonic()
            outage = outages.get(identifier)
            if outage is not None:
                due = now >= outage.retry_at
            else:
                due = now - last_batch[identifier] >= table.refresh_seconds
                if not due and table.commit_records and identifier in committed:
                    try:
                        due = pending_records(config, table, committed[identifier]) >= table.commit_records
                    except SourceError as error:
                        log.debug("%s: %s", identifier, error)
            if not due:
                continue
            last_batch[identifier] = time.monotonic()
            outcome, why, result = _attempt(
                spark,
                config,
                table,
                state_dir,
                on_result,
                metrics,
                committed.get(identifier),
                deadline,
                continuous=True,
            )
            if result is not None and outcome == Outcome.OK:  # a run that yielded did not read the offsets
                committed[identifier] = result.offsets
            if outcome == Outcome.FAILED:
                suspended.add(identifier)
                log.error("%s: suspended until restart", identifier)
            elif outcome == Outcome.WAITING:
                cap = max(OUTAGE_FIRST_RETRY_S, float(table.refresh_seconds))
                if outage is None:
                    outage = outages[identifier] = _Outage(time.monotonic(), why, OUTAGE_FIRST_RETRY_S, 0.0)
                    log.warning(
                        "%s: waiting for its source/catalog to come back (%s); retrying with backoff up to "
                        "%.0fs, other tables go on",
                        identifier,
                        why,
                        cap,
                    )
                else:
                    outage.delay = min(cap, outage.delay * 2)
                outage.retry_at = time.monotonic() + outage.delay
            elif outage is not None:
                del outages[identifier]
                log.info("%s: recovered after %.0fs; committing again", identifier, time.monotonic() - outage.since)
        stop.wait(poll_s)
    for table in tables:  # a clean stop: status must not take the table for a live job's
        identifier = config.identifier(table)
        if identifier not in suspended:
            _beat(state_dir, Heartbeat(identifier, time.time(), STOPPED, offsets=_keyed(committed.get(identifier, {}))))
    return len(suspended)


def maintain_tables(
    config_path: str, table_names: list[str], state_dir: Path, on_result: Callable[[dict], None]
) -> int:
    """`icefloe maintain`: maintenance now for the chosen tables that exist."""
    config = load_config(config_path)
    spark = spark_session(config.catalog, state_dir, config.uses_msk_iam, short_lived=True)
    failures = 0
    for table in config.select(table_names):
        identifier = config.identifier(table)
        try:
            with table_lock(state_dir, identifier, config.catalog.type == "local"):
                iceberg = IcebergTable(spark, identifier)
                if not iceberg.exists():
                    raise ConfigError(f"table {identifier} does not exist yet (run icefloe run first)")
                on_result(maintain(iceberg, table, config.catalog.managed_maintenance).as_dict())
        except IcefloeError as error:
            failures += 1
            log.error("table %s: %s", identifier, error)
        except Exception as error:  # Spark, Py4J, the catalog: one table's failure must not end the others
            failures += 1
            log.exception("table %s: maintenance failed: unexpected %s", identifier, type(error).__name__)
    return failures
