"""`icefloe status`: how fresh each table is, read from the table and the broker (read-only, no Spark).

Per table: the newest icefloe commit in main's ancestry (its time and offsets; maintenance commits carry none and
are walked past), rows and files from the current snapshot's summary, rows in `<table>_dlq`, ranges lost to retention
as recorded by runs (`onDataLoss: warn`) and as pending now, lag per partition (`icefloe.operate.lag`), and the continuous
job's heartbeat (`icefloe.operate.heartbeat`, local runs). The table's state says what it all means:

  missing      not created yet (its lag counts from where the first run will start)
  up-to-date   nothing unread
  idle         nothing unread, and a live continuous job checks it
  catching-up  unread records, the oldest younger than two refresh intervals (at least 60s), or a live job's batch
               is running
  behind       unread records older than that while a live continuous job commits: it does not keep up
  stuck        unread records older than that and no live job committing them (stopped, died, hung or not scheduled)
  waiting      a live continuous job waits for the table's broker, registry or catalog to come back
  failed       the last run stopped at a bad record (`errors: fail`) or a config error (a continuous job suspends
               the table until it is restarted)
  unknown      the table or the broker could not be read (see `error`)

A heartbeat is live when its process still runs (checked on the same host), it did not stop, and it is running a
batch or checked the table within two refresh intervals (at least 60s).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path

from icefloe.commit.checkpoint import Checkpoint, for_topic, lost_as_json, resume_point
from icefloe.errors import ConfigError, IcefloeError
from icefloe.materialize.dead_letters import dead_letter_identifier
from icefloe.operate.heartbeat import FAILED, RUNNING, STOPPED, Heartbeat, read_heartbeat
from icefloe.operate.lag import Lag, measure_lag
from icefloe.source.kafka import TRUNCATED, client_config
from icefloe.spec import IcefloeConfig, TableSpec, duration_seconds, format_duration
from icefloe.table.catalog import pyiceberg_catalog
from icefloe.table.iceberg import SnapshotRecord

STALE_REFRESHES = 2
MIN_STALE_S = 60.0


@dataclass(frozen=True)
class MaxLag:
    """`--max-lag`: a record count (`10000`) and/or a duration (`5m`); a table past either is behind."""

    records: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, values: list[str]) -> MaxLag:
        records = seconds = None
        for value in values:
            if value.isdigit():
                records = int(value)
            else:
                try:
                    seconds = duration_seconds(value)
                except ValueError:
                    raise ConfigError(
                        f"--max-lag {value!r}: give a record count (10000) or a duration (30s, 5m, 1h)"
                    ) from None
        return cls(records, seconds)

    def exceeded_by(self, lag: Lag) -> bool:
        return (self.records is not None and lag.records > self.records) or (
            self.seconds is not None and lag.seconds > self.seconds
        )


@dataclass
class TableFacts:
    """What the table's own metadata says."""

    exists: bool = False
    offsets: dict[int, int] = field(default_factory=dict)
    last_commit: float | None = None  # epoch seconds of the newest snapshot carrying offsets
    snapshot_id: int | None = None
    rows: int | None = None
    files: int | None = None
    delete_files: int | None = None
    data_lost: list[dict] = field(default_factory=list)
    checkpoint: Checkpoint | None = None  # the newest checkpoint: what lag's truncation check needs


@dataclass
class TableStatus:
    table: str
    spec: TableSpec
    facts: TableFacts
    lag: Lag | None
    heartbeat: Heartbeat | None
    state: str
    behind_max_lag: bool = False
    dlq_rows: int | None = None
    problems: list[str] = field(default_factory=list)
    now: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        """The `--json` line (documented in docs/operating.md, "Is every table fresh?"): keys are stable, new ones may be added."""
        lag = self.lag
        return {
            "table": self.table,
            "topic": self.spec.topic,
            "state": self.state,
            "mode": self.spec.mode,
            "errors": self.spec.errors,
            "refresh": self.spec.refresh,
            "exists": self.facts.exists,
            "last_commit": _iso(self.facts.last_commit),
            "snapshot_id": self.facts.snapshot_id,
            "rows": self.facts.rows,
            "files": self.facts.files,
            "delete_files": self.facts.delete_files,
            "dlq_rows": self.dlq_rows,
            "offsets": {str(p): o for p, o in sorted(self.facts.offsets.items())},
            "lag_records": lag.records if lag else None,
            "lag_seconds": round(lag.seconds, 1) if lag else None,
            "partitions": [p.as_dict() for p in lag.partitions] if lag else [],
            "data_lost": self.facts.data_lost,
            "lost_unread": lag.lost if lag else None,
            "truncated": lag.truncated if lag else None,
            "heartbeat": self.heartbeat.as_dict(self.now) if self.heartbeat else None,
            "behind_max_lag": self.behind_max_lag,
            "error": "; ".join(self.problems) or None,
        }


def stale_after(table: TableSpec) -> float:
    return max(MIN_STALE_S, STALE_REFRESHES * table.refresh_seconds)


def read_table_facts(catalog, identifier: str, topic: str) -> TableFacts:
    """The table's checkpoint (newest icefloe commit in main's ancestry), size and recorded data loss."""
    from pyiceberg.table.snapshots import ancestors_of

    if catalog is None or not catalog.table_exists(identifier):
        return TableFacts()
    table = catalog.load_table(identifier)
    current = table.current_snapshot()
    facts = TableFacts(exists=True, snapshot_id=current.snapshot_id if current else None)
    if current is None:
        return facts
    summary = current.summary or {}
    facts.rows = int(summary.get("total-records", 0)) - int(summary.get("total-position-deletes", 0))
    facts.files, facts.delete_files = int(summary.get("total-data-files", 0)), int(summary.get("total-delete-files", 0))
    history = [
        SnapshotRecord(s.snapshot_id, s.summary or {}, s.timestamp_ms) for s in ancestors_of(current, table.metadata)
    ]
    resume = resume_point(history, identifier)  # pyiceberg's ancestry ends at an expired snapshot
    if resume is not None:
        checkpoint, carrier = resume
        facts.checkpoint, facts.last_commit = for_topic(checkpoint, identifier, topic), carrier.timestamp_ms / 1000
        facts.offsets = dict(facts.checkpoint.offsets)
    for snapshot in reversed(history):  # oldest first
        carried = Checkpoint.from_summary(snapshot.summary or {})
        if carried is not None:  # maintenance commits carry none
            facts.data_lost.extend(lost_as_json(carried.lost))
    return facts


def dlq_rows(catalog, identifier: str) -> int | None:
    """Rows in the table's dead-letter table, or None when it has none."""
    name = dead_letter_identifier(identifier)
    if catalog is None or not catalog.table_exists(name):
        return None
    current = catalog.load_table(name).current_snapshot()
    return int((current.summary or {}).get("total-records", 0)) if current else 0


def decide_state(table: TableSpec, exists: bool, lag: Lag | None, beat: Heartbeat | None, now: float) -> str:
    """The state names in the module docstring, from the lag and the heartbeat."""
    stale = stale_after(table)
    live = (
        beat is not None
        and beat.outcome != STOPPED
        and beat.process_alive() is not False
        and (beat.outcome == RUNNING or beat.age(now) <= stale)
    )
    if beat is not None and beat.outcome == FAILED:
        return "failed"
    if live and beat is not None and beat.outcome == "waiting":
        return "waiting"
    if lag is None:
        return "unknown"
    if not exists:
        return "missing"
    if lag.records == 0:
        return "idle" if live else "up-to-date"
    if lag.seconds <= stale or (live and beat is not None and beat.outcome == RUNNING):
        return "catching-up"
    return "behind" if live else "stuck"


def table_status(catalog, config: IcefloeConfig, table: TableSpec, state_dir: Path, max_lag: MaxLag) -> TableStatus:
    """Everything `status` shows for one table; what cannot be read is named in the errors, the rest still shown."""
    identifier = config.identifier(table)
    now = time.time()
    errors: list[str] = []
    facts, lag, dlq = TableFacts(), None, None
    try:
        facts = read_table_facts(catalog, identifier, table.topic)
        dlq = dlq_rows(catalog, identifier)
    except Exception as error:  # the catalog (SQLite, Glue, S3) could not be read: say so, go on with the broker
        errors.append(f"catalog: {_one_line(error)}")
    if not errors:
        try:
            conf = client_config(config.cluster(table.source_cluster))
            known = facts.checkpoint
            lag = measure_lag(
                conf,
                table.topic,
                facts.offsets,
                table.starting_offsets,
                now,
                known.topic_id if known else None,
                known.leader_epochs if known else None,
                known.known_records if known else None,
            )
        except Exception as error:
            errors.append(f"broker: {_one_line(error)}")
    beat = read_heartbeat(state_dir, identifier)
    state = decide_state(table, facts.exists, lag, beat, now)
    behind = lag is not None and max_lag.exceeded_by(lag)
    return TableStatus(identifier, table, facts, lag, beat, state, behind, dlq, errors, now)


class _Unopened:
    """A catalog that could not be opened (a REST catalog asks its endpoint for config at once): every read raises
    why, so each table reports it as its `catalog:` error."""

    def __init__(self, error: Exception):
        self.error = error

    def table_exists(self, _identifier: str) -> bool:
        raise self.error

    load_table = table_exists


def open_catalog(config: IcefloeConfig, state_dir: Path):
    """The table catalog read-only; None locally before any run created it."""
    if config.catalog.type == "local":
        from icefloe.table.catalog import local_paths

        if not local_paths(state_dir)[0].exists():
            return None
    try:
        return pyiceberg_catalog(config.catalog, state_dir)
    except ConfigError:
        raise
    except Exception as error:  # S3 Tables' endpoint unreachable or refusing: said per table, like Glue's errors
        return _Unopened(error)


def collect_status(
    config: IcefloeConfig, table_names: list[str], state_dir: Path, max_lag: MaxLag
) -> list[TableStatus]:
    tables = config.select(table_names)
    if not tables:
        raise ConfigError("no enabled tables to show")
    catalog = open_catalog(config, state_dir)
    return [table_status(catalog, config, table, state_dir, max_lag) for table in tables]


# --- the human-readable table -------------------------------------------------------------------------------

COLUMNS = ("TABLE", "STATE", "MODE", "ERRORS", "LAST COMMIT (UTC)", "LAG RECORDS", "LAG TIME", "ROWS", "FILES", "DLQ")


def render(statuses: list[TableStatus]) -> str:
    rows = [COLUMNS] + [_row(s) for s in statuses]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if index:
            lines.extend("    " + detail for detail in _details(statuses[index - 1]))
    return "\n".join(lines)


def _row(status: TableStatus) -> tuple[str, ...]:
    facts, lag = status.facts, status.lag
    return (
        status.table,
        status.state + (" (> max lag)" if status.behind_max_lag else ""),
        status.spec.mode,
        status.spec.errors,
        _iso(facts.last_commit, sep=" ") or "-",
        f"{lag.records:,}" if lag else "?",
        format_duration(lag.seconds) if lag else "?",
        f"{facts.rows:,}" if facts.rows is not None else "-",
        str(facts.files) if facts.files is not None else "-",
        f"{status.dlq_rows:,}" if status.dlq_rows is not None else "-",
    )


def _details(status: TableStatus) -> list[str]:
    lines = []
    for part in status.lag.partitions if status.lag else []:
        committed = "-" if part.committed is None else str(part.committed)
        age = f", oldest {format_duration(part.seconds)}" if part.seconds is not None and part.records else ""
        lost = f", {part.lost} deleted before they were read" if part.lost else ""
        if part.truncated and part.committed is not None:
            lost += (
                f", log truncated: offsets {part.committed - part.truncated}..{part.committed - 1} read into the "
                "table are gone (onDataLoss decides the next run)"
            )
        lines.append(
            f"partition {part.partition}: next offset {committed}, end {part.end}: {part.records:,} behind{age}{lost}"
        )
    for loss in status.facts.data_lost:
        count = loss["end"] - loss["start"]
        how = "read, then truncated from the log" if loss.get("kind") == TRUNCATED else "deleted before they were read"
        lines.append(
            f"DATA LOST (recorded): partition {loss['partition']} offsets {loss['start']}..{loss['end'] - 1} "
            f"({count} records): {how}"
        )
    beat = status.heartbeat
    if beat is not None:
        alive = {True: "", False: ", process gone", None: f", on {beat.host}"}[beat.process_alive()]
        detail = f": {beat.detail}" if beat.detail else ""
        lines.append(
            f"heartbeat: {beat.outcome} {format_duration(beat.age(status.now))} ago (pid {beat.pid}{alive}){detail}"
        )
    lines.extend(f"error: {e}" for e in status.problems)
    return lines


def _iso(epoch: float | None, sep: str = "T") -> str | None:
    if epoch is None:
        return None
    return (
        dt.datetime.fromtimestamp(epoch, dt.UTC)
        .isoformat(sep=sep, timespec="seconds")
        .replace("+00:00", "Z" if sep == "T" else "")
    )


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    detail = text[0] if text else ""
    return detail if isinstance(error, IcefloeError) else f"{type(error).__name__}: {detail}"
